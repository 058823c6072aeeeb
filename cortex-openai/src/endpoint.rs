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
    /// `/v1/embeddings`: `input` (texts or token ids) in, a `list` of
    /// `embedding` objects out.
    Embeddings,
}

impl Endpoint {
    /// The URL path.
    pub fn url(self) -> &'static str {
        match self {
            Endpoint::ChatCompletions => "/v1/chat/completions",
            Endpoint::Completions => "/v1/completions",
            Endpoint::Responses => "/v1/responses",
            Endpoint::Embeddings => "/v1/embeddings",
        }
    }

    /// Parses a URL path.
    pub fn from_url(url: &str) -> Option<Self> {
        match url {
            "/v1/chat/completions" => Some(Endpoint::ChatCompletions),
            "/v1/completions" => Some(Endpoint::Completions),
            "/v1/responses" => Some(Endpoint::Responses),
            "/v1/embeddings" => Some(Endpoint::Embeddings),
            _ => None,
        }
    }
}

/// The format an item's output is rendered in, as the queue stores it (an
/// opaque tag to the queue): the endpoint's URL, plus
/// [`BASE64_EMBEDDINGS`] for embeddings asked for as base64.
pub(crate) fn output_tag(endpoint: Endpoint, base64: bool) -> String {
    if base64 {
        format!("{}{BASE64_EMBEDDINGS}", endpoint.url())
    } else {
        endpoint.url().to_owned()
    }
}

/// What [`output_tag`] wrote: the endpoint and whether embeddings are base64.
pub(crate) fn parse_output_tag(tag: &str) -> (Option<Endpoint>, bool) {
    match tag.strip_suffix(BASE64_EMBEDDINGS) {
        Some(url) => (Endpoint::from_url(url), true),
        None => (Endpoint::from_url(tag), false),
    }
}

/// The tag's suffix for `encoding_format: "base64"`.
const BASE64_EMBEDDINGS: &str = "?encoding_format=base64";
