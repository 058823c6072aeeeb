//! Chat `tools` and `tool_choice`: the function definitions handed to the
//! chat template, and how the model must choose (the grammar that forces a
//! call is the chat template's business: it knows the model's syntax).

use cortex_request::{ToolChoice, Tools};
use serde_json::{Value, json};

use super::format::only;
use super::{Fields, type_error};

/// The chat fields this module reads (a response's too).
pub(super) const TOOL_FIELDS: [&str; 3] = ["tools", "tool_choice", "parallel_tool_calls"];

/// A `/v1/responses` body's tool fields, whose shapes are flat
/// (`{"type": "function", "name", "parameters"}`, a choice
/// `{"type": "function", "name"}`), read as a chat's.
pub(super) fn response_tools_of(fields: &Fields) -> Result<Option<Tools>, String> {
    let mut chat = Fields::new();
    if let Some(tools) = fields.get("tools").filter(|t| !t.is_null()) {
        let Value::Array(tools) = tools else {
            return Err(type_error("tools", "an array of function tools", tools));
        };
        let tools: Vec<Value> = tools
            .iter()
            .enumerate()
            .map(|(i, tool)| {
                let at = format!("tools[{i}]");
                let Value::Object(tool) = tool else {
                    return Err(type_error(&at, "a function tool object", tool));
                };
                match tool.get("type").and_then(Value::as_str) {
                    Some("function") => {}
                    Some(other) => {
                        return Err(format!(
                            "{at}.type {other:?} is not supported; only function tools (OpenAI's built-in tools run on its servers)"
                        ));
                    }
                    None => return Err(format!("{at} has no type")),
                }
                only(
                    &["type", "name", "description", "parameters", "strict"],
                    &at,
                    tool,
                )?;
                let function: serde_json::Map<String, Value> = tool
                    .iter()
                    .filter(|(key, _)| key.as_str() != "type")
                    .map(|(key, value)| (key.clone(), value.clone()))
                    .collect();
                Ok(json!({"type": "function", "function": function}))
            })
            .collect::<Result<_, String>>()?;
        chat.insert("tools".into(), Value::Array(tools));
    }
    if let Some(choice) = fields.get("tool_choice") {
        let choice = match choice {
            Value::Object(named)
                if named.get("type").and_then(Value::as_str) == Some("function") =>
            {
                only(&["type", "name"], "tool_choice", named)?;
                json!({"type": "function", "function": {"name": named.get("name").cloned().unwrap_or(Value::Null)}})
            }
            other => other.clone(),
        };
        chat.insert("tool_choice".into(), choice);
    }
    if let Some(parallel) = fields.get("parallel_tool_calls") {
        chat.insert("parallel_tool_calls".into(), parallel.clone());
    }
    tools_of(&chat)
}

/// What a chat body's tool fields ask for: the tools on offer (none for
/// `tool_choice: "none"`) and how the model must choose among them.
pub(super) fn tools_of(fields: &Fields) -> Result<Option<Tools>, String> {
    let tools = match fields.get("tools") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(tools)) => tools.clone(),
        Some(other) => return Err(type_error("tools", "an array of function tools", other)),
    };
    let names = tools
        .iter()
        .enumerate()
        .map(|(i, tool)| function_name(tool, i))
        .collect::<Result<Vec<_>, _>>()?;
    let choice = match fields.get("tool_choice") {
        None | Some(Value::Null) => Some(ToolChoice::Auto),
        Some(Value::String(s)) if s == "none" => None,
        Some(Value::String(s)) if s == "auto" => Some(ToolChoice::Auto),
        Some(Value::String(s)) if s == "required" => Some(ToolChoice::Required),
        Some(Value::Object(choice)) => {
            only(&["type", "function"], "tool_choice", choice)?;
            let name = choice
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or(
                    "tool_choice must be {\"type\": \"function\", \"function\": {\"name\": ...}}",
                )?;
            if !names.iter().any(|n| n == name) {
                return Err(format!(
                    "tool_choice names {name:?}, which is not among tools"
                ));
            }
            Some(ToolChoice::Function(name.to_owned()))
        }
        Some(other) => {
            return Err(type_error(
                "tool_choice",
                "\"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\"}}",
                other,
            ));
        }
    };
    // A named function without tools was refused above ("not among tools").
    if tools.is_empty() && choice == Some(ToolChoice::Required) {
        return Err("tool_choice \"required\" needs tools".into());
    }
    let Some(choice) = choice.filter(|_| !tools.is_empty()) else {
        return Ok(None);
    };
    // A forced call is held to the functions' schemas by a grammar: each
    // must be one (refused here, at submit, rather than when it runs).
    if choice != ToolChoice::Auto {
        call_grammar(&tools)?;
    }
    let parallel = match fields.get("parallel_tool_calls") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(parallel)) => *parallel,
        Some(other) => return Err(type_error("parallel_tool_calls", "a boolean", other)),
    };
    let definitions = Value::Array(tools).to_string();
    Ok(Some(Tools {
        definitions,
        choice,
        parallel,
    }))
}

/// Checks one `{"type": "function", "function": {"name", "description",
/// "parameters", "strict"}}` and returns its name.
fn function_name(tool: &Value, i: usize) -> Result<String, String> {
    let at = format!("tools[{i}]");
    let Value::Object(tool) = tool else {
        return Err(type_error(&at, "a function tool object", tool));
    };
    only(&["type", "function"], &at, tool)?;
    match tool.get("type").and_then(Value::as_str) {
        Some("function") => {}
        Some(other) => {
            return Err(format!(
                "{at}.type {other:?} is not supported; only function tools (OpenAI's built-in tools run on its servers)"
            ));
        }
        None => return Err(format!("{at} has no type")),
    }
    let Some(Value::Object(function)) = tool.get("function") else {
        return Err(format!("{at}.function is missing"));
    };
    only(
        &["name", "description", "parameters", "strict"],
        &format!("{at}.function"),
        function,
    )?;
    let name = function
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| format!("{at}.function has no name"))?;
    let valid = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !valid {
        return Err(format!(
            "{at}.function.name {name:?} must be 1-64 letters, digits, underscores or dashes"
        ));
    }
    match function.get("parameters") {
        None | Some(Value::Null) => Ok(name.to_owned()),
        Some(schema @ Value::Object(_)) => {
            check_size(schema, &format!("{at}.function.parameters"))?;
            Ok(name.to_owned())
        }
        Some(other) => Err(type_error(
            &format!("{at}.function.parameters"),
            "a JSON schema object",
            other,
        )),
    }
}

/// Refuses a `parameters` schema deeper or larger than a schema may be
/// when it constrains output: the chat template walks it to render the
/// tools into the prompt, on every request that offers them. Counted
/// without recursion, so the check itself has no depth to exhaust.
fn check_size(schema: &Value, at: &str) -> Result<(), String> {
    use cortex_grammar::limits::{MAX_SCHEMA_DEPTH, MAX_SCHEMA_NODES};
    let mut pending = vec![(schema, 1_usize)];
    let mut nodes = 0_usize;
    while let Some((value, depth)) = pending.pop() {
        nodes += 1;
        if nodes > MAX_SCHEMA_NODES {
            return Err(format!(
                "{at} has more than {MAX_SCHEMA_NODES} JSON values; make it smaller"
            ));
        }
        if depth > MAX_SCHEMA_DEPTH {
            return Err(format!(
                "{at} nests deeper than {MAX_SCHEMA_DEPTH} levels; make it shallower"
            ));
        }
        match value {
            Value::Array(items) => pending.extend(items.iter().map(|v| (v, depth + 1))),
            Value::Object(fields) => pending.extend(fields.values().map(|v| (v, depth + 1))),
            _ => {}
        }
    }
    Ok(())
}

/// The grammar of one call, `{"name": N, "arguments": A}`, of any of
/// `tools`, with A matching that function's parameters: refused at submit
/// when a schema cannot be one (as any forced or generic call must).
fn call_grammar(tools: &[Value]) -> Result<String, String> {
    let calls: Vec<Value> = tools
        .iter()
        .filter_map(|tool| {
            let function = &tool["function"];
            let name = function["name"].as_str()?;
            let parameters = match &function["parameters"] {
                Value::Null => json!({"type": "object"}),
                schema => schema.clone(),
            };
            Some(json!({
                "type": "object",
                "properties": {"name": {"const": name}, "arguments": parameters},
                "required": ["name", "arguments"],
                "additionalProperties": false,
            }))
        })
        .collect();
    let schema = match <[Value; 1]>::try_from(calls) {
        Ok([one]) => one,
        Err(all) => json!({ "anyOf": all }),
    };
    cortex_grammar::from_json_schema(&schema).map_err(|e| {
        format!("tools: a forced call cannot be constrained to the functions' parameters: {e}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: Value) -> Result<Option<Tools>, String> {
        let Value::Object(fields) = body else {
            unreachable!()
        };
        tools_of(&fields)
    }

    fn weather() -> Value {
        json!([{"type": "function", "function": {"name": "get_weather", "description": "Weather now",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])
    }

    #[test]
    fn choices() {
        let tools = parse(json!({"tools": weather()})).unwrap().unwrap();
        assert_eq!(tools.choice, ToolChoice::Auto);
        assert!(tools.definitions.contains("get_weather"));
        let tools = parse(json!({"tools": weather(), "tool_choice": "required"})).unwrap();
        assert_eq!(tools.unwrap().choice, ToolChoice::Required);
        let tools = parse(json!({"tools": weather(), "tool_choice": {"type": "function", "function": {"name": "get_weather"}}})).unwrap();
        assert_eq!(
            tools.unwrap().choice,
            ToolChoice::Function("get_weather".into())
        );
        assert_eq!(
            parse(json!({"tools": weather(), "tool_choice": "none"})).unwrap(),
            None
        );
        assert_eq!(parse(json!({"tool_choice": "auto"})).unwrap(), None);
    }

    #[test]
    fn parameters_are_bounded_in_depth_and_size() {
        let tool = |parameters: Value| json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": parameters}}]});
        let mut deep = json!({"type": "string"});
        for _ in 0..70 {
            deep = json!({"type": "object", "properties": {"x": deep}});
        }
        let error = parse(tool(deep)).unwrap_err();
        assert!(
            error.starts_with("tools[0].function.parameters nests deeper than 64 levels"),
            "{error}"
        );
        let wide: serde_json::Map<String, Value> = (0..6000)
            .map(|i| (format!("p{i}"), json!({"type": "string"})))
            .collect();
        let error = parse(tool(json!({"type": "object", "properties": wide}))).unwrap_err();
        assert!(error.contains("more than 10000 JSON values"), "{error}");
        let mut fine = json!({"type": "string"});
        for _ in 0..20 {
            fine = json!({"type": "object", "properties": {"x": fine}});
        }
        assert!(parse(tool(fine)).is_ok());
    }

    #[test]
    fn mistakes_are_named() {
        let error = |body: Value| parse(body).unwrap_err();
        assert_eq!(
            error(json!({"tool_choice": "required"})),
            "tool_choice \"required\" needs tools"
        );
        assert_eq!(
            error(
                json!({"tools": weather(), "tool_choice": {"type": "function", "function": {"name": "nope"}}})
            ),
            "tool_choice names \"nope\", which is not among tools"
        );
        assert_eq!(
            error(json!({"tools": [{"type": "web_search"}]})),
            "tools[0].type \"web_search\" is not supported; only function tools (OpenAI's built-in tools run on its servers)"
        );
        assert_eq!(
            error(json!({"tool_choice": {"type": "function", "function": {"name": "f"}}})),
            "tool_choice names \"f\", which is not among tools"
        );
        assert_eq!(
            error(json!({"tools": [{"type": "function", "function": {"name": "bad name"}}]})),
            "tools[0].function.name \"bad name\" must be 1-64 letters, digits, underscores or dashes"
        );
        let pattern = json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "string", "pattern": "a+"}}}}}]);
        assert!(
            error(json!({"tools": pattern.clone(), "tool_choice": "required"}))
                .starts_with("tools: a forced call cannot be constrained")
        );
        // The model chooses: no grammar holds its call to the schema.
        assert!(parse(json!({"tools": pattern})).is_ok());
    }
}
