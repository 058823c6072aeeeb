//! `cortex worker`: work on the queue here, or detached in the background.

use anyhow::Context as _;
use cortex_queue::JobId;

use super::open_store;
use crate::cli::WorkerArgs;
use crate::config::Config;
use crate::output::outln;
use crate::work::{
    StopFlag, WorkerScope, finish_deliveries, start_deliveries, work_every_model, work_one_model,
};

pub(crate) fn worker(config: &Config, args: &WorkerArgs) -> anyhow::Result<()> {
    let stop = StopFlag::install()?;
    let jobs = (!args.jobs.is_empty()).then(|| args.jobs.iter().copied().map(JobId).collect());
    let scope = WorkerScope {
        jobs,
        follow: args.follow,
        observer: None,
    };
    let deliveries = start_deliveries(config)?;
    // With no model chosen, every model's jobs; with one, that model's alone.
    let report = if config.model_chosen() {
        let model = config.resolve_model()?;
        let mut store = open_store(config)?;
        work_one_model(config, store.as_mut(), &model, scope, &stop, |_| Ok(()))?
    } else {
        let mut store = open_store(config)?;
        work_every_model(config, store.as_mut(), scope, &stop)?
    };
    eprintln!(
        "worker done: {} completed, {} failed, {} released, {} tokens generated{}",
        report.completed,
        report.failed,
        report.released,
        report.generated_tokens,
        if report.stopped_by_signal {
            " (stopped by signal)"
        } else {
            ""
        }
    );
    finish_deliveries(deliveries);
    Ok(())
}

/// Starts `cortex worker` again in the background (same arguments, without
/// --detach), its output going to a log file in the data directory.
pub(crate) fn detach_worker(config: &Config) -> anyhow::Result<()> {
    use std::os::unix::process::CommandExt;
    let logs = config.log_dir();
    std::fs::create_dir_all(&logs).with_context(|| format!("cannot create {}", logs.display()))?;
    let log_path = logs.join(format!("worker-{}.log", cortex_queue::now_ms()));
    let log = std::fs::File::create(&log_path)
        .with_context(|| format!("cannot create {}", log_path.display()))?;
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--detach")
        .collect();
    let child = std::process::Command::new(std::env::current_exe()?)
        .args(&args)
        .arg("-v")
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        // Its own process group: a Ctrl-C in this terminal does not reach it.
        .process_group(0)
        .spawn()
        .context("cannot start the worker")?;
    // The log's name carries the pid, so that until the worker registers
    // (after loading its model) `cortex status` can tell it is starting.
    let named = logs.join(format!(
        "worker-{}-pid{}.log",
        cortex_queue::now_ms(),
        child.id()
    ));
    let log_path = match std::fs::rename(&log_path, &named) {
        Ok(()) => named,
        Err(_) => log_path,
    };
    outln!("{}", child.id())?;
    eprintln!(
        "worker started in the background (pid {}); log: {}",
        child.id(),
        log_path.display()
    );
    Ok(())
}

/// Workers started with `--detach` that are still running, newest first:
/// their pids and logs (a worker registers in the queue only once its model
/// has loaded; until then this is how one is known to be starting).
pub(crate) fn detached_workers(config: &Config) -> Vec<(u32, std::path::PathBuf)> {
    let Ok(entries) = std::fs::read_dir(config.log_dir()) else {
        return Vec::new();
    };
    let mut found: Vec<(u32, std::path::PathBuf)> = entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            let pid: u32 = name
                .strip_suffix(".log")?
                .rsplit_once("-pid")?
                .1
                .parse()
                .ok()?;
            std::path::Path::new(&format!("/proc/{pid}"))
                .exists()
                .then(|| (pid, entry.path()))
        })
        .collect();
    found.sort_by(|a, b| b.1.cmp(&a.1));
    found
}
