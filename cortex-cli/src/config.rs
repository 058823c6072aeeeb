//! The effective configuration: every setting of the table
//! ([`crate::settings`]) resolved from its layers (default, the config file
//! `cortex.toml` in the working directory or else
//! `$XDG_CONFIG_HOME/cortex/cortex.toml`, the environment, the flags), and
//! the two conversions into the libraries' configurations:
//! [`Config::engine_config`] and [`Config::server_config`].

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use cortex_queue::{Database, QueueOpener};

use cortex_engine::{CpuKernels, EngineConfig};
use cortex_queue::{JobId, SubmitOptions};
use cortex_webhooks::Notifier;
use cortex_worker::{ModelIdentity, WorkerPlan};

use crate::cli::SubmitArgs;
use crate::settings::{self, Layers, OrAuto, RawValues, Setting, Settings, Source};

/// Where `cortex serve` listens, and with which keys.
pub(crate) struct ServePlan {
    /// The TCP address (used when `tcp`).
    pub(crate) listen: SocketAddr,
    /// Whether it serves on TCP (not only on the Unix socket).
    pub(crate) tcp: bool,
    /// The Unix-domain socket, if any.
    pub(crate) unix_socket: Option<PathBuf>,
    /// Every key it accepts.
    pub(crate) keys: Vec<cortex_server::ApiKey>,
}

/// The effective configuration.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    /// The file that was read, if any.
    pub(crate) file: Option<PathBuf>,
    settings: Settings,
    /// The config file's `[server.keys]`, each key of a project.
    key_table: Setting<Vec<cortex_server::ApiKey>>,
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

impl Config {
    /// Resolves the configuration from all sources, `flags` being the
    /// setting flags given on the command line.
    pub(crate) fn load(flags: &RawValues) -> anyhow::Result<Self> {
        let local = PathBuf::from("cortex.toml");
        let global = xdg_dir("XDG_CONFIG_HOME", ".config").join("cortex.toml");
        let file_path = [local, global].into_iter().find(|p| p.is_file());
        let (file_values, key_table) = match &file_path {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("cannot read {}", path.display()))?;
                let table: toml::Table = toml::from_str(&text)
                    .map_err(|e| anyhow::anyhow!("{}: {}", path.display(), e.message()))?;
                settings::read_file(table, path)?
            }
            None => (Vec::new(), None),
        };
        let mut settings = Settings::resolve(&Layers {
            file: &file_values,
            file_path: file_path.as_deref(),
            flags,
        })?;
        // Defaults that depend on where the machine keeps data.
        if settings.data_dir.value.as_os_str().is_empty() {
            settings.data_dir.value = xdg_dir("XDG_DATA_HOME", ".local/share");
        }
        if settings.db.value.as_os_str().is_empty() {
            settings.db.value = settings.data_dir.value.join("cortex.db");
        }
        let key_table = match (key_table, &file_path) {
            (Some(table), Some(path)) => Setting {
                value: crate::keys::from_table(
                    table
                        .try_into()
                        .map_err(|e| anyhow::anyhow!("{}: [server.keys]: {e}", path.display()))?,
                    path,
                )?,
                source: Source::File(path.clone()),
            },
            _ => Setting {
                value: Vec::new(),
                source: Source::Default,
            },
        };
        let config = Config {
            file: file_path,
            settings,
            key_table,
        };
        config.check()?;
        Ok(config)
    }

    /// What no single setting can check alone.
    fn check(&self) -> anyhow::Result<()> {
        if self.settings.unix_socket_only.value
            && self.settings.unix_socket.value.as_os_str().is_empty()
        {
            bail!(
                "unix_socket_only (from {}) needs a unix_socket to serve on",
                self.settings.unix_socket_only.source
            );
        }
        if self.settings.lease_seconds.value < 3 {
            bail!(
                "lease_seconds must be at least 3 (from {})",
                self.settings.lease_seconds.source
            );
        }
        Ok(())
    }

    /// Every API key `cortex serve` accepts: `api_keys` (admin keys of the
    /// `default` project), `[server.keys]` and the keys file's.
    fn server_keys(&self) -> anyhow::Result<Vec<cortex_server::ApiKey>> {
        let mut keys: Vec<cortex_server::ApiKey> = self
            .settings
            .api_keys
            .value
            .0
            .iter()
            .map(cortex_server::ApiKey::admin)
            .collect();
        keys.extend(self.key_table.value.iter().cloned());
        if !self.settings.keys_file.value.as_os_str().is_empty() {
            keys.extend(crate::keys::from_file(&self.settings.keys_file.value)?);
        }
        crate::keys::check_distinct(&keys)?;
        Ok(keys)
    }

    /// The configured model, fetched and verified if it is a known one not
    /// fetched yet, else checked.
    pub(crate) fn resolve_model(&self) -> anyhow::Result<ModelIdentity> {
        cortex_worker::resolve(&self.settings.model.value, &self.registry()).with_context(|| {
            format!(
                "cannot use the model (set by {})",
                self.settings.model.source
            )
        })
    }

    /// The configured model's name, SHA-256 and settings, without fetching it.
    pub(crate) fn identify_model(&self) -> anyhow::Result<ModelIdentity> {
        cortex_worker::identify(&self.settings.model.value, &self.registry()).with_context(|| {
            format!(
                "cannot use the model (set by {})",
                self.settings.model.source
            )
        })
    }

    /// The model setting as given (a name, a path), and where it came from.
    pub(crate) fn model_setting(&self) -> (&str, &Source) {
        (&self.settings.model.value, &self.settings.model.source)
    }

    /// The name of the model chosen (by file, environment or flag), as jobs
    /// are submitted for it; `None` when none was.
    pub(crate) fn chosen_model_name(&self) -> Option<String> {
        self.model_chosen().then(|| {
            cortex_worker::identify(&self.settings.model.value, &self.registry())
                .map_or_else(|_| self.settings.model.value.clone(), |model| model.name)
        })
    }

    /// How a worker works the queue: only `jobs` (all when `None`), waiting
    /// for more when `follow`, with the configured lease.
    pub(crate) fn worker_plan(&self, jobs: Option<Vec<JobId>>, follow: bool) -> WorkerPlan {
        WorkerPlan {
            jobs,
            follow,
            chat_template_chosen: !self.settings.chat_template.value.is_empty(),
            ..WorkerPlan::new(Duration::from_secs(self.settings.lease_seconds.value))
        }
    }

    /// How long a model's jobs wait per other model with work, at most.
    pub(crate) fn model_switch(&self) -> Duration {
        Duration::from_secs(self.settings.model_switch_seconds.value)
    }

    /// How lately a worker must have been heard from to count as working:
    /// two leases (it renews its heartbeat within one).
    pub(crate) fn live_worker_window(&self) -> Duration {
        Duration::from_secs(self.settings.lease_seconds.value.saturating_mul(2))
    }

    /// A job's options: the model's own settings under the command's flags,
    /// the configured attempts and chat template.
    pub(crate) fn submit_options(&self, args: &SubmitArgs) -> anyhow::Result<SubmitOptions> {
        let model = self.identify_model()?;
        let mut options = SubmitOptions::new(model.name.clone());
        options.model_sha256 = Some(model.sha256.clone());
        // The model's own settings first; the flags below override them.
        options.defaults = cortex_worker::model_defaults(&model.settings);
        args.request
            .apply(&mut options.defaults.sampling, &mut options.defaults.stop);
        options.defaults.omit_reasoning = args.omit_reasoning;
        options.priority = args.priority;
        options.max_attempts = self.settings.max_attempts.value;
        options.metadata = args.metadata.iter().cloned().collect();
        options.skip_invalid = args.skip_invalid;
        options.force = args.force;
        options.completion_window = args.completion_window;
        options.notify_url = args.notify.clone();
        if let Some(system) = &args.system {
            options.defaults.system = Some(system.clone());
        }
        let chosen = &self.settings.chat_template.value;
        options.chat_template = (!chosen.is_empty()).then(|| chosen.clone());
        options.chats_refused = model.chat_refusal(options.chat_template.as_deref());
        options.defaults.chat_template = model.chat_template(options.chat_template.as_deref());
        Ok(options)
    }

    /// What signs the queue's webhook events.
    pub(crate) fn webhook_notifier(&self) -> Notifier {
        Notifier::new(self.settings.webhook_secret.value.clone())
            .with_exporter(crate::export::exporter())
    }

    /// Where a worker started in the background writes its log.
    pub(crate) fn log_dir(&self) -> PathBuf {
        self.settings.data_dir.value.join("logs")
    }

    /// The engine's configuration for one prompt (`cortex generate`): one
    /// sequence, unless `parallel` was set.
    pub(crate) fn one_prompt_engine_config(&self, model: &ModelIdentity) -> EngineConfig {
        let mut engine = self.engine_config(model);
        if self.settings.parallel.source == Source::Default {
            engine.parallel = 1;
        }
        engine
    }

    /// The engine's configuration for working known jobs that have
    /// `requests` left in all (`cortex run`): left to the device, no more
    /// sequences at once than that.
    pub(crate) fn jobs_engine_config(
        &self,
        model: &ModelIdentity,
        requests: Option<u64>,
    ) -> EngineConfig {
        let mut engine = self.engine_config(model);
        engine.work_bound = requests
            .filter(|&n| n > 0)
            .map(|n| usize::try_from(n).unwrap_or(usize::MAX));
        engine
    }

    /// Where `cortex serve` listens and with which keys (the keys file read
    /// once), known before the model loads.
    pub(crate) fn serve_plan(&self) -> anyhow::Result<ServePlan> {
        Ok(ServePlan {
            listen: self.listen_address()?,
            tcp: !self.settings.unix_socket_only.value,
            unix_socket: self.unix_socket(),
            keys: self.server_keys()?,
        })
    }

    /// The model registry, with the configured model directories.
    pub(crate) fn registry(&self) -> cortex_models::Registry {
        let dirs = std::env::split_paths(&self.settings.model_dirs.value)
            .filter(|d| !d.as_os_str().is_empty())
            .collect();
        cortex_models::Registry::default_location().with_model_dirs(dirs)
    }

    /// This configuration with the model a job's input names (`line` the
    /// first line that names it), when no other was chosen.
    pub(crate) fn with_input_model(&self, name: &str, line: u64) -> Config {
        let mut config = self.clone();
        config.settings.model = Setting {
            value: name.to_owned(),
            source: Source::Input(line),
        };
        config
    }

    /// Whether a model was chosen (by file, environment or flag): a worker
    /// without one works every model's jobs.
    pub(crate) fn model_chosen(&self) -> bool {
        self.settings.model.source != Source::Default
    }

    /// The engine's configuration for `model`: the one conversion of the
    /// engine's settings.
    pub(crate) fn engine_config(&self, model: &ModelIdentity) -> EngineConfig {
        let mut engine = EngineConfig::new(&model.path);
        engine.parallel = self.settings.parallel.value;
        engine.max_batch_tokens = self.settings.batch_tokens.value;
        engine.micro_batch_tokens = self.settings.micro_batch_tokens.value;
        engine.step_loops = self.settings.step_loops.value;
        engine.gap_fill = self.settings.gap_fill.value.given();
        engine.even_chunks = self.settings.even_chunks.value.given();
        engine.steady_steps = self.settings.steady_steps.value;
        engine.step_cells = self.settings.step_cells.value;
        engine.threads = self.settings.threads.value;
        engine.stream_tokens =
            (self.settings.context.value > 0).then_some(self.settings.context.value);
        engine.kv_memory = self.settings.kv_memory_mib.value << 20;
        // The flag (or file, or environment) wins over a registered model's
        // TEMPLATE, which a client may have written: a template's text or a
        // name, never a file for the engine to read (refused when made;
        // one registered before is left out).
        engine.chat_template = (!self.settings.chat_template.value.is_empty())
            .then(|| self.settings.chat_template.value.clone())
            .or_else(|| {
                let template = model.settings.template.clone()?;
                match cortex_llama::check_chat_template_text(&template) {
                    Ok(()) => Some(template),
                    Err(why) => {
                        tracing::warn!(model = %model.name, "its TEMPLATE is left out: {why}");
                        None
                    }
                }
            });
        engine.device = self.settings.device.value.clone();
        engine.gpu_layers = self.settings.gpu_layers.value;
        engine.mmap = self.settings.mmap.value.given();
        engine.cpu_kernels = self.settings.cpu_kernels.value;
        engine.sample_on_device = self.settings.sample_on_device.value;
        engine.prefix_sharing = self.settings.prefix_sharing.value;
        engine.backends_dir = self.backends_dir();
        engine
    }

    /// The server's configuration: the one conversion of the server's
    /// settings. `engine_parallel` is the sequences the default model's
    /// engine runs (batch_parallel's `auto` takes three quarters of them).
    pub(crate) fn server_config(
        &self,
        plan: ServePlan,
        model: ModelIdentity,
        engine_parallel: usize,
        starter: cortex_server::EngineStarter,
    ) -> anyhow::Result<cortex_server::ServerConfig> {
        let mut server = cortex_server::ServerConfig::new(
            model,
            self.queue()?,
            self.files_dir()?,
            self.registry(),
            starter,
        );
        server.models = cortex_server::PoolLimits {
            keep_alive: self.settings.keep_alive.value,
            memory_budget: self.settings.model_memory_mib.value << 20,
            max_loaded: self.settings.max_loaded_models.value.max(1),
            ..cortex_server::PoolLimits::default()
        };
        server.chat_template = (!self.settings.chat_template.value.is_empty())
            .then(|| self.settings.chat_template.value.clone());
        server.model_switch = Duration::from_secs(self.settings.model_switch_seconds.value);
        server.listen = plan.listen;
        server.unix_socket = plan.unix_socket;
        server.unix_socket_only = !plan.tcp;
        server.api_keys = cortex_server::ApiKeys(plan.keys);
        server.lease = Duration::from_secs(self.settings.lease_seconds.value);
        server.max_attempts = self.settings.max_attempts.value;
        server.batch_parallel = self.batch_parallel(engine_parallel);
        server.max_request_tokens = self.settings.max_request_tokens.value;
        server.max_online_requests = self.settings.max_online_requests.value;
        server.max_online_requests_per_key = self.settings.max_online_requests_per_key.value;
        server.max_connections = self.settings.max_connections.value;
        server.header_timeout =
            Duration::from_secs(self.settings.header_timeout_seconds.value.max(1));
        server.body_timeout = Duration::from_secs(self.settings.body_timeout_seconds.value.max(1));
        server.max_client_priority = self.settings.max_client_priority.value;
        server.max_project_file_bytes = self.settings.max_project_file_bytes.value;
        server.file_retention = Duration::from_secs(
            self.settings
                .file_retention_days
                .value
                .saturating_mul(24 * 3600),
        );
        server.allowed_hosts = self.settings.allowed_hosts.value.0.clone();
        server.allowed_origins = self.settings.allowed_origins.value.0.clone();
        server.webhook_url = match self.settings.webhook_url.value.as_str() {
            "" => None,
            url => {
                cortex_webhooks::check_url(url).map_err(|e| anyhow::anyhow!("webhook_url: {e}"))?;
                Some(url.to_owned())
            }
        };
        server.webhook_secret = self.settings.webhook_secret.value.clone();
        server.exporter = Some(crate::export::exporter());
        Ok(server)
    }

    /// Sequences queue items may take of an engine running `parallel`.
    pub(crate) fn batch_parallel(&self, parallel: usize) -> usize {
        match self.settings.batch_parallel.value {
            OrAuto::Auto => parallel - parallel / 4,
            OrAuto::Value(n) => n.min(parallel),
        }
    }

    /// The address `cortex serve` listens on: an IP, or a name such as
    /// `localhost`.
    fn listen_address(&self) -> anyhow::Result<SocketAddr> {
        let (host, port) = (&self.settings.host.value, self.settings.port.value);
        if let Ok(ip) = host.parse::<IpAddr>() {
            return Ok(SocketAddr::new(ip, port));
        }
        (host.as_str(), port)
            .to_socket_addrs()
            .ok()
            .and_then(|mut addresses| addresses.next())
            .with_context(|| {
                format!(
                    "host {host:?} (from {}) is not an address this machine can listen on",
                    self.settings.host.source
                )
            })
    }

    /// The configured Unix-domain socket of `cortex serve`, if any.
    fn unix_socket(&self) -> Option<PathBuf> {
        let path = &self.settings.unix_socket.value;
        (!path.as_os_str().is_empty()).then(|| path.clone())
    }

    /// The configured directory of backend modules, if any.
    fn backends_dir(&self) -> Option<PathBuf> {
        let dir = &self.settings.backends_dir.value;
        (!dir.as_os_str().is_empty()).then(|| dir.clone())
    }

    /// Where `cortex devices` loads the backend modules from (the configured
    /// directory, if any) and which CPU kernels it registers.
    pub(crate) fn device_modules(&self) -> (Option<PathBuf>, CpuKernels) {
        (self.backends_dir(), self.settings.cpu_kernels.value)
    }

    /// The queue's database: a SQLite path (or `sqlite://PATH`) or a
    /// `postgres://` URL. Creates the data directory when the SQLite file is
    /// in its default place there (a path given explicitly must exist).
    pub(crate) fn database(&self) -> anyhow::Result<Database> {
        if self.settings.db.source == Source::Default {
            let dir = &self.settings.data_dir.value;
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create the data directory {}", dir.display()))?;
        }
        Ok(Database::parse(&self.settings.db.value.to_string_lossy()))
    }

    /// The files every command that touches the queue reads, which no
    /// output may replace: the SQLite database (PostgreSQL has none here).
    pub(crate) fn files_read(&self) -> Vec<crate::export::ReadFile> {
        match Database::parse(&self.settings.db.value.to_string_lossy()) {
            Database::Sqlite(path) => {
                vec![crate::export::ReadFile::new(path, "the queue's database")]
            }
            Database::Postgres(_) => Vec::new(),
        }
    }

    /// Opens connections to the configured queue, with its driver.
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
            Database::Postgres(_) => self.settings.data_dir.value.join("files"),
        })
    }

    /// Every setting as (key, value, source), for `cortex config`.
    pub(crate) fn entries(&self) -> Vec<(String, String, String)> {
        let mut rows: Vec<(String, String, String)> = self
            .settings
            .rows()
            .into_iter()
            .map(|(def, value, source)| (def.key(), value, source.to_string()))
            .collect();
        let at = rows
            .iter()
            .position(|(key, _, _)| key == "db")
            .map_or(0, |i| i + 1);
        rows.insert(
            at,
            (
                "db_driver".to_owned(),
                Database::parse(&self.settings.db.value.to_string_lossy())
                    .driver()
                    .to_owned(),
                self.settings.db.source.to_string(),
            ),
        );
        // Where pulled models are kept: not a setting of the file, but what a
        // user looks for beside the data directory.
        let at = rows
            .iter()
            .position(|(key, _, _)| key == "model_dirs")
            .map_or(rows.len(), |i| i + 1);
        let cache_source = match std::env::var_os("CORTEX_CACHE_DIR") {
            Some(_) => "environment variable CORTEX_CACHE_DIR",
            None => "default ($CORTEX_CACHE_DIR, else $XDG_CACHE_HOME/cortex)",
        };
        rows.insert(
            at,
            (
                "model_cache".to_owned(),
                self.registry().root().display().to_string(),
                cache_source.to_owned(),
            ),
        );
        rows.push((
            "server.keys".to_owned(),
            crate::keys::KeysShown(&self.key_table.value).to_string(),
            self.key_table.source.to_string(),
        ));
        rows
    }
}

impl crate::cli::RequestFlags {
    /// Sets what the flags give over a request's defaults (the model's
    /// PARAMETERs, else the library's).
    pub(crate) fn apply(
        &self,
        sampling: &mut cortex_request::SamplingParams,
        stop: &mut cortex_request::StopConditions,
    ) {
        if let Some(max_tokens) = self.max_tokens {
            stop.max_tokens = max_tokens;
        }
        if let Some(temperature) = self.temperature {
            sampling.temperature = temperature;
        }
        if let Some(top_p) = self.top_p {
            sampling.top_p = top_p;
        }
        if self.seed.is_some() {
            sampling.seed = self.seed;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every engine setting left at its default converts to the engine
    /// library's own default: a setting keeps one default from the flag to
    /// where it acts (the settings table names each default once; this
    /// checks all of the engine's at once, not a list).
    fn default_config() -> Config {
        let settings = Settings::resolve(&Layers {
            file: &Vec::new(),
            file_path: None,
            flags: &Vec::new(),
        })
        .unwrap();
        Config {
            file: None,
            settings,
            key_table: Setting {
                value: Vec::new(),
                source: Source::Default,
            },
        }
    }

    fn model_with_template(template: Option<&str>) -> ModelIdentity {
        let mut model = ModelIdentity {
            path: "m.gguf".into(),
            name: "m".into(),
            sha256: String::new(),
            settings: Default::default(),
        };
        model.settings.template = template.map(str::to_owned);
        model
    }

    #[test]
    fn engine_settings_at_their_defaults_are_the_engines_defaults() {
        let config = default_config();
        let model = model_with_template(None);
        let mut converted = config.engine_config(&model);
        let library = EngineConfig::new("m.gguf");
        // Where device modules are searched is the program's own folder.
        converted.backends_dir = library.backends_dir.clone();
        assert_eq!(converted, library);
    }

    /// A registered TEMPLATE a client wrote is a template or a name: one
    /// naming a file (registered before such were refused) is left out, and
    /// the file is never the engine's to read.
    #[test]
    fn a_registered_template_naming_a_file_is_left_out() {
        let config = default_config();
        let file = tempfile::NamedTempFile::new().unwrap();
        let path = file.path().display().to_string();
        for (template, kept) in [
            (path.as_str(), None),
            ("chatml", Some("chatml")),
            ("{{ messages }}", Some("{{ messages }}")),
        ] {
            let engine = config.engine_config(&model_with_template(Some(template)));
            assert_eq!(engine.chat_template.as_deref(), kept, "{template}");
        }
    }
}
