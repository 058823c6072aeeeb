//! Requests that once took `cortex serve` down (a stack overflow in the
//! grammar checker aborted the process, and every client and the batch
//! worker with it), and others that could never mean anything: each is a
//! 4xx in OpenAI's or Ollama's error shape, the server stays up and answers
//! the next request. The same grammars at `cortex submit` and `cortex
//! generate` are refused with their line. Grammars at each limit load in
//! llama.cpp and generate, so the limits are where llama.cpp is safe.

use std::time::Duration;

use cortex_grammar::testing::{doubling, nested_groups, ref_chain, rule_chain};
use cortex_tests::{Cortex, Server, http, raw_http};
use serde_json::{Value, json};

/// POSTs `body` and expects a 4xx whose error message contains `expected`,
/// in OpenAI's shape on `/v1` routes and Ollama's on `/api` routes.
fn refused(server: &Server, path: &str, body: &Value, expected: &str) {
    let (status, text) = http(server.port, "POST", path, &body.to_string())
        .unwrap_or_else(|| panic!("{path}: no answer (the server died?)"));
    assert!((400..500).contains(&status), "{path}: {status} {text}");
    let answer: Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}: {text}"));
    let message = if path.starts_with("/api/") {
        answer["error"].as_str()
    } else {
        assert_eq!(answer["error"]["type"], "invalid_request_error", "{text}");
        answer["error"]["message"].as_str()
    }
    .unwrap_or_else(|| panic!("{path}: no error message: {text}"));
    assert!(
        message.contains(expected),
        "{path}: {message:?} lacks {expected:?}"
    );
}

fn completion(grammar: &str) -> Value {
    json!({"model": "default", "prompt": "Say a.", "max_tokens": 4, "grammar": grammar})
}

fn chat_with_schema(schema: &Value) -> Value {
    json!({"model": "default", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}})
}

#[test]
fn requests_that_once_killed_the_server_are_refused_and_it_stays_up() {
    let cortex = Cortex::new();
    let server = Server::start(&cortex, &["--parallel", "4"]);
    let nest = "groups nest deeper than 64 levels";
    refused(
        &server,
        "/v1/completions",
        &completion(&nested_groups(100_000)),
        nest,
    );
    let chat = json!({"model": "default", "messages": [{"role": "user", "content": "Hi"}],
        "grammar": nested_groups(100_000)});
    refused(&server, "/v1/chat/completions", &chat, nest);
    let responses = json!({"model": "default", "input": "Hi", "grammar": nested_groups(100_000)});
    refused(&server, "/v1/responses", &responses, nest);
    refused(
        &server,
        "/v1/completions",
        &completion(&rule_chain(20_000)),
        "at most 262144 are accepted",
    );
    refused(
        &server,
        "/v1/completions",
        &completion(&rule_chain(5_000)),
        "enters a chain of more than 1024 rules before matching any text",
    );
    refused(
        &server,
        "/v1/completions",
        &completion(&doubling(9)),
        "can go on in more than 256 ways at one point",
    );
    refused(
        &server,
        "/v1/chat/completions",
        &chat_with_schema(&ref_chain(20_000)),
        "the schema nests deeper than 64 levels (counting each $ref followed)",
    );
    let ollama =
        json!({"model": "default", "prompt": "Hi", "stream": false, "format": ref_chain(20_000)});
    refused(
        &server,
        "/api/generate",
        &ollama,
        "the schema nests deeper than 64 levels",
    );
    let ollama = json!({"model": "default", "messages": [{"role": "user", "content": "Hi"}],
        "stream": false, "format": {"type": "object", "properties": {"s": {"type": "string", "maxLength": 100000}}}});
    refused(
        &server,
        "/api/chat",
        &ollama,
        "maxLength = 100000 is more than a grammar can count here",
    );

    // What cannot mean anything.
    let mut bias = completion("root ::= \"a\"");
    bias["logit_bias"] = json!({"99999999": 5});
    refused(
        &server,
        "/v1/completions",
        &bias,
        "invalid logit_bias: token id 99999999 is outside the vocabulary of 49152",
    );
    let stop_ids =
        json!({"model": "default", "prompt": "Hi", "max_tokens": 2, "stop_token_ids": [49152]});
    refused(
        &server,
        "/v1/completions",
        &stop_ids,
        "token id 49152 is outside the vocabulary",
    );
    let options =
        json!({"model": "default", "prompt": "Hi", "stream": false, "options": {"num_ctx": "x"}});
    refused(
        &server,
        "/api/generate",
        &options,
        "options.num_ctx = \"x\": expected an integer",
    );
    let streaming = json!({"model": "default", "prompt": "Hi", "stream": "yes"});
    refused(
        &server,
        "/api/generate",
        &streaming,
        "stream = \"yes\": expected true or false",
    );
    let greedy = json!({"model": "default", "prompt": "Hi", "n": 64, "max_tokens": 100_000});
    refused(
        &server,
        "/v1/completions",
        &greedy,
        "this server allows 131072 per request: lower n or max_tokens",
    );

    // Still alive, and still generating under a grammar.
    let (status, text) = http(server.port, "GET", "/health", "").expect("the server is up");
    assert_eq!(status, 200, "{text}");
    let (status, text) = http(
        server.port,
        "POST",
        "/v1/completions",
        &completion("root ::= \"yes\" | \"no\"").to_string(),
    )
    .expect("an answer");
    assert_eq!(status, 200, "{text}");
    let answer: Value = serde_json::from_str(&text).unwrap();
    let said = answer["choices"][0]["text"].as_str().unwrap();
    assert!(said == "yes" || said == "no", "{text}");
}

/// A chat template a client makes (`/api/create`) that doubles a list
/// until it holds more than the memory once aborted `cortex serve` at
/// `/api/show`, and when a chat loaded the model: now each render stops at
/// its bound, the chats are refused with why, and the server stays up.
#[test]
fn a_clients_template_that_would_eat_the_memory_is_cut_off_and_the_server_stays_up() {
    let mut cortex = Cortex::new();
    // Its names go into a registry of its own, not the shared one.
    cortex.private_models();
    let server = Server::start(&cortex, &["--parallel", "2"]);
    let template = "{% set ns = namespace(l=['x']) %}{% for i in range(10000) %}\
                    {% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l|length }}";
    // Other weights than the default's: the pool runs one engine per
    // weights, and this name is the one that loads them.
    let create =
        json!({"model": "hog", "from": "gemma3-270m", "template": template, "stream": false});
    let (status, text) = http(server.port, "POST", "/api/create", &create.to_string())
        .expect("an answer to /api/create");
    assert_eq!(status, 200, "{text}");
    // A template is text, never a file on the server for it to read.
    let path = cortex.dir().join("secret.txt");
    std::fs::write(&path, "not for clients").unwrap();
    let create = json!({"model": "peek", "from": "gemma3-270m", "template": path, "stream": false});
    let (status, text) = http(server.port, "POST", "/api/create", &create.to_string())
        .expect("an answer to /api/create");
    assert_eq!(status, 400, "{text}");
    assert!(
        text.contains("template:") && text.contains("neither a Jinja template"),
        "{text}"
    );
    let show = json!({"model": "hog"}).to_string();
    let (status, text) = http(server.port, "POST", "/api/show", &show).expect("/api/show answers");
    assert_eq!(status, 200, "{text}");
    let bound = "more work or made more text than a chat needs";
    let messages = json!([{"role": "user", "content": "Hi"}]);
    let chat = json!({"model": "hog", "messages": messages, "max_tokens": 4});
    refused(&server, "/v1/chat/completions", &chat, bound);
    let chat = json!({"model": "hog", "messages": messages, "stream": false});
    refused(&server, "/api/chat", &chat, bound);
    let completion = json!({"model": "default", "prompt": "Say a.", "max_tokens": 2});
    let (status, text) = http(
        server.port,
        "POST",
        "/v1/completions",
        &completion.to_string(),
    )
    .expect("the server is up");
    assert_eq!(status, 200, "{text}");
}

#[test]
fn grammars_at_each_limit_load_in_llama_cpp_and_generate() {
    let cortex = Cortex::new();
    let server = Server::start(&cortex, &["--parallel", "4"]);
    let values: Vec<String> = (0..256).map(|i| format!("\"v{i}\"")).collect();
    for grammar in [
        nested_groups(64),
        rule_chain(1000),
        format!("root ::= {}", values.join(" | ")),
        doubling(8),
        format!("root ::= \"{}\"{{0,100}}", "x".repeat(1000)),
    ] {
        let (status, text) = http(
            server.port,
            "POST",
            "/v1/completions",
            &completion(&grammar).to_string(),
        )
        .expect("an answer");
        assert_eq!(status, 200, "{}: {text}", &grammar[..grammar.len().min(60)]);
    }
    let optional: serde_json::Map<String, Value> = (0..200)
        .map(|i| (format!("p{i}"), json!({"type": "integer"})))
        .collect();
    let labels: Vec<String> = (0..4096).map(|i| format!("label-{i}")).collect();
    for schema in [
        json!({"type": "object", "properties": optional}),
        json!({"enum": labels}),
        json!({"type": "string", "maxLength": 2000}),
    ] {
        let body = chat_with_schema(&schema);
        let (status, text) = http(
            server.port,
            "POST",
            "/v1/chat/completions",
            &body.to_string(),
        )
        .expect("an answer");
        assert_eq!(status, 200, "{text}");
    }
    let (status, _) = http(server.port, "GET", "/health", "").expect("the server is up");
    assert_eq!(status, 200);
}

#[test]
fn submit_and_generate_refuse_the_same_grammars_with_their_line() {
    let cortex = Cortex::new();
    let lines = [
        json!({"prompt": "fine", "max_tokens": 2}),
        json!({"prompt": "deep", "max_tokens": 2, "grammar": nested_groups(100_000)}),
        json!({"custom_id": "c", "method": "POST", "url": "/v1/chat/completions",
            "body": chat_with_schema(&ref_chain(5_000))}),
    ];
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    cortex.write("hostile.jsonl", &text);
    let stderr = cortex.refused(&["submit", "hostile.jsonl"], &[]);
    assert!(
        stderr.contains("line 2") && stderr.contains("groups nest deeper than 64 levels"),
        "{stderr}"
    );
    assert!(
        stderr.contains("line 3") && stderr.contains("the schema nests deeper than 64 levels"),
        "{stderr}"
    );
    let grammar = cortex.write("deep.gbnf", &nested_groups(100_000));
    let started = std::time::Instant::now();
    let output = cortex.run(&["generate", "--grammar", grammar.to_str().unwrap(), "Hi"]);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("groups nest deeper than 64 levels"),
        "{stderr}"
    );
    assert!(started.elapsed() < Duration::from_secs(60));
}

/// A request as a hostile client might send it: `head` is the request line
/// and any headers of its own; the harness adds `Host`, `Content-Type:
/// application/json` (unless the head has one), the length and
/// `Connection: close`.
fn hostile(head: &str, body: &[u8]) -> Vec<u8> {
    let mut request = head.trim_end().replace('\n', "\r\n") + "\r\nHost: 127.0.0.1\r\n";
    if !head.to_ascii_lowercase().contains("content-type") {
        request += "Content-Type: application/json\r\n";
    }
    request += &format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let mut bytes = request.into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

#[test]
fn a_hostile_client_gets_a_4xx_for_every_request_and_the_server_stays_up() {
    let cortex = Cortex::new();
    let server = Server::start(&cortex, &["--parallel", "2"]);
    let chat = "POST /v1/chat/completions HTTP/1.1";
    let completions = "POST /v1/completions HTTP/1.1";
    let generate = "POST /api/generate HTTP/1.1";
    let deep_array = "[".repeat(100_000);
    let deep_object = "{\"a\":".repeat(50_000);
    let many_stops: Vec<String> = (0..100_000).map(|i| format!("s{i}")).collect();
    let many_stops =
        json!({"model": "default", "prompt": "Hi", "max_tokens": 2, "stop": many_stops})
            .to_string();
    let long_model = json!({"model": "m".repeat(1 << 20), "prompt": "Hi"}).to_string();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        // Malformed bodies.
        (chat, b"{".to_vec()),
        (chat, b"not json at all".to_vec()),
        (chat, b"".to_vec()),
        (chat, b"null".to_vec()),
        (chat, b"[]".to_vec()),
        (chat, b"{\"model\": \"default\", \"messages\": [{\"role\": \"user\", \"content\": \"\xff\xfe\"}]}".to_vec()),
        (chat, deep_array.clone().into_bytes()),
        (completions, deep_object.into_bytes()),
        (generate, deep_array.into_bytes()),
        (completions, b"{\"model\": \"default\", \"prompt\": \"Hi\", \"max_tokens\": 1e400}".to_vec()),
        // Wrong types and values out of range.
        (chat, br#"{"model": "default", "messages": "Hi"}"#.to_vec()),
        (chat, br#"{"model": "default", "messages": []}"#.to_vec()),
        (chat, br#"{"model": "default", "messages": [{"role": "wizard", "content": "Hi"}]}"#.to_vec()),
        (chat, br#"{"model": "default", "messages": [{"role": "user", "content": 5}]}"#.to_vec()),
        (completions, br#"{"model": "default", "prompt": "Hi", "max_tokens": -1}"#.to_vec()),
        (completions, br#"{"model": "default", "prompt": "Hi", "temperature": "hot"}"#.to_vec()),
        (completions, br#"{"model": "default", "prompt": "Hi", "temperature": -3}"#.to_vec()),
        (completions, br#"{"model": "default", "prompt": "Hi", "top_p": 5}"#.to_vec()),
        (completions, br#"{"model": "default", "prompt": "Hi", "n": 0}"#.to_vec()),
        (completions, br#"{"model": "default", "prompt": "Hi", "n": 1000000000}"#.to_vec()),
        (completions, br#"{"model": "default", "prompt": [99999999]}"#.to_vec()),
        (completions, br#"{"model": "default", "prompt": [-1, 2]}"#.to_vec()),
        (completions, br#"{"model": "default", "prompt": "Hi", "logprobs": 1000}"#.to_vec()),
        (completions, br#"{"model": "default", "prompt": "Hi", "logit_bias": {"x": 1}}"#.to_vec()),
        (completions, br#"{"model": "default", "prompt": "Hi", "seed": "abc"}"#.to_vec()),
        (completions, br#"{"model": "nonexistent", "prompt": "Hi"}"#.to_vec()),
        (completions, long_model.into_bytes()),
        (completions, many_stops.into_bytes()),
        (completions, br#"{"model": "default", "prompt": "Hi", "grammar": "root ::= ("}"#.to_vec()),
        (chat, br##"{"model": "default", "messages": [{"role": "user", "content": "Hi"}], "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}}}}"##.to_vec()),
        (chat, br#"{"model": "default", "messages": [{"role": "user", "content": "Hi"}], "tools": [{"type": "function", "function": {"name": 5}}]}"#.to_vec()),
        ("POST /v1/embeddings HTTP/1.1", br#"{"model": "default", "input": []}"#.to_vec()),
        ("POST /v1/embeddings HTTP/1.1", br#"{"model": "default", "input": [[[1]]]}"#.to_vec()),
        (generate, br#"{"model": "default", "prompt": "Hi", "options": {"temperature": "x"}}"#.to_vec()),
        (generate, br#"{"model": "default", "prompt": "Hi", "format": 5}"#.to_vec()),
        (generate, br#"{"model": "default", "prompt": 5}"#.to_vec()),
        ("POST /api/chat HTTP/1.1", br#"{"model": "default", "messages": "Hi"}"#.to_vec()),
        ("POST /api/chat HTTP/1.1", br#"{"model": "default", "messages": [{"role": "user", "content": "Hi", "images": ["%%%"]}]}"#.to_vec()),
        ("POST /api/show HTTP/1.1", br#"{"model": 5}"#.to_vec()),
        // Ids that look like paths, and routes and methods that do not exist.
        ("GET /v1/files/..%2F..%2Fetc%2Fpasswd HTTP/1.1", Vec::new()),
        ("GET /v1/files/../../etc/passwd/content HTTP/1.1", Vec::new()),
        ("GET /v1/files/file-%00/content HTTP/1.1", Vec::new()),
        ("DELETE /v1/files/%2e%2e HTTP/1.1", Vec::new()),
        ("GET /v1/batches/batch_..%2F1 HTTP/1.1", Vec::new()),
        ("POST /v1/batches/batch_999999/cancel HTTP/1.1", Vec::new()),
        ("POST /v1/batches HTTP/1.1", br#"{"input_file_id": "file-nope", "endpoint": "/v1/chat/completions", "completion_window": "24h"}"#.to_vec()),
        ("POST /v1/batches HTTP/1.1", br#"{"input_file_id": 5}"#.to_vec()),
        ("GET /v1/batches?limit=-5 HTTP/1.1", Vec::new()),
        ("GET /v1/files?limit=abc HTTP/1.1", Vec::new()),
        ("POST /v1/files HTTP/1.1\nContent-Type: multipart/form-data", b"--x--".to_vec()),
        ("POST /v1/files HTTP/1.1\nContent-Type: multipart/form-data; boundary=x", b"--x\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--x--\r\n".to_vec()),
        ("PUT /v1/chat/completions HTTP/1.1", Vec::new()),
        ("GET /v1/nothing-here HTTP/1.1", Vec::new()),
        ("GET /v1/models/not-this-one HTTP/1.1", Vec::new()),
    ];
    assert!(cases.len() >= 40);
    for (head, body) in &cases {
        let (status, answer) = raw_http(server.port, hostile(head, body))
            .unwrap_or_else(|| panic!("{head}: no answer (the server died?)"));
        assert!((400..500).contains(&status), "{head}: {status}\n{answer}");
        let json: Value = answer
            .split_once("\r\n\r\n")
            .and_then(|(_, body)| serde_json::from_str(body).ok())
            .unwrap_or_else(|| panic!("{head}: not a JSON error:\n{answer}"));
        let message = if head.contains(" /api/") {
            json["error"].as_str()
        } else {
            json["error"]["message"].as_str()
        };
        assert!(
            message.is_some_and(|m| !m.is_empty()),
            "{head}: not the route's error shape: {json}"
        );
    }

    // What hyper refuses before the router: an empty 4xx, the connection closed.
    let huge_header = format!(
        "GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: {}\r\n\r\n",
        "a".repeat(200_000)
    );
    let many_headers = format!(
        "GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n{}\r\n",
        (0..500)
            .map(|i| format!("X-H{i}: v\r\n"))
            .collect::<String>()
    );
    for raw in [
        huge_header,
        many_headers,
        "GARBAGE\r\n\r\n".to_owned(),
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"
            .to_owned(),
    ] {
        if let Some((status, answer)) = raw_http(server.port, &raw) {
            assert!(
                (400..500).contains(&status),
                "{}: {status}\n{answer}",
                &raw[..raw.len().min(60)]
            );
        }
    }

    // A Host that is not text cannot be checked: refused, not let through.
    let (status, answer) = raw_http(
        server.port,
        b"GET /v1/models HTTP/1.1\r\nHost: \xff\xfe\r\nConnection: close\r\n\r\n",
    )
    .expect("an answer");
    assert_eq!(status, 400, "{answer}");
    assert!(answer.contains("Host header is not text"), "{answer}");

    let (status, text) = http(server.port, "GET", "/health", "").expect("the server is up");
    assert_eq!(status, 200, "{text}");
    let ok = json!({"model": "default", "prompt": "Hi", "max_tokens": 2}).to_string();
    assert_eq!(
        http(server.port, "POST", "/v1/completions", &ok).unwrap().0,
        200
    );
}
