//! The one rotation over models, of a worker with no model of its own and
//! of a server's queue worker alike: it takes the jobs of every model its
//! [`EngineSource`] can run, one model's turn at a time. A turn stays on its
//! model while that model's jobs have pending items, and hands over when
//! they run out, or when another model's pending job has waited longer than
//! `switch_after` and the turn has lasted that long: with contention every
//! model gets turns of at least `switch_after`, so a job waits at most
//! `switch_after` per other model with work (plus the time its items in
//! flight take to finish and the next model takes to load).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cortex_engine::{Engine, Shutdown};
use cortex_models::{ModelEntry, Registry, RegistryError};
use cortex_queue::{JobFilter, JobId, Queue, QueueError, now_ms};

use crate::{ModelIdentity, WorkerError, WorkerPlan, WorkerReport, work_queue};

/// How often a worker looks at the other models' jobs while it works.
const LOOK_EVERY: Duration = Duration::from_secs(2);

/// What the queue wants of each model: the models with jobs in scope, by
/// SHA-256. How a worker that serves many models (this one, or a server's)
/// chooses which to load.
#[derive(Debug, Default)]
pub struct ModelDemand {
    /// Models with pending items: the submission time (ms) of the oldest job
    /// with pending items.
    pending: BTreeMap<String, i64>,
    /// Models with jobs that can still produce work (pending, running
    /// elsewhere, leases of dead workers to reclaim, retries to come): the
    /// submission time of the oldest.
    unfinished: BTreeMap<String, i64>,
    /// The model name the oldest unfinished job of each model was submitted
    /// for (several names can share one GGUF: `cortex models add`, `cp`).
    names: BTreeMap<String, (i64, String)>,
}

impl ModelDemand {
    /// Reads the jobs of `store` (only those in `only`, if given), leaving
    /// out the models in `unavailable`.
    pub fn read(
        store: &mut dyn Queue,
        only: Option<&[JobId]>,
        unavailable: &HashSet<String>,
    ) -> Result<Self, QueueError> {
        demand(store, only, unavailable)
    }

    /// The model to load next: the loaded one while its jobs have pending
    /// items, else the one whose oldest pending job is oldest.
    pub fn choose(&self, loaded: Option<&str>) -> Option<String> {
        choose(self, loaded)
    }

    /// Whether the loaded model should give the engine to another model now,
    /// its turn having lasted `turn`.
    pub fn hand_over(&self, loaded: &str, turn: Duration, switch_after: Duration) -> bool {
        should_hand_over(self, loaded, turn, switch_after)
    }

    /// Whether any job in scope can still produce work.
    pub fn unfinished(&self) -> bool {
        !self.unfinished.is_empty()
    }

    /// The registry's entry to load for the model with this SHA-256: the
    /// one its oldest job was submitted for (so logs and the engine's
    /// settings name that model, not another name of the same weights),
    /// else any entry of those weights.
    pub fn entry(
        &self,
        sha256: &str,
        registry: &Registry,
    ) -> Result<Option<ModelEntry>, RegistryError> {
        let named = self
            .names
            .get(sha256)
            .and_then(|(_, name)| registry.find(name).ok().flatten())
            .filter(|entry| entry.sha256 == sha256);
        match named {
            Some(entry) => Ok(Some(entry)),
            None => registry.by_sha256(sha256),
        }
    }
}

type Demand = ModelDemand;

fn demand(
    store: &mut dyn Queue,
    only: Option<&[JobId]>,
    unavailable: &HashSet<String>,
) -> Result<Demand, QueueError> {
    let mut demand = Demand::default();
    for job in store.jobs(&JobFilter::default())? {
        if job.state.is_terminal() || only.is_some_and(|only| !only.contains(&job.id)) {
            continue;
        }
        let Some(sha) = job.model_sha256 else {
            continue;
        };
        if unavailable.contains(&sha) {
            continue;
        }
        let created = job.times.created_at;
        let name = demand
            .names
            .entry(sha.clone())
            .or_insert_with(|| (created, job.model.clone()));
        if created < name.0 {
            *name = (created, job.model.clone());
        }
        let oldest = demand.unfinished.entry(sha.clone()).or_insert(created);
        *oldest = (*oldest).min(created);
        if job.counts.pending > 0 {
            let oldest = demand.pending.entry(sha).or_insert(job.times.created_at);
            *oldest = (*oldest).min(job.times.created_at);
        }
    }
    Ok(demand)
}

/// The model to load next: the loaded one while its jobs have pending
/// items, else the one whose oldest pending job is oldest. With nothing
/// pending, a model whose jobs are unfinished (the loaded one first): its
/// items run elsewhere, or under the leases of a dead worker, which only a
/// claim for that model takes back.
fn choose(demand: &Demand, loaded: Option<&str>) -> Option<String> {
    let oldest = |models: &BTreeMap<String, i64>| {
        if let Some(loaded) = loaded
            && models.contains_key(loaded)
        {
            return Some(loaded.to_owned());
        }
        models
            .iter()
            .min_by_key(|(_, oldest)| **oldest)
            .map(|(sha, _)| sha.clone())
    };
    oldest(&demand.pending).or_else(|| oldest(&demand.unfinished))
}

/// Whether the loaded model should give the engine to another model now.
/// How long another model's job waits, and the loaded model keeps the
/// engine, before a worker without a model hands the engine over, unless
/// told otherwise.
pub const DEFAULT_MODEL_SWITCH: Duration = Duration::from_secs(600);

fn should_hand_over(demand: &Demand, loaded: &str, turn: Duration, switch_after: Duration) -> bool {
    let mut others = demand.pending.iter().filter(|(sha, _)| *sha != loaded);
    let Some(_) = others.clone().next() else {
        return false;
    };
    if !demand.pending.contains_key(loaded) {
        return true;
    }
    let long_ago = now_ms() - i64::try_from(switch_after.as_millis()).unwrap_or(i64::MAX);
    turn >= switch_after && others.any(|(_, oldest)| *oldest <= long_ago)
}

/// How long a model that could not be run here is left out of the choice.
const UNAVAILABLE_FOR: Duration = Duration::from_secs(60);

/// Why a rotation could not have a model's engine.
#[derive(Debug)]
pub enum HoldError {
    /// Not now: the model is left out of the choice for a while (its jobs
    /// wait for another worker, or for this one to try again).
    Unavailable(String),
    /// The rotation stops with this error.
    Fatal(WorkerError),
}

/// Where a rotation gets the engine of each model it works: a worker starts
/// one model at a time ([`OneModelAtATime`]); a server holds them from its
/// model pool, beside its online requests.
pub trait EngineSource {
    /// A hold on a model's engine for one turn.
    type Held: AsRef<Engine>;

    /// The model with this SHA-256, to run the jobs `demand` has for it;
    /// `Ok(None)` when there is none here.
    fn model(
        &mut self,
        sha256: &str,
        demand: &ModelDemand,
    ) -> Result<Option<ModelIdentity>, HoldError>;

    /// Holds the model's engine for a turn, loading it if need be.
    fn hold(&mut self, model: &ModelIdentity) -> Result<Self::Held, HoldError>;

    /// The rotation ends: engines it started go, their counters into `report`.
    fn finish(&mut self, _report: &mut WorkerReport) -> Result<(), WorkerError> {
        Ok(())
    }
}

/// Works the jobs of every model `source` can run (by each job's model
/// SHA-256), one model's turn after another, until no job in the plan's
/// scope can produce work (or, with `plan.follow`, until `stop`). The
/// plan's `model_sha256` is ignored. A job whose model cannot be run here
/// is left for another worker (and tried again after a minute).
pub fn work_in_turns<S: EngineSource>(
    store: &mut dyn Queue,
    source: &mut S,
    plan: &WorkerPlan,
    switch_after: Duration,
    stop: &AtomicBool,
    mut tick: impl FnMut(&mut dyn Queue) -> Result<(), QueueError>,
) -> Result<WorkerReport, WorkerError> {
    let mut unavailable: HashMap<String, Instant> = HashMap::new();
    let mut last: Option<String> = None;
    let mut report = WorkerReport::default();
    let outcome = loop {
        if stop.load(Ordering::SeqCst) {
            report.stopped_by_signal = true;
            break Ok(());
        }
        unavailable.retain(|_, since| since.elapsed() < UNAVAILABLE_FOR);
        let skipped: HashSet<String> = unavailable.keys().cloned().collect();
        let wanted = demand(store, plan.jobs.as_deref(), &skipped)?;
        let Some(sha) = choose(&wanted, last.as_deref()) else {
            if !wanted.unfinished() && !plan.follow {
                break Ok(());
            }
            tick(store)?;
            store.wait_for_work(Duration::from_secs(1))?;
            continue;
        };
        let held = source.model(&sha, &wanted).and_then(|model| match model {
            Some(model) => source.hold(&model).map(|held| (model, held)),
            None => Err(HoldError::Unavailable(
                "no model here has this SHA-256".into(),
            )),
        });
        let (model, held) = match held {
            Ok(held) => held,
            Err(HoldError::Fatal(error)) => break Err(error),
            Err(HoldError::Unavailable(why)) => {
                tracing::warn!(sha256 = %sha, "its jobs are left for other workers: {why}");
                unavailable.insert(sha, Instant::now());
                continue;
            }
        };
        last = Some(sha.clone());
        let hand_over = Arc::new(AtomicBool::new(false));
        let turn_plan = WorkerPlan {
            model_sha256: Some(sha.clone()),
            follow: false,
            hand_over: Some(Arc::clone(&hand_over)),
            ..plan.clone()
        };
        let turn_started = Instant::now();
        let mut last_look = Instant::now();
        let turn = work_queue(store, held.as_ref(), &turn_plan, stop, |store| {
            if last_look.elapsed() >= LOOK_EVERY && !hand_over.load(Ordering::Relaxed) {
                last_look = Instant::now();
                let wanted = demand(store, plan.jobs.as_deref(), &skipped)?;
                if should_hand_over(&wanted, &sha, turn_started.elapsed(), switch_after) {
                    tracing::info!(model = %model.name, "handing the engine over to another model's jobs");
                    hand_over.store(true, Ordering::Relaxed);
                }
            }
            tick(store)
        });
        drop(held);
        match turn {
            Ok(turn) => {
                tracing::info!(model = %model.name, completed = turn.completed, released = turn.released, "turn ended");
                report.add(&turn);
            }
            Err(error) => break Err(error),
        }
    };
    let finished = source.finish(&mut report);
    outcome.and(finished).map(|()| report)
}

/// The source of a worker without a model: the registry's models, one
/// engine at a time, started by `start` (and shut down when another model's
/// turn comes).
pub struct OneModelAtATime<'a, F> {
    registry: &'a Registry,
    start: F,
    loaded: Option<(ModelIdentity, Arc<Engine>)>,
}

impl<'a, F> OneModelAtATime<'a, F>
where
    F: FnMut(&ModelIdentity) -> Result<Engine, WorkerError>,
{
    /// Models from `registry`, engines from `start`.
    pub fn new(registry: &'a Registry, start: F) -> Self {
        Self {
            registry,
            start,
            loaded: None,
        }
    }
}

impl<F> EngineSource for OneModelAtATime<'_, F>
where
    F: FnMut(&ModelIdentity) -> Result<Engine, WorkerError>,
{
    type Held = Arc<Engine>;

    fn model(
        &mut self,
        sha256: &str,
        demand: &ModelDemand,
    ) -> Result<Option<ModelIdentity>, HoldError> {
        demand
            .entry(sha256, self.registry)
            .map(|entry| entry.map(ModelIdentity::from))
            .map_err(|e| {
                HoldError::Fatal(WorkerError::Model {
                    model: format!("sha256:{sha256}"),
                    detail: e.to_string(),
                })
            })
    }

    fn hold(&mut self, model: &ModelIdentity) -> Result<Arc<Engine>, HoldError> {
        if let Some((loaded, engine)) = &self.loaded
            && loaded.sha256 == model.sha256
        {
            return Ok(Arc::clone(engine));
        }
        if let Some((loaded, engine)) = self.loaded.take() {
            tracing::info!(model = %loaded.name, "unloading");
            if let Ok(engine) = Arc::try_unwrap(engine) {
                let _ = engine.shutdown(Shutdown::Abort);
            }
        }
        tracing::info!(model = %model.name, sha256 = %model.sha256, "loading");
        let engine = Arc::new((self.start)(model).map_err(HoldError::Fatal)?);
        self.loaded = Some((model.clone(), Arc::clone(&engine)));
        Ok(engine)
    }

    fn finish(&mut self, report: &mut WorkerReport) -> Result<(), WorkerError> {
        let Some((_, engine)) = self.loaded.take() else {
            return Ok(());
        };
        report.engine = engine.stats();
        let Ok(engine) = Arc::try_unwrap(engine) else {
            return Ok(());
        };
        match engine.shutdown(Shutdown::Abort) {
            Err(cortex_engine::EngineError::Died(message)) => {
                Err(WorkerError::EngineDied { message, items: 0 })
            }
            _ => Ok(()),
        }
    }
}

impl WorkerReport {
    fn add(&mut self, turn: &WorkerReport) {
        self.completed += turn.completed;
        self.failed += turn.failed;
        self.released += turn.released;
        self.generated_tokens += turn.generated_tokens;
        self.stopped_by_signal |= turn.stopped_by_signal;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn demand_of(pending: &[(&str, i64)]) -> Demand {
        let pending: BTreeMap<String, i64> =
            pending.iter().map(|(s, t)| ((*s).to_owned(), *t)).collect();
        Demand {
            unfinished: pending.clone(),
            pending,
            names: BTreeMap::new(),
        }
    }

    #[test]
    fn the_loaded_model_keeps_the_engine_while_its_jobs_wait() {
        let demand = demand_of(&[("a", 5), ("b", 1)]);
        assert_eq!(choose(&demand, Some("a")).as_deref(), Some("a"));
        assert_eq!(choose(&demand, None).as_deref(), Some("b"));
        assert_eq!(choose(&demand, Some("c")).as_deref(), Some("b"));
        assert_eq!(choose(&demand_of(&[]), Some("a")), None);
        // Nothing pending, but items running under a dead worker's leases:
        // their model is chosen, so that a claim takes them back.
        let waiting = Demand {
            pending: BTreeMap::new(),
            unfinished: [("a".to_owned(), 3), ("b".to_owned(), 1)].into(),
            names: BTreeMap::new(),
        };
        assert_eq!(choose(&waiting, Some("a")).as_deref(), Some("a"));
        assert_eq!(choose(&waiting, None).as_deref(), Some("b"));
    }

    #[test]
    fn a_model_hands_over_when_its_work_ends_or_its_turn_is_long_and_others_waited() {
        let minute = Duration::from_secs(60);
        let now = now_ms();
        // Its own work is done and another model has some: hand over.
        assert!(should_hand_over(
            &demand_of(&[("b", now)]),
            "a",
            Duration::ZERO,
            minute
        ));
        // Nobody else waits: keep it.
        assert!(!should_hand_over(
            &demand_of(&[("a", 0)]),
            "a",
            10 * minute,
            minute
        ));
        // Another waited long, but this turn is young: keep it.
        assert!(!should_hand_over(
            &demand_of(&[("a", 0), ("b", 0)]),
            "a",
            Duration::ZERO,
            minute
        ));
        // A long turn, and the other's job is fresh: keep it.
        assert!(!should_hand_over(
            &demand_of(&[("a", 0), ("b", now)]),
            "a",
            2 * minute,
            minute
        ));
        // A long turn while another's job waited longer than the bound: hand over.
        assert!(should_hand_over(
            &demand_of(&[("a", 0), ("b", 0)]),
            "a",
            2 * minute,
            minute
        ));
    }
}
