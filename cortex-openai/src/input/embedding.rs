//! `/v1/embeddings` bodies: `input` as a string, an array of strings, an
//! array of token ids or an array of arrays of token ids; `encoding_format`
//! float or base64; `dimensions` refused (a GGUF's embeddings have its own size).

use cortex_request::{EmbeddingRequest, Prompt, RequestId};
use serde_json::Value;

use super::{Fields, token_id, type_error};

/// What an embeddings body asks for: the request, the `model` it named and
/// whether the vectors are wanted as base64.
pub(super) struct EmbeddingLine {
    pub(super) request: EmbeddingRequest,
    pub(super) model: Option<String>,
    pub(super) base64: bool,
}

/// Reads an embeddings body.
pub(super) fn embedding_from(fields: &Fields) -> Result<EmbeddingLine, String> {
    for (key, value) in fields {
        match key.as_str() {
            "input" | "model" | "encoding_format" => {}
            // OpenAI's abuse-monitoring id: changes nothing here.
            "user" => {}
            "dimensions" => {
                return Err(format!(
                    "dimensions = {value} is an OpenAI field cortex does not support: a GGUF's embeddings have the model's own size (shortening them needs a model trained for it)"
                ));
            }
            _ => return Err(format!("unknown field {key:?}")),
        }
    }
    let inputs = match fields.get("input") {
        None | Some(Value::Null) => return Err("missing input".into()),
        Some(value) => inputs_of(value)?,
    };
    let model = match fields.get("model") {
        None | Some(Value::Null) => None,
        Some(Value::String(m)) => Some(m.clone()),
        Some(other) => return Err(type_error("model", "a string", other)),
    };
    let base64 = match fields.get("encoding_format") {
        None | Some(Value::Null) => false,
        Some(Value::String(f)) if f == "float" => false,
        Some(Value::String(f)) if f == "base64" => true,
        Some(other) => {
            return Err(type_error(
                "encoding_format",
                "\"float\" or \"base64\"",
                other,
            ));
        }
    };
    let request = EmbeddingRequest::new(RequestId(0), inputs);
    request.validate().map_err(|e| e.to_string())?;
    Ok(EmbeddingLine {
        request,
        model,
        base64,
    })
}

/// `input` in any of its four shapes.
fn inputs_of(value: &Value) -> Result<Vec<Prompt>, String> {
    let tokens = |items: &[Value], field: &str| -> Result<Prompt, String> {
        items
            .iter()
            .enumerate()
            .map(|(i, v)| token_id(v, &format!("{field}[{i}]")))
            .collect::<Result<Vec<_>, _>>()
            .map(Prompt::Tokens)
    };
    match value {
        Value::String(text) => Ok(vec![Prompt::Text(text.clone())]),
        Value::Array(items) if items.first().is_some_and(Value::is_number) => {
            Ok(vec![tokens(items, "input")?])
        }
        Value::Array(items) => items
            .iter()
            .enumerate()
            .map(|(i, item)| match item {
                Value::String(text) => Ok(Prompt::Text(text.clone())),
                Value::Array(ids) => tokens(ids, &format!("input[{i}]")),
                other => Err(type_error(
                    &format!("input[{i}]"),
                    "a string or an array of token ids",
                    other,
                )),
            })
            .collect(),
        other => Err(type_error(
            "input",
            "a string, an array of strings or an array of token ids",
            other,
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: &str) -> Result<EmbeddingLine, String> {
        let Value::Object(fields) = serde_json::from_str(body).unwrap() else {
            unreachable!()
        };
        embedding_from(&fields)
    }

    #[test]
    fn every_input_shape() {
        let one = parse(r#"{"input": "hello", "model": "m"}"#).unwrap();
        assert_eq!(one.request.inputs, vec![Prompt::Text("hello".into())]);
        assert_eq!((one.model.as_deref(), one.base64), (Some("m"), false));
        let many = parse(r#"{"input": ["a", [1, 2]], "encoding_format": "base64"}"#).unwrap();
        assert_eq!(
            many.request.inputs,
            vec![Prompt::Text("a".into()), Prompt::Tokens(vec![1, 2])]
        );
        assert!(many.base64);
        let ids = parse(r#"{"input": [5, 6, 7]}"#).unwrap();
        assert_eq!(ids.request.inputs, vec![Prompt::Tokens(vec![5, 6, 7])]);
    }

    #[test]
    fn refusals_name_the_field() {
        let error = |body: &str| parse(body).err().unwrap();
        assert!(
            error(r#"{"input": "a", "dimensions": 64}"#)
                .starts_with("dimensions = 64 is an OpenAI field cortex does not support")
        );
        assert_eq!(error(r#"{"input": ""}"#), "input[0] is empty");
        assert_eq!(
            error(r#"{"input": []}"#),
            "input is empty: give at least one text"
        );
        assert_eq!(error(r#"{"model": "m"}"#), "missing input");
        assert_eq!(
            error(r#"{"input": "a", "encoding_format": "int8"}"#),
            "encoding_format must be \"float\" or \"base64\", not \"int8\""
        );
        assert_eq!(
            error(r#"{"input": ["a", {"x": 1}]}"#),
            "input[1] must be a string or an array of token ids, not {\"x\":1}"
        );
        assert_eq!(
            error(r#"{"input": [[1, -2]]}"#),
            "input[0][1] must be a token id (a non-negative integer), not -2"
        );
        assert_eq!(
            error(r#"{"input": "a", "temperature": 1}"#),
            "unknown field \"temperature\""
        );
    }
}
