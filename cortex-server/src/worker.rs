//! The server's own queue worker: a thread running `cortex-worker`'s loop
//! on the shared engine with at most `batch_parallel` items in it (an
//! eighth of that while online requests are being answered, see
//! [`AppState::online_id`](crate::state::AppState)), so online requests
//! always find free slots and share each step with few queued sequences;
//! having a higher priority, they are admitted before any waiting item.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use cortex_engine::EngineHealth;
use cortex_worker::{WorkerError, WorkerPlan, work_queue};

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
        follow: true,
        model_sha256: Some(config.model.sha256.clone()),
        parallel: Some(Arc::clone(&state.batch_parallel)),
        max_priority: Some(crate::stream::client_priority_bound(config)),
        ..WorkerPlan::new(config.lease)
    };
    let stop = &state.stop_worker;
    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
        let outcome = config
            .queue
            .open()
            .map_err(WorkerError::from)
            .and_then(|mut store| {
                work_queue(store.as_mut(), &state.engine, &plan, stop, |_| Ok(()))
            });
        match outcome {
            Ok(report) => {
                tracing::info!(
                    completed = report.completed,
                    released = report.released,
                    "queue worker stopped"
                );
                return;
            }
            Err(error) => {
                tracing::error!("queue worker: {error}");
                if !matches!(state.engine.health(), EngineHealth::Running) {
                    return;
                }
                // A database hiccup (busy past patience, disk full): try again shortly.
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    }
}
