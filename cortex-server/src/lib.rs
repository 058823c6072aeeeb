//! `cortex serve`: the models of the registry behind an HTTP API that
//! speaks OpenAI's and Ollama's protocols, with OpenAI's Files and Batches
//! API on the durable queue. The only crate with a web framework (axum) and
//! the only one that runs an async runtime of its own (tokio; the object
//! store client, `cortex-objects`, drives its requests on a private one).
//!
//! - A request's `model` picks the model: loaded on demand, kept for its
//!   `keep_alive`, within a memory budget (`pool::ModelPool`); Ollama's model
//!   management (pull, create, blobs, copy, delete, show, ps) works on the
//!   registry.
//! - Online requests (`/v1/chat/completions`, `/v1/completions`,
//!   `/v1/responses`, `/v1/embeddings`, Ollama's `/api/generate`,
//!   `/api/chat`, `/api/embed`) go straight to their model's engine with a
//!   priority above every queued item, streamed (SSE or NDJSON) or whole; a
//!   client that goes away cancels its request.
//! - A batch is a queue job (`cortex-openai` maps one onto the other); a
//!   worker thread inside the server works the queue with part of the
//!   engine's slots (`ServerConfig::batch_parallel`, an eighth of that
//!   while online requests are answered), beside any `cortex worker`
//!   processes on the same database.
//! - A dashboard at `/` (plain HTML and JavaScript embedded in the binary)
//!   over cortex's own JSON API: `/v1/jobs` (jobs, their activity, items and
//!   actions) and `/v1/metrics` (the figures of `/metrics` as JSON).
//! - `/metrics` (Prometheus text, `prometheus-client`), `/health` (the
//!   engine's health), API keys, and a shutdown that releases claimed items.
//!
//! # Example
//!
//! ```no_run
//! use cortex_engine::EngineConfig;
//! use cortex_models::Registry;
//! use cortex_server::{EngineStarter, ServerConfig, serve};
//!
//! let model = cortex_worker::resolve("default", &Registry::default_location())?;
//! let engine = cortex_llama::start(&EngineConfig::new(&model.path))?;
//! let queue = cortex_queue_sqlite::Store::opener("cortex.db");
//! // Other models a request names are loaded the same way, on demand.
//! let starter = EngineStarter::new(|model| cortex_llama::start(&EngineConfig::new(&model.path)));
//! let config = ServerConfig::new(model, queue, "cortex-files", Registry::default_location(), starter);
//! serve(config, engine)?; // until SIGINT or SIGTERM
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Design notes
//!
//! `cortex serve` as a library (`serve(ServerConfig, Engine)`): the only crate
//! with tokio and axum. The loaded models are `pool::ModelPool`'s
//! (its `PoolError`s become HTTP statuses in `error.rs`), the default
//! one from start, others loaded on demand by the `EngineStarter` the CLI
//! gives (one load at a time, off the async threads). A request holds its
//! model (`ModelUse`: never unloaded while held); when the last use ends the
//! model's keep-alive starts (the request's, else the server's); a thread
//! unloads expired idle models every second; a load that does not fit
//! (`max_loaded`, `memory_budget`: weights plus KV bytes now) unloads idle
//! models, least recently used first, else waits up to `load_wait` (503), and
//! a model larger than the budget is a 507. Counters of unloaded engines are
//! kept (`/metrics` never goes back). Each model's engine serves:
//!
//! - `online`/`stream`: OpenAI's online routes. A body is read by
//!   `cortex_openai::parse_request` (the batch line checks, plus `stream` and
//!   `stream_options`), the `model` checked against the served one, then a
//!   `Call` submits it with `ONLINE_PRIORITY` added to its priority (admitted
//!   before any waiting queue item) and cancels it in the engine when dropped
//!   unfinished, so a client that goes away (the SSE body is dropped) stops
//!   its generation. Streams wait for the first event before answering, so an
//!   early failure (prompt too long) is a proper 400; then chat/completion
//!   chunks ending in `[DONE]`, or `/v1/responses` events. With tools the text
//!   is held back and sent as text or as `tool_calls` at the end.
//! - `batch_api` + `files`: Files and Batches. Uploads are files in
//!   `<db>.files/` (content and a JSON record, each written to a temporary
//!   name, synced, renamed). An upload is streamed chunk by chunk to its
//!   temporary file and counted against its project's quota
//!   (`max_project_file_bytes`) as it arrives; downloads are streamed from
//!   disk: no file is ever whole in memory. The records are read once at start
//!   into an index (one server owns a files directory): listings page through
//!   it and a project's stored bytes are known at once. At start the temporary
//!   files of writers that are gone and content whose record is gone are
//!   swept; failed batches and exports older than `file_retention` are pruned
//!   hourly. A batch is a job submitted with
//!   `SubmitJsonl::submit_batch` (every line must name the batch's endpoint;
//!   the batch's own fields ride in job metadata), so CLI jobs are batches
//!   too. The file is first read and checked with `check_batch` without the
//!   store (the same report `submit_batch` would give), so a bad file never
//!   holds the store's lock. A file with bad lines gives a `failed` batch kept as a JSON record.
//!   Output and error files are the job's export, written when first asked
//!   for and named by when the job ended (a resumed job ends again; the
//!   export of the earlier end is removed).
//! - `openapi`: `/openapi.json`, OpenAI's routes from `cortex_openai::openapi_document()`
//!   (the wire-format crate owns those shapes) merged with the server's own
//!   (`openapi.json` beside it: Ollama's routes, `/health`, `/metrics`), the
//!   served model's name filled in, made once at start. Schemathesis checks
//!   the server against it (`tests/tests/schemathesis.rs`): a route or a
//!   status added without its description fails there.
//! - `queue_worker`: a thread running `cortex_worker::work_in_turns` (the same
//!   rotation as `cortex worker` without a model) over the model pool, with
//!   `WorkerPlan::parallel` at `batch_parallel`, or an eighth of it while
//!   any online request is in flight (`AppState::online_id` sets it: every
//!   step decodes every running sequence, so online tokens come as fast as
//!   steps do), the rest of the slots left to online requests; it co-operates with `cortex worker` processes through
//!   the queue's leases as any worker does.
//! - `ollama`: Ollama's routes (its JSON is the server's own: only this crate
//!   speaks it): `generate` (generate, chat) and `embed` on the same `Call`s,
//!   the model's `SYSTEM` and `PARAMETER`s under the body's; `manage` (tags,
//!   ps, show, pull with progress, create, blobs streamed into the registry's
//!   `BlobWriter`, copy, delete refused while an unfinished job or the server's
//!   default model needs the weights); `shape` (errors, options, details).
//!   Batches take the model their lines name (one per file).
//! - `metrics`: `prometheus-client` registry; gauges and engine counters are
//!   brought up to date at each scrape. One `Snapshot` (read by `routes::gather`:
//!   the pool's stats, the queue's counts and workers, `system`'s gauges) feeds
//!   both `/metrics` and `/v1/metrics` (JSON), so the two never disagree.
//!   `system`: the process's and the machine's CPU and memory from `/proc`
//!   (CPU as use since the previous scrape); absent where there is no `/proc`.
//! - `jobs_api`: cortex's own JSON view of the queue (`/v1/jobs`...): a page
//!   of jobs (`JobStore::job_page`: filtered, counted and paged in SQL) with
//!   each one's `JobStatus` (rates, ETA), a job's `JobActivity` (completions per
//!   span, latency `Distribution`s from the results' `first_token_ms` and
//!   `duration_ms`), pages of items (`JobStore::item_page`, paged and
//!   filtered in SQL, so a job of 100,000 items costs one page), one item
//!   (`JobStore::item`), cancel/resume/retry. Each handler checks the caller's
//!   project first (`batch_api::caller_job`).
//! - `dashboard`: `/`, `/dashboard.js`, `/dashboard.css`, embedded with
//!   `include_str!` from `src/dashboard/`. The page holds no data and needs no
//!   key; its script reads the JSON API with the key the user gives (kept in
//!   the tab's `sessionStorage`), renders with DOM calls (text is never parsed
//!   as HTML) and polls while a view is shown. A Content-Security-Policy of
//!   `default-src 'self'` holds it to this server. `auth`: API keys (constant-time
//!   compare), every route but `/health`; each key acts for a project and
//!   puts a `Caller` (project, admin, cache scope) in the request for the
//!   handlers. `batch_api` answers another project's file, batch or export as
//!   not found and lists only the caller's (an admin's: all); `/metrics` needs
//!   an admin key. `routes`: body limits (a
//!   Content-Length over the limit is refused before the body is read),
//!   request metrics, OpenAI-shaped 404/405. `shutdown`: first signal stops
//!   accepting, stops the worker (claimed items released), cancels online
//!   requests after the grace period; a second exits at once.
//! - `listen`: the accept loop under axum (hyper's HTTP/1 connections): at
//!   most `max_connections` open (TCP and the Unix socket together), a header
//!   deadline that also closes idle connections, a 64 KiB head, a graceful
//!   stop. The Unix-domain socket is bound in a private directory, given mode
//!   0600 and renamed into place, so it is never reachable with wider rights;
//!   its requests skip the `Host` check (no web page can reach a socket).
//! - `admission`: `max_online_requests` (and per key) on the generation and
//!   embedding routes, a 429 with `Retry-After` beyond it; a request's place
//!   is held by its answer's body, so a stream keeps it until it ends or the
//!   client goes; every request body has `body_timeout` to arrive.
//! - `guard`: the browser's threats to a local server: `Host` must be an IP,
//!   `localhost`, this machine's name or an allowed name (DNS rebinding);
//!   `Origin` a loopback page, the server itself or an allowed origin (which
//!   get CORS answers); a POST body `application/json` (uploads multipart).
//!
//! Layers, outermost first: body limit, request metrics, guard, oversized
//! Content-Length, body deadline, keys, then admission on the online routes:
//! every refusal is counted, and nothing is read from a body before the
//! checks that need no body have passed.
//!
//! Invariant: a project's objects are reachable only by its keys and admin
//! keys; every handler that takes an id checks the `Caller` before it answers,
//! and answers "not found" alike for another's and for none.
//!
//! Invariant: the dashboard loads nothing from another host (no CDN, no
//! remote font): the machines cortex runs on are often offline, and a page
//! that pulls code from elsewhere runs whatever that host serves. Tidy checks
//! its files for absolute URLs.
//!
//! Invariant: the server never panics on a request: every extractor's
//! rejection is taken as a `Result` and answered in OpenAI's error shape
//! (Ollama's on `/api/` routes, `ApiError::for_path`).

#![forbid(unsafe_code)]

mod admission;
mod auth;
mod batch_api;
mod config;
mod dashboard;
mod error;
mod files;
mod guard;
mod jobs_api;
mod listen;
mod metrics;
mod ollama;
mod online;
mod openapi;
mod pool;
mod queue_worker;
mod routes;
mod shutdown;
mod state;
mod stream;
mod system;
mod tokenizer;

use std::sync::Arc;

use cortex_engine::Engine;
use cortex_webhooks::{Deliverer, Notifier};

pub use auth::{ApiKey, ApiKeys};
pub use config::{
    DEFAULT_BODY_TIMEOUT, DEFAULT_FILE_RETENTION, DEFAULT_HEADER_TIMEOUT, DEFAULT_LISTEN,
    DEFAULT_MAX_CLIENT_PRIORITY, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_ONLINE_REQUESTS,
    DEFAULT_MAX_PROJECT_FILE_BYTES, DEFAULT_MAX_REQUEST_TOKENS, ServerConfig,
};
pub use error::ServerError;
pub use pool::{EngineStarter, KeepAlive, PoolLimits};
pub use stream::ONLINE_PRIORITY;

/// How long a stopping server keeps retrying webhook events due soon.
const WEBHOOK_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

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
    let models = pool::ModelPool::new(
        config.registry.clone(),
        config.model.clone(),
        engine,
        config.engine_starter.clone(),
        config.models.clone(),
    );
    // Webhook events of every job in the queue that names a URL.
    let mut notifier = Notifier::new(config.webhook_secret.clone());
    if let Some(exporter) = &config.exporter {
        notifier = notifier.with_exporter(exporter.clone());
    }
    let deliveries = Deliverer::start(config.queue.clone(), notifier);
    let state = state::AppState::open(config, Arc::clone(&models))?;
    let result = runtime.block_on(shutdown::run(Arc::clone(&state)));
    if deliveries.finish(WEBHOOK_GRACE) {
        tracing::warn!(
            "some webhook events were not delivered yet: the next worker or server on this queue retries them"
        );
    }
    drop(state);
    drop(runtime);
    models.unload_all();
    result
}
