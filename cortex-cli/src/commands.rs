//! One function per subcommand.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use cortex_engine::bench::{self, BenchRow, ReportPlan};
use cortex_engine::{
    DEFAULT_MODEL, Engine, EngineEvent, KNOWN_MODELS, ModelCache, ModelSpec, Shutdown, read_gguf,
};
use cortex_openai::{ExportJsonl, SubmitJsonl};
use cortex_queue::{Job, JobFilter, JobId, JobState, Queue, QueueError, SubmitOptions, Submitted};
use cortex_request::{ChatMessage, Prompt, Request, RequestId};
use serde_json::json;

use crate::config::Config;
use crate::output;
use crate::worker::{StopFlag, WorkerScope, identify_model, resolve_model, run_worker};
use crate::{BenchArgs, GenerateArgs, RunArgs, SubmitArgs, WorkerArgs};

fn open_store(config: &Config) -> anyhow::Result<Box<dyn Queue>> {
    Ok(config.queue()?.open()?)
}

fn print_json(value: &impl serde::Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

fn submit_options(config: &Config, args: &SubmitArgs) -> anyhow::Result<SubmitOptions> {
    let (name, sha256) = identify_model(config)?;
    let mut options = SubmitOptions::new(name);
    options.model_sha256 = Some(sha256);
    if let Some(v) = args.max_tokens {
        options.defaults.stop.max_tokens = v;
    }
    if let Some(v) = args.temperature {
        options.defaults.sampling.temperature = v;
    }
    if let Some(v) = args.top_p {
        options.defaults.sampling.top_p = v;
    }
    options.defaults.sampling.seed = args.seed;
    options.priority = args.priority;
    options.max_attempts = args.max_attempts.unwrap_or(config.max_attempts.value);
    options.metadata = args.metadata.iter().cloned().collect();
    options.skip_invalid = args.skip_invalid;
    options.force = args.force;
    Ok(options)
}

fn submit_job(
    store: &mut dyn Queue,
    config: &Config,
    args: &SubmitArgs,
) -> anyhow::Result<Submitted> {
    let options = submit_options(config, args)?;
    store
        .submit_file(&args.file, &options)
        .map_err(|e| match e {
            QueueError::InvalidInput(_) if !args.skip_invalid => anyhow::Error::new(e).context(
                "the file was rejected (fix the lines, or --skip-invalid to keep the valid ones)",
            ),
            other => other.into(),
        })
}

fn requests(n: u64) -> String {
    if n == 1 {
        "1 request".into()
    } else {
        format!("{n} requests")
    }
}

pub(crate) fn submit(config: &Config, args: &SubmitArgs) -> anyhow::Result<()> {
    let mut store = open_store(config)?;
    let submitted = submit_job(store.as_mut(), config, args)?;
    if args.json {
        return print_json(&json!({
            "job": submitted.job, "items": submitted.items, "invalid": submitted.invalid,
            "invalid_lines": submitted.first_errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
        }));
    }
    println!("{}", submitted.job);
    if submitted.invalid > 0 {
        eprintln!(
            "{} invalid lines recorded as failed, e.g. {}",
            submitted.invalid, submitted.first_errors[0]
        );
    }
    eprintln!(
        "job {} submitted with {}; run `cortex worker` to generate them",
        submitted.job,
        requests(submitted.items)
    );
    Ok(())
}

pub(crate) fn worker(config: &Config, args: &WorkerArgs) -> anyhow::Result<()> {
    let stop = StopFlag::install()?;
    let model = resolve_model(config)?;
    let mut store = open_store(config)?;
    let jobs = (!args.jobs.is_empty()).then(|| args.jobs.iter().copied().map(JobId).collect());
    let scope = WorkerScope {
        jobs,
        follow: args.follow,
        observer: None,
    };
    let report = run_worker(config, store.as_mut(), &model, scope, &stop, |_| Ok(()))?;
    eprintln!(
        "worker done: {} completed, {} failed, {} released, {} tokens generated{}",
        report.completed,
        report.failed,
        report.released,
        report.generated_tokens,
        if report.stopped_by_signal {
            " (stopped by signal)"
        } else {
            ""
        }
    );
    Ok(())
}

/// Starts `cortex worker` again in the background (same arguments, without
/// --detach), its output going to a log file in the data directory.
pub(crate) fn detach_worker(config: &Config) -> anyhow::Result<()> {
    use std::os::unix::process::CommandExt;
    let logs = config.data_dir.value.join("logs");
    std::fs::create_dir_all(&logs).with_context(|| format!("cannot create {}", logs.display()))?;
    let log_path = logs.join(format!("worker-{}.log", cortex_queue::now_ms()));
    let log = std::fs::File::create(&log_path)
        .with_context(|| format!("cannot create {}", log_path.display()))?;
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--detach")
        .collect();
    let child = std::process::Command::new(std::env::current_exe()?)
        .args(&args)
        .arg("-v")
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        // Its own process group: a Ctrl-C in this terminal does not reach it.
        .process_group(0)
        .spawn()
        .context("cannot start the worker")?;
    println!("{}", child.id());
    eprintln!(
        "worker started in the background (pid {}); log: {}",
        child.id(),
        log_path.display()
    );
    Ok(())
}

fn newest_job(store: &mut dyn Queue) -> anyhow::Result<JobId> {
    let jobs = store.jobs(&JobFilter {
        limit: Some(1),
        ..JobFilter::default()
    })?;
    jobs.first()
        .map(|j| j.id)
        .ok_or_else(|| anyhow::anyhow!("no jobs yet; submit one with `cortex submit FILE`"))
}

pub(crate) fn status(
    config: &Config,
    job: Option<i64>,
    watch: bool,
    json: bool,
) -> anyhow::Result<()> {
    let mut store = open_store(config)?;
    let job = match job {
        Some(id) => JobId(id),
        None => newest_job(store.as_mut())?,
    };
    if !watch {
        let status = store.status(job)?;
        return if json {
            print_json(&status)
        } else {
            println!("{}", output::status_text(&status));
            Ok(())
        };
    }
    let bar = output::job_bar(0);
    loop {
        let status = store.status(job)?;
        output::update_bar(&bar, &status);
        if status.job.state.is_terminal() {
            bar.finish();
            println!(
                "{}",
                if json {
                    serde_json::to_string(&status)?
                } else {
                    output::status_text(&status)
                }
            );
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

pub(crate) fn list(
    config: &Config,
    state: Option<JobState>,
    limit: usize,
    json: bool,
) -> anyhow::Result<()> {
    let jobs = open_store(config)?.jobs(&JobFilter {
        state,
        limit: Some(limit),
        ..JobFilter::default()
    })?;
    if json {
        print_json(&jobs)
    } else {
        println!("{}", output::jobs_table(&jobs));
        Ok(())
    }
}

pub(crate) fn results(
    config: &Config,
    job: i64,
    output_path: Option<PathBuf>,
    errors: Option<PathBuf>,
    partial: bool,
    json: bool,
) -> anyhow::Result<()> {
    let mut store = open_store(config)?;
    let output_path = output_path.unwrap_or_else(|| PathBuf::from(format!("results-{job}.jsonl")));
    let errors = errors.unwrap_or_else(|| PathBuf::from(format!("errors-{job}.jsonl")));
    let summary = store.export(JobId(job), &output_path, Some(&errors), partial)?;
    if json {
        return print_json(&json!({
            "job": job, "results": summary.results, "output": summary.output,
            "errors": summary.errors, "errors_file": summary.errors_file,
        }));
    }
    println!(
        "{} results -> {}",
        summary.results,
        summary.output.display()
    );
    println!("{} errors  -> {}", summary.errors, errors.display());
    Ok(())
}

fn print_job(job: &Job, json: bool, what: &str) -> anyhow::Result<()> {
    if json {
        return print_json(job);
    }
    let c = &job.counts;
    println!(
        "job {} {what}: now {} ({} of {} requests done)",
        job.id,
        job.state,
        c.finished(),
        c.total
    );
    Ok(())
}

pub(crate) fn cancel(config: &Config, job: i64, json: bool) -> anyhow::Result<()> {
    let job = open_store(config)?.cancel(JobId(job))?;
    print_job(&job, json, "cancelled")
}

pub(crate) fn resume(config: &Config, job: i64, json: bool) -> anyhow::Result<()> {
    let (job, count) = open_store(config)?.resume(JobId(job))?;
    print_job(
        &job,
        json,
        &format!("resumed ({count} requests to run again)"),
    )
}

pub(crate) fn retry(config: &Config, job: i64, json: bool) -> anyhow::Result<()> {
    let (job, count) = open_store(config)?.retry_failed(JobId(job))?;
    print_job(
        &job,
        json,
        &format!("retried ({count} failed requests to run again)"),
    )
}

/// Submits the file (or finds it already submitted), works on that job until
/// it ends, and writes its results next to the current directory.
pub(crate) fn run_file(config: &Config, args: &RunArgs) -> anyhow::Result<()> {
    let stop = StopFlag::install()?;
    // Fetch the model before anything is stored, so a missing model fails early.
    let model = resolve_model(config)?;
    let mut store = open_store(config)?;
    let job = match submit_job(store.as_mut(), config, &args.submit) {
        Ok(submitted) => {
            eprintln!(
                "job {} submitted with {}",
                submitted.job,
                requests(submitted.items)
            );
            submitted.job
        }
        // Running the same file again picks up the earlier job: nothing finished is redone.
        Err(e) => match e.downcast_ref::<QueueError>() {
            Some(QueueError::DuplicateJob {
                existing, state, ..
            }) => {
                eprintln!(
                    "{} was submitted before as job {existing} ({state}); continuing it",
                    args.submit.file.display()
                );
                if matches!(state, JobState::Cancelled | JobState::Failed) {
                    store.resume(*existing)?;
                }
                *existing
            }
            _ => return Err(e),
        },
    };
    let started = Instant::now();
    let mut generated = 0;
    let mut trace = None;
    if !store.job(job)?.state.is_terminal() {
        let observer: Option<Box<dyn cortex_engine::StepObserver>> = match &args.trace {
            Some(path) => {
                let (writer, summary) = crate::trace::TraceWriter::create(path)?;
                trace = Some((path, summary));
                Some(Box::new(writer))
            }
            None => None,
        };
        let bar = output::job_bar(0);
        let scope = WorkerScope {
            jobs: Some(vec![job]),
            follow: false,
            observer,
        };
        let report = run_worker(config, store.as_mut(), &model, scope, &stop, |store| {
            output::update_bar(&bar, &store.status(job)?);
            Ok(())
        })?;
        bar.finish_and_clear();
        generated = report.generated_tokens;
    }
    if let Some((path, summary)) = trace {
        let summary = summary
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        eprintln!(
            "{}
  every step: {}",
            summary.text(),
            path.display()
        );
    }
    let status = store.status(job)?;
    if !status.job.state.is_terminal() {
        bail!(
            "stopped before job {job} finished ({} of {} done); run the same command again to continue",
            status.job.counts.finished(),
            status.job.counts.total
        );
    }
    let stem = args
        .submit
        .file
        .file_stem()
        .map_or_else(|| "job".into(), |s| s.to_string_lossy().into_owned());
    let output_path = args
        .output
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("{stem}.results.jsonl")));
    let errors_path = output_path.with_file_name(format!("{stem}.errors.jsonl"));
    let summary = store.export(job, &output_path, Some(&errors_path), false)?;
    print_run_summary(
        &status.job,
        &summary.output,
        summary.results,
        &errors_path,
        summary.errors,
        started.elapsed(),
        generated,
    )
}

fn print_run_summary(
    job: &Job,
    output_path: &Path,
    results: u64,
    errors_path: &Path,
    errors: u64,
    took: Duration,
    generated: u64,
) -> anyhow::Result<()> {
    println!(
        "job {} {}: {} of {} requests completed in {} ({generated} tokens generated here, {:.0} tokens/s)",
        job.id,
        job.state,
        job.counts.completed,
        job.counts.total,
        output::duration(took),
        generated as f64 / took.as_secs_f64().max(1e-3)
    );
    println!("results: {} ({results} lines)", output_path.display());
    println!("errors:  {} ({errors} lines)", errors_path.display());
    // A taste of the output.
    let text = std::fs::read_to_string(output_path)?;
    for line in text.lines().take(3) {
        let value: serde_json::Value = serde_json::from_str(line)?;
        let body = &value["response"]["body"]["choices"][0];
        let answer = body["message"]["content"]
            .as_str()
            .or(body["text"].as_str())
            .unwrap_or_default();
        let mut short: String = answer
            .trim()
            .chars()
            .take(70)
            .collect::<String>()
            .replace('\n', " ");
        if answer.trim().chars().count() > 70 {
            short.push('…');
        }
        println!(
            "  {:<12} {short}",
            value["custom_id"].as_str().unwrap_or_default()
        );
    }
    Ok(())
}

/// The grammar `generate` constrains its output with, from `--json-schema`
/// or `--grammar`, checked before the model loads.
fn generation_grammar(args: &GenerateArgs) -> anyhow::Result<Option<String>> {
    let read = |path: &Path| {
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
    };
    if let Some(path) = &args.json_schema {
        let schema: serde_json::Value = serde_json::from_str(&read(path)?)
            .with_context(|| format!("{}: not JSON", path.display()))?;
        let grammar = cortex_grammar::from_json_schema(&schema)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        return Ok(Some(grammar));
    }
    if let Some(path) = &args.grammar {
        let grammar = read(path)?;
        cortex_grammar::check(&grammar).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        return Ok(Some(grammar));
    }
    Ok(None)
}

pub(crate) fn generate(config: &Config, args: &GenerateArgs) -> anyhow::Result<()> {
    let model = resolve_model(config)?.path;
    let engine = Engine::start(&config.engine(&model, 1))?;
    let prompt = if args.chat {
        Prompt::Chat(vec![ChatMessage::user(&args.prompt)])
    } else {
        Prompt::Text(args.prompt.clone())
    };
    let mut request = Request::new(RequestId(1), prompt);
    request.stop.max_tokens = args.max_tokens;
    request.sampling.temperature = args.temperature;
    if let Some(top_p) = args.top_p {
        request.sampling.top_p = top_p;
    }
    request.sampling.seed = args.seed;
    request.grammar = generation_grammar(args)?;
    request.validate(&cortex_request::Limits::default())?;
    let events = engine.submit(request)?;
    let mut stdout = std::io::stdout().lock();
    for event in &events {
        match event {
            EngineEvent::Token { text, .. } => {
                stdout.write_all(text.as_bytes())?;
                stdout.flush()?;
            }
            EngineEvent::Finished(response) => {
                writeln!(stdout)?;
                let u = &response.usage;
                let speed = response
                    .timings
                    .decode_tokens_per_second(u.completion_tokens)
                    .unwrap_or(0.0);
                let reason = response
                    .completions
                    .first()
                    .map_or("stop", |c| c.finish_reason.as_str());
                eprintln!(
                    "[{} prompt + {} generated tokens, {speed:.0} tokens/s, finished: {reason}]",
                    u.prompt_tokens, u.completion_tokens
                );
                break;
            }
            EngineEvent::Failed { error, .. } => return Err(error.into()),
            _ => {}
        }
    }
    engine.shutdown(Shutdown::Abort)?;
    Ok(())
}

pub(crate) fn models_pull(name: Option<&str>) -> anyhow::Result<()> {
    let spec = match name {
        None | Some("default") => &DEFAULT_MODEL,
        Some(name) => ModelSpec::by_name(name).with_context(|| {
            let known: Vec<&str> = KNOWN_MODELS.iter().map(|m| m.name).collect();
            format!(
                "no known model is called {name:?} (known: {})",
                known.join(", ")
            )
        })?,
    };
    let cache = ModelCache::default_location();
    eprintln!(
        "fetching {} into {} (if not there yet)…",
        spec.file_name,
        cache.dir().display()
    );
    let path = cache.ensure(spec)?;
    println!("{}", path.display());
    Ok(())
}

pub(crate) fn models_list(json: bool) -> anyhow::Result<()> {
    let cache = ModelCache::default_location();
    let mut models: Vec<(String, u64)> = match std::fs::read_dir(cache.dir()) {
        Ok(entries) => entries
            .filter_map(Result::ok)
            .filter(|e| e.path().extension().is_some_and(|x| x == "gguf"))
            .map(|e| {
                (
                    e.path().display().to_string(),
                    e.metadata().map_or(0, |m| m.len()),
                )
            })
            .collect(),
        Err(_) => Vec::new(),
    };
    models.sort();
    if json {
        let list: Vec<_> = models
            .iter()
            .map(|(path, size)| json!({ "path": path, "bytes": size }))
            .collect();
        return print_json(&list);
    }
    if models.is_empty() {
        println!(
            "no models in {} (fetch the default one with `cortex models pull`)",
            cache.dir().display()
        );
    }
    for (path, size) in models {
        println!("{:>8.1} MB  {path}", size as f64 / 1e6);
    }
    Ok(())
}

pub(crate) fn models_info(config: &Config, model: Option<&str>, json: bool) -> anyhow::Result<()> {
    let path = match model {
        None => resolve_model(config)?.path,
        Some(name) => match (name == "default")
            .then_some(&DEFAULT_MODEL)
            .or_else(|| ModelSpec::by_name(name))
        {
            Some(spec) => ModelCache::default_location().ensure(spec)?,
            None => PathBuf::from(name),
        },
    };
    let info = read_gguf(&path)?;
    let facts = json!({
        "path": path,
        "architecture": info.architecture(),
        "name": info.string("general.name"),
        "parameters": info.parameters,
        "context_length": info.context_length(),
        "chat_template": info.has_chat_template(),
        "quantisation": info.quantisation(),
        "file_bytes": info.file_size,
        "gguf_version": info.version,
        "tensors": info.tensor_count,
    });
    if json {
        return print_json(&facts);
    }
    for (key, value) in facts.as_object().into_iter().flatten() {
        let shown = value
            .as_str()
            .map_or_else(|| value.to_string(), str::to_owned);
        println!("{key:<15} {shown}");
    }
    Ok(())
}

pub(crate) fn bench(config: &Config, args: &BenchArgs) -> anyhow::Result<()> {
    let model = resolve_model(config)?.path;
    let plan = ReportPlan {
        threads: config.threads.value,
        batch_sizes: args.batch.clone(),
        repeats: args.repeat.max(1),
        raw: !args.engine_only,
        prefix_job: !args.no_prefix,
    };
    let report = bench::run_report(&model, &plan, |line| eprintln!("{line}"))?;
    if !args.json {
        println!("{report}");
        return Ok(());
    }
    let row = |r: &BenchRow| {
        json!({
            "pp": r.pp, "tg": r.tg, "b": r.b, "n_kv": r.n_kv(),
            "t_pp": r.t_pp.as_secs_f64(), "s_pp": r.s_pp(),
            "t_tg": r.t_tg.as_secs_f64(), "s_tg": r.s_tg(),
            "t": r.t().as_secs_f64(), "s": r.s(),
        })
    };
    print_json(&json!({
        "model": report.model,
        "threads": plan.threads,
        "repeats": plan.repeats,
        "batched": report.batched.iter().map(|b| json!({
            "engine": row(&b.engine),
            "raw": b.raw.as_ref().map(row),
        })).collect::<Vec<_>>(),
        "prefix": report.prefix.iter().map(|p| json!({
            "sharing": p.sharing,
            "seconds": p.elapsed.as_secs_f64(),
            "prefill_tokens": p.prefill_tokens,
            "saved_tokens": p.saved_tokens,
            "generated_tokens": p.generated_tokens,
        })).collect::<Vec<_>>(),
        "peak_rss_bytes": report.peak_rss_bytes,
    }))
}

pub(crate) fn show_config(config: &Config, json: bool) -> anyhow::Result<()> {
    let entries = config.entries();
    if json {
        let map: serde_json::Map<_, _> = entries
            .iter()
            .map(|(k, v, s)| ((*k).to_owned(), json!({ "value": v, "source": s })))
            .collect();
        return print_json(&map);
    }
    match &config.file {
        Some(file) => println!("# config file: {}", file.display()),
        None => println!(
            "# config file: none (looked for ./cortex.toml and $XDG_CONFIG_HOME/cortex/cortex.toml)"
        ),
    }
    let width = entries.iter().map(|(k, _, _)| k.len()).max().unwrap_or(0);
    for (key, value, source) in entries {
        println!("{key:<width$} = {value:<50} # {source}");
    }
    Ok(())
}
