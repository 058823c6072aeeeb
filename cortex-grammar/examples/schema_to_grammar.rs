//! A JSON Schema turned into the GBNF grammar that holds generation to it,
//! checked as the engine checks every grammar before llama.cpp sees it.
//!
//! ```text
//! cargo run -p cortex-grammar --example schema_to_grammar [SCHEMA.json]
//! ```
//!
//! Without a file, a schema of a person (name, age, city) is used.

use std::process::ExitCode;

#[cfg_attr(test, allow(dead_code))]
fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match grammar_of(args.first().map(String::as_str)) {
        Ok(grammar) => {
            print!("{grammar}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("schema_to_grammar: {error}");
            ExitCode::FAILURE
        }
    }
}

/// The grammar of the schema in the file at `path` (the person schema
/// when none).
fn grammar_of(path: Option<&str>) -> Result<String, Box<dyn std::error::Error>> {
    let schema: serde_json::Value = match path {
        Some(path) => serde_json::from_str(&std::fs::read_to_string(path)?)?,
        None => serde_json::json!({
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 40},
                "age": {"type": "integer", "minimum": 0},
                "city": {"type": "string"}
            },
            "required": ["name", "age", "city"],
            "additionalProperties": false
        }),
    };
    let grammar = cortex_grammar::from_json_schema(&schema)?;
    cortex_grammar::check(&grammar)?;
    Ok(grammar)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_person_schema_becomes_a_grammar_that_checks() {
        let grammar = super::grammar_of(None).unwrap();
        assert!(grammar.starts_with("root ::= "), "{grammar}");
        assert!(grammar.contains("\\\"city\\\""), "{grammar}");
    }
}
