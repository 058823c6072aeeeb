//! Errors as OpenAI's error object with the right status: every refusal
//! names what was wrong; nothing a client sends makes the server panic.
//! And [`ServerError`]: why the server could not run.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use cortex_engine::EngineError;
use std::net::SocketAddr;

/// An HTTP error in OpenAI's shape (`{"error": {"message", "type", "param", "code"}}`).
#[derive(Debug, Clone)]
pub(crate) struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) message: String,
    pub(crate) kind: &'static str,
    pub(crate) param: Option<String>,
    pub(crate) code: Option<&'static str>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
        }
    }

    pub(crate) fn invalid(message: impl Into<String>, param: Option<String>) -> Self {
        Self {
            param,
            ..Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
        }
    }

    pub(crate) fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "invalid_request_error", message)
    }

    pub(crate) fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "invalid_request_error", message)
    }

    pub(crate) fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    pub(crate) fn unauthorized(message: impl Into<String>) -> Self {
        Self {
            code: Some("invalid_api_key"),
            ..Self::new(StatusCode::UNAUTHORIZED, "invalid_request_error", message)
        }
    }

    /// Over an admission limit: the client should try again later.
    pub(crate) fn too_many_requests(message: impl Into<String>) -> Self {
        Self {
            code: Some("rate_limit_exceeded"),
            ..Self::new(StatusCode::TOO_MANY_REQUESTS, "requests", message)
        }
    }

    /// Refused before the body was read (wrong type of body, a host or
    /// origin not allowed).
    pub(crate) fn refused(status: StatusCode, message: impl Into<String>) -> Self {
        Self::new(status, "invalid_request_error", message)
    }

    /// The answer for a request to `path`: Ollama's shape
    /// (`{"error": "..."}`) on its routes, OpenAI's elsewhere.
    pub(crate) fn for_path(self, path: &str) -> Response {
        if path.starts_with("/api/") {
            if self.status.is_server_error() {
                tracing::warn!(status = %self.status, message = %self.message, "request failed");
            }
            return (
                self.status,
                Json(serde_json::json!({ "error": self.message })),
            )
                .into_response();
        }
        self.into_response()
    }

    /// A model nobody has: the registry's message, which lists what is installed.
    pub(crate) fn model_not_found(message: &str) -> Self {
        Self {
            code: Some("model_not_found"),
            param: Some("model".into()),
            ..Self::not_found(message)
        }
    }

    /// No room to load a model now (the loaded ones are answering requests).
    pub(crate) fn unavailable(message: impl Into<String>) -> Self {
        Self {
            code: Some("model_busy"),
            ..Self::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message)
        }
    }

    /// A model larger than the whole model memory budget.
    pub(crate) fn insufficient_storage(message: impl Into<String>) -> Self {
        Self {
            code: Some("model_too_large"),
            ..Self::new(StatusCode::INSUFFICIENT_STORAGE, "server_error", message)
        }
    }

    /// A body axum could not read (too large, not readable).
    pub(crate) fn body(status: StatusCode, limit: usize, detail: String) -> Self {
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            return Self {
                code: Some("request_too_large"),
                ..Self::new(
                    status,
                    "invalid_request_error",
                    format!("the request body is over the size limit of {limit} bytes"),
                )
            };
        }
        Self::new(status, "invalid_request_error", detail)
    }

    /// An upload that would take its project over its quota of stored files.
    pub(crate) fn quota(message: String) -> Self {
        Self {
            code: Some("quota_exceeded"),
            ..Self::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                message,
            )
        }
    }

    /// What an engine refusal or failure means to a client.
    pub(crate) fn engine(error: &EngineError) -> Self {
        let message = error.to_string();
        match error {
            EngineError::PromptTooLong { .. } => Self {
                code: Some("context_length_exceeded"),
                ..Self::invalid(message, None)
            },
            EngineError::Invalid { field, .. } => Self::invalid(message, Some(field.clone())),
            EngineError::Stopped | EngineError::Died(_) => {
                Self::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message)
            }
            _ => Self::internal(message),
        }
    }

    pub(crate) fn body_json(&self) -> serde_json::Value {
        cortex_openai::error_body(&self.message, self.kind, self.param.as_deref(), self.code)
    }
}

/// What the model pool refuses, as HTTP: a model nobody has is a 404, one
/// over the whole memory budget a 507, no room now a 503, one whose chat
/// template fails (a client's `/api/create` may make one) a 400.
impl From<crate::pool::PoolError> for ApiError {
    fn from(error: crate::pool::PoolError) -> Self {
        use crate::pool::PoolError;
        let message = error.to_string();
        match error {
            PoolError::NotFound(_) => Self::model_not_found(&message),
            PoolError::TooLarge { .. } => Self::insufficient_storage(message),
            PoolError::Busy { .. } => Self::unavailable(message),
            PoolError::Load {
                source: EngineError::ChatTemplate(_),
                ..
            } => Self::invalid(message, Some("model".into())),
            PoolError::Registry { .. } | PoolError::Load { .. } => Self::internal(message),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::warn!(status = %self.status, message = %self.message, "request failed");
        }
        (self.status, Json(self.body_json())).into_response()
    }
}

/// Why the server could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// The address could not be bound.
    #[error("cannot listen on {address}: {source}")]
    Bind {
        /// The address.
        address: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The queue could not be opened.
    #[error(transparent)]
    Queue(#[from] cortex_queue::QueueError),
    /// Another I/O failure (the runtime, the files directory).
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// Why it failed.
        source: std::io::Error,
    },
}
