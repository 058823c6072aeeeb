//! A chat's template variables: `chat_template_kwargs` (vLLM's and
//! llama-server's field, such as Qwen3's `enable_thinking`), and
//! `reasoning_effort` (a Responses body's `reasoning.effort`), which
//! templates that take it read (gpt-oss's), `none` also switching thinking
//! off where a template reads `enable_thinking`; and `include_reasoning`
//! (vLLM's), false to leave the thinking out of the answer.

use serde_json::{Map, Value};

use super::{Fields, type_error};
use crate::Endpoint;

/// The fields this module reads, by endpoint.
pub(super) fn variable_fields(endpoint: Endpoint) -> &'static [&'static str] {
    match endpoint {
        Endpoint::ChatCompletions => &[
            "chat_template_kwargs",
            "reasoning_effort",
            "include_reasoning",
        ],
        Endpoint::Responses => &["chat_template_kwargs", "reasoning", "include_reasoning"],
        Endpoint::Completions | Endpoint::Embeddings => &[],
    }
}

/// The efforts OpenAI's reasoning models take.
const EFFORTS: [&str; 6] = ["none", "minimal", "low", "medium", "high", "xhigh"];

/// Whether the body leaves the thinking out (`include_reasoning: false`),
/// else the job's default.
pub(super) fn omit_reasoning(fields: &Fields, default: bool) -> Result<bool, String> {
    match fields.get("include_reasoning") {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(include)) => Ok(!include),
        Some(other) => Err(type_error("include_reasoning", "a boolean", other)),
    }
}

/// The template variables a body sets, as a JSON object's text.
pub(super) fn template_variables(
    fields: &Fields,
    endpoint: Endpoint,
) -> Result<Option<String>, String> {
    let mut variables = match fields.get("chat_template_kwargs") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(map)) => map.clone(),
        Some(other) => {
            return Err(type_error(
                "chat_template_kwargs",
                "an object of template variables",
                other,
            ));
        }
    };
    let effort = match endpoint {
        Endpoint::Responses => match fields.get("reasoning") {
            None | Some(Value::Null) => None,
            Some(Value::Object(reasoning)) => {
                super::format::only(&["effort", "summary"], "reasoning", reasoning)?;
                reasoning
                    .get("effort")
                    .filter(|e| !e.is_null())
                    .map(|e| ("reasoning.effort", e))
            }
            Some(other) => return Err(type_error("reasoning", "an object", other)),
        },
        _ => fields
            .get("reasoning_effort")
            .filter(|e| !e.is_null())
            .map(|e| ("reasoning_effort", e)),
    };
    if let Some((field, effort)) = effort {
        let Some(effort) = effort.as_str().filter(|e| EFFORTS.contains(e)) else {
            return Err(format!(
                "{field} = {effort} is not one of {}",
                EFFORTS.join(", ")
            ));
        };
        variables
            .entry("reasoning_effort")
            .or_insert_with(|| Value::from(effort));
        if effort == "none" {
            variables
                .entry("enable_thinking")
                .or_insert(Value::Bool(false));
        }
    }
    Ok((!variables.is_empty()).then(|| Value::Object(variables).to_string()))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn variables(body: Value, endpoint: Endpoint) -> Result<Option<Value>, String> {
        let Value::Object(fields) = body else {
            unreachable!()
        };
        template_variables(&fields, endpoint)
            .map(|text| text.map(|t| serde_json::from_str(&t).unwrap()))
    }

    #[test]
    fn kwargs_and_effort_become_template_variables() {
        let chat = Endpoint::ChatCompletions;
        assert_eq!(variables(json!({}), chat), Ok(None));
        assert_eq!(
            variables(
                json!({"chat_template_kwargs": {"enable_thinking": false}, "reasoning_effort": "low"}),
                chat
            ),
            Ok(Some(
                json!({"enable_thinking": false, "reasoning_effort": "low"})
            ))
        );
        assert_eq!(
            variables(json!({"reasoning_effort": "none"}), chat),
            Ok(Some(
                json!({"reasoning_effort": "none", "enable_thinking": false})
            ))
        );
        assert_eq!(
            variables(
                json!({"reasoning": {"effort": "high"}}),
                Endpoint::Responses
            ),
            Ok(Some(json!({"reasoning_effort": "high"})))
        );
        assert_eq!(
            variables(json!({"reasoning_effort": "max"}), chat),
            Err(
                "reasoning_effort = \"max\" is not one of none, minimal, low, medium, high, xhigh"
                    .into()
            )
        );
        assert!(variables(json!({"chat_template_kwargs": [1]}), chat).is_err());
    }
}
