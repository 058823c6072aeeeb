//! A worker with no model of its own: it takes the jobs of every model the
//! registry can load, one model in the engine at a time. It stays on the
//! loaded model while that model's jobs have pending items, and hands over
//! when they run out, or when another model's pending job has waited longer
//! than `switch_after` and the loaded model has had the engine that long:
//! with contention every model gets turns of at least `switch_after`, so a
//! job waits at most `switch_after` per other model with work (plus the
//! time its items in flight take to finish and the next model takes to load).

use std::collections::{BTreeMap, HashSet};
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

/// Works the jobs of every model `registry` can load (by each job's model
/// SHA-256), starting an engine with `start_engine` for each model in turn,
/// until no job in the plan's scope can produce work (or, with
/// `plan.follow`, until `stop`). The plan's `model_sha256` is ignored. A job
/// whose model is not in the registry is left for another worker.
pub fn work_every_model(
    store: &mut dyn Queue,
    registry: &Registry,
    start_engine: &mut dyn FnMut(&ModelIdentity) -> Result<Engine, WorkerError>,
    plan: &WorkerPlan,
    switch_after: Duration,
    stop: &AtomicBool,
    mut tick: impl FnMut(&mut dyn Queue) -> Result<(), QueueError>,
) -> Result<WorkerReport, WorkerError> {
    let mut loaded: Option<(ModelIdentity, Engine)> = None;
    let mut unavailable: HashSet<String> = HashSet::new();
    let mut report = WorkerReport::default();
    let outcome = loop {
        if stop.load(Ordering::SeqCst) {
            report.stopped_by_signal = true;
            break Ok(());
        }
        let wanted = demand(store, plan.jobs.as_deref(), &unavailable)?;
        let loaded_sha = loaded.as_ref().map(|(model, _)| model.sha256.as_str());
        let Some(sha) = choose(&wanted, loaded_sha) else {
            if !wanted.unfinished() && !plan.follow {
                break Ok(());
            }
            tick(store)?;
            store.wait_for_work(Duration::from_secs(1))?;
            continue;
        };
        if loaded_sha != Some(sha.as_str()) {
            if let Some((model, engine)) = loaded.take() {
                tracing::info!(model = %model.name, "unloading");
                let _ = engine.shutdown(Shutdown::Abort);
            }
            let Some(entry) = wanted
                .entry(&sha, registry)
                .map_err(|e| WorkerError::Model {
                    model: format!("sha256:{sha}"),
                    detail: e.to_string(),
                })?
            else {
                tracing::warn!(sha256 = %sha, "no model here has this SHA-256: its jobs are left for other workers");
                unavailable.insert(sha);
                continue;
            };
            let model = ModelIdentity::from(entry);
            tracing::info!(model = %model.name, sha256 = %model.sha256, "loading");
            let engine = start_engine(&model)?;
            loaded = Some((model, engine));
        }
        let (model, engine) = loaded.as_ref().expect("a model was loaded");
        let hand_over = Arc::new(AtomicBool::new(false));
        let turn_plan = WorkerPlan {
            model_sha256: Some(model.sha256.clone()),
            follow: false,
            hand_over: Some(Arc::clone(&hand_over)),
            ..plan.clone()
        };
        let turn_started = Instant::now();
        let mut last_look = Instant::now();
        let mut unavailable_now = unavailable.clone();
        unavailable_now.remove(&model.sha256);
        let turn = work_queue(store, engine, &turn_plan, stop, |store| {
            if last_look.elapsed() >= LOOK_EVERY && !hand_over.load(Ordering::Relaxed) {
                last_look = Instant::now();
                let wanted = demand(store, plan.jobs.as_deref(), &unavailable_now)?;
                if should_hand_over(&wanted, &model.sha256, turn_started.elapsed(), switch_after) {
                    tracing::info!(model = %model.name, "handing the engine over to another model's jobs");
                    hand_over.store(true, Ordering::Relaxed);
                }
            }
            tick(store)
        });
        match turn {
            Ok(turn) => report.add(&turn),
            Err(error) => break Err(error),
        }
    };
    if let Some((_, engine)) = loaded {
        report.engine = engine.stats();
        if let Err(cortex_engine::EngineError::Died(message)) = engine.shutdown(Shutdown::Abort)
            && outcome.is_ok()
        {
            return Err(WorkerError::EngineDied { message, items: 0 });
        }
    }
    outcome.map(|()| report)
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
