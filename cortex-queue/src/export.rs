//! A job's output and error files, written so that a crash or a full disk
//! never leaves a half-written file under the final name (an
//! [`OutputFile`]: a device or a pipe is written into as it is). The lines' format
//! is the caller's ([`ExportFormat`]); the queue supplies what each says.

use std::io::Write;
use std::path::{Path, PathBuf};

use cortex_request::Response;

use crate::output_file::OutputFile;
use crate::{ItemId, Job, JobCounts, QueueError, Result};

/// What an export wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportSummary {
    /// The output file.
    pub output: PathBuf,
    /// Result lines written.
    pub results: u64,
    /// The error file, if one was asked for.
    pub errors_file: Option<PathBuf>,
    /// Error lines (failed, cancelled and invalid requests).
    pub errors: u64,
    /// The job's counts at export time.
    pub counts: JobCounts,
}

/// A result as stored.
#[derive(Debug, Clone, PartialEq)]
pub enum StoredResult {
    /// The response (token ids are not kept).
    Response(Response),
    /// A body rendered when it was written (databases from before schema
    /// version 4 kept OpenAI bodies); write it out as it is.
    Rendered(String),
}

/// One completed item, for its output line.
#[derive(Debug, Clone, PartialEq)]
pub struct ExportedResult {
    /// The item.
    pub item: ItemId,
    /// Its input line.
    pub line: u64,
    /// The caller's id.
    pub custom_id: String,
    /// The format its line named (an endpoint path).
    pub endpoint: String,
    /// When its result was written (Unix ms).
    pub completed_at: i64,
    /// The result.
    pub result: StoredResult,
}

/// One item without a result (failed, cancelled) or a bad input line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportedError {
    /// Its input line.
    pub line: u64,
    /// The caller's id (the line number when there was none).
    pub custom_id: String,
    /// A short code: the error's, `cancelled`, or `invalid_input`.
    pub code: String,
    /// What happened.
    pub message: String,
}

/// How output and error lines are written (the wire format's business).
pub trait ExportFormat {
    /// The output line of a completed item of `job` (without its newline).
    fn result_line(&self, job: &Job, result: &ExportedResult) -> String;
    /// The error-file line of an item of `job` that has no result.
    fn error_line(&self, job: &Job, error: &ExportedError) -> String;
}

/// Refuses to export a job that is still running, unless `partial`.
pub fn check_exportable(job: &Job, partial: bool) -> Result<()> {
    if partial || job.state.is_terminal() {
        return Ok(());
    }
    let c = &job.counts;
    Err(QueueError::wrong_state(
        job.id,
        job.state,
        format!(
            "{} of {} requests are done; wait for it to finish, or export the partial results",
            c.finished(),
            c.total
        ),
    ))
}

/// Where a driver hands the rows of one file of an export, in input order.
pub type RowSink<'a, T, E> = &'a mut dyn FnMut(T) -> Result<(), E>;

/// A job's export, the same on every driver: its results to `output` and
/// (if asked) its errors to `errors`, each line as `format` renders it, each
/// file written atomically, and what was written. The driver reads the
/// rows, from one snapshot, in `results` and `error_rows`: each hands its
/// rows in input order to the sink it is given, with `reader` (a
/// transaction, a cursor's connection) passed through to both.
pub fn export_files<R, E: From<QueueError>>(
    reader: &mut R,
    job: &Job,
    (output, errors): (&Path, Option<&Path>),
    format: &dyn ExportFormat,
    results: impl FnOnce(&mut R, RowSink<'_, ExportedResult, E>) -> Result<(), E>,
    error_rows: impl FnOnce(&mut R, RowSink<'_, ExportedError, E>) -> Result<(), E>,
) -> Result<ExportSummary, E> {
    // Both files or neither: each is made first, and both are renamed into
    // place only once both are whole.
    let mut output_file = OutputFile::create(output)?;
    let mut errors_file = errors.map(OutputFile::create).transpose()?;
    let results = write_lines(
        &mut output_file,
        |sink| results(reader, sink),
        |result| format.result_line(job, result),
    )?;
    let errors_written = match &mut errors_file {
        None => 0,
        Some(file) => write_lines(
            file,
            |sink| error_rows(reader, sink),
            |error| format.error_line(job, error),
        )?,
    };
    output_file.flush()?;
    if let Some(file) = &mut errors_file {
        file.flush()?;
    }
    if let Some(file) = errors_file {
        file.commit()?;
    }
    output_file.commit()?;
    Ok(ExportSummary {
        output: output.to_path_buf(),
        results,
        errors_file: errors.map(Path::to_path_buf),
        errors: errors_written,
        counts: job.counts,
    })
}

/// Writes one line per row that `rows` hands over into `file`, as `line`
/// renders it; returns how many.
fn write_lines<T, E: From<QueueError>>(
    file: &mut OutputFile,
    rows: impl FnOnce(RowSink<'_, T, E>) -> Result<(), E>,
    line: impl Fn(&T) -> String,
) -> Result<u64, E> {
    let mut count = 0;
    rows(&mut |row| {
        let written = writeln!(file.writer(), "{}", line(&row));
        written.map_err(|source| E::from(file.io_error(source)))?;
        count += 1;
        Ok(())
    })?;
    Ok(count)
}
