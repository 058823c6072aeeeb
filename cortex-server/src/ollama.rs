//! Ollama's API on the same engine: `/api/generate` and `/api/chat`
//! (NDJSON streams by default, or one object with `stream: false`;
//! `format` as `"json"` or a JSON schema, compiled to a grammar; `options`
//! mapped onto sampling), `/api/tags`, `/api/show`, `/api/ps`,
//! `/api/version`. Errors are `{"error": "..."}` as Ollama sends them.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use cortex_engine::EngineEvent;
use cortex_request::{
    ChatMessage, FinishReason, Limits, Prompt, Request, RequestId, Response as Finished, Work,
};
use serde_json::{Map, Value, json};

use crate::auth::Caller;
use crate::error::ApiError;
use crate::online::body_bytes;
use crate::state::{AppState, off_async};
use crate::stream::Call;

/// The Ollama API version cortex answers like.
const OLLAMA_VERSION: &str = "0.12.0";

/// An error in Ollama's shape.
struct OllamaError(StatusCode, String);

impl From<ApiError> for OllamaError {
    fn from(error: ApiError) -> Self {
        Self(error.status, error.message)
    }
}

impl IntoResponse for OllamaError {
    fn into_response(self) -> Response {
        (self.0, Json(json!({ "error": self.1 }))).into_response()
    }
}

fn bad(message: impl Into<String>) -> OllamaError {
    OllamaError(StatusCode::BAD_REQUEST, message.into())
}

/// RFC 3339 UTC with milliseconds.
fn timestamp(ms: i64) -> String {
    let (y, mo, d, h, mi, s) = cortex_request::civil_date(ms.div_euclid(1000));
    format!(
        "{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{:03}Z",
        ms.rem_euclid(1000)
    )
}

fn text_field(fields: &Map<String, Value>, key: &str) -> Result<Option<String>, OllamaError> {
    match fields.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(bad(format!("{key} = {other}: expected a string"))),
    }
}

fn number(key: &str, value: &Value) -> Result<f64, OllamaError> {
    value
        .as_f64()
        .ok_or_else(|| bad(format!("options.{key} = {value}: expected a number")))
}

/// An integer option: any JSON number, cut to an integer as Ollama does.
fn integer(key: &str, value: &Value) -> Result<f64, OllamaError> {
    value
        .as_f64()
        .map(f64::trunc)
        .ok_or_else(|| bad(format!("options.{key} = {value}: expected an integer")))
}

/// Options that tune Ollama's runtime rather than what is generated, with
/// their types: accepted (when of the right type), no effect here.
const RUNTIME_OPTIONS: &[(&str, OptionType)] = &[
    ("num_ctx", OptionType::Integer),
    ("num_batch", OptionType::Integer),
    ("num_gpu", OptionType::Integer),
    ("main_gpu", OptionType::Integer),
    ("use_mmap", OptionType::Bool),
    ("use_mlock", OptionType::Bool),
    ("num_thread", OptionType::Integer),
    ("numa", OptionType::Bool),
    ("low_vram", OptionType::Bool),
    ("vocab_only", OptionType::Bool),
    ("num_keep", OptionType::Integer),
    ("penalize_newline", OptionType::Bool),
    ("typical_p", OptionType::Number),
    ("mirostat", OptionType::Integer),
    ("mirostat_tau", OptionType::Number),
    ("mirostat_eta", OptionType::Number),
    ("tfs_z", OptionType::Number),
];

#[derive(Clone, Copy)]
enum OptionType {
    Integer,
    Number,
    Bool,
}

impl OptionType {
    fn check(self, key: &str, value: &Value) -> Result<(), OllamaError> {
        match self {
            OptionType::Integer => integer(key, value).map(drop),
            OptionType::Number => number(key, value).map(drop),
            OptionType::Bool if value.is_boolean() => Ok(()),
            OptionType::Bool => Err(bad(format!(
                "options.{key} = {value}: expected true or false"
            ))),
        }
    }
}

/// `options` onto the request's sampling and stop settings.
fn apply_options(options: &Value, request: &mut Request) -> Result<(), OllamaError> {
    let Value::Object(options) = options else {
        return if options.is_null() {
            Ok(())
        } else {
            Err(bad(format!("options = {options}: expected an object")))
        };
    };
    let sampling = &mut request.sampling;
    for (key, value) in options {
        match key.as_str() {
            "temperature" => sampling.temperature = number(key, value)? as f32,
            "top_p" => sampling.top_p = number(key, value)? as f32,
            "top_k" => sampling.top_k = integer(key, value)? as i32,
            "min_p" => sampling.min_p = number(key, value)? as f32,
            "repeat_penalty" => sampling.repetition_penalty = number(key, value)? as f32,
            "presence_penalty" => sampling.presence_penalty = number(key, value)? as f32,
            "frequency_penalty" => sampling.frequency_penalty = number(key, value)? as f32,
            "repeat_last_n" => sampling.penalty_last_n = integer(key, value)?.max(0.0) as u32,
            "seed" => sampling.seed = Some(integer(key, value)? as u64),
            "num_predict" => {
                let n = integer(key, value)?;
                // -1 (and -2) mean "until the context is full": the engine's limit.
                request.stop.max_tokens = if n < 0.0 { u32::MAX } else { n as u32 };
            }
            "stop" => {
                request.stop.stop = value
                    .as_array()
                    .and_then(|a| a.iter().map(|s| s.as_str().map(str::to_owned)).collect())
                    .ok_or_else(|| {
                        bad(format!(
                            "options.stop = {value}: expected an array of strings"
                        ))
                    })?;
            }
            key => match RUNTIME_OPTIONS.iter().find(|(name, _)| *name == key) {
                Some((_, kind)) => kind.check(key, value)?,
                None => return Err(bad(format!("options.{key} is not an option cortex knows"))),
            },
        }
    }
    Ok(())
}

/// `format`: `"json"` or a JSON schema, as a grammar.
fn format_grammar(format: Option<&Value>) -> Result<Option<String>, OllamaError> {
    match format {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) if s == "json" => Ok(Some(cortex_grammar::json_object())),
        Some(schema @ Value::Object(_)) => cortex_grammar::from_json_schema(schema)
            .map(Some)
            .map_err(|e| bad(format!("format: {e}"))),
        Some(other) => Err(bad(format!(
            "format = {other}: expected \"json\" or a JSON schema"
        ))),
    }
}

/// A parsed `/api/generate` or `/api/chat` body.
struct OllamaRequest {
    request: Request,
    stream: bool,
}

fn parse(state: &AppState, body: &[u8], chat: bool) -> Result<OllamaRequest, OllamaError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| bad(format!("the body is not valid JSON: {e}")))?;
    let Value::Object(fields) = value else {
        return Err(bad("the body must be a JSON object"));
    };
    let prompt_fields: &[&str] = if chat {
        &["messages", "tools"]
    } else {
        &[
            "prompt", "system", "raw", "suffix", "template", "context", "images",
        ]
    };
    for (key, value) in &fields {
        match key.as_str() {
            "stream" | "raw"
                if (key == "stream" || !chat) && !matches!(value, Value::Null | Value::Bool(_)) =>
            {
                return Err(bad(format!("{key} = {value}: expected true or false")));
            }
            "keep_alive" if !matches!(value, Value::Null | Value::String(_) | Value::Number(_)) => {
                return Err(bad(format!(
                    "keep_alive = {value}: expected a duration (\"5m\") or a number of seconds"
                )));
            }
            "model" | "stream" | "format" | "options" | "keep_alive" => {}
            "think" if matches!(value, Value::Null | Value::Bool(false)) => {}
            "suffix" | "template" | "images" | "context" | "tools"
                if !value.is_null() && value != "" && value != &json!([]) =>
            {
                return Err(bad(format!("{key} is not supported by cortex")));
            }
            key if prompt_fields.contains(&key) => {}
            key => return Err(bad(format!("unknown field {key:?}"))),
        }
    }
    let model = text_field(&fields, "model")?.ok_or_else(|| bad("model is required"))?;
    state.check_model(Some(&model))?;
    let prompt = if chat {
        let messages = fields
            .get("messages")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("messages is required: an array of {role, content}"))?;
        let messages = messages
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let role = m["role"]
                    .as_str()
                    .ok_or_else(|| bad(format!("messages[{i}].role: expected a string")))?;
                let content = m["content"].as_str().unwrap_or_default();
                if m.get("images").is_some_and(|v| !v.is_null()) {
                    return Err(bad(format!(
                        "messages[{i}].images: cortex runs text models only"
                    )));
                }
                Ok(ChatMessage::new(role, content))
            })
            .collect::<Result<Vec<_>, OllamaError>>()?;
        Prompt::Chat(messages)
    } else {
        let text = text_field(&fields, "prompt")?.unwrap_or_default();
        if fields.get("raw").is_some_and(|r| r == true) {
            Prompt::Text(text)
        } else {
            let mut messages = Vec::new();
            if let Some(system) = text_field(&fields, "system")? {
                messages.push(ChatMessage::new("system", system));
            }
            messages.push(ChatMessage::new("user", text));
            Prompt::Chat(messages)
        }
    };
    let mut request = Request::new(RequestId(0), prompt);
    if let Some(options) = fields.get("options") {
        apply_options(options, &mut request)?;
    }
    request.grammar = format_grammar(fields.get("format"))?;
    request
        .validate(&Limits::default())
        .map_err(|e| bad(e.to_string()))?;
    let stream = !matches!(fields.get("stream"), Some(Value::Bool(false)));
    Ok(OllamaRequest { request, stream })
}

/// What both endpoints share in every line.
fn line(model: &str, chat: bool, text: &str) -> Value {
    let mut line =
        json!({ "model": model, "created_at": timestamp(cortex_queue::now_ms()), "done": false });
    if chat {
        line["message"] = json!({ "role": "assistant", "content": text });
    } else {
        line["response"] = json!(text);
    }
    line
}

/// The last line: `done`, why, and the counts and durations (nanoseconds).
fn done_line(model: &str, chat: bool, text: &str, response: &Finished, total_ns: u64) -> Value {
    let mut last = line(model, chat, text);
    let reason = match response.completions.first().map(|c| c.finish_reason) {
        Some(FinishReason::Length) => "length",
        Some(FinishReason::Cancelled) => "cancelled",
        _ => "stop",
    };
    let timings = &response.timings;
    let first = timings.first_token.unwrap_or(timings.finished);
    let ns = |d: std::time::Duration| d.as_nanos() as u64;
    last["done"] = json!(true);
    last["done_reason"] = json!(reason);
    last["total_duration"] = json!(total_ns);
    last["load_duration"] = json!(0);
    last["prompt_eval_count"] = json!(response.usage.prompt_tokens);
    last["prompt_eval_duration"] = json!(ns(first.saturating_sub(timings.queued)));
    last["eval_count"] = json!(response.usage.completion_tokens);
    last["eval_duration"] = json!(ns(timings.finished.saturating_sub(first)));
    if !chat {
        last["context"] = json!([]);
    }
    last
}

async fn run(
    state: Arc<AppState>,
    caller: Caller,
    body: Result<Bytes, BytesRejection>,
    chat: bool,
) -> Result<Response, OllamaError> {
    let body = body_bytes(&state, body)?;
    let parsing = Arc::clone(&state);
    let OllamaRequest { request, stream } =
        off_async(move || parse(&parsing, &body, chat)).await??;
    let model = state.model_name().to_owned();
    let endpoint = if chat { "/api/chat" } else { "/api/generate" };
    let mut call = Call::submit(&state, &caller, Work::Generate(request), endpoint)?;
    if !stream {
        let response = call.finish().await?;
        let text = response.completions.first().map_or("", |c| c.text.as_str());
        let total = call.elapsed().as_nanos() as u64;
        return Ok(Json(done_line(&model, chat, text, &response, total)).into_response());
    }
    call.first().await?;
    let lines = futures_util::stream::unfold(
        (call, false, String::new()),
        move |(mut call, done, mut sent)| {
            let model = model.clone();
            async move {
                if done {
                    return None;
                }
                loop {
                    let (value, done) = match call.next().await {
                        Some(EngineEvent::Token { text, .. }) if text.is_empty() => continue,
                        Some(EngineEvent::Token { text, .. }) => {
                            sent.push_str(&text);
                            (line(&model, chat, &text), false)
                        }
                        Some(EngineEvent::Finished(response)) => {
                            let full = response.completions.first().map_or("", |c| c.text.as_str());
                            let rest = full.strip_prefix(sent.as_str()).unwrap_or("").to_owned();
                            let total = call.elapsed().as_nanos() as u64;
                            (done_line(&model, chat, &rest, &response, total), true)
                        }
                        Some(EngineEvent::Failed { error, .. }) => {
                            (json!({ "error": error.to_string() }), true)
                        }
                        Some(_) => continue,
                        None => (json!({ "error": "the engine stopped" }), true),
                    };
                    let mut bytes = value.to_string().into_bytes();
                    bytes.push(b'\n');
                    return Some((
                        Ok::<Bytes, Infallible>(Bytes::from(bytes)),
                        (call, done, sent),
                    ));
                }
            }
        },
    );
    Ok((
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(lines),
    )
        .into_response())
}

pub(crate) async fn generate(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    run(state, caller, body, false).await.into_response()
}

pub(crate) async fn chat(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    run(state, caller, body, true).await.into_response()
}

/// The served model as Ollama describes one.
fn model_entry(state: &AppState) -> Value {
    let model = &state.config.model;
    let size = std::fs::metadata(&model.path).map_or(0, |m| m.len());
    json!({
        "name": model.name,
        "model": model.name,
        "modified_at": timestamp(state.started * 1000),
        "size": size,
        "digest": model.sha256,
        "details": {
            "parent_model": "",
            "format": "gguf",
            "family": "",
            "families": null,
            "parameter_size": "",
            "quantization_level": "",
        },
    })
}

pub(crate) async fn tags(State(state): State<Arc<AppState>>) -> Json<Value> {
    Json(json!({ "models": [model_entry(&state)] }))
}

pub(crate) async fn ps(State(state): State<Arc<AppState>>) -> Json<Value> {
    let mut entry = model_entry(&state);
    entry["expires_at"] = json!(timestamp((state.started + 100 * 365 * 86_400) * 1000));
    // Ollama's `size` is what the loaded model takes in all, `size_vram` the
    // part of it in GPU memory.
    let on_gpu = state.engine.gpu_memory_used().unwrap_or(0);
    let size = entry["size"].as_u64().unwrap_or(0).max(on_gpu);
    entry["size"] = json!(size);
    entry["size_vram"] = json!(on_gpu);
    Json(json!({ "models": [entry] }))
}

pub(crate) async fn show(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let shown = (|| {
        let body = body_bytes(&state, body)?;
        let value: Value = serde_json::from_slice(&body)
            .map_err(|e| bad(format!("the body is not valid JSON: {e}")))?;
        let name = value
            .get("model")
            .or_else(|| value.get("name"))
            .and_then(Value::as_str)
            .ok_or_else(|| bad("model is required"))?;
        state.check_model(Some(name))?;
        let entry = model_entry(&state);
        Ok::<Value, OllamaError>(json!({
            // The file's name only: where the server keeps it is not the client's business.
            "modelfile": format!(
                "FROM {}",
                state
                    .config
                    .model
                    .path
                    .file_name()
                    .map_or_else(String::new, |name| name.to_string_lossy().into_owned())
            ),
            "parameters": "",
            "template": "",
            "details": entry["details"],
            "model_info": { "general.name": state.model_name() },
            "capabilities": ["completion"],
            "modified_at": entry["modified_at"],
        }))
    })();
    match shown {
        Ok(value) => Json(value).into_response(),
        Err(error) => error.into_response(),
    }
}

pub(crate) async fn version() -> Json<Value> {
    Json(json!({ "version": OLLAMA_VERSION }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_rfc3339() {
        assert_eq!(timestamp(1_500), "1970-01-01T00:00:01.500Z");
    }

    #[test]
    fn options_map_onto_sampling() {
        let mut request = Request::new(RequestId(0), "Hi");
        apply_options(
            &json!({"temperature": 0, "num_predict": 5, "stop": ["\n"], "num_ctx": 2048}),
            &mut request,
        )
        .unwrap_or_else(|_| panic!("options refused"));
        assert_eq!(
            (request.sampling.temperature, request.stop.max_tokens),
            (0.0, 5)
        );
        assert_eq!(request.stop.stop, vec!["\n".to_owned()]);
        let Err(OllamaError(_, message)) = apply_options(&json!({"warp": 9}), &mut request) else {
            panic!("an unknown option was accepted");
        };
        assert_eq!(message, "options.warp is not an option cortex knows");
        for (options, expected) in [
            (
                json!({"num_ctx": "x"}),
                "options.num_ctx = \"x\": expected an integer",
            ),
            (
                json!({"use_mmap": 1}),
                "options.use_mmap = 1: expected true or false",
            ),
            (
                json!({"typical_p": [1]}),
                "options.typical_p = [1]: expected a number",
            ),
            (
                json!({"top_k": "5"}),
                "options.top_k = \"5\": expected an integer",
            ),
        ] {
            let Err(OllamaError(_, message)) = apply_options(&options, &mut request) else {
                panic!("{options} was accepted");
            };
            assert_eq!(message, expected);
        }
        apply_options(
            &json!({"num_ctx": 4096, "top_k": 3.0, "low_vram": false}),
            &mut request,
        )
        .unwrap_or_else(|_| panic!("options refused"));
    }
}
