//! Admission control and the browser's threats, against the real server:
//! online requests beyond the configured limit (in all, and per API key)
//! get 429 with `Retry-After` and the server serves again once they end;
//! slow clients (headers, idle connections, bodies) are cut off by their
//! timeouts while others are served; a keyless server refuses what a web
//! page could send it (a `text/plain` body, a foreign `Host`, a foreign
//! `Origin`) and answers the pages it allows.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::time::{Duration, Instant};

use cortex_tests::{Cortex, Server, http, raw_http};
use serde_json::{Value, json};

/// A streamed completion left running: the connection stays open, holding
/// its place, until dropped (which cancels it).
fn hold_a_stream(port: u16, key: Option<&str>) -> BufReader<TcpStream> {
    let body = json!({"model": "default", "prompt": "Count to a thousand:", "max_tokens": 2000,
        "ignore_eos": true, "stream": true})
    .to_string();
    let auth = key.map_or(String::new(), |k| format!("Authorization: Bearer {k}\r\n"));
    let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).expect("connect");
    write!(
        stream,
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    assert!(
        line.contains(" 200 "),
        "the held stream was refused: {line}"
    );
    // Up to the first event: the request is in the engine.
    loop {
        line.clear();
        reader.read_line(&mut line).unwrap();
        if line.starts_with("data:") || line.contains("data: ") {
            return reader;
        }
    }
}

fn post_with_key(port: u16, path: &str, key: &str, body: &Value) -> (u16, String) {
    let body = body.to_string();
    raw_http(
        port,
        format!(
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ),
    )
    .expect("an answer")
}

fn short_completion() -> Value {
    json!({"model": "default", "prompt": "Hi", "max_tokens": 2})
}

/// Retries `request` until it is a 200 (the places of dropped requests
/// come back when the engine has cancelled them).
fn served_again(request: impl Fn() -> u16) {
    let started = Instant::now();
    while request() != 200 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "never served again"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn online_requests_beyond_the_limit_get_429_and_retry_after() {
    let cortex = Cortex::new();
    let server = Server::start(&cortex, &["--parallel", "4", "--max-online-requests", "2"]);
    let held = [
        hold_a_stream(server.port, None),
        hold_a_stream(server.port, None),
    ];

    let body = short_completion().to_string();
    let (status, text) = raw_http(
        server.port,
        format!(
            "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ),
    )
    .expect("an answer");
    assert_eq!(status, 429, "{text}");
    assert!(
        text.to_ascii_lowercase().contains("retry-after: 1"),
        "{text}"
    );
    let answer: Value = serde_json::from_str(text.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert_eq!(answer["error"]["code"], "rate_limit_exceeded", "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_online_requests"),
        "{answer}"
    );
    // Ollama's routes count too, and answer in Ollama's shape.
    let ollama = json!({"model": "default", "prompt": "Hi", "stream": false});
    let (status, text) = http(server.port, "POST", "/api/generate", &ollama.to_string()).unwrap();
    assert_eq!(status, 429, "{text}");
    assert!(serde_json::from_str::<Value>(&text).unwrap()["error"].is_string());
    // What is not generation is not limited.
    assert_eq!(http(server.port, "GET", "/v1/models", "").unwrap().0, 200);

    drop(held);
    served_again(|| {
        http(server.port, "POST", "/v1/completions", &body).map_or(0, |(status, _)| status)
    });
}

#[test]
fn one_key_cannot_take_every_place() {
    let cortex = Cortex::new();
    let server = Server::start(
        &cortex,
        &[
            "--parallel",
            "4",
            "--api-key",
            "alpha",
            "--api-key",
            "beta",
            "--max-online-requests-per-key",
            "1",
        ],
    );
    let held = hold_a_stream(server.port, Some("alpha"));
    let (status, text) =
        post_with_key(server.port, "/v1/completions", "alpha", &short_completion());
    assert_eq!(status, 429, "{text}");
    assert!(text.contains("max_online_requests_per_key"), "{text}");
    let (status, text) = post_with_key(server.port, "/v1/completions", "beta", &short_completion());
    assert_eq!(status, 200, "{text}");
    drop(held);
    served_again(|| post_with_key(server.port, "/v1/completions", "alpha", &short_completion()).0);
}

/// Whether the server closed `stream` within `within` (reads nothing more,
/// or an answer and then nothing).
fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    stream.set_read_timeout(Some(within)).unwrap();
    let mut rest = Vec::new();
    stream.read_to_end(&mut rest).is_ok()
}

#[test]
fn slow_clients_are_cut_off_while_others_are_served() {
    let cortex = Cortex::new();
    let server = Server::start(
        &cortex,
        &[
            "--parallel",
            "2",
            "--header-timeout-seconds",
            "2",
            "--body-timeout-seconds",
            "2",
        ],
    );
    let connect = || TcpStream::connect((Ipv4Addr::LOCALHOST, server.port)).expect("connect");

    // Headers a line at a time, never finished.
    let mut slowloris = connect();
    let started = Instant::now();
    slowloris
        .write_all(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .unwrap();
    let mut cut_off = false;
    for i in 0..40 {
        assert_eq!(http(server.port, "GET", "/v1/models", "").unwrap().0, 200);
        if write!(slowloris, "X-Slow-{i}: a\r\n").is_err() {
            cut_off = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    assert!(
        cut_off || closed_within(&mut slowloris, Duration::from_secs(5)),
        "a client sending headers for {:?} was not cut off",
        started.elapsed()
    );
    assert!(started.elapsed() < Duration::from_secs(9));

    // A connection that never sends anything.
    let mut idle = connect();
    assert!(closed_within(&mut idle, Duration::from_secs(6)));

    // A body that stops halfway: refused with a 4xx naming the timeout.
    let mut stalled = connect();
    write!(
        stalled,
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"model\": "
    )
    .unwrap();
    stalled
        .set_read_timeout(Some(Duration::from_secs(8)))
        .unwrap();
    let mut answer = String::new();
    let _ = stalled.read_to_string(&mut answer);
    let status: u16 = answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no answer to a stalled body: {answer:?}"));
    assert!((400..500).contains(&status), "{answer}");
    assert!(answer.contains("body_timeout"), "{answer}");

    let ok = json!({"model": "default", "prompt": "Hi", "max_tokens": 2}).to_string();
    assert_eq!(
        http(server.port, "POST", "/v1/completions", &ok).unwrap().0,
        200
    );
}

#[test]
fn a_keyless_server_refuses_what_a_web_page_could_send() {
    let cortex = Cortex::new();
    let server = Server::start(
        &cortex,
        &[
            "--parallel",
            "2",
            "--allowed-origins",
            "https://app.example",
        ],
    );
    let port = server.port;
    let body = short_completion().to_string();
    let request = |headers: &str| {
        raw_http(
            port,
            format!(
                "POST /v1/completions HTTP/1.1\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            ),
        )
        .expect("an answer")
    };
    let error_of = |text: &str| -> String {
        let answer: Value = serde_json::from_str(text.split("\r\n\r\n").nth(1).unwrap())
            .unwrap_or_else(|e| panic!("{e}: {text}"));
        answer["error"]["message"].as_str().unwrap().to_owned()
    };

    // A JSON body is JSON whatever it is labelled with when no page sent it
    // (`curl -d` says form, as in Ollama's docs; LiteLLM's Ollama providers
    // say nothing) or an allowed page did.
    for headers in [
        "Host: 127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded\r\n",
        "Host: 127.0.0.1\r\nContent-Type: text/plain\r\n",
        "Host: 127.0.0.1\r\n",
        "Host: 127.0.0.1\r\nOrigin: http://127.0.0.1:8080\r\n",
        "Host: 127.0.0.1\r\nOrigin: https://app.example\r\nContent-Type: text/plain\r\n",
    ] {
        let (status, text) = request(headers);
        assert_eq!(status, 200, "{headers}: {text}");
    }
    // What a foreign page's form posts without a preflight: refused by its origin.
    let (status, text) =
        request("Host: 127.0.0.1\r\nOrigin: https://evil.example\r\nContent-Type: text/plain\r\n");
    assert_eq!(status, 403, "{text}");

    // DNS rebinding: a page at attacker.example resolved to 127.0.0.1.
    let (status, text) =
        request("Host: attacker.example:8080\r\nContent-Type: application/json\r\n");
    assert_eq!(status, 403, "{text}");
    assert!(error_of(&text).contains("attacker.example"), "{text}");
    let (status, text) = raw_http(
        port,
        "GET /api/tags HTTP/1.1\r\nHost: attacker.example\r\nConnection: close\r\n\r\n",
    )
    .unwrap();
    assert_eq!(status, 403, "{text}");
    assert!(text.contains("\"error\":\""), "Ollama's shape: {text}");

    // A foreign page, and a page the server allows.
    let (status, text) = request(
        "Host: 127.0.0.1\r\nOrigin: https://evil.example\r\nContent-Type: application/json\r\n",
    );
    assert_eq!(status, 403, "{text}");
    assert!(error_of(&text).contains("--allowed-origins"), "{text}");
    let (status, text) = request(
        "Host: 127.0.0.1\r\nOrigin: https://app.example\r\nContent-Type: application/json\r\n",
    );
    assert_eq!(status, 200, "{text}");
    assert!(
        text.to_ascii_lowercase()
            .contains("access-control-allow-origin: https://app.example"),
        "{text}"
    );
    let (status, text) = raw_http(
        port,
        "OPTIONS /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: https://app.example\r\nAccess-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: content-type\r\nConnection: close\r\n\r\n",
    )
    .unwrap();
    assert_eq!(status, 204, "{text}");
    // A page served from this machine's loopback (a local app) may call it.
    let (status, text) = request(
        "Host: localhost\r\nOrigin: http://localhost:3000\r\nContent-Type: application/json; charset=utf-8\r\n",
    );
    assert_eq!(status, 200, "{text}");
    assert_eq!(http(port, "GET", "/health", "").unwrap().0, 200);
}
