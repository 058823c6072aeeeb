//! End-to-end tests of cortex across crates and processes live in `tests/`.
//!
//! The end-to-end suite arrives with the CLI; this crate has no library code.

#![forbid(unsafe_code)]
