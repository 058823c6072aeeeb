//! `cortex run --trace FILE` on the real model: one JSON line per engine
//! step whose figures add up to the job's own (every generated token is in
//! some step, prompt tokens computed never exceed the prompts', shared
//! prefixes are computed once, attention spans at least what it reads),
//! and a summary of where the time went.

use cortex_tests::{Cortex, assert_greedy_agrees, greedy_completions, read_jsonl};
use serde_json::json;

#[test]
fn a_trace_accounts_for_every_token_of_the_job() {
    let cortex = Cortex::new();
    let prefix = "Background for the archivist: ".to_owned()
        + &"the river, the lantern, the orchard and the harbor. ".repeat(20);
    let lines: String = (0..12)
        .map(|i| {
            format!(
                "{}\n",
                json!({"custom_id": format!("t{i}"), "prompt": format!("{prefix}Question {i}: why?"),
                    "max_tokens": 6, "temperature": 0, "ignore_eos": true})
            )
        })
        .collect();
    cortex.write("job.jsonl", &lines);
    let output = cortex.run(&[
        "run",
        "job.jsonl",
        "-o",
        "out.jsonl",
        "--trace",
        "trace.jsonl",
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    for text in [
        "trace: ",
        "llama_decode",
        "tokens per step",
        "each distinct prefix once would be",
        "padding",
    ] {
        assert!(stderr.contains(text), "{text:?} missing from:\n{stderr}");
    }

    let results = read_jsonl(&cortex.dir().join("out.jsonl"));
    let usage = |key: &str| -> u64 {
        results
            .iter()
            .map(|r| r["response"]["body"]["usage"][key].as_u64().unwrap())
            .sum()
    };
    let steps = read_jsonl(&cortex.dir().join("trace.jsonl"));
    let total = |key: &str| -> u64 { steps.iter().map(|s| s[key].as_u64().unwrap()).sum() };
    assert!(!steps.is_empty());
    for (i, step) in steps.iter().enumerate() {
        assert_eq!(step["step"], json!(i as u64 + 1), "{step}");
        let seconds = |key: &str| step[key].as_f64().unwrap();
        assert!(
            seconds("decode_seconds") >= 0.0
                && seconds("host_seconds") >= 0.0
                && seconds("kv_rebuild_seconds") >= 0.0
        );
        let (used, attended) = (
            step["kv_cells_used"].as_u64().unwrap(),
            step["kv_cells_attended"].as_u64().unwrap(),
        );
        assert!(used <= attended && attended % 256 == 0, "{step}");
        // Every step with tokens is at least one pass of llama.cpp's; never
        // more passes than streams plus prompt chunks (each chunk past its
        // first token goes in at most one more).
        let passes = step["micro_batches"].as_u64().unwrap();
        let streams = step["streams"].as_u64().unwrap();
        let chunks = step["prefill_chunks"].as_u64().unwrap();
        assert!(passes >= 1 && passes <= streams + chunks, "{step}");
    }
    assert_eq!(total("generated_tokens"), usage("completion_tokens"));
    // The shared prefix is computed once, the rest of each prompt once each.
    let computed = total("prefill_tokens");
    assert!(
        computed < usage("prompt_tokens"),
        "{computed} of {}",
        usage("prompt_tokens")
    );
    let minimum = stderr
        .split("each distinct prefix once would be ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse::<u64>().ok())
        .expect("the minimum in the summary");
    assert!(minimum <= computed, "{minimum} > {computed}");
}

#[test]
fn steady_steps_repeat_one_graph_and_change_no_output() {
    // 24 greedy requests of different lengths on 8 streams: they finish at
    // different steps and the later ones join as slots free. With steady
    // steps, joins wait for every 8th step and every decoding step spans
    // all 8 streams, so llama.cpp runs most micro-batches on the graph of
    // the one before. The texts stay those of plain steps: exactly with
    // cortex's attention (AVX2 or AVX-512), where a row's result does not depend on
    // its batch; with llama.cpp's, whose tiles move the last bits with the
    // batch's layout, equal up to near-ties.
    let cortex = Cortex::new();
    write_greedy_job(
        &cortex,
        (0..24).map(|i| {
            (
                format!("s{i}"),
                format!("List {i} colours of a kite:"),
                6 + (i * 5) % 17,
            )
        }),
        &json!({"logprobs": 5}),
    );
    let run = |name: &str, steady: &str| {
        let (_, steps) = run_traced(
            &cortex,
            name,
            &["--parallel", "8", "--steady-steps", steady],
        );
        let total = |key: &str| -> u64 { steps.iter().map(|s| s[key].as_u64().unwrap()).sum() };
        let spanning_all = steps
            .iter()
            .filter(|s| s["decode_sequences"].as_u64().unwrap() > 0)
            .all(|s| s["streams"] == json!(8));
        let reused = total("graphs_reused") as f64 / total("micro_batches") as f64;
        (reused, spanning_all)
    };
    let (plain_reuse, plain_spans) = run("plain", "0");
    let (steady_reuse, steady_spans) = run("steady", "8");
    assert!(steady_spans && !plain_spans);
    assert!(
        steady_reuse > 0.5 && steady_reuse > plain_reuse,
        "graphs reused: {steady_reuse:.2} steady, {plain_reuse:.2} plain"
    );

    assert_same_greedy_texts(
        &cortex,
        ("plain steps", "plain"),
        ("steady steps", "steady"),
        24,
    );
}

#[test]
fn even_chunks_cut_prompt_steps_and_change_no_output() {
    // 24 greedy requests whose prompts differ in length, 8 streams, 96-token
    // batches, every gap filled: steps take in several prompts of different
    // lengths beside decodes. With even chunks some of those steps cut
    // their chunks to one length (the rest runs later), and the texts stay
    // those of plain steps.
    let cortex = Cortex::new();
    write_greedy_job(
        &cortex,
        (0..24).map(|i| {
            let words = "red green blue ".repeat(1 + i % 7);
            (format!("e{i}"), format!("{words}{i}:"), 4 + (i * 3) % 11)
        }),
        &json!({"logprobs": 5}),
    );
    let run = |name: &str, even: &str| {
        let settings = [
            "--parallel",
            "8",
            "--batch-tokens",
            "96",
            "--gap-fill",
            "1000",
            "--even-chunks",
            even,
        ];
        let (stderr, steps) = run_traced(&cortex, name, &settings);
        let evened: u64 = steps
            .iter()
            .map(|s| s["chunks_evened"].as_u64().unwrap())
            .sum();
        (
            evened,
            stderr.contains("prompt chunks cut to even out their steps"),
        )
    };
    assert_eq!(run("plain", "false"), (0, false));
    assert!(matches!(run("even", "true"), (n, true) if n > 0));

    assert_same_greedy_texts(
        &cortex,
        ("plain steps", "plain"),
        ("even chunks", "even"),
        24,
    );
}

#[test]
fn gap_fillers_beside_a_full_batch_are_decoded_in_it() {
    // Requests of many lengths keep streams finishing beside running ones
    // while new prompts fill each step's token budget: every gap is filled
    // (--gap-fill 1000) on top of a full plan. The binding's batch takes
    // the fillers too, so no step falls back to a decode per stream (which
    // made such steps several times slower), and the texts are the greedy
    // ones.
    let cortex = Cortex::new();
    write_greedy_job(
        &cortex,
        (0..48).map(|i| {
            let prompt = format!("Story {i}: the lantern and the orchard were quiet. Then");
            (format!("g{i}"), prompt, 3 + (i * 7) % 13)
        }),
        &json!({}),
    );
    let settings = [
        "--parallel",
        "16",
        "--batch-tokens",
        "48",
        "--gap-fill",
        "1000",
    ];
    let (stderr, steps) = run_traced(&cortex, "out", &settings);
    assert!(!stderr.contains("stream by stream"), "{stderr}");
    let full_and_filled = steps
        .iter()
        .filter(|s| {
            let planned =
                s["decode_sequences"].as_u64().unwrap() + s["prefill_tokens"].as_u64().unwrap();
            planned >= 40 && s["gap_fillers"].as_u64().unwrap() > 0
        })
        .count();
    assert!(
        full_and_filled > 0,
        "no step filled gaps beside a full batch"
    );
    for step in &steps {
        assert_eq!(step["decode_calls"], json!(1), "{step}");
    }
    let results = read_jsonl(&cortex.dir().join("out.jsonl"));
    assert_eq!(results.len(), 48);
    assert!(results.iter().all(|r| r["response"]["status_code"] == 200));
}

/// The outputs `{a}.jsonl` and `{b}.jsonl` of one greedy job of `items`
/// lines (with logprobs), run two ways, have the same texts: exactly with
/// cortex's attention (AVX2 or AVX-512), where a row's result does not depend on its
/// batch; with llama.cpp's, whose tiles move the last bits with the batch's
/// layout, equal up to near-ties.
fn assert_same_greedy_texts(
    cortex: &Cortex,
    (a_label, a): (&str, &str),
    (b_label, b): (&str, &str),
    items: usize,
) {
    let (a, b) = (
        cortex.dir().join(format!("{a}.jsonl")),
        cortex.dir().join(format!("{b}.jsonl")),
    );
    let devices: serde_json::Value =
        serde_json::from_str(&cortex.ok(&["devices", "--json"])).unwrap();
    if devices["cortex_kernels"].is_string()
        && std::env::var("CORTEX_CPU_KERNELS").as_deref() != Ok("llama")
    {
        assert_eq!(greedy_completions(&b), greedy_completions(&a));
    } else {
        assert_greedy_agrees((a_label, &a), (b_label, &b), 0.5, 0.3);
    }
    assert_eq!(greedy_completions(&a).len(), items);
}

/// `cortex run job.jsonl` with `settings`, writing `{name}.jsonl` and the
/// trace `{name}.trace.jsonl`; fails unless it succeeds. Returns its
/// standard error and the trace's steps. Each run of the same file is a
/// job of its own (`--force`), not the finished one.
fn run_traced(cortex: &Cortex, name: &str, settings: &[&str]) -> (String, Vec<serde_json::Value>) {
    let (output, trace) = (format!("{name}.jsonl"), format!("{name}.trace.jsonl"));
    let mut args = vec![
        "run",
        "job.jsonl",
        "-o",
        &output,
        "--trace",
        &trace,
        "--force",
    ];
    args.extend_from_slice(settings);
    let run = cortex.run(&args);
    let stderr = String::from_utf8_lossy(&run.stderr).into_owned();
    assert!(run.status.success(), "{stderr}");
    (stderr, read_jsonl(&cortex.dir().join(&trace)))
}

/// `job.jsonl`: a greedy request (EOS ignored) for each `(custom_id, prompt,
/// max_tokens)`, with `extra`'s fields besides.
fn write_greedy_job(
    cortex: &Cortex,
    requests: impl Iterator<Item = (String, String, usize)>,
    extra: &serde_json::Value,
) {
    let lines: String = requests
        .map(|(id, prompt, max_tokens)| {
            let mut line = json!({"custom_id": id, "prompt": prompt, "max_tokens": max_tokens,
                "temperature": 0, "ignore_eos": true});
            for (key, value) in extra.as_object().into_iter().flatten() {
                line[key] = value.clone();
            }
            format!("{line}\n")
        })
        .collect();
    cortex.write("job.jsonl", &lines);
}
