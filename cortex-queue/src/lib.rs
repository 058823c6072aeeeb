//! The cortex job queue: the only crate that will use SQLite.
//!
//! Not built yet: this crate is an empty placeholder in the workspace so the
//! crate graph is fixed from the start. It exports nothing.

#![forbid(unsafe_code)]
