//! OpenAI's online routes: chat completions, completions, responses and
//! embeddings (whole or streamed), the model list, and the body and model
//! checks they share.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use cortex_openai::{ChunkHead, Endpoint, list_object, model_object, online_body, parse_request};

use crate::auth::Caller;
use crate::error::ApiError;
use crate::state::{AppState, off_async};
use crate::stream::{Call, sse};

/// The body's bytes, or why it could not be read (over the size limit, ...).
pub(crate) fn body_bytes(
    state: &AppState,
    body: Result<Bytes, BytesRejection>,
) -> Result<Bytes, ApiError> {
    body.map_err(|rejection| {
        ApiError::body(
            rejection.status(),
            state.config.max_body_bytes,
            rejection.body_text(),
        )
    })
}

async fn answer(
    state: Arc<AppState>,
    caller: Caller,
    endpoint: Endpoint,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body_bytes(&state, body)?;
    let request = off_async(move || parse_request(endpoint, &body))
        .await?
        .map_err(|e| ApiError::invalid(e.message, e.param))?;
    state.check_model(request.model.as_deref())?;
    let head = ChunkHead {
        key: state.files.new_id(""),
        model: state.model_name().to_owned(),
        created: cortex_queue::now_ms() / 1000,
    };
    let mut call = Call::submit(&state, &caller, request.work.clone(), endpoint.url())?;
    if let Some(options) = request.stream {
        call.first().await?;
        return Ok(sse(call, &request, head, options));
    }
    let response = call.finish().await?;
    let body = online_body(&head.key, &request, &head.model, head.created, &response);
    Ok(Json(body).into_response())
}

pub(crate) async fn chat(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    answer(state, caller, Endpoint::ChatCompletions, body).await
}

pub(crate) async fn completions(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    answer(state, caller, Endpoint::Completions, body).await
}

pub(crate) async fn responses(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    answer(state, caller, Endpoint::Responses, body).await
}

pub(crate) async fn embeddings(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    answer(state, caller, Endpoint::Embeddings, body).await
}

pub(crate) async fn models(State(state): State<Arc<AppState>>) -> Json<serde_json::Value> {
    Json(list_object(
        vec![model_object(state.model_name(), state.started)],
        false,
    ))
}

pub(crate) async fn model(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    state.check_model(Some(&id))?;
    Ok(Json(model_object(state.model_name(), state.started)))
}
