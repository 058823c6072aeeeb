//! llama.cpp: its backend modules and devices, the model, the engine's
//! backend over it, and the FFI boundary (`sys`, the only code in cortex
//! with `unsafe`).

mod backend;
mod chat;
pub(crate) mod devices;
mod model;
pub(crate) mod sys;

pub(crate) use backend::{ContextConfig, LlamaEngineBackend};
pub use devices::{
    Backends, CpuKernels, Device, DeviceChoice, DeviceKind, GpuLayers, LoadedModule, devices,
    load_backends,
};
pub use model::Model;
pub(crate) use model::chat_template_names;
pub(crate) use model::{Placement, resolve_chat_template};
