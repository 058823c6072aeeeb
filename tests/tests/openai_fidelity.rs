//! An OpenAI batch file of every kind of line people's pipelines make, run
//! through the `cortex` binary on the real model: each line either produces
//! an output that the official `openai` package's types accept, or is
//! refused at submit with its line number and why.

use cortex_tests::{Cortex, python_check, read_jsonl, response_body};
use serde_json::{Value, json};

fn chat(custom_id: &str, extra: &Value) -> Value {
    let mut body = json!({
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": "Name a fruit."}],
        "max_tokens": 12,
        "temperature": 0,
    });
    for (key, value) in extra.as_object().unwrap() {
        body[key] = value.clone();
    }
    json!({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body})
}

#[test]
fn every_kind_of_batch_line_gives_a_valid_output_or_a_clear_error() {
    let cortex = Cortex::new();
    let lines = vec![
        chat(
            "json-object",
            &json!({"messages": [{"role": "user", "content": "Give the colour red as JSON with keys name and hex."}],
                                   "max_tokens": 60, "response_format": {"type": "json_object"}}),
        ),
        chat(
            "json-schema",
            &json!({"max_tokens": 60, "response_format": {"type": "json_schema", "json_schema": {
            "name": "fruit", "strict": true, "schema": {"type": "object", "properties": {
                "fruit": {"type": "string", "maxLength": 20}, "colour": {"enum": ["red", "green", "yellow"]}},
                "required": ["fruit", "colour"], "additionalProperties": false}}}}),
        ),
        chat("logprobs", &json!({"logprobs": true, "top_logprobs": 3})),
        chat(
            "harmless",
            &json!({"user": "u-42", "stream": false, "store": true, "metadata": {"run": "7"},
                                "service_tier": "auto", "parallel_tool_calls": false, "tool_choice": "none"}),
        ),
        chat(
            "parts",
            &json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "Name a "}, {"type": "text", "text": "fruit."}]}],
                             "max_tokens": null, "max_completion_tokens": 12}),
        ),
        chat(
            "tools",
            &json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}),
        ),
        json!({"custom_id": "completion", "method": "POST", "url": "/v1/completions",
               "body": {"model": "x", "prompt": "Once upon a time", "max_tokens": 8, "logprobs": 2, "temperature": 0}}),
        json!({"custom_id": "responses", "method": "POST", "url": "/v1/responses",
               "body": {"model": "x", "instructions": "Answer in one word.", "input": "Name a fruit.", "max_output_tokens": 8,
                        "include": ["message.output_text.logprobs"], "top_logprobs": 2}}),
        json!({"custom_id": "responses-schema", "method": "POST", "url": "/v1/responses",
               "body": {"input": [{"role": "user", "content": [{"type": "input_text", "text": "Is water wet? Answer as JSON."}]}],
                        "max_output_tokens": 40, "temperature": 0,
                        "text": {"format": {"type": "json_schema", "name": "a", "strict": true, "schema": {
                            "type": "object", "properties": {"answer": {"type": "boolean"}}, "required": ["answer"], "additionalProperties": false}}}}}),
        json!({"custom_id": "embeddings", "method": "POST", "url": "/v1/embeddings",
               "body": {"model": "x", "input": "hello"}}),
        chat(
            "functions",
            &json!({"functions": [{"name": "f", "parameters": {}}]}),
        ),
    ];
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    let input = cortex.write("in.jsonl", &text);
    // All or nothing first: the refused lines are named with their numbers.
    // Written for OpenAI's models: run on cortex's, as the flag says.
    cortex.refused(
        &["submit", "in.jsonl", "--ignore-line-models"],
        &[
            "1 of 11 lines are invalid",
            "line 11 (custom_id \"functions\"): body: functions = ",
            "is an OpenAI field cortex does not support: it is the deprecated form of tools and tool_choice; give those",
        ],
    );
    cortex.ok(&[
        "submit",
        "in.jsonl",
        "--skip-invalid",
        "--ignore-line-models",
    ]);
    cortex.ok(&["worker"]);
    cortex.ok(&["results", "1", "-o", "out.jsonl", "--errors", "err.jsonl"]);
    let out_path = cortex.dir().join("out.jsonl");
    let outputs = read_jsonl(&out_path);
    assert_eq!(outputs.len(), 10);
    let errors = read_jsonl(&cortex.dir().join("err.jsonl"));
    let refused: Vec<(&str, u64)> = errors
        .iter()
        .map(|e| {
            (
                e["custom_id"].as_str().unwrap(),
                e["error"]["line"].as_u64().unwrap(),
            )
        })
        .collect();
    // The deprecated `functions` was refused at submit; the tools line ran
    // (the default model's template takes no tools: cortex's generic format).
    assert_eq!(refused, [("functions", 11)]);

    let report = python_check("validate_openai.py", &[&input, &out_path]);
    assert!(
        report.contains(
            "6 /v1/chat/completions, 1 /v1/completions, 1 /v1/embeddings, 2 /v1/responses"
        ),
        "{report}"
    );
    let body = |id: &str| response_body(&outputs, id);
    let schema = body("json-schema");
    let fruit: Value =
        serde_json::from_str(schema["choices"][0]["message"]["content"].as_str().unwrap()).unwrap();
    assert!(
        ["red", "green", "yellow"].contains(&fruit["colour"].as_str().unwrap()),
        "{fruit}"
    );
    let answer = body("responses-schema");
    let answer: Value =
        serde_json::from_str(answer["output"][0]["content"][0]["text"].as_str().unwrap()).unwrap();
    assert!(answer["answer"].is_boolean(), "{answer}");
    let top = &body("logprobs")["choices"][0]["logprobs"]["content"][0]["top_logprobs"];
    assert_eq!(top.as_array().unwrap().len(), 3);
    let top = &body("responses")["output"][0]["content"][0]["logprobs"][0]["top_logprobs"];
    assert_eq!(top.as_array().unwrap().len(), 2);
}

#[test]
fn a_model_without_a_chat_template_takes_chats_with_one_chosen_by_name_or_file() {
    let cortex = Cortex::new();
    // Gemma 3 270M (base) ships no chat template in its GGUF; its registry
    // entry names its family's, so pulled by name it chats out of the box.
    let pulled = cortex.ok(&["models", "pull", "gemma3-270m"]);
    let chats: String = (0..2)
        .map(|i| {
            format!(
                "{}\n",
                json!({"custom_id": format!("c{i}"), "messages": [{"role": "user", "content": "Name a fruit."}],
                       "max_tokens": 6, "temperature": 0})
            )
        })
        .collect();
    cortex.write("chat.jsonl", &chats);
    cortex.ok(&["--model", "gemma3-270m", "submit", "chat.jsonl"]);
    cortex.ok(&["--model", "gemma3-270m", "worker"]);
    assert_eq!(cortex.job(1).counts.completed, 2);

    // Named by its file, it has none: chat lines are refused at submit,
    // each with its line number and what to do, and nothing is stored.
    let file = pulled.trim().lines().last().unwrap().to_owned();
    let gemma = ["--model", file.as_str()];
    let refused = cortex.run(&[&gemma[..], &["submit", "chat.jsonl"]].concat());
    assert_eq!(refused.status.code(), Some(3));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("line 1 (custom_id \"c0\"): a chat (messages), but the model")
            && stderr.contains("has no chat template of its own: choose one with --chat-template"),
        "{stderr}"
    );
    assert!(
        cortex.run(&["status", "2"]).status.code() == Some(4),
        "nothing was stored"
    );

    // By name (rendered by llama.cpp), and from a Jinja file (rendered by
    // minijinja): both render what the registry's entry renders.
    cortex.ok(&[
        &gemma[..],
        &[
            "--chat-template",
            "gemma",
            "submit",
            "chat.jsonl",
            "--force",
        ],
    ]
    .concat());
    cortex.ok(&[&gemma[..], &["--chat-template", "gemma", "worker"]].concat());
    assert_eq!(cortex.job(2).counts.completed, 2);
    let template = cortex.write(
        "gemma.jinja",
        // Jinja, as transformers renders it: the template's own trailing
        // newline is dropped, so the last one is written as an expression.
        "{% for m in messages %}<start_of_turn>{{ m.role }}\n{{ m.content }}<end_of_turn>\n{% endfor %}{{ '<start_of_turn>model\\n' }}",
    );
    let by_file = ["--chat-template", template.to_str().unwrap()];
    cortex.ok(&[
        &gemma[..],
        &by_file[..],
        &["submit", "chat.jsonl", "--force"],
    ]
    .concat());
    cortex.ok(&[&gemma[..], &by_file[..], &["worker"]].concat());
    assert_eq!(cortex.job(3).counts.completed, 2);
    // The same template renders the same prompt: the same greedy outputs.
    let texts = |job: &str| {
        cortex.ok(&["results", job, "-o", &format!("{job}.jsonl")]);
        read_jsonl(&cortex.dir().join(format!("{job}.jsonl")))
            .iter()
            .map(|l| l["response"]["body"]["choices"][0]["message"]["content"].clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(texts("1"), texts("2"));
    assert_eq!(texts("2"), texts("3"));

    // A name llama.cpp does not know is refused before anything runs.
    let refused = cortex.run(&[
        "--model",
        "default",
        "--chat-template",
        "no-such-template",
        "worker",
    ]);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr)
            .contains("is neither a file nor a template llama.cpp knows (")
    );
}
