//! Property-based fuzzing of what a client hands this crate: GBNF text
//! built from grammar tokens and arbitrary characters, and JSON values
//! built from JSON Schema keywords. Whatever comes in, the checker and the
//! converter answer (no panic, no stack overflow), a refusal says what is
//! wrong, and every grammar the converter makes passes the checker.

use cortex_grammar::{check, from_json_schema};
use proptest::prelude::*;
use serde_json::{Map, Value};

/// Pieces of GBNF, and a few characters that are not.
const TOKENS: &[&str] = &[
    "root",
    " ::= ",
    "r1",
    "r2",
    " ",
    "\n",
    "\"a\"",
    "\"\\\"\"",
    "\"\\u00e9\"",
    "(",
    ")",
    "|",
    "*",
    "+",
    "?",
    "{2}",
    "{1,3}",
    "{0,}",
    "{99999}",
    "[a-z]",
    "[^\\n]",
    "[",
    "]",
    "\"",
    "\\",
    "#c\n",
    ".",
    "r1 ::= ",
    "\nr2 ::= ",
    "ws",
    "é",
    "\u{0}",
];

fn gbnf() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            4 => prop::sample::select(TOKENS).prop_map(str::to_owned),
            1 => any::<char>().prop_map(String::from),
        ],
        0..80,
    )
    .prop_map(|pieces| pieces.concat())
}

/// Schema keywords and type names, and other keys.
const KEYS: &[&str] = &[
    "type",
    "properties",
    "required",
    "items",
    "prefixItems",
    "enum",
    "const",
    "anyOf",
    "oneOf",
    "allOf",
    "$ref",
    "$defs",
    "definitions",
    "additionalProperties",
    "minItems",
    "maxItems",
    "minLength",
    "maxLength",
    "pattern",
    "format",
    "minimum",
    "maximum",
    "x",
    "y",
];
const WORDS: &[&str] = &[
    "object",
    "array",
    "string",
    "integer",
    "number",
    "boolean",
    "null",
    "#",
    "#/$defs/x",
    "#/definitions/y",
    "#/properties/x",
    "date",
    "uuid",
    "^a+$",
    "x",
    "y",
];

fn json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        (-5_i64..50).prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        prop::sample::select(WORDS).prop_map(Value::from),
        ".{0,8}".prop_map(Value::from),
    ];
    leaf.prop_recursive(12, 200, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((prop::sample::select(KEYS), inner), 0..6).prop_map(|fields| {
                Value::Object(
                    fields
                        .into_iter()
                        .map(|(k, v)| (k.to_owned(), v))
                        .collect::<Map<_, _>>(),
                )
            }),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn any_grammar_text_is_checked_or_refused_with_a_reason(text in gbnf()) {
        if let Err(error) = check(&text) {
            prop_assert!(!error.message.is_empty());
            prop_assert!(error.line >= 1);
        }
    }

    #[test]
    fn any_json_is_converted_to_a_valid_grammar_or_refused_with_a_reason(schema in json()) {
        match from_json_schema(&schema) {
            Ok(grammar) => {
                let checked = check(&grammar);
                prop_assert!(checked.is_ok(), "{schema} gave a grammar the checker refuses: {checked:?}\n{grammar}");
            }
            Err(error) => prop_assert!(!error.to_string().is_empty()),
        }
    }
}
