//! What a request continues: text, tokens or a conversation.

use crate::TokenId;

/// What the model is asked to continue.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum Prompt {
    /// Raw text, tokenized by the engine with the model's vocabulary.
    Text(String),
    /// Token ids already in the model's vocabulary.
    Tokens(Vec<TokenId>),
    /// A conversation, rendered by the engine with the model's chat template.
    Chat(Vec<ChatMessage>),
    /// Several text or token prompts answered by one request (a
    /// `/v1/completions` prompt array): each gets the request's `n`
    /// completions, completion `p × n + k` continuing prompt `p`.
    Several(Vec<Prompt>),
}

impl Prompt {
    /// Whether there is nothing to condition on (no text, no tokens, no message content).
    pub fn is_empty(&self) -> bool {
        match self {
            Prompt::Text(text) => text.is_empty(),
            Prompt::Tokens(tokens) => tokens.is_empty(),
            Prompt::Chat(messages) => messages.iter().all(|m| m.content.is_empty()),
            Prompt::Several(prompts) => prompts.is_empty() || prompts.iter().any(Prompt::is_empty),
        }
    }

    /// The prompts it holds: those of [`Prompt::Several`], else itself.
    pub fn parts(&self) -> &[Prompt] {
        match self {
            Prompt::Several(prompts) => prompts,
            one => std::slice::from_ref(one),
        }
    }
}

impl From<&str> for Prompt {
    fn from(text: &str) -> Self {
        Prompt::Text(text.to_owned())
    }
}

impl From<String> for Prompt {
    fn from(text: String) -> Self {
        Prompt::Text(text)
    }
}

impl From<Vec<TokenId>> for Prompt {
    fn from(tokens: Vec<TokenId>) -> Self {
        Prompt::Tokens(tokens)
    }
}

impl From<Vec<ChatMessage>> for Prompt {
    fn from(messages: Vec<ChatMessage>) -> Self {
        Prompt::Chat(messages)
    }
}

/// One turn of a chat prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The message text.
    pub content: String,
    /// The text parts the caller sent it as (a list of parts), whose lines
    /// `content` joins; empty when it came as one string. A template that
    /// walks a list of parts gets them as such.
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Vec::is_empty")
    )]
    pub content_parts: Vec<String>,
    /// The function calls of an `assistant` turn.
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Vec::is_empty")
    )]
    pub tool_calls: Vec<crate::ToolCall>,
    /// The call a `tool` message answers.
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub tool_call_id: Option<String>,
    /// An earlier `assistant` turn's thinking, for templates that render
    /// it (`reasoning_content`; OpenAI-compatible servers also call it
    /// `reasoning`, gpt-oss's templates `thinking`).
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub reasoning_content: Option<String>,
}

impl ChatMessage {
    /// The roles chat templates understand.
    pub const ROLES: [&'static str; 5] = ["system", "developer", "user", "assistant", "tool"];

    /// A message with the given role and content.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            content_parts: Vec::new(),
            tool_calls: Vec::new(),
            tool_call_id: None,
            reasoning_content: None,
        }
    }

    /// A message sent as a list of text `parts`: its `content` is their
    /// lines, joined with newlines as llama.cpp joins them.
    pub fn from_parts(role: impl Into<String>, parts: Vec<String>) -> Self {
        let mut message = Self::new(role, parts.join("\n"));
        message.content_parts = parts;
        message
    }

    /// A `system` message.
    pub fn system(content: impl Into<String>) -> Self {
        Self::new("system", content)
    }

    /// A `user` message.
    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }

    /// An `assistant` message.
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new("assistant", content)
    }
}
