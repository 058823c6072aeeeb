//! What the job commands print: statuses, tables, progress bars, and what
//! submit, results, cancel/resume/retry and run report.

use std::fmt::Write as _;
use std::time::Duration;

use cortex_queue::{Job, JobStatus, Submitted};

use crate::export::Exported;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

use super::{duration, print_json, timestamp};

/// The status block of `cortex status`.
pub(crate) fn status_text(status: &JobStatus) -> String {
    let job = &status.job;
    let c = &job.counts;
    let mut out = String::new();
    let _ = writeln!(out, "job {}  {}  {}", job.id, job.state, job.source_name);
    let _ = writeln!(out, "  model     {}", model_text(job));
    if let Some(url) = &job.output_url {
        let _ = writeln!(out, "  output    {url} (written when the job ends)");
    }
    let _ = writeln!(
        out,
        "  requests  {} total: {} completed, {} failed, {} cancelled, {} running, {} pending",
        c.total, c.completed, c.failed, c.cancelled, c.running, c.pending
    );
    let _ = write!(
        out,
        "  tokens    {} generated, {} prompt",
        job.completion_tokens + status.running_tokens,
        job.prompt_tokens
    );
    if status.running_tokens > 0 {
        let _ = write!(out, " ({} by running requests)", status.running_tokens);
    }
    out.push('\n');
    let _ = writeln!(
        out,
        "  speed     {:.2} requests/s, {:.1} tokens/s (last {})",
        status.items_per_second,
        status.tokens_per_second,
        duration(status.window)
    );
    if let Some(eta) = status.eta {
        let _ = writeln!(out, "  eta       {}", duration(eta));
    }
    let _ = writeln!(out, "  reruns    {}", reruns_text(job));
    let _ = write!(out, "  created   {}", timestamp(job.times.created_at));
    if let Some(url) = &job.notify_url {
        let _ = write!(out, "\n  notify    {url} (when it ends)");
    }
    if let (Some(expires_at), false) = (job.times.expires_at, job.state.is_terminal()) {
        let _ = write!(
            out,
            "\n  window    ends {} (what has not finished then fails with batch_expired)",
            timestamp(expires_at)
        );
    }
    let ended = [
        job.times.completed_at,
        job.times.failed_at,
        job.times.cancelled_at,
        job.times.expired_at,
    ]
    .into_iter()
    .flatten()
    .max();
    if let (Some(ended), true) = (ended, job.state.is_terminal()) {
        let _ = write!(out, "\n  ended     {}", timestamp(ended));
    }
    out
}

/// Whether running the job again gives the same outputs (the book's "Same
/// input, same output"), as far as the workers that claimed its lines say.
fn reruns_text(job: &Job) -> &'static str {
    let ran = job.counts.completed + job.counts.running + job.counts.failed > job.counts.invalid;
    match (job.outputs_may_vary, ran) {
        (true, _) => {
            "may differ: some lines ran where a line's output can change with what runs beside it (a GPU, llama.cpp's kernels, or weights cortex's kernels do not take)"
        }
        (false, true) => {
            "give the same output: every line so far ran where its output depends only on the line, its settings and its seed"
        }
        (false, false) => {
            "give the same output where its workers keep that promise (`cortex devices` says)"
        }
    }
}

/// The model a job needs: its name and the start of its SHA-256 (only
/// workers running that exact file claim it).
fn model_text(job: &Job) -> String {
    match &job.model_sha256 {
        Some(sha) => format!("{} (sha256 {}…)", job.model, &sha[..sha.len().min(12)]),
        None => format!("{} (any worker)", job.model),
    }
}

/// The table of `cortex list`.
pub(crate) fn jobs_table(jobs: &[Job]) -> String {
    let mut out = format!(
        "{:<6} {:<12} {:>12} {:>7} {:<20} {:<32} {}\n",
        "ID", "STATE", "DONE/TOTAL", "FAILED", "CREATED", "MODEL", "SOURCE"
    );
    for job in jobs {
        let c = &job.counts;
        let _ = writeln!(
            out,
            "{:<6} {:<12} {:>12} {:>7} {:<20} {:<32} {}",
            job.id.0,
            job.state.as_str(),
            format!("{}/{}", c.finished(), c.total),
            c.failed,
            timestamp(job.times.created_at),
            job.model,
            job.source_name
        );
    }
    if jobs.is_empty() {
        out.push_str("(no jobs)\n");
    }
    out.trim_end().to_owned()
}

/// A progress bar over a job's requests (hidden when stderr is not a terminal).
pub(crate) fn job_bar(total: u64) -> ProgressBar {
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{bar:30.cyan/blue} {pos}/{len} requests  {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar
}

/// Moves the bar to the job's status.
pub(crate) fn update_bar(bar: &ProgressBar, status: &JobStatus) {
    let c = &status.job.counts;
    bar.set_length(c.total);
    bar.set_position(c.finished());
    let eta = status
        .eta
        .map_or_else(String::new, |eta| format!(", eta {}", duration(eta)));
    bar.set_message(format!(
        "{} tokens, {:.0} tok/s{eta} [{}]",
        status.job.completion_tokens + status.running_tokens,
        status.tokens_per_second,
        status.job.state
    ));
}

/// The bar's figures as one plain line on stderr, for a watch whose output
/// is not a terminal; with `hint` after them.
pub(crate) fn progress_line(status: &JobStatus, hint: Option<&str>) {
    let c = &status.job.counts;
    let eta = status
        .eta
        .map_or_else(String::new, |eta| format!(", eta {}", duration(eta)));
    let hint = hint.map_or_else(String::new, |hint| format!("; {hint}"));
    eprintln!(
        "job {} {}: {} of {} requests done, {} tokens, {:.0} tok/s{eta}{hint}",
        status.job.id,
        status.job.state,
        c.finished(),
        c.total,
        status.job.completion_tokens + status.running_tokens,
        status.tokens_per_second,
    );
}

/// What `cortex submit` says about a stored job, and who will run it: the
/// worker already working the queue (`worker`), or the command to start one.
pub(crate) fn submitted(
    submitted: &Submitted,
    worker: Option<&str>,
    json: bool,
) -> anyhow::Result<()> {
    if json {
        return print_json(&json!({
            "job": submitted.job, "items": submitted.items, "invalid": submitted.invalid,
            "invalid_lines": submitted.first_errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
        }));
    }
    outln!("{}", submitted.job)?;
    if submitted.invalid > 0 {
        eprintln!(
            "{} invalid lines recorded as failed, e.g. {}",
            submitted.invalid, submitted.first_errors[0]
        );
    }
    let next = match worker {
        Some(worker) => format!("the worker on {worker} will generate them"),
        None => "run `cortex worker` to generate them".to_owned(),
    };
    eprintln!(
        "job {} submitted with {}; {next}",
        submitted.job,
        requests(submitted.items)
    );
    Ok(())
}

/// `N requests`, or `1 request`.
pub(crate) fn requests(n: u64) -> String {
    counted(n, "request")
}

/// `N units`, or `1 unit`.
pub(crate) fn counted(n: u64, unit: &str) -> String {
    if n == 1 {
        format!("1 {unit}")
    } else {
        format!("{n} {unit}s")
    }
}

/// A job's status, once.
pub(crate) fn status(status: &JobStatus, json: bool) -> anyhow::Result<()> {
    if json {
        print_json(status)
    } else {
        outln!("{}", status_text(status))?;
        Ok(())
    }
}

/// A job's status when `--watch` saw it end (JSON on one line).
pub(crate) fn final_status(status: &JobStatus, json: bool) -> anyhow::Result<()> {
    if json {
        outln!("{}", serde_json::to_string(status)?)?;
    } else {
        outln!("{}", status_text(status))?;
    }
    Ok(())
}

/// The jobs `cortex list` found.
pub(crate) fn jobs(jobs: &[Job], json: bool) -> anyhow::Result<()> {
    if json {
        print_json(&jobs)
    } else {
        outln!("{}", jobs_table(jobs))?;
        Ok(())
    }
}

/// Where `cortex results` wrote a job's results and errors.
pub(crate) fn exported(job: i64, exported: &Exported, json: bool) -> anyhow::Result<()> {
    let text = if json {
        serde_json::to_string_pretty(&json!({
            "job": job, "results": exported.results, "output": exported.output.to_string(),
            "errors": exported.errors, "errors_file": exported.errors_to.to_string(),
        }))?
    } else {
        format!(
            "{} results -> {}\n{} errors  -> {}",
            exported.results, exported.output, exported.errors, exported.errors_to
        )
    };
    report(exported, &text)
}

/// Prints what an export did, on stderr when the results themselves went
/// to stdout (`-o -`), so the two never mix.
fn report(exported: &Exported, text: &str) -> anyhow::Result<()> {
    if exported.on_stdout() {
        eprintln!("{text}");
        return Ok(());
    }
    outln!("{text}")
}

/// A job after a command changed it (`what`: "cancelled", "resumed (…)").
pub(crate) fn job_changed(job: &Job, json: bool, what: &str) -> anyhow::Result<()> {
    if json {
        return print_json(job);
    }
    outln!(
        "job {} {what}: now {} ({})",
        job.id,
        job.state,
        counts_in_words(&job.counts)
    )?;
    Ok(())
}

/// "3 of 20 requests completed, 17 cancelled": what happened to them, with
/// only the counts that are not zero beyond the completed ones.
fn counts_in_words(c: &cortex_queue::JobCounts) -> String {
    let mut text = format!("{} of {} requests completed", c.completed, c.total);
    let to_run = c.pending + c.running;
    for (count, what) in [
        (c.failed - c.invalid, "failed"),
        (c.invalid, "invalid"),
        (c.cancelled, "cancelled"),
        (to_run, "still to run"),
    ] {
        if count > 0 {
            text.push_str(&format!(", {count} {what}"));
        }
    }
    text
}

/// What `cortex run` did: the job, its files, and a taste of the output.
pub(crate) fn run_summary(
    job: &Job,
    exported: &Exported,
    took: Duration,
    generated: u64,
) -> anyhow::Result<()> {
    use std::fmt::Write as _;
    let mut text = format!(
        "job {} {}: {} of {} requests completed in {} ({generated} tokens generated here, {:.0} tokens/s)\n",
        job.id,
        job.state,
        job.counts.completed,
        job.counts.total,
        duration(took),
        generated as f64 / took.as_secs_f64().max(1e-3)
    );
    writeln!(
        text,
        "results: {} ({})",
        exported.output,
        counted(exported.results, exported.result_unit())
    )?;
    write!(
        text,
        "errors:  {} ({})",
        exported.errors_to,
        counted(exported.errors, "line")
    )?;
    // A taste of the output (a table is for other tools to read).
    for line in &exported.first_lines {
        let value: serde_json::Value = serde_json::from_str(line)?;
        let answer = cortex_openai::answer_preview(line).unwrap_or_default();
        let mut short: String = answer
            .trim()
            .chars()
            .take(70)
            .collect::<String>()
            .replace('\n', " ");
        if answer.trim().chars().count() > 70 {
            short.push('…');
        }
        write!(
            text,
            "\n  {:<12} {short}",
            value["custom_id"].as_str().unwrap_or_default()
        )?;
    }
    report(exported, &text)
}
