//! The model registry: which GGUF a name means, where its bytes are, and
//! what it says about itself.
//!
//! - [`Registry`]: names (`name[:tag]`, [`ModelName`]) pointing at
//!   content-addressed blobs, one manifest per name, as Ollama keeps models;
//!   known models ([`KNOWN_MODELS`]) are fetched from their Python packages on
//!   first use, local GGUFs are added under a name or found in model
//!   directories, names are copied and removed (a blob stays while a name uses it).
//! - [`Modelfile`]: the subset of Ollama's (`FROM`, `SYSTEM`, `TEMPLATE`,
//!   `PARAMETER`) that sets a model's [`ModelSettings`].
//! - [`read_gguf`] checks a GGUF's header before anything loads it;
//!   [`ModelDetails`] gives its family, size, quantization and lengths.
//!
//! No llama.cpp here: the registry is plain files, so any tool can list and
//! manage models without building an engine.
//!
//! # Example
//!
//! ```no_run
//! use cortex_models::Registry;
//!
//! let registry = Registry::default_location();
//! let model = registry.resolve("smollm2-135m")?; // fetched once, then reused
//! println!("{} is {} ({} bytes)", model.name, model.path.display(), model.size);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![forbid(unsafe_code)]

mod details;
mod gguf;
mod modelfile;
mod name;
mod packages;
mod registry;

pub use details::{ModelDetails, model_info, parameter_size};
pub use gguf::{GgufError, GgufInfo, GgufValue, read_gguf};
pub use modelfile::{
    MAX_MODELFILE_BYTES, ModelSettings, Modelfile, ModelfileError, Parameter, ParameterValue,
};
pub use name::{DEFAULT_TAG, ModelName, NameError, is_path};
pub use packages::{
    DEFAULT_MODEL, GEMMA3_270M, KNOWN_MODELS, ModelCache, ModelError, ModelSpec, PackagedFile,
    PullProgress, file_sha256, verify_file,
};
pub use registry::{
    BlobWriter, Listing, ModelEntry, Origin, Registry, RegistryError, Removed, parse_digest,
};
