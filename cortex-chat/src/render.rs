//! A chat made ready for a model: rendered with its template, adapted
//! where the template cannot render something (a system message, the tools
//! on offer, earlier calls), with how its output is read and, when the
//! output must be a call, the grammar that makes it one.

use std::borrow::Cow;

use cortex_grammar::Part;
use cortex_request::{ChatMessage, ToolChoice, Tools};
use serde_json::{Value, json};

use crate::capabilities::{ContentCalls, named_calls};
use crate::conversation::Conversation;
use crate::native::{Body, JsonCall, NativeCalls, probe};
use crate::syntax::{CallSyntax, OutputSyntax};
use crate::template::{ChatTemplate, TemplateError};

/// A chat rendered for generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderedChat {
    /// The prompt: the conversation, the assistant's turn opened.
    pub prompt: String,
    /// How the output is read.
    pub syntax: OutputSyntax,
    /// What the output must match (GBNF), when the tools' choice or the
    /// generic tools format constrain it.
    pub grammar: Option<String>,
}

/// What [`ChatTemplate::render_chat`] changes of a conversation that the
/// template cannot render as it is (see `docs/chat-templates.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Adaptations {
    /// A `developer` message is the system message (a template without
    /// that role).
    pub developer_as_system: bool,
    /// Earlier calls and results are written as cortex's JSON (a template
    /// that does not render them, or renders no tools).
    pub calls_as_text: bool,
    /// Earlier calls are written into the assistant's text as the family's
    /// model writes them (a template that renders no calls but names its
    /// syntax: LFM2, Granite 3.3); their results stay tool messages, which
    /// the template renders.
    pub calls_in_content: bool,
    /// The tools are offered by cortex's generic preamble (a template that
    /// does not render them).
    pub tools_preamble: bool,
    /// The system message is at the head of the first user message (a
    /// template that refuses or drops one).
    pub system_in_first_user: bool,
    /// `enable_thinking` is true, as llama.cpp hands it, where the caller
    /// left it unset and the template would close the thinking block.
    pub thinking_on: bool,
    /// Content sent as a list of text parts reaches the template as their
    /// lines, joined as llama.cpp joins them (a template that does not walk
    /// such lists).
    pub parts_joined: bool,
}

impl Adaptations {
    /// Whether any applies.
    pub fn any(&self) -> bool {
        *self != Self::default()
    }
}

impl ChatTemplate {
    /// What [`ChatTemplate::render_chat`] changes of `conversation` (but
    /// for tools a template that renders tools fails on, which get the
    /// preamble too).
    pub fn adaptations(&self, conversation: &Conversation<'_>) -> Adaptations {
        self.adaptations_when(conversation, self.capabilities.takes_tools)
    }

    /// [`ChatTemplate::adaptations`], the template taking the tools on
    /// offer or not (`takes_tools`).
    fn adaptations_when(&self, conversation: &Conversation<'_>, takes_tools: bool) -> Adaptations {
        let capabilities = &self.capabilities;
        let messages = conversation.messages;
        let tools_preamble = conversation.tools.is_some() && !takes_tools;
        let has_calls = messages
            .iter()
            .any(|m| !m.tool_calls.is_empty() || m.role == "tool");
        let has_system = messages
            .iter()
            .any(|m| m.role == "system" || (m.role == "developer" && !capabilities.developer_role));
        let sets_thinking = conversation.variables.is_some_and(|text| {
            serde_json::from_str::<Value>(text).map_or(true, |v| {
                !v.is_object() || v.get("enable_thinking").is_some()
            })
        });
        let unrendered_calls = has_calls && (tools_preamble || !capabilities.renders_calls);
        let calls_in_content = unrendered_calls
            && !tools_preamble
            && capabilities.content_calls.is_some_and(|form| {
                messages.iter().all(|m| {
                    m.tool_calls.is_empty() || form.write(&m.content, &m.tool_calls).is_some()
                })
            });
        Adaptations {
            developer_as_system: !capabilities.developer_role
                && messages.iter().any(|m| m.role == "developer"),
            calls_as_text: unrendered_calls && !calls_in_content,
            calls_in_content,
            tools_preamble,
            system_in_first_user: !capabilities.system_role && (has_system || tools_preamble),
            thinking_on: capabilities.thinking_closed_unless_enabled && !sets_thinking,
            parts_joined: messages
                .iter()
                .any(|m| !m.content_parts.is_empty() && !capabilities.walks_parts_of(&m.role)),
        }
    }

    /// Renders `conversation` for generation. Where the template cannot
    /// render part of it, it is adapted as llama.cpp adapts it: a system
    /// message a template refuses goes at the head of the first user
    /// message; tools a template does not render are offered by cortex's
    /// generic preamble (the functions as JSON schemas, the answer a JSON
    /// object: calls or a response), the output held to that form by a
    /// grammar; earlier calls a template does not render are written as
    /// that JSON (so are tools a template that renders tools fails to
    /// render). A template whose prompt closes an empty thinking block
    /// unless `enable_thinking` is set (llama.cpp's copy of DeepSeek's R1
    /// distills) gets it true where the caller leaves it unset, as llama.cpp
    /// hands it: the model thinks anyway, and its thinking is read as such.
    pub fn render_chat(
        &self,
        conversation: &Conversation<'_>,
    ) -> Result<RenderedChat, TemplateError> {
        let adapted = self.adaptations(conversation);
        match self.render_adapted(conversation, adapted) {
            // A template that renders tools may fail on a request's own
            // (Command R+'s needs every parameter described): cortex's
            // preamble offers them instead.
            Err(TemplateError::Render(_))
                if !adapted.tools_preamble && conversation.tools.is_some() =>
            {
                self.render_adapted(conversation, self.adaptations_when(conversation, false))
            }
            rendered => rendered,
        }
    }

    /// [`ChatTemplate::render_chat`] with the adaptations `adapted`.
    fn render_adapted(
        &self,
        conversation: &Conversation<'_>,
        adapted: Adaptations,
    ) -> Result<RenderedChat, TemplateError> {
        let capabilities = &self.capabilities;
        let tools = conversation.tools;
        let generic = adapted.tools_preamble;
        let mut messages = Cow::Borrowed(conversation.messages);
        if adapted.developer_as_system {
            messages = Cow::Owned(developer_as_system(&messages));
        }
        if adapted.calls_as_text {
            messages = Cow::Owned(calls_as_text(&messages));
        }
        if let (true, Some(form)) = (adapted.calls_in_content, capabilities.content_calls) {
            messages = Cow::Owned(calls_in_content(&messages, form));
        }
        if let (true, Some(tools)) = (generic, tools) {
            messages = Cow::Owned(with_preamble(&messages, tools)?);
        }
        if adapted.system_in_first_user {
            messages = Cow::Owned(system_in_first_user(&messages));
        }
        let variables = adapted
            .thinking_on
            .then(|| thinking_on_unless_set(conversation.variables))
            .flatten();
        let prompt = self.render(
            &Conversation {
                messages: &messages,
                tools: if generic { None } else { tools },
                variables: variables.as_deref().or(conversation.variables),
            },
            true,
        )?;
        let calls = match tools {
            // gpt-oss writes every answer in channels (thinking, then the answer).
            _ if capabilities.channels && !generic => CallSyntax::Channels,
            // So does functionary v3.2, in messages to recipients.
            _ if capabilities.recipients && !generic => CallSyntax::Recipients,
            None => CallSyntax::None,
            Some(_) if generic => CallSyntax::Generic,
            Some(_) => CallSyntax::Native(capabilities.native_calls.clone().map(Box::new)),
        };
        let mut prompt = prompt;
        let reasoning = capabilities.reasoning.clone();
        let mut starts_in_reasoning = reasoning.as_ref().is_some_and(|markers| {
            let tail = prompt.trim_end();
            tail.ends_with(markers.open.trim())
        });
        let grammar = match tools {
            None => None,
            Some(tools) => self.tools_grammar(tools, generic)?,
        };
        if let (Some(markers), true, true) = (&reasoning, starts_in_reasoning, grammar.is_some()) {
            // An answer a grammar holds starts at once: the prompt's open
            // thinking block is closed, as a template switching thinking off
            // closes it.
            prompt.push_str(markers.close);
            prompt.push_str("\n\n");
            starts_in_reasoning = false;
        }
        Ok(RenderedChat {
            prompt,
            syntax: OutputSyntax {
                reasoning,
                starts_in_reasoning,
                calls,
                one_call: tools.is_some_and(|t| !t.parallel),
            },
            grammar,
        })
    }

    /// The grammar of the output when tools constrain it: the generic
    /// envelope always (a call or, for `auto`, a response); the template's
    /// own call syntax when a call is forced and it could be learned, else a
    /// bare JSON call (which every parser here reads).
    fn tools_grammar(&self, tools: &Tools, generic: bool) -> Result<Option<String>, TemplateError> {
        let functions = functions(tools)?;
        let wanted = wanted(&functions, &tools.choice)?;
        let compiled = if generic {
            generic_grammar(&wanted, tools)
        } else if tools.choice == ToolChoice::Auto {
            return Ok(None);
        } else {
            match self.capabilities.native_calls.as_ref() {
                Some(native) if !self.capabilities.channels => native_grammar(native, &wanted)
                    .unwrap_or_else(|| one_line(&bare_call_schema(&wanted))),
                _ => one_line(&bare_call_schema(&wanted)),
            }
        };
        compiled.map(Some).map_err(|e| unconstrained(&e))
    }
}

/// The functions a call may be of: the one `choice` forces, else all.
fn wanted<'f>(
    functions: &'f [Function],
    choice: &ToolChoice,
) -> Result<Vec<&'f Function>, TemplateError> {
    let wanted: Vec<&Function> = match choice {
        ToolChoice::Function(name) => functions.iter().filter(|f| &f.name == name).collect(),
        ToolChoice::Auto | ToolChoice::Required => functions.iter().collect(),
    };
    if wanted.is_empty() {
        return Err(TemplateError::Input(
            "tool_choice names a function that is not among the tools".into(),
        ));
    }
    Ok(wanted)
}

fn unconstrained(e: &cortex_grammar::SchemaError) -> TemplateError {
    TemplateError::Input(format!(
        "tools: a call cannot be constrained to the functions' parameters: {e}"
    ))
}

/// The generic envelope's grammar for the `wanted` functions of `tools`.
fn generic_grammar(
    wanted: &[&Function],
    tools: &Tools,
) -> Result<String, cortex_grammar::SchemaError> {
    one_line(&generic_schema(wanted, &tools.choice, tools.parallel)).or_else(|_| {
        // A schema no grammar can hold (a `pattern`; forced calls were
        // refused at submit): any object as arguments.
        let loose: Vec<Function> = wanted
            .iter()
            .map(|f| Function {
                name: f.name.clone(),
                description: None,
                parameters: json!({"type": "object"}),
            })
            .collect();
        let loose: Vec<&Function> = loose.iter().collect();
        one_line(&generic_schema(&loose, &tools.choice, tools.parallel))
    })
}

/// A chat made ready for a template that renders only roles and text
/// (llama.cpp's built-in templates, which it renders itself): a
/// `developer` message as the system message, the tools on offer in
/// cortex's generic preamble, earlier calls and their results written as
/// that JSON. The messages to render, how the output is read, and the
/// grammar that holds it to the generic envelope when tools are on offer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextOnlyChat {
    /// The messages, each a role and its text.
    pub messages: Vec<ChatMessage>,
    /// How the output is read.
    pub syntax: OutputSyntax,
    /// What the output must match (GBNF), when tools are on offer.
    pub grammar: Option<String>,
}

impl TextOnlyChat {
    /// `conversation` made ready for a text-only template.
    pub fn new(conversation: &Conversation<'_>) -> Result<Self, TemplateError> {
        let mut messages = developer_as_system(conversation.messages);
        if messages
            .iter()
            .any(|m| !m.tool_calls.is_empty() || m.role == "tool")
        {
            messages = calls_as_text(&messages);
        }
        let Some(tools) = conversation.tools else {
            return Ok(Self {
                messages,
                syntax: OutputSyntax::plain(),
                grammar: None,
            });
        };
        let functions = functions(tools)?;
        let wanted = wanted(&functions, &tools.choice)?;
        let grammar = generic_grammar(&wanted, tools).map_err(|e| unconstrained(&e))?;
        Ok(Self {
            messages: with_preamble(&messages, tools)?,
            syntax: OutputSyntax {
                reasoning: None,
                starts_in_reasoning: false,
                calls: CallSyntax::Generic,
                one_call: !tools.parallel,
            },
            grammar: Some(grammar),
        })
    }
}

/// A function on offer: its name and the schema of its arguments.
struct Function {
    name: String,
    description: Option<String>,
    parameters: Value,
}

fn functions(tools: &Tools) -> Result<Vec<Function>, TemplateError> {
    let Ok(Value::Array(definitions)) = serde_json::from_str::<Value>(&tools.definitions) else {
        return Err(TemplateError::Input("tools are not a JSON array".into()));
    };
    Ok(definitions
        .iter()
        .filter_map(|tool| {
            let function = tool.get("function")?;
            Some(Function {
                name: function.get("name")?.as_str()?.to_owned(),
                description: function
                    .get("description")
                    .and_then(Value::as_str)
                    .map(str::to_owned),
                parameters: match function.get("parameters") {
                    None | Some(Value::Null) => json!({"type": "object"}),
                    Some(schema) => schema.clone(),
                },
            })
        })
        .collect())
}

/// `{"name": N, "arguments": A}` for each function.
fn call_schemas(functions: &[&Function]) -> Vec<Value> {
    functions
        .iter()
        .map(|f| {
            json!({
                "type": "object",
                "properties": {"name": {"const": f.name}, "arguments": f.parameters},
                "required": ["name", "arguments"],
                "additionalProperties": false,
            })
        })
        .collect()
}

fn one_of(mut schemas: Vec<Value>) -> Value {
    if schemas.len() == 1 {
        schemas.remove(0)
    } else {
        json!({ "anyOf": schemas })
    }
}

/// The grammar of one JSON document of `schema`, written on one line (as
/// calls are: a model cannot spend its tokens on blanks).
fn one_line(schema: &Value) -> Result<String, cortex_grammar::SchemaError> {
    cortex_grammar::sequence(&[Part::Json(schema)])
}

/// The most calls one answer in the generic format may make.
const MAX_PARALLEL_CALLS: usize = 4;

/// One bare call: `{"name": ..., "arguments": {...}}`.
fn bare_call_schema(functions: &[&Function]) -> Value {
    one_of(call_schemas(functions))
}

/// cortex's envelope: `{"tool_calls": [calls]}`, or for `auto` also
/// `{"response": "..."}`.
fn generic_schema(functions: &[&Function], choice: &ToolChoice, parallel: bool) -> Value {
    // One call of a named function; else a few, so that a model repeating
    // itself ends its answer rather than run to the token limit.
    let most = match choice {
        ToolChoice::Function(_) => 1,
        _ if !parallel => 1,
        _ => MAX_PARALLEL_CALLS,
    };
    let list = json!({
        "type": "array",
        "items": one_of(call_schemas(functions)),
        "minItems": 1,
        "maxItems": most,
    });
    let calls = json!({
        "type": "object",
        "properties": {"tool_calls": list},
        "required": ["tool_calls"],
        "additionalProperties": false,
    });
    if *choice != ToolChoice::Auto {
        return calls;
    }
    let response = json!({
        "type": "object",
        "properties": {"response": {"type": "string"}},
        "required": ["response"],
        "additionalProperties": false,
    });
    json!({ "anyOf": [calls, response] })
}

/// One call in the template's own syntax, as it wrote its probe call:
/// markers around a JSON call, or around a name and its JSON arguments.
fn native_grammar(
    native: &NativeCalls,
    functions: &[&Function],
) -> Option<Result<String, cortex_grammar::SchemaError>> {
    let written = &native.written;
    // Ids the template wrote into its markers become any nine letters or digits.
    const ID: &str = "[a-zA-Z0-9]{9}";
    let split_ids =
        |text: &str| -> Vec<String> { text.split(probe::ID_FIRST).map(str::to_owned).collect() };
    match &native.body {
        Body::Json(shape) => {
            let schemas: Vec<Value> = functions
                .iter()
                .map(|f| json_call_schema(shape, f))
                .collect::<Option<_>>()?;
            let call = one_of(schemas);
            let value = if written.array {
                json!({"type": "array", "items": call, "minItems": 1, "maxItems": 1})
            } else {
                call
            };
            let before = split_ids(&written.before);
            let after = split_ids(&written.after);
            let mut parts = with_ids(&before, ID);
            parts.push(Part::Json(&value));
            parts.extend(with_ids(&after, ID));
            Some(cortex_grammar::sequence(&parts))
        }
        Body::NameThenJson { .. } => {
            let before = split_ids(&written.before);
            let between = split_ids(&written.between);
            let after = split_ids(&written.after);
            let choices: Vec<Vec<Part<'_>>> = functions
                .iter()
                .map(|f| {
                    let mut choice = vec![Part::Text(&f.name)];
                    choice.extend(with_ids(&between, ID));
                    choice.push(Part::Json(&f.parameters));
                    choice
                })
                .collect();
            let mut parts = with_ids(&before, ID);
            parts.push(Part::OneOf(choices));
            parts.extend(with_ids(&after, ID));
            Some(cortex_grammar::sequence(&parts))
        }
        Body::NameThenArguments { .. } | Body::Python => None,
    }
}

/// Text pieces with an id between each two.
fn with_ids<'a>(pieces: &'a [String], id: &'a str) -> Vec<Part<'a>> {
    let mut parts = Vec::new();
    for (i, piece) in pieces.iter().enumerate() {
        if i > 0 {
            parts.push(Part::Expression(id));
        }
        if !piece.is_empty() {
            parts.push(Part::Text(piece));
        }
    }
    parts
}

/// A call object in the template's JSON shape.
fn json_call_schema(shape: &JsonCall, function: &Function) -> Option<Value> {
    match shape {
        JsonCall::Keyed => Some(json!({
            "type": "object",
            "properties": {function.name.as_str(): function.parameters},
            "required": [function.name],
            "additionalProperties": false,
        })),
        JsonCall::Fields {
            arguments_as_text: true,
            ..
        } => None,
        JsonCall::Fields {
            name, arguments, ..
        } => {
            // The two paths share their leading keys (`function.name`,
            // `function.arguments`): build the nested objects together.
            let mut leaves = vec![
                (name.as_slice(), json!({"const": function.name})),
                (arguments.as_slice(), function.parameters.clone()),
            ];
            Some(nested_schema(&mut leaves))
        }
    }
}

/// An object schema holding each leaf at its path (all required).
fn nested_schema(leaves: &mut [(&[String], Value)]) -> Value {
    let mut properties = serde_json::Map::new();
    let mut order: Vec<String> = Vec::new();
    for (path, _) in leaves.iter() {
        if let Some(first) = path.first()
            && !order.contains(first)
        {
            order.push(first.clone());
        }
    }
    for key in &order {
        let mut inner: Vec<(&[String], Value)> = leaves
            .iter()
            .filter(|(path, _)| path.first() == Some(key))
            .map(|(path, leaf)| (&path[1..], leaf.clone()))
            .collect();
        let schema = match inner.as_mut_slice() {
            [([], leaf)] => leaf.clone(),
            many => nested_schema(many),
        };
        properties.insert(key.clone(), schema);
    }
    json!({
        "type": "object",
        "properties": properties,
        "required": order,
        "additionalProperties": false,
    })
}

/// Earlier calls and their results as text in cortex's envelope, for a
/// template that cannot render them: a call turn's calls as
/// `{"tool_calls": [...]}`, a result as a user turn
/// `{"tool_response": {"id", "content"}}`.
fn calls_as_text(messages: &[ChatMessage]) -> Vec<ChatMessage> {
    messages
        .iter()
        .map(|message| {
            if !message.tool_calls.is_empty() {
                let envelope =
                    json!({ "tool_calls": named_calls(&message.tool_calls) }).to_string();
                let content = if message.content.trim().is_empty() {
                    envelope
                } else {
                    format!("{}\n{envelope}", message.content)
                };
                let mut turn = ChatMessage::assistant(content);
                turn.reasoning_content = message.reasoning_content.clone();
                turn
            } else if message.role == "tool" {
                ChatMessage::user(
                    json!({"tool_response": {
                        "id": message.tool_call_id.clone().unwrap_or_default(),
                        "content": message.content,
                    }})
                    .to_string(),
                )
            } else {
                message.clone()
            }
        })
        .collect()
}

/// Earlier calls written into their assistant turns' text in `form`, the
/// family's own syntax; every call was found writable (see
/// [`Adaptations::calls_in_content`]).
fn calls_in_content(messages: &[ChatMessage], form: ContentCalls) -> Vec<ChatMessage> {
    messages
        .iter()
        .map(
            |message| match form.write(&message.content, &message.tool_calls) {
                Some(content) if !message.tool_calls.is_empty() => {
                    let mut turn = ChatMessage::assistant(content);
                    turn.reasoning_content = message.reasoning_content.clone();
                    turn
                }
                _ => message.clone(),
            },
        )
        .collect()
}

/// The generic tools preamble, at the end of the system message (one is
/// made when there is none).
fn with_preamble(
    messages: &[ChatMessage],
    tools: &Tools,
) -> Result<Vec<ChatMessage>, TemplateError> {
    let functions = functions(tools)?;
    let listed: Vec<Value> = functions
        .iter()
        .map(|f| {
            let mut entry = json!({"name": f.name, "parameters": f.parameters});
            if let Some(description) = &f.description {
                entry["description"] = json!(description);
            }
            entry
        })
        .collect();
    let listed = serde_json::to_string_pretty(&listed).unwrap_or_default();
    let how = match &tools.choice {
        ToolChoice::Auto => {
            "Answer with one JSON object: {\"tool_calls\": [{\"name\": \"<function>\", \"arguments\": {<its arguments>}}]} to call functions, or {\"response\": \"<your answer>\"} to answer directly.".to_owned()
        }
        ToolChoice::Required => {
            "Answer with one JSON object calling one or more of them: {\"tool_calls\": [{\"name\": \"<function>\", \"arguments\": {<its arguments>}}]}.".to_owned()
        }
        ToolChoice::Function(name) => format!(
            "Answer with one JSON object calling {name}: {{\"tool_calls\": [{{\"name\": \"{name}\", \"arguments\": {{<its arguments>}}}}]}}."
        ),
    };
    let preamble = format!(
        "You can call these functions (their arguments as JSON Schemas):\n{listed}\n\n{how}"
    );
    let mut out = messages.to_vec();
    match out.iter_mut().find(|m| m.role == "system") {
        Some(system) => {
            system.content = format!("{}\n\n{preamble}", system.content);
            if !system.content_parts.is_empty() {
                system.content_parts.push(preamble);
            }
        }
        None => out.insert(0, ChatMessage::system(preamble)),
    }
    Ok(out)
}

/// `developer` messages as system messages, for a template that does not
/// know that role (OpenAI's own rule for models without it).
fn developer_as_system(messages: &[ChatMessage]) -> Vec<ChatMessage> {
    messages
        .iter()
        .map(|m| {
            let mut m = m.clone();
            if m.role == "developer" {
                m.role = "system".into();
            }
            m
        })
        .collect()
}

/// System messages at the head of the first user message (or as a user
/// message when none follows), for a template without a system role.
fn system_in_first_user(messages: &[ChatMessage]) -> Vec<ChatMessage> {
    let system: Vec<&str> = messages
        .iter()
        .filter(|m| m.role == "system")
        .map(|m| m.content.as_str())
        .collect();
    let system = system.join("\n\n");
    let mut out: Vec<ChatMessage> = messages
        .iter()
        .filter(|m| m.role != "system")
        .cloned()
        .collect();
    match out.iter_mut().find(|m| m.role == "user") {
        Some(user) => {
            user.content = format!("{system}\n\n{}", user.content);
            if !user.content_parts.is_empty() {
                user.content_parts.insert(0, system);
            }
        }
        None => out.insert(0, ChatMessage::user(system)),
    }
    out
}

/// `variables` (a JSON object's text) with `enable_thinking: true` unless
/// they set it; `None` when they are not an object (rendering says why).
fn thinking_on_unless_set(variables: Option<&str>) -> Option<String> {
    let mut map = match variables {
        None => serde_json::Map::new(),
        Some(text) => match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(map)) => map,
            _ => return None,
        },
    };
    map.entry("enable_thinking").or_insert(Value::Bool(true));
    Some(Value::Object(map).to_string())
}
