//! Evaluation harnesses score models through cortex: lm-evaluation-harness
//! itself (`local-completions`, as its users run it) on a multiple-choice
//! task from local files, through `cortex serve`; and the same echoed
//! completions request as a batch line, which scores the same.

use std::process::Command;

use cortex_tests::{Cortex, Server, clients_python, read_jsonl, response_body};
use serde_json::{Value, json};

#[test]
fn lm_eval_scores_a_multiple_choice_task_and_a_batch_line_echoes_the_same() {
    let Some(python) = clients_python() else {
        return;
    };
    let cortex = Cortex::new();
    let server = Server::start(&cortex, &[]);
    let work = cortex.dir().join("eval");
    std::fs::create_dir_all(&work).unwrap();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("python/lm_eval_task.py");
    let output = Command::new(python)
        .arg(&script)
        .arg(server.url())
        .arg(&work)
        .output()
        .expect("run lm_eval_task.py");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "lm-eval failed:\n{stdout}{stderr}");
    let report: Value = serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}: {stdout}{stderr}"));

    // Every choice was scored: a log probability of a few tokens, below 0.
    let scores = report["loglikelihoods"].as_array().unwrap();
    assert_eq!(scores.len(), 4, "{report}");
    for choices in scores {
        for score in choices.as_array().unwrap() {
            let score = score.as_f64().unwrap();
            assert!(score < 0.0 && score > -60.0, "{report}");
        }
    }
    // The model knows these capitals: a broken scoring would be at chance (1/3).
    let accuracy = report["accuracy"].as_f64().unwrap();
    assert!(accuracy >= 0.75, "accuracy {accuracy}: {report}");

    let refusals = &report["refusals"];
    assert_eq!(refusals["/tokenize"][0], 400, "{refusals}");
    assert!(
        refusals["/tokenize"][1]
            .as_str()
            .unwrap()
            .contains("unknown field \"promt\": did you mean \"prompt\"?"),
        "{refusals}"
    );
    assert_eq!(refusals["/detokenize"][0], 400, "{refusals}");
    assert!(
        refusals["/detokenize"][1]
            .as_str()
            .unwrap()
            .starts_with("tokens[0] = 1000000000 is not a token id of this model"),
        "{refusals}"
    );

    // The echoed request: the prompt is the text, every token of it scored
    // but the first, nothing generated.
    let body = &report["echoed"]["body"];
    let online = &report["echoed"]["answer"];
    let choice = &online["choices"][0];
    assert_eq!(choice["text"], body["prompt"], "{online}");
    assert_eq!(online["usage"]["completion_tokens"], 0, "{online}");
    let logprobs = &choice["logprobs"];
    let tokens: String = logprobs["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(tokens, body["prompt"].as_str().unwrap());
    let online_scores = logprobs["token_logprobs"].as_array().unwrap();
    assert_eq!(
        online_scores.len() as u64,
        online["usage"]["prompt_tokens"].as_u64().unwrap()
    );
    assert_eq!(online_scores[0], Value::Null);
    assert!(
        online_scores[1..]
            .iter()
            .all(|s| s.as_f64().is_some_and(|s| s < 0.0))
    );
    assert_eq!(logprobs["top_logprobs"][1].as_object().unwrap().len(), 2);

    // The same body as a batch line, in a queue of its own.
    let batch = Cortex::new();
    let line =
        json!({"custom_id": "echo", "method": "POST", "url": "/v1/completions", "body": body});
    batch.write("echo.jsonl", &format!("{line}\n"));
    batch.ok(&["run", "echo.jsonl", "-o", "out.jsonl"]);
    let outputs = read_jsonl(&batch.dir().join("out.jsonl"));
    let answer = response_body(&outputs, "echo");
    assert_eq!(answer["choices"][0]["text"], body["prompt"]);
    let batch_scores = answer["choices"][0]["logprobs"]["token_logprobs"]
        .as_array()
        .unwrap();
    assert_eq!(batch_scores.len(), online_scores.len());
    for (a, b) in batch_scores.iter().zip(online_scores).skip(1) {
        let (a, b) = (a.as_f64().unwrap(), b.as_f64().unwrap());
        assert!(
            (a - b).abs() < 1e-3,
            "batch {batch_scores:?}, online {online_scores:?}"
        );
    }
}
