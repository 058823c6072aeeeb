//! A job's output and error files, written so that a crash or a full disk
//! never leaves a half-written file under the final name. The lines' format
//! is the caller's ([`ExportFormat`]); the queue supplies what each says.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use cortex_request::Response;

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

/// Writes `path` through a temporary file beside it: written, flushed,
/// fsynced, renamed over `path`, and the directory fsynced. On any error the
/// temporary file is removed and `path` is untouched.
fn write_atomically<E: From<QueueError>>(
    path: &Path,
    fill: impl FnOnce(&mut BufWriter<File>) -> Result<u64, E>,
) -> Result<u64, E> {
    let io_error = |source: std::io::Error| {
        E::from(QueueError::Io {
            path: path.to_path_buf(),
            source,
        })
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "output".into());
    let temp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    let result = (|| {
        let file = File::create(&temp).map_err(io_error)?;
        let mut writer = BufWriter::with_capacity(1 << 16, file);
        let lines = fill(&mut writer)?;
        let file = writer.into_inner().map_err(|e| io_error(e.into_error()))?;
        file.sync_all().map_err(io_error)?;
        drop(file);
        std::fs::rename(&temp, path).map_err(io_error)?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            // Makes the rename itself durable; not every platform can open a directory.
            if let Ok(dir) = File::open(dir) {
                let _ = dir.sync_all();
            }
        }
        Ok(lines)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    result
}

/// Refuses to export a job that is still running, unless `partial`.
pub fn check_exportable(job: &Job, partial: bool) -> Result<()> {
    if partial || job.state.is_terminal() {
        return Ok(());
    }
    let c = &job.counts;
    Err(QueueError::wrong_state(
        job,
        format!(
            "{} of {} requests are done; wait for it to finish, or export the partial results",
            c.finished(),
            c.total
        ),
    ))
}

/// Where a backend hands the rows of one file of an export, in input order.
pub type RowSink<'a, T, E> = &'a mut dyn FnMut(T) -> Result<(), E>;

/// A job's export, the same on every backend: its results to `output` and
/// (if asked) its errors to `errors`, each line as `format` renders it, each
/// file written atomically, and what was written. The backend reads the
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
    let results = write_lines(
        output,
        |sink| results(reader, sink),
        |result| format.result_line(job, result),
    )?;
    let errors_written = match errors {
        None => 0,
        Some(path) => write_lines(
            path,
            |sink| error_rows(reader, sink),
            |error| format.error_line(job, error),
        )?,
    };
    Ok(ExportSummary {
        output: output.to_path_buf(),
        results,
        errors_file: errors.map(Path::to_path_buf),
        errors: errors_written,
        counts: job.counts,
    })
}

/// Writes `path` atomically, one line per row that `rows` hands over, as
/// `line` renders it; returns how many.
fn write_lines<T, E: From<QueueError>>(
    path: &Path,
    rows: impl FnOnce(RowSink<'_, T, E>) -> Result<(), E>,
    line: impl Fn(&T) -> String,
) -> Result<u64, E> {
    write_atomically(path, |w| {
        let mut count = 0;
        rows(&mut |row| {
            writeln!(w, "{}", line(&row)).map_err(|source| {
                E::from(QueueError::Io {
                    path: path.to_path_buf(),
                    source,
                })
            })?;
            count += 1;
            Ok(())
        })?;
        Ok(count)
    })
}
