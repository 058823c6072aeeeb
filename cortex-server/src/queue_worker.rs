//! The server's own queue worker: a thread running `cortex-worker`'s one
//! rotation over models ([`cortex_worker::work_in_turns`], as `cortex
//! worker` without a model does) with the engines of the model pool: it
//! holds the model of the oldest job with pending items (loading it if need
//! be, as a request would) and works that model's jobs with at most
//! `batch_parallel` items in its engine (an eighth of that while online
//! requests are being answered, see
//! [`AppState::online_id`](crate::state::AppState)), so online requests
//! always find free slots; having a higher priority, they are admitted
//! before any waiting item. It hands over to another model when its model's
//! pending items run out, or when another model's job has waited
//! `model_switch` and its turn has lasted as long.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::Duration;

use cortex_worker::{WorkerError, WorkerPlan, work_in_turns};

use crate::state::AppState;

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
        follow: true,
        chat_template_chosen: config.chat_template.is_some(),
        ..WorkerPlan::new(config.lease)
    };
    let mut models = crate::pool::PoolEngines(Arc::clone(&state.models));
    while !state.stop_worker.load(Ordering::SeqCst) {
        let worked = config
            .queue
            .open()
            .map_err(WorkerError::from)
            .and_then(|mut store| {
                work_in_turns(
                    store.as_mut(),
                    &mut models,
                    &plan,
                    config.model_switch,
                    &state.stop_worker,
                    |_| Ok(()),
                )
            });
        if let Err(error) = worked {
            tracing::error!("queue worker: {error}");
            // A database hiccup (busy past patience, disk full), or an
            // engine that died (the pool loads it afresh): try again shortly.
            std::thread::sleep(Duration::from_secs(1));
        }
    }
    tracing::info!("queue worker stopped");
}
