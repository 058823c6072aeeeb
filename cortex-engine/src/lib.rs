//! The cortex engine: the only crate that will talk to llama.cpp.
//!
//! Not built yet: this crate is an empty placeholder in the workspace so the
//! crate graph is fixed from the start. It exports nothing.

#![forbid(unsafe_code)]
