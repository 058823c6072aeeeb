//! Running the server until a signal, then stopping in order: stop
//! accepting, let online requests finish for the grace period and cancel
//! the rest, release the worker's claimed items, return.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::signal::unix::{SignalKind, signal};

use crate::state::AppState;
use crate::{ServerError, listen, routes, worker};

/// Resolves on the first SIGINT or SIGTERM; a second one exits at once.
async fn stop_signal() {
    let (Ok(mut interrupt), Ok(mut terminate)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        tracing::error!("cannot listen for signals; stop the server with SIGKILL");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = interrupt.recv() => {}
        _ = terminate.recv() => {}
    }
    tokio::spawn(async move {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
        tracing::warn!("second stop signal: exiting now");
        std::process::exit(130);
    });
}

pub(crate) async fn run(state: Arc<AppState>) -> Result<(), ServerError> {
    let address = state.config.listen;
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .map_err(|source| ServerError::Bind { address, source })?;
    let worker = worker::spawn(Arc::clone(&state)).map_err(|source| ServerError::Io {
        context: "cannot start the queue worker".into(),
        source,
    })?;
    tracing::info!(%address, model = state.model_name(), "listening");
    let app = routes::router(Arc::clone(&state));
    let stopping = Arc::clone(&state);
    let shutdown = async move {
        stop_signal().await;
        tracing::info!("stopping: no new connections; releasing claimed queue items");
        stopping.stop_worker.store(true, Ordering::SeqCst);
        let grace = stopping.config.shutdown_grace;
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            let cancelled = stopping.cancel_online();
            if cancelled > 0 {
                tracing::info!(
                    cancelled,
                    "online requests cancelled at the end of the grace period"
                );
            }
        });
    };
    let limits = listen::ConnectionLimits {
        max_connections: state.config.max_connections,
        header_timeout: state.config.header_timeout,
    };
    listen::serve(listener, app, &limits, shutdown).await;
    state.stop_worker.store(true, Ordering::SeqCst);
    if let Some(worker) = worker {
        let _ = tokio::task::spawn_blocking(move || worker.join()).await;
    }
    Ok(())
}
