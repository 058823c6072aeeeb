//! Constraints on what a model may generate, as GBNF grammars (llama.cpp's
//! format, which its grammar sampler enforces token by token).
//!
//! - [`from_json_schema`] compiles a JSON Schema (OpenAI's structured-output
//!   subset and more: objects, arrays, enums, `const`, `anyOf`, `$ref`,
//!   string lengths and formats, item counts) into a grammar whose every
//!   complete match is a JSON document valid against the schema. What the
//!   grammar cannot enforce (`pattern`, numeric ranges, ...) is refused with
//!   the schema path and the keyword, never silently dropped.
//! - [`json_object`] is the grammar of any JSON object (`response_format:
//!   json_object`).
//! - [`check`] parses a hand-written grammar as llama.cpp would and reports
//!   the first problem (syntax, an undefined rule, no `root`, left
//!   recursion) with its line, so a bad grammar is refused when it is
//!   submitted rather than when it is generated.
//!
//! The crate does no I/O and knows nothing of llama.cpp.
//!
//! # Example
//!
//! ```
//! use serde_json::json;
//!
//! let schema = json!({
//!     "type": "object",
//!     "properties": {
//!         "name": {"type": "string"},
//!         "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}
//!     },
//!     "required": ["name", "tags"],
//!     "additionalProperties": false
//! });
//! let grammar = cortex_grammar::from_json_schema(&schema).unwrap();
//! assert!(grammar.starts_with("root ::= "));
//! cortex_grammar::check(&grammar).unwrap();
//!
//! let error = cortex_grammar::from_json_schema(&json!({
//!     "type": "object",
//!     "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}}
//! }))
//! .unwrap_err();
//! assert_eq!(error.to_string(), "schema at properties.zip: pattern is not supported (a regular expression constraint)");
//!
//! let error = cortex_grammar::check("root ::= greeting\n").unwrap_err();
//! assert_eq!(error.to_string(), "grammar line 1: rule greeting is used but not defined");
//! ```
//!
//! # Design notes
//!
//! JSON Schema → GBNF (`from_json_schema`: objects with properties in declared
//! order, optional ones as chains, arrays with item bounds and tuples, enums,
//! `const`, `anyOf`/`oneOf`, local `$ref`s including recursive ones, string
//! lengths, date/time/uuid formats, integer lower bounds 0 and 1), the grammar
//! of any JSON object (`json_object`), and `check`, a GBNF checker that follows
//! llama.cpp's parser (syntax, undefined rules, `root`, left recursion) so a bad
//! grammar is a submit-time error with its line. Keywords a grammar cannot
//! enforce (`pattern`, numeric ranges, `allOf`, ...) are refused with the schema
//! path. No I/O, no llama.cpp.
//!
//! A grammar comes from a client, and llama.cpp's grammar code recurses (its
//! parser once per group level, its left-recursion check along chains of rules)
//! and keeps one parse stack per way the grammar can go on, checking each
//! against every token. So `check` lowers the text into the rules llama.cpp
//! builds (`gbnf/parse.rs`: a group is a rule, a repetition a chain of rules,
//! numbered as llama.cpp numbers them) and measures, without recursion
//! (`gbnf/analysis.rs`): left recursion (a depth-first search with its own
//! stack), the longest chain of rules entered before any text, the rules
//! entered from any one point, llama.cpp's left-recursion steps, and the ways
//! to go on at any point. Each has a limit in `limits.rs`, chosen from measured
//! costs (a masked token ≈ 0.14 ms per way on a 49,152-token vocabulary; a
//! load ≈ 0.3 µs per element). The schema compiler is bounded the same way
//! (depth counting `$ref` hops, node count, counts within llama.cpp's
//! repetition limit), writes enums as prefix trees (the ways at a point are the
//! distinct next characters), shares identical rules, and runs `check` on what
//! it produced.

#![forbid(unsafe_code)]

mod gbnf;
pub mod limits;
mod schema;
// Hostile inputs for the tests here and in `tests/`: behind the
// `test-support` feature, not part of the API.
#[cfg(any(test, feature = "test-support"))]
pub mod testing;

pub use gbnf::{GrammarError, check};
pub use schema::{Part, SchemaError, from_json_schema, json_object, sequence};
