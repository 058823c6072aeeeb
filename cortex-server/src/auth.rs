//! API keys: with keys configured, every route but `/health` needs
//! `Authorization: Bearer KEY` (Ollama's routes too).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;
use crate::state::AppState;

/// Compares without stopping at the first differing byte, so the time taken
/// says nothing about how much of a key was right.
fn same_key(given: &[u8], key: &[u8]) -> bool {
    given.len() == key.len() && given.iter().zip(key).fold(0u8, |d, (a, b)| d | (a ^ b)) == 0
}

pub(crate) async fn require_key(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    let keys = &state.config.api_keys;
    if keys.is_empty() || request.uri().path() == "/health" {
        return next.run(request).await;
    }
    let given = request
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::trim);
    let refusal = match given {
        None => "no API key: send `Authorization: Bearer KEY`",
        Some(value) => match value.strip_prefix("Bearer ") {
            Some(token)
                if keys
                    .iter()
                    .any(|k| same_key(token.trim().as_bytes(), k.as_bytes())) =>
            {
                return next.run(request).await;
            }
            Some(_) => "the API key is not one this server accepts",
            None => "the Authorization header must be `Bearer KEY`",
        },
    };
    ApiError::unauthorized(refusal).into_response()
}

#[cfg(test)]
mod tests {
    use super::same_key;

    #[test]
    fn keys_compare_whole() {
        assert!(same_key(b"secret", b"secret"));
        assert!(!same_key(b"secret", b"secreT"));
        assert!(!same_key(b"secre", b"secret"));
    }
}
