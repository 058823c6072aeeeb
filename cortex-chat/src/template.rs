//! Rendering a Jinja chat template as `transformers` does.

use cortex_request::ChatMessage;
use minijinja::{Environment, ErrorKind, Value};
use serde_json::json;

/// Why a template cannot be used or rendered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TemplateError {
    /// The source is not a template minijinja can compile.
    #[error("the chat template does not compile: {0}")]
    Syntax(String),
    /// Rendering failed (the template raised an exception, or used
    /// something it was not given).
    #[error("the chat template failed to render: {0}")]
    Render(String),
    /// Tools were offered to a template that does not render them.
    #[error(
        "the chat template takes no tools (it never reads `tools`); choose one that does with --chat-template FILE"
    )]
    NoTools,
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
    takes_tools: bool,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("takes_tools", &self.takes_tools)
            .finish_non_exhaustive()
    }
}

/// The name the template is compiled under.
const NAME: &str = "chat";

impl ChatTemplate {
    /// Compiles `source`; `bos_token` and `eos_token` are the texts of the
    /// model's special tokens, which templates may print.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self, TemplateError> {
        let mut env = Environment::new();
        // transformers renders with trim_blocks and lstrip_blocks on.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(NAME, source.to_owned())
            .map_err(|e| TemplateError::Syntax(describe(&e)))?;
        let takes_tools = env
            .get_template(NAME)
            .map_err(|e| TemplateError::Syntax(describe(&e)))?
            .undeclared_variables(false)
            .contains("tools");
        Ok(Self {
            env,
            bos_token: bos_token.to_owned(),
            eos_token: eos_token.to_owned(),
            takes_tools,
        })
    }

    /// Whether the template renders `tools` (a model trained to call functions).
    pub fn takes_tools(&self) -> bool {
        self.takes_tools
    }

    /// Renders `messages`, with `tools` (a JSON array of OpenAI function
    /// definitions) on offer, ending with the assistant's turn opened when
    /// `add_generation_prompt`.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        tools: Option<&str>,
        add_generation_prompt: bool,
    ) -> Result<String, TemplateError> {
        let tools = match tools {
            None => None,
            Some(_) if !self.takes_tools => return Err(TemplateError::NoTools),
            Some(text) => Some(
                serde_json::from_str::<serde_json::Value>(text)
                    .map_err(|e| TemplateError::Render(format!("tools are not JSON: {e}")))?,
            ),
        };
        let messages: Vec<serde_json::Value> = messages.iter().map(message_value).collect();
        let context = minijinja::context! {
            messages => Value::from_serialize(&messages),
            tools => tools.map(|t| Value::from_serialize(&t)),
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.as_str(),
            eos_token => self.eos_token.as_str(),
        };
        self.env
            .get_template(NAME)
            .and_then(|t| t.render(context))
            .map_err(|e| TemplateError::Render(describe(&e)))
    }
}

/// A message as templates read it (Hugging Face's shape): `role`,
/// `content`, and `tool_calls` (arguments as objects) or `tool_call_id`
/// only when present, since templates test whether they are defined.
fn message_value(message: &ChatMessage) -> serde_json::Value {
    let mut value = json!({ "role": message.role, "content": message.content });
    if !message.tool_calls.is_empty() {
        value["tool_calls"] = message
            .tool_calls
            .iter()
            .map(|call| {
                let arguments = serde_json::from_str::<serde_json::Value>(&call.arguments)
                    .unwrap_or_else(|_| serde_json::Value::String(call.arguments.clone()));
                json!({
                    "id": call.id,
                    "type": "function",
                    "function": { "name": call.name, "arguments": arguments },
                })
            })
            .collect();
    }
    if let Some(id) = &message.tool_call_id {
        value["tool_call_id"] = json!(id);
    }
    value
}

/// The error with the template line it happened on, when known.
fn describe(error: &minijinja::Error) -> String {
    let mut text = error
        .detail()
        .map_or_else(|| error.kind().to_string(), str::to_owned);
    if let Some(line) = error.line() {
        text = format!("line {line}: {text}");
    }
    text
}

/// Templates call `raise_exception("...")` to refuse a conversation.
fn raise_exception(message: String) -> Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
}

/// `strftime_now(format)`: the current UTC date and time (Llama 3 templates
/// print today's date). Supports %Y %y %m %d %e %B %b %A %a %H %M %S %%.
fn strftime_now(format: &str) -> String {
    let seconds = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    strftime(format, seconds)
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = [
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
];

fn strftime(format: &str, seconds: u64) -> String {
    let days = seconds / 86_400;
    let (year, month, day, _, _, _) = cortex_request::civil_date(seconds as i64);
    let secs = seconds % 86_400;
    let month_name = MONTHS[(month - 1) as usize];
    let day_name = DAYS[(days % 7) as usize];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out += &year.to_string(),
            Some('y') => out += &format!("{:02}", year % 100),
            Some('m') => out += &format!("{month:02}"),
            Some('d') => out += &format!("{day:02}"),
            Some('e') => out += &format!("{day:2}"),
            Some('B') => out += month_name,
            Some('b') => out += &month_name[..3],
            Some('A') => out += day_name,
            Some('a') => out += &day_name[..3],
            Some('H') => out += &format!("{:02}", secs / 3600),
            Some('M') => out += &format!("{:02}", secs / 60 % 60),
            Some('S') => out += &format!("{:02}", secs % 60),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use cortex_request::ToolCall;

    use super::*;

    /// SmolLM2-135M-Instruct's own template, as its GGUF carries it.
    const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn the_default_models_template_renders_as_transformers_does() {
        let template = ChatTemplate::new(SMOLLM2, "<|im_start|>", "<|im_end|>").unwrap();
        let prompt = template
            .render(&[ChatMessage::user("Hi")], None, true)
            .unwrap();
        assert_eq!(
            prompt,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        assert!(!template.takes_tools());
        assert_eq!(
            template.render(&[ChatMessage::user("Hi")], Some("[]"), true),
            Err(TemplateError::NoTools)
        );
    }

    #[test]
    fn python_methods_exceptions_and_tool_turns() {
        let source = r#"
{%- if messages[0].role == 'system' %}{{ raise_exception('no system role: ' + messages[0].content.strip()) }}{% endif %}
{%- for m in messages %}
{%- if m.tool_calls is defined %}{% for c in m.tool_calls %}CALL {{ c.function.name }} {{ c.function.arguments | tojson }};{% endfor %}
{%- elif m.role == 'tool' %}RESULT {{ m.tool_call_id }}={{ m.content }};
{%- else %}{{ m.role.upper() }}:{{ m.content.lstrip() }};
{%- endif %}
{%- endfor %}
{%- if tools %}TOOLS {% for t in tools %}{{ t.function.name }} {% endfor %}{% endif %}"#;
        let template = ChatTemplate::new(source, "", "").unwrap();
        assert!(template.takes_tools());
        let mut call = ChatMessage::assistant("");
        call.tool_calls = vec![ToolCall {
            id: "c1".into(),
            name: "add".into(),
            arguments: r#"{"a": 1}"#.into(),
        }];
        let mut result = ChatMessage::new("tool", "2");
        result.tool_call_id = Some("c1".into());
        let prompt = template
            .render(
                &[ChatMessage::user("  one plus one"), call, result],
                Some(r#"[{"type": "function", "function": {"name": "add"}}]"#),
                true,
            )
            .unwrap();
        assert_eq!(
            prompt,
            r#"USER:one plus one;CALL add {"a":1};RESULT c1=2;TOOLS add "#
        );
        let refused = template.render(&[ChatMessage::system(" x ")], None, true);
        assert_eq!(
            refused,
            Err(TemplateError::Render("line 2: no system role: x".into()))
        );
    }

    #[test]
    fn a_broken_template_is_a_syntax_error_with_its_line() {
        let error =
            ChatTemplate::new("{% for m in messages %}\n{{ m.content }", "", "").unwrap_err();
        assert!(
            matches!(&error, TemplateError::Syntax(text) if text.starts_with("line 2")),
            "{error}"
        );
    }

    #[test]
    fn dates_format_like_strftime() {
        // 2024-02-29 13:05:09 UTC, a Thursday.
        let t = 1_709_211_909;
        assert_eq!(strftime("%d %b %Y", t), "29 Feb 2024");
        assert_eq!(
            strftime("%A %B %e, %y %H:%M:%S %%", t),
            "Thursday February 29, 24 13:05:09 %"
        );
    }
}
