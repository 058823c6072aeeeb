//! Many models behind one `cortex serve` with the real models (SmolLM2 and
//! Gemma 3 270M) and the official clients (`tests/python/serve_models.py`):
//! Ollama's model management, models loaded on demand within a memory
//! budget that holds one at a time, keep_alive, and one batch per model
//! drained by a `cortex worker` started without a model.

use cortex_queue::JobState;
use cortex_tests::{Cortex, Server, output_texts, python_check};

const QUESTION: &str = "Name a colour.";
const SYSTEM: &str = "You answer in one word.";

#[test]
fn one_server_serves_and_manages_many_models() {
    let mut cortex = Cortex::new();
    let root = cortex.private_models();
    let gguf = cortex.dir().join("smol.gguf");
    std::fs::copy(
        root.join("blobs")
            .join(format!("sha256-{}", cortex_models::DEFAULT_MODEL.sha256)),
        &gguf,
    )
    .unwrap();
    // Gemma 3 270M has no chat template: a registered TEMPLATE gives it one.
    cortex.write(
        "Gemma.Modelfile",
        "FROM gemma3-270m\nTEMPLATE \"\"\"{% for message in messages %}{{ message.role }}: {{ message.content }}\n{% endfor %}assistant:\"\"\"\nPARAMETER temperature 0\n",
    );
    cortex.ok(&["models", "add", "gemma-chat", "Gemma.Modelfile"]);
    cortex.write(
        "Mine.Modelfile",
        &format!(
            "FROM ./smol.gguf\nSYSTEM {SYSTEM}\nPARAMETER temperature 0\nPARAMETER num_predict 8\n"
        ),
    );
    cortex.ok(&["models", "add", "mine", "Mine.Modelfile"]);
    let generate = |model: &str, extra: &[&str]| -> String {
        let mut args = vec!["--model", model, "generate", "--chat", QUESTION];
        args.extend_from_slice(extra);
        cortex.ok(&args).trim().to_owned()
    };
    let references = serde_json::json!({
        "default": generate("default", &["--max-tokens", "8", "--temperature", "0"]),
        "gemma": generate("gemma-chat", &["--max-tokens", "8"]),
        // Its own name chats with the template its registry entry names.
        "gemma-own": generate("gemma3-270m", &["--max-tokens", "8", "--temperature", "0"]),
        "mine": generate("mine", &[]),
    });
    assert_ne!(references["default"], references["gemma"]);
    assert_ne!(references["gemma"], references["gemma-own"]);

    // A budget that holds either model, not both; the server works no batches.
    let server = Server::start(
        &cortex,
        &[
            "--parallel",
            "4",
            "--model-memory-mib",
            "300",
            "--batch-parallel",
            "0",
        ],
    );
    let settings = cortex.write(
        "settings.json",
        &serde_json::json!({
            "url": server.url(),
            "gguf": gguf,
            "system": SYSTEM,
            "question": QUESTION,
            "default": "smollm2-135m:latest",
            "references": references,
        })
        .to_string(),
    );
    let printed = python_check("serve_models.py", &[&settings]);
    println!("{printed}");
    drop(server);

    // The two batches, drained by one worker that has no model of its own.
    let worker = cortex.run(&["worker"]);
    let stderr = String::from_utf8_lossy(&worker.stderr);
    assert!(worker.status.success(), "{stderr}");
    assert!(stderr.contains("worker done: 9 completed"), "{stderr}");
    // Jobs 2 and 3 name the same weights: one engine, each job's template.
    for (job, expected) in [
        (1, &references["default"]),
        (2, &references["gemma"]),
        (3, &references["gemma-own"]),
    ] {
        assert_eq!(cortex.job(job).state, JobState::Completed, "job {job}");
        for text in output_texts(&cortex, &job.to_string()) {
            assert_eq!(text.trim(), expected.as_str().unwrap(), "job {job}");
        }
    }
    assert_eq!(cortex.job(2).model, "gemma-chat:latest");
    assert_eq!(cortex.job(3).model, "gemma3-270m:latest");
}
