//! Tool calling through the `cortex` binary and the real model, with the
//! default model's own template (which renders no tools: cortex's generic
//! tools format) and with one that takes tools
//! (`examples/templates/chatml-tools.jinja`, Hermes format), and with
//! llama.cpp's built-in templates (chatml; Gemma 3's, chosen for its GGUF):
//! `tool_choice: "required"` or a named function always gives a call whose
//! arguments match the function's parameters, earlier calls and their
//! results render into the prompt, and every body is a valid
//! `ChatCompletion` for the official `openai` package. Through `cortex
//! serve`, the clients people use for tools (the `openai` and `ollama`
//! packages, LangChain, instructor, LiteLLM) call them, streamed and not.

use std::path::Path;
use std::process::Command;
use std::sync::Mutex;

use cortex_tests::{Cortex, Server, clients_python, python_check, read_jsonl};
use serde_json::{Value, json};

static TURN: Mutex<()> = Mutex::new(());

/// The model in turn (two cores run one generating server well).
fn turn() -> std::sync::MutexGuard<'static, ()> {
    TURN.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string", "maxLength": 30},
                "unit": {"enum": ["celsius", "fahrenheit"]}},
                "required": ["city", "unit"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "get_time", "description": "Current time in a time zone",
            "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 30}},
                "required": ["zone"], "additionalProperties": false}}}
    ])
}

fn line(custom_id: &str, messages: Value, extra: Value) -> String {
    let mut body =
        json!({"model": "smollm2-135m", "max_tokens": 80, "temperature": 0, "tools": tools()});
    body["messages"] = messages;
    if let Value::Object(extra) = extra {
        for (key, value) in extra {
            body[key] = value;
        }
    }
    format!(
        "{}\n",
        json!({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body})
    )
}

fn user(text: &str) -> Value {
    json!([{"role": "user", "content": text}])
}

const QUESTIONS: [&str; 6] = [
    "What's the weather in Paris?",
    "Is it raining in Lisbon right now?",
    "What time is it in Tokyo?",
    "How warm is it in Cairo, in fahrenheit?",
    "Tell me the current time in New York.",
    "Weather report for Oslo please.",
];

#[test]
fn forced_calls_match_their_functions_with_or_without_a_template_that_takes_tools() {
    let _turn = turn();
    let cortex = Cortex::new();
    let mut text = String::new();
    for (i, question) in QUESTIONS.iter().enumerate() {
        text += &line(
            &format!("required-{i}"),
            user(question),
            json!({"tool_choice": "required"}),
        );
        text += &line(
            &format!("named-{i}"),
            user(question),
            json!({"tool_choice": {"type": "function", "function": {"name": "get_time"}}}),
        );
    }
    text += &line("auto", user(QUESTIONS[0]), json!({}));
    text += &line(
        "serial",
        user(QUESTIONS[1]),
        json!({"tool_choice": "required", "parallel_tool_calls": false}),
    );
    text += &line(
        "history",
        json!([
            {"role": "user", "content": "What's the weather in Rome?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Rome\", \"unit\": \"celsius\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature\": 21, \"sky\": \"clear\"}"}
        ]),
        json!({"tool_choice": "auto"}),
    );
    let input = cortex.write("tools.jsonl", &text);

    // The default model's own template renders no tools: the generic format.
    cortex.ok(&["run", "tools.jsonl", "-o", "generic.jsonl"]);
    check_calls(&cortex, &input, "generic.jsonl");

    // A template that takes tools: its own (Hermes) format.
    let template =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/templates/chatml-tools.jinja");
    cortex.ok(&[
        "--chat-template",
        template.to_str().unwrap(),
        "run",
        "tools.jsonl",
        "--force",
        "-o",
        "out.jsonl",
    ]);
    check_calls(&cortex, &input, "out.jsonl");

    // A template llama.cpp renders itself (a name; Gemma 3's GGUF has no
    // template, so its built-in one is chosen): the generic format again.
    cortex.ok(&[
        "--chat-template",
        "chatml",
        "run",
        "tools.jsonl",
        "--force",
        "-o",
        "builtin.jsonl",
    ]);
    check_calls(&cortex, &input, "builtin.jsonl");
    cortex.ok(&["models", "pull", "gemma3-270m"]);
    cortex.ok(&[
        "--model",
        "gemma3-270m",
        "run",
        "tools.jsonl",
        "--ignore-line-models",
        "-o",
        "gemma.jsonl",
    ]);
    check_calls(&cortex, &input, "gemma.jsonl");
}

/// Every line answered, a valid `ChatCompletion`; each forced call one
/// call of the right function with arguments its schema accepts.
fn check_calls(cortex: &Cortex, input: &Path, output: &str) {
    let out_path = cortex.dir().join(output);
    let outputs = read_jsonl(&out_path);
    assert_eq!(outputs.len(), 15, "{outputs:?}");
    let report = python_check("validate_openai.py", &[input, &out_path]);
    assert!(report.contains("15 /v1/chat/completions"), "{report}");

    let parameters: Vec<(String, Value)> = tools()
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["function"]["name"].as_str().unwrap().to_owned(),
                t["function"]["parameters"].clone(),
            )
        })
        .collect();
    for output in &outputs {
        let id = output["custom_id"].as_str().unwrap();
        let choice = &output["response"]["body"]["choices"][0];
        if !(id.starts_with("required") || id.starts_with("named") || id.starts_with("serial")) {
            assert!(
                choice["message"]["content"].is_string()
                    || choice["message"]["tool_calls"].is_array(),
                "{choice}"
            );
            continue;
        }
        // Several calls may run into the token limit: the last one is then
        // cut short, a call with its arguments as far as they went (as
        // OpenAI gives it); the others are whole.
        let finish = choice["finish_reason"].as_str().unwrap();
        let single = id.starts_with("serial") || id.starts_with("named");
        assert!(
            finish == "tool_calls" || (!single && finish == "length"),
            "{output}, {id}: {choice}"
        );
        assert!(choice["message"]["content"].is_null(), "{id}: {choice}");
        let calls = choice["message"]["tool_calls"].as_array().unwrap();
        let expected = if single { 1..=1 } else { 1..=4 };
        assert!(expected.contains(&calls.len()), "{output}, {id}: {choice}");
        for (k, call) in calls.iter().enumerate() {
            let function = &call["function"];
            let name = function["name"].as_str().unwrap();
            if id.starts_with("named") {
                assert_eq!(name, "get_time", "{id}");
            }
            assert!(call["id"].as_str().unwrap().starts_with("call_"));
            let schema = &parameters.iter().find(|(n, _)| n == name).unwrap().1;
            let text = function["arguments"].as_str().unwrap();
            if finish == "length" && k + 1 == calls.len() {
                assert!(text.is_empty() || text.starts_with('{'), "{id}: {choice}");
                continue;
            }
            let arguments: Value = serde_json::from_str(text).unwrap();
            let validator = jsonschema::validator_for(schema).unwrap();
            assert!(
                validator.is_valid(&arguments),
                "{id}: {arguments} does not match {schema}"
            );
        }
    }
}

/// The interpreter of the clients' environment (`scripts/clients-env.sh`,
/// which `scripts/test.sh` runs): `None`, after saying so, when there is
/// none and none is required.
#[test]
fn tools_work_in_the_clients_people_use_with_the_default_model() {
    let Some(python) = clients_python() else {
        return;
    };
    let _turn = turn();
    let cortex = Cortex::new();
    let key = "tools-key-0123";
    let server = Server::start(&cortex, &["--api-key", key, "--parallel", "4"]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/tool_clients.py");
    let output = Command::new(python)
        .arg(&script)
        .args([&server.url(), key, "smollm2-135m"])
        .output()
        .expect("run the clients");
    let printed = String::from_utf8_lossy(&output.stdout);
    println!("{printed}");
    assert!(
        output.status.success() && printed.contains("ALL CHECKS PASSED"),
        "{printed}{}",
        String::from_utf8_lossy(&output.stderr)
    );
}
