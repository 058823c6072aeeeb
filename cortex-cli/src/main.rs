//! `cortex`: offline batch LLM generation. Submit a JSONL file of prompts, run
//! workers, poll progress, collect a JSONL of outputs.
//!
//! # Design notes
//!
//! The `cortex` binary (clap; `anyhow` only here). `config.rs` layers defaults,
//! `cortex.toml` (working directory, else `$XDG_CONFIG_HOME/cortex/`), `CORTEX_*`
//! environment variables and flags, remembering each value's source for
//! `cortex config`. `commands/` has one module per command family (`jobs`:
//! submit, status, list, results, cancel, resume, retry; `run`; `worker`;
//! `generate`; `models`; `bench`), each function one subcommand that does the
//! work and hands what it found to `output/`, the one place that prints, by the
//! same families: text for people, or JSON with `--json` (`print_json`), plus the
//! shared pieces (one-line errors, times, durations, progress bars); exit codes
//! map from `QueueError` (3 invalid input, 4 no such job, 5 wrong state), and
//! `cortex run`'s job that ended with requests not completed exits 6 (some
//! completed) or 7 (none did).
//!
//! `work.rs` turns settings into the library's engine config and worker plan
//! and resolves the model; the loop itself is `cortex-worker`. It exits when no
//! job in scope can produce work (or waits, with `--follow`). SIGINT/SIGTERM
//! (signal-hook) set the stop flag: stop claiming, let in-flight items finish for
//! up to 3 s, release the rest, exit 0; a second signal exits at once with 130
//! (its leases are reclaimed at once by the next claim on this host). `--detach` re-runs the same command in its own
//! process group with output to `$XDG_DATA_HOME/cortex/logs/worker-*.log`.
//! `cortex run FILE` = submit (or pick up the earlier job for the same file and
//! parameters) + worker for that job + export, with a progress bar.
//! `serve.rs` turns the `[server]` settings into a `cortex_server::ServerConfig`
//! and runs it (loopback without keys unless told otherwise, and it says so).

#![forbid(unsafe_code)]

mod cli;
mod commands;
mod config;
mod devices;
#[cfg(test)]
mod doc_commands;
mod exit;
mod export;
mod keys;
mod output;
mod serve;
mod settings;
mod trace;
mod work;

use std::process::ExitCode;

use clap::Parser;
use cortex_queue::{JobState, QueueError};

use crate::cli::{Cli, Command, ModelsCommand};
use crate::config::Config;
use crate::settings::RawValues;

/// Exit code for an error: see `EXIT_CODES`.
fn exit_code(error: &anyhow::Error) -> u8 {
    if error.downcast_ref::<work::Interrupted>().is_some() {
        return 130;
    }
    if error.downcast_ref::<commands::BadInput>().is_some() {
        return 3;
    }
    if error.downcast_ref::<commands::Usage>().is_some() {
        return 2;
    }
    if error.downcast_ref::<commands::NoJob>().is_some() {
        return 4;
    }
    if let Some(unfinished) = error.downcast_ref::<commands::Unfinished>() {
        return unfinished.exit as u8;
    }
    match error.downcast_ref::<QueueError>() {
        Some(QueueError::InvalidInput(_) | QueueError::DuplicateJob { .. }) => 3,
        Some(QueueError::NoSuchJob(_)) => 4,
        Some(QueueError::WrongState { .. }) => 5,
        _ => 1,
    }
}

fn init_tracing(verbose: u8) {
    let level = match verbose {
        0 => tracing::Level::WARN,
        1 => tracing::Level::INFO,
        2 => tracing::Level::DEBUG,
        // llama.cpp's and ggml's own debug output (graph splits, ...).
        _ => tracing::Level::TRACE,
    };
    // Colours only on a terminal: a detached worker's log file stays plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt()
        .with_ansi(ansi)
        .with_max_level(level)
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let verbose = cli.verbose;
    init_tracing(verbose);
    let flags = match setting_flags(&cli) {
        Ok(flags) => flags,
        Err(error) => error.exit(),
    };
    let result = Config::load(&flags).and_then(|config| run(cli, &config));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // The reader of stdout went away (`cortex status | head -1`): what
        // it wanted it has; end quietly, as Unix tools do.
        Err(error) if reader_left(&error) => ExitCode::SUCCESS,
        Err(error) => {
            let code = exit_code(&error);
            if verbose > 0 {
                eprintln!("error: {error:?}");
            } else {
                eprintln!("error: {}", output::one_line(&error));
            }
            ExitCode::from(code)
        }
    }
}

/// Whether `error` is stdout's reader having gone away.
fn reader_left(error: &anyhow::Error) -> bool {
    error.downcast_ref::<output::ReaderLeft>().is_some()
}

/// The setting flags given before the command's name and after it (which
/// win); one given before that the command does not take is a usage error.
fn setting_flags(cli: &Cli) -> Result<RawValues, clap::Error> {
    let (after, groups) = cli.command.settings();
    for (name, _) in &cli.settings.values {
        let def = settings::def(name).expect("flags come from the table");
        if !groups.contains(&def.group) {
            let mut command = <Cli as clap::CommandFactory>::command();
            return Err(command.error(
                clap::error::ErrorKind::ArgumentConflict,
                format!(
                    "--{} does not apply to `cortex {}` (`cortex {} --help` lists what does)",
                    def.flag(),
                    cli.command.name(),
                    cli.command.name()
                ),
            ));
        }
    }
    Ok(cli.settings.values.iter().chain(after).cloned().collect())
}

fn job_state(name: &str) -> anyhow::Result<JobState> {
    JobState::parse(name).ok_or_else(|| {
        let names: Vec<_> = JobState::ALL.iter().map(|s| s.as_str()).collect();
        anyhow::anyhow!("unknown state {name:?}; use one of {}", names.join(", "))
    })
}

fn run(cli: Cli, config: &Config) -> anyhow::Result<()> {
    use commands as c;
    match cli.command {
        Command::Submit(args) => c::submit(config, &args.job, args.output.as_deref()),
        Command::Worker(args) if args.detach => c::detach_worker(config),
        Command::Worker(args) => c::worker(config, &args),
        Command::Status {
            job, watch, json, ..
        } => c::status(config, job, watch, json),
        Command::List {
            state, limit, json, ..
        } => {
            let state = state.as_deref().map(job_state).transpose()?;
            c::list(config, state, limit, json)
        }
        Command::Results {
            job,
            outputs,
            partial,
            json,
            ..
        } => c::results(config, job, &outputs, partial, json),
        Command::Cancel { job, json, .. } => c::cancel(config, job, json),
        Command::Resume { job, json, .. } => c::resume(config, job, json),
        Command::Retry { job, json, .. } => c::retry(config, job, json),
        Command::Run(args) => c::run_file(config, &args),
        Command::Generate(args) => c::generate(config, &args),
        Command::Models { command, .. } => match command {
            ModelsCommand::List { json } => c::models_list(config, json),
            ModelsCommand::Info { model, json } => c::models_info(config, model.as_deref(), json),
            ModelsCommand::Pull { name, json } => c::models_pull(config, name.as_deref(), json),
            ModelsCommand::Add { name, source, json } => {
                c::models_add(config, &name, &source, json)
            }
            ModelsCommand::Cp { from, to, json } => c::models_copy(config, &from, &to, json),
            ModelsCommand::Rm { name, force, json } => c::models_remove(config, &name, force, json),
        },
        Command::Bench(args) => c::bench(config, &args),
        Command::Serve(_) => serve::serve(config),
        Command::Devices { json, .. } => devices::devices(config, json),
        Command::Config { json, .. } => c::show_config(config, json),
    }
}
