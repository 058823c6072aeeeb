//! What a chat template renders.

use cortex_request::{ChatMessage, Tools};

/// What a template renders: a conversation, the functions on offer, and
/// the caller's own template variables.
#[derive(Debug, Clone, Copy, Default)]
pub struct Conversation<'a> {
    /// The turns, in order.
    pub messages: &'a [ChatMessage],
    /// The functions on offer (a JSON array of OpenAI function tools,
    /// handed to the template as `tools`; left undefined when `None`, so
    /// templates that test `tools is defined` see none) and how the model
    /// must choose among them.
    pub tools: Option<&'a Tools>,
    /// More template variables: a JSON object (a request's
    /// `chat_template_kwargs`, its `reasoning_effort`), each key a variable.
    pub variables: Option<&'a str>,
}

impl<'a> Conversation<'a> {
    /// Just these messages.
    pub fn new(messages: &'a [ChatMessage]) -> Self {
        Self {
            messages,
            ..Self::default()
        }
    }
}
