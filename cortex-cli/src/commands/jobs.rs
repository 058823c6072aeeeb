//! The job commands: submit, status, list, results, cancel, resume, retry.

use std::io::BufRead;
use std::time::Duration;

use anyhow::Context as _;
use cortex_objects::Location;
use cortex_openai::SubmitJsonl;
use cortex_parquet::{RowLines, TableInput, TextTable};
use cortex_queue::{JobFilter, JobId, JobState, Queue, QueueError, Submitted};

use super::{BadInput, NoJob, open_store};
use crate::cli::{OutputArgs, SubmitArgs};
use crate::config::Config;
use crate::export::{Outputs, ReadFile, export_job};
use crate::output;

/// The configuration a job of `args.file` runs with: the model its lines
/// name (one per file, as OpenAI's Batch API requires) when none was
/// chosen; refused when they name another of this machine's models than
/// the one chosen, or, with none chosen, one the registry does not have,
/// unless `--ignore-line-models`. A name that is no model here gives way
/// to a chosen model. Names set aside are said once. Only a local JSONL
/// file is read for this.
pub(crate) fn for_input(config: &Config, args: &SubmitArgs) -> anyhow::Result<Config> {
    let Location::Local(path) = Location::parse(&args.file)? else {
        return Ok(config.clone());
    };
    // A table's rows are data, not requests: a `model` column names no model.
    if args.prompt_template.is_some() {
        return Ok(config.clone());
    }
    if cortex_parquet::is_parquet(&path).unwrap_or(false) {
        return Ok(config.clone());
    }
    let Ok(file) = std::fs::File::open(&path) else {
        // The submit says why it cannot read it.
        return Ok(config.clone());
    };
    let mut reader: Box<dyn BufRead> = Box::new(std::io::BufReader::new(file));
    if starts_an_array(reader.as_mut()) {
        match cortex_parquet::json_array_lines(reader) {
            Ok((lines, _)) => reader = lines,
            // The submit says what is wrong with it.
            Err(_) => return Ok(config.clone()),
        }
    }
    if args.ignore_line_models {
        // Whatever the lines name runs on the job's model, said once.
        let named = cortex_openai::named_models(reader)
            .map_err(|message| BadInput(format!("{}: {message}", args.file)))?;
        let job = config.identify_model()?;
        let registry = config.registry();
        let others: Vec<String> = named
            .iter()
            .filter(|n| {
                cortex_worker::identify(&n.name, &registry).map_or(true, |m| m.sha256 != job.sha256)
            })
            .map(|n| format!("{} (line {})", n.name, n.line))
            .collect();
        if !others.is_empty() {
            eprintln!(
                "the lines name {}: they run on {} (--ignore-line-models)",
                others.join(", "),
                job.name
            );
        }
        return Ok(config.clone());
    }
    let named = cortex_openai::named_model(reader)
        .map_err(|message| BadInput(format!("{}: {message}", args.file)))?;
    let Some(named) = named else {
        return Ok(config.clone());
    };
    let registry = config.registry();
    let line_model = cortex_worker::identify(&named.name, &registry);
    if !config.model_chosen() {
        return match line_model {
            Ok(_) => Ok(config.with_input_model(&named.name, named.line)),
            Err(e) => Err(BadInput(format!(
                "{} line {}: the lines name the model {}, which is not here ({e}); give --model NAME to run the file on a model of yours, or --ignore-line-models to run it on the default model",
                args.file, named.line, named.name
            ))
            .into()),
        };
    }
    let job = config.identify_model()?;
    match line_model {
        Ok(line) if line.sha256 == job.sha256 => Ok(config.clone()),
        // A name that is no model here (a hosted API's, as a pipeline's
        // file has it) gives way to the model chosen, said once; another
        // model of this machine is refused below: both are real choices.
        Err(_) => {
            eprintln!(
                "{}: the lines name {} (line {}), which is not a model here: they run on {} (set by {})",
                args.file,
                named.name,
                named.line,
                job.name,
                config.model_setting().1
            );
            Ok(config.clone())
        }
        Ok(_) => Err(BadInput(format!(
            "{} line {}: the lines name the model {}, but the job runs {} (set by {}); a job runs one model: give --model {} to run the file on it, or --ignore-line-models to run it on {}",
            args.file,
            named.line,
            named.name,
            job.name,
            config.model_setting().1,
            named.name,
            job.name
        ))
        .into()),
    }
}

pub(super) fn submit_job(
    store: &mut dyn Queue,
    config: &Config,
    args: &SubmitArgs,
    output_url: Option<String>,
) -> anyhow::Result<Submitted> {
    let mut options = config.submit_options(args)?;
    options.output_url = output_url;
    let table = TableInput {
        prompt_template: args.prompt_template.clone(),
        id_column: args.id_column.clone(),
    };
    let location = Location::parse(&args.file)?;
    let name = location.to_string();
    let templated = table != TableInput::default();
    // A table's columns that cannot make the requests asked for are bad input.
    let bad_table = |e: std::io::Error| -> anyhow::Error {
        match e.kind() {
            std::io::ErrorKind::InvalidData => BadInput(format!("{name}: {e}")).into(),
            _ => anyhow::Error::new(e).context(format!("cannot read {name}")),
        }
    };
    let submitted = match &location {
        Location::Local(path) => {
            let parquet =
                cortex_parquet::is_parquet(path).with_context(|| format!("cannot read {name}"))?;
            if parquet {
                let rows = RowLines::open(path, &table).map_err(bad_table)?;
                store.submit_reader(rows, &name, &options)
            } else {
                let open = || -> anyhow::Result<Box<dyn BufRead>> {
                    let file =
                        std::fs::File::open(path).with_context(|| format!("cannot read {name}"))?;
                    Ok(Box::new(std::io::BufReader::with_capacity(
                        PEEK_BYTES, file,
                    )))
                };
                match text_kind(&name, open()?.as_mut(), templated)? {
                    Some(kind) if templated => {
                        let rows = RowLines::open_text(open()?, kind, &table).map_err(bad_table)?;
                        store.submit_reader(rows, &name, &options)
                    }
                    Some(TextTable::JsonArray) => store.submit_reader(
                        array_lines(&name, open()?).map_err(bad_table)?,
                        &name,
                        &options,
                    ),
                    _ => store.submit_file(path, &options),
                }
            }
        }
        // Read as it streams in; the object's name is the job's source.
        Location::Object(object) => {
            let object = object.open()?;
            if cortex_parquet::is_parquet_object(&object)? {
                let rows = RowLines::open_object(&object, &table).map_err(bad_table)?;
                store.submit_reader(rows, &name, &options)
            } else {
                let mut reader: Box<dyn BufRead> = Box::new(std::io::BufReader::with_capacity(
                    PEEK_BYTES,
                    object.reader(),
                ));
                match text_kind(&name, reader.as_mut(), templated)? {
                    Some(kind) if templated => {
                        let rows = RowLines::open_text(reader, kind, &table).map_err(bad_table)?;
                        store.submit_reader(rows, &name, &options)
                    }
                    Some(TextTable::JsonArray) => store.submit_reader(
                        array_lines(&name, reader).map_err(bad_table)?,
                        &name,
                        &options,
                    ),
                    _ => store.submit_reader(reader, &name, &options),
                }
            }
        }
    };
    submitted.map_err(|e| match e {
        // Bad lines: fix them, or keep the rest (an empty file has none).
        QueueError::InvalidInput(ref report) if !args.skip_invalid && !report.errors.is_empty() => {
            anyhow::Error::new(e).context(
                "the file was rejected (fix the lines, or --skip-invalid to keep the valid ones)",
            )
        }
        other => other.into(),
    })
}

/// A JSON array's elements as the job's lines, saying so once (its line
/// numbers in any error are the elements').
fn array_lines(name: &str, reader: impl std::io::Read) -> std::io::Result<Box<dyn BufRead>> {
    let (lines, elements) = cortex_parquet::json_array_lines(reader)?;
    eprintln!("{name} is a JSON array: its {elements} elements are read as lines 1-{elements}");
    Ok(lines)
}

/// Whether a text input's first character that is not blank (or a BOM)
/// opens a JSON array.
fn starts_an_array(reader: &mut dyn BufRead) -> bool {
    reader.fill_buf().is_ok_and(|buffered| {
        String::from_utf8_lossy(buffered)
            .trim_start_matches('\u{feff}')
            .trim_start()
            .starts_with('[')
    })
}

/// How much of a text input is looked at to tell what it holds.
const PEEK_BYTES: usize = 1 << 20;

/// What a text input holds, from its first line (peeked, not read): JSONL
/// or a CSV table, `None` for an empty one. A CSV without a template, or
/// text that is neither, is refused here, saying what it is and what to do.
fn text_kind(
    name: &str,
    reader: &mut dyn BufRead,
    templated: bool,
) -> anyhow::Result<Option<TextTable>> {
    let buffered = reader
        .fill_buf()
        .with_context(|| format!("cannot read {name}"))?;
    let text = String::from_utf8_lossy(buffered);
    let mut lines = text.lines().filter(|line| !line.trim().is_empty()).take(5);
    let Some(first) = lines.next() else {
        return Ok(None);
    };
    // A JSONL file with a broken first line is JSONL still: its lines
    // are reported one by one.
    let any_object = || lines.clone().any(|line| line.trim_start().starts_with('{'));
    match TextTable::of_first_line(first) {
        None if any_object() => Ok(Some(TextTable::Jsonl)),
        Some(TextTable::Csv) if !templated => Err(BadInput(format!(
            "{name} is a CSV table (columns {}), not JSONL lines: give --prompt-template 'Summarise: {{text}}' (and --id-column) to make a request of each row",
            first.trim()
        ))
        .into()),
        Some(kind) => Ok(Some(kind)),
        None => Err(BadInput(format!(
            "{name} is neither JSONL lines (a JSON object on each line) nor a table cortex reads (Parquet, or CSV with a header row); its first line: {:?}",
            first.chars().take(60).collect::<String>()
        ))
        .into()),
    }
}

pub(crate) fn submit(
    config: &Config,
    args: &SubmitArgs,
    output: Option<&str>,
) -> anyhow::Result<()> {
    let output_url = output.map(destination).transpose()?;
    let config = &for_input(config, args)?;
    if let Some(url) = &output_url {
        // Never the input or the database; whether it can be created is the
        // worker's to find when it writes (its folder may come later).
        let mut reads = config.files_read();
        if let Ok(Location::Local(path)) = Location::parse(&args.file) {
            reads.push(ReadFile::new(path, "the input"));
        }
        Outputs::choose(Some(url), None, "results")?.refuse_replacing(&reads)?;
    }
    let mut store = open_store(config)?;
    let submitted = submit_job(store.as_mut(), config, args, output_url)?;
    let job = store.job(submitted.job)?;
    // A worker started with --detach that is still loading its model will
    // take the job too (it works every job of its model, or every job).
    let worker = match live_worker(store.as_mut(), config, &job)? {
        Some(worker) => Some(worker),
        None => super::detached_workers(config)
            .first()
            .map(|(pid, _)| format!("this host, starting (pid {pid})")),
    };
    output::submitted(&submitted, worker.as_deref(), args.json)
}

/// Where a job's results are to go, as the worker will read it: an object's
/// URL (one that can be written), or a local path made absolute (a worker
/// runs elsewhere).
fn destination(output: &str) -> anyhow::Result<String> {
    Ok(match Location::parse(output)? {
        Location::Local(path) => std::path::absolute(&path)
            .with_context(|| format!("cannot make {} absolute", path.display()))?
            .display()
            .to_string(),
        Location::Object(object) => {
            object.check_writable()?;
            object.url().to_owned()
        }
    })
}

/// A worker that is working the queue now (a `cortex worker` or `cortex
/// serve` whose heartbeat is recent) and can take the job: where it runs.
/// A worker that has been heard from lately and can take `job` (any model,
/// or the job's), as "host (pid N)".
fn live_worker(
    store: &mut dyn Queue,
    config: &Config,
    job: &cortex_queue::Job,
) -> anyhow::Result<Option<String>> {
    let now = cortex_queue::now_ms();
    let recent = i64::try_from(config.live_worker_window().as_millis()).unwrap_or(i64::MAX);
    Ok(store
        .workers()?
        .into_iter()
        .filter(|w| {
            w.model_sha256.is_none() || w.model_sha256.as_deref() == job.model_sha256.as_deref()
        })
        .find(|w| now - w.heartbeat_at.unwrap_or(w.registered_at) < recent)
        .map(|w| format!("{} (pid {})", w.host, w.pid)))
}

fn newest_job(store: &mut dyn Queue) -> anyhow::Result<JobId> {
    let jobs = store.jobs(&JobFilter {
        limit: Some(1),
        ..JobFilter::default()
    })?;
    jobs.first()
        .map(|j| j.id)
        .ok_or_else(|| NoJob("no jobs yet; submit one with `cortex submit FILE`".into()).into())
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
        return output::status(&store.status(job)?, json);
    }
    // A bar on a terminal; elsewhere (tee, a CI log) a plain line whenever
    // the count moves, and at least every half minute.
    let on_terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let bar = output::job_bar(0);
    let mut last_line: Option<(u64, std::time::Instant)> = None;
    for tick in 0u64.. {
        let status = store.status(job)?;
        if status.job.state.is_terminal() {
            bar.finish();
            return output::final_status(&status, json);
        }
        // Nothing moves without a worker; say so rather than show 0 tok/s
        // forever (one started with --detach registers once its model loads).
        let idle = tick % 10 == 0
            && status.job.counts.running == 0
            && live_worker(store.as_mut(), config, &status.job)?.is_none();
        let hint = idle.then(|| match super::detached_workers(config).first() {
            Some((pid, log)) => format!(
                "a worker is starting in the background (pid {pid}, loading its model; log: {})",
                log.display()
            ),
            None => "no worker is running: start one with `cortex worker`".to_owned(),
        });
        if on_terminal {
            output::update_bar(&bar, &status);
            if let Some(hint) = &hint {
                bar.println(hint);
            }
        } else {
            let finished = status.job.counts.finished();
            let due = last_line.is_none_or(|(count, at)| {
                count != finished || at.elapsed() >= Duration::from_secs(30)
            });
            if due || hint.is_some() {
                output::progress_line(&status, hint.as_deref());
                last_line = Some((finished, std::time::Instant::now()));
            }
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    unreachable!("a u64 of half seconds does not run out")
}

pub(crate) fn list(
    config: &Config,
    state: Option<JobState>,
    limit: usize,
    json: bool,
) -> anyhow::Result<()> {
    // A model given (flag, variable or file) lists its jobs only, by the
    // name they were submitted for.
    let model = config.chosen_model_name();
    let jobs = open_store(config)?.jobs(&JobFilter {
        state,
        model,
        limit: Some(limit),
        ..JobFilter::default()
    })?;
    output::jobs(&jobs, json)
}

pub(crate) fn results(
    config: &Config,
    job: i64,
    outputs: &OutputArgs,
    partial: bool,
    json: bool,
) -> anyhow::Result<()> {
    let mut store = open_store(config)?;
    let outputs = Outputs::choose(
        outputs.output.as_deref(),
        outputs.errors.as_deref(),
        &format!("job-{job}"),
    )?;
    // The file the job was submitted from, where it still is, is an input too.
    let mut reads = config.files_read();
    if let Ok(Location::Local(source)) = Location::parse(&store.job(JobId(job))?.source_name) {
        reads.push(ReadFile::new(source, "the job's input"));
    }
    outputs.check(&reads)?;
    let exported = export_job(
        store.as_mut(),
        JobId(job),
        &outputs.results,
        &outputs.errors,
        partial,
        None,
    )
    .map_err(|e| match e.downcast_ref::<QueueError>() {
        Some(QueueError::WrongState {
            job: id,
            state,
            hint,
        }) if !partial => QueueError::WrongState {
            job: *id,
            state: *state,
            hint: format!("{hint} with `cortex results {job} --partial`"),
        }
        .into(),
        _ => e,
    })?;
    output::exported(job, &exported, json)
}

pub(crate) fn cancel(config: &Config, job: i64, json: bool) -> anyhow::Result<()> {
    let job = open_store(config)?.cancel(JobId(job))?;
    output::job_changed(&job, json, "cancelled")
}

pub(crate) fn resume(config: &Config, job: i64, json: bool) -> anyhow::Result<()> {
    let (job, count) = open_store(config)?.resume(JobId(job))?;
    output::job_changed(
        &job,
        json,
        &format!("resumed ({count} requests to run again)"),
    )
}

pub(crate) fn retry(config: &Config, job: i64, json: bool) -> anyhow::Result<()> {
    let (job, count) = open_store(config)?.retry_failed(JobId(job))?;
    let mut what = format!("retried ({count} failed requests to run again");
    // Invalid lines fail again however often they run: they are not retried.
    match job.counts.invalid {
        0 => {}
        1 => what.push_str("; its invalid input line is not retried: fix it and submit it again"),
        n => what.push_str(&format!(
            "; its {n} invalid input lines are not retried: fix them and submit them again"
        )),
    }
    what.push(')');
    output::job_changed(&job, json, &what)?;
    if count == 0 && matches!(job.state, JobState::Cancelled | JobState::Cancelling) {
        eprintln!(
            "a cancelled job's requests run again with `cortex resume {}`",
            job.id.0
        );
    }
    Ok(())
}
