//! How a server runs: [`ServerConfig`] and its defaults (the CLI's settings
//! table takes them from here).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use cortex_models::Registry;
use cortex_queue::QueueOpener;
use cortex_webhooks::{Exporter, SigningSecret};
use cortex_worker::ModelIdentity;

use crate::{ApiKeys, EngineStarter, PoolLimits};

/// [`ServerConfig::listen`] by default: this machine only.
pub const DEFAULT_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 8080);

/// [`ServerConfig::max_request_tokens`] by default: 16 completions of a
/// whole 8,192-token context.
pub const DEFAULT_MAX_REQUEST_TOKENS: u64 = 1 << 17;

/// [`ServerConfig::max_online_requests`] by default: four times the
/// engine's default sequences, so a burst queues briefly in the engine
/// while a flood is refused.
pub const DEFAULT_MAX_ONLINE_REQUESTS: usize = 256;

/// [`ServerConfig::max_connections`] by default.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;

/// [`ServerConfig::header_timeout`] by default.
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// [`ServerConfig::body_timeout`] by default.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(60);

/// [`ServerConfig::max_client_priority`] by default.
pub const DEFAULT_MAX_CLIENT_PRIORITY: i32 = 1000;

/// [`ServerConfig::max_project_file_bytes`] by default: 10 GiB.
pub const DEFAULT_MAX_PROJECT_FILE_BYTES: u64 = 10 << 30;

/// [`ServerConfig::file_retention`] by default: 30 days.
pub const DEFAULT_FILE_RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);

/// How a server runs.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ServerConfig {
    /// Where to listen (TCP).
    pub listen: SocketAddr,
    /// A Unix-domain socket to serve the same routes on, created with mode
    /// 0600 so that only its owner can connect (and no web page can).
    pub unix_socket: Option<PathBuf>,
    /// Serve only on [`ServerConfig::unix_socket`], with no TCP port.
    pub unix_socket_only: bool,
    /// Keys a client must present (`Authorization: Bearer KEY`), each of a
    /// project; none: open, every request the `default` project's.
    pub api_keys: ApiKeys,
    /// The default model: what a request without a `model` (or with
    /// `default`) gets, loaded at start.
    pub model: ModelIdentity,
    /// Where other models are found by name.
    pub registry: Registry,
    /// The chat template engines render chats with instead of a model's
    /// own (`--chat-template`), if one was chosen: batches of chats for a
    /// model without a template of its own are taken only then.
    pub chat_template: Option<String>,
    /// How a model a request names is loaded.
    pub engine_starter: EngineStarter,
    /// How many models stay loaded, and for how long.
    pub models: PoolLimits,
    /// Largest GGUF a client may upload to `/api/blobs`, bytes.
    pub max_blob_bytes: usize,
    /// The server's queue worker hands its engine to another model's jobs
    /// once they have waited this long (and its model has had a turn as long).
    pub model_switch: Duration,
    /// The queue (SQLite or PostgreSQL).
    pub queue: QueueOpener,
    /// Where uploaded files and batch exports live.
    pub files_dir: PathBuf,
    /// Lease of the items the server's worker claims.
    pub lease: Duration,
    /// Attempts per item of the batches made through the Batch API.
    pub max_attempts: u32,
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
    /// Most bytes of uploaded files one project may keep (0: no limit);
    /// an upload that would go over is refused (413).
    pub max_project_file_bytes: u64,
    /// How long failed batches and batch exports are kept (an export is
    /// made again when asked for); pruned at start and every hour.
    pub file_retention: Duration,
    /// How long in-flight online requests may run on after a stop signal
    /// before they are cancelled.
    pub shutdown_grace: Duration,
    /// Online requests (generation and embeddings) answered at once at
    /// most; beyond it a 429 with `Retry-After`.
    pub max_online_requests: usize,
    /// The same, for the requests of one API key (0: only the total).
    pub max_online_requests_per_key: usize,
    /// Open connections at most; more wait to be accepted.
    pub max_connections: usize,
    /// How long a client may take to send a request's headers, and how
    /// long an idle connection stays open (slow clients are cut off).
    pub header_timeout: Duration,
    /// How long a client may take to send a request's body.
    pub body_timeout: Duration,
    /// A client's `priority` is clamped to ± this, so no request outranks
    /// the server's own online priority ([`ONLINE_PRIORITY`]) or another
    /// online request by more than it.
    pub max_client_priority: i32,
    /// Names a client may use in `Host` besides IP addresses and
    /// `localhost` when the server listens on loopback (`*`: any name).
    /// Anything else is refused, which stops DNS rebinding.
    pub allowed_hosts: Vec<String>,
    /// Browser origins (`Origin`) allowed to call the server besides
    /// loopback pages and its own (`*`: any origin).
    pub allowed_origins: Vec<String>,
    /// Where batches created through the Batch API announce their end
    /// (`batch.completed`, ...): a webhook URL, or none.
    pub webhook_url: Option<String>,
    /// The key the server signs the webhook events it delivers with (of
    /// every job in its queue that names a URL); empty: unsigned.
    pub webhook_secret: SigningSecret,
    /// How the results of a job that carries a destination (`submit
    /// --output`) are written when it ends; `None`: left to a worker.
    pub exporter: Option<Exporter>,
}

impl ServerConfig {
    /// Listens on 127.0.0.1:8080 without keys; the queue `queue` opens,
    /// files in `files_dir`; 60 s leases; 48 queue items at most (of the
    /// engine's default 64 slots); 131,072 tokens a request; 32 MiB bodies,
    /// 512 MiB files, 10 GiB of files a project, kept 30 days; 5 s grace; 256 online requests at once (no cap per
    /// key); 1,024 connections; 10 s for headers, 60 s for a body;
    /// priorities within ±1,000; no other hosts or origins; models kept 5
    /// minutes after their last request, at most 3 loaded, no memory budget;
    /// blobs of 64 GiB at most.
    pub fn new(
        model: ModelIdentity,
        queue: QueueOpener,
        files_dir: impl Into<PathBuf>,
        registry: Registry,
        engine_starter: EngineStarter,
    ) -> Self {
        Self {
            registry,
            chat_template: None,
            engine_starter,
            models: PoolLimits::default(),
            max_blob_bytes: 64 << 30,
            model_switch: cortex_worker::DEFAULT_MODEL_SWITCH,
            listen: DEFAULT_LISTEN,
            unix_socket: None,
            unix_socket_only: false,
            api_keys: ApiKeys::default(),
            model,
            queue,
            files_dir: files_dir.into(),
            lease: cortex_queue::DEFAULT_LEASE,
            max_attempts: cortex_queue::DEFAULT_MAX_ATTEMPTS,
            batch_parallel: 48,
            max_request_tokens: DEFAULT_MAX_REQUEST_TOKENS,
            max_body_bytes: 32 << 20,
            max_file_bytes: 512 << 20,
            max_project_file_bytes: DEFAULT_MAX_PROJECT_FILE_BYTES,
            file_retention: DEFAULT_FILE_RETENTION,
            shutdown_grace: Duration::from_secs(5),
            max_online_requests: DEFAULT_MAX_ONLINE_REQUESTS,
            max_online_requests_per_key: 0,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            body_timeout: DEFAULT_BODY_TIMEOUT,
            max_client_priority: DEFAULT_MAX_CLIENT_PRIORITY,
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
            webhook_url: None,
            webhook_secret: SigningSecret::default(),
            exporter: None,
        }
    }
}
