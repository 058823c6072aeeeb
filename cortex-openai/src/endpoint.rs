//! The OpenAI endpoints a batch line may name.

/// Which OpenAI endpoint a line asks for (plain lines map to one too).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Endpoint {
    /// `/v1/chat/completions`: `messages` in, `chat.completion` out.
    ChatCompletions,
    /// `/v1/completions`: `prompt` in, `text_completion` out.
    Completions,
    /// `/v1/responses`: `input` (and `instructions`) in, `response` out.
    Responses,
}

impl Endpoint {
    /// The URL path.
    pub fn url(self) -> &'static str {
        match self {
            Endpoint::ChatCompletions => "/v1/chat/completions",
            Endpoint::Completions => "/v1/completions",
            Endpoint::Responses => "/v1/responses",
        }
    }

    /// Parses a URL path.
    pub fn from_url(url: &str) -> Option<Self> {
        match url {
            "/v1/chat/completions" => Some(Endpoint::ChatCompletions),
            "/v1/completions" => Some(Endpoint::Completions),
            "/v1/responses" => Some(Endpoint::Responses),
            _ => None,
        }
    }
}
