//! Running the server until a signal, then stopping in order: stop
//! accepting, let online requests finish for the grace period and cancel
//! the rest, release the worker's claimed items, return.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::Extension;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::Semaphore;

use crate::files::Pruned;
use crate::state::AppState;
use crate::{ServerError, listen, queue_worker, routes};

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

/// Prunes failed batches and exports past the retention now and every hour.
async fn prune_files(state: Arc<AppState>) {
    let mut every_hour = tokio::time::interval(Duration::from_secs(3600));
    loop {
        every_hour.tick().await;
        let files = Arc::clone(&state);
        let retention = state.config.file_retention;
        match tokio::task::spawn_blocking(move || files.files.prune(retention)).await {
            Ok(Ok(pruned)) if pruned != Pruned::default() => tracing::info!(
                failed_batches = pruned.failed_batches,
                exports = pruned.exports,
                responses = pruned.responses,
                "pruned files past the retention"
            ),
            Ok(Ok(_)) => {}
            Ok(Err(error)) => tracing::warn!("cannot prune the files directory: {error}"),
            Err(error) => tracing::warn!("the pruning task failed: {error}"),
        }
    }
}

/// Unloads, every second, the idle models whose keep-alive ran out.
async fn unload_idle_models(state: Arc<AppState>) {
    let mut every = tokio::time::interval(Duration::from_secs(1));
    loop {
        every.tick().await;
        let models = Arc::clone(&state.models);
        let _ = tokio::task::spawn_blocking(move || models.unload_expired()).await;
    }
}

pub(crate) async fn run(state: Arc<AppState>) -> Result<(), ServerError> {
    let config = &state.config;
    let address = config.listen;
    let tcp = match config.unix_socket_only && config.unix_socket.is_some() {
        true => None,
        false => Some(
            tokio::net::TcpListener::bind(address)
                .await
                .map_err(|source| ServerError::Bind { address, source })?,
        ),
    };
    let unix = match &config.unix_socket {
        Some(path) => Some((listen::bind_unix_socket(path)?, path.clone())),
        None => None,
    };
    let worker = queue_worker::spawn(Arc::clone(&state)).map_err(|source| ServerError::Io {
        context: "cannot start the queue worker".into(),
        source,
    })?;
    tracing::info!(
        address = tcp.as_ref().map(|_| address.to_string()),
        unix_socket = config.unix_socket.as_ref().map(|p| p.display().to_string()),
        model = %state.models.default_model().name,
        "listening"
    );
    tokio::spawn(prune_files(Arc::clone(&state)));
    tokio::spawn(unload_idle_models(Arc::clone(&state)));
    let app = routes::router(Arc::clone(&state));
    let stopping = Arc::clone(&state);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        stop_signal().await;
        let _ = stop.send(true);
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
    });
    let limits = listen::ConnectionLimits {
        header_timeout: config.header_timeout,
    };
    let permits = Arc::new(Semaphore::new(config.max_connections.max(1)));
    let over_tcp = async {
        if let Some(listener) = tcp {
            let permits = Arc::clone(&permits);
            listen::serve(listener, app.clone(), &limits, permits, stopped.clone()).await;
        }
    };
    let over_unix = async {
        if let Some((listener, path)) = unix {
            let app = app.clone().layer(Extension(listen::OverUnixSocket));
            let permits = Arc::clone(&permits);
            listen::serve(listener, app, &limits, permits, stopped.clone()).await;
            let _ = std::fs::remove_file(path);
        }
    };
    tokio::join!(over_tcp, over_unix);
    state.stop_worker.store(true, Ordering::SeqCst);
    if let Some(worker) = worker {
        let _ = tokio::task::spawn_blocking(move || worker.join()).await;
    }
    Ok(())
}
