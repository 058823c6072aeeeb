//! `/openapi.json`: the OpenAPI 3.1 description of every route, OpenAI's
//! from the wire-format crate and the server's own (Ollama's, `/health`,
//! `/metrics`, this one) from `openapi.json` beside this file, put
//! together once, when the server starts, with the served model's name.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// Where the document is served.
pub(crate) const ROUTE: &str = "/openapi.json";

/// The whole document, for a server of `model`.
pub(crate) fn document(model: &str) -> Value {
    let mut document = cortex_openai::openapi_document();
    let own: Value =
        serde_json::from_str(include_str!("openapi.json")).expect("openapi.json is JSON");
    let sections = [
        (&own["paths"], "/paths"),
        (&own["components"]["responses"], "/components/responses"),
        (&own["components"]["schemas"], "/components/schemas"),
    ];
    for (from, into) in sections {
        if let (Some(into), Some(from)) = (
            document.pointer_mut(into).and_then(Value::as_object_mut),
            from.as_object(),
        ) {
            into.extend(from.clone());
        }
    }
    // The default model: what generated examples name (any model of the
    // registry may be named; an unknown one is a 404).
    document["components"]["schemas"]["ModelName"] = json!({
        "type": "string",
        "enum": [model, format!("{model}:latest"), "default"],
    });
    document
}

/// The document as JSON text, made once.
pub(crate) fn text(model: &str) -> Bytes {
    Bytes::from(document(model).to_string())
}

/// `GET /openapi.json`: the document made at start.
pub(crate) async fn serve(State(document): State<Bytes>) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], document).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reference_resolves() {
        let document = &document("m");
        let mut pending = vec![document];
        while let Some(value) = pending.pop() {
            match value {
                Value::Object(fields) => {
                    if let Some(Value::String(target)) = fields.get("$ref") {
                        let pointer = target.trim_start_matches('#');
                        assert!(document.pointer(pointer).is_some(), "{target} is nowhere");
                    }
                    pending.extend(fields.values());
                }
                Value::Array(items) => pending.extend(items),
                _ => {}
            }
        }
        assert!(document["paths"]["/api/chat"].is_object());
        assert!(document["paths"]["/v1/chat/completions"].is_object());
        assert_eq!(
            document["components"]["schemas"]["ModelName"]["enum"][0],
            "m"
        );
    }
}
