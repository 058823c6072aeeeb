//! `/api/generate` and `/api/chat`: NDJSON streams by default, or one
//! object with `stream: false`; the model's own `SYSTEM` and `PARAMETER`s
//! under the body's `system` and `options`; `keep_alive`; an empty prompt
//! only loads (or, with `keep_alive: 0`, unloads) the model.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use cortex_engine::EngineEvent;
use cortex_request::{
    ChatMessage, FinishReason, Limits, Prompt, Request, RequestId, Response as Finished, ToolCall,
    Work,
};
use cortex_worker::ModelIdentity;
use serde_json::{Value, json};

use super::chat_shape as shapes;
use super::shape::{
    OllamaError, apply_options, bad, format_grammar, keep_alive, object, text_field, timestamp,
};
use crate::auth::Caller;
use crate::online::body_bytes;
use crate::pool::{KeepAlive, ModelPool};
use crate::state::{AppState, off_async};
use crate::stream::Call;

/// A parsed `/api/generate` or `/api/chat` body.
struct OllamaRequest {
    model: ModelIdentity,
    /// `None`: nothing to generate (an empty prompt): only load or unload.
    request: Option<Request>,
    stream: bool,
    keep_alive: Option<KeepAlive>,
}

/// Reads a body (off the async threads: it may look the model up in the
/// registry). The model's `SYSTEM` is the system prompt unless the body
/// brings one; its `PARAMETER`s are the defaults under `options`.
fn parse(models: &ModelPool, body: &[u8], chat: bool) -> Result<OllamaRequest, OllamaError> {
    let fields = object(body)?;
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
            "model" | "stream" | "format" | "options" | "keep_alive" | "think" => {}
            "suffix" | "template" | "images" | "context"
                if !value.is_null() && value != "" && value != &json!([]) =>
            {
                return Err(bad(format!("{key} is not supported by cortex")));
            }
            key if prompt_fields.contains(&key) => {}
            key => return Err(bad(format!("unknown field {key:?}"))),
        }
    }
    let keep_alive = keep_alive(&fields)?;
    let asked = text_field(&fields, "model")?.ok_or_else(|| bad("model is required"))?;
    let model = models.identify(Some(&asked))?;
    let defaults = cortex_worker::model_defaults(&model.settings);
    let stream = !matches!(fields.get("stream"), Some(Value::Bool(false)));
    let prompt = if chat {
        let mut messages = shapes::messages(fields.get("messages"))?;
        if messages.is_empty() {
            None
        } else {
            if let Some(system) = &defaults.system
                && !messages.iter().any(|m| m.role == "system")
            {
                messages.insert(0, ChatMessage::system(system));
            }
            Some(Prompt::Chat(messages))
        }
    } else {
        let text = text_field(&fields, "prompt")?.unwrap_or_default();
        if text.is_empty() {
            None
        } else if fields.get("raw").is_some_and(|r| r == true) {
            Some(Prompt::Text(text))
        } else {
            let mut messages = Vec::new();
            if let Some(system) = text_field(&fields, "system")?.or(defaults.system.clone()) {
                messages.push(ChatMessage::new("system", system));
            }
            messages.push(ChatMessage::new("user", text));
            Some(Prompt::Chat(messages))
        }
    };
    let request = match prompt {
        None => None,
        Some(prompt) => {
            let mut request = Request::new(RequestId(0), prompt);
            request.sampling = defaults.sampling;
            request.stop = defaults.stop;
            if let Some(options) = fields.get("options") {
                apply_options(options, &mut request)?;
            }
            request.grammar = format_grammar(fields.get("format"))?;
            request.template_variables = shapes::think(fields.get("think"))?;
            if chat {
                request.tools = shapes::tools(fields.get("tools"))?;
            }
            request
                .validate(&Limits::default())
                .map_err(|e| bad(e.to_string()))?;
            Some(request)
        }
    };
    Ok(OllamaRequest {
        model,
        request,
        stream,
        keep_alive,
    })
}

/// What both endpoints share in every line: the text, and a chat answer's
/// thinking and whole calls.
fn line(model: &str, chat: bool, text: &str, thinking: &str, calls: &[ToolCall]) -> Value {
    let mut line =
        json!({ "model": model, "created_at": timestamp(cortex_queue::now_ms()), "done": false });
    if chat {
        let mut message = serde_json::Map::new();
        message.insert("role".into(), json!("assistant"));
        message.insert("content".into(), json!(text));
        shapes::answer_fields(&mut message, thinking, calls);
        line["message"] = Value::Object(message);
    } else {
        line["response"] = json!(text);
        if !thinking.is_empty() {
            line["thinking"] = json!(thinking);
        }
    }
    line
}

/// The last line: `done`, why, and the counts and durations (nanoseconds).
fn done_line(model: &str, chat: bool, text: &str, response: &Finished, total_ns: u64) -> Value {
    let mut last = line(model, chat, text, "", &[]);
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
    let models = Arc::clone(&state.models);
    let OllamaRequest {
        model,
        request,
        stream,
        keep_alive,
    } = off_async(move || parse(&models, &body, chat)).await??;
    let Some(request) = request else {
        return load_or_unload(&state, &model, keep_alive, chat).await;
    };
    let held = {
        let models = Arc::clone(&state.models);
        off_async(move || models.acquire(&model, keep_alive)).await??
    };
    let model = held.asked().name.clone();
    let endpoint = if chat { "/api/chat" } else { "/api/generate" };
    let mut call = Call::submit(&state, &caller, held, Work::Generate(request), endpoint)?;
    if !stream {
        let response = call.finish().await?;
        let first = response.completions.first();
        let text = first.map_or("", |c| c.text.as_str());
        let total = call.elapsed().as_nanos() as u64;
        let mut last = done_line(&model, chat, text, &response, total);
        match last.get_mut("message").and_then(Value::as_object_mut) {
            Some(message) => shapes::completion_fields(message, first),
            None => {
                if let Some(thinking) = first.and_then(|c| c.reasoning.as_deref()) {
                    last["thinking"] = json!(thinking);
                }
            }
        }
        return Ok(Json(last).into_response());
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
                        Some(EngineEvent::Token {
                            text,
                            reasoning,
                            calls,
                            ..
                        }) => {
                            if text.is_empty() && reasoning.is_empty() && calls.is_empty() {
                                continue;
                            }
                            sent.push_str(&text);
                            (line(&model, chat, &text, &reasoning, &calls), false)
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

/// A body with nothing to generate: Ollama's way to load a model ahead of
/// time, or with `keep_alive: 0` to unload it.
async fn load_or_unload(
    state: &Arc<AppState>,
    model: &ModelIdentity,
    keep_alive: Option<KeepAlive>,
    chat: bool,
) -> Result<Response, OllamaError> {
    let models = Arc::clone(&state.models);
    let unload = keep_alive == Some(KeepAlive::For(std::time::Duration::ZERO));
    let target = model.clone();
    off_async(move || {
        if unload {
            models.unload(&target.sha256);
            Ok(())
        } else {
            models.acquire(&target, keep_alive).map(drop)
        }
    })
    .await??;
    let mut answer = json!({
        "model": model.name,
        "created_at": timestamp(cortex_queue::now_ms()),
        "done": true,
        "done_reason": if unload { "unload" } else { "load" },
    });
    if chat {
        answer["message"] = json!({ "role": "assistant", "content": "" });
    } else {
        answer["response"] = json!("");
    }
    Ok(Json(answer).into_response())
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
