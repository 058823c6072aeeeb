//! Tool calling data: the functions a chat may call, how it must choose,
//! and the calls a completion made.

/// One call of a function, as a model made it (or as an earlier assistant
/// turn of a chat records it).
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct ToolCall {
    /// The call's id (given by the caller in a chat's history; empty in a
    /// completion, whose renderer names it).
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "String::is_empty")
    )]
    pub id: String,
    /// The function's name.
    pub name: String,
    /// Its arguments, as JSON text.
    pub arguments: String,
}

/// A piece of a call as it is generated: the call's name with its first
/// piece, then more of its arguments' text (streamed as OpenAI streams
/// calls).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ToolCallDelta {
    /// Which call of the completion (0 for its first).
    pub index: usize,
    /// The function's name, in the call's first piece only.
    pub name: Option<String>,
    /// More of its arguments' text.
    pub arguments: String,
}

/// Whether and which function the model must call.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum ToolChoice {
    /// The model decides: it may answer in text or call functions.
    #[default]
    Auto,
    /// The model must call one of the functions (the output is constrained
    /// by a grammar to a call).
    Required,
    /// The model must call this function.
    Function(String),
}

/// The functions a chat request offers the model.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Tools {
    /// The function definitions as a JSON array of OpenAI's
    /// `{"type": "function", "function": {"name", "description", "parameters"}}`,
    /// handed to the chat template as `tools`.
    pub definitions: String,
    /// How the model must choose.
    #[cfg_attr(feature = "serde", serde(default))]
    pub choice: ToolChoice,
    /// Whether one answer may make several calls (`parallel_tool_calls`,
    /// true unless a request says otherwise, as OpenAI's default).
    #[cfg_attr(feature = "serde", serde(default = "several"))]
    pub parallel: bool,
}

#[cfg(feature = "serde")]
fn several() -> bool {
    true
}
