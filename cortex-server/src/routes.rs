//! The router: every route, the body limits, API keys, request metrics,
//! `/health`, `/metrics`, and OpenAI-shaped answers for unknown routes and
//! methods.

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, head, post};
use axum::{Json, Router};
use cortex_engine::EngineHealth;
use cortex_queue::{JobCounts, JobFilter};
use serde_json::{Value, json};

use crate::error::ApiError;
use crate::files::ROUTE as FILES_ROUTE;
use crate::metrics::Snapshot;
use crate::ollama::{BLOBS_PREFIX, BLOBS_ROUTE};
use crate::state::{AppState, off_async};
use crate::{
    admission, auth, batch_api, dashboard, guard, jobs_api, ollama, online, openapi, tokenizer,
};

pub(crate) fn router(state: Arc<AppState>) -> Router {
    let file_limit = state.config.max_file_bytes;
    // Generation and embeddings: what admission control counts.
    let online = Router::new()
        .route("/v1/chat/completions", post(online::chat))
        .route("/v1/completions", post(online::completions))
        .route("/v1/responses", post(online::responses))
        .route(
            "/v1/responses/{id}",
            get(online::stored_response).delete(online::delete_response),
        )
        .route("/v1/embeddings", post(online::embeddings))
        .route("/api/generate", post(ollama::generate))
        .route("/api/chat", post(ollama::chat))
        .route("/api/embed", post(ollama::embed))
        .route("/api/embeddings", post(ollama::embeddings))
        .route_layer(middleware::from_fn_with_state(
            admission::Admission::new(&state.config),
            admission::admit_online,
        ));
    Router::new()
        .merge(online)
        .route("/v1/models", get(online::models))
        .route("/tokenize", post(tokenizer::tokenize))
        .route("/detokenize", post(tokenizer::detokenize))
        .route("/tokenizer_info", get(tokenizer::tokenizer_info))
        .route("/v1/models/{id}", get(online::model))
        .route(
            FILES_ROUTE,
            post(batch_api::upload)
                .layer(DefaultBodyLimit::max(file_limit))
                .get(batch_api::list_files),
        )
        .route(
            "/v1/files/{id}",
            get(batch_api::retrieve_file).delete(batch_api::delete_file),
        )
        .route("/v1/files/{id}/content", get(batch_api::file_content))
        .route(
            "/v1/batches",
            post(batch_api::create_batch).get(batch_api::list_batches),
        )
        .route("/v1/batches/{id}", get(batch_api::retrieve_batch))
        .route("/v1/batches/{id}/cancel", post(batch_api::cancel_batch))
        .route("/v1/jobs", get(jobs_api::list))
        .route("/v1/jobs/{id}", get(jobs_api::retrieve))
        .route("/v1/jobs/{id}/items", get(jobs_api::items))
        .route("/v1/jobs/{id}/items/{line}", get(jobs_api::item))
        .route("/v1/jobs/{id}/cancel", post(jobs_api::cancel))
        .route("/v1/jobs/{id}/resume", post(jobs_api::resume))
        .route("/v1/jobs/{id}/retry", post(jobs_api::retry))
        .route("/api/tags", get(ollama::tags))
        .route("/api/show", post(ollama::show))
        .route("/api/ps", get(ollama::ps))
        .route("/api/version", get(ollama::version))
        .route("/api/pull", post(ollama::pull))
        .route("/api/create", post(ollama::create))
        .route("/api/copy", post(ollama::copy))
        .route("/api/delete", delete(ollama::delete))
        .route(
            BLOBS_ROUTE,
            head(ollama::has_blob)
                .post(ollama::upload_blob)
                .layer(DefaultBodyLimit::disable()),
        )
        .route("/", get(dashboard::page))
        .route("/dashboard.js", get(dashboard::script))
        .route("/dashboard.css", get(dashboard::style))
        .route("/metrics", get(metrics))
        .route("/v1/metrics", get(metrics_json))
        .route("/health", get(health))
        .route(
            openapi::ROUTE,
            get(openapi::serve).with_state(openapi::text(&state.models.default_model().name)),
        )
        .fallback(unknown_route)
        .method_not_allowed_fallback(wrong_method)
        .layer(middleware::from_fn_with_state(
            auth::KeyCheck::new(&state.config.api_keys),
            auth::require_key,
        ))
        .layer(middleware::from_fn_with_state(
            state.config.body_timeout,
            admission::body_deadline,
        ))
        .layer(middleware::from_fn_with_state(
            Arc::clone(&state),
            refuse_oversized,
        ))
        .layer(middleware::from_fn_with_state(
            guard::Allowed::new(&state.config),
            guard::guard,
        ))
        .layer(middleware::from_fn_with_state(Arc::clone(&state), track))
        .layer(DefaultBodyLimit::max(state.config.max_body_bytes))
        .with_state(state)
}

/// Counts every answer by route and status (refusals by `auth` included:
/// it runs inside this layer).
async fn track(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", MatchedPath::as_str)
        .to_owned();
    let response = next.run(request).await;
    state.metrics.request(&route, response.status().as_u16());
    response
}

/// A body whose Content-Length is over the route's limit is refused at
/// once, before a byte of it is read (the extractors' own limit catches
/// bodies without a length as they are read).
async fn refuse_oversized(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    let path = request.uri().path();
    let limit = if path == FILES_ROUTE {
        state.config.max_file_bytes
    } else if path.starts_with(BLOBS_PREFIX) {
        state.config.max_blob_bytes
    } else {
        state.config.max_body_bytes
    };
    let length = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if length.is_some_and(|n| n > limit as u64) {
        return ApiError::body(StatusCode::PAYLOAD_TOO_LARGE, limit, String::new()).into_response();
    }
    next.run(request).await
}

async fn unknown_route(request: Request) -> ApiError {
    ApiError::not_found(format!(
        "no route {} {}; see GET /v1/models, POST /v1/chat/completions, /v1/completions, /v1/responses, /v1/embeddings, /v1/files, /v1/batches, /api/chat, /api/generate (every route: GET /openapi.json)",
        request.method(),
        request.uri().path()
    ))
}

async fn wrong_method(request: Request) -> ApiError {
    ApiError {
        status: StatusCode::METHOD_NOT_ALLOWED,
        ..ApiError::invalid(
            format!(
                "{} is not allowed on {}",
                request.method(),
                request.uri().path()
            ),
            None,
        )
    }
}

/// 200 while the engine runs; 503 with why once it stopped or died.
/// Up or down, and nothing more: `/health` needs no key, so it names
/// neither the model nor why the engine stopped (the log and `/metrics`,
/// behind the key, do).
async fn health(State(state): State<Arc<AppState>>) -> Response {
    match state.models.health() {
        EngineHealth::Running => Json(json!({ "status": "ok" })).into_response(),
        EngineHealth::Stopped => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "status": "stopped" })),
        )
            .into_response(),
        EngineHealth::Died(message) => {
            tracing::error!("health: the engine died: {message}");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(json!({ "status": "died" })),
            )
                .into_response()
        }
    }
}

async fn metrics(State(state): State<Arc<AppState>>) -> Result<Response, ApiError> {
    let snapshot = gather(&state).await?;
    Ok((
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.render(&snapshot),
    )
        .into_response())
}

/// `/metrics`'s figures as JSON, for scripts and the dashboard.
async fn metrics_json(State(state): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    let snapshot = gather(&state).await?;
    Ok(Json(snapshot.to_json(&state.metrics)))
}

/// Reads every figure (the store and the pool off the async threads).
async fn gather(state: &Arc<AppState>) -> Result<Snapshot, ApiError> {
    let (queue, workers) = state
        .with_store(|store| {
            let mut total = JobCounts::default();
            for job in store.jobs(&JobFilter::default())? {
                if job.state.is_terminal() {
                    continue;
                }
                let c = job.counts;
                total.pending += c.pending;
                total.running += c.running;
                total.completed += c.completed;
                total.failed += c.failed;
                total.cancelled += c.cancelled;
            }
            Ok((total, store.workers()?))
        })
        .await?;
    let models = Arc::clone(&state.models);
    let (stats, (device, device_used), loaded) =
        off_async(move || (models.stats(), models.device(), models.running())).await?;
    Ok(Snapshot {
        at: cortex_queue::now_ms(),
        stats,
        queue,
        online: state.online_count(),
        device,
        device_used,
        system: state.system.sample(),
        loaded,
        workers,
    })
}
