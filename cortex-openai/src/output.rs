//! OpenAI batch output: result bodies (`chat.completion`,
//! `text_completion`, `response`, a `list` of embeddings), output lines and
//! error lines.

use cortex_queue::{ExportFormat, ExportedError, ExportedResult, ItemId, Job, StoredResult};
use cortex_request::{Completion, PromptToken, Response, TokenLogprob, TopLogprob};
use serde_json::{Value, json};

use base64::Engine as _;

use crate::Endpoint;
use crate::endpoint::parse_output_tag;

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
    body_of(&item.to_string(), endpoint, model, created, response, false)
}

/// A result body whose ids (`chatcmpl-KEY`, `resp_KEY`, ...) are made from
/// `key`; embeddings as base64 when `base64`.
pub(crate) fn body_of(
    key: &str,
    endpoint: Endpoint,
    model: &str,
    created: i64,
    response: &Response,
    base64: bool,
) -> Value {
    match endpoint {
        Endpoint::Responses => return response_object(key, model, created, response),
        Endpoint::Embeddings => return embedding_list(model, response, base64),
        _ => {}
    }
    let choices: Vec<Value> = response
        .completions
        .iter()
        .map(|c| match endpoint {
            Endpoint::ChatCompletions => chat_choice(key, c),
            Endpoint::Completions => json!({
                "index": c.index,
                "text": completion_text(c),
                "logprobs": completion_logprobs(c),
                "finish_reason": c.finish_reason.as_openai(),
            }),
            _ => unreachable!("rendered above"),
        })
        .collect();
    let (id, object) = match endpoint {
        Endpoint::ChatCompletions => (format!("chatcmpl-{key}"), "chat.completion"),
        Endpoint::Completions => (format!("cmpl-{key}"), "text_completion"),
        _ => unreachable!("rendered above"),
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

/// One choice of a `chat.completion`: the assistant's message, with its
/// function calls as `tool_calls` (ids `call_ITEM_CHOICE_K`, content null
/// when there was no text around them, finish reason `tool_calls`).
fn chat_choice(key: &str, c: &Completion) -> Value {
    let mut message = json!({ "role": "assistant", "content": c.text, "refusal": null });
    if let Some(reasoning) = &c.reasoning {
        // As llama-server, vLLM and DeepSeek's API name the model's thinking.
        message["reasoning_content"] = json!(reasoning);
    }
    let mut finish_reason = c.finish_reason.as_openai();
    if !c.tool_calls.is_empty() {
        message["tool_calls"] = tool_calls(key, c, false);
        if c.text.is_empty() {
            message["content"] = Value::Null;
        }
        if finish_reason == "stop" {
            finish_reason = "tool_calls";
        }
    }
    json!({
        "index": c.index,
        "message": message,
        "logprobs": chat_logprobs(c),
        "finish_reason": finish_reason,
    })
}

/// The id of choice `index`'s `k`-th call in the answer `key`.
pub(crate) fn call_id(key: &str, index: u32, k: usize) -> String {
    format!("call_{key}_{index}_{k}")
}

/// A completion's function calls as OpenAI's `tool_calls` (ids
/// `call_KEY_CHOICE_K`); streamed deltas also carry each call's `index`.
pub(crate) fn tool_calls(key: &str, c: &Completion, indexed: bool) -> Value {
    c.tool_calls
        .iter()
        .enumerate()
        .map(|(k, call)| {
            let mut value = json!({
                "id": call_id(key, c.index, k),
                "type": "function",
                "function": { "name": call.name, "arguments": call.arguments },
            });
            if indexed {
                value["index"] = json!(k);
            }
            value
        })
        .collect()
}

/// A `/v1/responses` `response` object: one assistant message of one
/// `output_text`, `incomplete` (reason `max_output_tokens`) when generation
/// hit the token limit. Request parameters are not echoed back (the export
/// has the result, not the request): `temperature`, `top_p`, `instructions`
/// and `max_output_tokens` are null, as OpenAI's optional members allow.
pub(crate) fn response_object(key: &str, model: &str, created: i64, response: &Response) -> Value {
    let completion = response.completions.first();
    let incomplete =
        completion.is_some_and(|c| c.finish_reason == cortex_request::FinishReason::Length);
    let status = if incomplete {
        "incomplete"
    } else {
        "completed"
    };
    let usage = &response.usage;
    let mut output = Vec::new();
    if let Some(reasoning) = completion.and_then(|c| c.reasoning.as_deref()) {
        output.push(json!({
            "type": "reasoning",
            "id": format!("rs_{key}"),
            "summary": [],
            "content": [{"type": "reasoning_text", "text": reasoning}],
        }));
    }
    let calls = completion.map_or(&[][..], |c| c.tool_calls.as_slice());
    let text = completion.map_or("", |c| c.text.as_str());
    if !text.is_empty() || calls.is_empty() {
        output.push(json!({
            "type": "message",
            "id": format!("msg_{key}"),
            "status": status,
            "role": "assistant",
            "content": [{
                "type": "output_text",
                "text": text,
                "annotations": [],
                "logprobs": completion.and_then(logprob_entries).unwrap_or_default(),
            }],
        }));
    }
    for (k, call) in calls.iter().enumerate() {
        output.push(json!({
            "type": "function_call",
            "id": format!("fc_{key}_{k}"),
            "call_id": call_id(key, 0, k),
            "name": call.name,
            "arguments": call.arguments,
            "status": "completed",
        }));
    }
    json!({
        "id": format!("resp_{key}"),
        "object": "response",
        "created_at": created,
        "status": status,
        "error": null,
        "incomplete_details": if incomplete { json!({"reason": "max_output_tokens"}) } else { Value::Null },
        "instructions": null,
        "max_output_tokens": null,
        "model": model,
        "output": output,
        "parallel_tool_calls": true,
        "previous_response_id": null,
        "temperature": null,
        "tool_choice": "auto",
        "tools": [],
        "top_p": null,
        "truncation": "disabled",
        "usage": {
            "input_tokens": usage.prompt_tokens,
            "input_tokens_details": {
                "cached_tokens": usage.cached_prompt_tokens,
                "cache_write_tokens": 0,
            },
            "output_tokens": usage.completion_tokens,
            "output_tokens_details": { "reasoning_tokens": 0 },
            "total_tokens": usage.total_tokens(),
        },
        "metadata": {},
    })
}

/// A `/v1/embeddings` body: a `list` of `embedding` objects in input order,
/// each vector as numbers or (`base64`) the base64 of its little-endian
/// 32-bit floats, as OpenAI's clients decode it.
fn embedding_list(model: &str, response: &Response, base64: bool) -> Value {
    let data: Vec<Value> = response
        .embeddings
        .iter()
        .enumerate()
        .map(|(index, vector)| {
            let embedding = if base64 {
                let bytes: Vec<u8> = vector.iter().flat_map(|v| v.to_le_bytes()).collect();
                Value::String(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                json!(vector)
            };
            json!({ "object": "embedding", "index": index, "embedding": embedding })
        })
        .collect();
    let tokens = response.usage.prompt_tokens;
    json!({
        "object": "list",
        "data": data,
        "model": model,
        "usage": { "prompt_tokens": tokens, "total_tokens": tokens },
    })
}

fn token_text(entry: &TopLogprob) -> String {
    String::from_utf8_lossy(&entry.bytes).into_owned()
}

fn chat_entry(entry: &TopLogprob) -> Value {
    json!({ "token": token_text(entry), "logprob": entry.logprob, "bytes": entry.bytes })
}

/// Chat's `choices[].logprobs`: `{"content": [{token, logprob, bytes,
/// top_logprobs}], "refusal": null}`, or null when not asked for.
pub(crate) fn chat_logprobs(completion: &Completion) -> Value {
    completion
        .logprobs
        .as_deref()
        .map_or(Value::Null, chat_logprobs_of)
}

/// Chat's `logprobs` object for these tokens (a whole choice's, or a
/// streamed chunk's).
pub(crate) fn chat_logprobs_of(logprobs: &[TokenLogprob]) -> Value {
    json!({ "content": logprobs.iter().map(chat_logprob_entry).collect::<Vec<_>>(), "refusal": null })
}

fn chat_logprob_entry(TokenLogprob { chosen, top }: &TokenLogprob) -> Value {
    let mut entry = chat_entry(chosen);
    entry["top_logprobs"] = top.iter().map(chat_entry).collect();
    entry
}

/// Per generated token `{token, logprob, bytes, top_logprobs}` (chat's
/// `logprobs.content` and responses' `output_text.logprobs`).
fn logprob_entries(completion: &Completion) -> Option<Vec<Value>> {
    let logprobs = completion.logprobs.as_ref()?;
    Some(logprobs.iter().map(chat_logprob_entry).collect())
}

/// A completion's text, after its prompt when the prompt was echoed (the
/// prompt as its tokens spell it).
fn completion_text(completion: &Completion) -> String {
    match &completion.prompt_logprobs {
        Some(prompt) => {
            let bytes: Vec<u8> = prompt
                .iter()
                .flat_map(|t| t.bytes.iter().copied())
                .collect();
            String::from_utf8_lossy(&bytes).into_owned() + &completion.text
        }
        None => completion.text.clone(),
    }
}

/// Completions' `choices[].logprobs`: parallel arrays of tokens, their log
/// probabilities, the alternatives (token text to log probability) and each
/// token's character offset in the choice's text. An echoed prompt's tokens
/// come first, the first of them with null for its log probability and
/// alternatives (nothing precedes it).
fn completion_logprobs(completion: &Completion) -> Value {
    let Some(generated) = completion.logprobs.as_deref() else {
        return Value::Null;
    };
    let prompt = completion.prompt_logprobs.as_deref().unwrap_or_default();
    let rows = prompt
        .iter()
        .map(
            |PromptToken {
                 bytes,
                 logprob,
                 top,
                 ..
             }| LogprobRow {
                text: String::from_utf8_lossy(bytes).into_owned(),
                logprob: *logprob,
                top: logprob.is_some().then_some(top.as_slice()),
            },
        )
        .chain(generated.iter().map(LogprobRow::generated));
    logprob_arrays(rows, 0)
}

/// One token of completions' `logprobs` arrays.
struct LogprobRow<'a> {
    text: String,
    logprob: Option<f32>,
    top: Option<&'a [TopLogprob]>,
}

impl<'a> LogprobRow<'a> {
    fn generated(entry: &'a TokenLogprob) -> Self {
        Self {
            text: token_text(&entry.chosen),
            logprob: Some(entry.chosen.logprob),
            top: Some(&entry.top),
        }
    }
}

/// Completions' `logprobs` object for these tokens, the first at character
/// `offset` of the choice's text (a whole choice's, or a streamed chunk's).
pub(crate) fn completion_logprobs_of(logprobs: &[TokenLogprob], offset: usize) -> Value {
    logprob_arrays(logprobs.iter().map(LogprobRow::generated), offset)
}

fn logprob_arrays<'a>(rows: impl Iterator<Item = LogprobRow<'a>>, offset: usize) -> Value {
    let mut offset = offset;
    let (mut tokens, mut logprobs, mut tops, mut offsets) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for row in rows {
        offsets.push(offset);
        offset += row.text.chars().count();
        logprobs.push(json!(row.logprob));
        tops.push(row.top.map_or(Value::Null, |top| {
            top.iter()
                .map(|t| (token_text(t), json!(t.logprob)))
                .collect::<serde_json::Map<_, _>>()
                .into()
        }));
        tokens.push(row.text);
    }
    json!({
        "tokens": tokens,
        "token_logprobs": logprobs,
        "top_logprobs": tops,
        "text_offset": offsets,
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
                let (endpoint, base64) = parse_output_tag(&result.endpoint);
                body_of(
                    &result.item.to_string(),
                    endpoint.unwrap_or(Endpoint::Completions),
                    &job.model,
                    result.completed_at / 1000,
                    response,
                    base64,
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

#[cfg(test)]
mod tests {
    use cortex_request::{FinishReason, Timings, Usage};

    use super::*;

    fn response_with_logprobs() -> Response {
        let entry = |token, text: &str, logprob| TopLogprob {
            token,
            bytes: text.as_bytes().to_vec(),
            logprob,
        };
        Response {
            id: cortex_request::RequestId(1),
            completions: vec![Completion {
                index: 0,
                text: " Paris.".into(),
                tokens: vec![7, 8],
                finish_reason: FinishReason::Length,
                logprobs: Some(vec![
                    TokenLogprob {
                        chosen: entry(7, " Paris", -0.25),
                        top: vec![entry(7, " Paris", -0.25), entry(9, " Lyon", -2.5)],
                    },
                    TokenLogprob {
                        chosen: entry(8, ".", -0.5),
                        top: vec![entry(8, ".", -0.5), entry(10, ",", -1.0)],
                    },
                ]),
                prompt_logprobs: None,
                tool_calls: Vec::new(),
                reasoning: None,
            }],
            usage: Usage {
                prompt_tokens: 5,
                completion_tokens: 2,
                cached_prompt_tokens: 0,
            },
            timings: Timings::default(),
            embeddings: Vec::new(),
        }
    }

    #[test]
    fn chat_logprobs_have_openais_shape() {
        let body = response_body(
            ItemId(3),
            Endpoint::ChatCompletions,
            "m",
            0,
            &response_with_logprobs(),
        );
        let content = &body["choices"][0]["logprobs"]["content"];
        assert_eq!(content[0]["token"], " Paris");
        assert_eq!(content[0]["logprob"], -0.25);
        assert_eq!(content[0]["bytes"], json!(" Paris".as_bytes()));
        assert_eq!(content[0]["top_logprobs"][1]["token"], " Lyon");
        assert_eq!(content[1]["top_logprobs"][1]["logprob"], -1.0);
        assert_eq!(body["choices"][0]["logprobs"]["refusal"], Value::Null);
    }

    #[test]
    fn completion_logprobs_are_parallel_arrays() {
        let body = response_body(
            ItemId(3),
            Endpoint::Completions,
            "m",
            0,
            &response_with_logprobs(),
        );
        let logprobs = &body["choices"][0]["logprobs"];
        assert_eq!(logprobs["tokens"], json!([" Paris", "."]));
        assert_eq!(logprobs["token_logprobs"], json!([-0.25, -0.5]));
        assert_eq!(
            logprobs["top_logprobs"][0],
            json!({" Paris": -0.25, " Lyon": -2.5})
        );
        assert_eq!(logprobs["text_offset"], json!([0, 6]));
    }

    #[test]
    fn an_echoed_prompt_comes_first_in_the_text_and_the_arrays() {
        let mut response = response_with_logprobs();
        let token = |token, text: &str, logprob: Option<f32>| PromptToken {
            token,
            bytes: text.as_bytes().to_vec(),
            logprob,
            top: logprob
                .map(|l| TopLogprob {
                    token,
                    bytes: text.as_bytes().to_vec(),
                    logprob: l,
                })
                .into_iter()
                .collect(),
        };
        response.completions[0].prompt_logprobs =
            Some(vec![token(1, "", None), token(2, "Capital:", Some(-3.0))]);
        let body = response_body(ItemId(3), Endpoint::Completions, "m", 0, &response);
        let choice = &body["choices"][0];
        assert_eq!(choice["text"], "Capital: Paris.");
        let logprobs = &choice["logprobs"];
        assert_eq!(logprobs["tokens"], json!(["", "Capital:", " Paris", "."]));
        assert_eq!(logprobs["token_logprobs"], json!([null, -3.0, -0.25, -0.5]));
        assert_eq!(logprobs["top_logprobs"][0], Value::Null);
        assert_eq!(logprobs["top_logprobs"][1], json!({"Capital:": -3.0}));
        assert_eq!(logprobs["text_offset"], json!([0, 0, 8, 14]));
        // Echo without logprobs: the text only.
        response.completions[0].logprobs = None;
        let body = response_body(ItemId(3), Endpoint::Completions, "m", 0, &response);
        assert_eq!(body["choices"][0]["text"], "Capital: Paris.");
        assert_eq!(body["choices"][0]["logprobs"], Value::Null);
    }

    #[test]
    fn no_logprobs_asked_means_null() {
        let mut response = response_with_logprobs();
        response.completions[0].logprobs = None;
        let body = response_body(ItemId(3), Endpoint::ChatCompletions, "m", 0, &response);
        assert_eq!(body["choices"][0]["logprobs"], Value::Null);
    }
}

/// What an output line answered, as a person would glance at it: a chat's
/// message, else its tool calls as `name(arguments)`; a completion's text; a
/// response's output text and calls; an embedding's size. `None` for a line
/// that is not an output line.
pub fn answer_preview(line: &str) -> Option<String> {
    let value: Value = serde_json::from_str(line).ok()?;
    let body = value.pointer("/response/body")?;
    let call = |name: &Value, arguments: &Value| {
        format!(
            "{}({})",
            name.as_str().unwrap_or_default(),
            arguments.as_str().unwrap_or_default()
        )
    };
    let choice = &body["choices"][0];
    if let Some(text) = choice["message"]["content"]
        .as_str()
        .or(choice["text"].as_str())
        .filter(|text| !text.trim().is_empty())
    {
        return Some(text.to_owned());
    }
    if let Some(calls) = choice["message"]["tool_calls"].as_array() {
        let calls: Vec<String> = calls
            .iter()
            .map(|c| call(&c["function"]["name"], &c["function"]["arguments"]))
            .collect();
        return Some(calls.join(" "));
    }
    if let Some(output) = body["output"].as_array() {
        let parts: Vec<String> = output
            .iter()
            .flat_map(|item| match item["type"].as_str() {
                Some("message") => item["content"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|part| part["text"].as_str().map(str::to_owned))
                    .collect(),
                Some("function_call") => vec![call(&item["name"], &item["arguments"])],
                _ => Vec::new(),
            })
            .filter(|part| !part.trim().is_empty())
            .collect();
        return Some(parts.join(" "));
    }
    if let Some(embedding) = body["data"][0]["embedding"].as_array() {
        return Some(format!("(an embedding of {} numbers)", embedding.len()));
    }
    Some(String::new())
}

#[cfg(test)]
mod preview_tests {
    use super::answer_preview;

    #[test]
    fn every_kind_of_output_line_has_a_preview() {
        let line = |body: &str| format!(r#"{{"custom_id": "a", "response": {{"body": {body}}}}}"#);
        let cases = [
            (
                r#"{"choices": [{"message": {"content": "Paris."}}]}"#,
                "Paris.",
            ),
            (r#"{"choices": [{"text": " blue"}]}"#, " blue"),
            (
                r#"{"choices": [{"message": {"content": null, "tool_calls": [{"function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}}]}}]}"#,
                r#"get_weather({"city":"Oslo"})"#,
            ),
            (
                r#"{"output": [{"type": "message", "content": [{"type": "output_text", "text": "Hi there"}]}, {"type": "function_call", "name": "f", "arguments": "{}"}]}"#,
                "Hi there f({})",
            ),
            (
                r#"{"data": [{"embedding": [0.1, 0.2]}]}"#,
                "(an embedding of 2 numbers)",
            ),
        ];
        for (body, expected) in cases {
            assert_eq!(
                answer_preview(&line(body)).as_deref(),
                Some(expected),
                "{body}"
            );
        }
        assert_eq!(answer_preview("not json"), None);
    }
}
