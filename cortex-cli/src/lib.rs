//! The `cortex` command-line tool.
//!
//! Not built yet: this crate is an empty placeholder in the workspace so the
//! crate graph is fixed from the start. It exports nothing.

#![forbid(unsafe_code)]
