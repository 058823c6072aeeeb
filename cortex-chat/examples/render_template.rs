//! A chat template rendering a conversation with tools on offer, and a
//! model's answer read back as text and calls, as the engine reads it.
//!
//! ```text
//! cargo run -p cortex-chat --example render_template [TEMPLATE.jinja]
//! ```
//!
//! Without a file, the repository's ChatML template with Hermes tool calls
//! (`examples/templates/chatml-tools.jinja`) is used.

use std::process::ExitCode;

use cortex_chat::{ChatTemplate, Conversation, ParsedOutput};
use cortex_request::{ChatMessage, ToolChoice, Tools};

#[cfg_attr(test, allow(dead_code))]
fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match render(args.first().map(String::as_str)) {
        Ok((prompt, answer)) => {
            println!("--- prompt\n{prompt}\n--- the answer read back\n{answer:#?}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("render_template: {error}");
            ExitCode::FAILURE
        }
    }
}

/// The prompt the template at `path` makes of a weather question, and a
/// Hermes-style answer with a call read back by what it learned.
fn render(path: Option<&str>) -> Result<(String, ParsedOutput), Box<dyn std::error::Error>> {
    let source = match path {
        Some(path) => std::fs::read_to_string(path)?,
        None => std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../examples/templates/chatml-tools.jinja"
        ))?,
    };
    let template = ChatTemplate::new(&source, "<s>", "</s>")?;
    let messages = [
        ChatMessage::system("You help with the weather."),
        ChatMessage::user("What is the weather in Oslo?"),
    ];
    let tools = Tools {
        definitions: serde_json::json!([{"type": "function", "function": {
            "name": "get_weather",
            "description": "The current weather in a city.",
            "parameters": {"type": "object",
                "properties": {"city": {"type": "string", "description": "A city."}},
                "required": ["city"]}}}])
        .to_string(),
        choice: ToolChoice::Auto,
        parallel: true,
    };
    let rendered = template.render_chat(&Conversation {
        messages: &messages,
        tools: Some(&tools),
        variables: None,
    })?;
    let answer = rendered.syntax.parse(
        "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>",
    );
    Ok((rendered.prompt, answer))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_tools_are_offered_and_the_call_is_read_back() {
        let (prompt, answer) = super::render(None).unwrap();
        assert!(prompt.contains("get_weather") && prompt.ends_with("<|im_start|>assistant\n"));
        assert_eq!(answer.content, "Let me check.");
        assert_eq!(answer.tool_calls[0].arguments, r#"{"city":"Oslo"}"#);
    }
}
