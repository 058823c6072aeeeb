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
//! - [`SubmitJsonl`] (for any [`cortex_queue::JobStore`], such as the SQLite driver's `Store`): submit a JSONL file.
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
//! use cortex_openai::parse_line;
//! use cortex_queue::JobDefaults;
//!
//! // A plain line and an OpenAI batch line: what each asks for, typed.
//! let plain = parse_line(1, r#"{"prompt": "Once upon a time", "max_tokens": 8}"#, &JobDefaults::default())?;
//! assert_eq!(plain.request.as_generate().unwrap().stop.max_tokens, 8);
//! let batch = r#"{"custom_id": "q1", "method": "POST", "url": "/v1/chat/completions",
//!                 "body": {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}}"#;
//! let item = parse_line(2, batch, &JobDefaults::default())?;
//! assert_eq!((item.custom_id.as_str(), item.endpoint.as_str()), ("q1", "/v1/chat/completions"));
//!
//! // What cortex does not do is refused, naming the line and the field.
//! let error = parse_line(3, r#"{"prompt": "Hi", "stream": true}"#, &JobDefaults::default())
//!     .unwrap_err()
//!     .to_string();
//! assert!(error.contains("line 3: stream = true is an OpenAI field cortex does not support"), "{error}");
//! # Ok::<(), cortex_queue::LineError>(())
//! ```
//!
//! [`SubmitJsonl`] submits a whole file that way to any queue, and
//! [`ExportJsonl`] writes a job's results as OpenAI's batch output.
//!
//! # Design notes
//!
//! The wire format. `input.rs`: `parse_line` and `InputReader` read OpenAI
//! batch lines (`/v1/chat/completions`, `/v1/completions`, `/v1/responses`,
//! `/v1/embeddings` — `input/embedding.rs`) and plain lines into
//! `cortex_queue::NewItem`s (typed `Work`, and the output format as an opaque
//! tag: the endpoint path, plus `?encoding_format=base64` for base64 embeddings) or `LineError`s naming line and field; `input/prompt.rs`
//! turns `messages`, `prompt` and responses' `input` + `instructions` into a
//! `Prompt`, `input/format.rs` the output constraints into a grammar;
//! log probabilities (chat's `logprobs`/`top_logprobs`, completions'
//! `logprobs: N`) become `Request::logprobs`; the engine fills
//! `Completion::logprobs` from the logits the sampler chose from (after bias
//! and penalties, before temperature; `cortex_sample::logprobs`), and
//! `output.rs` renders them in each endpoint's shape. `response_format`
//! (`json_object`, `json_schema`) and the `grammar` extension are compiled and
//! checked with `cortex-grammar` into `Request::grammar` at parse time; the
//! engine makes one llama.cpp grammar sampler per completion from it
//! (`Executor::grammar`) and advances it past every token taken.
//! `input/tools.rs`: chat `tools` become `Request::tools` (the definitions as
//! JSON for the template, the choice); `tool_choice` `required` or a named
//! function also compiles a grammar of one `{"name", "arguments"}` call whose
//! arguments match the function's `parameters`, so a forced call is always
//! valid; `output.rs` renders `Completion::tool_calls` as `message.tool_calls`
//! (`finish_reason: "tool_calls"`). `fields.rs` classifies
//! OpenAI's documented fields cortex does not implement:
//! accepted when they change nothing (`user`, `store`, `metadata`,
//! `stream: false`, ...), refused with the reason otherwise. `output.rs`:
//! `response_body` (`chat.completion` / `text_completion` / `response`) and `BatchOutput`,
//! the `ExportFormat` that writes OpenAI's output and error lines. `jsonl.rs`:
//! `SubmitJsonl` (hash the file while parsing it, `Store::submit_items`) and
//! `ExportJsonl` (`Store::export_with(.., &BatchOutput)`) as extension traits of
//! `Store`.

#![forbid(unsafe_code)]

mod batch;
mod endpoint;
mod fields;
mod input;
mod jsonl;
mod online;
mod output;
mod tokenizer;

pub use batch::{
    BatchFiles, BatchRequest, FileInfo, batch_id, batch_object, failed_batch_object,
    file_deleted_object, file_object, list_object, webhook_event, webhook_event_id,
};
pub use endpoint::Endpoint;
pub use input::{InputReader, line_seed_of, parse_line};
pub use jsonl::{ExportJsonl, NamedModel, SubmitJsonl, check_batch, named_model, named_models};
pub use online::{
    BodyError, ChunkHead, OnlineRequest, ResponseEvents, StreamOptions, error_body, model_object,
    online_body, parse_request, parse_request_with, response_deleted_object,
};
pub use output::{BatchOutput, answer_preview, response_body};
pub use tokenizer::{
    DetokenizeCall, TokenizeCall, detokenize_body, parse_detokenize, parse_tokenize, tokenize_body,
    tokenizer_info_body,
};

/// An OpenAPI 3.1 description of OpenAI's routes as cortex serves them:
/// request and response schemas, and the error shape of each refusal.
pub fn openapi_document() -> serde_json::Value {
    serde_json::from_str(include_str!("openapi.json")).expect("openapi.json is JSON")
}
