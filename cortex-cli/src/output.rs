//! Human output: error lines, times, durations, tables, progress bars.

use std::fmt::Write as _;
use std::time::Duration;

use cortex_queue::{Job, JobStatus};
use indicatif::{ProgressBar, ProgressStyle};

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

/// The status block of `cortex status`.
pub(crate) fn status_text(status: &JobStatus) -> String {
    let job = &status.job;
    let c = &job.counts;
    let mut out = String::new();
    let _ = writeln!(out, "job {}  {}  {}", job.id, job.state, job.source_name);
    let _ = writeln!(out, "  model     {}", model_text(job));
    let _ = writeln!(
        out,
        "  requests  {} total: {} completed, {} failed, {} cancelled, {} running, {} pending",
        c.total, c.completed, c.failed, c.cancelled, c.running, c.pending
    );
    let _ = writeln!(
        out,
        "  tokens    {} generated, {} prompt",
        job.completion_tokens, job.prompt_tokens
    );
    let _ = writeln!(
        out,
        "  speed     {:.2} requests/s, {:.1} tokens/s (last {})",
        status.items_per_second,
        status.tokens_per_second,
        duration(status.window)
    );
    if let Some(eta) = status.eta {
        let _ = writeln!(out, "  eta       {}", duration(eta));
    }
    let _ = write!(out, "  created   {}", timestamp(job.times.created_at));
    let ended = [
        job.times.completed_at,
        job.times.failed_at,
        job.times.cancelled_at,
    ]
    .into_iter()
    .flatten()
    .max();
    if let (Some(ended), true) = (ended, job.state.is_terminal()) {
        let _ = write!(out, "\n  ended     {}", timestamp(ended));
    }
    out
}

/// The model a job needs: its name and the start of its SHA-256 (only
/// workers running that exact file claim it).
fn model_text(job: &Job) -> String {
    match &job.model_sha256 {
        Some(sha) => format!("{} (sha256 {}…)", job.model, &sha[..sha.len().min(12)]),
        None => format!("{} (any worker)", job.model),
    }
}

/// The table of `cortex list`.
pub(crate) fn jobs_table(jobs: &[Job]) -> String {
    let mut out = format!(
        "{:<6} {:<12} {:>12} {:>7} {:<20} {:<32} {}\n",
        "ID", "STATE", "DONE/TOTAL", "FAILED", "CREATED", "MODEL", "SOURCE"
    );
    for job in jobs {
        let c = &job.counts;
        let _ = writeln!(
            out,
            "{:<6} {:<12} {:>12} {:>7} {:<20} {:<32} {}",
            job.id.0,
            job.state.as_str(),
            format!("{}/{}", c.finished(), c.total),
            c.failed,
            timestamp(job.times.created_at),
            job.model,
            job.source_name
        );
    }
    if jobs.is_empty() {
        out.push_str("(no jobs)\n");
    }
    out.trim_end().to_owned()
}

/// A progress bar over a job's requests (hidden when stderr is not a terminal).
pub(crate) fn job_bar(total: u64) -> ProgressBar {
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{bar:30.cyan/blue} {pos}/{len} requests  {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar
}

/// Moves the bar to the job's status.
pub(crate) fn update_bar(bar: &ProgressBar, status: &JobStatus) {
    let c = &status.job.counts;
    bar.set_length(c.total);
    bar.set_position(c.finished());
    let eta = status
        .eta
        .map_or_else(String::new, |eta| format!(", eta {}", duration(eta)));
    bar.set_message(format!(
        "{:.0} tok/s{eta} [{}]",
        status.tokens_per_second, status.job.state
    ));
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
