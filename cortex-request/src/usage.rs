//! Token counts and latencies of a finished request.

use std::time::Duration;

/// Token counts of one request, as the OpenAI API reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Usage {
    /// Tokens in the prompt (after chat templating).
    pub prompt_tokens: u32,
    /// Tokens generated, over all `n` completions.
    pub completion_tokens: u32,
    /// Prompt tokens whose KV was reused from a shared prefix instead of computed.
    pub cached_prompt_tokens: u32,
}

impl Usage {
    /// Prompt plus completion tokens.
    pub fn total_tokens(&self) -> u32 {
        self.prompt_tokens + self.completion_tokens
    }
}

/// When things happened to a request, measured from its submission.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Timings {
    /// Time spent waiting before the first step that worked on it.
    pub queued: Duration,
    /// Time until the first generated token (`None` if none was generated).
    pub first_token: Option<Duration>,
    /// Time until it ended.
    pub finished: Duration,
}

impl Timings {
    /// Generated tokens per second after the first one (`None` when undefined).
    pub fn decode_tokens_per_second(&self, completion_tokens: u32) -> Option<f64> {
        let first = self.first_token?;
        let decoding = self.finished.checked_sub(first)?.as_secs_f64();
        (completion_tokens > 1 && decoding > 0.0)
            .then(|| f64::from(completion_tokens - 1) / decoding)
    }
}
