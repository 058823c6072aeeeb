//! OpenAI's online routes: chat completions, completions, responses and
//! embeddings (whole or streamed), the model list, and the body and model
//! checks they share.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use cortex_openai::{
    ChunkHead, Endpoint, list_object, model_object, online_body, parse_request_with,
    response_deleted_object,
};

use serde_json::Value;

use crate::auth::Caller;
use crate::error::ApiError;
use crate::pool::ModelPool;
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
    let models = Arc::clone(&state.models);
    // The model's own settings (SYSTEM, PARAMETER) are the body's defaults;
    // an unknown model is answered after the body's own mistakes.
    let (request, named) = off_async(move || {
        let mut named = None;
        let request = parse_request_with(endpoint, &body, &mut |asked| {
            let model = models.identify(asked);
            let defaults = model
                .as_ref()
                .map(|m| cortex_worker::model_defaults(&m.settings))
                .unwrap_or_default();
            named = Some(model);
            defaults
        });
        (request, named)
    })
    .await?;
    let request = request.map_err(|e| ApiError::invalid(e.message, e.param))?;
    let model = named.unwrap_or_else(|| state.models.identify(None))?;
    let model = {
        let models = Arc::clone(&state.models);
        off_async(move || models.acquire(&model, None)).await??
    };
    let head = ChunkHead {
        key: state.files.new_id(""),
        model: model.asked().name.clone(),
        created: cortex_queue::now_ms() / 1000,
    };
    let mut call = Call::submit(&state, &caller, model, request.work.clone(), endpoint.url())?;
    // A `/v1/responses` answer is kept for `GET /v1/responses/{id}` (`store`).
    let keep = request.store.then(|| caller.project.to_string());
    if let Some(options) = request.stream {
        call.first().await?;
        return Ok(sse(call, &request, head, options, keep));
    }
    let response = call.finish().await?;
    let body = online_body(&head.key, &request, &head.model, head.created, &response);
    if let Some(project) = keep {
        state.keep_response(body.clone(), project).await;
    }
    Ok(Json(body).into_response())
}

/// `GET /v1/responses/{id}`: a response made online and kept.
pub(crate) async fn stored_response(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let files = Arc::clone(&state);
    let lookup = id.clone();
    let found = off_async(move || files.files.response(&lookup)).await?;
    match found {
        Some((project, response)) if caller.sees(&project) => Ok(Json(response)),
        _ => Err(no_response(&id)),
    }
}

/// `DELETE /v1/responses/{id}`: forgets a kept response.
pub(crate) async fn delete_response(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let files = Arc::clone(&state);
    let target = id.clone();
    let deleted = off_async(move || {
        let visible = files
            .files
            .response(&target)
            .is_some_and(|(project, _)| caller.sees(&project));
        if !visible {
            return Ok(false);
        }
        files.files.delete_response(&target)
    })
    .await?
    .map_err(|e| ApiError::internal(format!("the files directory: {e}")))?;
    if deleted {
        Ok(Json(response_deleted_object(&id)))
    } else {
        Err(no_response(&id))
    }
}

fn no_response(id: &str) -> ApiError {
    ApiError::not_found(format!("No such Response object: {id}"))
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

/// Every model the server can answer with: the default one first, then
/// the registry's, each created when its name was.
pub(crate) async fn models(State(state): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    let models = Arc::clone(&state.models);
    let started = state.started;
    let list = off_async(move || {
        let default = models.default_model().clone();
        let created = created_of(&models, &default.name, started);
        let mut objects = vec![model_object(&default.name, created)];
        for entry in models.registry().list().models {
            let name = entry.name.to_string();
            if name != default.name {
                objects.push(model_object(&name, (entry.modified_at_ms / 1000) as i64));
            }
        }
        objects
    })
    .await?;
    Ok(Json(list_object(list, false)))
}

pub(crate) async fn model(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let models = Arc::clone(&state.models);
    let started = state.started;
    let found = off_async(move || {
        let model = models.describe(Some(&id))?;
        let created = created_of(&models, &model.name, started);
        Ok::<_, ApiError>(model_object(&model.name, created))
    })
    .await??;
    Ok(Json(found))
}

/// When a model was created, as `/v1/models` and `/v1/models/{id}` both
/// say: when its name was registered, else (a GGUF file) when the server
/// started.
fn created_of(models: &ModelPool, name: &str, started: i64) -> i64 {
    models
        .registry()
        .find(name)
        .ok()
        .flatten()
        .map_or(started, |e| (e.modified_at_ms / 1000) as i64)
}
