//! vLLM's tokenizer routes (`POST /tokenize`, `POST /detokenize`, `GET
//! /tokenizer_info`), with which evaluation harnesses count a context's
//! tokens before they score its continuations (`echo` on
//! `/v1/completions`): answered with the model's own tokenizer, the one
//! its prompts are made with.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use cortex_openai::{
    detokenize_body, parse_detokenize, parse_tokenize, tokenize_body, tokenizer_info_body,
};
use serde_json::Value;

use crate::error::ApiError;
use crate::online::body_bytes;
use crate::state::{AppState, off_async};

type Answer = Result<Json<Value>, ApiError>;

/// `POST /tokenize`: `{"prompt", "add_special_tokens"}` to `{"tokens", "count", "max_model_len"}`.
pub(crate) async fn tokenize(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Answer {
    let body = body_bytes(&state, body)?;
    let call = parse_tokenize(&body).map_err(|e| ApiError::invalid(e.message, e.param))?;
    let model = state.use_model(call.model.as_deref(), None).await?;
    off_async(move || {
        let tokens = model
            .engine
            .tokenize(&call.prompt, call.add_special_tokens)
            .map_err(|e| ApiError::engine(&e))?;
        Ok(Json(tokenize_body(
            &tokens,
            model.engine.info().max_sequence_tokens,
        )))
    })
    .await?
}

/// `POST /detokenize`: `{"tokens"}` to `{"prompt"}`.
pub(crate) async fn detokenize(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Answer {
    let body = body_bytes(&state, body)?;
    let invalid = |e: cortex_openai::BodyError| ApiError::invalid(e.message, e.param);
    let call = parse_detokenize(&body).map_err(invalid)?;
    // The model's vocabulary bounds the ids.
    let model = state.use_model(call.model.as_deref(), None).await?;
    let call = call.within(model.engine.info().n_vocab).map_err(invalid)?;
    off_async(move || {
        let text = model
            .engine
            .detokenize(call.tokens)
            .map_err(|e| ApiError::engine(&e))?;
        Ok(Json(detokenize_body(&text)))
    })
    .await?
}

/// `GET /tokenizer_info`: the default model's start and end tokens and its
/// longest sequence.
pub(crate) async fn tokenizer_info(State(state): State<Arc<AppState>>) -> Answer {
    let model = state.use_model(None, None).await?;
    off_async(move || {
        let (start, end) = model
            .engine
            .start_end_texts()
            .map_err(|e| ApiError::engine(&e))?;
        let max = model.engine.info().max_sequence_tokens;
        Ok(Json(tokenizer_info_body(&start, &end, max, None)))
    })
    .await?
}
