//! The 70 chat templates llama.cpp ships (`models/templates/` of the
//! llama-cpp-python sdist, fetched by `scripts/test.sh`): every one
//! compiles; six conversations (a plain turn, a system prompt and turns,
//! tools offered, a call and its result, thinking off, content as lists of
//! text parts) render through the
//! wire format exactly as Hugging Face `transformers` renders them, but for
//! the differences `docs/chat-templates.md` lists with why, and through the
//! request path (`render_chat`) too but where it adapts them; the calls a
//! template writes are read back by the syntax learned from it; thinking is
//! split on the reasoning templates.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use cortex_chat::{ChatTemplate, Conversation};
use cortex_queue::JobDefaults;
use cortex_request::{ChatMessage, Request, ToolCall, ToolChoice, Tools};
use serde_json::{Value, json};

/// The templates' folder, or `None` (after saying so) when it was not
/// fetched and is not required.
fn templates_dir() -> Option<PathBuf> {
    cortex_tests::llama_cpp_models().map(|models| models.join("templates"))
}

fn templates(dir: &Path) -> BTreeMap<String, String> {
    let mut templates = BTreeMap::new();
    for entry in std::fs::read_dir(dir).expect("the templates' folder") {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "jinja") {
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            templates.insert(name, std::fs::read_to_string(&path).unwrap());
        }
    }
    templates
}

fn conversations() -> serde_json::Map<String, Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("chat/conversations.json");
    match serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap() {
        Value::Object(map) => map,
        _ => unreachable!("an object of conversations"),
    }
}

/// A chat body as cortex reads a batch line of it.
fn request_of(body: &Value) -> Request {
    let line =
        json!({"custom_id": "c", "method": "POST", "url": "/v1/chat/completions", "body": body});
    let item = cortex_openai::parse_line(1, &line.to_string(), &JobDefaults::default())
        .unwrap_or_else(|e| panic!("{body}: {e}"));
    item.request.as_generate().expect("a generation").clone()
}

/// The differences docs/chat-templates.md lists: `- TEMPLATE / CONVERSATION: why`.
fn documented_differences() -> BTreeSet<(String, String)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/chat-templates.md");
    let text = std::fs::read_to_string(path).unwrap();
    let section = text
        .split("<!-- differences -->")
        .nth(1)
        .and_then(|rest| rest.split("<!-- /differences -->").next())
        .expect("docs/chat-templates.md marks its list of differences");
    section
        .lines()
        .filter_map(|line| {
            let item = line.strip_prefix("- `")?;
            let (template, rest) = item.split_once("` / `")?;
            let (conversation, _) = rest.split_once('`')?;
            Some((template.to_owned(), conversation.to_owned()))
        })
        .collect()
}

#[test]
fn every_template_llama_cpp_ships_renders_as_transformers_renders_it() {
    let Some(dir) = templates_dir() else { return };
    let templates = templates(&dir);
    assert_eq!(templates.len(), 70, "llama.cpp ships 70 templates");
    let conversations = conversations();
    let cases_dir = tempfile::tempdir().unwrap();
    let cases = cases_dir.path().join("cases.json");
    let reference = cases_dir.path().join("reference.json");
    let (bos, eos) = ("<s>", "</s>");
    std::fs::write(
        &cases,
        json!({"templates": templates, "conversations": conversations, "bos_token": bos, "eos_token": eos})
            .to_string(),
    )
    .unwrap();
    cortex_tests::python_check("chat_template_reference.py", &[&cases, &reference]);
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(&reference).unwrap()).unwrap();

    let mut same = 0;
    let mut sent_same = 0;
    let mut parts_joined = 0;
    let mut adapted_by: BTreeMap<String, usize> = BTreeMap::new();
    let mut differences = BTreeSet::new();
    for (name, source) in &templates {
        let template = ChatTemplate::new(source, bos, eos)
            .unwrap_or_else(|e| panic!("{name} does not compile: {e}"));
        for (conversation, case) in &conversations {
            let request = request_of(&case["body"]);
            let cortex_request::Prompt::Chat(messages) = &request.prompt else {
                unreachable!("a chat")
            };
            let ours = template.render(
                &Conversation {
                    messages,
                    tools: request.tools.as_ref(),
                    variables: request.template_variables.as_deref(),
                },
                true,
            );
            let theirs = &reference[name][conversation];
            let agree = match (&ours, theirs.get("text").and_then(Value::as_str)) {
                (Ok(ours), Some(theirs)) => ours == theirs,
                // Both refuse the conversation.
                (Err(_), None) => true,
                _ => false,
            };
            // Through the request path: what `cortex serve` and `cortex run`
            // send, adapted where the template cannot render the request.
            let conversation_sent = Conversation {
                messages,
                tools: request.tools.as_ref(),
                variables: request.template_variables.as_deref(),
            };
            // Parts a template does not walk reach it as lines (transformers
            // hands it the list, which it prints as Python's repr): the
            // renderer's comparison leaves those cases out.
            let joined = template.adaptations(&conversation_sent).parts_joined;
            if joined {
                parts_joined += 1;
            } else if agree {
                same += 1;
            } else {
                differences.insert((name.clone(), conversation.clone()));
            }
            let sent = template.render_chat(&conversation_sent);
            let sent_agrees = match (&sent, theirs.get("text").and_then(Value::as_str)) {
                (Ok(sent), Some(theirs)) => sent.prompt == theirs,
                (Err(_), None) => true,
                _ => false,
            };
            let mut adapted = template.adaptations(&conversation_sent);
            // Tools the template fails on are offered by the preamble.
            adapted.tools_preamble |= sent
                .as_ref()
                .is_ok_and(|s| s.prompt.contains("You can call these functions"));
            if sent_agrees {
                sent_same += 1;
            } else if adapted.any() {
                let names = [
                    (adapted.developer_as_system, "developer as system"),
                    (adapted.calls_as_text, "calls as JSON"),
                    (adapted.calls_in_content, "calls in the family's text"),
                    (adapted.tools_preamble, "tools preamble"),
                    (adapted.system_in_first_user, "system in first user"),
                    (adapted.thinking_on, "enable_thinking true"),
                    (adapted.parts_joined, "parts joined"),
                ];
                let names: Vec<&str> = names
                    .iter()
                    .filter(|(on, _)| *on)
                    .map(|(_, n)| *n)
                    .collect();
                *adapted_by.entry(names.join(" + ")).or_insert(0) += 1;
            } else {
                // Not adapted: the renderer's own difference, listed above.
                assert!(
                    !agree,
                    "{name} / {conversation}: the request path differs unadapted"
                );
            }
        }
    }
    let total = templates.len() * conversations.len();
    let compared = total - parts_joined;
    eprintln!(
        "{same} of {compared} renders are the same as transformers' ({:.1}%; {parts_joined} with content parts joined for templates that do not walk them left out)",
        100.0 * same as f64 / compared as f64
    );
    eprintln!(
        "through the request path: {sent_same} of {total} ({:.1}%); the others adapted as docs/chat-templates.md says: {adapted_by:?}",
        100.0 * sent_same as f64 / total as f64
    );
    assert!(
        sent_same * 100 >= total * 72,
        "{sent_same} of {total} through the request path"
    );
    assert!(
        same * 100 >= compared * 95,
        "{same} of {compared}: {differences:?}"
    );
    let documented = documented_differences();
    let undocumented: Vec<_> = differences.difference(&documented).collect();
    assert!(
        undocumented.is_empty(),
        "renders unlike transformers' that docs/chat-templates.md does not list: {undocumented:?}"
    );
    let stale: Vec<_> = documented.difference(&differences).collect();
    assert!(
        stale.is_empty(),
        "docs/chat-templates.md lists differences that are gone: {stale:?}"
    );
}

/// Two calls (the second template-dependent: some take one at a time).
fn calls() -> Vec<ToolCall> {
    let call = |id: &str, name: &str, arguments: &str| ToolCall {
        id: id.into(),
        name: name.into(),
        arguments: arguments.into(),
    };
    vec![
        call(
            "abc123xyz",
            "get_weather",
            r#"{"location": "Paris", "unit": "celsius"}"#,
        ),
        call("def456uvw", "get_time", r#"{"zone": "CET"}"#),
    ]
}

fn tools(choice: ToolChoice) -> Tools {
    Tools {
        definitions: json!([
            {"type": "function", "function": {"name": "get_weather", "description": "The weather.",
                "parameters": {"type": "object", "properties": {
                    "location": {"type": "string", "description": "A city."},
                    "unit": {"type": "string", "description": "celsius or fahrenheit."}},
                "required": ["location"]}}},
            {"type": "function", "function": {"name": "get_time", "description": "The time.",
                "parameters": {"type": "object", "properties": {
                    "zone": {"type": "string", "description": "A time zone."}},
                "required": ["zone"]}}},
        ])
        .to_string(),
        choice,
        parallel: true,
    }
}

/// Templates whose calls are not read back, and why (docs/chat-templates.md
/// says the same).
const UNREAD: [(&str, &str); 2] = [
    (
        "MiniMax-M3",
        "each argument is its own tag, named by its key",
    ),
    (
        "muse-glimmer",
        "each call is a message of its own, named in its header",
    ),
];

#[test]
fn the_calls_each_template_writes_are_read_back() {
    let Some(dir) = templates_dir() else { return };
    let mut read = 0;
    let mut native = 0;
    for (name, source) in templates(&dir) {
        let template = ChatTemplate::new(&source, "<s>", "</s>").unwrap();
        let tools = tools(ToolChoice::Auto);
        let user = [ChatMessage::user("What is the weather in Paris?")];
        let rendered = template
            .render_chat(&Conversation {
                messages: &user,
                tools: Some(&tools),
                variables: None,
            })
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        if !template.takes_tools() {
            // cortex's generic format: a call is its JSON envelope.
            let parsed = rendered
                .syntax
                .parse(r#"{"tool_calls": [{"name": "get_time", "arguments": {"zone": "CET"}}]}"#);
            assert_eq!(parsed.tool_calls.len(), 1, "{name}");
            continue;
        }
        let all = calls();
        let (written, wanted) = match template.write_calls(&all) {
            Some(text) if text.contains("get_time") => (text, all),
            _ => match template.write_calls(&all[..1]) {
                Some(text) => (text, all[..1].to_vec()),
                None => continue,
            },
        };
        native += 1;
        if UNREAD.iter().any(|(unread, _)| *unread == name) {
            continue;
        }
        // A model whose prompt opened its thinking closes it first.
        let output = match rendered.syntax.reasoning_close() {
            Some(close) if rendered.syntax.starts_in_reasoning() => format!("{close}{written}"),
            _ => written.clone(),
        };
        let parsed = rendered.syntax.parse(&output);
        let got: Vec<(String, Value)> = parsed
            .tool_calls
            .iter()
            .map(|c| {
                (
                    c.name.clone(),
                    serde_json::from_str(&c.arguments).unwrap_or_default(),
                )
            })
            .collect();
        let want: Vec<(String, Value)> = wanted
            .iter()
            .map(|c| (c.name.clone(), serde_json::from_str(&c.arguments).unwrap()))
            .collect();
        assert_eq!(got, want, "{name} wrote {written:?}");
        assert_eq!(parsed.content, "", "{name} wrote {written:?}");
        read += 1;
    }
    eprintln!("{read} of {native} templates that write calls have them read back");
    assert_eq!(read + UNREAD.len(), native);
}

#[test]
fn a_forced_call_is_held_to_the_templates_own_syntax() {
    let Some(dir) = templates_dir() else { return };
    for name in [
        "Qwen-Qwen2.5-7B-Instruct",
        "mistralai-Ministral-3-14B-Reasoning-2512",
        "moonshotai-Kimi-K2",
    ] {
        let source = std::fs::read_to_string(dir.join(format!("{name}.jinja"))).unwrap();
        let template = ChatTemplate::new(&source, "<s>", "</s>").unwrap();
        let tools = tools(ToolChoice::Function("get_time".into()));
        let rendered = template
            .render_chat(&Conversation {
                messages: &[ChatMessage::user("What time is it?")],
                tools: Some(&tools),
                variables: None,
            })
            .unwrap();
        let grammar = rendered.grammar.expect("a forced call has a grammar");
        let written = template.write_calls(&calls()[1..]).unwrap();
        let first_marker: String = written.trim().chars().take(6).collect();
        assert!(
            grammar.contains(&first_marker),
            "{name}: {first_marker:?} not in {grammar}"
        );
        cortex_grammar::check(&grammar).unwrap();
    }
}

#[test]
fn thinking_is_split_on_the_reasoning_templates() {
    let Some(dir) = templates_dir() else { return };
    let cases = [
        // The prompt opens the block: the model's text starts inside it.
        (
            "deepseek-ai-DeepSeek-R1-Distill-Llama-8B",
            "Let me think.\n</think>\n\nIt is 4.",
        ),
        // Thinking on where the caller leaves it unset (as llama.cpp hands
        // `enable_thinking`), though this template reads unset as off.
        (
            "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
            "Let me think.\n</think>\n\nIt is 4.",
        ),
        (
            "Qwen-Qwen3-0.6B",
            "<think>\nLet me think.\n</think>\n\nIt is 4.",
        ),
        (
            "openai-gpt-oss-120b",
            "<|channel|>analysis<|message|>Let me think.<|end|><|start|>assistant<|channel|>final<|message|>It is 4.",
        ),
    ];
    for (name, output) in cases {
        let source = std::fs::read_to_string(dir.join(format!("{name}.jinja"))).unwrap();
        let template = ChatTemplate::new(&source, "<s>", "</s>").unwrap();
        let rendered = template
            .render_chat(&Conversation::new(&[ChatMessage::user("What is 2+2?")]))
            .unwrap();
        let parsed = rendered.syntax.parse(output);
        assert_eq!(
            (parsed.reasoning.as_deref(), parsed.content.as_str()),
            (Some("Let me think."), "It is 4."),
            "{name}"
        );
    }
    // Qwen3 with thinking switched off: the prompt closes an empty block.
    let source = std::fs::read_to_string(dir.join("Qwen-Qwen3-0.6B.jinja")).unwrap();
    let template = ChatTemplate::new(&source, "<s>", "</s>").unwrap();
    let rendered = template
        .render_chat(&Conversation {
            messages: &[ChatMessage::user("Hi")],
            tools: None,
            variables: Some(r#"{"enable_thinking": false}"#),
        })
        .unwrap();
    assert!(
        rendered.prompt.ends_with("<think>\n\n</think>\n\n"),
        "{:?}",
        rendered.prompt
    );
    assert_eq!(rendered.syntax.parse("Hello!").content, "Hello!");
}
