//! The worker: claims items from the queue, keeps the engine full, writes
//! results back under their leases, heartbeats, and stops cleanly on signals.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use cortex_engine::{DEFAULT_MODEL, Engine, EngineEvent, ModelCache, Shutdown, read_gguf};
use cortex_queue::{
    ClaimOptions, ClaimedItem, ItemFailure, JobFilter, JobId, LeaseStatus, QueueError, Store,
};
use cortex_request::{FinishReason, RequestId, Response};

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

    pub(crate) fn requested(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// The model file to run: the default one (fetched and verified on first
/// use) or the configured GGUF path, checked before llama.cpp sees it.
pub(crate) fn model_path(config: &Config) -> anyhow::Result<PathBuf> {
    let model = &config.model.value;
    if model == "default" {
        return ModelCache::default_location()
            .ensure(&DEFAULT_MODEL)
            .context("cannot fetch the default model");
    }
    let path = PathBuf::from(model);
    read_gguf(&path)
        .with_context(|| format!("cannot load the model (set by {})", config.model.source))?;
    Ok(path)
}

/// The name recorded with jobs and in outputs: the model file's stem.
pub(crate) fn model_name(config: &Config) -> String {
    let model = &config.model.value;
    let file = if model == "default" {
        DEFAULT_MODEL.file_name
    } else {
        model.as_str()
    };
    let stem = Path::new(file)
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned());
    stem.unwrap_or_else(|| model.clone())
}

/// What one worker run should do.
#[derive(Debug, Clone)]
pub(crate) struct WorkerPlan {
    /// Only these jobs (all when `None`).
    pub(crate) jobs: Option<Vec<JobId>>,
    /// Wait for new work instead of exiting when the queue is empty.
    pub(crate) follow: bool,
    /// Sequences decoded at once.
    pub(crate) parallel: usize,
}

/// What a worker run did.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct WorkerReport {
    pub(crate) completed: u64,
    pub(crate) failed: u64,
    pub(crate) released: usize,
    pub(crate) generated_tokens: u64,
    pub(crate) stopped_by_signal: bool,
}

/// How long in-flight items may run on after a stop signal before they are released.
const STOP_GRACE: Duration = Duration::from_secs(3);
/// How often an idle worker looks for work.
const POLL: Duration = Duration::from_millis(250);

struct Worker<'a> {
    store: Store,
    engine: Engine,
    events: (flume::Sender<EngineEvent>, flume::Receiver<EngineEvent>),
    in_flight: HashMap<RequestId, ClaimedItem>,
    claim: ClaimOptions,
    plan: &'a WorkerPlan,
    report: WorkerReport,
}

impl Worker<'_> {
    /// Fills the engine up to its free slots; returns how many items were claimed.
    fn fill(&mut self) -> anyhow::Result<usize> {
        let want = self.engine.available_slots();
        if want == 0 {
            return Ok(0);
        }
        let claimed = self.store.claim(want, &self.claim)?;
        let requests = claimed.iter().map(|c| c.request.clone()).collect();
        if let Err(error) = self.engine.submit_many_to(requests, &self.events.0) {
            let leases: Vec<_> = claimed.iter().map(|c| c.lease).collect();
            self.store.release(&leases)?;
            return Err(error).context("the engine stopped");
        }
        let count = claimed.len();
        for item in claimed {
            tracing::debug!(item = %item.lease.item, job = %item.job, attempt = item.attempt, "claimed");
            self.in_flight.insert(item.request.id, item);
        }
        Ok(count)
    }

    /// Waits up to `wait` for engine events and writes their outcomes back.
    fn drain_events(&mut self, wait: Duration) -> anyhow::Result<()> {
        let mut finished: Vec<(ClaimedItem, Response)> = Vec::new();
        let first = self.events.1.recv_timeout(wait).ok();
        for event in first.into_iter().chain(self.events.1.try_iter()) {
            match event {
                EngineEvent::Finished(response) => {
                    // Items cancelled here (lost lease, cancelled job, shutdown) are already accounted for.
                    let Some(item) = self.in_flight.remove(&response.id) else {
                        continue;
                    };
                    if response
                        .completions
                        .iter()
                        .any(|c| c.finish_reason == FinishReason::Cancelled)
                    {
                        self.store.release(&[item.lease])?;
                        self.report.released += 1;
                        continue;
                    }
                    finished.push((item, response));
                }
                EngineEvent::Failed { id, error } => {
                    let Some(item) = self.in_flight.remove(&id) else {
                        continue;
                    };
                    let failure = ItemFailure {
                        code: error.code().into(),
                        message: error.to_string(),
                        retryable: error.is_retryable(),
                    };
                    tracing::warn!(item = %item.lease.item, custom_id = %item.custom_id, "{}", failure.message);
                    match self.store.fail(&item.lease, &failure) {
                        Ok(_) => self.report.failed += 1,
                        Err(QueueError::LeaseLost { .. }) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                // Tokens: a worker only records whole results.
                _ => {}
            }
        }
        if !finished.is_empty() {
            // One transaction (one fsync) for everything that finished in this round.
            let done: Vec<_> = finished
                .iter()
                .map(|(item, response)| (item.lease, response))
                .collect();
            for ((item, response), outcome) in finished.iter().zip(self.store.complete_many(&done)?)
            {
                match outcome {
                    Ok(()) => {
                        self.report.completed += 1;
                        self.report.generated_tokens += u64::from(response.usage.completion_tokens);
                    }
                    Err(e) => tracing::warn!(item = %item.lease.item, "{e}"),
                }
            }
        }
        Ok(())
    }

    /// Extends every lease; items whose lease was lost or whose job was cancelled stop.
    fn heartbeat(&mut self) -> anyhow::Result<()> {
        let items: Vec<(RequestId, cortex_queue::Lease)> = self
            .in_flight
            .iter()
            .map(|(id, c)| (*id, c.lease))
            .collect();
        if items.is_empty() {
            return Ok(());
        }
        let leases: Vec<_> = items.iter().map(|(_, lease)| *lease).collect();
        let statuses = self.store.heartbeat(&leases, self.claim.lease)?;
        for ((id, lease), status) in items.into_iter().zip(statuses) {
            if !matches!(status, LeaseStatus::Held { .. }) {
                tracing::info!(item = %lease.item, "{status:?}: stopping it");
                self.in_flight.remove(&id);
                self.engine.cancel(id);
            }
        }
        Ok(())
    }

    /// Whether any job this worker serves can still produce work.
    fn work_remains(&mut self) -> anyhow::Result<bool> {
        let jobs = self.store.jobs(&JobFilter::default())?;
        Ok(jobs.iter().any(|job| {
            !job.state.is_terminal()
                && self
                    .plan
                    .jobs
                    .as_ref()
                    .is_none_or(|only| only.contains(&job.id))
        }))
    }

    /// Gives every in-flight item back (shutdown).
    fn release_all(&mut self) -> anyhow::Result<()> {
        let leases: Vec<_> = self
            .in_flight
            .drain()
            .map(|(id, item)| {
                self.engine.cancel(id);
                item.lease
            })
            .collect();
        self.report.released += self.store.release(&leases)?;
        Ok(())
    }
}

/// Runs a worker on `model` until the queue (or the plan's jobs) has nothing
/// left, or a stop signal. `tick` is called a few times a second with the store (progress).
pub(crate) fn run_worker(
    config: &Config,
    model: &Path,
    plan: &WorkerPlan,
    stop: &StopFlag,
    mut tick: impl FnMut(&mut Store) -> anyhow::Result<()>,
) -> anyhow::Result<WorkerReport> {
    let store = crate::commands::open_store(config)?;
    let engine = Engine::start(&config.engine(model, plan.parallel))?;
    tracing::info!(model = %model.display(), parallel = plan.parallel, "worker started");
    let lease = Duration::from_secs(config.lease_seconds.value);
    let mut worker = Worker {
        store,
        engine,
        events: flume::unbounded(),
        in_flight: HashMap::new(),
        claim: ClaimOptions {
            lease,
            jobs: plan.jobs.clone(),
        },
        plan,
        report: WorkerReport::default(),
    };
    let mut last_heartbeat = Instant::now();
    let mut last_tick = Instant::now();
    let mut next_claim = Instant::now();
    let mut stop_deadline: Option<Instant> = None;
    loop {
        if stop.requested() && stop_deadline.is_none() {
            tracing::info!(
                in_flight = worker.in_flight.len(),
                "stop requested: finishing or releasing in-flight items"
            );
            stop_deadline = Some(Instant::now() + STOP_GRACE);
            worker.report.stopped_by_signal = true;
        }
        let mut drained = false;
        if stop_deadline.is_none() && Instant::now() >= next_claim && worker.fill()? == 0 {
            next_claim = Instant::now() + POLL;
            // Nothing to claim and nothing in hand: done unless a job in scope can still produce work.
            drained = worker.in_flight.is_empty() && !plan.follow && !worker.work_remains()?;
        }
        worker.drain_events(Duration::from_millis(50))?;
        if last_heartbeat.elapsed() >= lease / 3 {
            worker.heartbeat()?;
            last_heartbeat = Instant::now();
        }
        if last_tick.elapsed() >= Duration::from_millis(250) {
            tick(&mut worker.store)?;
            last_tick = Instant::now();
        }
        let finished = match stop_deadline {
            Some(deadline) => worker.in_flight.is_empty() || Instant::now() >= deadline,
            None => drained,
        };
        if finished {
            break;
        }
    }
    worker.release_all()?;
    tick(&mut worker.store)?;
    let Worker {
        mut store,
        engine,
        report,
        ..
    } = worker;
    let stats = engine.stats();
    tracing::info!(
        steps = stats.steps,
        busy_seconds = format!("{:.2}", stats.busy_seconds),
        decode_seconds = format!("{:.2}", stats.decode_seconds),
        prefill_tokens = stats.prefill_tokens,
        prefill_tokens_saved = stats.prefill_tokens_saved,
        generated_tokens = stats.generated_tokens,
        preemptions = stats.preemptions,
        kv_streams = stats.kv_streams,
        kv_stream_tokens = stats.kv_stream_tokens,
        kv_resizes = stats.kv_resizes,
        prefix_copies = stats.prefix_copies,
        "engine totals"
    );
    engine
        .shutdown(Shutdown::Abort)
        .context("the engine stopped")?;
    store.unregister_worker()?;
    tracing::info!(
        completed = report.completed,
        failed = report.failed,
        released = report.released,
        "worker stopped"
    );
    Ok(report)
}
