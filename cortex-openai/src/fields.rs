//! OpenAI request fields that cortex does not implement: each is either
//! accepted with a documented meaning here (it changes nothing about what is
//! generated) or refused with an error that says it is OpenAI's, why cortex
//! does not take it, and what to do instead. Fields nobody documents stay
//! "unknown field" errors.

use serde_json::Value;

use crate::Endpoint;

/// Accepted anywhere, with no effect on generation.
const HARMLESS: &[(&str, &str)] = &[
    (
        "user",
        "an end-user id for OpenAI's abuse monitoring; recorded nowhere",
    ),
    (
        "safety_identifier",
        "an end-user id for OpenAI's abuse monitoring; recorded nowhere",
    ),
    (
        "prompt_cache_key",
        "a hint for OpenAI's prompt cache; cortex shares prefixes on its own",
    ),
    (
        "store",
        "whether OpenAI keeps the output; cortex keeps every batch result in its queue, and an online /v1/responses answer for GET /v1/responses/{id} unless false",
    ),
    (
        "metadata",
        "labels for OpenAI's stored completions; give job labels with `submit --metadata`",
    ),
    (
        "service_tier",
        "OpenAI's processing tier; one machine has one",
    ),
];

/// What a field of `endpoint` means to cortex, if it is one OpenAI documents
/// that cortex does not implement: `Ok(true)` accepted as harmless (see
/// [`HARMLESS`] and the value checks below), `Err` refused with the reason,
/// `Ok(false)` not such a field.
pub(crate) fn check(endpoint: Endpoint, key: &str, value: &Value) -> Result<bool, String> {
    // `store` decides whether an online response is kept: a boolean.
    if key == "store" && !matches!(value, Value::Bool(_) | Value::Null) {
        return Err(format!("store = {value}: expected a boolean"));
    }
    if HARMLESS.iter().any(|(name, _)| *name == key) {
        return Ok(true);
    }
    let off = |accepted: bool, reason: &str| {
        if accepted {
            Ok(true)
        } else {
            Err(format!(
                "{key} = {value} is an OpenAI field cortex does not support: {reason}"
            ))
        }
    };
    let is_falsy = matches!(value, Value::Null | Value::Bool(false)) || value.as_u64() == Some(0);
    let chat = endpoint == Endpoint::ChatCompletions;
    let responses = endpoint == Endpoint::Responses;
    match key {
        "truncation" if responses => off(
            value.is_null() || value == "disabled",
            "cortex never drops input to fit; a prompt longer than the context fails",
        ),
        "previous_response_id" | "conversation" if responses => off(
            value.is_null(),
            "a batch line stands alone; put the whole conversation in input",
        ),
        "background" if responses => off(is_falsy, "a batch runs in the background anyway"),
        "prompt" if responses => off(value.is_null(), "stored prompt templates are OpenAI's"),
        "max_tool_calls" if responses => off(
            value.is_null(),
            "a batch line makes one answer; give parallel_tool_calls: false for one call",
        ),
        "stream" => off(
            is_falsy,
            "a batch writes whole results; stream from a server instead",
        ),
        "stream_options" => off(value.is_null(), "it only applies to streaming"),
        "functions" | "function_call" if chat => off(
            value.is_null(),
            "it is the deprecated form of tools and tool_choice; give those",
        ),
        "modalities" if chat => off(
            value.is_null() || *value == serde_json::json!(["text"]),
            "cortex generates text only",
        ),
        "audio" if chat => off(value.is_null(), "cortex generates text only"),
        "prediction" if chat => off(value.is_null(), "predicted outputs are not implemented"),
        "web_search_options" if chat => off(value.is_null(), "a local model has no web search"),
        "verbosity" if chat => off(
            value.is_null(),
            "it is for OpenAI's reasoning models; a local model takes no such setting",
        ),
        "suffix" if endpoint == Endpoint::Completions => off(
            value.is_null(),
            "insertion (text after the completion) is not implemented",
        ),
        "best_of" if endpoint == Endpoint::Completions => off(
            value.is_null() || value.as_u64() == Some(1),
            "choosing the best of several completions is not implemented; use n",
        ),
        _ => Ok(false),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn harmless_fields_are_accepted_and_unsupported_ones_say_why() {
        let chat = Endpoint::ChatCompletions;
        assert_eq!(check(chat, "user", &json!("u-1")), Ok(true));
        assert_eq!(check(chat, "store", &json!(false)), Ok(true));
        assert!(
            check(chat, "store", &json!("yes"))
                .unwrap_err()
                .contains("expected a boolean")
        );
        assert_eq!(check(chat, "stream", &json!(false)), Ok(true));
        assert_eq!(check(chat, "tool_choice", &json!("none")), Ok(false));
        assert_eq!(check(chat, "temperature", &json!(1)), Ok(false));
        assert_eq!(check(chat, "echo", &json!(true)), Ok(false));
        let error = check(chat, "functions", &json!([{"name": "f"}])).unwrap_err();
        assert!(
            error.starts_with("functions = [{\"name\":\"f\"}] is an OpenAI field cortex does not support: it is the deprecated form"),
            "{error}"
        );
        let error = check(chat, "stream", &json!(true)).unwrap_err();
        assert!(error.contains("a batch writes whole results"), "{error}");
        let completions = Endpoint::Completions;
        assert_eq!(check(completions, "best_of", &json!(1)), Ok(true));
        assert!(check(completions, "suffix", &json!("end")).is_err());
    }
}
