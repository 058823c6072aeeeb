//! Running a worker from the command line: signals, and the settings that
//! turn into the library's engine config and worker plan.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use cortex_engine::{Engine, StepObserver};
use cortex_queue::{JobId, Queue};
use cortex_webhooks::Deliverer;
use cortex_worker::{ModelIdentity, WorkerPlan, WorkerReport};

use crate::config::Config;

/// Set by the first SIGINT or SIGTERM; a second one exits the process at once (status 130).
#[derive(Debug, Clone)]
pub(crate) struct StopFlag(Arc<AtomicBool>);

impl StopFlag {
    pub(crate) fn install() -> anyhow::Result<Self> {
        let flag = Arc::new(AtomicBool::new(false));
        for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
            // Registered first, so it sees the flag as the previous signal left it.
            signal_hook::flag::register_conditional_shutdown(signal, 130, Arc::clone(&flag))?;
            signal_hook::flag::register(signal, Arc::clone(&flag))?;
        }
        Ok(Self(flag))
    }

    fn flag(&self) -> &AtomicBool {
        &self.0
    }

    /// Whether a stop signal came.
    pub(crate) fn raised(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// A command stopped by SIGINT or SIGTERM before it was done: the shell's
/// status for it is 130.
#[derive(Debug)]
pub(crate) struct Interrupted(pub(crate) String);

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Interrupted {}

/// What a worker works on, and what watches its engine.
#[derive(Default)]
pub(crate) struct WorkerScope {
    /// Only these jobs (all when `None`).
    pub(crate) jobs: Option<Vec<JobId>>,
    /// Keep waiting for work when there is none.
    pub(crate) follow: bool,
    /// Told of every engine step (`cortex run --trace`).
    pub(crate) observer: Option<Box<dyn StepObserver>>,
}

/// Starts an engine on `model` and works the queue with it until there is
/// nothing left for it (or `follow`), or a stop signal.
pub(crate) fn work_one_model(
    config: &Config,
    store: &mut dyn Queue,
    model: &ModelIdentity,
    scope: WorkerScope,
    stop: &StopFlag,
    tick: impl FnMut(&mut dyn Queue) -> Result<(), cortex_queue::QueueError>,
) -> anyhow::Result<WorkerReport> {
    let WorkerScope {
        jobs,
        follow,
        observer,
    } = scope;
    // A worker of given jobs that stops when they are done needs no more
    // sequences than they have requests left.
    let requests_left = match (&jobs, follow) {
        (Some(ids), false) => requests_left(store, ids),
        _ => None,
    };
    let starting = std::time::Instant::now();
    let engine =
        cortex_llama::start_observed(&config.jobs_engine_config(model, requests_left), observer)?;
    let loaded = starting.elapsed();
    let device = describe_device(&engine);
    let parallel = engine.info().parallel;
    let sequences = if parallel == 1 {
        "sequence"
    } else {
        "sequences"
    };
    eprintln!(
        "generating on {device}, {parallel} {sequences} at once (the model loaded in {:.1} s)",
        loaded.as_secs_f64()
    );
    tracing::info!(model = %model.path.display(), sha256 = %model.sha256, parallel, %device, "worker started");
    let plan = WorkerPlan {
        model_sha256: Some(model.sha256.clone()),
        ..config.worker_plan(jobs, follow)
    };
    Ok(cortex_worker::run_worker(
        store,
        engine,
        &plan,
        stop.flag(),
        tick,
    )?)
}

/// Requests of `jobs` not yet finished (waiting, or claimed by a worker that
/// may have died); `None` when a job cannot be read.
fn requests_left(store: &mut dyn Queue, jobs: &[JobId]) -> Option<u64> {
    let mut left = 0u64;
    for id in jobs {
        let counts = store.job(*id).ok()?.counts;
        left = left.saturating_add(counts.pending + counts.running);
    }
    Some(left)
}

/// Works the jobs of every model in the registry, loading each job's model
/// in turn (a worker started without a model).
pub(crate) fn work_every_model(
    config: &Config,
    store: &mut dyn Queue,
    scope: WorkerScope,
    stop: &StopFlag,
) -> anyhow::Result<WorkerReport> {
    let plan = config.worker_plan(scope.jobs, scope.follow);
    let switch_after = config.model_switch();
    eprintln!(
        "working the jobs of every model (one at a time; a model's jobs wait at most {}s per other model with work)",
        switch_after.as_secs()
    );
    let mut start_engine = |model: &ModelIdentity| {
        let engine = cortex_llama::start(&config.engine_config(model))?;
        eprintln!(
            "generating with {} on {}",
            model.name,
            describe_device(&engine)
        );
        Ok(engine)
    };
    let registry = config.registry();
    let mut source = cortex_worker::OneModelAtATime::new(&registry, &mut start_engine);
    Ok(cortex_worker::work_in_turns(
        store,
        &mut source,
        &plan,
        switch_after,
        stop.flag(),
        |_| Ok(()),
    )?)
}

/// How long a worker that is done keeps retrying webhook events whose
/// next attempt comes soon (a receiver that failed a moment ago).
pub(crate) const WEBHOOK_GRACE: Duration = Duration::from_secs(15);

/// Delivers the queue's webhook events beside the work, on a thread and a
/// connection of its own; [`finish_deliveries`] when the work is done.
pub(crate) fn start_deliveries(config: &Config) -> anyhow::Result<Deliverer> {
    Ok(Deliverer::start(config.queue()?, config.webhook_notifier()))
}

/// Delivers what is due (retrying for a few seconds), and says so when
/// events are left for the next worker or server.
pub(crate) fn finish_deliveries(deliveries: Deliverer) {
    if deliveries.finish(WEBHOOK_GRACE) {
        eprintln!(
            "some webhook events were not delivered yet (their receiver did not take them): the next worker or server on this queue retries them"
        );
    }
}

/// Where an engine runs, for people: the GPU with its memory in use, or the
/// CPU with the kernels that run there (cortex's, and llama.cpp's backend
/// variant chosen for the machine).
pub(crate) fn describe_device(engine: &Engine) -> String {
    let device = engine.device();
    if device.kind.is_gpu() {
        let used = engine.gpu_memory_used().unwrap_or(0);
        return format!(
            "{} ({}; {} MiB in use of {} MiB)",
            device.name,
            device.description,
            used >> 20,
            device.memory_total >> 20
        );
    }
    let variant = cortex_llama::load_backends(None, Default::default())
        .loaded
        .iter()
        .find(|m| m.backend == "CPU")
        .and_then(|m| m.path.file_stem())
        .map(|stem| {
            stem.to_string_lossy()
                .trim_start_matches("libggml-cpu-")
                .to_owned()
        });
    let kernels = match (engine.cortex_kernels(), variant) {
        (Some(isa), Some(variant)) => {
            format!("; cortex's {isa} kernels, llama.cpp's {variant} for the rest")
        }
        (Some(isa), None) => format!("; cortex's {isa} kernels"),
        (None, Some(variant)) => format!("; llama.cpp's {variant} kernels"),
        (None, None) => String::new(),
    };
    format!("the CPU ({}{kernels})", device.description)
}
