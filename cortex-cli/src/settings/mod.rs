//! Every setting, declared once: its key in the config file, its flag, its
//! `CORTEX_*` variable, its type, its default (taken from the library that
//! acts on it) and its help. Everything else comes from this table: clap's
//! arguments for each command (only the settings that apply to it, each help
//! line ending with the default and the variable), the file's keys, the
//! layering (default, then the file, then the environment, then the flag)
//! and `cortex config`'s rows with where each value came from.
//!
//! The key is the field's name (`[server]`'s settings are `server.NAME` in
//! the file), the variable `CORTEX_` and the name in capitals, the flag
//! `--name-with-dashes`: one name from the flag to where the setting acts.
//!
//! Split by concern: this file is the table and what a setting is (its
//! definition, its sources, the layering); `values` the types a setting
//! holds and how each reads and shows; `flags` clap's arguments for each
//! command's scope; `file` the config file's keys.

mod file;
mod flags;
mod values;

use std::fmt;
use std::path::{Path, PathBuf};

use cortex_engine::{CpuKernels, DeviceChoice, EngineConfig, GpuLayers};
use cortex_server::KeepAlive;
use cortex_webhooks::SigningSecret;

pub(crate) use file::read_file;
pub(crate) use flags::{
    BeforeCommand, ForConfig, ForDevices, ForEngine, ForList, ForModels, ForQueue, ForRun,
    ForServe, ForSubmit, ForWorker, Scope, SettingFlags,
};
pub(crate) use values::{ApiKeys, NameList, OrAuto, SettingValue};

/// Where a setting's value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Source {
    Default,
    File(PathBuf),
    Env(String),
    Flag,
    /// The model the input file's lines name (from this line).
    Input(u64),
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Default => f.write_str("default"),
            Source::File(path) => write!(f, "file {}", path.display()),
            Source::Env(name) => write!(f, "environment variable {name}"),
            Source::Flag => f.write_str("command-line flag"),
            Source::Input(line) => write!(f, "the input's line {line}"),
        }
    }
}

/// A value and its origin.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Setting<T> {
    pub(crate) value: T,
    pub(crate) source: Source,
}

/// Which commands a setting applies to (see [`Scope`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Group {
    /// Where jobs are kept: every command that reads or writes the queue.
    Queue,
    /// Which model, and where models are found.
    Model,
    /// How the engine runs the model.
    Engine,
    /// How a worker holds its items and shares its engine between models.
    Work,
    /// What a job gets when it is submitted.
    Submit,
    /// `cortex serve`.
    Server,
}

/// One setting as the table declares it.
#[derive(Debug)]
pub(crate) struct Def {
    /// The field's name: the file's key (under `[server]` for server
    /// settings), and the flag and the variable spelt from it.
    pub(crate) name: &'static str,
    pub(crate) group: Group,
    /// The flag, when it is not `--` and the name with dashes.
    flag_override: Option<&'static str>,
    value_name: &'static str,
    /// The help text (the field's doc comment).
    doc: &'static str,
    /// What an empty value means, shown in its place (`(none)` if unset).
    empty: &'static str,
    /// The default as `cortex config` shows it.
    default: fn() -> String,
    /// Whether a raw value parses as the setting's type.
    check: fn(&str) -> Result<(), String>,
    /// A flag given several times (`--api-key A --api-key B`): joined with commas.
    repeatable: bool,
}

impl Def {
    /// The key in the config file.
    pub(crate) fn key(&self) -> String {
        match self.group {
            Group::Server => format!("server.{}", self.name),
            _ => self.name.to_owned(),
        }
    }

    /// The environment variable.
    pub(crate) fn env(&self) -> String {
        format!("CORTEX_{}", self.name.to_uppercase())
    }

    /// The flag, without its dashes.
    pub(crate) fn flag(&self) -> String {
        self.flag_override
            .map_or_else(|| self.name.replace('_', "-"), str::to_owned)
    }

    /// The help text in one paragraph.
    fn help(&self) -> String {
        self.doc.split_whitespace().collect::<Vec<_>>().join(" ")
    }

    /// A value as `cortex config` shows it.
    pub(crate) fn shown(&self, value: &str) -> String {
        if value.is_empty() {
            format!(
                "({})",
                if self.empty.is_empty() {
                    "none"
                } else {
                    self.empty
                }
            )
        } else {
            value.to_owned()
        }
    }

    /// clap's argument for it: its help ends with the default and the variable.
    fn arg(&'static self) -> clap::Arg {
        let check = self.check;
        let default = (self.default)();
        let help = format!(
            "{} [default: {}] [env: {}]",
            self.help(),
            self.shown(&default),
            self.env()
        );
        let arg = clap::Arg::new(self.name)
            .long(self.flag())
            .value_name(self.value_name)
            .help(help)
            .value_parser(move |raw: &str| check(raw).map(|()| raw.to_owned()));
        if self.value_name == "BOOL" {
            // `--unix-socket-only` alone means true.
            arg.num_args(0..=1).default_missing_value("true")
        } else if self.repeatable {
            arg.action(clap::ArgAction::Append)
        } else {
            arg.action(clap::ArgAction::Set)
        }
    }
}

/// The raw values of one source, by setting name.
pub(crate) type RawValues = Vec<(&'static str, String)>;

/// What the layers above the defaults hold: the file's values, the
/// environment, the flags.
pub(crate) struct Layers<'a> {
    pub(crate) file: &'a RawValues,
    pub(crate) file_path: Option<&'a Path>,
    pub(crate) flags: &'a RawValues,
}

impl Layers<'_> {
    /// One setting from its layers, the last present winning.
    fn resolve<T: SettingValue>(&self, def: &Def, default: T) -> anyhow::Result<Setting<T>>
    where
        T::Err: fmt::Display,
    {
        let lookup = |values: &RawValues| {
            values
                .iter()
                .rev()
                .find(|(name, _)| *name == def.name)
                .map(|(_, raw)| raw.clone())
        };
        let mut setting = Setting {
            value: default,
            source: Source::Default,
        };
        if let (Some(raw), Some(path)) = (lookup(self.file), self.file_path) {
            setting = Setting {
                value: raw.parse().map_err(|e| {
                    anyhow::anyhow!(
                        "{}: {} = {raw:?} is invalid: {e}",
                        path.display(),
                        def.key()
                    )
                })?,
                source: Source::File(path.to_path_buf()),
            };
        }
        let env = def.env();
        if let Some(raw) = std::env::var(&env).ok().filter(|v| !v.is_empty()) {
            setting = Setting {
                value: raw.parse().map_err(|e| {
                    anyhow::anyhow!("environment variable {env}={raw:?} is invalid: {e}")
                })?,
                source: Source::Env(env),
            };
        }
        if let Some(raw) = lookup(self.flags) {
            setting = Setting {
                value: raw
                    .parse()
                    .map_err(|e| anyhow::anyhow!("--{} {raw:?} is invalid: {e}", def.flag()))?,
                source: Source::Flag,
            };
        }
        Ok(setting)
    }
}

/// Declares the settings: the typed [`Settings`], the [`DEFS`] table and
/// the one resolution of every setting from its layers.
macro_rules! settings {
    ($(
        $(#[doc = $doc:literal])+
        $name:ident: $ty:ty = $default:expr;
        $group:ident, $value_name:literal
        $(, empty = $empty:literal)?
        $(, flag = $flag:literal)?
        $(, repeatable = $repeatable:literal)?
        ;
    )*) => {
        /// Every setting's value and where it came from.
        #[derive(Debug, Clone)]
        pub(crate) struct Settings {
            $(
                $(#[doc = $doc])+
                pub(crate) $name: Setting<$ty>,
            )*
        }

        /// The table of settings, in the order `cortex config` shows them.
        pub(crate) static DEFS: &[Def] = &[
            $(Def {
                name: stringify!($name),
                group: Group::$group,
                flag_override: settings!(@option $($flag)?),
                value_name: $value_name,
                doc: concat!($($doc, "\n"),+),
                empty: settings!(@text $($empty)?),
                default: || SettingValue::shown(&{ let value: $ty = $default; value }),
                check: |raw| raw.parse::<$ty>().map(|_| ()).map_err(|e| e.to_string()),
                repeatable: settings!(@flag $($repeatable)?),
            }),*
        ];

        impl Settings {
            /// Every setting from its layers.
            pub(crate) fn resolve(layers: &Layers<'_>) -> anyhow::Result<Self> {
                let mut defs = DEFS.iter();
                Ok(Self {
                    $($name: layers.resolve::<$ty>(defs.next().expect("one definition per setting"), $default)?,)*
                })
            }

            /// Every setting as (definition, value as shown, source).
            pub(crate) fn rows(&self) -> Vec<(&'static Def, String, &Source)> {
                let mut defs = DEFS.iter();
                vec![$({
                    let def = defs.next().expect("one definition per setting");
                    (def, def.shown(&self.$name.value.shown()), &self.$name.source)
                }),*]
            }
        }
    };
    (@option) => { None };
    (@option $flag:literal) => { Some($flag) };
    (@text) => { "" };
    (@text $text:literal) => { $text };
    (@flag) => { false };
    (@flag $flag:literal) => { $flag };
}

settings! {
    /// The job database: a SQLite file, or a PostgreSQL URL
    /// (postgres://user[:password]@host[:port]/database) shared by many hosts.
    db: PathBuf = PathBuf::new();
    Queue, "FILE|URL", empty = "cortex.db in the data directory";
    /// Where the default database, worker logs and exports live.
    data_dir: PathBuf = PathBuf::new();
    Queue, "DIR", empty = "$XDG_DATA_HOME/cortex";
    /// The model: `default` (smollm2-135m, fetched on first use), a name
    /// (`name[:tag]`, see `cortex models list`) or a GGUF file. A worker
    /// without one works every model's jobs.
    model: String = "default".to_owned();
    Model, "MODEL";
    /// Directories whose GGUF files are models too, under their file names,
    /// `:`-separated.
    model_dirs: String = String::new();
    Model, "DIRS";
    /// llama.cpp threads of each step loop (0: for the device, every core,
    /// adapting to other processes' load; one on a GPU that holds the whole
    /// model, where llama.cpp computes only the input embeddings on the CPU).
    threads: usize = EngineConfig::FOR_DEVICE;
    Engine, "N";
    /// Sequences decoded at once, over every step loop (0: for the device,
    /// 64 on the CPU, 256 a loop on a GPU, and for `cortex run` no more than
    /// the job has requests left).
    parallel: usize = EngineConfig::FOR_DEVICE;
    Engine, "N";
    /// Step loops sharing the device, each with its own sequences: while one
    /// waits for a GPU, another prepares its next step (0: for the device, 1
    /// on the CPU and 2 on a GPU).
    step_loops: usize = EngineConfig::FOR_DEVICE;
    Engine, "N";
    /// Idle KV streams at most that a step fills with a throwaway token to
    /// join the running streams around them into one llama.cpp micro-batch
    /// (auto: every gap on a GPU, gaps of up to 4 on the CPU).
    gap_fill: OrAuto<usize> = OrAuto::Auto;
    Engine, "N|auto";
    /// Cut each step's prompt chunks to one length, a shorter chunk's rest
    /// going a token a step, so llama.cpp computes the step in two
    /// micro-batches (auto: on a GPU, not on the CPU).
    even_chunks: OrAuto<bool> = OrAuto::Auto;
    Engine, "BOOL|auto";
    /// Steady steps (0: off; slower on the jobs measured so far): new sequences join only
    /// every N-th step and every decoding step spans all streams, so steps
    /// repeat one shape that llama.cpp and CUDA reuse instead of building
    /// and launching it again.
    steady_steps: usize = EngineConfig::new("").steady_steps;
    Engine, "N";
    /// KV cells the sequences of one step span at most, when streams are
    /// sized from the job: long requests then run fewer at a time (0: for
    /// the device and model, see `cortex config`; no bound on a GPU).
    step_cells: usize = EngineConfig::new("").step_cells;
    Engine, "N";
    /// Tokens per decode call at most, prompt chunks and decode tokens
    /// together (there is always room for every sequence's decode token).
    batch_tokens: usize = EngineConfig::DEFAULT_BATCH_TOKENS;
    Engine, "N";
    /// Tokens llama.cpp computes in one pass over the weights at most, its
    /// micro-batch (0: for the device, 512 on the CPU, a whole decode call
    /// on a GPU).
    micro_batch_tokens: usize = EngineConfig::FOR_DEVICE;
    Engine, "N";
    /// KV cells per sequence, prompt plus generation (0: sized from the job,
    /// growing as longer requests come).
    context: usize = 0;
    Engine, "N";
    /// MiB the KV cache may take when sized from the job (0: on a GPU what it
    /// has free after the model, on the CPU a quarter of the memory).
    kv_memory_mib: usize = 0;
    Engine, "MIB";
    /// The device that runs the model: auto (the first GPU, else the CPU),
    /// cpu, or a device's name (`cortex devices` lists them).
    device: DeviceChoice = DeviceChoice::Auto;
    Engine, "auto|cpu|NAME";
    /// Layers of the model on the GPU: all, or a number.
    gpu_layers: GpuLayers = GpuLayers::All;
    Engine, "N|all";
    /// Map the model's file into memory (true) or read it (false); auto:
    /// llama.cpp's choice, mapped unless a device cannot take mapped weights.
    mmap: OrAuto<bool> = OrAuto::Auto;
    Engine, "BOOL|auto";
    /// Which code multiplies the weights on the CPU: cortex (its kernels for
    /// 4-, 5-, 6- and 8-bit weights: Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K,
    /// Q8_0, and attention; llama.cpp's for the rest), cortex-avx2 (the
    /// same with AVX2 only, to measure an AVX2-only machine's speed on an
    /// AVX-512 CPU), cortex-avx-vnni (with AVX-VNNI at most, as on an Alder
    /// Lake or Sierra Forest) or llama.
    cpu_kernels: CpuKernels = CpuKernels::default();
    Engine, "cortex|cortex-avx2|cortex-avx-vnni|llama";
    /// Take the argmax of greedy requests on the device that computes the
    /// logits (a GPU, or cortex's CPU kernels): one token per sequence comes
    /// back instead of all the logits.
    sample_on_device: bool = EngineConfig::new("").sample_on_device;
    Engine, "BOOL";
    /// Requests that begin with the same tokens share them: the prefix is
    /// computed once, its KV copied to each (outputs are the same either way).
    prefix_sharing: bool = EngineConfig::new("").prefix_sharing;
    Engine, "BOOL";
    /// A directory of llama.cpp backend modules (libggml-*.so) searched
    /// before the program's own.
    backends_dir: PathBuf = PathBuf::new();
    Engine, "DIR", empty = "none: beside the program";
    /// Render chats with this template instead of the model's own (for a
    /// GGUF without one): a name llama.cpp knows (chatml, llama3, gemma, ...)
    /// or a file.
    chat_template: String = String::new();
    Model, "NAME|FILE", empty = "the model's own";
    /// Seconds an item's lease lasts; workers renew it at a third of that.
    lease_seconds: u64 = cortex_queue::DEFAULT_LEASE.as_secs();
    Work, "SECONDS";
    /// A worker without a model hands its engine to another model's jobs
    /// once they have waited this long (and its model has had a turn as long).
    model_switch_seconds: u64 = cortex_worker::DEFAULT_MODEL_SWITCH.as_secs();
    Work, "SECONDS";
    /// The key webhook events are signed with (whsec_ and base64, as the
    /// Standard Webhooks scheme and OpenAI use; `openssl rand -base64 32`
    /// makes one): workers and servers sign what they deliver.
    webhook_secret: SigningSecret = SigningSecret::default();
    Work, "whsec_KEY", empty = "none: events go unsigned";
    /// Attempts per item before a retryable failure is final, for new jobs.
    max_attempts: u32 = cortex_queue::DEFAULT_MAX_ATTEMPTS;
    Submit, "N";
    /// The address to listen on.
    host: String = cortex_server::DEFAULT_LISTEN.ip().to_string();
    Server, "ADDRESS";
    /// The port.
    port: u16 = cortex_server::DEFAULT_LISTEN.port();
    Server, "PORT";
    /// A key clients must send as `Authorization: Bearer KEY`, an admin key
    /// of the `default` project (repeatable; comma-separated in the
    /// variable; keys_file keeps keys out of `ps`).
    api_keys: ApiKeys = ApiKeys::default();
    Server, "KEY", empty = "none: no key needed", flag = "api-key", repeatable = true;
    /// Sequences queue items may take at most; the rest of parallel is kept
    /// for online requests (auto: three quarters of it; 0: no queue work).
    batch_parallel: OrAuto<usize> = OrAuto::Auto;
    Server, "N|auto";
    /// Most tokens one online request may ask for, n × max_tokens (each cut
    /// to the context); more is a 400.
    max_request_tokens: u64 = cortex_server::DEFAULT_MAX_REQUEST_TOKENS;
    Server, "N";
    /// Online requests (generation, embeddings) answered at once at most;
    /// more get 429 with Retry-After.
    max_online_requests: usize = cortex_server::DEFAULT_MAX_ONLINE_REQUESTS;
    Server, "N";
    /// The same for the requests of one API key (0: only the total).
    max_online_requests_per_key: usize = 0;
    Server, "N";
    /// Open connections at most; more wait to be accepted.
    max_connections: usize = cortex_server::DEFAULT_MAX_CONNECTIONS;
    Server, "N";
    /// How long a model stays loaded after its last request: 5m, 1h, 0
    /// (unload at once), -1 (for ever); a request's keep_alive wins.
    keep_alive: KeepAlive = KeepAlive::DEFAULT;
    Server, "DURATION";
    /// MiB the loaded models may take, weights and KV memory; the least
    /// recently used idle model is unloaded to make room (0: no limit).
    model_memory_mib: u64 = 0;
    Server, "MIB";
    /// Models loaded at once at most.
    max_loaded_models: usize = cortex_server::PoolLimits::DEFAULT_MAX_LOADED;
    Server, "N";
    /// Seconds a client may take to send a request's headers; idle
    /// connections close after it too.
    header_timeout_seconds: u64 = cortex_server::DEFAULT_HEADER_TIMEOUT.as_secs();
    Server, "SECONDS";
    /// Seconds a client may take to send a request's body (an upload:
    /// between its chunks).
    body_timeout_seconds: u64 = cortex_server::DEFAULT_BODY_TIMEOUT.as_secs();
    Server, "SECONDS";
    /// A client's `priority` is clamped to ± this.
    max_client_priority: i32 = cortex_server::DEFAULT_MAX_CLIENT_PRIORITY;
    Server, "N";
    /// Bytes of uploaded files one project may keep; an upload beyond is a
    /// 413 (0: no limit).
    max_project_file_bytes: u64 = cortex_server::DEFAULT_MAX_PROJECT_FILE_BYTES;
    Server, "BYTES";
    /// Days failed batches and batch exports are kept (exports are made
    /// again when asked for).
    file_retention_days: u64 = cortex_server::DEFAULT_FILE_RETENTION.as_secs() / (24 * 3600);
    Server, "DAYS";
    /// Names clients may use in `Host` besides IP addresses, localhost and
    /// this machine's name, comma-separated (`*`: any).
    allowed_hosts: NameList = NameList::default();
    Server, "NAMES";
    /// Web page origins (e.g. https://app.example) allowed to call the
    /// server besides loopback pages, comma-separated (`*`: any).
    allowed_origins: NameList = NameList::default();
    Server, "NAMES";
    /// A file of API keys, one a line: `KEY PROJECT` or `KEY PROJECT admin`
    /// (keys in a file stay out of `ps`).
    keys_file: PathBuf = PathBuf::new();
    Server, "PATH";
    /// Where batches created through the Batch API announce their end
    /// (batch.completed, batch.failed, batch.cancelled, batch.expired): an
    /// http(s) URL, as OpenAI's project webhooks.
    webhook_url: String = String::new();
    Server, "URL", empty = "none";
    /// Also serve on a Unix-domain socket at PATH, created with mode 0600 so
    /// only its owner can connect (`curl --unix-socket PATH`).
    unix_socket: PathBuf = PathBuf::new();
    Server, "PATH";
    /// Serve on the Unix-domain socket only: no TCP port at all.
    unix_socket_only: bool = false;
    Server, "BOOL";
}

/// The definition of the setting `name`.
pub(crate) fn def(name: &str) -> Option<&'static Def> {
    DEFS.iter().find(|d| d.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_setting_has_one_name_for_its_key_flag_and_variable() {
        for def in DEFS {
            let base = def.key().trim_start_matches("server.").to_owned();
            assert_eq!(base, def.name);
            assert_eq!(def.env(), format!("CORTEX_{}", def.name.to_uppercase()));
            if def.flag_override.is_none() {
                assert_eq!(def.flag(), def.name.replace('_', "-"));
            }
            // The default parses back to itself.
            let default = (def.default)();
            (def.check)(&default)
                .unwrap_or_else(|e| panic!("{}: default {default:?}: {e}", def.name));
        }
        let mut names: Vec<_> = DEFS.iter().map(|d| d.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), DEFS.len(), "a name is declared twice");
    }

    #[test]
    fn defaults_are_the_librarys() {
        let default = |name: &str| (def(name).unwrap().default)();
        let engine = EngineConfig::new("");
        let submit = cortex_queue::SubmitOptions::new("");
        let pool = cortex_server::PoolLimits::default();
        for (name, library) in [
            ("threads", engine.threads.to_string()),
            ("parallel", engine.parallel.to_string()),
            ("steady_steps", engine.steady_steps.to_string()),
            ("step_cells", engine.step_cells.to_string()),
            ("batch_tokens", engine.max_batch_tokens.to_string()),
            ("sample_on_device", engine.sample_on_device.to_string()),
            ("prefix_sharing", engine.prefix_sharing.to_string()),
            ("max_attempts", submit.max_attempts.to_string()),
            (
                "lease_seconds",
                cortex_queue::DEFAULT_LEASE.as_secs().to_string(),
            ),
            (
                "model_switch_seconds",
                cortex_worker::DEFAULT_MODEL_SWITCH.as_secs().to_string(),
            ),
            ("host", cortex_server::DEFAULT_LISTEN.ip().to_string()),
            ("port", cortex_server::DEFAULT_LISTEN.port().to_string()),
            ("max_loaded_models", pool.max_loaded.to_string()),
        ] {
            assert_eq!(default(name), library, "{name}");
        }
    }

    #[test]
    fn a_setting_takes_the_last_layer_that_sets_it() {
        let def = def("parallel").unwrap();
        let file: RawValues = vec![("parallel", "8".into())];
        let flags: RawValues = vec![("parallel", "4".into())];
        let path = Path::new("cortex.toml");
        let layers = Layers {
            file: &file,
            file_path: Some(path),
            flags: &Vec::new(),
        };
        let setting: Setting<usize> = layers.resolve(def, 0).unwrap();
        assert_eq!(
            (setting.value, setting.source),
            (8, Source::File(path.into()))
        );
        let layers = Layers {
            file: &file,
            file_path: Some(path),
            flags: &flags,
        };
        let setting: Setting<usize> = layers.resolve(def, 0).unwrap();
        assert_eq!((setting.value, setting.source), (4, Source::Flag));
    }

    #[test]
    fn file_values_become_the_text_their_setting_parses() {
        let table: toml::Table = toml::from_str(
            "parallel = 4\n[server]\nallowed_hosts = [\"a\", \"b\"]\nunix_socket_only = true\n[server.keys]\n\"sk\" = \"p\"\n",
        )
        .unwrap();
        let (values, keys) = read_file(table, Path::new("c.toml")).unwrap();
        assert!(values.contains(&("parallel", "4".into())));
        assert!(values.contains(&("allowed_hosts", "a,b".into())));
        assert!(values.contains(&("unix_socket_only", "true".into())));
        assert!(keys.is_some());
        let typo: toml::Table = toml::from_str("paralel = 4\n").unwrap();
        let error = read_file(typo, Path::new("c.toml"))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("unknown key \"paralel\": did you mean \"parallel\"?"),
            "{error}"
        );
        // A server setting belongs in [server].
        let misplaced: toml::Table = toml::from_str("port = 9000\n").unwrap();
        assert!(read_file(misplaced, Path::new("c.toml")).is_err());
    }
}
