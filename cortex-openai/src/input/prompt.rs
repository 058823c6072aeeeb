//! What to continue: chat `messages` (with content parts), completion
//! `prompt`s, and `/v1/responses` `input` with its `instructions`.

use cortex_request::{ChatMessage, Prompt, ToolCall};
use serde_json::Value;

use super::format::only;
use super::{Fields, token_id, type_error};

/// A `/v1/responses` `input` (a string, or message items) after its
/// `instructions`, as chat messages.
pub(super) fn response_input(fields: &Fields) -> Result<Vec<ChatMessage>, String> {
    let mut out = Vec::new();
    match fields.get("instructions") {
        None | Some(Value::Null) => {}
        Some(Value::String(text)) => out.push(ChatMessage::system(text.clone())),
        Some(other) => return Err(type_error("instructions", "a string", other)),
    }
    match fields.get("input") {
        None | Some(Value::Null) => return Err("missing input".into()),
        Some(Value::String(text)) => out.push(ChatMessage::user(text.clone())),
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                match item.get("type").and_then(Value::as_str) {
                    Some("function_call") => {
                        let call = function_call_item(item, i)?;
                        // Calls made together are one assistant turn.
                        match out.last_mut() {
                            Some(turn)
                                if turn.role == "assistant" && !turn.tool_calls.is_empty() =>
                            {
                                turn.tool_calls.push(call);
                            }
                            _ => {
                                let mut turn = ChatMessage::assistant("");
                                turn.tool_calls.push(call);
                                out.push(turn);
                            }
                        }
                    }
                    Some("function_call_output") => out.push(function_output_item(item, i)?),
                    _ => out.push(input_item(item, i)?),
                }
            }
        }
        Some(other) => {
            return Err(type_error(
                "input",
                "a string or an array of message items",
                other,
            ));
        }
    }
    Ok(out)
}

/// A `{"type": "function_call", "call_id", "name", "arguments"}` item: a
/// call the model made in an earlier turn.
fn function_call_item(item: &Value, i: usize) -> Result<ToolCall, String> {
    let at = format!("input[{i}]");
    let Value::Object(m) = item else {
        return Err(type_error(&at, "a function_call item", item));
    };
    only(
        &["type", "call_id", "name", "arguments", "id", "status"],
        &at,
        m,
    )?;
    let text = |key: &str| {
        m.get(key)
            .and_then(Value::as_str)
            .ok_or_else(|| format!("{at}.{key} is missing (a string)"))
    };
    Ok(ToolCall {
        id: text("call_id")?.to_owned(),
        name: text("name")?.to_owned(),
        arguments: text("arguments")?.to_owned(),
    })
}

/// A `{"type": "function_call_output", "call_id", "output"}` item: a call's
/// result, as a `tool` message.
fn function_output_item(item: &Value, i: usize) -> Result<ChatMessage, String> {
    let at = format!("input[{i}]");
    let Value::Object(m) = item else {
        return Err(type_error(&at, "a function_call_output item", item));
    };
    only(&["type", "call_id", "output", "id", "status"], &at, m)?;
    let call_id = m
        .get("call_id")
        .and_then(Value::as_str)
        .ok_or_else(|| format!("{at}.call_id is missing (a string)"))?;
    let output = match m.get("output") {
        Some(Value::String(text)) => text.clone(),
        Some(other) => return Err(type_error(&format!("{at}.output"), "a string", other)),
        None => return Err(format!("{at}.output is missing")),
    };
    let mut message = ChatMessage::new("tool", output);
    message.tool_call_id = Some(call_id.to_owned());
    Ok(message)
}

/// One message item of a `/v1/responses` input: `{"role", "content"}` with
/// an optional `"type": "message"`; content as a string or `input_text` /
/// `output_text` parts.
fn input_item(item: &Value, i: usize) -> Result<ChatMessage, String> {
    let at = format!("input[{i}]");
    let Value::Object(m) = item else {
        return Err(type_error(&at, "a message item", item));
    };
    match m.get("type").and_then(Value::as_str) {
        None | Some("message") => {}
        Some(kind) => {
            return Err(format!(
                "{at} has type {kind:?}; message, function_call and function_call_output items are supported (no files or built-in tools)"
            ));
        }
    }
    only(&["type", "role", "content", "id", "status"], &at, m)?;
    let role = match m.get("role").and_then(Value::as_str) {
        // A developer message is rendered as the template knows it (see cortex-chat).
        Some(role @ ("user" | "assistant" | "system" | "developer")) => role,
        Some(other) => {
            return Err(format!(
                "{at}.role {other:?} is not user, assistant, system or developer"
            ));
        }
        None => return Err(format!("{at} has no role")),
    };
    let content = match m.get("content") {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => {
            let mut texts = Vec::new();
            for (j, part) in parts.iter().enumerate() {
                match (
                    part.get("type").and_then(Value::as_str),
                    part.get("text").and_then(Value::as_str),
                ) {
                    (Some("input_text" | "output_text"), Some(t)) => texts.push(t.to_owned()),
                    (Some(kind), _) => {
                        return Err(format!(
                            "{at}.content[{j}] has type {kind:?}; only input_text is supported"
                        ));
                    }
                    _ => {
                        return Err(type_error(
                            &format!("{at}.content[{j}]"),
                            "an {\"type\": \"input_text\", \"text\": ...} part",
                            part,
                        ));
                    }
                }
            }
            return Ok(ChatMessage::from_parts(role, texts));
        }
        None | Some(Value::Null) => return Err(format!("{at} has no content")),
        Some(other) => {
            return Err(type_error(
                &format!("{at}.content"),
                "a string or parts",
                other,
            ));
        }
    };
    Ok(ChatMessage::new(role, content))
}

pub(super) fn messages(value: &Value) -> Result<Vec<ChatMessage>, String> {
    let Value::Array(items) = value else {
        return Err(type_error(
            "messages",
            "an array of {role, content} objects",
            value,
        ));
    };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let Value::Object(m) = item else {
                return Err(type_error(&format!("messages[{i}]"), "an object", item));
            };
            if let Some(key) = m.keys().find(|k| {
                ![
                    "role",
                    "content",
                    "name",
                    "tool_calls",
                    "tool_call_id",
                    "refusal",
                    "reasoning_content",
                    "reasoning",
                    "thinking",
                ]
                .contains(&k.as_str())
            }) {
                return Err(format!("messages[{i}] has unknown field {key:?}"));
            }
            let role = match m.get("role") {
                Some(Value::String(r)) => r.clone(),
                Some(other) => {
                    return Err(type_error(
                        &format!("messages[{i}].role"),
                        "a string",
                        other,
                    ));
                }
                None => return Err(format!("messages[{i}] has no role")),
            };
            let tool_calls = match m.get("tool_calls") {
                None | Some(Value::Null) => Vec::new(),
                Some(calls) if role == "assistant" => history_calls(calls, i)?,
                Some(_) => {
                    return Err(format!(
                        "messages[{i}] has tool_calls but is not an assistant message"
                    ));
                }
            };
            let tool_call_id = match (role.as_str(), m.get("tool_call_id")) {
                ("tool", Some(Value::String(id))) => Some(id.clone()),
                ("tool", _) => {
                    return Err(format!(
                        "messages[{i}] is a tool message without a tool_call_id (a string)"
                    ));
                }
                (_, None | Some(Value::Null)) => None,
                (_, Some(_)) => {
                    return Err(format!(
                        "messages[{i}] has tool_call_id but is not a tool message"
                    ));
                }
            };
            let mut parts = Vec::new();
            let content = match m.get("content") {
                Some(Value::String(c)) => c.clone(),
                Some(Value::Array(given)) => {
                    parts = text_parts(given, i)?;
                    parts.join("\n")
                }
                // An assistant turn that only called functions has no text.
                Some(Value::Null) | None if !tool_calls.is_empty() => String::new(),
                Some(Value::Null) | None => return Err(format!("messages[{i}] has no content")),
                Some(other) => {
                    return Err(type_error(
                        &format!("messages[{i}].content"),
                        "a string",
                        other,
                    ));
                }
            };
            // An earlier turn's thinking, under any name servers give it.
            let reasoning = ["reasoning_content", "reasoning", "thinking"]
                .iter()
                .find_map(|key| m.get(*key).filter(|v| !v.is_null()).map(|v| (*key, v)));
            let reasoning_content = match reasoning {
                None => None,
                Some((_, Value::String(text))) if role == "assistant" => Some(text.clone()),
                Some((key, Value::String(_))) => {
                    return Err(format!(
                        "messages[{i}] has {key} but is not an assistant message"
                    ));
                }
                Some((key, other)) => {
                    return Err(type_error(
                        &format!("messages[{i}].{key}"),
                        "a string",
                        other,
                    ));
                }
            };
            let mut message = ChatMessage::new(role, content);
            message.content_parts = parts;
            message.tool_calls = tool_calls;
            message.tool_call_id = tool_call_id;
            message.reasoning_content = reasoning_content;
            Ok(message)
        })
        .collect()
}

/// An assistant turn's `tool_calls`: `[{"id", "type": "function",
/// "function": {"name", "arguments"}}]`, arguments as JSON text.
fn history_calls(value: &Value, message: usize) -> Result<Vec<ToolCall>, String> {
    let field = format!("messages[{message}].tool_calls");
    let Value::Array(calls) = value else {
        return Err(type_error(&field, "an array of tool calls", value));
    };
    calls
        .iter()
        .enumerate()
        .map(|(j, call)| {
            let at = format!("{field}[{j}]");
            let Value::Object(call) = call else {
                return Err(type_error(&at, "a tool call object", call));
            };
            only(&["id", "type", "function"], &at, call)?;
            if call.get("type").is_some_and(|t| t != "function") {
                return Err(format!("{at}.type must be \"function\""));
            }
            let function = call
                .get("function")
                .and_then(Value::as_object)
                .ok_or_else(|| format!("{at} has no function object"))?;
            only(&["name", "arguments"], &format!("{at}.function"), function)?;
            let name = function
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| format!("{at}.function has no name"))?;
            let arguments = match function.get("arguments") {
                Some(Value::String(text)) => text.clone(),
                // Some clients send the object itself; keep it as its JSON.
                Some(object @ Value::Object(_)) => object.to_string(),
                None | Some(Value::Null) => "{}".into(),
                Some(other) => {
                    return Err(type_error(
                        &format!("{at}.function.arguments"),
                        "a JSON string",
                        other,
                    ));
                }
            };
            Ok(ToolCall {
                id: call
                    .get("id")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
                name: name.to_owned(),
                arguments,
            })
        })
        .collect()
}

/// OpenAI's content parts (only `{"type": "text", "text": ...}` is
/// supported): their texts, which a message's content joins by a newline,
/// as llama.cpp joins them ("Translate to French:" and "Good morning" are
/// two lines, not "Translate to French:Good morning").
fn text_parts(parts: &[Value], message: usize) -> Result<Vec<String>, String> {
    let mut texts = Vec::new();
    for (j, part) in parts.iter().enumerate() {
        let field = format!("messages[{message}].content[{j}]");
        match (
            part.get("type").and_then(Value::as_str),
            part.get("text").and_then(Value::as_str),
        ) {
            (Some("text"), Some(t)) => texts.push(t.to_owned()),
            (Some(kind), _) if kind != "text" => {
                return Err(format!("{field} has type {kind:?}; only text is supported"));
            }
            _ => {
                return Err(type_error(
                    &field,
                    "a {\"type\": \"text\", \"text\": ...} part",
                    part,
                ));
            }
        }
    }
    Ok(texts)
}

/// A `/v1/completions` `prompt`: a text, token ids, or a list of either
/// (each answered with `n` completions, in order).
pub(super) fn completion_prompt(value: &Value) -> Result<Prompt, String> {
    const EXPECTED: &str =
        "a string, an array of token ids, or an array of strings or of token-id arrays";
    let one = |value: &Value, field: &str| match value {
        Value::String(s) => Ok(Prompt::Text(s.clone())),
        Value::Array(ids) if ids.iter().all(Value::is_number) => Ok(Prompt::Tokens(
            ids.iter()
                .enumerate()
                .map(|(i, v)| token_id(v, &format!("{field}[{i}]")))
                .collect::<Result<_, _>>()?,
        )),
        other => Err(type_error(
            field,
            "a string or an array of token ids",
            other,
        )),
    };
    match value {
        Value::Array(items) if items.is_empty() => Err("prompt is an empty array".into()),
        Value::Array(items) if items.iter().all(Value::is_number) => one(value, "prompt"),
        Value::Array(items) if items.len() == 1 => one(&items[0], "prompt[0]"),
        Value::Array(items) => Ok(Prompt::Several(
            items
                .iter()
                .enumerate()
                .map(|(i, item)| one(item, &format!("prompt[{i}]")))
                .collect::<Result<_, _>>()?,
        )),
        Value::String(_) => one(value, "prompt"),
        other => Err(type_error("prompt", EXPECTED, other)),
    }
}
