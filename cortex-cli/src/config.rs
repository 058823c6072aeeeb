//! Effective configuration: built-in defaults, then a TOML file (`cortex.toml`
//! in the working directory, else `$XDG_CONFIG_HOME/cortex/cortex.toml`), then
//! environment variables, then flags; each value remembers where it came from.

use std::fmt;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use cortex_engine::{CpuKernels, DeviceChoice, GpuLayers};
use cortex_queue::{Database, QueueOpener};
use serde::Deserialize;

/// Where a setting's value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Source {
    Default,
    File(PathBuf),
    Env(&'static str),
    Flag,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Default => f.write_str("default"),
            Source::File(path) => write!(f, "file {}", path.display()),
            Source::Env(name) => write!(f, "environment variable {name}"),
            Source::Flag => f.write_str("command-line flag"),
        }
    }
}

/// A value and its origin.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Setting<T> {
    pub(crate) value: T,
    pub(crate) source: Source,
}

impl<T> Setting<T> {
    fn default(value: T) -> Self {
        Self {
            value,
            source: Source::Default,
        }
    }
}

/// The file's keys (all optional; unknown keys are an error).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    db: Option<PathBuf>,
    model: Option<String>,
    model_dirs: Option<String>,
    model_switch_seconds: Option<u64>,
    data_dir: Option<PathBuf>,
    threads: Option<usize>,
    parallel: Option<usize>,
    context: Option<usize>,
    kv_memory_mib: Option<usize>,
    lease_seconds: Option<u64>,
    max_attempts: Option<u32>,
    chat_template: Option<String>,
    device: Option<String>,
    gpu_layers: Option<FileGpuLayers>,
    cpu_kernels: Option<String>,
    backends_dir: Option<PathBuf>,
    server: Option<ServerFile>,
}

/// `gpu_layers` in the file: a number or `"all"`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum FileGpuLayers {
    Count(u32),
    Text(String),
}

/// A file value given as text, parsed as its setting's type.
fn parse_file_value<T: std::str::FromStr>(
    key: &str,
    raw: Option<String>,
    file: Option<&Path>,
) -> anyhow::Result<Option<T>>
where
    T::Err: fmt::Display,
{
    raw.map(|raw| {
        raw.parse().map_err(|e| {
            let file = file.map_or_else(String::new, |f| f.display().to_string());
            anyhow::anyhow!("{file}: {key} = {raw:?} is invalid: {e}")
        })
    })
    .transpose()
}

/// The `[server]` table.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ServerFile {
    host: Option<String>,
    port: Option<u16>,
    api_keys: Option<Vec<String>>,
    batch_parallel: Option<usize>,
    max_request_tokens: Option<u64>,
    max_online_requests: Option<usize>,
    max_online_requests_per_key: Option<usize>,
    max_connections: Option<usize>,
    keep_alive: Option<String>,
    model_memory_mib: Option<u64>,
    max_loaded_models: Option<usize>,
    header_timeout_seconds: Option<u64>,
    body_timeout_seconds: Option<u64>,
    max_client_priority: Option<i32>,
    max_project_file_bytes: Option<u64>,
    file_retention_days: Option<u64>,
    allowed_hosts: Option<Vec<String>>,
    allowed_origins: Option<Vec<String>>,
    keys: Option<std::collections::BTreeMap<String, crate::keys::KeyEntry>>,
    keys_file: Option<PathBuf>,
    unix_socket: Option<PathBuf>,
    unix_socket_only: Option<bool>,
}

/// API keys: given as a list in the file, comma-separated in
/// `CORTEX_API_KEYS`; shown only as a count (`Debug` too).
#[derive(Clone, Default, PartialEq, Eq)]
pub(crate) struct ApiKeys(pub(crate) Vec<String>);

impl fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ApiKeys{self}")
    }
}

impl std::str::FromStr for ApiKeys {
    type Err = String;

    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        let keys: Vec<String> = raw
            .split(',')
            .map(str::trim)
            .filter(|k| !k.is_empty())
            .map(str::to_owned)
            .collect();
        if keys.is_empty() {
            return Err("no keys in it".into());
        }
        Ok(Self(keys))
    }
}

impl fmt::Display for ApiKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.len() {
            0 => f.write_str("(none: no key needed)"),
            1 => f.write_str("(1 key)"),
            n => write!(f, "({n} keys)"),
        }
    }
}

/// A list of names (hosts, origins): a list in the file, comma-separated in
/// the environment and on the command line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct NameList(pub(crate) Vec<String>);

impl std::str::FromStr for NameList {
    type Err = std::convert::Infallible;

    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        Ok(Self(
            raw.split(',')
                .map(str::trim)
                .filter(|name| !name.is_empty())
                .map(str::to_owned)
                .collect(),
        ))
    }
}

impl fmt::Display for NameList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            f.write_str("(none)")
        } else {
            f.write_str(&self.0.join(","))
        }
    }
}

/// Flags that override everything.
#[derive(Debug, Default, Clone)]
pub(crate) struct Overrides {
    pub(crate) db: Option<PathBuf>,
    pub(crate) model: Option<String>,
    pub(crate) threads: Option<usize>,
    pub(crate) parallel: Option<usize>,
    pub(crate) chat_template: Option<String>,
    pub(crate) device: Option<DeviceChoice>,
    pub(crate) gpu_layers: Option<GpuLayers>,
    pub(crate) cpu_kernels: Option<CpuKernels>,
    pub(crate) backends_dir: Option<PathBuf>,
    pub(crate) host: Option<String>,
    pub(crate) port: Option<u16>,
    pub(crate) api_keys: Option<ApiKeys>,
    pub(crate) batch_parallel: Option<usize>,
    pub(crate) max_request_tokens: Option<u64>,
    pub(crate) max_online_requests: Option<usize>,
    pub(crate) max_online_requests_per_key: Option<usize>,
    pub(crate) max_connections: Option<usize>,
    pub(crate) keep_alive: Option<String>,
    pub(crate) model_memory_mib: Option<u64>,
    pub(crate) max_loaded_models: Option<usize>,
    pub(crate) header_timeout_seconds: Option<u64>,
    pub(crate) body_timeout_seconds: Option<u64>,
    pub(crate) max_client_priority: Option<i32>,
    pub(crate) max_project_file_bytes: Option<u64>,
    pub(crate) file_retention_days: Option<u64>,
    pub(crate) allowed_hosts: Option<NameList>,
    pub(crate) allowed_origins: Option<NameList>,
    pub(crate) keys_file: Option<PathBuf>,
    pub(crate) unix_socket: Option<PathBuf>,
    pub(crate) unix_socket_only: Option<bool>,
}

/// The effective configuration.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    /// The file that was read, if any.
    pub(crate) file: Option<PathBuf>,
    /// Worker logs and the default database live here.
    pub(crate) data_dir: Setting<PathBuf>,
    /// The job database.
    pub(crate) db: Setting<PathBuf>,
    /// `default` (SmolLM2-135M-Instruct, fetched into the cache), a model
    /// name (`name[:tag]`) or a GGUF path.
    pub(crate) model: Setting<String>,
    /// Directories whose GGUFs are models too, under their file stems
    /// (`:`-separated, as `PATH`).
    pub(crate) model_dirs: Setting<String>,
    /// A worker without `--model` hands the engine to another model's jobs
    /// once they have waited this long (and its model has had a turn as long).
    pub(crate) model_switch_seconds: Setting<u64>,
    /// llama.cpp threads (0: every core).
    pub(crate) threads: Setting<usize>,
    /// Sequences a worker decodes at once.
    pub(crate) parallel: Setting<usize>,
    /// KV cells per sequence (prompt plus generation); 0 sizes them from the job.
    pub(crate) context: Setting<usize>,
    /// Most KV memory in MiB when sized from the job; 0: a quarter of the machine's.
    pub(crate) kv_memory_mib: Setting<usize>,
    /// Lease length; workers heartbeat at a third of it.
    pub(crate) lease_seconds: Setting<u64>,
    /// Attempts per item for new jobs.
    pub(crate) max_attempts: Setting<u32>,
    /// The chat template instead of the model's own (a name llama.cpp knows
    /// or a file); empty: the model's own.
    pub(crate) chat_template: Setting<String>,
    /// The device that runs the model: auto (the first GPU, else the CPU),
    /// cpu, or a device's name.
    pub(crate) device: Setting<DeviceChoice>,
    /// Layers of the model on the GPU.
    pub(crate) gpu_layers: Setting<GpuLayers>,
    /// Which code multiplies the weights on the CPU: cortex's kernels (for
    /// the formats they have) or llama.cpp's.
    pub(crate) cpu_kernels: Setting<CpuKernels>,
    /// A directory of llama.cpp backend modules searched before the
    /// program's own; empty: none.
    pub(crate) backends_dir: Setting<PathBuf>,
    /// `cortex serve`: the address to listen on.
    pub(crate) host: Setting<String>,
    /// `cortex serve`: the port.
    pub(crate) port: Setting<u16>,
    /// `cortex serve`: keys clients must present (none: open, loopback by default).
    pub(crate) api_keys: Setting<ApiKeys>,
    /// `cortex serve`: queue items in the engine at most (the rest of
    /// `parallel` is kept for online requests); 0: no queue work.
    pub(crate) batch_parallel: Setting<usize>,
    /// `cortex serve`: most tokens one online request may ask for
    /// (`n` × `max_tokens`, each cut to the context).
    pub(crate) max_request_tokens: Setting<u64>,
    /// `cortex serve`: online requests answered at once at most (more: 429).
    pub(crate) max_online_requests: Setting<usize>,
    /// `cortex serve`: the same for one API key (0: only the total).
    pub(crate) max_online_requests_per_key: Setting<usize>,
    /// `cortex serve`: open connections at most (more wait).
    pub(crate) max_connections: Setting<usize>,
    /// `cortex serve`: how long a model stays loaded after its last request
    /// (Ollama's forms: `5m`, `1h`, `0`, `-1` for ever).
    pub(crate) keep_alive: Setting<String>,
    /// `cortex serve`: MiB the loaded models may take (weights and KV); 0: no limit.
    pub(crate) model_memory_mib: Setting<u64>,
    /// `cortex serve`: models loaded at once at most.
    pub(crate) max_loaded_models: Setting<usize>,
    /// `cortex serve`: seconds a client may take to send a request's headers (and an idle connection stays open).
    pub(crate) header_timeout_seconds: Setting<u64>,
    /// `cortex serve`: seconds a client may take to send a request's body.
    pub(crate) body_timeout_seconds: Setting<u64>,
    /// `cortex serve`: a client's `priority` is clamped to ± this.
    pub(crate) max_client_priority: Setting<i32>,
    /// `cortex serve`: bytes of uploaded files one project may keep (0: no limit).
    pub(crate) max_project_file_bytes: Setting<u64>,
    /// `cortex serve`: days failed batches and batch exports are kept.
    pub(crate) file_retention_days: Setting<u64>,
    /// `cortex serve`: names clients may use in `Host` besides addresses, localhost and this machine's name (`*`: any).
    pub(crate) allowed_hosts: Setting<NameList>,
    /// `cortex serve`: browser origins allowed to call the server besides loopback pages and its own (`*`: any).
    pub(crate) allowed_origins: Setting<NameList>,
    /// `cortex serve`: the config file's `[server.keys]`, each key of a project.
    pub(crate) key_table: Setting<Vec<cortex_server::ApiKey>>,
    /// `cortex serve`: a file of `KEY PROJECT [admin]` lines; empty: none.
    pub(crate) keys_file: Setting<PathBuf>,
    /// `cortex serve`: a Unix-domain socket (mode 0600) serving the same routes; empty: none.
    pub(crate) unix_socket: Setting<PathBuf>,
    /// `cortex serve`: serve on the Unix-domain socket only, with no TCP port.
    pub(crate) unix_socket_only: Setting<bool>,
}

fn env_path(name: &str) -> Option<PathBuf> {
    std::env::var_os(name)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

fn xdg_dir(variable: &str, fallback: &str) -> PathBuf {
    env_path(variable)
        .or_else(|| env_path("HOME").map(|home| home.join(fallback)))
        .unwrap_or_else(std::env::temp_dir)
        .join("cortex")
}

/// One setting from its layers, the last present winning: `default`, the
/// file's value, the environment variable `env`, the flag. Every setting is
/// resolved by this one rule, in [`Config::load`].
fn resolve<T: std::str::FromStr>(
    default: T,
    file: Option<T>,
    file_path: Option<&Path>,
    env: &'static str,
    flag: Option<T>,
) -> anyhow::Result<Setting<T>>
where
    T::Err: fmt::Display,
{
    let mut setting = Setting::default(default);
    if let (Some(value), Some(path)) = (file, file_path) {
        setting = Setting {
            value,
            source: Source::File(path.to_path_buf()),
        };
    }
    if let Some(raw) = std::env::var(env).ok().filter(|v| !v.is_empty()) {
        let value = raw
            .parse()
            .map_err(|e| anyhow::anyhow!("environment variable {env}={raw:?} is invalid: {e}"))?;
        setting = Setting {
            value,
            source: Source::Env(env),
        };
    }
    if let Some(value) = flag {
        setting = Setting {
            value,
            source: Source::Flag,
        };
    }
    Ok(setting)
}

impl Config {
    /// Resolves the configuration from all sources.
    pub(crate) fn load(overrides: &Overrides) -> anyhow::Result<Self> {
        let local = PathBuf::from("cortex.toml");
        let global = xdg_dir("XDG_CONFIG_HOME", ".config").join("cortex.toml");
        let file_path = [local, global].into_iter().find(|p| p.is_file());
        let file: FileConfig = match &file_path {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("cannot read {}", path.display()))?;
                toml::from_str(&text)
                    .map_err(|e| anyhow::anyhow!("{}: {}", path.display(), e.message()))?
            }
            None => FileConfig::default(),
        };
        let fp = file_path.as_deref();

        let data_dir = resolve(
            xdg_dir("XDG_DATA_HOME", ".local/share"),
            file.data_dir,
            fp,
            "CORTEX_DATA_DIR",
            None,
        )?;
        let db = resolve(
            data_dir.value.join("cortex.db"),
            file.db,
            fp,
            "CORTEX_DB",
            overrides.db.clone(),
        )?;
        let model = resolve(
            "default".to_owned(),
            file.model,
            fp,
            "CORTEX_MODEL",
            overrides.model.clone(),
        )?;
        let model_dirs = resolve(
            String::new(),
            file.model_dirs,
            fp,
            "CORTEX_MODEL_DIRS",
            None,
        )?;
        let model_switch_seconds = resolve(
            600,
            file.model_switch_seconds,
            fp,
            "CORTEX_MODEL_SWITCH_SECONDS",
            None,
        )?;
        let threads = resolve(0, file.threads, fp, "CORTEX_THREADS", overrides.threads)?;
        let parallel = resolve(
            cortex_engine::EngineConfig::DEFAULT_PARALLEL,
            file.parallel,
            fp,
            "CORTEX_PARALLEL",
            overrides.parallel,
        )?;
        let context = resolve(0, file.context, fp, "CORTEX_CONTEXT", None)?;
        let kv_memory_mib = resolve(0, file.kv_memory_mib, fp, "CORTEX_KV_MEMORY_MIB", None)?;
        let lease_seconds = resolve(60, file.lease_seconds, fp, "CORTEX_LEASE_SECONDS", None)?;
        let max_attempts = resolve(3, file.max_attempts, fp, "CORTEX_MAX_ATTEMPTS", None)?;
        let chat_template = resolve(
            String::new(),
            file.chat_template,
            fp,
            "CORTEX_CHAT_TEMPLATE",
            overrides.chat_template.clone(),
        )?;
        let file_device = parse_file_value("device", file.device, fp)?;
        let device = resolve(
            DeviceChoice::Auto,
            file_device,
            fp,
            "CORTEX_DEVICE",
            overrides.device.clone(),
        )?;
        let file_layers = match file.gpu_layers {
            Some(FileGpuLayers::Count(n)) => Some(GpuLayers::Count(n)),
            Some(FileGpuLayers::Text(text)) => parse_file_value("gpu_layers", Some(text), fp)?,
            None => None,
        };
        let gpu_layers = resolve(
            GpuLayers::All,
            file_layers,
            fp,
            "CORTEX_GPU_LAYERS",
            overrides.gpu_layers,
        )?;
        let file_kernels = parse_file_value("cpu_kernels", file.cpu_kernels, fp)?;
        let cpu_kernels = resolve(
            CpuKernels::Cortex,
            file_kernels,
            fp,
            "CORTEX_CPU_KERNELS",
            overrides.cpu_kernels,
        )?;
        let backends_dir = resolve(
            PathBuf::new(),
            file.backends_dir,
            fp,
            "CORTEX_BACKENDS_DIR",
            overrides.backends_dir.clone(),
        )?;
        let server = file.server.unwrap_or_default();
        let host = resolve(
            "127.0.0.1".to_owned(),
            server.host,
            fp,
            "CORTEX_HOST",
            overrides.host.clone(),
        )?;
        let port = resolve(8080, server.port, fp, "CORTEX_PORT", overrides.port)?;
        let api_keys = resolve(
            ApiKeys::default(),
            server.api_keys.map(ApiKeys),
            fp,
            "CORTEX_API_KEYS",
            overrides.api_keys.clone(),
        )?;
        let batch_parallel = resolve(
            parallel.value - parallel.value / 4,
            server.batch_parallel,
            fp,
            "CORTEX_BATCH_PARALLEL",
            overrides.batch_parallel,
        )?;
        let max_request_tokens = resolve(
            cortex_server::DEFAULT_MAX_REQUEST_TOKENS,
            server.max_request_tokens,
            fp,
            "CORTEX_MAX_REQUEST_TOKENS",
            overrides.max_request_tokens,
        )?;
        let max_online_requests = resolve(
            cortex_server::DEFAULT_MAX_ONLINE_REQUESTS,
            server.max_online_requests,
            fp,
            "CORTEX_MAX_ONLINE_REQUESTS",
            overrides.max_online_requests,
        )?;
        let max_online_requests_per_key = resolve(
            0,
            server.max_online_requests_per_key,
            fp,
            "CORTEX_MAX_ONLINE_REQUESTS_PER_KEY",
            overrides.max_online_requests_per_key,
        )?;
        let max_connections = resolve(
            cortex_server::DEFAULT_MAX_CONNECTIONS,
            server.max_connections,
            fp,
            "CORTEX_MAX_CONNECTIONS",
            overrides.max_connections,
        )?;
        let keep_alive = resolve(
            "5m".to_owned(),
            server.keep_alive,
            fp,
            "CORTEX_KEEP_ALIVE",
            overrides.keep_alive.clone(),
        )?;
        let model_memory_mib = resolve(
            0,
            server.model_memory_mib,
            fp,
            "CORTEX_MODEL_MEMORY_MIB",
            overrides.model_memory_mib,
        )?;
        let max_loaded_models = resolve(
            3,
            server.max_loaded_models,
            fp,
            "CORTEX_MAX_LOADED_MODELS",
            overrides.max_loaded_models,
        )?;
        let header_timeout_seconds = resolve(
            cortex_server::DEFAULT_HEADER_TIMEOUT.as_secs(),
            server.header_timeout_seconds,
            fp,
            "CORTEX_HEADER_TIMEOUT_SECONDS",
            overrides.header_timeout_seconds,
        )?;
        let body_timeout_seconds = resolve(
            cortex_server::DEFAULT_BODY_TIMEOUT.as_secs(),
            server.body_timeout_seconds,
            fp,
            "CORTEX_BODY_TIMEOUT_SECONDS",
            overrides.body_timeout_seconds,
        )?;
        let max_client_priority = resolve(
            cortex_server::DEFAULT_MAX_CLIENT_PRIORITY,
            server.max_client_priority,
            fp,
            "CORTEX_MAX_CLIENT_PRIORITY",
            overrides.max_client_priority,
        )?;
        let max_project_file_bytes = resolve(
            cortex_server::DEFAULT_MAX_PROJECT_FILE_BYTES,
            server.max_project_file_bytes,
            fp,
            "CORTEX_MAX_PROJECT_FILE_BYTES",
            overrides.max_project_file_bytes,
        )?;
        let file_retention_days = resolve(
            cortex_server::DEFAULT_FILE_RETENTION.as_secs() / (24 * 3600),
            server.file_retention_days,
            fp,
            "CORTEX_FILE_RETENTION_DAYS",
            overrides.file_retention_days,
        )?;
        let allowed_hosts = resolve(
            NameList::default(),
            server.allowed_hosts.map(NameList),
            fp,
            "CORTEX_ALLOWED_HOSTS",
            overrides.allowed_hosts.clone(),
        )?;
        let allowed_origins = resolve(
            NameList::default(),
            server.allowed_origins.map(NameList),
            fp,
            "CORTEX_ALLOWED_ORIGINS",
            overrides.allowed_origins.clone(),
        )?;
        let mut key_table = Setting::default(Vec::new());
        if let (Some(table), Some(path)) = (server.keys, fp) {
            key_table = Setting {
                value: crate::keys::from_table(table, path)?,
                source: Source::File(path.to_path_buf()),
            };
        }
        let keys_file = resolve(
            PathBuf::new(),
            server.keys_file,
            fp,
            "CORTEX_KEYS_FILE",
            overrides.keys_file.clone(),
        )?;
        let unix_socket = resolve(
            PathBuf::new(),
            server.unix_socket,
            fp,
            "CORTEX_UNIX_SOCKET",
            overrides.unix_socket.clone(),
        )?;
        let unix_socket_only = resolve(
            false,
            server.unix_socket_only,
            fp,
            "CORTEX_UNIX_SOCKET_ONLY",
            overrides.unix_socket_only,
        )?;
        if unix_socket_only.value && unix_socket.value.as_os_str().is_empty() {
            bail!(
                "unix_socket_only (from {}) needs a unix_socket to serve on",
                unix_socket_only.source
            );
        }
        if parallel.value == 0 {
            bail!("parallel must be at least 1 (from {})", parallel.source);
        }
        if lease_seconds.value < 3 {
            bail!(
                "lease_seconds must be at least 3 (from {})",
                lease_seconds.source
            );
        }
        Ok(Config {
            file: file_path,
            data_dir,
            db,
            model,
            model_dirs,
            model_switch_seconds,
            threads,
            parallel,
            context,
            kv_memory_mib,
            lease_seconds,
            max_attempts,
            chat_template,
            device,
            gpu_layers,
            cpu_kernels,
            backends_dir,
            host,
            port,
            api_keys,
            batch_parallel,
            max_request_tokens,
            max_online_requests,
            max_online_requests_per_key,
            max_connections,
            keep_alive,
            model_memory_mib,
            max_loaded_models,
            header_timeout_seconds,
            body_timeout_seconds,
            max_client_priority,
            max_project_file_bytes,
            file_retention_days,
            allowed_hosts,
            allowed_origins,
            key_table,
            keys_file,
            unix_socket,
            unix_socket_only,
        })
    }

    /// Every API key `cortex serve` accepts: `api_keys` (admin keys of the
    /// `default` project), `[server.keys]` and the keys file's.
    pub(crate) fn server_keys(&self) -> anyhow::Result<Vec<cortex_server::ApiKey>> {
        let mut keys: Vec<cortex_server::ApiKey> = self
            .api_keys
            .value
            .0
            .iter()
            .map(cortex_server::ApiKey::admin)
            .collect();
        keys.extend(self.key_table.value.iter().cloned());
        if !self.keys_file.value.as_os_str().is_empty() {
            keys.extend(crate::keys::from_file(&self.keys_file.value)?);
        }
        crate::keys::check_distinct(&keys)?;
        Ok(keys)
    }

    /// The model registry, with the configured model directories.
    pub(crate) fn registry(&self) -> cortex_models::Registry {
        let dirs = std::env::split_paths(&self.model_dirs.value)
            .filter(|d| !d.as_os_str().is_empty())
            .collect();
        cortex_models::Registry::default_location().with_model_dirs(dirs)
    }

    /// Whether a model was chosen (by file, environment or flag): a worker
    /// without one works every model's jobs.
    pub(crate) fn model_chosen(&self) -> bool {
        self.model.source != Source::Default
    }

    /// Engine settings for `model` from this configuration, running
    /// `parallel` sequences at once.
    pub(crate) fn engine(
        &self,
        model: &cortex_worker::ModelIdentity,
        parallel: usize,
    ) -> cortex_engine::EngineConfig {
        let mut engine = cortex_engine::EngineConfig::new(&model.path);
        engine.parallel = parallel;
        engine.threads = self.threads.value;
        engine.stream_tokens = (self.context.value > 0).then_some(self.context.value);
        engine.kv_memory = self.kv_memory_mib.value << 20;
        // The flag (or file, or environment) wins over a registered model's TEMPLATE.
        engine.chat_template = (!self.chat_template.value.is_empty())
            .then(|| self.chat_template.value.clone())
            .or_else(|| model.settings.template.clone());
        engine.device = self.device.value.clone();
        engine.gpu_layers = self.gpu_layers.value;
        engine.cpu_kernels = self.cpu_kernels.value;
        engine.backends_dir = self.backends_dir();
        engine
    }

    /// The configured Unix-domain socket of `cortex serve`, if any.
    pub(crate) fn unix_socket(&self) -> Option<PathBuf> {
        let path = &self.unix_socket.value;
        (!path.as_os_str().is_empty()).then(|| path.clone())
    }

    /// The configured directory of backend modules, if any.
    pub(crate) fn backends_dir(&self) -> Option<PathBuf> {
        let dir = &self.backends_dir.value;
        (!dir.as_os_str().is_empty()).then(|| dir.clone())
    }

    /// The queue's database: a SQLite path (or `sqlite://PATH`) or a
    /// `postgres://` URL. Creates the data directory when the SQLite file is
    /// in its default place there (a path given explicitly must exist).
    pub(crate) fn database(&self) -> anyhow::Result<Database> {
        if self.db.source == Source::Default {
            let dir = &self.data_dir.value;
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create the data directory {}", dir.display()))?;
        }
        Ok(Database::parse(&self.db.value.to_string_lossy()))
    }

    /// Opens connections to the configured queue, on its backend.
    pub(crate) fn queue(&self) -> anyhow::Result<QueueOpener> {
        Ok(match self.database()? {
            Database::Sqlite(path) => cortex_queue_sqlite::Store::opener(path),
            #[cfg(feature = "postgres")]
            Database::Postgres(url) => {
                let config = cortex_queue_postgres::PgConfig::default();
                cortex_queue_postgres::PgStore::opener(&url, config)
            }
            #[cfg(not(feature = "postgres"))]
            Database::Postgres(_) => anyhow::bail!(
                "this cortex was built without PostgreSQL support (the `postgres` feature of cortex-cli)"
            ),
        })
    }

    /// Where uploaded files and batch exports live: beside a SQLite file,
    /// else in the data directory (PostgreSQL stores no files).
    pub(crate) fn files_dir(&self) -> anyhow::Result<PathBuf> {
        Ok(match self.database()? {
            Database::Sqlite(path) => path.with_extension("files"),
            Database::Postgres(_) => self.data_dir.value.join("files"),
        })
    }

    /// Every setting as (key, value, source), for `cortex config`.
    pub(crate) fn entries(&self) -> Vec<(&'static str, String, String)> {
        let show = |key, value: String, source: &Source| (key, value, source.to_string());
        vec![
            show(
                "db",
                Database::parse(&self.db.value.to_string_lossy()).to_string(),
                &self.db.source,
            ),
            show(
                "db_backend",
                Database::parse(&self.db.value.to_string_lossy())
                    .backend()
                    .to_owned(),
                &self.db.source,
            ),
            show("model", self.model.value.clone(), &self.model.source),
            show(
                "model_dirs",
                self.model_dirs.value.clone(),
                &self.model_dirs.source,
            ),
            show(
                "model_switch_seconds",
                self.model_switch_seconds.value.to_string(),
                &self.model_switch_seconds.source,
            ),
            show(
                "data_dir",
                self.data_dir.value.display().to_string(),
                &self.data_dir.source,
            ),
            show(
                "threads",
                self.threads.value.to_string(),
                &self.threads.source,
            ),
            show(
                "parallel",
                self.parallel.value.to_string(),
                &self.parallel.source,
            ),
            show(
                "context",
                self.context.value.to_string(),
                &self.context.source,
            ),
            show(
                "kv_memory_mib",
                self.kv_memory_mib.value.to_string(),
                &self.kv_memory_mib.source,
            ),
            show(
                "lease_seconds",
                self.lease_seconds.value.to_string(),
                &self.lease_seconds.source,
            ),
            show(
                "max_attempts",
                self.max_attempts.value.to_string(),
                &self.max_attempts.source,
            ),
            show(
                "chat_template",
                if self.chat_template.value.is_empty() {
                    "(the model's own)".to_owned()
                } else {
                    self.chat_template.value.clone()
                },
                &self.chat_template.source,
            ),
            show("device", self.device.value.to_string(), &self.device.source),
            show(
                "gpu_layers",
                self.gpu_layers.value.to_string(),
                &self.gpu_layers.source,
            ),
            show(
                "cpu_kernels",
                self.cpu_kernels.value.to_string(),
                &self.cpu_kernels.source,
            ),
            show(
                "backends_dir",
                match self.backends_dir() {
                    Some(dir) => dir.display().to_string(),
                    None => "(none: beside the program)".to_owned(),
                },
                &self.backends_dir.source,
            ),
            show("server.host", self.host.value.clone(), &self.host.source),
            show(
                "server.port",
                self.port.value.to_string(),
                &self.port.source,
            ),
            show(
                "server.api_keys",
                self.api_keys.value.to_string(),
                &self.api_keys.source,
            ),
            show(
                "server.batch_parallel",
                self.batch_parallel.value.to_string(),
                &self.batch_parallel.source,
            ),
            show(
                "server.max_request_tokens",
                self.max_request_tokens.value.to_string(),
                &self.max_request_tokens.source,
            ),
            show(
                "server.max_online_requests",
                self.max_online_requests.value.to_string(),
                &self.max_online_requests.source,
            ),
            show(
                "server.max_online_requests_per_key",
                self.max_online_requests_per_key.value.to_string(),
                &self.max_online_requests_per_key.source,
            ),
            show(
                "server.max_connections",
                self.max_connections.value.to_string(),
                &self.max_connections.source,
            ),
            show(
                "server.keep_alive",
                self.keep_alive.value.clone(),
                &self.keep_alive.source,
            ),
            show(
                "server.model_memory_mib",
                self.model_memory_mib.value.to_string(),
                &self.model_memory_mib.source,
            ),
            show(
                "server.max_loaded_models",
                self.max_loaded_models.value.to_string(),
                &self.max_loaded_models.source,
            ),
            show(
                "server.header_timeout_seconds",
                self.header_timeout_seconds.value.to_string(),
                &self.header_timeout_seconds.source,
            ),
            show(
                "server.body_timeout_seconds",
                self.body_timeout_seconds.value.to_string(),
                &self.body_timeout_seconds.source,
            ),
            show(
                "server.max_client_priority",
                self.max_client_priority.value.to_string(),
                &self.max_client_priority.source,
            ),
            show(
                "server.max_project_file_bytes",
                self.max_project_file_bytes.value.to_string(),
                &self.max_project_file_bytes.source,
            ),
            show(
                "server.file_retention_days",
                self.file_retention_days.value.to_string(),
                &self.file_retention_days.source,
            ),
            show(
                "server.allowed_hosts",
                self.allowed_hosts.value.to_string(),
                &self.allowed_hosts.source,
            ),
            show(
                "server.allowed_origins",
                self.allowed_origins.value.to_string(),
                &self.allowed_origins.source,
            ),
            show(
                "server.keys",
                crate::keys::KeysShown(&self.key_table.value).to_string(),
                &self.key_table.source,
            ),
            show(
                "server.keys_file",
                if self.keys_file.value.as_os_str().is_empty() {
                    "(none)".to_owned()
                } else {
                    self.keys_file.value.display().to_string()
                },
                &self.keys_file.source,
            ),
            show(
                "server.unix_socket",
                self.unix_socket()
                    .map_or_else(|| "(none)".to_owned(), |p| p.display().to_string()),
                &self.unix_socket.source,
            ),
            show(
                "server.unix_socket_only",
                self.unix_socket_only.value.to_string(),
                &self.unix_socket_only.source,
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    /// A setting keeps one name: `NAME` in the file (or its `[server]`
    /// table), `CORTEX_NAME` in the environment, `Config::NAME` in code.
    #[test]
    fn every_setting_keeps_its_name_from_the_file_to_the_environment() {
        let source = include_str!("config.rs");
        let start = source.find("pub(crate) fn load(").expect("Config::load");
        let end = start + source[start..].find("Ok(Config {").expect("its result");
        let load = &source[start..end];
        let mut checked = 0;
        for (at, _) in load.match_indices("= resolve(") {
            let name = load[..at]
                .trim_end()
                .rsplit(' ')
                .next()
                .expect("a let binding");
            let call = &load[at..];
            let call = &call[..call.find(")?;").expect("a resolve call ends")];
            let env = call.rsplit('"').nth(1).expect("an environment variable");
            assert_eq!(
                env,
                format!("CORTEX_{}", name.to_uppercase()),
                "setting {name}"
            );
            checked += 1;
        }
        assert!(checked >= 30, "only {checked} settings found");
    }
}
