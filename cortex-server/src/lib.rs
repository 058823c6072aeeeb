//! `cortex serve`: one engine behind an HTTP API that speaks OpenAI's and
//! Ollama's protocols, with OpenAI's Files and Batches API on the durable
//! queue. The only crate with an async runtime (tokio) and a web framework
//! (axum).
//!
//! - Online requests (`/v1/chat/completions`, `/v1/completions`,
//!   `/v1/responses`, `/v1/embeddings`, Ollama's `/api/generate` and
//!   `/api/chat`) go straight to the engine with a priority above every
//!   queued item, streamed (SSE or NDJSON) or whole; a client that goes away
//!   cancels its request.
//! - A batch is a queue job (`cortex-openai` maps one onto the other); a
//!   worker thread inside the server works the queue with part of the
//!   engine's slots (`ServerConfig::batch_parallel`, an eighth of that
//!   while online requests are answered), beside any `cortex worker`
//!   processes on the same database.
//! - `/metrics` (Prometheus text, `prometheus-client`), `/health` (the
//!   engine's health), API keys, and a shutdown that releases claimed items.
//!
//! # Example
//!
//! ```no_run
//! use cortex_engine::{Engine, EngineConfig, ModelCache};
//! use cortex_server::{ServerConfig, serve};
//!
//! let model = cortex_worker::resolve("default", &ModelCache::default_location())?;
//! let engine = Engine::start(&EngineConfig::new(&model.path))?;
//! let queue = cortex_queue::QueueOpener::sqlite("cortex.db");
//! let config = ServerConfig::new(model, queue, "cortex-files");
//! serve(config, engine)?; // until SIGINT or SIGTERM
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![forbid(unsafe_code)]

mod auth;
mod batch_api;
mod error;
mod files;
mod metrics;
mod ollama;
mod online;
mod routes;
mod shutdown;
mod state;
mod stream;
mod worker;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use cortex_engine::Engine;
use cortex_queue::QueueOpener;
use cortex_worker::ModelIdentity;

pub use stream::ONLINE_PRIORITY;

/// [`ServerConfig::max_request_tokens`] by default: 16 completions of a
/// whole 8,192-token context.
pub const DEFAULT_MAX_REQUEST_TOKENS: u64 = 1 << 17;

/// How a server runs.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ServerConfig {
    /// Where to listen.
    pub listen: SocketAddr,
    /// Keys a client must present (`Authorization: Bearer KEY`); none: open.
    pub api_keys: Vec<String>,
    /// The served model (its name is what `/v1/models` lists).
    pub model: ModelIdentity,
    /// The queue (SQLite or PostgreSQL).
    pub queue: QueueOpener,
    /// Where uploaded files and batch exports live.
    pub files_dir: PathBuf,
    /// Lease of the items the server's worker claims.
    pub lease: Duration,
    /// Queue items in the engine at most (an eighth of it while online
    /// requests are in flight); the engine's other slots are kept for
    /// online requests. 0: the server works no queue items.
    pub batch_parallel: usize,
    /// Most tokens one online request may ask for: `n` × `max_tokens`, each
    /// cut to the context (a longer answer cannot be). More is a 400.
    pub max_request_tokens: u64,
    /// Largest request body (JSON), bytes.
    pub max_body_bytes: usize,
    /// Largest uploaded file, bytes.
    pub max_file_bytes: usize,
    /// How long in-flight online requests may run on after a stop signal
    /// before they are cancelled.
    pub shutdown_grace: Duration,
}

impl ServerConfig {
    /// Listens on 127.0.0.1:8080 without keys; the queue `queue` opens,
    /// files in `files_dir`; 60 s leases; 48 queue items at most (of the
    /// engine's default 64 slots); 131,072 tokens a request; 32 MiB bodies,
    /// 512 MiB files; 5 s grace.
    pub fn new(model: ModelIdentity, queue: QueueOpener, files_dir: impl Into<PathBuf>) -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            api_keys: Vec::new(),
            model,
            queue,
            files_dir: files_dir.into(),
            lease: Duration::from_secs(60),
            batch_parallel: 48,
            max_request_tokens: DEFAULT_MAX_REQUEST_TOKENS,
            max_body_bytes: 32 << 20,
            max_file_bytes: 512 << 20,
            shutdown_grace: Duration::from_secs(5),
        }
    }
}

/// Why the server could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// The address could not be bound.
    #[error("cannot listen on {address}: {source}")]
    Bind {
        /// The address.
        address: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The queue could not be opened.
    #[error(transparent)]
    Queue(#[from] cortex_queue::QueueError),
    /// Another I/O failure (the runtime, the files directory).
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// Why it failed.
        source: std::io::Error,
    },
}

/// Serves `engine` until SIGINT or SIGTERM: stops accepting, gives online
/// requests [`ServerConfig::shutdown_grace`] and then cancels them, releases
/// the queue items the server's worker holds (pending again, attempt not
/// used), and returns. A second signal exits the process at once (status 130).
pub fn serve(config: ServerConfig, engine: Engine) -> Result<(), ServerError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("cortex-http")
        .enable_all()
        .build()
        .map_err(|source| ServerError::Io {
            context: "cannot start the HTTP runtime".into(),
            source,
        })?;
    let engine = Arc::new(engine);
    let state = state::AppState::open(config, Arc::clone(&engine))?;
    let result = runtime.block_on(shutdown::run(Arc::clone(&state)));
    drop(state);
    drop(runtime);
    if let Ok(engine) = Arc::try_unwrap(engine) {
        let _ = engine.shutdown(cortex_engine::Shutdown::Abort);
    }
    result
}
