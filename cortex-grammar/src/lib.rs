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

#![forbid(unsafe_code)]

mod gbnf;
pub mod limits;
mod schema;
// Hostile inputs for the tests here and in `tests/` (hidden: not API).
#[doc(hidden)]
pub mod testing;

pub use gbnf::{GrammarError, check};
pub use schema::{SchemaError, from_json_schema, json_object};
