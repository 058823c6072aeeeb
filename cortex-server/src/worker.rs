//! The server's own queue worker: a thread running `cortex-worker`'s loop
//! on the loaded models, the jobs of every model the registry has. It
//! holds the model of the oldest job with pending items (loading it if need
//! be, as a request would) and works that model's jobs with at most
//! `batch_parallel` items in its engine (an eighth of that while online
//! requests are being answered, see
//! [`AppState::online_id`](crate::state::AppState)), so online requests
//! always find free slots; having a higher priority, they are admitted
//! before any waiting item. It hands over to another model as `cortex
//! worker` does: when its model's pending items run out, or when another
//! model's job has waited `model_switch` and its turn has lasted as long.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cortex_worker::{ModelDemand, WorkerError, WorkerPlan, work_queue};

use crate::state::AppState;

/// How often a working turn looks at the other models' jobs.
const LOOK_EVERY: Duration = Duration::from_secs(2);
/// How long a model that cannot be loaded here is left out of the choice.
const UNAVAILABLE_FOR: Duration = Duration::from_secs(60);

/// Starts the worker thread (none when `batch_parallel` is 0).
pub(crate) fn spawn(state: Arc<AppState>) -> std::io::Result<Option<JoinHandle<()>>> {
    if state.config.batch_parallel == 0 {
        return Ok(None);
    }
    std::thread::Builder::new()
        .name("cortex-queue-worker".into())
        .spawn(move || work(&state))
        .map(Some)
}

fn work(state: &AppState) {
    let config = &state.config;
    let plan = WorkerPlan {
        parallel: Some(Arc::clone(&state.batch_parallel)),
        max_priority: Some(crate::stream::client_priority_bound(config)),
        ..WorkerPlan::new(config.lease)
    };
    let stop = &state.stop_worker;
    let mut unavailable: HashMap<String, Instant> = HashMap::new();
    let mut last: Option<String> = None;
    while !stop.load(Ordering::SeqCst) {
        unavailable.retain(|_, since| since.elapsed() < UNAVAILABLE_FOR);
        match turn(state, &plan, &mut unavailable, &mut last) {
            Ok(true) => {}
            Ok(false) => std::thread::sleep(Duration::from_millis(500)),
            Err(error) => {
                tracing::error!("queue worker: {error}");
                // A database hiccup (busy past patience, disk full), or an
                // engine that died (the pool loads it afresh): try again shortly.
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    }
    tracing::info!("queue worker stopped");
}

/// One model's turn: chooses a model with pending items, holds it and works
/// its jobs until it hands over. `Ok(false)`: nothing to do.
fn turn(
    state: &AppState,
    plan: &WorkerPlan,
    unavailable: &mut HashMap<String, Instant>,
    last: &mut Option<String>,
) -> Result<bool, WorkerError> {
    let config = &state.config;
    let mut store = config.queue.open()?;
    let skipped = unavailable.keys().cloned().collect();
    let demand = ModelDemand::read(store.as_mut(), None, &skipped)?;
    let Some(sha) = demand.choose(last.as_deref()) else {
        store.wait_for_work(Duration::from_secs(1))?;
        return Ok(false);
    };
    let model = match state.models.find_loaded(&sha).map(Ok).unwrap_or_else(|| {
        demand
            .entry(&sha, state.models.registry())
            .map_err(|e| e.to_string())
            .and_then(|found| found.ok_or_else(|| "no model here has this SHA-256".into()))
            .map(cortex_worker::ModelIdentity::from)
    }) {
        Ok(model) => model,
        Err(why) => {
            tracing::warn!(sha256 = %sha, "its jobs are left for other workers: {why}");
            unavailable.insert(sha, Instant::now());
            return Ok(false);
        }
    };
    let held = match state.models.acquire(&model, None) {
        Ok(held) => held,
        Err(error) => {
            tracing::warn!(model = %model.name, "cannot load it for its jobs now: {}", error.message);
            unavailable.insert(sha, Instant::now());
            return Ok(false);
        }
    };
    *last = Some(sha.clone());
    let hand_over = Arc::new(AtomicBool::new(false));
    let turn_plan = WorkerPlan {
        model_sha256: Some(sha.clone()),
        hand_over: Some(Arc::clone(&hand_over)),
        ..plan.clone()
    };
    let started = Instant::now();
    let mut last_look = Instant::now();
    let switch_after = config.model_switch;
    let report = work_queue(
        store.as_mut(),
        &held.engine,
        &turn_plan,
        &state.stop_worker,
        |store| {
            if last_look.elapsed() >= LOOK_EVERY && !hand_over.load(Ordering::Relaxed) {
                last_look = Instant::now();
                let demand = ModelDemand::read(store, None, &skipped)?;
                if demand.hand_over(&sha, started.elapsed(), switch_after) {
                    hand_over.store(true, Ordering::Relaxed);
                }
            }
            Ok(())
        },
    )?;
    tracing::info!(
        model = %held.model.name,
        completed = report.completed,
        released = report.released,
        "queue worker's turn ended"
    );
    Ok(true)
}
