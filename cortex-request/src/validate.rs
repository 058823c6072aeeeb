//! Checking a request against limits before it reaches an engine.

use crate::{ChatMessage, Prompt, Request};

/// Bounds a request is checked against; engines and queues may tighten them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most stop strings per request.
    pub max_stop_strings: usize,
    /// Longest stop string, in bytes.
    pub max_stop_string_bytes: usize,
    /// Most completions per prompt (`n`).
    pub max_n: u32,
    /// Most completions per request: `n` times the number of prompts.
    pub max_choices: u32,
    /// Most `logit_bias` entries per request.
    pub max_logit_bias: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_stop_strings: 16,
            max_stop_string_bytes: 256,
            max_n: 64,
            max_choices: 1024,
            max_logit_bias: 1024,
        }
    }
}

/// A request field with a value outside what cortex accepts.
///
/// Every variant names the field (with its index where it is a list entry) and
/// the value that was wrong, so callers can report it as given.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ValidationError {
    /// A number outside its range.
    #[error("{field} = {value} is out of range: expected {expected}")]
    OutOfRange {
        /// The field's name as users write it (`temperature`, `logit_bias[42]`).
        field: String,
        /// The offending value.
        value: String,
        /// The accepted range, in words.
        expected: &'static str,
    },
    /// The prompt has no text, no tokens or no message content.
    #[error("{field} is empty")]
    EmptyPrompt {
        /// `prompt` or `messages`.
        field: &'static str,
    },
    /// A list longer than its limit.
    #[error("{field} has {count} entries; at most {max} are allowed")]
    TooMany {
        /// The list's name.
        field: &'static str,
        /// How many entries it had.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// A stop string that is empty or too long.
    #[error("stop[{index}] = {value:?} is invalid: {reason}")]
    BadStopString {
        /// Its position in `stop`.
        index: usize,
        /// The string (truncated when long).
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// An entry of a prompt list that is not text or token ids.
    #[error("prompt[{index}] is not a text or a list of token ids")]
    NotTextOrTokens {
        /// Its position in the list.
        index: usize,
    },
    /// A chat message with a role no template knows.
    #[error(
        "messages[{index}].role = {role:?} is not one of system, developer, user, assistant, tool"
    )]
    InvalidRole {
        /// The message's position.
        index: usize,
        /// The role given.
        role: String,
    },
}

impl ValidationError {
    /// The name of the offending field, as users write it.
    pub fn field(&self) -> String {
        match self {
            ValidationError::OutOfRange { field, .. } => field.clone(),
            ValidationError::EmptyPrompt { field } | ValidationError::TooMany { field, .. } => {
                (*field).to_owned()
            }
            ValidationError::BadStopString { index, .. } => format!("stop[{index}]"),
            ValidationError::InvalidRole { index, .. } => format!("messages[{index}].role"),
            ValidationError::NotTextOrTokens { index } => format!("prompt[{index}]"),
        }
    }
}

fn check(
    ok: bool,
    field: impl Into<String>,
    value: &dyn std::fmt::Display,
    expected: &'static str,
) -> Result<(), ValidationError> {
    if ok {
        Ok(())
    } else {
        Err(ValidationError::OutOfRange {
            field: field.into(),
            value: value.to_string(),
            expected,
        })
    }
}

fn check_count(field: &'static str, count: usize, max: usize) -> Result<(), ValidationError> {
    if count > max {
        Err(ValidationError::TooMany { field, count, max })
    } else {
        Ok(())
    }
}

fn validate_prompt(prompt: &Prompt) -> Result<(), ValidationError> {
    if let Prompt::Several(prompts) = prompt
        && let Some(index) = prompts
            .iter()
            .position(|p| matches!(p, Prompt::Chat(_) | Prompt::Several(_)))
    {
        return Err(ValidationError::NotTextOrTokens { index });
    }
    if let Prompt::Chat(messages) = prompt {
        if messages.is_empty() {
            return Err(ValidationError::EmptyPrompt { field: "messages" });
        }
        if let Some((index, message)) = messages
            .iter()
            .enumerate()
            .find(|(_, m)| !ChatMessage::ROLES.contains(&m.role.as_str()))
        {
            return Err(ValidationError::InvalidRole {
                index,
                role: message.role.clone(),
            });
        }
    }
    if prompt.is_empty() {
        let field = if matches!(prompt, Prompt::Chat(_)) {
            "messages"
        } else {
            "prompt"
        };
        return Err(ValidationError::EmptyPrompt { field });
    }
    Ok(())
}

fn shorten(text: &str) -> String {
    const KEEP: usize = 40;
    match text.char_indices().nth(KEEP) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

impl Request {
    /// Checks every field against `limits`, returning the first problem found.
    ///
    /// Fields are checked in a fixed order (prompt, n, sampling, stop
    /// conditions), so the same request always reports the same error.
    pub fn validate(&self, limits: &Limits) -> Result<(), ValidationError> {
        validate_prompt(&self.prompt)?;
        check(
            (1..=limits.max_n).contains(&self.n),
            "n",
            &self.n,
            "an integer >= 1 within the server's limit",
        )?;
        check_count(
            "prompt",
            self.prompt.parts().len(),
            (limits.max_choices / self.n) as usize,
        )?;

        if let Some(top) = self.logprobs {
            check(
                top <= Request::MAX_TOP_LOGPROBS,
                "top_logprobs",
                &top,
                "an integer from 0 to 20",
            )?;
        }
        if let Some(top) = self.prompt_logprobs {
            check(
                top <= Request::MAX_TOP_LOGPROBS,
                "prompt_logprobs",
                &top,
                "an integer from 0 to 20",
            )?;
        }

        let s = &self.sampling;
        check(
            s.temperature.is_finite() && s.temperature >= 0.0,
            "temperature",
            &s.temperature,
            "a finite number >= 0",
        )?;
        check(
            s.top_p > 0.0 && s.top_p <= 1.0,
            "top_p",
            &s.top_p,
            "a number in (0, 1]",
        )?;
        check(
            s.top_k >= 0,
            "top_k",
            &s.top_k,
            "an integer >= 0 (0 disables)",
        )?;
        check(
            (0.0..=1.0).contains(&s.min_p),
            "min_p",
            &s.min_p,
            "a number in [0, 1]",
        )?;
        check(
            s.repetition_penalty.is_finite() && s.repetition_penalty > 0.0,
            "repetition_penalty",
            &s.repetition_penalty,
            "a finite number > 0 (1 disables)",
        )?;
        check(
            (-2.0..=2.0).contains(&s.presence_penalty),
            "presence_penalty",
            &s.presence_penalty,
            "a number in [-2, 2]",
        )?;
        check(
            (-2.0..=2.0).contains(&s.frequency_penalty),
            "frequency_penalty",
            &s.frequency_penalty,
            "a number in [-2, 2]",
        )?;
        check_count("logit_bias", s.logit_bias.len(), limits.max_logit_bias)?;
        for (token, bias) in &s.logit_bias {
            check(
                (-100.0..=100.0).contains(bias),
                format!("logit_bias[{token}]"),
                &bias,
                "a number in [-100, 100]",
            )?;
        }

        let stop = &self.stop;
        // Scoring a prompt (its log probabilities) may generate nothing.
        if self.prompt_logprobs.is_none() {
            check(
                stop.max_tokens >= 1,
                "max_tokens",
                &stop.max_tokens,
                "an integer >= 1 (0 only with the prompt's log probabilities, echo)",
            )?;
        }
        check_count("stop", stop.stop.len(), limits.max_stop_strings)?;
        for (index, text) in stop.stop.iter().enumerate() {
            let reason = if text.is_empty() {
                "it is empty"
            } else if text.len() > limits.max_stop_string_bytes {
                "it is longer than the limit"
            } else {
                continue;
            };
            return Err(ValidationError::BadStopString {
                index,
                value: shorten(text),
                reason,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ChatMessage, Prompt, Request, RequestId};

    fn request() -> Request {
        Request::new(RequestId(1), "Hello")
    }

    fn request_with(edit: impl FnOnce(&mut Request)) -> Request {
        let mut r = request();
        edit(&mut r);
        r
    }

    fn error_of(edit: impl FnOnce(&mut Request)) -> String {
        request_with(edit)
            .validate(&Limits::default())
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn defaults_are_valid() {
        assert_eq!(request().validate(&Limits::default()), Ok(()));
    }

    #[test]
    fn errors_name_the_field_and_the_value() {
        type Edit = fn(&mut Request);
        let cases: [(Edit, &str); 12] = [
            (
                |r| r.sampling.temperature = -0.5,
                "temperature = -0.5 is out of range: expected a finite number >= 0",
            ),
            (
                |r| r.sampling.temperature = f32::NAN,
                "temperature = NaN is out of range: expected a finite number >= 0",
            ),
            (
                |r| r.sampling.top_p = 0.0,
                "top_p = 0 is out of range: expected a number in (0, 1]",
            ),
            (
                |r| r.sampling.top_p = 1.5,
                "top_p = 1.5 is out of range: expected a number in (0, 1]",
            ),
            (
                |r| r.sampling.top_k = -1,
                "top_k = -1 is out of range: expected an integer >= 0 (0 disables)",
            ),
            (
                |r| r.sampling.min_p = 2.0,
                "min_p = 2 is out of range: expected a number in [0, 1]",
            ),
            (
                |r| r.sampling.repetition_penalty = 0.0,
                "repetition_penalty = 0 is out of range: expected a finite number > 0 (1 disables)",
            ),
            (
                |r| r.sampling.presence_penalty = 3.0,
                "presence_penalty = 3 is out of range: expected a number in [-2, 2]",
            ),
            (
                |r| r.sampling.frequency_penalty = -2.5,
                "frequency_penalty = -2.5 is out of range: expected a number in [-2, 2]",
            ),
            (
                |r| {
                    r.sampling.logit_bias.insert(42, 150.0);
                },
                "logit_bias[42] = 150 is out of range: expected a number in [-100, 100]",
            ),
            (
                |r| r.stop.max_tokens = 0,
                "max_tokens = 0 is out of range: expected an integer >= 1 (0 only with the prompt's log probabilities, echo)",
            ),
            (
                |r| r.n = 0,
                "n = 0 is out of range: expected an integer >= 1 within the server's limit",
            ),
        ];
        for (edit, message) in cases {
            assert_eq!(error_of(edit), message);
        }
    }

    #[test]
    fn prompts_must_have_content() {
        assert_eq!(
            error_of(|r| r.prompt = Prompt::Text(String::new())),
            "prompt is empty"
        );
        assert_eq!(
            error_of(|r| r.prompt = Prompt::Tokens(vec![])),
            "prompt is empty"
        );
        assert_eq!(
            error_of(|r| r.prompt = Prompt::Chat(vec![])),
            "messages is empty"
        );
        assert_eq!(
            error_of(|r| r.prompt = Prompt::Chat(vec![ChatMessage::user("")])),
            "messages is empty"
        );
        assert_eq!(
            error_of(|r| r.prompt = Prompt::Chat(vec![
                ChatMessage::system("be brief"),
                ChatMessage::new("robot", "hi")
            ])),
            "messages[1].role = \"robot\" is not one of system, developer, user, assistant, tool"
        );
    }

    #[test]
    fn a_prompt_list_holds_texts_and_token_lists_within_the_choice_limit() {
        let texts = |count: usize| Prompt::Several(vec![Prompt::Text("hi".into()); count]);
        assert!(
            request_with(|r| r.prompt = texts(3))
                .validate(&Limits::default())
                .is_ok()
        );
        assert_eq!(
            error_of(|r| r.prompt =
                Prompt::Several(vec![Prompt::Text("a".into()), Prompt::Tokens(vec![])])),
            "prompt is empty"
        );
        assert_eq!(
            error_of(|r| r.prompt = Prompt::Several(vec![
                Prompt::Tokens(vec![1]),
                Prompt::Chat(vec![ChatMessage::user("hi")])
            ])),
            "prompt[1] is not a text or a list of token ids"
        );
        // n completions of each prompt count against the request's bound.
        assert_eq!(
            error_of(|r| {
                r.prompt = texts(17);
                r.n = 64;
            }),
            "prompt has 17 entries; at most 16 are allowed"
        );
        assert_eq!(request_with(|r| r.prompt = texts(3)).choices(), 3);
    }

    #[test]
    fn stop_strings_are_bounded() {
        let limits = Limits::default();
        assert_eq!(
            error_of(|r| r.stop.stop = vec!["x".into(); limits.max_stop_strings + 1]),
            "stop has 17 entries; at most 16 are allowed"
        );
        assert_eq!(
            error_of(|r| r.stop.stop = vec!["ok".into(), String::new()]),
            "stop[1] = \"\" is invalid: it is empty"
        );
        let long = "é".repeat(200);
        let message = error_of(|r| r.stop.stop = vec![long]);
        assert!(message.starts_with("stop[0] = \"éééé"), "{message}");
        assert!(
            message.ends_with("…\" is invalid: it is longer than the limit"),
            "{message}"
        );
    }

    #[test]
    fn field_names_match_messages() {
        let mut r = request();
        r.sampling.logit_bias.insert(7, -101.0);
        assert_eq!(
            r.validate(&Limits::default()).unwrap_err().field(),
            "logit_bias[7]"
        );
        let mut r = request();
        r.stop.stop = vec![String::new()];
        assert_eq!(
            r.validate(&Limits::default()).unwrap_err().field(),
            "stop[0]"
        );
    }
}
