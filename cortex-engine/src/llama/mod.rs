//! llama.cpp: the model, the engine's backend over it, and the FFI
//! boundary (`sys`, the only code in cortex with `unsafe`).

mod backend;
mod chat;
mod model;
pub(crate) mod sys;

pub use backend::{ContextConfig, LlamaEngineBackend, MAX_STREAMS};
pub(crate) use model::resolve_chat_template;
pub use model::{Model, chat_template_names};
