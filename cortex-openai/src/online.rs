//! Online requests: the body of a server's `POST /v1/...` call read into
//! typed work (the same checks as a batch line, plus `stream` and
//! `stream_options`), the whole-response bodies, the streamed chunks and
//! events, and OpenAI's error object.

use cortex_queue::JobDefaults;
use cortex_request::{
    Completion, RequestId, Response, Timings, TokenLogprob, ToolCallDelta, Usage, Work,
};
use serde_json::{Value, json};

use crate::Endpoint;
use crate::endpoint::parse_output_tag;
use crate::input::{Fields, body_work};
use crate::output::{
    body_of, call_id, chat_logprobs_of, completion_logprobs_of, response_object, tool_calls,
};

/// An online request as read from its body.
#[derive(Debug, Clone, PartialEq)]
pub struct OnlineRequest {
    /// The endpoint it was sent to.
    pub endpoint: Endpoint,
    /// What it asks for.
    pub work: Work,
    /// The `model` it named.
    pub model: Option<String>,
    /// `stream: true`, with its options.
    pub stream: Option<StreamOptions>,
    /// Embeddings wanted as base64.
    pub base64: bool,
    /// A `/v1/responses` answer to keep for `GET /v1/responses/{id}`
    /// (OpenAI's `store`, true unless the body says false).
    pub store: bool,
}

/// How a streamed response ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StreamOptions {
    /// Send a last chunk with the usage (`stream_options.include_usage`).
    pub include_usage: bool,
}

/// Why a body was refused: the message, and the field it is about when one is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BodyError {
    /// What was wrong, naming the field and value.
    pub message: String,
    /// The field (OpenAI's `param`), when the message is about one.
    pub param: Option<String>,
}

/// Reads the body of an online request to `endpoint`: JSON, every field
/// checked as in a batch line, with `stream` (not for embeddings) and
/// `stream_options` taken.
///
/// ```
/// use cortex_openai::{Endpoint, parse_request};
///
/// let request = parse_request(Endpoint::ChatCompletions, br#"{"model": "m", "messages": [{"role": "user", "content": "Hi"}], "stream": true}"#).unwrap();
/// assert!(request.stream.is_some());
/// let error = parse_request(Endpoint::Completions, br#"{"prompt": "Hi", "top_p": 2}"#).unwrap_err();
/// assert_eq!((error.message.as_str(), error.param.as_deref()), ("top_p = 2 is out of range: expected a number in (0, 1]", Some("top_p")));
/// ```
pub fn parse_request(endpoint: Endpoint, body: &[u8]) -> Result<OnlineRequest, BodyError> {
    parse_request_with(endpoint, body, &mut |_| JobDefaults::default())
}

/// [`parse_request`] with defaults chosen by the model the body names
/// (`None` when it names none): a registered model's system prompt and
/// parameters, under whatever the body sets.
pub fn parse_request_with(
    endpoint: Endpoint,
    body: &[u8],
    defaults_for: &mut dyn FnMut(Option<&str>) -> JobDefaults,
) -> Result<OnlineRequest, BodyError> {
    let plain = |message: String| BodyError {
        message,
        param: None,
    };
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        plain(format!(
            "the body is not valid JSON: {}",
            e.to_string().replace(" at line 1 column ", " at column ")
        ))
    })?;
    let Value::Object(mut fields) = value else {
        return Err(plain("the body must be a JSON object".into()));
    };
    let stream = if endpoint == Endpoint::Embeddings {
        None
    } else {
        take_stream(&mut fields)?
    };
    let defaults = defaults_for(fields.get("model").and_then(Value::as_str));
    let (tag, work, model) =
        body_work(endpoint, &fields, &defaults).map_err(|message| BodyError {
            param: param_of(&message, &fields),
            message,
        })?;
    let echoed = work
        .as_generate()
        .is_some_and(|r| r.prompt_logprobs.is_some());
    if stream.is_some() && echoed {
        return Err(BodyError {
            message: "echo comes in whole responses: set stream to false".into(),
            param: Some("echo".into()),
        });
    }
    let base64 = parse_output_tag(&tag).1;
    let store = endpoint == Endpoint::Responses && fields.get("store") != Some(&Value::Bool(false));
    Ok(OnlineRequest {
        endpoint,
        work,
        model,
        stream,
        base64,
        store,
    })
}

/// Removes `stream` and `stream_options` from `fields`: `Some` for `stream: true`.
fn take_stream(fields: &mut Fields) -> Result<Option<StreamOptions>, BodyError> {
    let error = |field: &str, message: String| BodyError {
        message,
        param: Some(field.into()),
    };
    let stream = match fields.remove("stream") {
        None | Some(Value::Null | Value::Bool(false)) => false,
        Some(Value::Bool(true)) => true,
        Some(other) => {
            return Err(error(
                "stream",
                format!("stream = {other}: expected a boolean"),
            ));
        }
    };
    let mut options = StreamOptions::default();
    match fields.remove("stream_options") {
        None | Some(Value::Null) => {}
        Some(Value::Object(given)) => {
            for (key, value) in given {
                match (key.as_str(), value) {
                    ("include_usage", Value::Bool(b)) => options.include_usage = b,
                    ("include_obfuscation", Value::Bool(_)) => {}
                    (key, value) => {
                        return Err(error(
                            "stream_options",
                            format!(
                                "stream_options.{key} = {value} is not supported (include_usage is)"
                            ),
                        ));
                    }
                }
            }
            if !stream {
                return Err(error(
                    "stream_options",
                    "stream_options is only allowed with stream: true".into(),
                ));
            }
        }
        Some(other) => {
            return Err(error(
                "stream_options",
                format!("stream_options = {other}: expected an object"),
            ));
        }
    }
    Ok(stream.then_some(options))
}

/// The field a parse message is about: its first word, when the body has such a field.
fn param_of(message: &str, fields: &Fields) -> Option<String> {
    if let Some(rest) = message.strip_prefix("unknown field \"") {
        return rest.split('"').next().map(str::to_owned);
    }
    if let Some(rest) = message.strip_prefix("missing ") {
        return rest.split([' ', '(']).next().map(str::to_owned);
    }
    let word = message.split([' ', '.', '[', ':']).next()?;
    fields.contains_key(word).then(|| word.to_owned())
}

/// The whole response to an online request: ids made from `key`, `model`
/// as the server names it, `created` in Unix seconds.
pub fn online_body(
    key: &str,
    request: &OnlineRequest,
    model: &str,
    created: i64,
    response: &Response,
) -> Value {
    body_of(
        key,
        request.endpoint,
        model,
        created,
        response,
        request.base64,
    )
}

/// The answer to a kept response's deletion (`DELETE /v1/responses/{id}`).
pub fn response_deleted_object(id: &str) -> Value {
    json!({ "id": id, "object": "response", "deleted": true })
}

/// A `model` object (`GET /v1/models`), owned by `cortex`.
pub fn model_object(id: &str, created: i64) -> Value {
    json!({ "id": id, "object": "model", "created": created, "owned_by": "cortex" })
}

/// OpenAI's error object: `{"error": {"message", "type", "param", "code"}}`.
pub fn error_body(message: &str, kind: &str, param: Option<&str>, code: Option<&str>) -> Value {
    json!({ "error": { "message": message, "type": kind, "param": param, "code": code } })
}

/// What every chunk of one streamed response shares.
#[derive(Debug, Clone)]
pub struct ChunkHead {
    /// The response's id key (`chatcmpl-KEY`, `cmpl-KEY`, `resp_KEY`).
    pub key: String,
    /// The model as the server names it.
    pub model: String,
    /// Unix seconds.
    pub created: i64,
}

impl ChunkHead {
    fn chunk(&self, endpoint: Endpoint, choices: Value) -> Value {
        let mut chunk = match endpoint {
            Endpoint::Completions => json!({
                "id": format!("cmpl-{}", self.key),
                "object": "text_completion",
                "created": self.created,
                "model": self.model,
            }),
            _ => json!({
                "id": format!("chatcmpl-{}", self.key),
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
            }),
        };
        chunk["choices"] = choices;
        chunk
    }

    /// The first chunk of a chat choice: the assistant role, no content yet.
    pub fn chat_role(&self, index: u32) -> Value {
        self.chunk(
            Endpoint::ChatCompletions,
            json!([{ "index": index, "delta": { "role": "assistant", "content": "" }, "logprobs": null, "finish_reason": null }]),
        )
    }

    /// New text of choice `index` (chat or completions), with the log
    /// probabilities of the tokens it came from when the request asked for
    /// them (`offset`: the characters of the tokens sent before, where
    /// completions' `text_offset` counts from).
    pub fn text(
        &self,
        endpoint: Endpoint,
        index: u32,
        text: &str,
        logprobs: Option<&[TokenLogprob]>,
        offset: usize,
    ) -> Value {
        let choice = match endpoint {
            Endpoint::Completions => {
                let logprobs = logprobs.map_or(Value::Null, |l| completion_logprobs_of(l, offset));
                json!({ "index": index, "text": text, "logprobs": logprobs, "finish_reason": null })
            }
            _ => {
                let logprobs = logprobs.map_or(Value::Null, chat_logprobs_of);
                json!({ "index": index, "delta": { "content": text }, "logprobs": logprobs, "finish_reason": null })
            }
        };
        self.chunk(endpoint, json!([choice]))
    }

    /// More of a chat choice's thinking (`reasoning_content`, as
    /// llama-server and vLLM stream it).
    pub fn reasoning(&self, index: u32, text: &str) -> Value {
        self.chunk(
            Endpoint::ChatCompletions,
            json!([{ "index": index, "delta": { "reasoning_content": text }, "logprobs": null, "finish_reason": null }]),
        )
    }

    /// Pieces of the calls of chat choice `index`, as OpenAI streams them:
    /// a call's first piece with its id, type and name, the later ones
    /// with more of its arguments only.
    pub fn call_pieces(&self, index: u32, pieces: &[ToolCallDelta]) -> Value {
        let calls: Vec<Value> = pieces
            .iter()
            .map(|piece| match &piece.name {
                Some(name) => json!({
                    "index": piece.index,
                    "id": call_id(&self.key, index, piece.index),
                    "type": "function",
                    "function": { "name": name, "arguments": piece.arguments },
                }),
                None => json!({
                    "index": piece.index,
                    "function": { "arguments": piece.arguments },
                }),
            })
            .collect();
        self.chunk(
            Endpoint::ChatCompletions,
            json!([{ "index": index, "delta": { "tool_calls": calls }, "logprobs": null, "finish_reason": null }]),
        )
    }

    /// The last chunk of a choice: its finish reason, the log probabilities
    /// not sent with its text (the first `logprobs_sent` were, their tokens
    /// `offset` characters long), and for chat the tool calls the
    /// completion made that were not sent (the first `calls_sent` were).
    pub fn finish(
        &self,
        endpoint: Endpoint,
        completion: &Completion,
        (logprobs_sent, offset): (usize, usize),
        calls_sent: usize,
    ) -> Value {
        let mut finish_reason = completion.finish_reason.as_openai();
        let rest = completion
            .logprobs
            .as_deref()
            .map(|l| &l[logprobs_sent.min(l.len())..]);
        let choice = match endpoint {
            Endpoint::Completions => {
                let logprobs = rest.map_or(Value::Null, |l| completion_logprobs_of(l, offset));
                json!({ "index": completion.index, "text": "", "logprobs": logprobs, "finish_reason": finish_reason })
            }
            _ => {
                let mut delta = json!({});
                if !completion.tool_calls.is_empty() {
                    if calls_sent < completion.tool_calls.len() {
                        let calls = tool_calls(&self.key, completion, true);
                        delta["tool_calls"] = Value::Array(
                            calls
                                .as_array()
                                .map_or(&[][..], |c| &c[calls_sent..])
                                .to_vec(),
                        );
                    }
                    if finish_reason == "stop" {
                        finish_reason = "tool_calls";
                    }
                }
                let logprobs = rest.map_or(Value::Null, chat_logprobs_of);
                json!({ "index": completion.index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason })
            }
        };
        self.chunk(endpoint, json!([choice]))
    }

    /// The usage chunk (`stream_options.include_usage`): no choices.
    pub fn usage(&self, endpoint: Endpoint, usage: &Usage) -> Value {
        let mut chunk = self.chunk(endpoint, json!([]));
        chunk["usage"] = json!({
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.total_tokens(),
            "prompt_tokens_details": { "cached_tokens": usage.cached_prompt_tokens },
        });
        chunk
    }
}

/// The events of a streamed `/v1/responses` call, numbered in order:
/// `response.created`, `response.in_progress`, the output item and its
/// text part added, text deltas, then everything done and
/// `response.completed` (or `response.incomplete`) with the whole response.
#[derive(Debug)]
pub struct ResponseEvents {
    head: ChunkHead,
    sequence: u64,
    text: String,
}

impl ResponseEvents {
    /// Events for the response `head` describes.
    pub fn new(head: ChunkHead) -> Self {
        Self {
            head,
            sequence: 0,
            text: String::new(),
        }
    }

    fn event(&mut self, kind: &str, mut fields: Value) -> (String, Value) {
        fields["type"] = json!(kind);
        fields["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        (kind.to_owned(), fields)
    }

    fn item_id(&self) -> String {
        format!("msg_{}", self.head.key)
    }

    fn in_progress(&self) -> Value {
        let mut response = response_object(
            &self.head.key,
            &self.head.model,
            self.head.created,
            &Response {
                id: RequestId(0),
                completions: Vec::new(),
                usage: Usage::default(),
                timings: Timings::default(),
                embeddings: Vec::new(),
            },
        );
        response["status"] = json!("in_progress");
        response["output"] = json!([]);
        response["usage"] = Value::Null;
        response
    }

    /// The events before any text: (event name, data).
    pub fn start(&mut self) -> Vec<(String, Value)> {
        let response = self.in_progress();
        let item = json!({ "type": "message", "id": self.item_id(), "status": "in_progress", "role": "assistant", "content": [] });
        let item_id = self.item_id();
        vec![
            self.event("response.created", json!({ "response": response })),
            self.event("response.in_progress", json!({ "response": response })),
            self.event(
                "response.output_item.added",
                json!({ "output_index": 0, "item": item }),
            ),
            self.event(
                "response.content_part.added",
                json!({ "item_id": item_id, "output_index": 0, "content_index": 0, "part": { "type": "output_text", "text": "", "annotations": [], "logprobs": [] } }),
            ),
        ]
    }

    /// New text.
    pub fn delta(&mut self, text: &str) -> (String, Value) {
        self.text.push_str(text);
        let item_id = self.item_id();
        self.event(
            "response.output_text.delta",
            json!({ "item_id": item_id, "output_index": 0, "content_index": 0, "delta": text, "logprobs": [] }),
        )
    }

    /// The events that close the response, the last with all of it.
    pub fn finish(&mut self, response: &Response) -> Vec<(String, Value)> {
        let whole = response_object(
            &self.head.key,
            &self.head.model,
            self.head.created,
            response,
        );
        let item = whole["output"][0].clone();
        let part = item["content"][0].clone();
        let item_id = self.item_id();
        let text = part["text"].clone();
        let last = if whole["status"] == "incomplete" {
            "response.incomplete"
        } else {
            "response.completed"
        };
        vec![
            self.event(
                "response.output_text.done",
                json!({ "item_id": item_id, "output_index": 0, "content_index": 0, "text": text, "logprobs": [] }),
            ),
            self.event(
                "response.content_part.done",
                json!({ "item_id": item_id, "output_index": 0, "content_index": 0, "part": part }),
            ),
            self.event(
                "response.output_item.done",
                json!({ "output_index": 0, "item": item }),
            ),
            self.event(last, json!({ "response": whole })),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_fields_are_taken_and_checked() {
        let request = parse_request(
            Endpoint::Completions,
            br#"{"prompt": "Hi", "stream": true, "stream_options": {"include_usage": true}}"#,
        )
        .unwrap();
        assert_eq!(
            request.stream,
            Some(StreamOptions {
                include_usage: true
            })
        );
        let error = parse_request(
            Endpoint::Completions,
            br#"{"prompt": "Hi", "stream_options": {"include_usage": true}}"#,
        )
        .unwrap_err();
        assert_eq!(
            error.message,
            "stream_options is only allowed with stream: true"
        );
        let error = parse_request(Endpoint::ChatCompletions, br#"{"messages": [], "nope": 1}"#)
            .unwrap_err();
        assert_eq!(error.param.as_deref(), Some("nope"));
        let error = parse_request(Endpoint::ChatCompletions, b"{\"messages\": ").unwrap_err();
        assert!(
            error.message.starts_with("the body is not valid JSON: "),
            "{}",
            error.message
        );
        let error =
            parse_request(Endpoint::Embeddings, br#"{"input": "x", "stream": true}"#).unwrap_err();
        assert_eq!(error.message, "unknown field \"stream\"");
    }

    #[test]
    fn chunks_have_openais_shape() {
        let head = ChunkHead {
            key: "k".into(),
            model: "m".into(),
            created: 1,
        };
        let chunk = head.text(Endpoint::ChatCompletions, 0, "Hel", None, 0);
        assert_eq!(chunk["object"], "chat.completion.chunk");
        assert_eq!(chunk["choices"][0]["delta"]["content"], "Hel");
        let usage = head.usage(
            Endpoint::ChatCompletions,
            &Usage {
                prompt_tokens: 3,
                completion_tokens: 2,
                cached_prompt_tokens: 0,
            },
        );
        assert_eq!(usage["choices"], json!([]));
        assert_eq!(usage["usage"]["total_tokens"], 5);
        let mut events = ResponseEvents::new(head);
        let start = events.start();
        assert_eq!(start[0].0, "response.created");
        assert_eq!(events.delta("Hi").1["sequence_number"], 4);
    }
}
