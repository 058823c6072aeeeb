//! OpenAI's wire format for cortex: what a batch line says, as typed
//! requests for the queue, and what a result becomes, as OpenAI's output and
//! error lines. The queue ([`cortex_queue`]) stores and returns data and
//! knows no JSON shapes; this crate is the one place that does.
//!
//! - [`parse_line`] / [`InputReader`]: OpenAI batch lines
//!   (`{"custom_id", "method", "url", "body"}`) and plain `{"prompt"...}` /
//!   `{"messages"...}` lines, every field checked, each error naming its line
//!   and field. OpenAI fields that change nothing here are accepted; those
//!   cortex does not implement are refused with the reason.
//! - [`SubmitJsonl`] (for any [`cortex_queue::JobStore`], such as `cortex_queue_sqlite::Store`): submit a JSONL file.
//! - [`BatchOutput`] and [`ExportJsonl`]: a job's results as OpenAI batch
//!   output, [`response_body`] for one result.
//! - [`parse_request`], [`online_body`], [`ChunkHead`], [`ResponseEvents`],
//!   [`error_body`]: a server's online requests, responses, streamed chunks
//!   and errors.
//! - [`BatchRequest`], [`batch_object`], [`file_object`]: the Batch and Files
//!   APIs over jobs (a batch is a job; [`SubmitJsonl::submit_batch`]).
//!
//! # Example
//!
//! ```
//! use cortex_openai::{ExportJsonl, SubmitJsonl};
//! use cortex_queue::{SubmitOptions, WorkerStore};
//! use cortex_queue_sqlite::Store;
//!
//! let dir = tempfile::tempdir()?;
//! let input = dir.path().join("prompts.jsonl");
//! std::fs::write(&input, "{\"prompt\": \"Once upon a time\", \"max_tokens\": 8}\n")?;
//! let mut store = Store::open(dir.path().join("cortex.db"))?;
//! let job = store.submit_file(&input, &SubmitOptions::new("m"))?.job;
//! let claimed = store.claim(1, &Default::default())?;
//! assert_eq!(claimed[0].request.as_generate().unwrap().stop.max_tokens, 8);
//!
//! let error = store
//!     .submit_reader("{\"prompt\": \"Hi\", \"stream\": true}\n".as_bytes(), "s.jsonl", &SubmitOptions::new("m"))
//!     .unwrap_err()
//!     .to_string();
//! assert!(error.contains("line 1: stream = true is an OpenAI field cortex does not support"), "{error}");
//! # let _ = job;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![forbid(unsafe_code)]

mod batch;
mod endpoint;
mod fields;
mod input;
mod jsonl;
mod online;
mod output;

pub use batch::{
    BatchFiles, BatchRequest, FileInfo, batch_id, batch_object, failed_batch_object,
    file_deleted_object, file_object, list_object,
};
pub use endpoint::Endpoint;
pub use input::{InputReader, parse_line};
pub use jsonl::{ExportJsonl, SubmitJsonl, check_batch};
pub use online::{
    BodyError, ChunkHead, OnlineRequest, ResponseEvents, StreamOptions, error_body, model_object,
    online_body, parse_request, parse_request_with,
};
pub use output::{BatchOutput, response_body};

/// An OpenAPI 3.1 description of OpenAI's routes as cortex serves them:
/// request and response schemas, and the error shape of each refusal.
pub fn openapi_document() -> serde_json::Value {
    serde_json::from_str(include_str!("openapi.json")).expect("openapi.json is JSON")
}
