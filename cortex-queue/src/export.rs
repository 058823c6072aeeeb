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

/// A file being written through a temporary file beside it, renamed over
/// it once whole: a reader never sees half a file, and a failure leaves the
/// file as it was.
struct AtomicFile {
    path: PathBuf,
    temp: PathBuf,
    writer: Option<BufWriter<File>>,
}

impl AtomicFile {
    /// Creates the temporary file; a place where no file can be made is
    /// refused here, before anything is written anywhere.
    fn create(path: &Path) -> Result<Self> {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "output".into());
        let temp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
        let refused = |source: std::io::Error| {
            let dir = path
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            QueueError::Export {
                path: path.to_path_buf(),
                detail: if path.is_dir() {
                    "it is a directory".into()
                } else {
                    format!("no file can be created in {} ({source})", dir.display())
                },
            }
        };
        if path.is_dir() {
            return Err(refused(std::io::Error::other("a directory")));
        }
        let file = File::create(&temp).map_err(refused)?;
        Ok(Self {
            path: path.to_path_buf(),
            writer: Some(BufWriter::with_capacity(1 << 16, file)),
            temp,
        })
    }

    fn io_error(&self, source: std::io::Error) -> QueueError {
        QueueError::Io {
            path: self.path.clone(),
            source,
        }
    }

    fn writer(&mut self) -> &mut BufWriter<File> {
        self.writer.as_mut().expect("written before it is finished")
    }

    /// Flushes and fsyncs the temporary file.
    fn flush(&mut self) -> Result<()> {
        let writer = self.writer.take().expect("flushed once");
        let file = writer
            .into_inner()
            .map_err(|e| self.io_error(e.into_error()))?;
        file.sync_all().map_err(|e| self.io_error(e))
    }

    /// Renames it over the file asked for, durably.
    fn commit(self) -> Result<()> {
        std::fs::rename(&self.temp, &self.path).map_err(|e| self.io_error(e))?;
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            // Makes the rename itself durable; not every platform can open a directory.
            if let Ok(dir) = File::open(dir) {
                let _ = dir.sync_all();
            }
        }
        Ok(())
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        // Not committed: the temporary file goes (after a commit it is gone).
        let _ = std::fs::remove_file(&self.temp);
    }
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
    let mut output_file = AtomicFile::create(output)?;
    let mut errors_file = errors.map(AtomicFile::create).transpose()?;
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
    file: &mut AtomicFile,
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
