//! The cortex engine: continuous batching on llama.cpp.
//!
//! This is the only crate that talks to llama.cpp (through `llama-cpp-sys-2`,
//! bound in one module, `llama::sys`). An
//! [`Engine`] runs its step loop on a thread of its own and is driven over
//! channels: submit a [`cortex_request::Request`] and receive its
//! [`EngineEvent`]s (tokens with UTF-8-safe text deltas, then `Finished` with
//! completions, usage and timings, or `Failed`); cancel at any time; read
//! [`EngineStats`]; shut down draining or aborting.
//!
//! Each step takes a plan from `cortex-sched`, builds one llama batch mixing
//! prompt chunks and decode tokens (logits only where a token is sampled),
//! decodes, samples every row with `cortex-sample` in parallel, applies stop
//! conditions (EOS, max tokens, stop ids, stop strings held back until they
//! can no longer form) and streams the text. Every running sequence has a KV
//! stream of its own (llama.cpp's non-unified KV), so a token attends only to
//! its own sequence and large batches stay fast; streams are sized from the
//! requests and grow when a longer one arrives. `cortex-kv`'s block
//! accounting decides what is shared: a prompt prefix is computed once and a
//! new sequence gets it by taking over the finished stream that holds it or by
//! a whole-stream copy (milliseconds, where recomputing costs seconds). A
//! [`Backend`] trait separates the loop from llama.cpp so failures can be
//! injected in tests; [`Engine::health`] reports a loop that died.
//!
//! Models come from `cortex-models` (the registry, and the default model,
//! SmolLM2-135M-Instruct Q4_1, fetched from its Python package); the engine
//! checks any GGUF with `cortex_models::read_gguf` before llama.cpp sees it,
//! so a missing, foreign or truncated file is a clear error naming the path.
//!
//! # Example
//!
//! ```
//! use cortex_engine::{Engine, EngineConfig, EngineEvent};
//! use cortex_models::{DEFAULT_MODEL, ModelCache};
//! use cortex_request::{Request, RequestId, SamplingParams};
//!
//! let model = ModelCache::default_location().ensure(&DEFAULT_MODEL)?; // fetched once
//! let engine = Engine::start(&EngineConfig::new(model))?;
//!
//! let mut request = Request::new(RequestId(1), "The capital of France is");
//! request.sampling = SamplingParams::greedy();
//! request.stop.max_tokens = 8;
//! for event in engine.submit(request)?.iter() {
//!     match event {
//!         EngineEvent::Token { text, .. } => print!("{text}"),
//!         EngineEvent::Finished(response) => {
//!             assert_eq!(response.usage.completion_tokens, 8);
//!             break;
//!         }
//!         EngineEvent::Failed { error, .. } => panic!("{error}"),
//!         _ => {}
//!     }
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

// The FFI boundary (`llama::sys`) is the only module allowed `unsafe`.
#![deny(unsafe_code)]

/// Index of the largest logit (the greedy choice), as `cortex-sample` picks it.
pub(crate) fn argmax_row(logits: &[f32]) -> cortex_request::TokenId {
    cortex_sample::argmax(logits)
}

mod backend;
pub mod bench;
mod config;
mod engine;
mod error;
mod events;
mod llama;
mod protocol;
mod step;
mod streams;
mod system;
mod text;

pub use backend::{
    Backend, BackendError, BatchToken, EMBED_SEQUENCES, KvLayout, StreamId, TokenGrammar,
};
pub use config::EngineConfig;
pub use engine::Engine;
pub use error::EngineError;
pub use events::{EngineEvent, EngineStats, StepObserver, StepRecord};
pub use llama::{
    Backends, ContextConfig, CpuKernels, Device, DeviceChoice, DeviceKind, GpuLayers,
    LlamaEngineBackend, LoadedModule, MAX_STREAMS, Model, chat_template_names, devices,
    load_backends,
};
pub use protocol::{
    EngineHealth, EngineInfo, EventReceiver, EventSender, Events, Shutdown, event_channel,
};
