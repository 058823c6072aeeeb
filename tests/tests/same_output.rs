//! Same input, same output: a line's result (text, tokens, finish reason,
//! log probabilities) depends only on the line, the model, the settings
//! that change outputs and its seed; not on the lines beside it, how many
//! run at once, prefix sharing, the order of the file, the thread count,
//! the worker, a kill and resume, or whether it came through the server.
//! Each run below is a fresh installation, so nothing is reused between
//! them; every line must be byte-identical, ids and times aside.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use cortex_tests::{Cortex, Server, http, read_jsonl};
use serde_json::{Value, json};

static TURN: Mutex<()> = Mutex::new(());

fn turn() -> std::sync::MutexGuard<'static, ()> {
    TURN.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

const SYSTEM: &str = "You are a careful assistant for a logistics company. You answer questions about \
shipments, warehouses and delivery schedules, in short paragraphs.";

/// 64 lines: greedy chats sharing a system prompt and greedy completions,
/// with log probabilities; sampled chats without a seed and with one.
fn lines() -> Vec<Value> {
    let words = [
        "river", "lantern", "orchard", "harbor", "meadow", "comet", "violin", "glacier",
    ];
    (0..64)
        .map(|i| {
            let topic = format!("{} {}", words[i % 8], words[(i * 3 + 1) % 8]);
            match i {
                0..24 => json!({
                    "custom_id": format!("chat-{i}"),
                    "messages": [{"role": "system", "content": SYSTEM},
                                 {"role": "user", "content": format!("Question {i}: where is the {topic}?")}],
                    "max_tokens": 12, "temperature": 0, "logprobs": true, "top_logprobs": 2,
                }),
                24..40 => json!({
                    "custom_id": format!("text-{i}"),
                    "prompt": format!("Story {i}: the {topic} was"),
                    "max_tokens": 12, "temperature": 0, "logprobs": 2,
                }),
                40..56 => json!({
                    "custom_id": format!("sampled-{i}"),
                    "messages": [{"role": "user", "content": format!("Write about the {topic}.")}],
                    "max_tokens": 12, "temperature": 0.9, "top_p": 0.95, "logprobs": true,
                }),
                _ => json!({
                    "custom_id": format!("seeded-{i}"),
                    "prompt": format!("A poem about the {topic}:"),
                    "max_tokens": 12, "temperature": 1.1, "seed": i, "logprobs": 1,
                }),
            }
        })
        .collect()
}

fn write_lines(cortex: &Cortex, name: &str, lines: &[Value]) {
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    cortex.write(name, &text);
}

/// What must not change: a response's choices (text, tokens, finish
/// reason, log probabilities) and token counts. (How many prompt tokens
/// came from a cache is how the work was shared, not the output.)
fn output_of(body: &Value) -> Value {
    let usage = &body["usage"];
    json!({
        "choices": body["choices"],
        "tokens": [&usage["prompt_tokens"], &usage["completion_tokens"], &usage["total_tokens"]],
    })
}

/// Each line's output, by custom_id.
fn outputs(path: &std::path::Path) -> BTreeMap<String, Value> {
    read_jsonl(path)
        .into_iter()
        .map(|line| {
            (
                line["custom_id"].as_str().unwrap().to_owned(),
                output_of(&line["response"]["body"]),
            )
        })
        .collect()
}

/// A fresh installation runs `lines` with `args`; its outputs.
fn run(model: &str, lines: &[Value], args: &[&str]) -> BTreeMap<String, Value> {
    let cortex = Cortex::new();
    write_lines(&cortex, "job.jsonl", lines);
    let mut all = vec!["--model", model, "run", "job.jsonl", "-o", "out.jsonl"];
    all.extend_from_slice(args);
    cortex.ok(&all);
    outputs(&cortex.dir().join("out.jsonl"))
}

fn assert_same(what: &str, reference: &BTreeMap<String, Value>, got: &BTreeMap<String, Value>) {
    assert_eq!(reference.len(), got.len(), "{what}: lines");
    let differ: Vec<&String> = reference
        .iter()
        .filter(|(id, expected)| got.get(*id) != Some(*expected))
        .map(|(id, _)| id)
        .collect();
    if let Some(id) = differ.first() {
        panic!(
            "{what}: {} lines differ ({differ:?}); {id}:\n{}\nagainst\n{}",
            differ.len(),
            reference[*id],
            got.get(*id).unwrap_or(&Value::Null)
        );
    }
}

/// A pseudo-random order of `lines`, the same every time.
fn shuffled(lines: &[Value]) -> Vec<Value> {
    let mut out = lines.to_vec();
    let mut state = 0x9E37_79B9_u64;
    for i in (1..out.len()).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.swap(i, (state % (i as u64 + 1)) as usize);
    }
    out
}

#[test]
fn a_lines_output_is_the_same_whatever_runs_beside_it_and_however() {
    let _turn = turn();
    let lines = lines();
    let reference = run("default", &lines, &[]);
    // Sampled lines without a seed really sample (two differ), so that
    // their equality below says something.
    let sampled: Vec<&Value> = (40..56)
        .map(|i| &reference[&format!("sampled-{i}")]["choices"][0]["message"]["content"])
        .collect();
    assert!(sampled.windows(2).any(|w| w[0] != w[1]), "{sampled:?}");
    for (what, args) in [
        ("one at a time", &["--parallel", "1"][..]),
        (
            "seven at a time, no prefix sharing",
            &["--parallel", "7", "--prefix-sharing", "false"][..],
        ),
        ("one thread", &["--threads", "1"][..]),
    ] {
        assert_same(what, &reference, &run("default", &lines, args));
    }
    assert_same(
        "the file shuffled",
        &reference,
        &run("default", &shuffled(&lines), &[]),
    );

    // Two workers, one killed with SIGKILL mid-job, the rest resumed.
    let cortex = Cortex::new();
    write_lines(&cortex, "job.jsonl", &lines);
    cortex.ok(&["submit", "job.jsonl"]);
    let mut first = cortex.spawn(&["worker", "--parallel", "5"]);
    let mut second = cortex.spawn(&["worker", "--parallel", "11"]);
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while cortex.job(1).counts.completed < 8 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    first.kill().unwrap();
    first.wait().unwrap();
    second.wait().unwrap();
    cortex.ok(&["worker"]);
    cortex.ok(&["results", "1", "-o", "out.jsonl"]);
    assert!(
        !cortex.job(1).outputs_may_vary,
        "no worker said outputs vary"
    );
    assert_same(
        "two workers, one killed",
        &reference,
        &outputs(&cortex.dir().join("out.jsonl")),
    );

    // One line alone through the server: the same as inside the 64-line job.
    let serving = Cortex::new();
    let server = Server::start(&serving, &[]);
    for id in ["chat-3", "text-30", "seeded-60"] {
        let line = lines.iter().find(|l| l["custom_id"] == id).unwrap();
        let mut body = line.clone();
        body.as_object_mut().unwrap().remove("custom_id");
        let path = if body.get("messages").is_some() {
            "/v1/chat/completions"
        } else {
            "/v1/completions"
        };
        let (status, text) = http(server.port, "POST", path, &body.to_string()).unwrap();
        assert_eq!(status, 200, "{text}");
        let answer: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(output_of(&answer), reference[id], "{id} served alone");
    }
}

#[test]
fn the_k_quant_kernels_give_a_line_the_same_output_in_any_batch() {
    let _turn = turn();
    let lines: Vec<Value> = lines().into_iter().step_by(4).collect();
    let model = "gemma3-270m";
    Cortex::new().ok(&["models", "pull", model]);
    let reference = run(model, &lines, &[]);
    assert_same(
        "gemma, one at a time",
        &reference,
        &run(model, &lines, &["--parallel", "1"]),
    );
    assert_same(
        "gemma, shuffled, three at a time",
        &reference,
        &run(model, &shuffled(&lines), &["--parallel", "3"]),
    );
}

/// The promise on a CPU with AVX2 only: cortex's AVX2 kernels, chosen here
/// on any CPU that has them, give a line the same output in any batch, for
/// the default model's formats and Gemma's k-quants.
#[test]
fn the_avx2_kernels_give_a_line_the_same_output_in_any_batch() {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let has = |flag: &str| cpuinfo.split_whitespace().any(|word| word == flag);
    if !(cfg!(target_arch = "x86_64") && has("avx2") && has("fma")) {
        return;
    }
    let _turn = turn();
    let avx2 = ["--cpu-kernels", "cortex-avx2"];
    let lines: Vec<Value> = lines().into_iter().step_by(2).collect();
    let reference = run("default", &lines, &avx2);
    assert_same(
        "AVX2, one at a time",
        &reference,
        &run(
            "default",
            &lines,
            &[&avx2[..], &["--parallel", "1"]].concat(),
        ),
    );
    assert_same(
        "AVX2, shuffled, seven at a time, no prefix sharing",
        &reference,
        &run(
            "default",
            &shuffled(&lines),
            &[&avx2[..], &["--parallel", "7", "--prefix-sharing", "false"]].concat(),
        ),
    );
    let model = "gemma3-270m";
    Cortex::new().ok(&["models", "pull", model]);
    let lines: Vec<Value> = lines.into_iter().step_by(2).collect();
    assert_same(
        "AVX2, gemma, one at a time",
        &run(model, &lines, &avx2),
        &run(
            model,
            &shuffled(&lines),
            &[&avx2[..], &["--parallel", "1"]].concat(),
        ),
    );
}
