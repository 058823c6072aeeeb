//! OpenAI's Files and Batches objects over cortex jobs: a batch is a job;
//! what OpenAI's batch carries beyond a job (endpoint, input file, completion
//! window) rides in the job's metadata under reserved keys, so jobs
//! submitted by the CLI are batches too and the other way round.

use std::collections::BTreeMap;

use cortex_queue::{CompletionWindow, Job, JobState, LineError, WebhookEvent};
use serde_json::{Value, json};

use crate::Endpoint;
use crate::endpoint::parse_output_tag;

/// Job metadata keys holding the batch's own fields.
const ENDPOINT_KEY: &str = "openai.endpoint";
const INPUT_FILE_KEY: &str = "openai.input_file_id";
const WINDOW_KEY: &str = "openai.completion_window";

/// A stored file, as `/v1/files` lists it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FileInfo {
    /// `file-...`.
    pub id: String,
    /// Size in bytes.
    pub bytes: u64,
    /// Unix seconds.
    pub created_at: i64,
    /// The name it was uploaded with.
    pub filename: String,
    /// `batch` for inputs, `batch_output` for a batch's output and error files.
    pub purpose: String,
}

/// A `file` object.
pub fn file_object(file: &FileInfo) -> Value {
    json!({
        "id": file.id,
        "object": "file",
        "bytes": file.bytes,
        "created_at": file.created_at,
        "expires_at": null,
        "filename": file.filename,
        "purpose": file.purpose,
        "status": "processed",
        "status_details": null,
    })
}

/// The answer to a file's deletion.
pub fn file_deleted_object(id: &str) -> Value {
    json!({ "id": id, "object": "file", "deleted": true })
}

/// A `list` of objects with `first_id`, `last_id` and `has_more`.
pub fn list_object(data: Vec<Value>, has_more: bool) -> Value {
    let first = data.first().map(|d| d["id"].clone()).unwrap_or(Value::Null);
    let last = data.last().map(|d| d["id"].clone()).unwrap_or(Value::Null);
    let mut list =
        json!({ "object": "list", "first_id": first, "last_id": last, "has_more": has_more });
    list["data"] = Value::Array(data);
    list
}

/// What a `POST /v1/batches` asked for.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BatchRequest {
    /// The uploaded input file.
    pub input_file_id: String,
    /// The endpoint every line must name.
    pub endpoint: String,
    /// How long the batch has to finish (`24h`, or any duration such as
    /// `1h` or `90m`), as given; what has not finished by then ends
    /// `batch_expired` and the batch `expired`.
    pub completion_window: String,
    /// The caller's labels.
    pub metadata: BTreeMap<String, String>,
}

impl BatchRequest {
    /// Reads a `POST /v1/batches` body; errors name the field.
    pub fn parse(body: &[u8]) -> Result<Self, (String, Option<&'static str>)> {
        let value: Value = serde_json::from_slice(body)
            .map_err(|e| (format!("the body is not valid JSON: {e}"), None))?;
        let Value::Object(fields) = value else {
            return Err(("the body must be a JSON object".into(), None));
        };
        let mut request = BatchRequest::default();
        for (key, value) in &fields {
            let text = || {
                value
                    .as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| (format!("{key} = {value}: expected a string"), None))
            };
            match key.as_str() {
                "input_file_id" => request.input_file_id = text()?,
                "endpoint" => request.endpoint = text()?,
                "completion_window" => request.completion_window = text()?,
                "metadata" if value.is_null() => {}
                "metadata" => {
                    let Value::Object(labels) = value else {
                        return Err((
                            format!("metadata = {value}: expected an object of strings"),
                            Some("metadata"),
                        ));
                    };
                    for (k, v) in labels {
                        let Some(v) = v.as_str() else {
                            return Err((
                                format!("metadata.{k} = {v}: expected a string"),
                                Some("metadata"),
                            ));
                        };
                        request.metadata.insert(k.clone(), v.to_owned());
                    }
                }
                "output_expires_after" => {}
                _ => return Err((format!("unknown field {key:?}"), None)),
            }
        }
        for (field, value) in [
            ("input_file_id", &request.input_file_id),
            ("endpoint", &request.endpoint),
            ("completion_window", &request.completion_window),
        ] {
            if value.is_empty() {
                return Err((format!("missing {field}"), Some(field)));
            }
        }
        if Endpoint::from_url(&request.endpoint).is_none() {
            return Err((
                format!(
                    "endpoint {:?} is not supported; use /v1/chat/completions, /v1/completions, /v1/responses or /v1/embeddings",
                    request.endpoint
                ),
                Some("endpoint"),
            ));
        }
        CompletionWindow::parse(&request.completion_window)
            .map_err(|e| (e.to_string(), Some("completion_window")))?;
        Ok(request)
    }

    /// The window `completion_window` gives (checked by [`Self::parse`]).
    pub fn window(&self) -> CompletionWindow {
        CompletionWindow::parse(&self.completion_window).unwrap_or(CompletionWindow::DAY)
    }

    /// The job metadata that records this batch.
    pub fn job_metadata(&self) -> BTreeMap<String, String> {
        let mut metadata = self.metadata.clone();
        metadata.insert(ENDPOINT_KEY.into(), self.endpoint.clone());
        metadata.insert(INPUT_FILE_KEY.into(), self.input_file_id.clone());
        metadata.insert(WINDOW_KEY.into(), self.completion_window.clone());
        metadata
    }

    /// Checks that an input line (its output tag, see
    /// [`crate::endpoint::output_tag`]) names this batch's endpoint (OpenAI
    /// requires every line to use the batch's endpoint).
    pub(crate) fn check_line_endpoint(&self, output_tag: &str) -> Result<(), String> {
        let url: &str = match parse_output_tag(output_tag).0 {
            Some(endpoint) => endpoint.url(),
            None => output_tag,
        };
        if url == self.endpoint {
            Ok(())
        } else {
            Err(format!(
                "url {url:?} differs from the batch's endpoint {:?}",
                self.endpoint
            ))
        }
    }
}

/// The ids of a batch's output and error files, when they exist.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BatchFiles {
    /// Results.
    pub output_file_id: Option<String>,
    /// Failed, cancelled and invalid requests.
    pub error_file_id: Option<String>,
}

fn seconds(ms: Option<i64>) -> Value {
    ms.map_or(Value::Null, |ms| json!(ms / 1000))
}

/// A `batch` object for `job` (id `batch_ID`).
pub fn batch_object(job: &Job, files: &BatchFiles) -> Value {
    let times = &job.times;
    let metadata: BTreeMap<&String, &String> = job
        .metadata
        .iter()
        .filter(|(k, _)| ![ENDPOINT_KEY, INPUT_FILE_KEY, WINDOW_KEY].contains(&k.as_str()))
        .collect();
    let meta = |key: &str, default: &str| {
        job.metadata
            .get(key)
            .cloned()
            .unwrap_or_else(|| default.to_owned())
    };
    let counts = &job.counts;
    json!({
        "id": batch_id(job),
        "object": "batch",
        "endpoint": meta(ENDPOINT_KEY, ""),
        "errors": null,
        "input_file_id": meta(INPUT_FILE_KEY, ""),
        "completion_window": meta(WINDOW_KEY, "24h"),
        "status": job.state.as_str(),
        "output_file_id": files.output_file_id,
        "error_file_id": files.error_file_id,
        "created_at": times.created_at / 1000,
        "in_progress_at": seconds(times.in_progress_at),
        "expires_at": seconds(times.expires_at),
        "finalizing_at": seconds(times.finalizing_at),
        "completed_at": seconds(times.completed_at),
        "failed_at": seconds(times.failed_at),
        "expired_at": seconds(times.expired_at),
        "cancelling_at": seconds(times.cancelling_at),
        "cancelled_at": seconds(times.cancelled_at),
        "request_counts": {
            "total": counts.total,
            "completed": counts.completed,
            "failed": counts.failed + counts.cancelled,
        },
        "usage": {
            "input_tokens": job.prompt_tokens,
            "input_tokens_details": { "cached_tokens": 0 },
            "output_tokens": job.completion_tokens,
            "output_tokens_details": { "reasoning_tokens": 0 },
            "total_tokens": job.prompt_tokens + job.completion_tokens,
        },
        "metadata": metadata,
        "model": job.model,
    })
}

/// The batch id of a job.
pub fn batch_id(job: &Job) -> String {
    format!("batch_{}", job.id)
}

/// The body of a webhook event announcing a batch's end, as OpenAI sends
/// it: `{"object": "event", "id", "type", "created_at", "data": {"id"}}`.
pub fn webhook_event(event: &WebhookEvent) -> Value {
    json!({
        "object": "event",
        "id": webhook_event_id(event),
        "type": event.kind,
        "created_at": event.created_at / 1000,
        "data": { "id": format!("batch_{}", event.job) },
    })
}

/// An event's id, the same on every delivery attempt.
pub fn webhook_event_id(event: &WebhookEvent) -> String {
    format!("evt_{}", event.id)
}

/// A batch whose input file was refused: status `failed`, one entry per bad
/// line in `errors.data` (as OpenAI reports validation failures).
pub fn failed_batch_object(
    id: &str,
    request: &BatchRequest,
    created_at: i64,
    errors: &[LineError],
    message: &str,
) -> Value {
    let data: Vec<Value> = if errors.is_empty() {
        vec![json!({ "code": "invalid_input", "message": message, "param": null, "line": null })]
    } else {
        errors
            .iter()
            .map(|e| json!({ "code": "invalid_request", "message": e.message, "param": null, "line": e.line }))
            .collect()
    };
    json!({
        "id": id,
        "object": "batch",
        "endpoint": request.endpoint,
        "errors": { "object": "list", "data": data },
        "input_file_id": request.input_file_id,
        "completion_window": request.completion_window,
        "status": JobState::Failed.as_str(),
        "output_file_id": null,
        "error_file_id": null,
        "created_at": created_at,
        "in_progress_at": null,
        "expires_at": null,
        "finalizing_at": null,
        "completed_at": null,
        "failed_at": created_at,
        "expired_at": null,
        "cancelling_at": null,
        "cancelled_at": null,
        "request_counts": { "total": 0, "completed": 0, "failed": 0 },
        "metadata": request.metadata,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_requests_are_checked() {
        let ok = BatchRequest::parse(
            br#"{"input_file_id": "file-1", "endpoint": "/v1/chat/completions", "completion_window": "24h", "metadata": {"a": "b"}}"#,
        )
        .unwrap();
        assert_eq!(ok.job_metadata()["openai.input_file_id"], "file-1");
        assert!(ok.check_line_endpoint("/v1/completions").is_err());
        assert_eq!(ok.window(), CompletionWindow::DAY);
        let hour = BatchRequest::parse(
            br#"{"input_file_id": "file-1", "endpoint": "/v1/chat/completions", "completion_window": "1h"}"#,
        )
        .unwrap();
        assert_eq!(hour.window().duration().as_secs(), 3600);
        let (message, param) = BatchRequest::parse(
            br#"{"input_file_id": "file-1", "endpoint": "/v1/chat/completions", "completion_window": "soon"}"#,
        )
        .unwrap_err();
        assert_eq!(
            (message.as_str(), param),
            (
                "completion window \"soon\" is not a positive duration (like \"24h\", \"90m\" or \"1h30m\")",
                Some("completion_window")
            )
        );
    }
}
