//! Everything the CLI prints, by command family (text for people, JSON
//! with `--json`), and the pieces they share: error lines, times, durations.

use std::time::Duration;

/// `println!` that returns the write's error instead of panicking: when the
/// reader went away (`cortex status | head -1`), the command ends quietly
/// (see `main`), as Unix tools do.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout(), $($arg)*).map_err($crate::output::stdout_error)
    }};
}

/// `print!` likewise (see [`outln`]).
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        write!(std::io::stdout(), $($arg)*).map_err($crate::output::stdout_error)
    }};
}

pub(crate) use {out, outln};

/// Stdout's reader went away (a pipe closed early): not a failure.
#[derive(Debug)]
pub(crate) struct ReaderLeft;

impl std::fmt::Display for ReaderLeft {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the reader of the output went away")
    }
}

impl std::error::Error for ReaderLeft {}

/// An error writing to stdout: [`ReaderLeft`] for a closed pipe.
pub(crate) fn stdout_error(error: std::io::Error) -> anyhow::Error {
    if error.kind() == std::io::ErrorKind::BrokenPipe {
        anyhow::Error::new(ReaderLeft)
    } else {
        anyhow::Error::new(error).context("cannot write to stdout")
    }
}

mod bench;
mod config;
mod jobs;
mod models;

pub(crate) use bench::bench_report;
pub(crate) use config::settings;
pub(crate) use jobs::{
    exported, final_status, job_bar, job_changed, jobs, progress_line, requests, run_summary,
    status, submitted, update_bar,
};
pub(crate) use models::{model_entry, model_facts, model_list, model_pulled, model_removed};

/// An error and its causes on one line, "what failed: why" (a rejected input
/// file adds its bad lines below, one per line).
pub(crate) fn one_line(error: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

/// A Unix-millisecond timestamp as `YYYY-MM-DD HH:MM:SS` UTC.
pub(crate) fn timestamp(ms: i64) -> String {
    let (year, month, day, hour, minute, second) = cortex_request::civil_date(ms.div_euclid(1000));
    format!("{year:04}-{month:02}-{day:02} {hour:02}:{minute:02}:{second:02}")
}

/// A duration as `1h02m`, `3m05s` or `42s`.
pub(crate) fn duration(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

/// `value` as pretty JSON on stdout.
pub(crate) fn print_json(value: &impl serde::Serialize) -> anyhow::Result<()> {
    outln!("{}", serde_json::to_string_pretty(value)?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_and_durations_read_well() {
        assert_eq!(timestamp(0), "1970-01-01 00:00:00");
        assert_eq!(timestamp(1_795_000_000_000), "2026-11-18 11:06:40");
        assert_eq!(timestamp(951_782_400_000), "2000-02-29 00:00:00");
        assert_eq!(duration(Duration::from_secs(42)), "42s");
        assert_eq!(duration(Duration::from_secs(185)), "3m05s");
        assert_eq!(duration(Duration::from_secs(3720)), "1h02m");
    }

    #[test]
    fn an_error_chain_is_one_line_without_repeats() {
        let error = anyhow::anyhow!("disk full").context("cannot export job 3");
        assert_eq!(one_line(&error), "cannot export job 3: disk full");
    }
}
