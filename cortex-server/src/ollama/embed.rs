//! `/api/embed` (one or many inputs, vectors in input order) and the older
//! `/api/embeddings` (one prompt, one vector), on the model the body names.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use cortex_request::{EmbeddingRequest, Prompt, RequestId, Work};
use serde_json::{Value, json};

use super::shape::{OllamaError, bad, keep_alive, object, text_field};
use crate::auth::Caller;
use crate::online::body_bytes;
use crate::state::AppState;
use crate::stream::Call;

/// Options an embedding takes and ignores (they tune generation).
fn check_fields(
    fields: &serde_json::Map<String, Value>,
    allowed: &[&str],
) -> Result<(), OllamaError> {
    for key in fields.keys() {
        if !allowed.contains(&key.as_str()) {
            return Err(bad(format!("unknown field {key:?}")));
        }
    }
    if let Some(options) = fields.get("options")
        && !(options.is_null() || options.is_object())
    {
        return Err(bad(format!("options = {options}: expected an object")));
    }
    Ok(())
}

/// Embeds `inputs` with the model `fields` names; the vectors and the tokens read.
async fn embed_inputs(
    state: &Arc<AppState>,
    caller: &Caller,
    fields: &serde_json::Map<String, Value>,
    inputs: Vec<String>,
    endpoint: &'static str,
) -> Result<(String, Vec<Vec<f32>>, u32, u64), OllamaError> {
    let asked = text_field(fields, "model")?.ok_or_else(|| bad("model is required"))?;
    let keep_alive = keep_alive(fields)?;
    let request =
        EmbeddingRequest::new(RequestId(0), inputs.into_iter().map(Prompt::Text).collect());
    request.validate().map_err(|e| bad(e.to_string()))?;
    let model = state.use_model(Some(&asked), keep_alive).await?;
    let name = model.asked().name.clone();
    let mut call = Call::submit(state, caller, model, Work::Embed(request), endpoint)?;
    let response = call.finish().await?;
    let total = call.elapsed().as_nanos() as u64;
    Ok((
        name,
        response.embeddings,
        response.usage.prompt_tokens,
        total,
    ))
}

pub(crate) async fn embed(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let answer = async {
        let body = body_bytes(&state, body)?;
        let fields = object(&body)?;
        check_fields(
            &fields,
            &[
                "model",
                "input",
                "truncate",
                "options",
                "keep_alive",
                "dimensions",
            ],
        )?;
        if fields.get("dimensions").is_some_and(|d| !d.is_null()) {
            return Err(bad(
                "dimensions is not supported by cortex (vectors keep the model's width)",
            ));
        }
        let inputs = match fields.get("input") {
            Some(Value::String(text)) => vec![text.clone()],
            Some(Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, item)| {
                    item.as_str()
                        .map(str::to_owned)
                        .ok_or_else(|| bad(format!("input[{i}] = {item}: expected a string")))
                })
                .collect::<Result<_, _>>()?,
            None | Some(Value::Null) => return Err(bad("input is required")),
            Some(other) => {
                return Err(bad(format!(
                    "input = {other}: expected a string or an array of strings"
                )));
            }
        };
        let (model, embeddings, tokens, total) =
            embed_inputs(&state, &caller, &fields, inputs, "/api/embed").await?;
        Ok::<_, OllamaError>(Json(json!({
            "model": model,
            "embeddings": embeddings,
            "total_duration": total,
            "load_duration": 0,
            "prompt_eval_count": tokens,
        })))
    };
    answer.await.into_response()
}

pub(crate) async fn embeddings(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let answer = async {
        let body = body_bytes(&state, body)?;
        let fields = object(&body)?;
        check_fields(&fields, &["model", "prompt", "options", "keep_alive"])?;
        let prompt = text_field(&fields, "prompt")?.ok_or_else(|| bad("prompt is required"))?;
        let (_, embeddings, _, _) =
            embed_inputs(&state, &caller, &fields, vec![prompt], "/api/embeddings").await?;
        let embedding = embeddings.into_iter().next().unwrap_or_default();
        Ok::<_, OllamaError>(Json(json!({ "embedding": embedding })))
    };
    answer.await.into_response()
}
