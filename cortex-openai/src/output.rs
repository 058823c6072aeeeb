//! OpenAI batch output: result bodies (`chat.completion`,
//! `text_completion`), output lines and error lines.

use cortex_queue::{ExportFormat, ExportedError, ExportedResult, ItemId, Job, StoredResult};
use cortex_request::Response;
use serde_json::{Value, json};

use crate::Endpoint;

/// The `body` of an output line: a `chat.completion` or `text_completion`
/// object for the item `item` of a job run on `model`, created at `created`
/// (Unix seconds).
pub fn response_body(
    item: ItemId,
    endpoint: Endpoint,
    model: &str,
    created: i64,
    response: &Response,
) -> Value {
    let choices: Vec<Value> = response
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
}

/// OpenAI's batch output format: one `{"id", "custom_id", "response":
/// {"status_code", "request_id", "body"}, "error": null}` line per result,
/// one `{"id", "custom_id", "response": null, "error": {"code", "message",
/// "line"}}` line per request without one.
#[derive(Debug, Clone, Copy, Default)]
pub struct BatchOutput;

impl ExportFormat for BatchOutput {
    fn result_line(&self, job: &Job, result: &ExportedResult) -> String {
        let request_id = format!("batch_req_{}_{}", job.id, result.line);
        let body = match &result.result {
            StoredResult::Response(response) => {
                let endpoint =
                    Endpoint::from_url(&result.endpoint).unwrap_or(Endpoint::Completions);
                response_body(
                    result.item,
                    endpoint,
                    &job.model,
                    result.completed_at / 1000,
                    response,
                )
            }
            StoredResult::Rendered(body) => {
                serde_json::from_str(body).unwrap_or_else(|_| Value::String(body.clone()))
            }
        };
        // Written out so the members come in OpenAI's order.
        format!(
            r#"{{"id":{id},"custom_id":{custom_id},"response":{{"status_code":200,"request_id":{id},"body":{body}}},"error":null}}"#,
            id = json!(request_id),
            custom_id = json!(result.custom_id),
        )
    }

    fn error_line(&self, job: &Job, error: &ExportedError) -> String {
        format!(
            r#"{{"id":{},"custom_id":{},"response":null,"error":{{"code":{},"message":{},"line":{}}}}}"#,
            json!(format!("batch_req_{}_{}", job.id, error.line)),
            json!(error.custom_id),
            json!(error.code),
            json!(error.message),
            error.line,
        )
    }
}
