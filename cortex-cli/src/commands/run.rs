//! `cortex run`: submit a file (or find it submitted), work on it to the
//! end, write its results.

use std::time::Instant;

use anyhow::{Context as _, bail};
use cortex_objects::Location;
use cortex_queue::{JobState, QueueError};

use super::jobs::{for_input, submit_job};
use super::open_store;
use crate::cli::RunArgs;
use crate::config::Config;
use crate::export::{KeepColumns, Outputs, ReadFile, export_job, output_name};
use crate::output;
use crate::work::{
    Interrupted, StopFlag, WorkerScope, finish_deliveries, start_deliveries, work_one_model,
};

/// Submits the file (or finds it already submitted), works on that job until
/// it ends, and writes its results next to the current directory.
pub(crate) fn run_file(config: &Config, args: &RunArgs) -> anyhow::Result<()> {
    let stop = StopFlag::install()?;
    let input = Location::parse(&args.submit.file)?;
    let outputs = Outputs::choose(
        args.outputs.output.as_deref(),
        args.outputs.errors.as_deref(),
        &output_name(&input),
    )?;
    // Columns to keep are checked before any work, not after it.
    let keep = (!args.keep_columns.is_empty()).then(|| KeepColumns {
        input: &input,
        names: &args.keep_columns,
        templated: args.submit.prompt_template.is_some(),
    });
    if let Some(keep) = &keep {
        keep.check(&outputs.results)?;
    }
    let config = &for_input(config, &args.submit)?;
    // Fetch the model before anything is stored, so a missing model fails early.
    let model = config.resolve_model()?;
    // Nothing the job reads is overwritten, and a place that cannot be
    // written is found before the job is generated, not after.
    let mut reads = config.files_read();
    reads.push(ReadFile::new(&model.path, "the model"));
    if let Location::Local(path) = &input {
        reads.push(ReadFile::new(path, "the input"));
    }
    outputs.check(&reads)?;
    let mut store = open_store(config)?;
    let job = match submit_job(store.as_mut(), config, &args.submit, None) {
        Ok(submitted) => {
            eprintln!(
                "job {} submitted with {}",
                submitted.job,
                output::requests(submitted.items)
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
                    args.submit.file
                );
                if matches!(
                    state,
                    JobState::Cancelled | JobState::Failed | JobState::Expired
                ) {
                    store.resume(*existing)?;
                }
                *existing
            }
            _ => return Err(e),
        },
    };
    let deliveries = start_deliveries(config)?;
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
        let report = work_one_model(config, store.as_mut(), &model, scope, &stop, |store| {
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
        // With --force the same command would submit yet another job.
        let to_continue = if args.submit.force {
            format!(
                "`cortex worker --jobs {job}` continues it, then `cortex results {job} -o {}` writes its results (`cortex cancel {job}` drops it)",
                outputs.results
            )
        } else {
            "run the same command again to continue".to_owned()
        };
        let message = format!(
            "stopped before job {job} finished ({} of {} done); {to_continue}",
            status.job.counts.finished(),
            status.job.counts.total
        );
        if stop.raised() {
            return Err(Interrupted(message).into());
        }
        bail!(message);
    }
    let exported = export_job(
        store.as_mut(),
        job,
        &outputs.results,
        &outputs.errors,
        false,
        keep.as_ref(),
    )
    .with_context(|| {
        format!(
            "job {job} is done, but its results could not be written; `cortex results {job} -o FILE` writes them elsewhere (as does this command with another -o), without generating anything again"
        )
    })?;
    output::run_summary(&status.job, &exported, started.elapsed(), generated)?;
    finish_deliveries(deliveries);
    items_failed(&status.job.counts)
}

/// The distinct exit of a job that ended with items not completed, so a
/// pipeline (`make`, `&&`) can tell it from success: 6 when some completed,
/// 7 when none did.
fn items_failed(counts: &cortex_queue::JobCounts) -> anyhow::Result<()> {
    let not_completed = counts.total - counts.completed;
    if not_completed == 0 {
        return Ok(());
    }
    let exit = if counts.completed == 0 {
        super::Exit::NothingCompleted
    } else {
        super::Exit::SomeFailed
    };
    Err(super::Unfinished {
        exit,
        message: format!(
            "{not_completed} of {} requests did not complete (the error file says why)",
            counts.total
        ),
    }
    .into())
}
