//! Sampling parameters and stop conditions.

use std::collections::BTreeMap;

use crate::TokenId;

/// How the next token is chosen from the logits.
///
/// The defaults are OpenAI's (temperature 1, top_p 1, no penalties) with the
/// llama.cpp/vLLM extensions switched off (top_k 0, min_p 0, repetition 1).
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
pub struct SamplingParams {
    /// Softmax temperature; 0 means greedy (argmax).
    pub temperature: f32,
    /// Keep the smallest set of tokens whose probability mass reaches this; 1 disables.
    pub top_p: f32,
    /// Keep only the k most likely tokens; 0 disables.
    pub top_k: i32,
    /// Drop tokens whose probability is below `min_p` times the most likely one's; 0 disables.
    pub min_p: f32,
    /// Divides positive (multiplies negative) logits of recently seen tokens; 1 disables.
    pub repetition_penalty: f32,
    /// Subtracted once from the logit of every token already generated (OpenAI semantics).
    pub presence_penalty: f32,
    /// Subtracted per occurrence from the logit of every token already generated.
    pub frequency_penalty: f32,
    /// How many of the most recent tokens the penalties look at; 0 means all of them.
    pub penalty_last_n: u32,
    /// Added to the logit of a token before anything else (OpenAI's `logit_bias`).
    pub logit_bias: BTreeMap<TokenId, f32>,
    /// Seed of the per-request random generator; `None` lets the engine derive one
    /// from the request id so that runs still repeat.
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            penalty_last_n: 64,
            logit_bias: BTreeMap::new(),
            seed: None,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding: always the most likely token.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            ..Self::default()
        }
    }

    /// Whether sampling reduces to argmax (no randomness involved).
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0 || self.top_k == 1
    }

    /// Whether the token is the argmax of the raw logits: greedy, with no
    /// bias and no penalty to adjust them first.
    pub fn is_plain_argmax(&self) -> bool {
        self.is_greedy() && self.logit_bias.is_empty() && !self.has_penalties()
    }

    /// Whether any penalty needs the token history.
    pub fn has_penalties(&self) -> bool {
        self.repetition_penalty != 1.0
            || self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
    }
}

/// When a completion ends (besides cancellation and errors).
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
pub struct StopConditions {
    /// Most tokens to generate.
    pub max_tokens: u32,
    /// Strings that end the completion; the matched string is not part of the output.
    pub stop: Vec<String>,
    /// Token ids that end the completion (the token is not part of the output text).
    pub stop_token_ids: Vec<TokenId>,
    /// Keep generating past the model's end-of-generation tokens.
    pub ignore_eos: bool,
}

impl Default for StopConditions {
    fn default() -> Self {
        Self {
            max_tokens: Self::DEFAULT_MAX_TOKENS,
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            ignore_eos: false,
        }
    }
}

impl StopConditions {
    /// `max_tokens` when a request names none.
    pub const DEFAULT_MAX_TOKENS: u32 = 256;

    /// Stop after `max_tokens` tokens and nothing else.
    pub fn max_tokens(max_tokens: u32) -> Self {
        Self {
            max_tokens,
            ..Self::default()
        }
    }
}
