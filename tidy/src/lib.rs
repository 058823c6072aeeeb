//! The workspace's structural rules (ARCHITECTURE.md: layers, confined
//! dependencies, FFI and JSON shapes in their crates, documents and their
//! links), checked by `tests/tidy/` from `cargo metadata` and the
//! sources, in the manner of rust-analyzer's tidy. A default member that
//! depends on no crate of the workspace, so that a plain `cargo test` runs
//! it.

#![forbid(unsafe_code)]
