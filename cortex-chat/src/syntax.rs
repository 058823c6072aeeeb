//! How a chat's output is read: the thinking split from the answer, and
//! function calls read out of it, in the template's own syntax
//! (`native`), cortex's generic JSON envelope (templates without tools),
//! or gpt-oss's channels.

use cortex_request::ToolCall;
use serde_json::Value;

use crate::native::{Found, NativeCalls};
use crate::open_calls::{CallSoFar, common_calls_so_far, envelope_calls_so_far};

/// How one chat's output is read (made with its prompt by
/// [`crate::ChatTemplate::render_chat`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OutputSyntax {
    pub(crate) reasoning: Option<ReasoningMarkers>,
    /// The prompt ends inside an open thinking block (`<think>\n`), so the
    /// output starts with thinking.
    pub(crate) starts_in_reasoning: bool,
    pub(crate) calls: CallSyntax,
    /// Only the first call counts (`parallel_tool_calls: false`).
    pub(crate) one_call: bool,
}

/// The text that opens and closes a model's thinking.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReasoningMarkers {
    pub(crate) open: &'static str,
    pub(crate) close: &'static str,
}

/// The thinking markers templates use, most specific first.
const REASONING_MARKERS: [(&str, &str); 9] = [
    ("<seed:think>", "</seed:think>"),
    ("<think:opensource>", "</think:opensource>"),
    ("<mm:think>", "</mm:think>"),
    ("<think>", "</think>"),
    ("[THINK]", "[/THINK]"),
    ("<|START_THINKING|>", "<|END_THINKING|>"),
    ("<|channel>thought", "<channel|>"),
    ("<|open|>think<|sep|>", "<|close|>think<|sep|>"),
    ("◁think▷", "◁/think▷"),
];

impl ReasoningMarkers {
    /// `text` after a thinking block at its start (all of it when none).
    pub(crate) fn after<'t>(&self, text: &'t str) -> &'t str {
        let start = text.trim_start();
        match start.strip_prefix(self.open) {
            Some(thinking) => match thinking.find(self.close) {
                Some(end) => &thinking[end + self.close.len()..],
                None => text,
            },
            // An empty block's close alone (`</think>` after a prompt's `<think>`).
            None => start.strip_prefix(self.close).unwrap_or(text),
        }
    }

    /// The markers `source` (a template) writes, if any.
    pub(crate) fn of_template(source: &str) -> Option<Self> {
        // A template may name only the closing tag (DeepSeek R1's strips
        // `</think>` from history; its generation prompt opens `<think>`).
        REASONING_MARKERS
            .iter()
            .find(|(open, close)| source.contains(open) || source.contains(close))
            .map(|&(open, close)| Self { open, close })
    }
}

/// How calls are written, when tools are on offer.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) enum CallSyntax {
    /// No tools offered: the output is an answer.
    #[default]
    None,
    /// The template's own syntax (when learned), then the common ones.
    Native(Option<Box<NativeCalls>>),
    /// cortex's JSON envelope for templates without tools:
    /// `{"tool_calls": [{"name", "arguments"}]}` or `{"response": "..."}`.
    Generic,
    /// gpt-oss's channels: `<|channel|>commentary to=functions.NAME ...<|message|>ARGS<|call|>`.
    Channels,
    /// functionary v3.2's recipients: the prompt ends with `>>>`, and the
    /// output is messages `RECIPIENT\nTEXT` joined by `>>>`: `all` the
    /// answer, any other name a call to that function, its text the
    /// arguments as JSON.
    Recipients,
}

/// A chat's output read: the answer, the thinking, the calls.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ParsedOutput {
    /// The answer's text (without thinking and calls).
    pub content: String,
    /// The model's thinking, when its template has a syntax for it and it
    /// thought.
    pub reasoning: Option<String>,
    /// The function calls it made (when tools were on offer).
    pub tool_calls: Vec<ToolCall>,
}

impl OutputSyntax {
    /// Output read as it is: no thinking, no calls.
    pub fn plain() -> Self {
        Self::default()
    }

    /// Whether the output is read at all (thinking or calls).
    pub fn is_plain(&self) -> bool {
        self.reasoning.is_none() && self.calls == CallSyntax::None
    }

    /// Whether the prompt opened a thinking block (the output starts in it).
    pub fn starts_in_reasoning(&self) -> bool {
        self.starts_in_reasoning
    }

    /// The text that closes the model's thinking, if it marks it.
    pub fn reasoning_close(&self) -> Option<&str> {
        self.reasoning.as_ref().map(|m| m.close)
    }

    /// Whether calls are read out of the output.
    pub fn reads_calls(&self) -> bool {
        self.calls != CallSyntax::None
    }

    /// The marker texts the model writes as special tokens that must be
    /// kept in the text (`<tool_call>`, `<think>`, `[TOOL_CALLS]`), for
    /// the output to be read.
    pub fn marker_texts(&self) -> Vec<&str> {
        let mut texts = Vec::new();
        if let Some(markers) = &self.reasoning {
            texts.extend([markers.open, markers.close]);
        }
        match &self.calls {
            CallSyntax::Native(Some(native)) => texts.extend(native.marker_texts()),
            CallSyntax::Native(None) => texts.extend(["<tool_call>", "</tool_call>"]),
            CallSyntax::Channels => texts.extend(CHANNEL_MARKERS),
            CallSyntax::None | CallSyntax::Generic | CallSyntax::Recipients => {}
        }
        texts.extend(
            ["[TOOL_CALLS]", "<|python_tag|>"]
                .iter()
                .filter(|_| self.reads_calls()),
        );
        texts
    }

    /// Reads a whole output. One that ends inside a call (cut by the token
    /// limit) keeps it as a call, with its arguments as far as they go, as
    /// OpenAI does; nothing of a call is ever its text.
    pub fn parse(&self, text: &str) -> ParsedOutput {
        let mut parsed = self.parse_all(text);
        if self.reads_calls()
            && let (so_far, Some(open)) = self.so_far(text)
            && (open.marked || open.name.is_some())
        {
            parsed.content = so_far.content;
            parsed.tool_calls = so_far.tool_calls;
            parsed.tool_calls.extend(open.into_call());
        }
        if self.one_call {
            parsed.tool_calls.truncate(1);
        }
        parsed
    }

    fn parse_all(&self, text: &str) -> ParsedOutput {
        if self.calls == CallSyntax::Channels {
            return channels(text);
        }
        if self.calls == CallSyntax::Recipients {
            return recipients_of(text, true).0;
        }
        let (reasoning, answer) = self.split_reasoning(text);
        // An answer read for thinking or calls starts at its first word (so
        // does what a stream tells of it).
        let answer = answer.trim_start();
        let (content, tool_calls) = match &self.calls {
            CallSyntax::None => (answer.to_owned(), Vec::new()),
            CallSyntax::Generic => generic(answer),
            CallSyntax::Native(native) => {
                let found = native
                    .as_ref()
                    .and_then(|n| n.parse(answer))
                    .or_else(|| common_calls(answer));
                match found {
                    Some(Found { content, calls }) => (content, calls),
                    None => (answer.to_owned(), Vec::new()),
                }
            }
            CallSyntax::Channels | CallSyntax::Recipients => unreachable!("read above"),
        };
        ParsedOutput {
            content,
            reasoning,
            tool_calls,
        }
    }

    /// Of an output still being written: the answer and thinking so far
    /// (without what may yet be a marker, or trailing space), the calls
    /// written whole, each a start of what [`OutputSyntax::parse`] gives of
    /// the whole output; and the call being written.
    pub(crate) fn so_far(&self, text: &str) -> (ParsedOutput, Option<CallSoFar>) {
        let (mut parsed, mut open) = self.so_far_all(text);
        if self.one_call && !parsed.tool_calls.is_empty() {
            parsed.tool_calls.truncate(1);
            open = None;
        }
        (parsed, open)
    }

    fn so_far_all(&self, text: &str) -> (ParsedOutput, Option<CallSoFar>) {
        let mut parsed = ParsedOutput::default();
        if self.calls == CallSyntax::Channels {
            return channels_so_far(text);
        }
        if self.calls == CallSyntax::Recipients {
            return recipients_of(held_back(text, &[RECIPIENTS_SEPARATOR]), false);
        }
        let answer = match &self.reasoning {
            None => text,
            Some(markers) => {
                let start = text.trim_start();
                let thinking = if is_partial(start, markers.open) {
                    // `<thi`: thinking or not, it cannot be told yet.
                    return (parsed, None);
                } else if let Some(rest) = start.strip_prefix(markers.open) {
                    Some(rest)
                } else if self.starts_in_reasoning {
                    Some(start)
                } else {
                    None
                };
                match thinking {
                    None => text,
                    Some(thinking) => match thinking.find(markers.close) {
                        Some(end) => {
                            let reasoning = thinking[..end].trim();
                            parsed.reasoning =
                                (!reasoning.is_empty()).then(|| reasoning.to_owned());
                            &thinking[end + markers.close.len()..]
                        }
                        None => {
                            let so_far = held_back(thinking, &[markers.close]).trim();
                            parsed.reasoning = (!so_far.is_empty()).then(|| so_far.to_owned());
                            return (parsed, None);
                        }
                    },
                }
            }
        };
        let answer = answer.trim_start();
        let mut open = None;
        match &self.calls {
            CallSyntax::None => parsed.content = answer.trim_end().to_owned(),
            CallSyntax::Generic => (parsed.tool_calls, open) = envelope_calls_so_far(answer),
            CallSyntax::Native(native) => {
                let learned = native.as_ref().and_then(|n| n.calls_so_far(answer));
                let common = COMMON_MARKERS
                    .iter()
                    .filter_map(|marker| answer.find(marker))
                    .chain(answer.starts_with(['{', '[']).then_some(0))
                    .min();
                let start = match (&learned, common) {
                    (Some((start, ..)), Some(common)) => (*start).min(common),
                    (Some((start, ..)), None) => *start,
                    (None, common) => common.unwrap_or(answer.len()),
                };
                match learned {
                    Some((learned_start, calls, call)) if learned_start == start => {
                        parsed.tool_calls = calls;
                        open = call;
                    }
                    _ if Some(start) == common => {
                        (parsed.tool_calls, open) = common_calls_so_far(&answer[start..]);
                    }
                    _ => {}
                }
                let before = &answer[..start];
                let before = if start == answer.len() {
                    let mut markers = self.marker_texts();
                    markers.extend(COMMON_MARKERS);
                    held_back(before, &markers)
                } else {
                    before
                };
                parsed.content = before.trim_end().to_owned();
            }
            CallSyntax::Channels | CallSyntax::Recipients => unreachable!("read above"),
        }
        (parsed, open)
    }

    /// The thinking at the start of `text` (or all of it, unfinished), and
    /// the rest.
    fn split_reasoning<'t>(&self, text: &'t str) -> (Option<String>, &'t str) {
        let Some(markers) = &self.reasoning else {
            return (None, text);
        };
        let thinking = if self.starts_in_reasoning {
            // The template opened the block; the model may open it again.
            let start = text.trim_start();
            start.strip_prefix(markers.open).unwrap_or(start)
        } else {
            match text.trim_start().strip_prefix(markers.open) {
                Some(rest) => rest,
                None => return (None, text),
            }
        };
        match thinking.find(markers.close) {
            Some(end) => {
                let reasoning = thinking[..end].trim();
                let answer = thinking[end + markers.close.len()..].trim_start();
                (
                    (!reasoning.is_empty()).then(|| reasoning.to_owned()),
                    answer,
                )
            }
            // Cut off while thinking: all of it is thinking.
            None => (
                Some(thinking.trim().to_owned()).filter(|t| !t.is_empty()),
                "",
            ),
        }
    }
}

/// The markers of the calls most models write, whatever their template says.
const COMMON_MARKERS: [&str; 5] = [
    "<tool_call>",
    "[TOOL_CALLS]",
    "<|tool_call_start|>",
    "<|tool_call|>",
    "<|python_tag|>",
];

/// Whether `text` is the start of `marker`, and not all of it.
fn is_partial(text: &str, marker: &str) -> bool {
    !text.is_empty() && text.len() < marker.len() && marker.starts_with(text)
}

/// `text` without an end that may be the start of one of `markers` (but
/// a marker written whole, `>>>`, is not the start of another of itself).
fn held_back<'t>(text: &'t str, markers: &[&str]) -> &'t str {
    let longest = markers
        .iter()
        .filter(|marker| !text.ends_with(**marker))
        .flat_map(|marker| {
            (1..marker.len())
                .filter(|&n| marker.is_char_boundary(n))
                .filter(|&n| text.ends_with(&marker[..n]))
        })
        .max()
        .unwrap_or(0);
    &text[..text.len() - longest]
}

/// Calls in the forms most models use, whatever their template says:
/// Hermes' `<tool_call>` blocks, Mistral's `[TOOL_CALLS]` array, a bare
/// JSON call (a forced call's form).
fn common_calls(text: &str) -> Option<Found> {
    crate::calls::parse_tool_calls(text).map(|(content, calls)| Found { content, calls })
}

/// cortex's envelope: `{"tool_calls": [...]}` or `{"response": "..."}`;
/// an envelope cut short (the token limit) keeps the calls it completed;
/// anything else is the answer as it is.
fn generic(text: &str) -> (String, Vec<ToolCall>) {
    let Ok(Value::Object(envelope)) = serde_json::from_str::<Value>(text.trim()) else {
        let calls = completed_calls(text);
        return if calls.is_empty() {
            (text.to_owned(), Vec::new())
        } else {
            (String::new(), calls)
        };
    };
    if let Some(Value::Array(calls)) = envelope.get("tool_calls") {
        let calls: Option<Vec<ToolCall>> = calls.iter().map(generic_call).collect();
        if let Some(calls) = calls.filter(|c| !c.is_empty()) {
            return (String::new(), calls);
        }
    }
    match envelope.get("response") {
        Some(Value::String(answer)) => (answer.clone(), Vec::new()),
        _ => (text.to_owned(), Vec::new()),
    }
}

fn generic_call(call: &Value) -> Option<ToolCall> {
    let name = call.get("name")?.as_str()?;
    let arguments = match call.get("arguments") {
        Some(Value::String(text)) => text.clone(),
        Some(args @ Value::Object(_)) => args.to_string(),
        None => "{}".into(),
        Some(_) => return None,
    };
    Some(ToolCall {
        id: String::new(),
        name: name.to_owned(),
        arguments,
    })
}

/// The whole calls of an envelope cut short: `{"tool_calls": [{...}, {...`.
fn completed_calls(text: &str) -> Vec<ToolCall> {
    let mut calls = Vec::new();
    let Some(list) = text
        .trim_start()
        .strip_prefix('{')
        .map(str::trim_start)
        .and_then(|t| t.strip_prefix("\"tool_calls\""))
        .map(str::trim_start)
        .and_then(|t| t.strip_prefix(':'))
        .map(str::trim_start)
        .and_then(|t| t.strip_prefix('['))
    else {
        return calls;
    };
    let mut rest = list;
    loop {
        rest = rest.trim_start();
        let Some((value, end)) = crate::native::json_at(rest, 0) else {
            break;
        };
        match generic_call(&value) {
            Some(call) => calls.push(call),
            None => break,
        }
        rest = rest[end..].trim_start();
        match rest.strip_prefix(',') {
            Some(after) => rest = after,
            None => break,
        }
    }
    calls
}

const CHANNEL_MARKERS: [&str; 7] = [
    "<|channel|>",
    "<|message|>",
    "<|end|>",
    "<|start|>",
    "<|call|>",
    "<|constrain|>",
    "<|return|>",
];

/// [`channels`] of an output still being written: the messages so far,
/// the last one's text without what may be a marker, calls only once
/// written whole (`<|call|>`).
fn channels_so_far(text: &str) -> (ParsedOutput, Option<CallSoFar>) {
    let text = held_back(text, &CHANNEL_MARKERS);
    if !text.contains("<|message|>") {
        let start = text.trim_start();
        if start.starts_with("<|") {
            // A header being written.
            return (ParsedOutput::default(), None);
        }
        if start.starts_with(['{', '[']) {
            // A forced call's bare JSON (or an answer's): told once known.
            let (tool_calls, open) = common_calls_so_far(start);
            let parsed = ParsedOutput {
                tool_calls,
                ..ParsedOutput::default()
            };
            return (parsed, open);
        }
        let parsed = ParsedOutput {
            content: text.trim().to_owned(),
            ..ParsedOutput::default()
        };
        return (parsed, None);
    }
    channels_of(text, false)
}

/// gpt-oss's harmony format: messages `<|channel|>NAME<|message|>TEXT`
/// ended by `<|end|>`, `<|call|>` or `<|return|>`; `analysis` is thinking,
/// `final` the answer, `commentary to=functions.NAME` a call. Text outside
/// any channel (a model that skipped them) is the answer.
fn channels(text: &str) -> ParsedOutput {
    channels_of(text, true).0
}

/// [`channels`]; a call whose message has not ended is the call being
/// written unless the output has (`ended`).
fn channels_of(text: &str, ended: bool) -> (ParsedOutput, Option<CallSoFar>) {
    let mut parsed = ParsedOutput::default();
    let mut open = None;
    let mut reasoning = String::new();
    let mut rest = text;
    if !rest.contains("<|message|>") {
        // No channels (a forced call's bare JSON, or a model that skipped them).
        match common_calls(text) {
            Some(found) => {
                parsed.content = found.content;
                parsed.tool_calls = found.calls;
            }
            None => parsed.content = text.trim().to_owned(),
        }
        return (parsed, None);
    }
    while let Some(message) = rest.find("<|message|>") {
        let header = &rest[..message];
        let body_start = message + "<|message|>".len();
        let body_end = ["<|end|>", "<|call|>", "<|return|>", "<|start|>"]
            .iter()
            .filter_map(|end| rest[body_start..].find(end))
            .min();
        let body_len = body_end.unwrap_or(rest.len() - body_start);
        let body = &rest[body_start..body_start + body_len];
        let recipient = header
            .split("to=")
            .nth(1)
            .map(|r| r.split([' ', '<']).next().unwrap_or_default());
        match recipient {
            Some(to) if !to.is_empty() && !ended && body_end.is_none() => {
                open = Some(CallSoFar {
                    name: Some(to.strip_prefix("functions.").unwrap_or(to).to_owned()),
                    arguments: body.trim().to_owned(),
                    marked: true,
                });
            }
            Some(to) if !to.is_empty() => parsed.tool_calls.push(ToolCall {
                id: String::new(),
                name: to.strip_prefix("functions.").unwrap_or(to).to_owned(),
                arguments: body.trim().to_owned(),
            }),
            _ if header.contains("analysis") => {
                if !reasoning.is_empty() {
                    reasoning.push('\n');
                }
                reasoning.push_str(body.trim());
            }
            _ => parsed.content.push_str(body.trim()),
        }
        rest = &rest[body_start + body_len..];
    }
    parsed.reasoning = (!reasoning.is_empty()).then_some(reasoning);
    (parsed, open)
}

/// What joins functionary v3.2's messages (and ends its prompt).
const RECIPIENTS_SEPARATOR: &str = ">>>";
/// The recipient of its answer's text.
const ANSWER_RECIPIENT: &str = "all";

/// functionary v3.2's messages (see [`CallSyntax::Recipients`]); a call
/// whose message is last is the call being written unless the output has
/// `ended`. Text before any recipient's line (a model that skipped it) is
/// the answer.
fn recipients_of(text: &str, ended: bool) -> (ParsedOutput, Option<CallSoFar>) {
    let mut parsed = ParsedOutput::default();
    let mut open = None;
    let messages: Vec<&str> = text.split(RECIPIENTS_SEPARATOR).collect();
    let last = messages.len() - 1;
    let mut answer = |text: &str| {
        let text = text.trim();
        if !text.is_empty() {
            if !parsed.content.is_empty() {
                parsed.content.push('\n');
            }
            parsed.content.push_str(text);
        }
    };
    for (i, message) in messages.iter().enumerate() {
        let whole = ended || i < last;
        let Some((recipient, body)) = message.split_once('\n') else {
            let recipient = message.trim();
            if whole {
                answer(message);
            } else if !recipient.is_empty()
                && !ANSWER_RECIPIENT.starts_with(recipient)
                && is_function_name(recipient)
            {
                // A function's name being written.
                open = Some(CallSoFar::unnamed(true));
            }
            continue;
        };
        let recipient = recipient.trim();
        if recipient == ANSWER_RECIPIENT || !is_function_name(recipient) {
            answer(if recipient == ANSWER_RECIPIENT {
                body
            } else {
                message
            });
            continue;
        }
        let arguments = body.trim();
        if whole {
            // The arguments as written: a JSON object, else the text itself.
            let arguments = match crate::native::json_at(arguments, 0) {
                Some((value, end)) if value.is_object() => &arguments[..end],
                _ => arguments,
            };
            parsed.tool_calls.push(ToolCall {
                id: String::new(),
                name: recipient.to_owned(),
                arguments: arguments.to_owned(),
            });
        } else {
            open = Some(CallSoFar {
                name: Some(recipient.to_owned()),
                arguments: arguments.to_owned(),
                marked: true,
            });
        }
    }
    (parsed, open)
}

/// Whether `text` can be a function's name (what a recipient other than
/// the answer's is).
fn is_function_name(text: &str) -> bool {
    text.len() <= 128
        && text
            .chars()
            .all(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn thinking(starts_in_reasoning: bool) -> OutputSyntax {
        OutputSyntax {
            reasoning: Some(ReasoningMarkers {
                open: "<think>",
                close: "</think>",
            }),
            starts_in_reasoning,
            calls: CallSyntax::None,
            one_call: false,
        }
    }

    #[test]
    fn thinking_is_split_from_the_answer() {
        let parsed = thinking(false).parse("<think>\nLet me see.\n</think>\n\nIt is 4.");
        assert_eq!(parsed.reasoning.as_deref(), Some("Let me see."));
        assert_eq!(parsed.content, "It is 4.");
        // The prompt opened the block (DeepSeek R1).
        let parsed = thinking(true).parse("Hmm.\n</think>\nFour.");
        assert_eq!(
            (parsed.reasoning.as_deref(), parsed.content.as_str()),
            (Some("Hmm."), "Four.")
        );
        // Cut off while thinking.
        let parsed = thinking(true).parse("Still thinking");
        assert_eq!(
            (parsed.reasoning.as_deref(), parsed.content.as_str()),
            (Some("Still thinking"), "")
        );
        // No block: all answer.
        let parsed = thinking(false).parse("Four.");
        assert_eq!((parsed.reasoning, parsed.content.as_str()), (None, "Four."));
    }

    #[test]
    fn the_generic_envelope_is_a_call_or_an_answer() {
        let syntax = OutputSyntax {
            calls: CallSyntax::Generic,
            ..OutputSyntax::default()
        };
        let parsed = syntax.parse(r#"{"tool_calls": [{"name": "f", "arguments": {"x": 1}}]}"#);
        assert_eq!(parsed.tool_calls[0].name, "f");
        assert_eq!(parsed.tool_calls[0].arguments, r#"{"x":1}"#);
        assert_eq!(syntax.parse(r#"{"response": "Hi"}"#).content, "Hi");
        assert_eq!(syntax.parse(r#"{"respo"#).content, r#"{"respo"#);
        // Cut short by the token limit: still calls, the last one's
        // arguments as far as they go; nothing of them as text.
        let parsed =
            syntax.parse(r#"{"tool_calls": [{"name": "f", "arguments": {}}, {"name": "g", "argum"#);
        assert_eq!(parsed.tool_calls.len(), 2);
        assert_eq!(
            (parsed.tool_calls[1].name.as_str(), parsed.content.as_str()),
            ("g", "")
        );
        let parsed = syntax.parse(r#"{"tool_calls": [{"name": "get", "arguments": {"city": "Par"#);
        assert_eq!(parsed.tool_calls[0].arguments, r#"{"city":"Par"#);
        for cut in [r#"{ "tool_calls": [{"name": "get"#, r#"{"tool_ca"#] {
            let parsed = syntax.parse(cut);
            assert!(
                parsed.tool_calls.is_empty() && parsed.content.is_empty(),
                "{cut}"
            );
        }
    }

    #[test]
    fn gpt_oss_channels_are_thinking_answers_and_calls() {
        let syntax = OutputSyntax {
            calls: CallSyntax::Channels,
            ..OutputSyntax::default()
        };
        let parsed = syntax.parse(
            "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Oslo\"}<|call|>",
        );
        assert_eq!(parsed.reasoning.as_deref(), Some("Need weather."));
        assert_eq!(parsed.tool_calls[0].name, "get_weather");
        assert_eq!(parsed.tool_calls[0].arguments, "{\"city\": \"Oslo\"}");
        let parsed = syntax.parse(
            "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>Four.",
        );
        assert_eq!(
            (parsed.reasoning.as_deref(), parsed.content.as_str()),
            (Some("Easy."), "Four.")
        );
    }

    #[test]
    fn functionary_recipients_are_the_answer_and_calls() {
        let syntax = OutputSyntax {
            calls: CallSyntax::Recipients,
            ..OutputSyntax::default()
        };
        let text =
            "all\nLet me look.>>>get_weather\n{\"city\": \"Oslo\"}>>>get_time\n{\"zone\": \"CET\"}";
        let parsed = syntax.parse(text);
        assert_eq!(parsed.content, "Let me look.");
        let calls: Vec<(&str, &str)> = parsed
            .tool_calls
            .iter()
            .map(|c| (c.name.as_str(), c.arguments.as_str()))
            .collect();
        assert_eq!(
            calls,
            [
                ("get_weather", "{\"city\": \"Oslo\"}"),
                ("get_time", "{\"zone\": \"CET\"}")
            ]
        );
        assert_eq!(syntax.parse("all\nFour.").content, "Four.");
        // Streamed: no prefix tells any of a call as the answer, and the
        // call being written is named once its line is.
        for end in 0..=text.len() {
            let (so_far, open) = syntax.so_far(&text[..end]);
            assert!(
                "Let me look.".starts_with(&so_far.content),
                "{end}: {so_far:?}"
            );
            if end > text.find("get_weather\n").unwrap() + 12 && so_far.tool_calls.is_empty() {
                assert_eq!(open.unwrap().name.as_deref(), Some("get_weather"), "{end}");
            }
        }
        // Cut by the token limit: the call so far.
        let cut = syntax.parse("get_weather\n{\"city\": \"Os");
        assert_eq!(cut.tool_calls[0].name, "get_weather");
        assert_eq!(cut.content, "");
    }
}
