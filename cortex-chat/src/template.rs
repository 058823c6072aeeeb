//! Rendering a Jinja chat template as `transformers` does.

use cortex_request::ChatMessage;
use minijinja::value::ValueKind;
use minijinja::{Environment, ErrorKind, Value};

use crate::capabilities::{self, Capabilities};
use crate::conversation::Conversation;
use crate::python;

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
    /// What the caller handed to the template is not what it must be
    /// (tools that are not a JSON array, variables that are not an object).
    #[error("{0}")]
    Input(String),
}

/// A compiled chat template, and what it was found to render.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
    /// It reads `functions` and `datetime`, which Fireworks' FireFunction
    /// templates take from their server (the tools as JSON text, today).
    reads_functions: bool,
    pub(crate) capabilities: Capabilities,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("capabilities", &self.capabilities)
            .finish_non_exhaustive()
    }
}

/// The name the template is compiled under.
const NAME: &str = "chat";

/// The most work one render may do, in minijinja's fuel: one per
/// instruction and one per 64 bytes of text or values made, checked before a
/// large allocation. A render therefore ends and holds at most about 256 MB,
/// whatever a template does (templates come from clients: `/api/create`, an
/// uploaded GGUF): a loop that doubles a string or list, `range`, macros
/// calling themselves. Real templates spend about 1.5 per byte they print
/// (2,821 on the longest conversation of the parity test), so this leaves a
/// prompt of 100 MB room.
const FUEL: u64 = 4_000_000;

/// The fuel of each render that probes what a template does: its
/// conversations are a few short turns.
const PROBE_FUEL: u64 = 200_000;

impl ChatTemplate {
    /// Compiles `source`; `bos_token` and `eos_token` are the texts of the
    /// model's special tokens, which templates may print.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self, TemplateError> {
        let mut env = Environment::new();
        // transformers renders with trim_blocks and lstrip_blocks on.
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()
                .map_err(|e| TemplateError::Syntax(describe(&e)))?,
        );
        env.set_fuel(Some(PROBE_FUEL));
        python::behave_as_python(&mut env);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(NAME, without_generation_tags(source))
            .map_err(|e| TemplateError::Syntax(describe(&e)))?;
        let reads_functions = env
            .get_template(NAME)
            .map_err(|e| TemplateError::Syntax(describe(&e)))?
            .undeclared_variables(false)
            .contains("functions");
        let mut template = Self {
            env,
            bos_token: bos_token.to_owned(),
            eos_token: eos_token.to_owned(),
            reads_functions,
            capabilities: Capabilities::default(),
        };
        template.capabilities = Capabilities::probe(
            |conversation| template.render(conversation, false).ok(),
            source,
        );
        if !template.capabilities.renders_calls {
            // Asked again with the calls' arguments as text.
            template.capabilities.string_arguments = true;
            let again = Capabilities::probe(
                |conversation| template.render(conversation, false).ok(),
                source,
            );
            if again.renders_calls {
                template.capabilities = Capabilities {
                    string_arguments: true,
                    ..again
                };
            } else {
                template.capabilities.string_arguments = false;
            }
        }
        template.capabilities.thinking_closed_unless_enabled =
            template.closes_thinking_unless_enabled();
        // Asked with the parts handed over as a list.
        template.capabilities.walks_parts = true;
        template.capabilities.walks_system_parts = true;
        template.capabilities.walks_parts = template.walks_parts("user");
        template.capabilities.walks_system_parts = template.walks_parts("system");
        template.env.set_fuel(Some(FUEL));
        Ok(template)
    }

    /// Whether the template walks the content of a message of `role`
    /// given as a list of text parts (Granite 4, Reka, Kimi K2: as vLLM
    /// finds which form a template takes; some walk a user's but print a
    /// system message's as it is): it renders each part's text and nothing
    /// of the list itself. Asked with the list handed over.
    fn walks_parts(&self, role: &str) -> bool {
        const PARTS: [&str; 2] = ["ZQXJ part one", "ZQXJ part two"];
        let parts = ChatMessage::from_parts(role, PARTS.map(str::to_owned).to_vec());
        let messages = if role == "user" {
            vec![parts]
        } else {
            vec![parts, ChatMessage::user("ZQXJ question")]
        };
        let Ok(text) = self.render(&Conversation::new(&messages), false) else {
            return false;
        };
        PARTS.iter().all(|part| text.contains(part))
            && !["'type'", "\"type\"", "'text'", "\"text\""]
                .iter()
                .any(|mark| text.contains(mark))
    }

    /// Whether the generation prompt closes an empty thinking block unless
    /// `enable_thinking` is set, and leaves it open when it is (llama.cpp's
    /// copy of DeepSeek's R1 distills): a model that thinks whatever the
    /// prompt says, whose thinking would land in its answer.
    fn closes_thinking_unless_enabled(&self) -> bool {
        let Some(markers) = &self.capabilities.reasoning else {
            return false;
        };
        let prompt = |variables| {
            self.render(
                &Conversation {
                    messages: &[ChatMessage::user("Hi")],
                    tools: None,
                    variables,
                },
                true,
            )
            .ok()
        };
        let (Some(unset), Some(enabled)) =
            (prompt(None), prompt(Some(r#"{"enable_thinking": true}"#)))
        else {
            return false;
        };
        let closed = unset.trim_end().ends_with(markers.close);
        let opened = enabled.trim_end().ends_with(markers.open);
        closed && opened
    }

    /// How the template writes `calls` in an assistant's turn: the text a
    /// model trained on it generates to make them (what its output parser
    /// reads back); `None` when it does not write calls.
    pub fn write_calls(&self, calls: &[cortex_request::ToolCall]) -> Option<String> {
        capabilities::written_calls(|conversation| self.render(conversation, false).ok(), calls)
    }

    /// Whether the template renders the functions on offer (a model
    /// trained to call them); others get cortex's generic tools preamble.
    pub fn takes_tools(&self) -> bool {
        self.capabilities.takes_tools
    }

    /// Whether the template marks a model's thinking (`<think>`, gpt-oss's
    /// analysis channel, ...): a reasoning model's.
    pub fn marks_thinking(&self) -> bool {
        self.capabilities.reasoning.is_some() || self.capabilities.channels
    }

    /// Renders `conversation`, ending with the assistant's turn opened when
    /// `add_generation_prompt`.
    pub fn render(
        &self,
        conversation: &Conversation<'_>,
        add_generation_prompt: bool,
    ) -> Result<String, TemplateError> {
        let mut context: Vec<(String, Value)> = Vec::new();
        if let Some(text) = conversation.variables {
            let variables: Value = serde_json::from_str(text).map_err(|e| {
                TemplateError::Input(format!("template variables are not JSON: {e}"))
            })?;
            if variables.kind() != ValueKind::Map {
                return Err(TemplateError::Input(
                    "template variables must be a JSON object".into(),
                ));
            }
            for key in variables.try_iter().into_iter().flatten() {
                let value = variables.get_item(&key).unwrap_or_default();
                context.push((key.to_string(), value));
            }
        }
        if self.reads_functions {
            // As llama.cpp hands them: the tools as indented JSON, and the date.
            let functions = match conversation.tools {
                Some(tools) => serde_json::from_str::<serde_json::Value>(&tools.definitions)
                    .ok()
                    .and_then(|t| serde_json::to_string_pretty(&t).ok())
                    .unwrap_or_default(),
                None => String::new(),
            };
            context.push(("functions".into(), Value::from(functions)));
            context.push((
                "datetime".into(),
                Value::from(strftime_now("%b %d %Y %H:%M:%S GMT")),
            ));
        }
        if let Some(tools) = conversation.tools {
            let tools: serde_json::Value = serde_json::from_str(&tools.definitions)
                .map_err(|e| TemplateError::Input(format!("tools are not JSON: {e}")))?;
            context.push((
                "tools".into(),
                Value::from(minijinja::value::Serde(with_defaults(tools))),
            ));
        }
        let messages: Vec<Value> = conversation
            .messages
            .iter()
            .map(|message| {
                message_value(
                    message,
                    self.capabilities.walks_parts_of(&message.role),
                    self.capabilities.string_arguments,
                )
            })
            .collect();
        context.push(("messages".into(), Value::from(messages)));
        context.push((
            "add_generation_prompt".into(),
            Value::from(add_generation_prompt),
        ));
        context.push(("bos_token".into(), Value::from(self.bos_token.as_str())));
        context.push(("eos_token".into(), Value::from(self.eos_token.as_str())));
        let context = Value::from_pairs(context);
        self.env
            .get_template(NAME)
            .and_then(|t| t.render(context))
            .map_err(|e| TemplateError::Render(describe(&e)))
    }
}

/// Tools as llama.cpp hands them to templates: every function with a
/// `description` (empty when the client gave none) and `parameters`
/// (templates write `"..." + tool.description`, which fails on nothing).
fn with_defaults(mut tools: serde_json::Value) -> serde_json::Value {
    for tool in tools.as_array_mut().into_iter().flatten() {
        if let Some(function) = tool.get_mut("function").and_then(|f| f.as_object_mut()) {
            function
                .entry("description")
                .or_insert_with(|| serde_json::Value::from(""));
            function
                .entry("parameters")
                .or_insert_with(|| serde_json::json!({"type": "object", "properties": {}}));
        }
    }
    tools
}

/// `transformers` marks the assistant's text with `{% generation %}` ...
/// `{% endgeneration %}` (to find it for training masks); rendering is the
/// same with them as an `if true` block, whitespace control kept.
fn without_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        let after = &rest[start + 2..];
        let Some(end) = after.find("%}") else {
            break;
        };
        let tag = &after[..end];
        let open = if tag.starts_with(['-', '+']) {
            &tag[..1]
        } else {
            ""
        };
        let close = if tag.ends_with(['-', '+']) {
            &tag[tag.len() - 1..]
        } else {
            ""
        };
        let replacement = match tag[open.len()..tag.len() - close.len()].trim() {
            "generation" => Some(" if true "),
            "endgeneration" => Some(" endif "),
            _ => None,
        };
        out.push_str(&rest[..start + 2]);
        match replacement {
            Some(keyword) => {
                out.push_str(open);
                out.push_str(keyword);
                out.push_str(close);
                out.push_str("%}");
                rest = &after[end + 2..];
            }
            None => rest = after,
        }
    }
    out.push_str(rest);
    out
}

/// A message as templates read it (Hugging Face's shape): `role`,
/// `content` (its text parts as a list of `{"type": "text", "text"}` when
/// it came so and the template walks such lists, `parts_as_list`; else one
/// string), and `tool_calls` (arguments as objects, in their own key order;
/// as the JSON text OpenAI sends when `string_arguments`) or `tool_call_id`
/// only when present, since templates test whether they are defined.
fn message_value(message: &ChatMessage, parts_as_list: bool, string_arguments: bool) -> Value {
    let content = if parts_as_list && !message.content_parts.is_empty() {
        message
            .content_parts
            .iter()
            .map(|text| {
                Value::from_pairs([
                    ("type", Value::from("text")),
                    ("text", Value::from(text.as_str())),
                ])
            })
            .collect::<Vec<Value>>()
            .into()
    } else {
        Value::from(message.content.as_str())
    };
    let mut fields: Vec<(&str, Value)> = vec![
        ("role", Value::from(message.role.as_str())),
        ("content", content),
    ];
    if !message.tool_calls.is_empty() {
        let calls: Vec<Value> = message
            .tool_calls
            .iter()
            .map(|call| {
                let arguments = if string_arguments {
                    Value::from(call.arguments.as_str())
                } else {
                    serde_json::from_str::<Value>(&call.arguments)
                        .unwrap_or_else(|_| Value::from(call.arguments.as_str()))
                };
                let function = Value::from_pairs([
                    ("name", Value::from(call.name.as_str())),
                    ("arguments", arguments),
                ]);
                Value::from_pairs([
                    ("id", Value::from(call.id.as_str())),
                    ("type", Value::from("function")),
                    ("function", function),
                ])
            })
            .collect();
        fields.push(("tool_calls", Value::from(calls)));
    }
    if let Some(id) = &message.tool_call_id {
        fields.push(("tool_call_id", Value::from(id.as_str())));
    }
    if let Some(thinking) = &message.reasoning_content {
        // As transformers hands it: under both names templates read.
        fields.insert(0, ("thinking", Value::from(thinking.as_str())));
        fields.push(("reasoning_content", Value::from(thinking.as_str())));
    }
    Value::from_pairs(fields)
}

/// The error with the template line it happened on, when known.
fn describe(error: &minijinja::Error) -> String {
    let mut text = match error.kind() {
        ErrorKind::OutOfFuel => format!(
            "it did more work or made more text than a chat needs (more than {FUEL} steps, \
             or about {} MiB)",
            (FUEL * python::BYTES_PER_FUEL as u64) >> 20
        ),
        _ => error
            .detail()
            .map_or_else(|| error.kind().to_string(), str::to_owned),
    };
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
    use cortex_request::{ToolCall, Tools};

    use super::*;

    /// SmolLM2-135M-Instruct's own template, as its GGUF carries it.
    const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn the_default_models_template_renders_as_transformers_does() {
        let template = ChatTemplate::new(SMOLLM2, "<|im_start|>", "<|im_end|>").unwrap();
        let hi = [ChatMessage::user("Hi")];
        let prompt = template.render(&Conversation::new(&hi), true).unwrap();
        assert_eq!(
            prompt,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        assert!(!template.takes_tools());
        // Tools it cannot render are offered by the generic preamble, the
        // answer held to its JSON envelope.
        let tools = Tools {
            definitions: r#"[{"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}]"#.into(),
            choice: cortex_request::ToolChoice::Required,
            parallel: true,
        };
        let rendered = template
            .render_chat(&Conversation {
                messages: &hi,
                tools: Some(&tools),
                variables: None,
            })
            .unwrap();
        assert!(
            rendered
                .prompt
                .starts_with("<|im_start|>system\nYou can call these functions")
        );
        assert!(rendered.grammar.unwrap().contains("tool_calls"));
        let parsed = rendered
            .syntax
            .parse(r#"{"tool_calls": [{"name": "add", "arguments": {"a": 1}}]}"#);
        assert_eq!(parsed.tool_calls[0].arguments, r#"{"a":1}"#);
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
        let tools = Tools {
            definitions: r#"[{"type": "function", "function": {"name": "add"}}]"#.into(),
            choice: cortex_request::ToolChoice::Auto,
            parallel: true,
        };
        let prompt = template
            .render(
                &Conversation {
                    messages: &[ChatMessage::user("  one plus one"), call, result],
                    tools: Some(&tools),
                    variables: None,
                },
                true,
            )
            .unwrap();
        assert_eq!(
            prompt,
            r#"USER:one plus one;CALL add {"a": 1};RESULT c1=2;TOOLS add "#
        );
        let refused = template.render(&Conversation::new(&[ChatMessage::system(" x ")]), true);
        assert_eq!(
            refused,
            Err(TemplateError::Render("line 2: no system role: x".into()))
        );
    }

    #[test]
    fn content_parts_reach_a_template_that_walks_them_as_a_list_else_as_lines() {
        let parts = || {
            [ChatMessage::from_parts(
                "user",
                vec!["Translate to French:".into(), "Good morning".into()],
            )]
        };
        // Granite 4's way: a string, or each part's text.
        let walks = ChatTemplate::new(
            "{% for m in messages %}{% if m.content is string %}{{ m.content }}{% else %}{% for p in m.content %}[{{ p.text }}]{% endfor %}{% endif %}{% endfor %}",
            "",
            "",
        )
        .unwrap();
        assert!(walks.capabilities.walks_parts);
        let prompt = walks.render(&Conversation::new(&parts()), false).unwrap();
        assert_eq!(prompt, "[Translate to French:][Good morning]");
        // One that prints the content as it is gets the lines joined.
        let prints = ChatTemplate::new(SMOLLM2, "", "").unwrap();
        assert!(!prints.capabilities.walks_parts);
        let prompt = prints.render(&Conversation::new(&parts()), false).unwrap();
        assert!(
            prompt.contains("user\nTranslate to French:\nGood morning<|im_end|>"),
            "{prompt}"
        );
    }

    #[test]
    fn a_template_that_would_eat_the_machine_fails_to_render_instead() {
        let doubling = |set: &str, start: &str, doubled: &str| {
            format!(
                "{{% set ns = namespace(v={start}) %}}{{% for i in range(100) %}}\
                 {{% set {set} = {doubled} %}}{{% endfor %}}{{{{ ns.v|length }}}}"
            )
        };
        let hostile = [
            // Each doubles a value until it holds more than the memory.
            doubling("ns.v", "'x'", "ns.v + ns.v"),
            doubling("ns.v", "'x'", "ns.v ~ ns.v"),
            doubling("ns.v", "[1]", "ns.v + ns.v"),
            "{% set l = [1] %}".to_owned() + &"{% set l = l + l %}".repeat(40) + "{{ l|length }}",
            "{% macro f(s, n) %}{% if n %}{{ f(s ~ s, n - 1) }}{% endif %}{% endmacro %}{{ f('x', 60) }}"
                .to_owned(),
            // A list printed as far more text than it holds.
            "{% set l = [1] %}".to_owned() + &"{% set l = l + l %}".repeat(30) + "{{ l|tojson }}",
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
                .to_owned(),
        ];
        let hi = [ChatMessage::user("Hi")];
        for source in hostile {
            let template = ChatTemplate::new(&source, "", "").unwrap();
            let error = template.render(&Conversation::new(&hi), true).unwrap_err();
            assert!(
                error
                    .to_string()
                    .contains("more work or made more text than a chat needs"),
                "{source}: {error}"
            );
        }
    }

    #[test]
    fn a_namespaces_lists_change_in_place_as_pythons_do() {
        // Kimi K2's queue of call ids, and Python's list methods.
        let source = "{% set ns = namespace(ids=[], n=0) %}\
{% set _ = ns.ids.append('a') %}{% set _ = ns.ids.extend(['b', 'c']) %}{% set _ = ns.ids.insert(0, 'z') %}\
{{ ns.ids.pop(0) }}{{ ns.ids.pop() }} {{ ns.ids | length }} {{ ns.ids[-1] }} {{ ns.ids | tojson }} \
{% for id in ns.ids %}{{ id }}{% endfor %}{% if ns.ids %} full{% endif %}\
{% set _ = ns.ids.clear() %}{% if not ns.ids %} empty{% endif %}";
        let template = ChatTemplate::new(source, "", "").unwrap();
        let text = template.render(&Conversation::new(&[]), false).unwrap();
        assert_eq!(text, r#"zc 2 b ["a", "b"] ab full empty"#);
        let pops_nothing = "{% set ns = namespace(ids=[]) %}{{ ns.ids.pop(0) }}";
        let template = ChatTemplate::new(pops_nothing, "", "").unwrap();
        assert!(template.render(&Conversation::new(&[]), false).is_err());
        // A list extended by itself, doubling in one step: an error, not a
        // hang on its own lock nor memory without end.
        let doubling = "{% set ns = namespace(l=['x']) %}{% for i in range(10000) %}\
{% set _ = ns.l.extend(ns.l) %}{% endfor %}{{ ns.l | length }}";
        let template = ChatTemplate::new(doubling, "", "").unwrap();
        let error = template.render(&Conversation::new(&[]), false).unwrap_err();
        assert!(error.to_string().contains("more than"), "{error}");
    }

    #[test]
    fn variables_python_printing_and_generation_tags() {
        let source = "{% generation %}{{ flag }} {{ {'a': [1, none]} }}{%- endgeneration %} {{ messages | length }}";
        let template = ChatTemplate::new(source, "", "").unwrap();
        let prompt = template
            .render(
                &Conversation {
                    messages: &[],
                    tools: None,
                    variables: Some(r#"{"flag": true}"#),
                },
                true,
            )
            .unwrap();
        assert_eq!(prompt, "True {'a': [1, None]} 0");
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
