//! Request and response data for cortex.
//!
//! This crate is plain data that every other layer speaks: a [`Request`] holds
//! its [`Prompt`] (text, token ids or chat messages), [`SamplingParams`],
//! [`StopConditions`], priority and `n`; it moves through the [`RequestState`]
//! lifecycle (only legal transitions), and ends with a [`FinishReason`],
//! [`Usage`] and [`Timings`], collected in a [`Response`]. [`Request::validate`]
//! checks every field and returns a [`ValidationError`] that names the field and
//! the bad value.
//!
//! It knows nothing of llama.cpp, SQLite or threads. Enable the `serde` feature
//! to (de)serialize the types.
//!
//! # Example
//!
//! ```
//! use cortex_request::{Limits, Request, RequestId, RequestState, SamplingParams};
//!
//! let mut request = Request::new(RequestId(7), "Write a haiku about rust.");
//! request.sampling = SamplingParams { temperature: 0.7, top_p: 0.9, ..SamplingParams::default() };
//! request.stop.max_tokens = 48;
//! request.stop.stop = vec!["\n\n".into()];
//! assert!(request.validate(&Limits::default()).is_ok());
//!
//! request.sampling.top_p = 1.5;
//! let error = request.validate(&Limits::default()).unwrap_err();
//! assert_eq!(error.field(), "top_p");
//! assert_eq!(error.to_string(), "top_p = 1.5 is out of range: expected a number in (0, 1]");
//!
//! let mut state = RequestState::Pending;
//! state.transition(RequestState::Prefilling).unwrap();
//! assert!(state.transition(RequestState::Pending).is_ok()); // preempted, recomputed later
//! assert!(RequestState::Finished.transition(RequestState::Decoding).is_err());
//! ```
//!
//! # Design notes
//!
//! Plain data: `Request` (id, `Prompt` as text / tokens / chat messages,
//! `SamplingParams`, `StopConditions`, priority, `n`), `EmbeddingRequest` (inputs
//! as text or tokens), `Work` (what a queued item asks for: one of the two), `RequestState` with only
//! the legal transitions (Pending → Prefilling → Decoding → Finished, Failed or
//! Cancelled from any live state, back to Pending on preemption), `FinishReason`,
//! `Usage`, `Timings`, `Completion`, `Response` (completions, or for an
//! embedding request one vector per input). `Request::validate` returns a
//! `ValidationError` naming the field and the bad value. serde is behind a feature.

#![forbid(unsafe_code)]

mod civil;
mod embed;
mod params;
mod prompt;
mod state;
mod suggest;
mod tools;
mod usage;
mod validate;

use std::fmt;

pub use civil::civil_date;
pub use embed::{EmbedInputError, EmbeddingRequest, Work};
pub use params::{SamplingParams, StopConditions};
pub use prompt::{ChatMessage, Prompt};
pub use state::{FinishReason, InvalidTransition, RequestState};
pub use suggest::closest_name;
pub use tools::{ToolCall, ToolCallDelta, ToolChoice, Tools};
pub use usage::{Timings, Usage};
pub use validate::{Limits, ValidationError};

/// A token id in the model's vocabulary.
pub type TokenId = u32;

/// Identifies a request within one engine or job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(transparent))]
pub struct RequestId(pub u64);

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "req-{}", self.0)
    }
}

/// One generation request.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Request {
    /// Its id, unique among the requests an engine holds.
    pub id: RequestId,
    /// What to continue.
    pub prompt: Prompt,
    /// How tokens are chosen.
    pub sampling: SamplingParams,
    /// When each completion ends.
    pub stop: StopConditions,
    /// Higher runs first; equal priorities run in arrival order.
    pub priority: i32,
    /// Number of completions of each prompt (they share its KV).
    pub n: u32,
    /// Report the log probability of each generated token, with this many
    /// most likely alternatives (0 to [`Request::MAX_TOP_LOGPROBS`]) at each
    /// position; `None` reports none.
    #[cfg_attr(feature = "serde", serde(default))]
    pub logprobs: Option<u32>,
    /// Report the log probability of each prompt token given the tokens
    /// before it (what evaluation harnesses score, OpenAI's `echo`), with
    /// this many most likely alternatives at each position (0 to
    /// [`Request::MAX_TOP_LOGPROBS`]). The prompt is then computed whole,
    /// none of it taken from the prefix cache, and `max_tokens` may be 0.
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub prompt_logprobs: Option<u32>,
    /// What every completion must match: a GBNF grammar (llama.cpp's
    /// format) whose `root` rule the whole generated text matches. Tokens it
    /// rejects are never drawn; the others keep their relative odds.
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub grammar: Option<String>,
    /// Functions a chat offers the model: rendered by the chat template,
    /// and the calls in each completion's text parsed into
    /// [`Completion::tool_calls`].
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub tools: Option<Tools>,
    /// More variables for the chat template: a JSON object (a request's
    /// `chat_template_kwargs`, such as Qwen3's `enable_thinking`, and its
    /// `reasoning_effort`), each key a variable the template reads.
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub template_variables: Option<String>,
    /// Leave the model's thinking out of the completions (vLLM's
    /// `include_reasoning: false`): it is split from the answer and dropped.
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "std::ops::Not::not")
    )]
    pub omit_reasoning: bool,
    /// Which requests may reuse this one's cached prompt prefix, and whose it
    /// may reuse: only those of the same scope. A server gives each project
    /// its own, so that no project learns another's prompts from how fast
    /// (or how cheaply, in `cached_tokens`) its own are answered.
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "CacheScope::is_shared")
    )]
    pub cache_scope: CacheScope,
    /// Which chat template renders the messages: a registered model's
    /// own, where it shares its weights (and so its engine) with another
    /// name. Not stored with a request: whoever submits it sets it.
    #[cfg_attr(feature = "serde", serde(skip))]
    pub chat_template: ChatTemplateChoice,
}

/// Which chat template renders a chat request (see [`Request::chat_template`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum ChatTemplateChoice {
    /// The one the engine was started with.
    #[default]
    Engine,
    /// The model file's own (its GGUF's), whatever the engine was started with.
    ModelFile,
    /// This one: a Jinja template's text, or a name llama.cpp renders.
    Given(std::sync::Arc<str>),
}

impl ChatTemplateChoice {
    /// A registered model's template (`TEMPLATE`), or else its file's own.
    pub fn of_model(template: Option<&str>) -> Self {
        template.map_or(Self::ModelFile, |t| Self::Given(t.into()))
    }

    /// Whether it is the engine's own (what a request leaves unset).
    pub fn is_engine(&self) -> bool {
        *self == Self::Engine
    }
}

/// A partition of the prompt-prefix cache (see [`Request::cache_scope`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(transparent))]
pub struct CacheScope(pub u64);

impl CacheScope {
    /// The scope of requests that set none: all of them share it.
    pub const SHARED: Self = Self(0);

    /// The scope named `name` (a project's): the same name gives the same
    /// scope within a process, and never [`CacheScope::SHARED`].
    pub fn named(name: &str) -> Self {
        use std::hash::{Hash, Hasher};
        // Fixed keys: stable across threads and runs of one build.
        let mut hasher = std::hash::DefaultHasher::new();
        name.hash(&mut hasher);
        Self(hasher.finish().max(1))
    }

    /// A scope of its own for the sequence numbered `n` (unique within
    /// an engine): what it computes is reused by no other sequence. (Its
    /// values and [`CacheScope::named`]'s may meet only by a 64-bit hash
    /// collision.)
    pub fn private(n: u64) -> Self {
        Self(n.wrapping_mul(0xD6E8_FEB8_6659_FD93).rotate_left(17).max(1))
    }

    /// Whether this is the shared scope.
    pub fn is_shared(&self) -> bool {
        *self == Self::SHARED
    }
}

impl Request {
    /// A request with default sampling, stop conditions, priority 0 and `n` = 1.
    pub fn new(id: RequestId, prompt: impl Into<Prompt>) -> Self {
        Self {
            id,
            prompt: prompt.into(),
            sampling: SamplingParams::default(),
            stop: StopConditions::default(),
            priority: 0,
            n: 1,
            logprobs: None,
            prompt_logprobs: None,
            grammar: None,
            tools: None,
            template_variables: None,
            omit_reasoning: false,
            cache_scope: CacheScope::SHARED,
            chat_template: ChatTemplateChoice::Engine,
        }
    }

    /// Most alternatives per position a request may ask log probabilities of.
    pub const MAX_TOP_LOGPROBS: u32 = 20;

    /// How many completions it asks for: `n` for each of its prompts.
    pub fn choices(&self) -> u32 {
        (self.prompt.parts().len() as u32).saturating_mul(self.n)
    }
}

/// A token and its log probability.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct TopLogprob {
    /// The token.
    pub token: TokenId,
    /// The bytes it stands for.
    pub bytes: Vec<u8>,
    /// Its natural-log probability.
    pub logprob: f32,
}

/// The log probability of a generated token and the most likely tokens at
/// its position, from the logits the sampler chose from after logit bias and
/// penalties, before temperature and truncation (so they do not depend on
/// the sampling settings that only reshape the draw).
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct TokenLogprob {
    /// The generated token, its bytes and its log probability.
    pub chosen: TopLogprob,
    /// The most likely tokens at this position, most likely first.
    pub top: Vec<TopLogprob>,
}

/// A prompt token, with its log probability given the tokens before it
/// (none for the first) and the most likely tokens at its position.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct PromptToken {
    /// The token.
    pub token: TokenId,
    /// The bytes it stands for.
    pub bytes: Vec<u8>,
    /// Its natural-log probability after the tokens before it; `None` for
    /// the first token, which nothing precedes.
    pub logprob: Option<f32>,
    /// The most likely tokens at its position, most likely first.
    pub top: Vec<TopLogprob>,
}

/// One finished completion of a request.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Completion {
    /// Which of the `n` completions this is.
    pub index: u32,
    /// The generated text, without any matched stop string.
    pub text: String,
    /// The generated token ids.
    pub tokens: Vec<TokenId>,
    /// Why it ended.
    pub finish_reason: FinishReason,
    /// Per generated token (the ending EOS or stop token excepted), when the
    /// request asked for log probabilities.
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub logprobs: Option<Vec<TokenLogprob>>,
    /// Every token of the prompt it continues, with log probabilities, when
    /// the request asked for them ([`Request::prompt_logprobs`]).
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub prompt_logprobs: Option<Vec<PromptToken>>,
    /// The function calls the model made, when the request offered tools
    /// and the text held calls (`text` is then what was around them).
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Vec::is_empty")
    )]
    pub tool_calls: Vec<ToolCall>,
    /// The model's thinking, split from `text` (for a chat whose template
    /// marks thinking: `<think>`, gpt-oss's analysis channel, ...).
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub reasoning: Option<String>,
}

/// The outcome of a request: its completions, usage and timings.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Response {
    /// The request this answers.
    pub id: RequestId,
    /// One entry per completion, in index order.
    pub completions: Vec<Completion>,
    /// Token counts.
    pub usage: Usage,
    /// Latencies.
    pub timings: Timings,
    /// For an [`EmbeddingRequest`]: one vector per input, in input order
    /// (no completions then; `usage.prompt_tokens` counts every input).
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Vec::is_empty")
    )]
    pub embeddings: Vec<Vec<f32>>,
}

#[cfg(all(test, feature = "serde"))]
mod serde_tests {
    use super::*;

    #[test]
    fn request_round_trips_through_json() {
        let mut request = Request::new(RequestId(3), vec![ChatMessage::user("hi")]);
        request.sampling.logit_bias.insert(5, -1.5);
        request.stop.stop = vec!["END".into()];
        let json = serde_json::to_string(&request).unwrap();
        let back: Request = serde_json::from_str(&json).unwrap();
        assert_eq!(back, request);
    }
}
