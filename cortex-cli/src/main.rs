//! `cortex`: offline batch LLM generation. Submit a JSONL file of prompts, run
//! workers, poll progress, collect a JSONL of outputs.

#![forbid(unsafe_code)]

mod commands;
mod config;
mod devices;
mod keys;
mod output;
mod serve;
mod trace;
mod worker;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use cortex_queue::{JobState, QueueError};

use crate::config::{Config, Overrides};

/// Offline batch LLM generation on llama.cpp: submit a JSONL file of prompts,
/// run workers, poll progress, collect a JSONL of outputs. Nothing finished is
/// ever lost or generated twice, whatever is killed.
#[derive(Debug, Parser)]
#[command(name = "cortex", version, after_help = EXIT_CODES)]
struct Cli {
    /// The job database: a SQLite file (default: $XDG_DATA_HOME/cortex/cortex.db)
    /// or a PostgreSQL URL (postgres://user[:password]@host[:port]/database).
    #[arg(long, global = true, value_name = "FILE|URL")]
    db: Option<PathBuf>,
    /// The model: `default` (smollm2-135m, fetched on first use), a name
    /// (`name[:tag]`, see `cortex models list`) or a GGUF file. A worker
    /// without one works every model's jobs.
    #[arg(long, global = true, value_name = "MODEL")]
    model: Option<String>,
    /// llama.cpp threads (0: every core).
    #[arg(long, global = true, value_name = "N")]
    threads: Option<usize>,
    /// The device that runs the model: auto (the first GPU, else the CPU),
    /// cpu, or a device's name (`cortex devices` lists them).
    #[arg(long, global = true, value_name = "auto|cpu|NAME")]
    device: Option<cortex_engine::DeviceChoice>,
    /// Layers of the model on the GPU: all (default) or a number.
    #[arg(long, global = true, value_name = "N|all")]
    gpu_layers: Option<cortex_engine::GpuLayers>,
    /// Which code multiplies the weights on the CPU: cortex (its kernels for
    /// Q4_1 and Q8_0 weights, llama.cpp's for the rest; the default) or llama.
    #[arg(long, global = true, value_name = "cortex|llama")]
    cpu_kernels: Option<cortex_engine::CpuKernels>,
    /// A directory of llama.cpp backend modules (libggml-*.so) searched
    /// before the program's own.
    #[arg(long, global = true, value_name = "DIR")]
    backends_dir: Option<PathBuf>,
    /// Render chats with this template instead of the model's own (for a GGUF
    /// without one): a name llama.cpp knows (chatml, llama3, gemma, ...) or a file.
    #[arg(long, global = true, value_name = "NAME|FILE")]
    chat_template: Option<String>,
    /// More detail on errors and progress (-vv for debug, -vvv with llama.cpp's own).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

const EXIT_CODES: &str = "Exit codes: 0 success; 1 failure (model, database, file); 2 bad command line; \
3 invalid input file or duplicate submission; 4 no such job; 5 the job's state does not allow it \
(e.g. results of a running job); 130 stopped by a second interrupt.";

#[derive(Debug, Subcommand)]
enum Command {
    /// Store a JSONL file as a job (validated, all or nothing) and print its id. Never generates.
    Submit(SubmitArgs),
    /// Claim items and generate until the queue is empty (or keep waiting with --follow).
    Worker(WorkerArgs),
    /// Show a job's progress: counts, tokens/s, ETA (the newest job if none is given).
    Status {
        job: Option<i64>,
        /// Show a live progress bar until the job ends.
        #[arg(long)]
        watch: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// List jobs, newest first.
    List {
        /// Only jobs in this state (in_progress, completed, ...).
        #[arg(long)]
        state: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 20)]
        limit: usize,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Write a job's results (OpenAI batch output JSONL) and its errors.
    Results {
        job: i64,
        /// The output file (default: results-JOB.jsonl).
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
        /// The error file for failed, cancelled and invalid requests (default: errors-JOB.jsonl).
        #[arg(long, value_name = "FILE")]
        errors: Option<PathBuf>,
        /// Export what is done even though the job is still running.
        #[arg(long)]
        partial: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Cancel a job: pending items at once, running ones at their next heartbeat.
    Cancel {
        job: i64,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Resume a cancelled or failed job: its unfinished items run again.
    Resume {
        job: i64,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Run a job's failed items again.
    Retry {
        job: i64,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Submit, work and write the results in one go, with a progress bar.
    Run(RunArgs),
    /// Generate for one prompt, streaming the text as it comes.
    Generate(GenerateArgs),
    /// Manage models: list, info, pull, add, cp, rm.
    Models {
        #[command(subcommand)]
        command: ModelsCommand,
    },
    /// Run the engine benchmark tables on the model.
    Bench(BenchArgs),
    /// Serve the model over HTTP: OpenAI's API (with Files and Batches on the
    /// queue) and Ollama's, until SIGINT or SIGTERM.
    Serve(Box<ServeArgs>),
    /// List llama.cpp's backend modules found and the devices they offer,
    /// with their memory.
    Devices {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Print the effective configuration and where each value came from.
    Config {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
enum ModelsCommand {
    /// List the models: registered names, and GGUFs in the model directories.
    List {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Show a model's details: family, size, quantization, lengths, digest,
    /// system prompt and parameters (the configured model if none is given).
    Info {
        model: Option<String>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Fetch a known model (verified by size and SHA-256) and register it.
    Pull {
        /// `default` (smollm2-135m, SmolLM2-135M-Instruct) or `gemma3-270m`.
        name: Option<String>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Register a local GGUF under a name (it is copied into the registry),
    /// or make a model from a Modelfile (FROM, SYSTEM, TEMPLATE, PARAMETER).
    Add {
        /// The name, `name[:tag]`.
        name: String,
        /// A GGUF file or a Modelfile.
        source: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Give a model a second name (the weights are shared, not copied).
    Cp {
        from: String,
        to: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Remove a name; its weights go when no other name uses them. Refused
    /// while an unfinished job needs them.
    Rm {
        name: String,
        /// Remove it even though unfinished jobs need it (they wait until
        /// the model is back).
        #[arg(long)]
        force: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// How a job is submitted (shared by `submit` and `run`).
#[derive(Debug, Args, Clone)]
struct SubmitArgs {
    /// The JSONL file: OpenAI batch lines or plain {"prompt"...} / {"messages"...} lines.
    file: PathBuf,
    /// Default max_tokens for lines that set none.
    #[arg(long)]
    max_tokens: Option<u32>,
    /// Default temperature for lines that set none.
    #[arg(long)]
    temperature: Option<f32>,
    /// Default top_p for lines that set none.
    #[arg(long)]
    top_p: Option<f32>,
    /// Default seed for lines that set none.
    #[arg(long)]
    seed: Option<u64>,
    /// Jobs with a higher priority are worked on first.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    priority: i32,
    /// Attempts per item before a retryable failure is final (default from config: 3).
    #[arg(long)]
    max_attempts: Option<u32>,
    /// A label, repeatable: --metadata team=search.
    #[arg(long, value_name = "KEY=VALUE", value_parser = parse_key_value)]
    metadata: Vec<(String, String)>,
    /// Accept the valid lines and record the bad ones as failed.
    #[arg(long)]
    skip_invalid: bool,
    /// Submit even if the same file with the same parameters was submitted before.
    #[arg(long)]
    force: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

fn parse_key_value(raw: &str) -> Result<(String, String), String> {
    match raw.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
        _ => Err(format!("expected KEY=VALUE, got {raw:?}")),
    }
}

#[derive(Debug, Args, Clone)]
struct WorkerArgs {
    /// Work only on these jobs (comma-separated ids).
    #[arg(long, value_delimiter = ',')]
    jobs: Vec<i64>,
    /// Sequences decoded at once (default from config: 16).
    #[arg(long)]
    parallel: Option<usize>,
    /// Keep waiting for new jobs when the queue is empty.
    #[arg(long)]
    follow: bool,
    /// Start in the background and return; the log goes to a file in the data directory.
    #[arg(long)]
    detach: bool,
}

/// `cortex serve`.
#[derive(Debug, Args, Clone)]
struct ServeArgs {
    /// The address to listen on (default from config: 127.0.0.1).
    #[arg(long)]
    host: Option<String>,
    /// The port (default from config: 8080).
    #[arg(long)]
    port: Option<u16>,
    /// A key clients must send as `Authorization: Bearer KEY`, an admin key
    /// of the `default` project (repeatable; or CORTEX_API_KEYS,
    /// comma-separated; --keys-file keeps keys out of `ps`).
    #[arg(long = "api-key", value_name = "KEY")]
    api_keys: Vec<String>,
    /// Sequences decoded at once, online and queued (default from config: 64).
    #[arg(long)]
    parallel: Option<usize>,
    /// Queue items in the engine at most; the rest of --parallel is kept for
    /// online requests (default: three quarters of it; 0: no queue work).
    #[arg(long)]
    batch_parallel: Option<usize>,
    /// Most tokens one online request may ask for, n × max_tokens (each cut
    /// to the context); more is a 400 (default from config: 131072).
    #[arg(long)]
    max_request_tokens: Option<u64>,
    /// Online requests (generation, embeddings) answered at once at most; more get 429 with Retry-After (default from config: 256).
    #[arg(long)]
    max_online_requests: Option<usize>,
    /// The same for the requests of one API key (default from config: 0, only the total).
    #[arg(long)]
    max_online_requests_per_key: Option<usize>,
    /// Open connections at most; more wait to be accepted (default from config: 1024).
    #[arg(long)]
    max_connections: Option<usize>,
    /// How long a model stays loaded after its last request: 5m, 1h, 0
    /// (unload at once), -1 (for ever); a request's keep_alive wins (default from config: 5m).
    #[arg(long, allow_hyphen_values = true)]
    keep_alive: Option<String>,
    /// MiB the loaded models may take, weights and KV memory; the least
    /// recently used idle model is unloaded to make room (default from config: 0, no limit).
    #[arg(long)]
    model_memory_mib: Option<u64>,
    /// Models loaded at once at most (default from config: 3).
    #[arg(long)]
    max_loaded_models: Option<usize>,
    /// Seconds a client may take to send a request's headers; idle connections close after it too (default from config: 10).
    #[arg(long)]
    header_timeout_seconds: Option<u64>,
    /// Seconds a client may take to send a request's body (an upload: between its chunks) (default from config: 60).
    #[arg(long)]
    body_timeout_seconds: Option<u64>,
    /// A client's `priority` is clamped to ± this (default from config: 1000).
    #[arg(long)]
    max_client_priority: Option<i32>,
    /// Bytes of uploaded files one project may keep; an upload beyond is a 413 (0: no limit; default from config: 10 GiB).
    #[arg(long)]
    max_project_file_bytes: Option<u64>,
    /// Days failed batches and batch exports are kept (exports are made again when asked for; default from config: 30).
    #[arg(long)]
    file_retention_days: Option<u64>,
    /// Names clients may use in `Host` besides IP addresses, localhost and this machine's name, comma-separated (`*`: any; default: none).
    #[arg(long, value_name = "NAMES")]
    allowed_hosts: Option<config::NameList>,
    /// Web page origins (e.g. https://app.example) allowed to call the server besides loopback pages, comma-separated (`*`: any; default: none).
    #[arg(long, value_name = "NAMES")]
    allowed_origins: Option<config::NameList>,
    /// A file of API keys, one a line: `KEY PROJECT` or `KEY PROJECT admin`
    /// (or CORTEX_KEYS_FILE; keys in a file stay out of `ps`).
    #[arg(long, value_name = "PATH")]
    keys_file: Option<PathBuf>,
    /// Also serve on a Unix-domain socket at PATH, created with mode 0600 so
    /// only its owner can connect (`curl --unix-socket PATH`).
    #[arg(long, value_name = "PATH")]
    unix_socket: Option<PathBuf>,
    /// Serve on --unix-socket only: no TCP port at all.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    unix_socket_only: Option<bool>,
}

/// `cortex bench`: the engine in llama-batched-bench's columns.
#[derive(Debug, Args, Clone)]
struct BenchArgs {
    /// Batch sizes (parallel sequences) to measure.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 4, 16, 32, 64])]
    batch: Vec<usize>,
    /// Runs per row (the best is kept).
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// Skip the shared-prefix table.
    #[arg(long)]
    no_prefix: bool,
    /// Skip the plain llama.cpp loop beside each engine row.
    #[arg(long)]
    engine_only: bool,
    /// Print JSON instead of tables.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args, Clone)]
struct RunArgs {
    #[command(flatten)]
    submit: SubmitArgs,
    /// The output file (default: FILE's name with .results.jsonl).
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// Sequences decoded at once (default from config: 16).
    #[arg(long)]
    parallel: Option<usize>,
    /// Write every engine step as a JSON line to FILE (its batch, the KV its
    /// attention read, decode and host time) and print where the time went.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
}

#[derive(Debug, Args, Clone)]
struct GenerateArgs {
    /// The prompt.
    prompt: String,
    /// Treat the prompt as a user message in the model's chat template.
    #[arg(long)]
    chat: bool,
    /// Tokens to generate at most (default: the model's num_predict, else 128).
    #[arg(long)]
    max_tokens: Option<u32>,
    /// Sampling temperature (default: the model's, else 0.7).
    #[arg(long)]
    temperature: Option<f32>,
    #[arg(long)]
    top_p: Option<f32>,
    #[arg(long)]
    seed: Option<u64>,
    /// Constrain the output to a JSON Schema (a file), as `response_format` json_schema does.
    #[arg(long, value_name = "FILE", conflicts_with = "grammar")]
    json_schema: Option<PathBuf>,
    /// Constrain the output to a GBNF grammar (a file, start rule `root`).
    #[arg(long, value_name = "FILE")]
    grammar: Option<PathBuf>,
}

/// Exit code for an error: see `EXIT_CODES`.
fn exit_code(error: &anyhow::Error) -> u8 {
    match error.downcast_ref::<QueueError>() {
        Some(QueueError::InvalidInput(_) | QueueError::DuplicateJob { .. }) => 3,
        Some(QueueError::NoSuchJob(_)) => 4,
        Some(QueueError::WrongState { .. }) => 5,
        _ => 1,
    }
}

fn init_tracing(verbose: u8) {
    let level = match verbose {
        0 => tracing::Level::WARN,
        1 => tracing::Level::INFO,
        2 => tracing::Level::DEBUG,
        // llama.cpp's and ggml's own debug output (graph splits, ...).
        _ => tracing::Level::TRACE,
    };
    // Colours only on a terminal: a detached worker's log file stays plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt()
        .with_ansi(ansi)
        .with_max_level(level)
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let verbose = cli.verbose;
    init_tracing(verbose);
    let parallel = match &cli.command {
        Command::Worker(args) => args.parallel,
        Command::Run(args) => args.parallel,
        Command::Serve(args) => args.parallel,
        _ => None,
    };
    let serve = match &cli.command {
        Command::Serve(args) => Some(args.as_ref().clone()),
        _ => None,
    };
    let overrides = Overrides {
        db: cli.db.clone(),
        model: cli.model.clone(),
        threads: cli.threads,
        parallel,
        chat_template: cli.chat_template.clone(),
        device: cli.device.clone(),
        gpu_layers: cli.gpu_layers,
        cpu_kernels: cli.cpu_kernels,
        backends_dir: cli.backends_dir.clone(),
        host: serve.as_ref().and_then(|a| a.host.clone()),
        port: serve.as_ref().and_then(|a| a.port),
        api_keys: serve
            .as_ref()
            .filter(|a| !a.api_keys.is_empty())
            .map(|a| config::ApiKeys(a.api_keys.clone())),
        batch_parallel: serve.as_ref().and_then(|a| a.batch_parallel),
        max_request_tokens: serve.as_ref().and_then(|a| a.max_request_tokens),
        max_online_requests: serve.as_ref().and_then(|a| a.max_online_requests),
        max_online_requests_per_key: serve.as_ref().and_then(|a| a.max_online_requests_per_key),
        max_connections: serve.as_ref().and_then(|a| a.max_connections),
        keep_alive: serve.as_ref().and_then(|a| a.keep_alive.clone()),
        model_memory_mib: serve.as_ref().and_then(|a| a.model_memory_mib),
        max_loaded_models: serve.as_ref().and_then(|a| a.max_loaded_models),
        header_timeout_seconds: serve.as_ref().and_then(|a| a.header_timeout_seconds),
        body_timeout_seconds: serve.as_ref().and_then(|a| a.body_timeout_seconds),
        max_client_priority: serve.as_ref().and_then(|a| a.max_client_priority),
        max_project_file_bytes: serve.as_ref().and_then(|a| a.max_project_file_bytes),
        file_retention_days: serve.as_ref().and_then(|a| a.file_retention_days),
        allowed_hosts: serve.as_ref().and_then(|a| a.allowed_hosts.clone()),
        allowed_origins: serve.as_ref().and_then(|a| a.allowed_origins.clone()),
        keys_file: serve.as_ref().and_then(|a| a.keys_file.clone()),
        unix_socket: serve.as_ref().and_then(|a| a.unix_socket.clone()),
        unix_socket_only: serve.as_ref().and_then(|a| a.unix_socket_only),
    };
    let result = Config::load(&overrides).and_then(|config| run(cli, &config));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            let code = exit_code(&error);
            if verbose > 0 {
                eprintln!("error: {error:?}");
            } else {
                eprintln!("error: {}", output::one_line(&error));
            }
            ExitCode::from(code)
        }
    }
}

fn job_state(name: &str) -> anyhow::Result<JobState> {
    JobState::parse(name).ok_or_else(|| {
        let names: Vec<_> = JobState::ALL.iter().map(|s| s.as_str()).collect();
        anyhow::anyhow!("unknown state {name:?}; use one of {}", names.join(", "))
    })
}

fn run(cli: Cli, config: &Config) -> anyhow::Result<()> {
    use commands as c;
    match cli.command {
        Command::Submit(args) => c::submit(config, &args),
        Command::Worker(args) if args.detach => c::detach_worker(config),
        Command::Worker(args) => c::worker(config, &args),
        Command::Status { job, watch, json } => c::status(config, job, watch, json),
        Command::List { state, limit, json } => {
            let state = state.as_deref().map(job_state).transpose()?;
            c::list(config, state, limit, json)
        }
        Command::Results {
            job,
            output,
            errors,
            partial,
            json,
        } => c::results(config, job, output, errors, partial, json),
        Command::Cancel { job, json } => c::cancel(config, job, json),
        Command::Resume { job, json } => c::resume(config, job, json),
        Command::Retry { job, json } => c::retry(config, job, json),
        Command::Run(args) => c::run_file(config, &args),
        Command::Generate(args) => c::generate(config, &args),
        Command::Models { command } => match command {
            ModelsCommand::List { json } => c::models_list(config, json),
            ModelsCommand::Info { model, json } => c::models_info(config, model.as_deref(), json),
            ModelsCommand::Pull { name, json } => c::models_pull(config, name.as_deref(), json),
            ModelsCommand::Add { name, source, json } => {
                c::models_add(config, &name, &source, json)
            }
            ModelsCommand::Cp { from, to, json } => c::models_copy(config, &from, &to, json),
            ModelsCommand::Rm { name, force, json } => c::models_remove(config, &name, force, json),
        },
        Command::Bench(args) => c::bench(config, &args),
        Command::Serve(_) => serve::serve(config),
        Command::Devices { json } => devices::devices(config, json),
        Command::Config { json } => c::show_config(config, json),
    }
}
