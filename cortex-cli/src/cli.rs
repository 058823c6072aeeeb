//! The command line: every command and its arguments, as clap parses
//! them. Settings are not declared here: each command takes the flags of
//! the settings that apply to it from the table in [`crate::settings`].

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use cortex_queue::CompletionWindow;

use crate::settings::{
    BeforeCommand, ForConfig, ForDevices, ForEngine, ForList, ForModels, ForQueue, ForRun,
    ForServe, ForSubmit, ForWorker, Group, Scope, SettingFlags,
};

/// Offline batch LLM generation on llama.cpp: submit a JSONL file of prompts,
/// run workers, poll progress, collect a JSONL of outputs. Nothing finished is
/// ever lost or generated twice, whatever is killed.
#[derive(Debug, Parser)]
#[command(name = "cortex", version, after_help = EXIT_CODES)]
pub(crate) struct Cli {
    /// Settings before the command's name apply to it (`cortex --model M
    /// submit FILE`); each command lists those it takes.
    #[command(flatten)]
    pub(crate) settings: SettingFlags<BeforeCommand>,
    /// More detail on errors and progress (-vv for debug, -vvv with llama.cpp's own).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub(crate) verbose: u8,
    #[command(subcommand)]
    pub(crate) command: Command,
}

pub(crate) const EXIT_CODES: &str = "Exit codes: 0 success; 1 failure (model, database, file); 2 bad command line; \
3 invalid input file or duplicate submission; 4 no such job; 5 the job's state does not allow it \
(e.g. results of a running job); 6 `cortex run`: the job ended and its results are written, but some \
requests failed; 7 `cortex run`: the job ended with no request completed; 130 stopped by an interrupt \
(SIGINT, SIGTERM) before the work was done (a worker's first interrupt is a clean stop: 0).";

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Store a JSONL or Parquet input (a file or an object) as a job (validated, all or nothing)
    /// and print its id. Never generates.
    Submit(SubmitCommand),
    /// Claim items and generate until the queue is empty (or keep waiting with --follow).
    Worker(WorkerArgs),
    /// Show a job's progress: counts, tokens/s, ETA (the newest job if none is given).
    Status {
        /// The job's id (`cortex list` shows them; default: the newest job).
        job: Option<i64>,
        /// Show a live progress bar until the job ends.
        #[arg(long)]
        watch: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        settings: SettingFlags<ForQueue>,
    },
    /// List jobs, newest first (only the model's when --model is given).
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
        #[command(flatten)]
        settings: SettingFlags<ForList>,
    },
    /// Write a job's results (OpenAI batch output JSONL) and its errors.
    Results {
        /// The job's id.
        job: i64,
        #[command(flatten)]
        outputs: OutputArgs,
        /// Export what is done even though the job is still running.
        #[arg(long)]
        partial: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        settings: SettingFlags<ForQueue>,
    },
    /// Cancel a job: pending items at once, running ones at their next heartbeat.
    Cancel {
        /// The job's id.
        job: i64,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        settings: SettingFlags<ForQueue>,
    },
    /// Resume a cancelled or failed job: its unfinished items run again.
    Resume {
        /// The job's id.
        job: i64,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        settings: SettingFlags<ForQueue>,
    },
    /// Run a job's failed items again.
    Retry {
        /// The job's id.
        job: i64,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        settings: SettingFlags<ForQueue>,
    },
    /// Submit, work and write the results in one go, with a progress bar.
    Run(RunArgs),
    /// Generate for one prompt, streaming the text as it comes.
    Generate(GenerateArgs),
    /// Manage models: list, info, pull, add, cp, rm.
    Models {
        #[command(subcommand)]
        command: ModelsCommand,
        #[command(flatten)]
        settings: SettingFlags<ForModels>,
    },
    /// Run the engine benchmark tables on the model.
    Bench(BenchArgs),
    /// Serve the model over HTTP: OpenAI's API (with Files and Batches on the
    /// queue) and Ollama's, until SIGINT or SIGTERM.
    Serve(ServeArgs),
    /// List llama.cpp's backend modules found and the devices they offer,
    /// with their memory.
    Devices {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        settings: SettingFlags<ForDevices>,
    },
    /// Print the effective configuration and where each value came from.
    Config {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        settings: SettingFlags<ForConfig>,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum ModelsCommand {
    /// List the models: registered names, and GGUFs in the model directories.
    List {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Show a model's details: family, size, quantization, lengths, digest,
    /// system prompt and parameters (the configured model if none is given).
    Info {
        /// The model's name or file (default: the configured model).
        model: Option<String>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Fetch a known model (verified by size and SHA-256) and register it.
    Pull {
        /// `default` (smollm2-135m, SmolLM2-135M-Instruct) or `gemma3-270m`
        /// (default: the configured model).
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
        /// The model's name.
        from: String,
        /// The new name, `name[:tag]`.
        to: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Remove a name; its weights go when no other name uses them. Refused
    /// while an unfinished job needs them.
    Rm {
        /// The name to remove.
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

/// `cortex submit`.
#[derive(Debug, Args, Clone)]
pub(crate) struct SubmitCommand {
    #[command(flatten)]
    pub(crate) job: SubmitArgs,
    /// Where the job's results go when it ends, written once by the worker
    /// or server that takes it (again after a crash): a local path (made
    /// absolute) or a URL (s3://, gs://, az://); a .parquet name writes a
    /// table. The error file goes beside it.
    #[arg(short, long, value_name = "FILE|URL")]
    pub(crate) output: Option<String>,
    #[command(flatten)]
    pub(crate) settings: SettingFlags<ForSubmit>,
}

/// The sampling flags of `submit`, `run` and `generate`: what a request
/// gets when it sets none itself (a batch line's own fields win). Unset,
/// a request gets the model's PARAMETERs, else the library's defaults, as
/// a served request does.
#[derive(Debug, Args, Clone, Default)]
pub(crate) struct RequestFlags {
    /// Tokens to generate at most, for requests that set none (default:
    /// the model's num_predict, else 256).
    #[arg(long)]
    pub(crate) max_tokens: Option<u32>,
    /// Sampling temperature, for requests that set none (default: the
    /// model's, else 1.0; 0 is greedy).
    #[arg(long)]
    pub(crate) temperature: Option<f32>,
    /// Nucleus sampling: draw from the smallest set of tokens whose
    /// probabilities add up to this, for requests that set none (default:
    /// the model's, else 1.0: off).
    #[arg(long)]
    pub(crate) top_p: Option<f32>,
    /// The job's random seed (default: the model's, else 0): a line that
    /// sets no seed of its own draws from one derived from this and its
    /// custom_id, so a sampled job gives the same text again whatever the
    /// order of its file or what runs beside each line.
    #[arg(long)]
    pub(crate) seed: Option<u64>,
}

/// How a job is submitted (shared by `submit` and `run`).
#[derive(Debug, Args, Clone)]
pub(crate) struct SubmitArgs {
    /// The input: a JSONL file of OpenAI batch lines or plain {"prompt"...} /
    /// {"messages"...} lines, or a Parquet table whose rows are such lines
    /// (columns custom_id, method, url, body; or prompt / messages and
    /// sampling fields), or any table with --prompt-template. A local path or
    /// a URL: s3://bucket/key (AWS_* variables, AWS_ENDPOINT_URL for other
    /// S3-compatible stores), gs://, az://, https://, file://.
    #[arg(value_name = "FILE|URL")]
    pub(crate) file: String,
    #[command(flatten)]
    pub(crate) request: RequestFlags,
    /// Jobs with a higher priority are worked on first.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub(crate) priority: i32,
    /// A label, repeatable: --metadata team=search.
    #[arg(long, value_name = "KEY=VALUE", value_parser = parse_key_value)]
    pub(crate) metadata: Vec<(String, String)>,
    /// Accept the valid lines and record the bad ones as failed.
    #[arg(long)]
    pub(crate) skip_invalid: bool,
    /// Submit even if the same file with the same parameters was submitted before.
    #[arg(long)]
    pub(crate) force: bool,
    /// Run lines that name another model (a file made for a hosted API:
    /// "model": "gpt-4o-mini") on the job's model, saying so once; without
    /// it such a file is refused. A file whose lines name a model of the
    /// registry runs on that model when --model is not given.
    #[arg(long)]
    pub(crate) ignore_line_models: bool,
    /// Leave a reasoning model's thinking out of the results (each chat's
    /// reasoning_content), as include_reasoning: false on every line that
    /// does not say; the answer is the same.
    #[arg(long)]
    pub(crate) omit_reasoning: bool,
    /// How long the job has to finish (24h, 90m, 1h30m, 45s): requests not
    /// finished by then fail with batch_expired and the job is expired,
    /// keeping what finished. Default: no limit.
    #[arg(long, value_name = "DURATION", value_parser = CompletionWindow::parse)]
    pub(crate) completion_window: Option<CompletionWindow>,
    /// A URL told when the job ends: an OpenAI-style webhook event
    /// (batch.completed, batch.failed, batch.cancelled, batch.expired), POSTed
    /// by a worker, signed with webhook_secret, retried with backoff (16
    /// attempts over about five hours).
    #[arg(long, value_name = "URL", value_parser = parse_webhook_url)]
    pub(crate) notify: Option<String>,
    /// For a table (Parquet, CSV with a header row, or JSONL rows): each
    /// row's user message made from its columns, `{column}` replaced by the
    /// row's value ('Summarise: {text}'; `{{` and `}}` are braces).
    #[arg(long, value_name = "TEMPLATE")]
    pub(crate) prompt_template: Option<String>,
    /// With --prompt-template: the column whose value is each row's
    /// custom_id (default: the row number).
    #[arg(long, value_name = "NAME")]
    pub(crate) id_column: Option<String>,
    /// A system message for every chat that has none.
    #[arg(long, value_name = "TEXT")]
    pub(crate) system: Option<String>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub(crate) json: bool,
}

fn parse_webhook_url(raw: &str) -> Result<String, cortex_webhooks::NotHttpUrl> {
    cortex_webhooks::check_url(raw).map(|()| raw.to_owned())
}

fn parse_key_value(raw: &str) -> Result<(String, String), String> {
    match raw.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
        _ => Err(format!("expected KEY=VALUE, got {raw:?}")),
    }
}

#[derive(Debug, Args, Clone)]
pub(crate) struct WorkerArgs {
    /// Work only on these jobs (comma-separated ids).
    #[arg(long, value_delimiter = ',')]
    pub(crate) jobs: Vec<i64>,
    /// Keep waiting for new jobs when the queue is empty.
    #[arg(long)]
    pub(crate) follow: bool,
    /// Start in the background and return; the log goes to a file in the data directory.
    #[arg(long)]
    pub(crate) detach: bool,
    #[command(flatten)]
    pub(crate) settings: SettingFlags<ForWorker>,
}

/// `cortex serve`: its settings are all in the table.
#[derive(Debug, Args, Clone)]
pub(crate) struct ServeArgs {
    #[command(flatten)]
    pub(crate) settings: SettingFlags<ForServe>,
}

/// `cortex bench`: the engine in llama-batched-bench's columns.
#[derive(Debug, Args, Clone)]
pub(crate) struct BenchArgs {
    /// Batch sizes (parallel sequences) to measure.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 4, 16, 32, 64])]
    pub(crate) batch: Vec<usize>,
    /// Runs per row (the best is kept).
    #[arg(long, default_value_t = 1)]
    pub(crate) repeat: usize,
    /// Prompt tokens of each sequence (llama-batched-bench's -npp).
    #[arg(long, default_value_t = cortex_llama::bench::BATCHED_TOKENS.0)]
    pub(crate) pp: usize,
    /// Tokens each sequence generates (llama-batched-bench's -ntg).
    #[arg(long, default_value_t = cortex_llama::bench::BATCHED_TOKENS.1)]
    pub(crate) tg: usize,
    /// Skip the shared-prefix table.
    #[arg(long)]
    pub(crate) no_prefix: bool,
    /// Skip the plain llama.cpp loop beside each engine row.
    #[arg(long)]
    pub(crate) engine_only: bool,
    /// Time every graph operation of each row's last run and print where
    /// the device's time went (each operation then runs alone and is waited
    /// for, so those runs are slower than unprofiled ones).
    #[arg(long)]
    pub(crate) profile_ops: bool,
    /// Print JSON instead of tables.
    #[arg(long)]
    pub(crate) json: bool,
    #[command(flatten)]
    pub(crate) settings: SettingFlags<ForEngine>,
}

/// Where a job's results and errors go, for `run` and `results` alike.
#[derive(Debug, Args, Clone)]
pub(crate) struct OutputArgs {
    /// The results (default: NAME.results.jsonl here, NAME being the input's
    /// file name less .jsonl for `run`, job-N for `results`; `-`: stdout); a
    /// `.parquet` name writes one table of results and errors. A local path or
    /// a URL (s3://, gs://, az://): a file or an object appears whole, once
    /// written; a device or a pipe is written into. Never a file the job reads.
    #[arg(short, long, value_name = "FILE|URL")]
    pub(crate) output: Option<String>,
    /// The error file for failed, cancelled and invalid requests (default:
    /// beside the results, named after them: OUT.errors.jsonl, or
    /// NAME.errors.jsonl here when the results go to stdout or a device; `-`:
    /// stdout, after the results); a local path or a URL.
    #[arg(long, value_name = "FILE|URL")]
    pub(crate) errors: Option<String>,
}

#[derive(Debug, Args, Clone)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    pub(crate) submit: SubmitArgs,
    #[command(flatten)]
    pub(crate) outputs: OutputArgs,
    /// For a .parquet output of a table's rows (Parquet, or CSV/JSONL rows
    /// read through --prompt-template): input columns to carry beside each
    /// row's answer (comma-separated; one named like an output column
    /// becomes input_NAME).
    #[arg(long, value_name = "NAMES", value_delimiter = ',')]
    pub(crate) keep_columns: Vec<String>,
    /// Write every engine step as a JSON line to FILE (its batch, the KV its
    /// attention read, decode, device and host time) and print where the
    /// time went.
    #[arg(long, value_name = "FILE")]
    pub(crate) trace: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) settings: SettingFlags<ForRun>,
}

#[derive(Debug, Args, Clone)]
pub(crate) struct GenerateArgs {
    /// The prompt; `-` reads it from stdin.
    pub(crate) prompt: String,
    /// Treat the prompt as a user message in the model's chat template.
    #[arg(long)]
    pub(crate) chat: bool,
    #[command(flatten)]
    pub(crate) request: RequestFlags,
    /// Constrain the output to a JSON Schema (a file), as `response_format` json_schema does.
    #[arg(long, value_name = "FILE", conflicts_with = "grammar")]
    pub(crate) json_schema: Option<PathBuf>,
    /// Constrain the output to a GBNF grammar (a file, start rule `root`).
    #[arg(long, value_name = "FILE")]
    pub(crate) grammar: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) settings: SettingFlags<ForEngine>,
}

impl Command {
    /// The command's name, as typed.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Command::Submit(_) => "submit",
            Command::Worker(_) => "worker",
            Command::Status { .. } => "status",
            Command::List { .. } => "list",
            Command::Results { .. } => "results",
            Command::Cancel { .. } => "cancel",
            Command::Resume { .. } => "resume",
            Command::Retry { .. } => "retry",
            Command::Run(_) => "run",
            Command::Generate(_) => "generate",
            Command::Models { .. } => "models",
            Command::Bench(_) => "bench",
            Command::Serve(_) => "serve",
            Command::Devices { .. } => "devices",
            Command::Config { .. } => "config",
        }
    }

    /// The setting flags given after the command's name, and the groups of
    /// settings it takes.
    pub(crate) fn settings(&self) -> (&crate::settings::RawValues, &'static [Group]) {
        fn of<S: Scope>(
            flags: &SettingFlags<S>,
        ) -> (&crate::settings::RawValues, &'static [Group]) {
            (&flags.values, S::GROUPS)
        }
        match self {
            Command::Submit(args) => of(&args.settings),
            Command::Worker(args) => of(&args.settings),
            Command::List { settings, .. } => of(settings),
            Command::Status { settings, .. }
            | Command::Results { settings, .. }
            | Command::Cancel { settings, .. }
            | Command::Resume { settings, .. }
            | Command::Retry { settings, .. } => of(settings),
            Command::Run(args) => of(&args.settings),
            Command::Generate(args) => of(&args.settings),
            Command::Models { settings, .. } => of(settings),
            Command::Bench(args) => of(&args.settings),
            Command::Serve(args) => of(&args.settings),
            Command::Devices { settings, .. } => of(settings),
            Command::Config { settings, .. } => of(settings),
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;
    use cortex_request::{SamplingParams, StopConditions};

    /// The sampling flags' help states the library's defaults as numbers,
    /// and they are the numbers the library uses.
    #[test]
    fn the_request_flags_help_gives_the_librarys_defaults_as_numbers() {
        let mut cli = super::Cli::command();
        let run = cli.find_subcommand_mut("run").expect("cortex run");
        let help = run.render_long_help().to_string();
        let flat = help.split_whitespace().collect::<Vec<_>>().join(" ");
        let defaults = SamplingParams::default();
        for expected in [
            format!("num_predict, else {})", StopConditions::DEFAULT_MAX_TOKENS),
            format!("model's, else {:.1}; 0 is greedy)", defaults.temperature),
            format!("model's, else {:.1}: off)", defaults.top_p),
        ] {
            assert!(flat.contains(&expected), "{expected}\n{flat}");
        }
    }
}
