//! JSONL files in and out of a store: submit a file (parsed here, stored as
//! typed items there) and export a job as OpenAI batch output.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

use cortex_queue::{
    ExportSummary, InputReport, ItemSource, JobId, JobStore, LineError, LineResult, NewItem,
    QueueError, SubmitOptions, Submitted,
};
use sha2::{Digest, Sha256};

use crate::input::LineForm;
use crate::{BatchOutput, BatchRequest, InputReader};

/// Hashes everything read through it, so the file is read once.
struct HashingReader<R> {
    inner: R,
    hasher: Sha256,
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

/// A JSONL stream as an [`ItemSource`]: parsed lines, then the stream's hash.
/// With `batch`, a batch line naming another endpoint than the batch's is an
/// error (a plain line names none).
struct JsonlSource<'b, R: Read> {
    lines: InputReader<BufReader<HashingReader<R>>>,
    batch: Option<&'b BatchRequest>,
    /// Why chat lines are refused (the model renders no chats).
    chats_refused: Option<String>,
}

impl<'b, R: Read> JsonlSource<'b, R> {
    fn new(reader: R, options: &SubmitOptions, batch: Option<&'b BatchRequest>) -> Self {
        let hashing = HashingReader {
            inner: reader,
            hasher: Sha256::new(),
        };
        Self {
            lines: InputReader::new(
                BufReader::with_capacity(1 << 18, hashing),
                options.defaults.clone(),
            ),
            batch,
            chats_refused: options.chats_refused.clone(),
        }
    }

    /// The line's item, unless its batch or its model cannot take it.
    fn check(&self, item: NewItem) -> LineResult {
        let refuse = |item: NewItem, message: String| {
            Err(LineError {
                line: item.line,
                custom_id: Some(item.custom_id),
                message,
            })
        };
        // A plain line names no endpoint: its format follows from it, as in
        // `cortex submit`, whatever the batch's.
        if let Some(batch) = self.batch
            && self.lines.last_form() == Some(LineForm::Batch)
            && let Err(message) = batch.check_line_endpoint(&item.endpoint)
        {
            return refuse(item, message);
        }
        if let Some(reason) = &self.chats_refused
            && item
                .request
                .as_generate()
                .is_some_and(|r| matches!(r.prompt, cortex_request::Prompt::Chat(_)))
        {
            let message = format!("a chat (messages), but {reason}");
            return refuse(item, message);
        }
        Ok(item)
    }
}

impl<R: Read> Iterator for JsonlSource<'_, R> {
    type Item = std::io::Result<LineResult>;

    fn next(&mut self) -> Option<Self::Item> {
        let next = self.lines.next()?;
        Some(next.map(|line| line.and_then(|item| self.check(item))))
    }
}

impl<R: Read> ItemSource for JsonlSource<'_, R> {
    fn source_sha256(&mut self) -> String {
        let hasher = &self.lines.get_ref().get_ref().hasher;
        hasher
            .clone()
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

/// Submitting JSONL input to a queue (any [`JobStore`]).
pub trait SubmitJsonl {
    /// Submits the JSONL file at `path` as one job (see [`SubmitJsonl::submit_reader`]).
    fn submit_file(
        &mut self,
        path: &Path,
        options: &SubmitOptions,
    ) -> Result<Submitted, QueueError>;

    /// Reads a JSONL stream line by line (OpenAI batch lines or plain lines,
    /// see [`crate::parse_line`]; fields a line does not set come from
    /// `options.defaults`) and submits it as one job with
    /// [`JobStore::submit_items`]: all of it, or, with bad lines, nothing and a
    /// report of every one (unless `options.skip_invalid`).
    fn submit_reader(
        &mut self,
        reader: impl Read,
        source_name: &str,
        options: &SubmitOptions,
    ) -> Result<Submitted, QueueError>;

    /// Submits an OpenAI Batch API input file as [`SubmitJsonl::submit_reader`]
    /// does, with `batch` recorded in the job's metadata (beside
    /// `options.metadata`) and every line required to name its endpoint.
    fn submit_batch(
        &mut self,
        reader: impl Read,
        source_name: &str,
        options: &SubmitOptions,
        batch: &BatchRequest,
    ) -> Result<Submitted, QueueError>;
}

impl<S: JobStore + ?Sized> SubmitJsonl for S {
    fn submit_file(
        &mut self,
        path: &Path,
        options: &SubmitOptions,
    ) -> Result<Submitted, QueueError> {
        let file = std::fs::File::open(path).map_err(|source| QueueError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let name = path.display().to_string();
        self.submit_reader(file, &name, options)
            .map_err(|e| match e {
                QueueError::Io { source, .. } => QueueError::Io {
                    path: path.to_path_buf(),
                    source,
                },
                other => other,
            })
    }

    fn submit_reader(
        &mut self,
        reader: impl Read,
        source_name: &str,
        options: &SubmitOptions,
    ) -> Result<Submitted, QueueError> {
        let mut source = JsonlSource::new(reader, options, None);
        self.submit_items(&mut source, source_name, options)
    }

    fn submit_batch(
        &mut self,
        reader: impl Read,
        source_name: &str,
        options: &SubmitOptions,
        batch: &BatchRequest,
    ) -> Result<Submitted, QueueError> {
        let mut source = JsonlSource::new(reader, options, Some(batch));
        let mut options = options.clone();
        options.metadata.extend(batch.job_metadata());
        options.completion_window = Some(batch.window());
        self.submit_items(&mut source, source_name, &options)
    }
}

/// Checks an OpenAI Batch API input as [`SubmitJsonl::submit_batch`]
/// would (every line, its endpoint, `custom_id`s unique), storing nothing:
/// the lines read, or the same [`QueueError::InvalidInput`] report. A
/// server runs it before it takes its store, so a bad file costs the
/// queue nothing and a good one is only stored there.
pub fn check_batch(
    reader: impl Read,
    source_name: &str,
    options: &SubmitOptions,
    batch: &BatchRequest,
) -> Result<u64, QueueError> {
    let source = JsonlSource::new(reader, options, Some(batch));
    let mut first_lines: HashMap<String, u64> = HashMap::new();
    let mut errors = Vec::new();
    let mut lines = 0;
    for next in source {
        let parsed = next.map_err(|source| QueueError::Io {
            path: source_name.into(),
            source,
        })?;
        lines += 1;
        match parsed {
            Ok(item) => match first_lines.entry(item.custom_id) {
                Entry::Vacant(slot) => {
                    slot.insert(item.line);
                }
                Entry::Occupied(first) => errors.push(LineError::duplicate_custom_id(
                    item.line,
                    first.key(),
                    Some(*first.get()),
                )),
            },
            Err(error) => errors.push(error),
        }
    }
    if errors.is_empty() && !first_lines.is_empty() {
        return Ok(lines);
    }
    Err(QueueError::InvalidInput(InputReport {
        source_name: source_name.to_owned(),
        lines,
        errors,
    }))
}

/// Exporting a job as OpenAI batch output.
pub trait ExportJsonl {
    /// Writes the job's results as OpenAI batch output lines, in input
    /// order, to `output`, and (if given) its failed, cancelled and invalid
    /// requests to `errors`, each file atomically. Refuses while the job is
    /// still running unless `partial`.
    fn export(
        &mut self,
        job: JobId,
        output: &Path,
        errors: Option<&Path>,
        partial: bool,
    ) -> Result<ExportSummary, QueueError>;
}

impl<S: JobStore + ?Sized> ExportJsonl for S {
    fn export(
        &mut self,
        job: JobId,
        output: &Path,
        errors: Option<&Path>,
        partial: bool,
    ) -> Result<ExportSummary, QueueError> {
        self.export_with(job, output, errors, partial, &BatchOutput)
    }
}

#[cfg(test)]
mod tests {
    use cortex_queue::{QueueError, SubmitOptions};

    use super::check_batch;
    use crate::BatchRequest;

    #[test]
    fn a_batch_takes_plain_lines_and_refuses_batch_lines_for_another_endpoint() {
        let batch = BatchRequest::parse(
            br#"{"input_file_id": "file-1", "endpoint": "/v1/chat/completions", "completion_window": "24h"}"#,
        )
        .unwrap();
        let options = SubmitOptions::new("m");
        let plain = concat!(
            r#"{"custom_id": "a", "prompt": "Once upon a time"}"#,
            "\n",
            r#"{"custom_id": "b", "messages": [{"role": "user", "content": "Hi"}]}"#,
            "\n",
            r#"{"custom_id": "c", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": "Hi"}]}}"#,
            "\n",
        );
        assert_eq!(
            check_batch(plain.as_bytes(), "in.jsonl", &options, &batch).unwrap(),
            3
        );
        let other = concat!(
            r#"{"custom_id": "a", "prompt": "Once upon a time"}"#,
            "\n",
            r#"{"custom_id": "d", "method": "POST", "url": "/v1/completions", "body": {"prompt": "Hi"}}"#,
            "\n",
        );
        let Err(QueueError::InvalidInput(report)) =
            check_batch(other.as_bytes(), "in.jsonl", &options, &batch)
        else {
            panic!("a batch line for another endpoint is refused");
        };
        assert_eq!(report.errors.len(), 1);
        assert_eq!(report.errors[0].line, 2);
        assert!(
            report.errors[0]
                .message
                .contains("differs from the batch's endpoint")
        );
    }
}

/// The model a file's lines name (`body.model`, or `model` on a plain
/// line), with the first line that names it: one model per file, as
/// OpenAI's Batch API requires (`m` and `m:latest` are one); `None` when
/// no line names one. Lines that do not parse are left to the submit's own
/// checks.
pub fn named_model(reader: impl BufRead) -> Result<Option<NamedModel>, String> {
    let mut named = named_models(reader)?.into_iter();
    let first = named.next();
    if let (Some(first), Some(second)) = (&first, named.next()) {
        return Err(format!(
            "line {} names the model {}, line {} names {}: a batch file names one model, as OpenAI requires",
            second.line, second.name, first.line, first.name
        ));
    }
    Ok(first)
}

/// Every model a file's lines name, each with the first line naming it,
/// in that order (`m` and `m:latest` are one).
pub fn named_models(reader: impl BufRead) -> Result<Vec<NamedModel>, String> {
    let mut named: Vec<NamedModel> = Vec::new();
    for (index, line) in reader.split(b'\n').enumerate() {
        let line = line.map_err(|e| e.to_string())?;
        let Ok(value) = serde_json::from_slice::<serde_json::Value>(&line) else {
            continue;
        };
        let model = value
            .pointer("/body/model")
            .or_else(|| value.get("model"))
            .and_then(serde_json::Value::as_str);
        let Some(model) = model.filter(|m| !m.is_empty()) else {
            continue;
        };
        if !named.iter().any(|n| model_key(&n.name) == model_key(model)) {
            named.push(NamedModel {
                name: model.to_owned(),
                line: index as u64 + 1,
            });
        }
    }
    Ok(named)
}

/// A model a file's lines name, and the first line that does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedModel {
    /// The name as the line gives it.
    pub name: String,
    /// The first line naming it (1-based).
    pub line: u64,
}

/// `m` and `m:latest` are one model, whatever the case.
fn model_key(name: &str) -> String {
    let name = name.to_ascii_lowercase();
    if name.contains(':') {
        name
    } else {
        format!("{name}:latest")
    }
}
