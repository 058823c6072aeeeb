//! The fields that constrain what is generated: chat's `response_format`,
//! responses' `text.format` and the `grammar` extension, compiled at submit
//! into the GBNF grammar a request carries.

use serde_json::Value;

use super::{Fields, type_error};
use crate::Endpoint;

/// The fields that constrain the output on `endpoint`: OpenAI's
/// `response_format` (chat) and llama.cpp's `grammar` (GBNF) on both.
pub(super) fn constraint_fields(endpoint: Endpoint) -> &'static [&'static str] {
    match endpoint {
        Endpoint::ChatCompletions => &["response_format", "grammar"],
        Endpoint::Completions => &["grammar"],
        Endpoint::Responses => &["text", "grammar"],
        Endpoint::Embeddings => &[],
    }
}

/// The grammar every completion must match, if the line asks for one:
/// `response_format` (chat) or `text.format` (responses) `json_object` (any
/// JSON object) or `json_schema` (its schema compiled; `strict` or not, the
/// output always matches it), or a GBNF `grammar`. Whatever cannot be
/// compiled is refused here, at submit.
pub(super) fn grammar_of(fields: &Fields, endpoint: Endpoint) -> Result<Option<String>, String> {
    let grammar = match fields.get("grammar") {
        None | Some(Value::Null) => None,
        Some(Value::String(text)) => {
            cortex_grammar::check(text).map_err(|e| e.to_string())?;
            Some(text.clone())
        }
        Some(other) => return Err(type_error("grammar", "a GBNF grammar as a string", other)),
    };
    let compiled = match endpoint {
        Endpoint::ChatCompletions => match fields.get("response_format") {
            None | Some(Value::Null) => None,
            Some(Value::Object(format)) => format_grammar(format, "response_format", true)?,
            Some(other) => return Err(type_error("response_format", "an object", other)),
        },
        Endpoint::Responses => match fields.get("text") {
            None | Some(Value::Null) => None,
            Some(Value::Object(text)) => {
                only(&["format", "verbosity"], "text", text)?;
                match text.get("verbosity") {
                    None | Some(Value::Null) => {}
                    Some(v) if v == "medium" => {}
                    Some(other) => {
                        return Err(format!(
                            "text.verbosity = {other} is an OpenAI setting for its own models; a local model takes no such setting"
                        ));
                    }
                }
                match text.get("format") {
                    None | Some(Value::Null) => None,
                    Some(Value::Object(format)) => format_grammar(format, "text.format", false)?,
                    Some(other) => return Err(type_error("text.format", "an object", other)),
                }
            }
            Some(other) => return Err(type_error("text", "an object", other)),
        },
        Endpoint::Completions | Endpoint::Embeddings => None,
    };
    match (compiled, grammar) {
        (Some(_), Some(_)) => Err("give a JSON format or a grammar, not both".into()),
        (compiled, grammar) => Ok(compiled.or(grammar)),
    }
}

/// Refuses members of `object` (at `at`) other than `allowed`.
pub(super) fn only(allowed: &[&str], at: &str, object: &Fields) -> Result<(), String> {
    match object.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(key) => Err(format!("{at} has unknown field {key:?}")),
        None => Ok(()),
    }
}

/// A `{"type": "text" | "json_object" | "json_schema", ...}` format at `at`:
/// chat nests the schema's `name`, `schema`, `strict` and `description`
/// under `json_schema`; responses put them beside `type`.
fn format_grammar(format: &Fields, at: &str, nested: bool) -> Result<Option<String>, String> {
    const SPEC: [&str; 4] = ["name", "schema", "strict", "description"];
    match format.get("type").and_then(Value::as_str) {
        Some("text") => {
            only(&["type"], at, format)?;
            Ok(None)
        }
        Some("json_object") => {
            only(&["type"], at, format)?;
            Ok(Some(cortex_grammar::json_object()))
        }
        Some("json_schema") => {
            let (spec, spec_at) = if nested {
                only(&["type", "json_schema"], at, format)?;
                let spec_at = format!("{at}.json_schema");
                match format.get("json_schema") {
                    Some(Value::Object(spec)) => (spec, spec_at),
                    None => return Err(format!("{spec_at} is missing")),
                    Some(other) => return Err(type_error(&spec_at, "an object", other)),
                }
            } else {
                let allowed: Vec<&str> = SPEC.iter().copied().chain(["type"]).collect();
                only(&allowed, at, format)?;
                (format, at.to_owned())
            };
            if nested {
                only(&SPEC, &spec_at, spec)?;
            }
            match spec.get("strict") {
                None | Some(Value::Null | Value::Bool(_)) => {}
                Some(other) => {
                    return Err(type_error(
                        &format!("{spec_at}.strict"),
                        "true or false",
                        other,
                    ));
                }
            }
            // OpenAI's default when no schema is given: any JSON object.
            let schema = spec.get("schema").cloned().unwrap_or(Value::Bool(true));
            if schema == Value::Bool(true) {
                return Ok(Some(cortex_grammar::json_object()));
            }
            cortex_grammar::from_json_schema(&schema)
                .map(Some)
                .map_err(|e| format!("{spec_at}: {e}"))
        }
        Some(other) => Err(format!(
            "{at}.type {other:?} is not one of text, json_object, json_schema"
        )),
        None => Err(format!("{at} has no type")),
    }
}
