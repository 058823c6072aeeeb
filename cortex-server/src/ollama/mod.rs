//! Ollama's API on the loaded models: generation (`generate`; a chat's
//! messages, tools and thinking in `chat_shape`), model management on the
//! registry (`manage`), embeddings (`embed`), and what they share
//! (`shape`: errors as `{"error": "..."}`, options, times).

mod chat_shape;
mod embed;
mod generate;
mod manage;
mod shape;

pub(crate) use embed::{embed, embeddings};
pub(crate) use generate::{chat, generate};
pub(crate) use manage::{
    copy, create, delete, has_blob, ps, pull, show, tags, upload_blob, version,
};

/// Where Ollama's client uploads a GGUF before creating a model from it.
pub(crate) const BLOBS_ROUTE: &str = "/api/blobs/{digest}";
/// The same, as paths start.
pub(crate) const BLOBS_PREFIX: &str = "/api/blobs/";
