//! `/api/chat`'s messages, tools and thinking in Ollama's shapes: messages
//! with `images` (empty: LiteLLM sends one on every message), earlier
//! `tool_calls` (arguments as objects) and `thinking`, a tool's result
//! (`tool_name`); `tools` as OpenAI's function tools; `think` (true, false,
//! or gpt-oss's "low"/"medium"/"high"); an answer's `thinking` and
//! `tool_calls`.

use cortex_request::{ChatMessage, Completion, ToolCall, ToolChoice, Tools};
use serde_json::{Map, Value, json};

use super::shape::{OllamaError, bad};

/// The body's `messages`.
pub(super) fn messages(value: Option<&Value>) -> Result<Vec<ChatMessage>, OllamaError> {
    let messages = match value {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(messages)) => messages,
        Some(other) => {
            return Err(bad(format!(
                "messages = {other}: expected an array of {{role, content}}"
            )));
        }
    };
    messages
        .iter()
        .enumerate()
        .map(|(i, m)| message(m, i))
        .collect()
}

fn message(m: &Value, i: usize) -> Result<ChatMessage, OllamaError> {
    let role = m["role"]
        .as_str()
        .ok_or_else(|| bad(format!("messages[{i}].role: expected a string")))?;
    let content = match &m["content"] {
        Value::Null => "",
        Value::String(text) => text,
        other => {
            return Err(bad(format!(
                "messages[{i}].content = {other}: expected a string"
            )));
        }
    };
    match m.get("images") {
        None | Some(Value::Null) => {}
        Some(Value::Array(images)) if images.is_empty() => {}
        Some(_) => {
            return Err(bad(format!(
                "messages[{i}].images: cortex runs text models only"
            )));
        }
    }
    let mut message = ChatMessage::new(role, content);
    if let Some(calls) = m.get("tool_calls").filter(|c| !c.is_null()) {
        let Value::Array(calls) = calls else {
            return Err(bad(format!("messages[{i}].tool_calls: expected an array")));
        };
        message.tool_calls = calls
            .iter()
            .enumerate()
            .map(|(k, call)| {
                let function = &call["function"];
                let name = function["name"].as_str().ok_or_else(|| {
                    bad(format!(
                        "messages[{i}].tool_calls[{k}].function.name: expected a string"
                    ))
                })?;
                let arguments = match &function["arguments"] {
                    Value::Null => "{}".to_owned(),
                    Value::String(text) => text.clone(),
                    object => object.to_string(),
                };
                Ok(ToolCall {
                    id: call["id"].as_str().unwrap_or_default().to_owned(),
                    name: name.to_owned(),
                    arguments,
                })
            })
            .collect::<Result<_, OllamaError>>()?;
    }
    if role == "tool" {
        // Ollama names the function a result is for; OpenAI, the call.
        message.tool_call_id = m["tool_call_id"]
            .as_str()
            .or(m["tool_name"].as_str())
            .map(str::to_owned);
    }
    message.reasoning_content = m["thinking"].as_str().map(str::to_owned);
    Ok(message)
}

/// The body's `tools`: OpenAI's function tools, the model choosing.
pub(super) fn tools(value: Option<&Value>) -> Result<Option<Tools>, OllamaError> {
    let tools = match value {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(tools)) if tools.is_empty() => return Ok(None),
        Some(Value::Array(tools)) => tools,
        Some(other) => return Err(bad(format!("tools = {other}: expected an array"))),
    };
    for (i, tool) in tools.iter().enumerate() {
        let name = tool["function"]["name"].as_str();
        if tool["type"] != "function" || name.is_none_or(str::is_empty) {
            return Err(bad(format!(
                "tools[{i}]: expected {{\"type\": \"function\", \"function\": {{\"name\", \"parameters\"}}}}"
            )));
        }
    }
    Ok(Some(Tools {
        definitions: Value::Array(tools.clone()).to_string(),
        choice: ToolChoice::Auto,
        parallel: true,
    }))
}

/// The body's `think` as template variables: true or false switches
/// thinking on or off where a template reads `enable_thinking`; a level
/// is gpt-oss's `reasoning_effort`.
pub(super) fn think(value: Option<&Value>) -> Result<Option<String>, OllamaError> {
    let variables = match value {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Bool(on)) => json!({ "enable_thinking": on }),
        Some(Value::String(level)) if ["low", "medium", "high"].contains(&level.as_str()) => {
            json!({ "reasoning_effort": level })
        }
        Some(other) => {
            return Err(bad(format!(
                "think = {other}: expected true, false, \"low\", \"medium\" or \"high\""
            )));
        }
    };
    Ok(Some(variables.to_string()))
}

/// What an answer's message adds to its text: its `thinking` and its
/// `tool_calls`, arguments as objects.
pub(super) fn answer_fields(message: &mut Map<String, Value>, thinking: &str, calls: &[ToolCall]) {
    if !thinking.is_empty() {
        message.insert("thinking".into(), json!(thinking));
    }
    if !calls.is_empty() {
        let calls: Vec<Value> = calls
            .iter()
            .map(|call| {
                let arguments = serde_json::from_str::<Value>(&call.arguments)
                    .unwrap_or_else(|_| whole_members(&call.arguments));
                json!({ "function": { "name": call.name, "arguments": arguments } })
            })
            .collect();
        message.insert("tool_calls".into(), json!(calls));
    }
}

/// The members written whole of a call's arguments cut short (the token
/// limit): Ollama's calls carry an object, never text.
fn whole_members(arguments: &str) -> Value {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    let mut member_ends = Vec::new();
    for (at, c) in arguments.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if in_string => escaped = true,
            '"' => in_string = !in_string,
            _ if in_string => {}
            '{' | '[' => depth += 1,
            '}' | ']' => depth = depth.saturating_sub(1),
            ',' if depth == 1 => member_ends.push(at),
            _ => {}
        }
    }
    member_ends
        .iter()
        .rev()
        .find_map(|&end| serde_json::from_str(&format!("{}}}", &arguments[..end])).ok())
        .unwrap_or_else(|| json!({}))
}

/// [`answer_fields`] of a whole completion.
pub(super) fn completion_fields(message: &mut Map<String, Value>, completion: Option<&Completion>) {
    if let Some(c) = completion {
        answer_fields(message, c.reasoning.as_deref().unwrap_or(""), &c.tool_calls);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_cut_short_keep_their_whole_members() {
        assert_eq!(
            whole_members(r#"{"city":"Paris, \"FR\"","unit":"cel"#),
            json!({"city": "Paris, \"FR\""})
        );
        assert_eq!(whole_members(r#"{"city":"#), json!({}));
        assert_eq!(whole_members(r#"{"a":{"b":1,"c":"#), json!({}));
    }
}
