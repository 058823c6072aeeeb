//! Function calls read back out of generated text. Models write them in
//! their training's format; the common ones are recognised:
//!
//! - Hermes / Qwen / SmolLM3: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
//!   blocks (the closing tag may be missing at the very end);
//! - Mistral: `[TOOL_CALLS]` followed by a JSON array of calls;
//! - LFM2: `<|tool_call_start|>[name(key='value')]<|tool_call_end|>`;
//! - Granite 3: `<|tool_call|>` followed by a JSON array of calls;
//! - Llama 3.x and grammar-forced calls: the whole text is one JSON call
//!   (or an array of them), `arguments` or `parameters`, optionally after
//!   `<|python_tag|>`.

use cortex_request::ToolCall;
use serde_json::Value;

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// The calls in `text` and the text around them (trimmed), or `None` when
/// it holds no call (then it is an ordinary answer).
pub fn parse_tool_calls(text: &str) -> Option<(String, Vec<ToolCall>)> {
    if text.contains(OPEN) {
        return hermes(text);
    }
    if let Some((before, after)) = text.split_once("<|tool_call_start|>") {
        // LFM2: `[name(key='value')]`, Python's call syntax.
        let inside = after.split("<|tool_call_end|>").next().unwrap_or(after);
        let calls = crate::python_calls::python_call_list(inside.trim())?;
        return Some((before.trim().to_owned(), calls));
    }
    if let Some((before, after)) = text.split_once("<|tool_call|>") {
        // Granite 3: a JSON array of calls.
        let calls = calls_of(&serde_json::from_str(after.trim()).ok()?)?;
        return Some((before.trim().to_owned(), calls));
    }
    if let Some((before, after)) = text.split_once("[TOOL_CALLS]") {
        let calls = calls_of(&serde_json::from_str(after.trim()).ok()?)?;
        return Some((before.trim().to_owned(), calls));
    }
    let body = text.trim();
    let body = body.strip_prefix("<|python_tag|>").unwrap_or(body).trim();
    if body.starts_with('{') || body.starts_with('[') {
        let calls = calls_of(&serde_json::from_str(body).ok()?)?;
        return Some((String::new(), calls));
    }
    None
}

fn hermes(text: &str) -> Option<(String, Vec<ToolCall>)> {
    let mut content = String::new();
    let mut calls = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(OPEN) {
        content.push_str(&rest[..start]);
        let after = &rest[start + OPEN.len()..];
        let (inside, next) = match after.find(CLOSE) {
            Some(end) => (&after[..end], &after[end + CLOSE.len()..]),
            None => (after, ""),
        };
        calls.extend(calls_of(&serde_json::from_str(inside.trim()).ok()?)?);
        rest = next;
    }
    content.push_str(rest);
    (!calls.is_empty()).then(|| (content.trim().to_owned(), calls))
}

/// One call object, or an array of them.
fn calls_of(value: &Value) -> Option<Vec<ToolCall>> {
    match value {
        Value::Array(items) if !items.is_empty() => items.iter().map(call_of).collect(),
        Value::Object(_) => Some(vec![call_of(value)?]),
        _ => None,
    }
}

fn call_of(value: &Value) -> Option<ToolCall> {
    let name = value.get("name")?.as_str()?;
    let arguments = match value.get("arguments").or_else(|| value.get("parameters")) {
        // Some models write the arguments as a JSON string already.
        Some(Value::String(text)) => text.clone(),
        Some(arguments @ Value::Object(_)) => arguments.to_string(),
        None => "{}".to_owned(),
        Some(_) => return None,
    };
    Some(ToolCall {
        id: String::new(),
        name: name.to_owned(),
        arguments,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(text: &str) -> Option<(String, Vec<String>)> {
        parse_tool_calls(text).map(|(content, calls)| {
            (
                content,
                calls
                    .into_iter()
                    .map(|c| format!("{}{}", c.name, c.arguments))
                    .collect(),
            )
        })
    }

    #[test]
    fn every_format_is_read() {
        assert_eq!(
            names(
                "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n</tool_call>\n<tool_call>{\"name\": \"b\", \"arguments\": {}}"
            ),
            Some((String::new(), vec![r#"a{"x":1}"#.into(), "b{}".into()]))
        );
        assert_eq!(
            names("Sure. [TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {\"q\": \"s\"}}]"),
            Some(("Sure.".into(), vec![r#"f{"q":"s"}"#.into()]))
        );
        assert_eq!(
            names("<|python_tag|>{\"name\": \"g\", \"parameters\": {\"n\": 2}}"),
            Some((String::new(), vec![r#"g{"n":2}"#.into()]))
        );
        assert_eq!(
            names(" {\"name\": \"h\", \"arguments\": \"{\\\"k\\\": true}\"} "),
            Some((String::new(), vec![r#"h{"k": true}"#.into()]))
        );
    }

    #[test]
    fn ordinary_answers_and_broken_calls_are_text() {
        assert_eq!(names("The weather is fine."), None);
        assert_eq!(names("{\"answer\": 42}"), None);
        assert_eq!(names("<tool_call>{\"name\": \"a\", \"argu"), None);
        assert_eq!(names("[1, 2]"), None);
    }
}
