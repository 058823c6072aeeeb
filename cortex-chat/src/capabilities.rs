//! What a template renders, found by rendering probe conversations once
//! when it is compiled (as llama.cpp's template capabilities are): whether
//! it takes a system message, the tools on offer, earlier tool calls; how
//! it writes calls and thinking.

use cortex_request::{ChatMessage, ToolCall, Tools};
use serde_json::{Value, json};

use crate::conversation::Conversation;
use crate::native::{self, NativeCalls, probe};
use crate::syntax::ReasoningMarkers;

/// What a template was found to render.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Capabilities {
    /// It renders a system message (some refuse one, some drop it).
    pub(crate) system_role: bool,
    /// It renders a `developer` message as such (gpt-oss's harmony format);
    /// elsewhere one is the system message, as OpenAI takes it for models
    /// without that role.
    pub(crate) developer_role: bool,
    /// It renders the tools on offer.
    pub(crate) takes_tools: bool,
    /// It renders an assistant turn's tool calls and a tool's result.
    pub(crate) renders_calls: bool,
    /// It renders calls only with their arguments as the JSON text OpenAI
    /// sends, not as an object (functionary v3.2 writes `'\n' +
    /// arguments`): as llama.cpp finds a template that does not require
    /// object arguments, such a template gets the text.
    pub(crate) string_arguments: bool,
    /// How the model writes calls in its answer's text, for a template that
    /// renders none (LFM2, Granite 3.3): earlier calls are written so.
    pub(crate) content_calls: Option<ContentCalls>,
    /// How it writes calls, when that could be read from it.
    pub(crate) native_calls: Option<NativeCalls>,
    /// gpt-oss's channels (`<|channel|>`): calls and thinking are messages.
    pub(crate) channels: bool,
    /// functionary v3.2's recipients (`>>>all`): the answer and each call
    /// are messages, the first addressed after the prompt's `>>>`.
    pub(crate) recipients: bool,
    /// How it marks thinking.
    pub(crate) reasoning: Option<ReasoningMarkers>,
    /// Its generation prompt closes an empty thinking block unless
    /// `enable_thinking` is set (see `ChatTemplate::closes_thinking_unless_enabled`).
    pub(crate) thinking_closed_unless_enabled: bool,
    /// It walks a message's content given as a list of text parts (see
    /// `ChatTemplate::walks_parts`): such content reaches it as a list.
    pub(crate) walks_parts: bool,
    /// The same, for a system message's.
    pub(crate) walks_system_parts: bool,
}

/// How a family whose template renders no calls has its model write them:
/// in the answer's text, in a syntax the template names (and cortex's
/// output parser reads).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ContentCalls {
    /// LFM2 (its template lists tools after `List of tools: `, between
    /// `<|tool_list_start|>` and `<|tool_list_end|>` in LFM2's):
    /// `<|tool_call_start|>[name(key="value")]<|tool_call_end|>`, then the
    /// answer.
    PythonList,
    /// Granite 3 (its template tells the model to answer with
    /// `<|tool_call|>`): the answer, then `<|tool_call|>` and a JSON array
    /// of `{"name", "arguments"}`.
    MarkedJson,
}

impl ContentCalls {
    fn of_template(source: &str) -> Option<Self> {
        if source.contains("<|tool_list_start|>") || source.contains("List of tools: [") {
            Some(Self::PythonList)
        } else if source.contains("<|tool_call|>") {
            Some(Self::MarkedJson)
        } else {
            None
        }
    }

    /// An assistant turn's `content` and `calls` as the model writes them
    /// in this syntax; `None` when a call cannot be written in it (LFM2's
    /// Python takes only arguments that are keywords).
    pub(crate) fn write(self, content: &str, calls: &[ToolCall]) -> Option<String> {
        match self {
            Self::PythonList => {
                let calls = crate::python_calls::write_python_calls(calls)?;
                Some(format!(
                    "<|tool_call_start|>{calls}<|tool_call_end|>{content}"
                ))
            }
            Self::MarkedJson => {
                let calls = named_calls(calls);
                Some(if content.trim().is_empty() {
                    format!("<|tool_call|>{calls}")
                } else {
                    format!("{content}<|tool_call|>{calls}")
                })
            }
        }
    }
}

/// `calls` as a JSON array of `{"name", "arguments"}`, the arguments an
/// object where they parse as JSON (the form of Granite's calls and of
/// cortex's envelope).
pub(crate) fn named_calls(calls: &[ToolCall]) -> Value {
    calls
        .iter()
        .map(|call| {
            let arguments = serde_json::from_str::<Value>(&call.arguments)
                .unwrap_or_else(|_| Value::String(call.arguments.clone()));
            json!({"name": call.name, "arguments": arguments})
        })
        .collect()
}

impl Capabilities {
    /// Whether content parts of a message of `role` reach the template as
    /// a list.
    pub(crate) fn walks_parts_of(&self, role: &str) -> bool {
        if role == "system" {
            self.walks_system_parts
        } else {
            self.walks_parts
        }
    }
}

/// An answer no template writes on its own.
const ANSWER: &str = "ZQXJ answer";
const QUESTION: &str = "ZQXJ question";
const SYSTEM: &str = "ZQXJ system";

impl Capabilities {
    /// What the template `source` renders, as `render` (it, without a
    /// generation prompt) shows.
    pub(crate) fn probe(
        render: impl Fn(&Conversation<'_>) -> Option<String>,
        source: &str,
    ) -> Self {
        let tools = probe_tools();
        let render = |messages: &[ChatMessage], tools: Option<&Tools>| {
            render(&Conversation {
                messages,
                tools,
                variables: None,
            })
        };
        let user = ChatMessage::user(QUESTION);
        let system_role = render(&[ChatMessage::system(SYSTEM), user.clone()], None)
            .is_some_and(|text| text.contains(SYSTEM));
        // Named in the template itself: a ChatML template writes any role it
        // is given, which the model never saw for this one.
        let names_developer = source.contains("'developer'") || source.contains("\"developer\"");
        let developer_role = names_developer
            && render(&[ChatMessage::new("developer", SYSTEM), user.clone()], None)
                .is_some_and(|text| text.contains(SYSTEM));
        let takes_tools = render(std::slice::from_ref(&user), Some(&tools))
            .is_some_and(|text| text.contains(probe::FIRST));
        let answered = render(
            &[user.clone(), ChatMessage::assistant(ANSWER)],
            Some(&tools),
        );
        let one = calls_text(
            answered.as_deref(),
            render(&[user.clone(), call_turn(false)], Some(&tools)).as_deref(),
        );
        let two = calls_text(
            answered.as_deref(),
            render(&[user, call_turn(true)], Some(&tools)).as_deref(),
        );
        let renders_calls = one.as_deref().is_some_and(|t| t.contains(probe::FIRST));
        let reasoning = ReasoningMarkers::of_template(source);
        // The calls as a model writes them after its thinking.
        let after_thinking = |text: &str| match &reasoning {
            Some(markers) => markers.after(text).to_owned(),
            None => text.to_owned(),
        };
        let native_calls = match &one {
            Some(one) if renders_calls => native::learn(
                &after_thinking(one),
                two.as_deref().map(after_thinking).as_deref(),
            ),
            _ => None,
        };
        Self {
            system_role,
            developer_role,
            takes_tools,
            renders_calls,
            // Asked again with the arguments as text, once these are known.
            string_arguments: false,
            content_calls: if renders_calls {
                None
            } else {
                ContentCalls::of_template(source)
            },
            native_calls,
            channels: source.contains("<|channel|>"),
            recipients: source.contains(">>>all"),
            reasoning,
            // Learned by rendering more, once these are known.
            thinking_closed_unless_enabled: false,
            walks_parts: false,
            walks_system_parts: false,
        }
    }
}

/// How a template (`render`) writes `calls` in an assistant's turn.
pub(crate) fn written_calls(
    render: impl Fn(&Conversation<'_>) -> Option<String>,
    calls: &[ToolCall],
) -> Option<String> {
    let tools = probe_tools();
    let render = |messages: &[ChatMessage]| {
        render(&Conversation {
            messages,
            tools: Some(&tools),
            variables: None,
        })
    };
    let user = ChatMessage::user(QUESTION);
    let mut turn = ChatMessage::assistant("");
    turn.tool_calls = calls.to_vec();
    let answered = render(&[user.clone(), ChatMessage::assistant(ANSWER)]);
    calls_text(answered.as_deref(), render(&[user, turn]).as_deref())
        .filter(|text| calls.iter().all(|c| text.contains(&c.name)))
}

/// Tools offering the two probe functions.
fn probe_tools() -> Tools {
    let function = |name: &str| {
        serde_json::json!({"type": "function", "function": {
            "name": name,
            "description": "A probe.",
            // Each part a strict template reads (Command R+'s needs every
            // parameter described, and which are required).
            "parameters": {"type": "object", "properties": {
                probe::KEY_A: {"type": "string", "description": "A probe's argument."},
                probe::KEY_B: {"type": "string", "description": "A probe's argument."},
            }, "required": [probe::KEY_A, probe::KEY_B]},
        }})
    };
    Tools {
        definitions: serde_json::json!([function(probe::FIRST), function(probe::SECOND)])
            .to_string(),
        choice: cortex_request::ToolChoice::Auto,
        parallel: true,
    }
}

/// An assistant turn calling the first probe function with one argument,
/// or (`two`) with two and then the second with one.
fn call_turn(two: bool) -> ChatMessage {
    let call = |id: &str, name: &str, arguments: Value| ToolCall {
        id: id.to_owned(),
        name: name.to_owned(),
        arguments: arguments.to_string(),
    };
    let mut turn = ChatMessage::assistant("");
    turn.tool_calls = if two {
        vec![
            call(
                probe::ID_FIRST,
                probe::FIRST,
                serde_json::json!({probe::KEY_A: probe::VALUE_A, probe::KEY_B: probe::VALUE_B}),
            ),
            call(
                probe::ID_SECOND,
                probe::SECOND,
                serde_json::json!({probe::KEY_A: probe::VALUE_A}),
            ),
        ]
    } else {
        vec![call(
            probe::ID_FIRST,
            probe::FIRST,
            serde_json::json!({probe::KEY_A: probe::VALUE_A}),
        )]
    };
    turn
}

/// What a template wrote for a turn of calls (`calls`) where it would have
/// written the answer (`answered`): the two renders without what they
/// share before and after, widened to whole markers (`<|START_ACTION|>`
/// and `<|START_RESPONSE|>` share `<|START_`).
fn calls_text(answered: Option<&str>, calls: Option<&str>) -> Option<String> {
    let (answered, calls) = (answered?, calls?);
    let mut start = answered
        .char_indices()
        .zip(calls.chars())
        .find(|((_, a), c)| a != c)
        .map_or(answered.len().min(calls.len()), |((i, _), _)| i);
    let suffix = answered[start..]
        .chars()
        .rev()
        .zip(calls[start..].chars().rev())
        .take_while(|(a, c)| a == c)
        .map(|(a, _)| a.len_utf8())
        .sum::<usize>();
    let mut end = calls.len() - suffix;
    // A marker opened before the cut and not closed: start at its opening.
    if let Some(open) = calls[..start].rfind(['<', '['])
        && !calls[open..start].contains(['>', ']'])
    {
        start = open;
    }
    // A marker closed after the cut and not opened: end after its closing.
    if let Some(close) = calls[end..].find(['>', ']'])
        && !calls[end..end + close].contains(['<', '['])
    {
        end += close + 1;
    }
    Some(calls[start..end].to_owned())
}
