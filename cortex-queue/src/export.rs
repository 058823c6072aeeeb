//! OpenAI batch output: result bodies, and writing a job's output and error
//! files so that a crash or a full disk never leaves a half-written file under
//! the final name.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use cortex_request::Response;
use serde_json::json;

use crate::input::Endpoint;
use crate::jobs::{JobCounts, load_job};
use crate::store::{Outcome, Store};
use crate::{ItemId, JobId, QueueError, Result};

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

/// The `body` of an output line: a `chat.completion` or `text_completion` object.
pub(crate) fn response_body(
    item: ItemId,
    endpoint: Endpoint,
    model: &str,
    created: i64,
    response: &Response,
) -> String {
    let choices: Vec<serde_json::Value> = response
        .completions
        .iter()
        .map(|c| match endpoint {
            Endpoint::ChatCompletions => json!({
                "index": c.index,
                "message": { "role": "assistant", "content": c.text },
                "logprobs": null,
                "finish_reason": c.finish_reason.as_openai(),
            }),
            Endpoint::Completions => json!({
                "index": c.index,
                "text": c.text,
                "logprobs": null,
                "finish_reason": c.finish_reason.as_openai(),
            }),
        })
        .collect();
    let (id, object) = match endpoint {
        Endpoint::ChatCompletions => (format!("chatcmpl-{item}"), "chat.completion"),
        Endpoint::Completions => (format!("cmpl-{item}"), "text_completion"),
    };
    let usage = &response.usage;
    json!({
        "id": id,
        "object": object,
        "created": created,
        "model": model,
        "choices": choices,
        "usage": {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.total_tokens(),
            "prompt_tokens_details": { "cached_tokens": usage.cached_prompt_tokens },
        },
    })
    .to_string()
}

/// Writes `path` through a temporary file beside it: written, flushed,
/// fsynced, renamed over `path`, and the directory fsynced. On any error the
/// temporary file is removed and `path` is untouched.
fn write_atomically(
    path: &Path,
    fill: impl FnOnce(&mut BufWriter<File>) -> Result<u64, Outcome>,
) -> Result<u64, Outcome> {
    let io_error = |source: std::io::Error| {
        Outcome::Queue(QueueError::Io {
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

impl Store {
    /// Writes the job's results as OpenAI batch output lines, in input order,
    /// to `output`, and (if given) its failed, cancelled and invalid requests
    /// to `errors`. Refuses while the job is still running unless `partial`.
    pub fn export(
        &mut self,
        id: JobId,
        output: &Path,
        errors: Option<&Path>,
        partial: bool,
    ) -> Result<ExportSummary> {
        let io = |e: std::io::Error, path: &Path| {
            Outcome::Queue(QueueError::Io {
                path: path.to_path_buf(),
                source: e,
            })
        };
        // The state check and the lines written come from one snapshot.
        self.read(|tx| {
            let job = load_job(tx, id)?;
            if !partial && !job.state.is_terminal() {
                let c = &job.counts;
                return Err(Outcome::Queue(QueueError::WrongState {
                    job: id,
                    state: job.state,
                    hint: format!(
                        "{} of {} requests are done; wait for it to finish, or export the partial results",
                        c.finished(),
                        c.total
                    ),
                }));
            }
            let results = write_atomically(output, |w| {
                let mut rows = tx.prepare_cached(
                    "SELECT i.line, i.custom_id, r.body FROM items i JOIN results r ON r.item_id = i.id
                     WHERE i.job_id = ?1 AND i.state = 'completed' ORDER BY i.line",
                )?;
                let mut rows = rows.query([id.0])?;
                let mut count = 0;
                while let Some(row) = rows.next()? {
                    let (line, custom_id, body): (i64, String, String) = (row.get(0)?, row.get(1)?, row.get(2)?);
                    let request_id = format!("batch_req_{id}_{line}");
                    writeln!(
                        w,
                        r#"{{"id":{},"custom_id":{},"response":{{"status_code":200,"request_id":{},"body":{body}}},"error":null}}"#,
                        json!(request_id),
                        json!(custom_id),
                        json!(request_id),
                    )
                    .map_err(|e| io(e, output))?;
                    count += 1;
                }
                Ok(count)
            })?;
            let errors_written = match errors {
                None => 0,
                Some(path) => write_atomically(path, |w| {
                    let mut rows = tx.prepare_cached(
                        "SELECT line, custom_id, code, message FROM (
                             SELECT line, custom_id, coalesce(error_code, state) AS code,
                                    coalesce(error_message, 'cancelled before it ran to completion') AS message
                             FROM items WHERE job_id = ?1 AND state IN ('failed', 'cancelled')
                             UNION ALL
                             SELECT line, coalesce(custom_id, CAST(line AS TEXT)), 'invalid_input', message
                             FROM input_errors WHERE job_id = ?1)
                         ORDER BY line",
                    )?;
                    let mut rows = rows.query([id.0])?;
                    let mut count = 0;
                    while let Some(row) = rows.next()? {
                        let (line, custom_id, code, message): (i64, String, String, String) =
                            (row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?);
                        writeln!(
                            w,
                            r#"{{"id":{},"custom_id":{},"response":null,"error":{{"code":{},"message":{},"line":{line}}}}}"#,
                            json!(format!("batch_req_{id}_{line}")),
                            json!(custom_id),
                            json!(code),
                            json!(message),
                        )
                        .map_err(|e| io(e, path))?;
                        count += 1;
                    }
                    Ok(count)
                })?,
            };
            Ok(ExportSummary {
                output: output.to_path_buf(),
                results,
                errors_file: errors.map(Path::to_path_buf),
                errors: errors_written,
                counts: job.counts,
            })
        })
    }
}
