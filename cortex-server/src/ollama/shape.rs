//! What every Ollama route shares: errors in Ollama's shape
//! (`{"error": "..."}`), RFC 3339 times, `options` onto sampling, `format`
//! as a grammar, `keep_alive`, and a model as Ollama describes one.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use cortex_models::{ModelDetails, read_gguf};
use cortex_request::Request;
use cortex_worker::ModelIdentity;
use serde_json::{Map, Value, json};

use crate::error::ApiError;
use crate::pool::KeepAlive;

/// The Ollama API version cortex answers like.
pub(crate) const OLLAMA_VERSION: &str = "0.12.0";

/// An error in Ollama's shape.
pub(crate) struct OllamaError(pub(crate) StatusCode, pub(crate) String);

impl From<ApiError> for OllamaError {
    fn from(error: ApiError) -> Self {
        Self(error.status, error.message)
    }
}

impl From<crate::pool::PoolError> for OllamaError {
    fn from(error: crate::pool::PoolError) -> Self {
        ApiError::from(error).into()
    }
}

impl IntoResponse for OllamaError {
    fn into_response(self) -> Response {
        (self.0, Json(json!({ "error": self.1 }))).into_response()
    }
}

pub(crate) fn bad(message: impl Into<String>) -> OllamaError {
    OllamaError(StatusCode::BAD_REQUEST, message.into())
}

/// RFC 3339 UTC with milliseconds.
pub(crate) fn timestamp(ms: i64) -> String {
    let (y, mo, d, h, mi, s) = cortex_request::civil_date(ms.div_euclid(1000));
    format!(
        "{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{:03}Z",
        ms.rem_euclid(1000)
    )
}

pub(crate) fn text_field(
    fields: &Map<String, Value>,
    key: &str,
) -> Result<Option<String>, OllamaError> {
    match fields.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(bad(format!("{key} = {other}: expected a string"))),
    }
}

fn number(key: &str, value: &Value) -> Result<f64, OllamaError> {
    value
        .as_f64()
        .ok_or_else(|| bad(format!("options.{key} = {value}: expected a number")))
}

/// An integer option: any JSON number, cut to an integer as Ollama does.
fn integer(key: &str, value: &Value) -> Result<f64, OllamaError> {
    value
        .as_f64()
        .map(f64::trunc)
        .ok_or_else(|| bad(format!("options.{key} = {value}: expected an integer")))
}

/// Options that tune Ollama's runtime rather than what is generated, with
/// their types: accepted (when of the right type), no effect here.
const RUNTIME_OPTIONS: &[(&str, OptionType)] = &[
    ("num_ctx", OptionType::Integer),
    ("num_batch", OptionType::Integer),
    ("num_gpu", OptionType::Integer),
    ("main_gpu", OptionType::Integer),
    ("use_mmap", OptionType::Bool),
    ("use_mlock", OptionType::Bool),
    ("num_thread", OptionType::Integer),
    ("numa", OptionType::Bool),
    ("low_vram", OptionType::Bool),
    ("vocab_only", OptionType::Bool),
    ("num_keep", OptionType::Integer),
    ("penalize_newline", OptionType::Bool),
    ("typical_p", OptionType::Number),
    ("mirostat", OptionType::Integer),
    ("mirostat_tau", OptionType::Number),
    ("mirostat_eta", OptionType::Number),
    ("tfs_z", OptionType::Number),
];

#[derive(Clone, Copy)]
enum OptionType {
    Integer,
    Number,
    Bool,
}

impl OptionType {
    fn check(self, key: &str, value: &Value) -> Result<(), OllamaError> {
        match self {
            OptionType::Integer => integer(key, value).map(drop),
            OptionType::Number => number(key, value).map(drop),
            OptionType::Bool if value.is_boolean() => Ok(()),
            OptionType::Bool => Err(bad(format!(
                "options.{key} = {value}: expected true or false"
            ))),
        }
    }
}

/// `options` onto the request's sampling and stop settings.
pub(crate) fn apply_options(options: &Value, request: &mut Request) -> Result<(), OllamaError> {
    let Value::Object(options) = options else {
        return if options.is_null() {
            Ok(())
        } else {
            Err(bad(format!("options = {options}: expected an object")))
        };
    };
    let sampling = &mut request.sampling;
    for (key, value) in options {
        match key.as_str() {
            "temperature" => sampling.temperature = number(key, value)? as f32,
            "top_p" => sampling.top_p = number(key, value)? as f32,
            "top_k" => sampling.top_k = integer(key, value)? as i32,
            "min_p" => sampling.min_p = number(key, value)? as f32,
            "repeat_penalty" => sampling.repetition_penalty = number(key, value)? as f32,
            "presence_penalty" => sampling.presence_penalty = number(key, value)? as f32,
            "frequency_penalty" => sampling.frequency_penalty = number(key, value)? as f32,
            "repeat_last_n" => sampling.penalty_last_n = integer(key, value)?.max(0.0) as u32,
            "seed" => sampling.seed = Some(integer(key, value)? as u64),
            "num_predict" => {
                let n = integer(key, value)?;
                // -1 (and -2) mean "until the context is full": the engine's limit.
                request.stop.max_tokens = if n < 0.0 { u32::MAX } else { n as u32 };
            }
            "stop" => {
                request.stop.stop = value
                    .as_array()
                    .and_then(|a| a.iter().map(|s| s.as_str().map(str::to_owned)).collect())
                    .ok_or_else(|| {
                        bad(format!(
                            "options.stop = {value}: expected an array of strings"
                        ))
                    })?;
            }
            key => match RUNTIME_OPTIONS.iter().find(|(name, _)| *name == key) {
                Some((_, kind)) => kind.check(key, value)?,
                None => return Err(bad(format!("options.{key} is not an option cortex knows"))),
            },
        }
    }
    Ok(())
}

/// `format`: `"json"` or a JSON schema, as a grammar.
pub(crate) fn format_grammar(format: Option<&Value>) -> Result<Option<String>, OllamaError> {
    match format {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) if s == "json" => Ok(Some(cortex_grammar::json_object())),
        Some(schema @ Value::Object(_)) => cortex_grammar::from_json_schema(schema)
            .map(Some)
            .map_err(|e| bad(format!("format: {e}"))),
        Some(other) => Err(bad(format!(
            "format = {other}: expected \"json\" or a JSON schema"
        ))),
    }
}

pub(crate) fn not_found(message: impl Into<String>) -> OllamaError {
    OllamaError(StatusCode::NOT_FOUND, message.into())
}

/// A body's JSON object, or why it is not one.
pub(crate) fn object(body: &[u8]) -> Result<Map<String, Value>, OllamaError> {
    match serde_json::from_slice(body) {
        Ok(Value::Object(fields)) => Ok(fields),
        Ok(_) => Err(bad("the body must be a JSON object")),
        Err(e) => Err(bad(format!("the body is not valid JSON: {e}"))),
    }
}

/// `keep_alive`, if the body sets it.
pub(crate) fn keep_alive(fields: &Map<String, Value>) -> Result<Option<KeepAlive>, OllamaError> {
    match fields.get("keep_alive") {
        None | Some(Value::Null) => Ok(None),
        Some(value) => keep_alive_of(value).map(Some).map_err(bad),
    }
}

/// Ollama's forms of `keep_alive`: seconds as a number, or a duration
/// (`"5m"`, `"1h30m"`, `"45s"`, `"500ms"`, `"0"`); negative keeps the model.
fn keep_alive_of(value: &Value) -> Result<KeepAlive, String> {
    match value {
        Value::Number(n) => Ok(KeepAlive::from_seconds(n.as_f64().unwrap_or(0.0))),
        Value::String(text) => KeepAlive::parse_text(text).map_err(|e| e.to_string()),
        other => Err(format!(
            "keep_alive must be a duration or a number of seconds, not {other}"
        )),
    }
}

/// The model's `details` as Ollama gives them, read from its GGUF (empty
/// when the file cannot be read, e.g. a known model not fetched yet).
pub(crate) fn details(model: &ModelIdentity) -> (Value, Option<cortex_models::GgufInfo>) {
    let Ok(info) = read_gguf(&model.path) else {
        return (
            json!({ "parent_model": "", "format": "gguf", "family": "", "families": null, "parameter_size": "", "quantization_level": "" }),
            None,
        );
    };
    let facts = ModelDetails::of(&info);
    let family = facts.family.clone().unwrap_or_default();
    (
        json!({
            "parent_model": "",
            "format": "gguf",
            "family": family,
            "families": [family],
            "parameter_size": facts.parameter_size,
            "quantization_level": facts.quantization.unwrap_or(""),
        }),
        Some(info),
    )
}

/// A model as `/api/tags` lists it, with its `capabilities` as
/// `/api/show` gives them.
pub(crate) fn model_entry(model: &ModelIdentity, modified_ms: i64) -> Value {
    let size = std::fs::metadata(&model.path).map_or(0, |m| m.len());
    let (details, info) = details(model);
    let template = info
        .map(|info| template_of(model, &info))
        .unwrap_or_default();
    json!({
        "name": model.name,
        "model": model.name,
        "modified_at": timestamp(modified_ms),
        "size": size,
        "digest": model.sha256,
        "details": details,
        "capabilities": capabilities(&template),
    })
}

/// The chat template a model's chats render with: its Modelfile's, else
/// its GGUF's (empty: llama.cpp's built-in one is chosen).
pub(crate) fn template_of(model: &ModelIdentity, info: &cortex_models::GgufInfo) -> String {
    model
        .settings
        .template
        .clone()
        .or_else(|| info.string("tokenizer.chat_template").map(str::to_owned))
        .unwrap_or_default()
}

/// What Ollama's clients (Open WebUI, LangChain's ChatOllama) read in
/// `capabilities`: `completion` and `tools` always (a template that
/// renders tools, or cortex's tools text beside it or beside llama.cpp's
/// built-in templates); `thinking` when the model's template marks
/// thinking. Never `vision` (cortex takes no images) nor `embedding`
/// (Ollama's mark of an embedding-only model).
pub(crate) fn capabilities(template: &str) -> Vec<&'static str> {
    let mut out = vec!["completion", "tools"];
    // The special tokens' texts change what a template prints, not what it can.
    let thinking = !template.is_empty()
        && cortex_chat::ChatTemplate::new(template, "", "").is_ok_and(|t| t.marks_thinking());
    if thinking {
        out.push("thinking");
    }
    out
}

#[cfg(test)]
mod tests {
    use cortex_request::RequestId;

    use super::*;

    #[test]
    fn keep_alive_reads_ollamas_forms() {
        let parse = |v: Value| keep_alive_of(&v);
        assert_eq!(
            parse(json!(0)),
            Ok(KeepAlive::For(std::time::Duration::ZERO))
        );
        assert_eq!(parse(json!(-1)), Ok(KeepAlive::Forever));
        assert_eq!(
            parse(json!(90)),
            Ok(KeepAlive::For(std::time::Duration::from_secs(90)))
        );
        assert_eq!(parse(json!("5m")), Ok(KeepAlive::DEFAULT));
        assert_eq!(
            parse(json!("500ms")),
            Ok(KeepAlive::For(std::time::Duration::from_millis(500)))
        );
        for bad in [
            json!("soon"),
            json!("5 minutes"),
            json!(true),
            json!("1e999"),
        ] {
            assert!(parse(bad.clone()).is_err(), "{bad}");
        }
    }

    #[test]
    fn capabilities_follow_the_models_template() {
        let chatml = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
        let thinking = "{% for m in messages %}<|User|>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<|Assistant|><think>\n{% endif %}";
        // No template of its own: a built-in one, with cortex's tools text.
        assert_eq!(capabilities(""), ["completion", "tools"]);
        assert_eq!(capabilities(chatml), ["completion", "tools"]);
        assert_eq!(capabilities(thinking), ["completion", "tools", "thinking"]);
        assert_eq!(capabilities("{% for %}"), ["completion", "tools"]);
    }

    #[test]
    fn timestamps_are_rfc3339() {
        assert_eq!(timestamp(1_500), "1970-01-01T00:00:01.500Z");
    }

    #[test]
    fn options_map_onto_sampling() {
        let mut request = Request::new(RequestId(0), "Hi");
        apply_options(
            &json!({"temperature": 0, "num_predict": 5, "stop": ["\n"], "num_ctx": 2048}),
            &mut request,
        )
        .unwrap_or_else(|_| panic!("options refused"));
        assert_eq!(
            (request.sampling.temperature, request.stop.max_tokens),
            (0.0, 5)
        );
        assert_eq!(request.stop.stop, vec!["\n".to_owned()]);
        let Err(OllamaError(_, message)) = apply_options(&json!({"warp": 9}), &mut request) else {
            panic!("an unknown option was accepted");
        };
        assert_eq!(message, "options.warp is not an option cortex knows");
        for (options, expected) in [
            (
                json!({"num_ctx": "x"}),
                "options.num_ctx = \"x\": expected an integer",
            ),
            (
                json!({"use_mmap": 1}),
                "options.use_mmap = 1: expected true or false",
            ),
            (
                json!({"typical_p": [1]}),
                "options.typical_p = [1]: expected a number",
            ),
            (
                json!({"top_k": "5"}),
                "options.top_k = \"5\": expected an integer",
            ),
        ] {
            let Err(OllamaError(_, message)) = apply_options(&options, &mut request) else {
                panic!("{options} was accepted");
            };
            assert_eq!(message, expected);
        }
        apply_options(
            &json!({"num_ctx": 4096, "top_k": 3.0, "low_vram": false}),
            &mut request,
        )
        .unwrap_or_else(|_| panic!("options refused"));
    }
}
