//! The loop that bridges the queue and the engine: claims items, keeps the
//! engine full, writes results back under their leases, heartbeats, isolates
//! suspects, and stops cleanly on request or when the engine dies.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use cortex_engine::{
    Engine, EngineError, EngineEvent, EngineHealth, EngineStats, EventReceiver, EventSender,
    Shutdown,
};
use cortex_queue::{
    ClaimOptions, ClaimedItem, ItemFailure, JobFilter, JobId, Lease, LeaseStatus, Queue,
    QueueError, failpoint,
};
use cortex_request::{CacheScope, ChatTemplateChoice, FinishReason, RequestId, Response, Work};

use crate::WorkerError;

/// What one worker run should do.
#[derive(Debug, Clone)]
pub struct WorkerPlan {
    /// Only these jobs (all when `None`).
    pub jobs: Option<Vec<JobId>>,
    /// Wait for new work instead of returning when the queue is empty.
    pub follow: bool,
    /// How long a lease lasts without a heartbeat (heartbeats go every third of it).
    pub lease: Duration,
    /// The SHA-256 of the engine's model: only jobs for it are claimed
    /// (`None`: every job, whatever model it names).
    pub model_sha256: Option<String>,
    /// Keep at most this many items in the engine (`None`: as many as it
    /// runs at once, its own `parallel`). Read before every claim, so
    /// another thread may change it while the worker runs: a server sets it
    /// from its `batch_parallel`, lowered while online requests are being
    /// answered, and leaves the rest of the engine to them.
    pub parallel: Option<Arc<AtomicUsize>>,
    /// Clamp every item's priority to ± this (`None`: as submitted): a
    /// server keeps the items clients uploaded below its online requests.
    pub max_priority: Option<i32>,
    /// Once set (by another thread, or `tick`), claim nothing more and return
    /// when the items in flight have finished: how a worker that serves every
    /// model hands the engine over to another model's jobs.
    pub hand_over: Option<Arc<AtomicBool>>,
    /// Its engines render every chat with a template chosen for them all
    /// (`--chat-template`): a job's own model's (a name sharing weights
    /// with another) is then not used.
    pub chat_template_chosen: bool,
}

impl WorkerPlan {
    /// Every job, until the queue is empty, with `lease`-long leases, any model.
    pub fn new(lease: Duration) -> Self {
        Self {
            jobs: None,
            follow: false,
            lease,
            model_sha256: None,
            parallel: None,
            max_priority: None,
            hand_over: None,
            chat_template_chosen: false,
        }
    }

    fn handing_over(&self) -> bool {
        self.hand_over
            .as_ref()
            .is_some_and(|flag| flag.load(Ordering::Relaxed))
    }
}

/// What a worker run did.
#[derive(Debug, Default, Clone)]
pub struct WorkerReport {
    /// Items completed (results written).
    pub completed: u64,
    /// Failed attempts recorded.
    pub failed: u64,
    /// Items given back unfinished (stop requested, or cancelled mid-way).
    pub released: usize,
    /// Tokens generated for the completed items.
    pub generated_tokens: u64,
    /// Whether a stop request ended the run.
    pub stopped_by_signal: bool,
    /// The engine's totals at the end.
    pub engine: EngineStats,
}

/// How often the tokens of in-flight items are reported (what a job's
/// status counts while they run).
const PROGRESS_EVERY: Duration = Duration::from_secs(2);

/// How long the engine may hold the in-flight items' token events, which
/// only feed that count, to send them together: a worker woken at every
/// step of a one-sequence job costs the step loop a wake-up each time.
const TOKEN_EVENTS_DELAY: Duration = Duration::from_millis(500);

/// How long in-flight items may run on after a stop request before they are released.
const STOP_GRACE: Duration = Duration::from_secs(3);
/// How often an idle worker looks for work.
const POLL: Duration = Duration::from_millis(250);
/// Longest wait of an idle worker between claims (leases of dead workers
/// are swept at claims, so it must stay short).
const IDLE_WAIT: Duration = Duration::from_secs(1);

struct Worker<'a> {
    store: &'a mut dyn Queue,
    engine: &'a Engine,
    events: (EventSender, EventReceiver),
    in_flight: HashMap<RequestId, ClaimedItem>,
    /// Tokens each in-flight item has generated, and the count last
    /// reported to the queue (entries of items gone are dropped at the next report).
    generated: HashMap<RequestId, (u64, u64)>,
    /// The in-flight items are a suspect group: claim nothing more until it is done.
    isolating: bool,
    /// Items cancelled in the engine because `parallel` went down; their
    /// `cancelled` finish releases them (pending again, attempt not used).
    /// Ids that left `in_flight` are dropped when `shed` next looks.
    shedding: HashSet<RequestId>,
    /// Claims that brought items, and whether one was a lone suspect (see
    /// [`ClaimOptions::alone`]: at most one per worker, never first).
    claims: usize,
    ran_alone: bool,
    claim: ClaimOptions,
    plan: &'a WorkerPlan,
    report: WorkerReport,
    /// What each job seen gives its items: its project's prefix-cache
    /// scope, so that one project's items never reuse, nor reveal,
    /// another's prompts; and its model's chat template.
    job_settings: HashMap<JobId, JobSettings>,
}

/// What a job gives each of its items in the engine.
struct JobSettings {
    scope: CacheScope,
    chat_template: ChatTemplateChoice,
}

impl Worker<'_> {
    /// Fills the engine up to its free slots; returns how many items were claimed.
    fn fill(&mut self) -> Result<usize, WorkerError> {
        if self.isolating && !self.in_flight.is_empty() {
            return Ok(0);
        }
        let idle = self.in_flight.is_empty();
        // Suspects only into an empty engine, and no more of them than run at once.
        let want = if idle {
            self.engine.info().parallel
        } else {
            self.engine.available_slots()
        };
        let want = match &self.plan.parallel {
            Some(max) => want.min(
                max.load(Ordering::Relaxed)
                    .saturating_sub(self.in_flight.len()),
            ),
            None => want,
        };
        if want == 0 {
            return Ok(0);
        }
        self.claim.suspects = idle;
        self.claim.alone = self.claims > 0 && !self.ran_alone;
        let claimed = self.store.claim(want, &self.claim)?;
        self.isolating = claimed.iter().any(|c| c.suspect);
        self.ran_alone |= claimed.iter().any(|c| c.alone);
        self.claims += usize::from(!claimed.is_empty());
        if let Err(error) = self.learn_jobs(&claimed) {
            // Not run: pending again at once, attempt not used.
            let leases: Vec<Lease> = claimed.iter().map(|c| c.lease).collect();
            self.store.release(&leases)?;
            return Err(error.into());
        }
        let requests = claimed
            .iter()
            .map(|c| {
                let mut work = c.request.clone();
                if let Work::Generate(request) = &mut work {
                    if let Some(bound) = self.plan.max_priority {
                        request.priority = request.priority.clamp(-bound.abs(), bound.abs());
                    }
                    let job = &self.job_settings[&c.job];
                    request.cache_scope = job.scope;
                    if !self.plan.chat_template_chosen {
                        request.chat_template = job.chat_template.clone();
                    }
                }
                work
            })
            .collect();
        let submitted = self.engine.submit_many_to(requests, &self.events.0);
        let count = claimed.len();
        for item in claimed {
            tracing::debug!(item = %item.lease.item, job = %item.job, attempt = item.attempt, suspect = item.suspect, "claimed");
            self.in_flight.insert(item.request.id(), item);
        }
        if let Err(error) = submitted {
            return Err(self.engine_gone(error));
        }
        Ok(count)
    }

    /// Finds the settings of each claimed item's job not known yet; forgets
    /// those of jobs with nothing in flight, so a long-running worker keeps
    /// only the jobs it works on.
    fn learn_jobs(&mut self, claimed: &[ClaimedItem]) -> Result<(), QueueError> {
        let in_flight = &self.in_flight;
        self.job_settings
            .retain(|job, _| in_flight.values().any(|item| item.job == *job));
        for item in claimed {
            if !self.job_settings.contains_key(&item.job) {
                let job = self.store.job(item.job)?;
                let settings = JobSettings {
                    scope: CacheScope::named(&job.project),
                    chat_template: job.defaults.chat_template,
                };
                self.job_settings.insert(item.job, settings);
            }
        }
        Ok(())
    }

    /// When `parallel` went below what is in the engine, gives the
    /// newest items back: cancelled in the engine, released when their
    /// `cancelled` finish arrives. Their progress is lost (they are computed
    /// again later); a server does this so online requests get the engine
    /// now rather than after the queued items end. Suspect groups are left
    /// alone.
    fn shed(&mut self) {
        let Some(max) = &self.plan.parallel else {
            return;
        };
        let max = max.load(Ordering::Relaxed);
        let in_flight = &self.in_flight;
        self.shedding.retain(|id| in_flight.contains_key(id));
        let kept = self.in_flight.len() - self.shedding.len();
        if self.isolating || kept <= max {
            return;
        }
        let mut newest: Vec<(RequestId, i64)> = self
            .in_flight
            .iter()
            .filter(|(id, _)| !self.shedding.contains(id))
            .map(|(id, item)| (*id, item.lease.item.0))
            .collect();
        newest.sort_by_key(|&(_, item)| std::cmp::Reverse(item));
        for (id, _) in newest.into_iter().take(kept - max) {
            self.engine.cancel(id);
            self.shedding.insert(id);
        }
    }

    /// The engine refused work or died: its in-flight items end as a worker
    /// death would end them (suspects, charged only when alone), with the
    /// engine's error as their last error; items of a clean stop go back.
    fn engine_gone(&mut self, error: EngineError) -> WorkerError {
        let leases: Vec<Lease> = self.in_flight.drain().map(|(_, item)| item.lease).collect();
        let message = match self.engine.health() {
            EngineHealth::Died(message) => message,
            _ => match error {
                EngineError::Died(message) => message,
                other => {
                    if let Err(e) = self.store.release(&leases) {
                        return e.into();
                    }
                    return other.into();
                }
            },
        };
        tracing::error!(items = leases.len(), "the engine died: {message}");
        if let Err(e) = self
            .store
            .abandon(&leases, &format!("the engine died: {message}"))
        {
            return e.into();
        }
        WorkerError::EngineDied {
            message,
            items: leases.len(),
        }
    }

    /// Waits up to `wait` for engine events and writes their outcomes back.
    fn drain_events(&mut self, wait: Duration) -> Result<(), WorkerError> {
        let mut finished: Vec<(ClaimedItem, Response)> = Vec::new();
        let mut died = None;
        let first = self.events.1.recv_timeout(wait);
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
                    failpoint::hit("generated", &item.custom_id);
                    finished.push((item, response));
                }
                EngineEvent::Failed { error, .. } if matches!(error, EngineError::Died(_)) => {
                    died = Some(error);
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
                // Counted for the job's progress; results are written whole.
                EngineEvent::Token { id, .. } => self.generated.entry(id).or_default().0 += 1,
                _ => {}
            }
        }
        self.record(&finished)?;
        match died {
            Some(error) => Err(self.engine_gone(error)),
            None => Ok(()),
        }
    }

    /// Writes finished items in one transaction (one fsync).
    fn record(&mut self, finished: &[(ClaimedItem, Response)]) -> Result<(), WorkerError> {
        if finished.is_empty() {
            return Ok(());
        }
        let done: Vec<_> = finished
            .iter()
            .map(|(item, response)| (item.lease, response))
            .collect();
        for ((item, response), outcome) in finished.iter().zip(self.store.complete_many(&done)?) {
            match outcome {
                Ok(()) => {
                    self.report.completed += 1;
                    self.report.generated_tokens += u64::from(response.usage.completion_tokens);
                }
                Err(e) => tracing::warn!(item = %item.lease.item, "{e}"),
            }
        }
        Ok(())
    }

    /// Extends every lease; items whose lease was lost or whose job was cancelled stop.
    fn heartbeat(&mut self) -> Result<(), WorkerError> {
        let items: Vec<(RequestId, Lease)> = self
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

    /// Tells the queue how many tokens each in-flight item has generated
    /// since the last report, so a job's status counts them as they come;
    /// items whose lease is gone (their job's window ended) stop.
    fn report_progress(&mut self) -> Result<(), WorkerError> {
        let in_flight = &self.in_flight;
        self.generated.retain(|id, _| in_flight.contains_key(id));
        let changed: Vec<(Lease, u64)> = self
            .generated
            .iter_mut()
            .filter(|(_, (now, reported))| now != reported)
            .map(|(id, (now, reported))| {
                *reported = *now;
                (in_flight[id].lease, *now)
            })
            .collect();
        let gone = self.store.progress(&changed)?;
        for lease in gone {
            let id = self
                .in_flight
                .iter()
                .find_map(|(id, item)| (item.lease == lease).then_some(*id));
            if let Some(id) = id {
                tracing::info!(item = %lease.item, "the lease is no longer held: stopping it");
                self.in_flight.remove(&id);
                self.engine.cancel(id);
            }
        }
        Ok(())
    }

    /// Whether any job this worker serves can still produce work.
    fn work_remains(&mut self) -> Result<bool, WorkerError> {
        let jobs = self.store.jobs(&JobFilter::default())?;
        Ok(jobs.iter().any(|job| {
            !job.state.is_terminal()
                && self
                    .plan
                    .jobs
                    .as_ref()
                    .is_none_or(|only| only.contains(&job.id))
                && job.model_sha256.as_ref().is_none_or(|sha| {
                    self.plan
                        .model_sha256
                        .as_ref()
                        .is_none_or(|mine| mine == sha)
                })
        }))
    }

    /// Gives every in-flight item back (shutdown).
    fn release_all(&mut self) -> Result<(), WorkerError> {
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

/// Runs `engine` on the queue in `store` until the queue (or the plan's jobs)
/// has nothing left for it, or `stop` is set (in-flight items then get a few
/// seconds to finish and are released). `tick` is called a few times a second
/// with the store (progress display).
///
/// If the engine dies, its in-flight items end as in a worker death (see
/// [`cortex_queue::ClaimOptions::suspects`]) with the engine's message as their
/// last error, and the run returns [`WorkerError::EngineDied`].
pub fn run_worker(
    store: &mut dyn Queue,
    engine: Engine,
    plan: &WorkerPlan,
    stop: &AtomicBool,
    tick: impl FnMut(&mut dyn Queue) -> Result<(), QueueError>,
) -> Result<WorkerReport, WorkerError> {
    let outcome = work_queue(store, &engine, plan, stop, tick);
    let ended = engine.shutdown(Shutdown::Abort);
    let report = outcome?;
    if let Err(EngineError::Died(message)) = ended {
        // It died after its last item was written: nothing was lost, but say so.
        return Err(WorkerError::EngineDied { message, items: 0 });
    }
    Ok(report)
}

/// [`run_worker`] on an engine that others use too (a server's online
/// requests): the same loop, leaving the engine running when it returns.
/// Other requests in the engine count against its free slots, never against
/// the items' leases.
pub fn work_queue(
    store: &mut dyn Queue,
    engine: &Engine,
    plan: &WorkerPlan,
    stop: &AtomicBool,
    mut tick: impl FnMut(&mut dyn Queue) -> Result<(), QueueError>,
) -> Result<WorkerReport, WorkerError> {
    let lease = plan.lease;
    let mut worker = Worker {
        store,
        engine,
        events: cortex_engine::event_channel_batched(TOKEN_EVENTS_DELAY),
        in_flight: HashMap::new(),
        generated: HashMap::new(),
        isolating: false,
        shedding: HashSet::new(),
        claim: ClaimOptions {
            lease,
            jobs: plan.jobs.clone(),
            model_sha256: plan.model_sha256.clone(),
            suspects: true,
            alone: false,
            same_output: engine.same_output(),
        },
        claims: 0,
        ran_alone: false,
        plan,
        report: WorkerReport::default(),
        job_settings: HashMap::new(),
    };
    let outcome = work(&mut worker, stop, &mut tick);
    let mut report = std::mem::take(&mut worker.report);
    drop(worker);
    report.engine = engine.stats();
    log_engine_totals(&report.engine);
    outcome?;
    store.unregister_worker()?;
    tracing::info!(
        completed = report.completed,
        failed = report.failed,
        released = report.released,
        "worker stopped"
    );
    Ok(report)
}

fn work(
    worker: &mut Worker<'_>,
    stop: &AtomicBool,
    tick: &mut impl FnMut(&mut dyn Queue) -> Result<(), QueueError>,
) -> Result<(), WorkerError> {
    let lease = worker.plan.lease;
    let mut last_heartbeat = Instant::now();
    let mut last_progress = Instant::now();
    let mut last_tick = Instant::now();
    let mut next_claim = Instant::now();
    let mut stop_deadline: Option<Instant> = None;
    loop {
        if stop.load(Ordering::SeqCst) && stop_deadline.is_none() {
            tracing::info!(
                in_flight = worker.in_flight.len(),
                "stop requested: finishing or releasing in-flight items"
            );
            stop_deadline = Some(Instant::now() + STOP_GRACE);
            worker.report.stopped_by_signal = true;
        }
        let handing_over = worker.plan.handing_over();
        let mut drained = handing_over && worker.in_flight.is_empty();
        if stop_deadline.is_none()
            && !handing_over
            && Instant::now() >= next_claim
            && worker.fill()? == 0
        {
            next_claim = Instant::now() + POLL;
            // Nothing to claim and nothing in hand: done unless a job in scope can still produce work.
            drained =
                worker.in_flight.is_empty() && !worker.plan.follow && !worker.work_remains()?;
            if worker.in_flight.is_empty() && !drained && !stop.load(Ordering::SeqCst) {
                // Idle: wait for work to arrive (a driver with notifications
                // wakes at once), then claim again.
                worker.store.wait_for_work(IDLE_WAIT)?;
                next_claim = Instant::now();
            }
        }
        worker.shed();
        worker.drain_events(Duration::from_millis(50))?;
        if let EngineHealth::Died(message) = worker.engine.health() {
            return Err(worker.engine_gone(EngineError::Died(message)));
        }
        if last_heartbeat.elapsed() >= lease / 3 {
            worker.heartbeat()?;
            last_heartbeat = Instant::now();
        }
        if last_progress.elapsed() >= PROGRESS_EVERY {
            worker.report_progress()?;
            last_progress = Instant::now();
        }
        if last_tick.elapsed() >= Duration::from_millis(250) {
            tick(worker.store)?;
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
    tick(worker.store)?;
    Ok(())
}

fn log_engine_totals(stats: &EngineStats) {
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
}
