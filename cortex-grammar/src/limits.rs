//! The bounds that keep the work a grammar or a schema causes small, here
//! and in llama.cpp.
//!
//! A grammar arrives from a client, so everything it makes a machine do must
//! have a bound: this crate's own checks are iterative and linear, and a
//! grammar they accept is one llama.cpp loads and runs in bounded time and
//! stack (its grammar parser and its left-recursion check recurse, and the
//! number of parse stacks it keeps multiplies with ambiguity). Each limit
//! below is named in the error that refuses it.

/// Longest grammar text, in bytes.
pub const MAX_GRAMMAR_BYTES: usize = 256 * 1024;

/// Deepest nesting of parenthesised groups (llama.cpp's parser recurses
/// once per level).
pub const MAX_GROUP_NESTING: usize = 64;

/// Most grammar elements once llama.cpp has expanded repetitions (each
/// repetition copies what it repeats; every completion with the grammar
/// holds a copy of them all, 8 bytes each). Loading costs about 0.3 µs an
/// element here, so this is about 40 ms.
pub const MAX_GRAMMAR_ELEMENTS: usize = 1 << 17;

/// llama.cpp's own limit on repetition counts (`{m,n}`) and on a repetition
/// of a group multiplied by the repetitions inside it.
pub const MAX_REPETITIONS: u64 = 2000;

/// Longest chain of rules that can be entered before any text is matched
/// (llama.cpp's left-recursion check recurses along it).
pub const MAX_LEFT_CHAIN: usize = 1024;

/// Most rules llama.cpp may enter from one point before it reaches text
/// (each a parse stack it builds, after every character taken: rules that
/// can match nothing and branch multiply them). About 2.5 ms here.
pub const MAX_RULES_ENTERED: u64 = 4096;

/// Most steps llama.cpp's left-recursion check may take when it loads the
/// grammar: it walks every path of rules entered before any text, from each
/// rule not yet walked, without remembering the ones it walked.
pub const MAX_LEFT_PATHS: u64 = 1_000_000;

/// Most ways a grammar may go on at one point (llama.cpp's parse stacks:
/// a masked token costs about 0.14 ms for each on a 49,152-token
/// vocabulary, so this is about 35 ms).
pub const MAX_WAYS_AT_ONCE: u64 = 256;

/// Most values of one JSON-schema `enum` (compiled as a prefix tree, so
/// that the ways at any point are the distinct next characters).
pub const MAX_ENUM_VALUES: usize = 4096;

/// Deepest nesting of a JSON schema, counting each `$ref` followed as a
/// level.
pub const MAX_SCHEMA_DEPTH: usize = 64;

/// Most schema nodes (objects and booleans) one schema may have, counting a
/// node again each time a `$ref` leads to it for the first time.
pub const MAX_SCHEMA_NODES: usize = 10_000;
