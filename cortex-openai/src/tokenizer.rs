//! vLLM's tokenizer routes, which evaluation harnesses call beside the
//! OpenAI API (lm-evaluation-harness's remote tokenizer counts a context's
//! tokens with them before it scores continuations with `echo`):
//! `POST /tokenize`, `POST /detokenize` and `GET /tokenizer_info`.

use cortex_request::TokenId;
use serde_json::{Value, json};

use crate::online::BodyError;

/// A `POST /tokenize` body: `{"prompt", "add_special_tokens", "model"}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenizeCall {
    /// The model whose tokenizer is asked (none: the default model).
    pub model: Option<String>,
    /// The text to tokenize.
    pub prompt: String,
    /// Whether the model's start token comes first (vLLM's default: true).
    pub add_special_tokens: bool,
}

/// A `POST /detokenize` body: `{"tokens", "model"}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DetokenizeCall {
    /// The model whose tokenizer is asked (none: the default model).
    pub model: Option<String>,
    /// The token ids.
    pub tokens: Vec<TokenId>,
}

/// Reads a `POST /tokenize` body.
pub fn parse_tokenize(body: &[u8]) -> Result<TokenizeCall, BodyError> {
    let mut fields = object(body, &["model", "prompt", "add_special_tokens"])?;
    let prompt = match fields.remove("prompt") {
        Some(Value::String(text)) => text,
        None | Some(Value::Null) => return Err(error("missing prompt", "prompt")),
        Some(other) => {
            return Err(error(
                format!("prompt must be a string, not {other}"),
                "prompt",
            ));
        }
    };
    let add_special_tokens = match fields.remove("add_special_tokens") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => b,
        Some(other) => {
            return Err(error(
                format!("add_special_tokens must be true or false, not {other}"),
                "add_special_tokens",
            ));
        }
    };
    Ok(TokenizeCall {
        model: model(&mut fields)?,
        prompt,
        add_special_tokens,
    })
}

/// Reads a `POST /detokenize` body (see [`DetokenizeCall::within`] for the
/// model's vocabulary).
pub fn parse_detokenize(body: &[u8]) -> Result<DetokenizeCall, BodyError> {
    let mut fields = object(body, &["model", "tokens"])?;
    let tokens = match fields.remove("tokens") {
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                item.as_u64()
                    .and_then(|id| TokenId::try_from(id).ok())
                    .ok_or_else(|| {
                        error(
                            format!(
                                "tokens[{i}] = {item} is not a token id (a non-negative integer)"
                            ),
                            "tokens",
                        )
                    })
            })
            .collect::<Result<_, _>>()?,
        None | Some(Value::Null) => return Err(error("missing tokens", "tokens")),
        Some(other) => {
            return Err(error(
                format!("tokens must be an array of token ids, not {other}"),
                "tokens",
            ));
        }
    };
    Ok(DetokenizeCall {
        model: model(&mut fields)?,
        tokens,
    })
}

impl DetokenizeCall {
    /// The call, when every id is below `n_vocab` (the model's vocabulary);
    /// else the first that is not, named.
    pub fn within(self, n_vocab: usize) -> Result<Self, BodyError> {
        match self.tokens.iter().position(|&id| id as usize >= n_vocab) {
            None => Ok(self),
            Some(i) => Err(error(
                format!(
                    "tokens[{i}] = {} is not a token id of this model (0 to {})",
                    self.tokens[i],
                    n_vocab.saturating_sub(1)
                ),
                "tokens",
            )),
        }
    }
}

/// `POST /tokenize`'s answer.
pub fn tokenize_body(tokens: &[TokenId], max_model_len: usize) -> Value {
    json!({
        "count": tokens.len(),
        "max_model_len": max_model_len,
        "tokens": tokens,
        "token_strs": null,
    })
}

/// `POST /detokenize`'s answer.
pub fn detokenize_body(text: &str) -> Value {
    json!({ "prompt": text })
}

/// `GET /tokenizer_info`'s answer: the start and end tokens' texts (null
/// where the model has none), the longest sequence and the chat template.
pub fn tokenizer_info_body(
    start: &str,
    end: &str,
    max_model_len: usize,
    chat_template: Option<&str>,
) -> Value {
    let text = |t: &str| if t.is_empty() { Value::Null } else { json!(t) };
    json!({
        "tokenizer_class": "llama.cpp",
        "bos_token": text(start),
        "eos_token": text(end),
        "model_max_length": max_model_len,
        "chat_template": chat_template,
    })
}

fn error(message: impl Into<String>, param: &str) -> BodyError {
    BodyError {
        message: message.into(),
        param: Some(param.into()),
    }
}

/// The body as a JSON object with only the `known` fields.
fn object(body: &[u8], known: &[&str]) -> Result<serde_json::Map<String, Value>, BodyError> {
    let plain = |message: String| BodyError {
        message,
        param: None,
    };
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| plain(format!("the body is not valid JSON: {e}")))?;
    let Value::Object(fields) = value else {
        return Err(plain("the body must be a JSON object".into()));
    };
    if let Some(key) = fields.keys().find(|k| !known.contains(&k.as_str())) {
        let message = match cortex_request::closest_name(key, known.iter().copied()) {
            Some(near) => format!("unknown field {key:?}: did you mean {near:?}?"),
            None => format!("unknown field {key:?} (known: {})", known.join(", ")),
        };
        return Err(BodyError {
            message,
            param: Some(key.clone()),
        });
    }
    Ok(fields)
}

fn model(fields: &mut serde_json::Map<String, Value>) -> Result<Option<String>, BodyError> {
    match fields.remove("model") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(name)) => Ok(Some(name)),
        Some(other) => Err(error(
            format!("model must be a string, not {other}"),
            "model",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokenize_bodies_are_read_as_vllm_reads_them() {
        let call = parse_tokenize(br#"{"prompt": "Hi", "add_special_tokens": false}"#).unwrap();
        assert_eq!(
            call,
            TokenizeCall {
                model: None,
                prompt: "Hi".into(),
                add_special_tokens: false
            }
        );
        assert!(
            parse_tokenize(br#"{"prompt": "Hi"}"#)
                .unwrap()
                .add_special_tokens
        );
        let error = parse_tokenize(br#"{"promt": "Hi"}"#).unwrap_err();
        assert_eq!(
            error.message,
            "unknown field \"promt\": did you mean \"prompt\"?"
        );
        assert_eq!(parse_tokenize(b"{}").unwrap_err().message, "missing prompt");
    }

    #[test]
    fn detokenize_refuses_ids_outside_the_vocabulary() {
        let call = parse_detokenize(br#"{"tokens": [1, 2], "model": "m"}"#)
            .and_then(|call| call.within(10))
            .unwrap();
        assert_eq!(call.tokens, vec![1, 2]);
        assert_eq!(call.model.as_deref(), Some("m"));
        let error = parse_detokenize(br#"{"tokens": [1, 10]}"#)
            .and_then(|call| call.within(10))
            .unwrap_err();
        assert_eq!(
            error.message,
            "tokens[1] = 10 is not a token id of this model (0 to 9)"
        );
        assert_eq!(
            parse_detokenize(br#"{"tokens": [-1]}"#)
                .unwrap_err()
                .message,
            "tokens[0] = -1 is not a token id (a non-negative integer)"
        );
        assert!(parse_detokenize(br#"{"tokens": [4294967296]}"#).is_err());
        assert!(parse_detokenize(br#"{"tokens": "1 2"}"#).is_err());
    }

    #[test]
    fn tokenizer_info_names_the_end_token() {
        let info = tokenizer_info_body("", "<|im_end|>", 8192, None);
        assert_eq!(info["eos_token"], "<|im_end|>");
        assert_eq!(info["bos_token"], Value::Null);
        assert_eq!(info["model_max_length"], 8192);
        assert_eq!(tokenize_body(&[5, 6], 10)["count"], 2);
        assert_eq!(detokenize_body("x")["prompt"], "x");
    }
}
