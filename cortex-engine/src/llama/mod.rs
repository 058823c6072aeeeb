//! llama.cpp: the model, the engine's backend over it, and the FFI
//! boundary (`sys`, the only code in cortex with `unsafe`).

mod backend;
mod chat;
mod model;
pub(crate) mod sys;

pub use backend::{ContextConfig, LlamaEngineBackend, MAX_STREAMS};
pub use model::{Model, chat_template_names};
pub(crate) use model::{Placement, resolve_chat_template};
