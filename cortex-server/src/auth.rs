//! API keys: with keys configured, every route but `/health` needs
//! `Authorization: Bearer KEY` (Ollama's routes too).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::Response;

use crate::error::ApiError;
use crate::state::AppState;

/// Compares without stopping at the first differing byte, and with work
/// that depends only on what the client sent: the time taken says nothing
/// about how much of a key was right, nor how long the key is.
fn same_key(given: &[u8], key: &[u8]) -> bool {
    if key.is_empty() {
        return false;
    }
    let mut difference = given.len() ^ key.len();
    for (i, byte) in given.iter().enumerate() {
        difference |= usize::from(byte ^ key[i % key.len()]);
    }
    difference == 0
}

/// Which of the configured keys a request presented (its position), for
/// limits per key.
#[derive(Debug, Clone, Copy)]
pub(crate) struct KeyIndex(pub(crate) usize);

pub(crate) async fn require_key(
    State(state): State<Arc<AppState>>,
    mut request: Request,
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
            Some(token) => {
                // Every key is compared, so the time says nothing of which matched.
                let token = token.trim().as_bytes();
                let matched = keys.iter().enumerate().fold(None, |found, (i, k)| {
                    if same_key(token, k.as_bytes()) {
                        Some(i)
                    } else {
                        found
                    }
                });
                if let Some(index) = matched {
                    request.extensions_mut().insert(KeyIndex(index));
                    return next.run(request).await;
                }
                "the API key is not one this server accepts"
            }
            None => "the Authorization header must be `Bearer KEY`",
        },
    };
    ApiError::unauthorized(refusal).for_path(request.uri().path())
}

#[cfg(test)]
mod tests {
    use super::same_key;

    #[test]
    fn keys_compare_whole() {
        assert!(same_key(b"secret", b"secret"));
        assert!(!same_key(b"secret", b"secreT"));
        assert!(!same_key(b"secre", b"secret"));
        assert!(!same_key(b"secretsecret", b"secret"));
        assert!(!same_key(b"", b"secret"));
        assert!(!same_key(b"", b""));
    }
}
