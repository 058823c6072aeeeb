//! The real path on real architectures without their weights: tiny
//! random-weight GGUFs of llama, qwen2 and qwen3 with the vocabularies of
//! their real tokenizers and their real chat templates
//! (`tests/python/tiny_model.py`, from llama.cpp's vocab-only GGUFs and
//! templates). A grammar decides what each writes (a thinking block, a call
//! in its family's syntax), so rendering, generation and reading the output
//! run end to end through `cortex run` and, streamed, `cortex serve`.

use std::path::{Path, PathBuf};

use cortex_tests::{
    Cortex, Server, http, llama_cpp_models, python_check, read_jsonl, response_body,
};
use serde_json::{Value, json};

/// A tiny model of `arch` with `vocab`'s tokenizer and `template`.
fn tiny_model(cortex: &Cortex, models: &Path, arch: &str, vocab: &str, template: &str) -> PathBuf {
    let out = cortex.dir().join(format!("tiny-{arch}.gguf"));
    python_check(
        "tiny_model.py",
        &[
            &out,
            Path::new(arch),
            &models.join(format!("ggml-vocab-{vocab}.gguf")),
            &models.join(format!("templates/{template}.jinja")),
        ],
    );
    out
}

fn weather_tool() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
            "required": ["city"], "additionalProperties": false}}}])
}

/// A GBNF grammar that writes exactly `text`.
fn writes(text: &str) -> String {
    format!("root ::= {}", Value::String(text.to_owned()))
}

fn line(custom_id: &str, body: Value) -> String {
    let mut body = body;
    body["messages"] = json!([{"role": "user", "content": "What is the weather in Oslo?"}]);
    format!(
        "{}\n",
        json!({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body})
    )
}

/// The call a chat completion made: (name, arguments).
fn call_of(body: &Value) -> (String, Value) {
    let call = &body["choices"][0]["message"]["tool_calls"][0]["function"];
    (
        call["name"].as_str().unwrap_or_default().to_owned(),
        serde_json::from_str(call["arguments"].as_str().unwrap_or("null")).unwrap_or(Value::Null),
    )
}

#[test]
fn each_family_writes_reads_and_forces_its_own_calls_and_thinking() {
    let Some(models) = llama_cpp_models() else {
        return;
    };
    let cortex = Cortex::new();
    // (arch, vocabulary, template, what a call looks like in its family)
    let families = [
        (
            "qwen3",
            "qwen2",
            "Qwen-Qwen3-0.6B",
            "<think>\nThe user wants the weather.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>",
        ),
        (
            "qwen2",
            "qwen2",
            "Qwen-Qwen2.5-7B-Instruct",
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>",
        ),
        (
            "llama",
            "llama-bpe",
            "meta-llama-Llama-3.1-8B-Instruct",
            "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}",
        ),
    ];
    for (arch, vocab, template, written) in families {
        let model = tiny_model(&cortex, &models, arch, vocab, template);
        let model = model.to_str().unwrap();
        let input = format!("{arch}.jsonl");
        let text = [
            // What a model of the family writes, read back.
            line(
                "written",
                json!({"tools": weather_tool(), "grammar": writes(written), "max_tokens": 100}),
            ),
            // A forced call: held to a valid call by the grammar.
            line(
                "required",
                json!({"tools": weather_tool(), "tool_choice": "required", "max_tokens": 100}),
            ),
            // No tools: the answer as it is.
            line(
                "plain",
                json!({"grammar": writes("It is sunny."), "max_tokens": 20,
                "chat_template_kwargs": {"enable_thinking": false}}),
            ),
        ]
        .concat();
        let input = cortex.write(&input, &text);
        let output = format!("{arch}.out.jsonl");
        cortex.ok(&[
            "--model",
            model,
            "run",
            input.to_str().unwrap(),
            "-o",
            &output,
        ]);
        let outputs = read_jsonl(&cortex.dir().join(&output));
        let report = python_check("validate_openai.py", &[&input, &cortex.dir().join(&output)]);
        assert!(report.contains("3 /v1/chat/completions"), "{report}");

        let body = response_body(&outputs, "written");
        assert_eq!(
            call_of(&body),
            ("get_weather".into(), json!({"city": "Oslo"})),
            "{arch}: {body}"
        );
        assert_eq!(
            body["choices"][0]["finish_reason"], "tool_calls",
            "{arch}: {body}"
        );
        let reasoning = body["choices"][0]["message"]["reasoning_content"].as_str();
        if arch == "qwen3" {
            assert_eq!(reasoning, Some("The user wants the weather."), "{body}");
        } else {
            assert_eq!(reasoning, None, "{arch}: {body}");
        }

        let body = response_body(&outputs, "required");
        let (name, arguments) = call_of(&body);
        assert_eq!(name, "get_weather", "{arch}: {body}");
        assert!(arguments["city"].is_string(), "{arch}: {body}");

        let body = response_body(&outputs, "plain");
        assert_eq!(
            body["choices"][0]["message"]["content"], "It is sunny.",
            "{arch}: {body}"
        );
    }
}

#[test]
fn thinking_and_calls_stream_as_deltas_in_openais_shape() {
    // OpenAI's shape: a call's id and name in its first piece, then its
    // arguments as the model writes them.
    let Some(models) = llama_cpp_models() else {
        return;
    };
    let cortex = Cortex::new();
    let model = tiny_model(&cortex, &models, "qwen3", "qwen2", "Qwen-Qwen3-0.6B");
    let server = Server::start(
        &cortex,
        &["--model", model.to_str().unwrap(), "--parallel", "2"],
    );
    let body = json!({
        "model": "default",
        "messages": [{"role": "user", "content": "What is the weather in Oslo?"}],
        "tools": weather_tool(),
        "grammar": writes("<think>\nLet me look.\n</think>\n\nChecking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>"),
        "max_tokens": 120,
        "stream": true,
    });
    let (status, text) = http(
        server.port,
        "POST",
        "/v1/chat/completions",
        &body.to_string(),
    )
    .expect("an answer");
    assert_eq!(status, 200, "{text}");
    let (mut reasoning, mut content, mut calls, mut finish) =
        (String::new(), String::new(), Vec::new(), Value::Null);
    let mut reasoning_chunks = 0;
    for data in text.lines().filter_map(|l| l.strip_prefix("data: ")) {
        if data == "[DONE]" {
            break;
        }
        let chunk: Value = serde_json::from_str(data).unwrap_or_else(|e| panic!("{e}: {data}"));
        let choice = &chunk["choices"][0];
        if let Some(piece) = choice["delta"]["reasoning_content"].as_str() {
            reasoning += piece;
            reasoning_chunks += 1;
        }
        content += choice["delta"]["content"].as_str().unwrap_or_default();
        if let Some(delta) = choice["delta"]["tool_calls"].as_array() {
            calls.extend(delta.iter().cloned());
        }
        if !choice["finish_reason"].is_null() {
            finish = choice["finish_reason"].clone();
        }
    }
    assert_eq!(reasoning, "Let me look.", "{text}");
    assert!(
        reasoning_chunks >= 2,
        "thinking streams as it comes: {text}"
    );
    assert_eq!(content, "Checking.", "{text}");
    // The call's id and name first, then its arguments piece by piece.
    assert!(calls.len() >= 3, "{text}");
    assert!(calls.iter().all(|piece| piece["index"] == 0), "{text}");
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    assert!(calls[0]["id"].as_str().unwrap().starts_with("call_"));
    assert!(
        calls[1..]
            .iter()
            .all(|piece| piece.get("id").is_none() && piece["function"].get("name").is_none()),
        "{text}"
    );
    let arguments: String = calls
        .iter()
        .map(|piece| piece["function"]["arguments"].as_str().unwrap())
        .collect();
    assert_eq!(arguments, "{\"city\":\"Oslo\"}");
    assert_eq!(finish, "tool_calls");
}
