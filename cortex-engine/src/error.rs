//! Why a request or the engine failed.

use std::path::PathBuf;

use cortex_request::{RequestId, ValidationError};

use cortex_models::{GgufError, ModelError};

use crate::ExecutorError;

/// Why the engine or one of its requests failed.
///
/// It is `Clone` and `Eq` because one failure is sent to every request it
/// ends; so errors that are neither (I/O, the GGUF reader's) are kept as
/// their messages.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// The model file could not be used.
    #[error("{0}")]
    Model(String),
    /// llama.cpp refused the file or the context settings.
    #[error("{path}: llama.cpp could not load it: {detail}")]
    Load {
        /// The model file.
        path: PathBuf,
        /// What failed.
        detail: String,
    },
    /// The model's chat template (its GGUF's, its registry entry's, or the
    /// one configured) does not compile or render a chat: the model's
    /// settings are at fault, not the machine.
    #[error("{0}")]
    ChatTemplate(String),
    /// The request is invalid.
    #[error("request {id}: invalid {field}: {message}")]
    Invalid {
        /// The request.
        id: RequestId,
        /// The offending field.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// The prompt does not fit the context (not retryable).
    #[error("request {id}: the prompt has {prompt_tokens} tokens; the context holds {limit}")]
    PromptTooLong {
        /// The request.
        id: RequestId,
        /// Prompt length after templating.
        prompt_tokens: usize,
        /// Most tokens a sequence may have.
        limit: usize,
    },
    /// The same id is already in the engine.
    #[error("request {0} is already in the engine")]
    DuplicateId(RequestId),
    /// The executor failed on a batch containing this request.
    #[error("request {id}: executor error: {source}")]
    Executor {
        /// The request.
        id: RequestId,
        /// What the executor said.
        source: ExecutorError,
    },
    /// No progress for longer than the configured timeout.
    #[error("request {id}: no progress for {seconds} s")]
    Timeout {
        /// The request.
        id: RequestId,
        /// How long it made no progress, in whole seconds.
        seconds: u64,
    },
    /// The engine is shutting down or gone.
    #[error("the engine has stopped")]
    Stopped,
    /// The engine's step loop died (a panic inside it or in llama.cpp's
    /// bindings); every request it held fails with this.
    #[error("the engine died: {0}")]
    Died(String),
}

impl EngineError {
    /// Whether retrying the same request could succeed (executor hiccups,
    /// timeouts) as opposed to failing the same way again.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            EngineError::Executor { .. }
                | EngineError::Timeout { .. }
                | EngineError::Stopped
                | EngineError::Died(_)
        )
    }

    /// A short machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            EngineError::Model(_) | EngineError::Load { .. } | EngineError::ChatTemplate(_) => {
                "model_error"
            }
            EngineError::Invalid { .. } => "invalid_request",
            EngineError::PromptTooLong { .. } => "context_length_exceeded",
            EngineError::DuplicateId(_) => "duplicate_id",
            // (Was `backend_error`; error files written before say so.)
            EngineError::Executor { .. } => "executor_error",
            EngineError::Timeout { .. } => "timeout",
            EngineError::Stopped => "engine_stopped",
            EngineError::Died(_) => "engine_died",
        }
    }

    pub(crate) fn invalid(id: RequestId, error: &ValidationError) -> Self {
        EngineError::Invalid {
            id,
            field: error.field(),
            message: error.to_string(),
        }
    }

    pub(crate) fn executor(id: RequestId, error: &ExecutorError) -> Self {
        EngineError::Executor {
            id,
            source: error.clone(),
        }
    }
}

impl From<ModelError> for EngineError {
    fn from(e: ModelError) -> Self {
        EngineError::Model(e.to_string())
    }
}

impl From<GgufError> for EngineError {
    fn from(e: GgufError) -> Self {
        EngineError::Model(e.to_string())
    }
}
