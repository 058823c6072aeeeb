//! The model registry through the binary, with the real models: names,
//! copies and removal guarded by the jobs that need a model, a damaged
//! registry entry, and one worker without a model draining two models' jobs.

use std::sync::Mutex;

use cortex_queue::JobState;
use cortex_tests::{Cortex, capital_reference, completion_prompts, output_texts};

static TURN: Mutex<()> = Mutex::new(());

fn turn() -> std::sync::MutexGuard<'static, ()> {
    TURN.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn names(cortex: &Cortex) -> Vec<String> {
    let listing: serde_json::Value =
        serde_json::from_str(&cortex.ok(&["models", "list", "--json"])).unwrap();
    listing
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn a_model_a_job_needs_is_kept_and_a_damaged_entry_loses_nothing() {
    let _turn = turn();
    let mut cortex = Cortex::new();
    let root = cortex.private_models();
    let blob = root
        .join("blobs")
        .join(format!("sha256-{}", cortex_models::DEFAULT_MODEL.sha256));
    // A local GGUF under a name (copied in: the registry already holds these bytes).
    let gguf = cortex.dir().join("mine.gguf");
    std::fs::copy(&blob, &gguf).unwrap();
    let added: serde_json::Value = serde_json::from_str(&cortex.ok(&[
        "models",
        "add",
        "mine",
        gguf.to_str().unwrap(),
        "--json",
    ]))
    .unwrap();
    assert_eq!(added["name"], "mine:latest");
    assert_eq!(added["sha256"], cortex_models::DEFAULT_MODEL.sha256);
    assert_eq!(names(&cortex), ["mine:latest"]);
    let info: serde_json::Value =
        serde_json::from_str(&cortex.ok(&["models", "info", "mine", "--json"])).unwrap();
    assert_eq!(info["family"], "llama");
    assert_eq!(info["parameter_size"], "135M");
    assert_eq!(info["quantization"], "Q4_1");
    assert_eq!(info["context_length"], 8192);
    assert_eq!(info["embedding_length"], 576);

    cortex.write("p.jsonl", &completion_prompts(2, "p"));
    cortex.ok(&["--model", "mine", "submit", "p.jsonl"]);
    assert_eq!(cortex.job(1).model, "mine:latest");
    cortex.refused(
        &["models", "rm", "mine"],
        &["mine:latest is needed by job 1 (in_progress): let it finish or cancel it, or remove it with --force"],
    );
    // A second name shares the weights: either name may go, the weights stay.
    cortex.ok(&["models", "cp", "mine", "copy:v1"]);
    cortex.ok(&["models", "rm", "mine"]);
    assert!(blob.exists());
    cortex.refused(&["models", "rm", "copy:v1"], &["needed by job 1"]);
    assert_eq!(
        cortex.refused(&["models", "rm", "gpt-4o"], &[]).trim(),
        "error: no model is called \"gpt-4o\" (installed: copy:v1; fetched on first use: smollm2-135m, gemma3-270m)"
    );

    // A damaged entry is named, the others still listed, and no model file goes.
    cortex.ok(&["models", "pull", "gemma3-270m"]);
    let manifest = root.join("manifests/copy/v1.json");
    std::fs::write(&manifest, "{\"schema\": 1, \"model\": \"sha").unwrap();
    let output = cortex.run(&["models", "list"]);
    assert!(!output.status.success());
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stdout.contains("gemma3-270m:latest"), "{stdout}");
    assert!(
        stderr.contains(&format!(
            "error: {}: damaged registry entry (not a manifest: EOF while parsing a string",
            manifest.display()
        )),
        "{stderr}"
    );
    assert!(stderr.contains("every model file was kept"), "{stderr}");
    cortex.refused(
        &["--model", "copy:v1", "submit", "p.jsonl", "--force"],
        &["damaged registry entry", "fix or delete this file"],
    );
    cortex.ok(&["models", "rm", "gemma3-270m"]);
    assert!(blob.exists(), "the damaged entry may name it, so it stays");
    assert!(
        root.join("blobs")
            .join(format!("sha256-{}", cortex_models::GEMMA3_270M.sha256))
            .exists(),
        "nothing is removed while an entry is damaged"
    );
}

#[test]
fn a_worker_without_a_model_drains_every_models_jobs() {
    let _turn = turn();
    let mut cortex = Cortex::new();
    cortex.private_models();
    cortex.write("smol.jsonl", &completion_prompts(6, "smol"));
    cortex.write("gemma.jsonl", &completion_prompts(6, "gemma"));
    cortex.ok(&["submit", "smol.jsonl"]);
    cortex.ok(&["--model", "gemma3-270m", "submit", "gemma.jsonl"]);
    cortex.ok(&["submit", "gemma.jsonl", "--force"]);
    // Another name for the default model's weights (sorted before it): the
    // worker still names the model the jobs were submitted for.
    cortex.ok(&["models", "cp", "smollm2-135m", "a-copy"]);

    let worker = cortex.run(&["worker"]);
    let stderr = String::from_utf8_lossy(&worker.stderr);
    assert!(worker.status.success(), "{stderr}");
    assert!(stderr.contains("worker done: 18 completed"), "{stderr}");
    // One load per model: the default model's two jobs ran in one turn.
    assert_eq!(
        stderr
            .matches("generating with smollm2-135m:latest")
            .count(),
        1,
        "{stderr}"
    );
    assert_eq!(
        stderr.matches("generating with gemma3-270m:latest").count(),
        1,
        "{stderr}"
    );
    assert!(!stderr.contains("a-copy"), "{stderr}");
    for job in 1..=3 {
        assert_eq!(cortex.job(job).state, JobState::Completed, "job {job}");
    }
    // `list --model` lists that model's jobs only.
    let listed = cortex.ok(&["list", "--model", "gemma3-270m"]);
    assert_eq!(listed.matches("gemma3-270m:latest").count(), 1, "{listed}");
    assert!(!listed.contains("smollm2-135m"), "{listed}");
    let listed = cortex.ok(&["list"]);
    assert_eq!(listed.matches("smollm2-135m:latest").count(), 2, "{listed}");

    let (smol, gemma) = (
        capital_reference(&cortex, "default"),
        capital_reference(&cortex, "gemma3-270m"),
    );
    assert_ne!(smol, gemma);
    for (job, expected) in [("1", &smol), ("2", &gemma), ("3", &smol)] {
        for text in output_texts(&cortex, job) {
            assert_eq!(text.trim(), expected.as_str(), "job {job}");
        }
    }
}

/// A name made from the default model's weights with a template of its
/// own: its jobs render with it on the engine of those weights, whichever
/// name loaded them, unless the worker's `--chat-template` chooses one for
/// every chat.
#[test]
fn each_names_jobs_render_with_its_template_unless_the_worker_chooses_one() {
    let _turn = turn();
    let mut cortex = Cortex::new();
    cortex.private_models();
    cortex.write(
        "Bare.Modelfile",
        "FROM default\nTEMPLATE \"\"\"{% for m in messages %}{{ m.content }}{% endfor %}\"\"\"\n",
    );
    cortex.ok(&["models", "add", "bare", "Bare.Modelfile"]);
    let question = "Name a colour.";
    let chat = serde_json::json!({"messages": [{"role": "user", "content": question}],
                                  "max_tokens": 8, "temperature": 0});
    cortex.write("chat.jsonl", &format!("{chat}\n{chat}\n"));
    let generate = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend([
            "generate",
            "--chat",
            question,
            "--max-tokens",
            "8",
            "--temperature",
            "0",
        ]);
        cortex.ok(&all).trim().to_owned()
    };
    let bare = generate(&["--model", "bare"]);
    let own = generate(&["--model", "default"]);
    let chatml = generate(&["--model", "default", "--chat-template", "chatml"]);
    assert_ne!(bare, own);
    assert_ne!(bare, chatml);

    cortex.ok(&["--model", "bare", "submit", "chat.jsonl"]);
    cortex.ok(&["--model", "default", "submit", "chat.jsonl"]);
    // One engine for both jobs, loaded for the default model's name.
    cortex.ok(&["--model", "default", "worker"]);
    for (job, expected) in [(1, &bare), (2, &own)] {
        for text in output_texts(&cortex, &job.to_string()) {
            assert_eq!(text.trim(), expected, "job {job}");
        }
    }
    cortex.ok(&["--model", "bare", "submit", "chat.jsonl", "--force"]);
    cortex.ok(&["--model", "default", "--chat-template", "chatml", "worker"]);
    for text in output_texts(&cortex, "3") {
        assert_eq!(text.trim(), chatml, "the worker's choice");
    }
}
