//! cortex's CPU kernels on the real models, through the binary: they are
//! registered on a CPU that runs them, the default model's Q4_1 and Q8_0
//! weights and Gemma 3's k-quants go to them (and stay with llama.cpp under
//! `--cpu-kernels llama`), and a batched greedy job gives the same answers
//! either way, to float rounding. (That every kernel agrees bit for bit with its scalar
//! reference at every batch size is a unit test of `cortex-llama`.)

use cortex_tests::{Cortex, assert_greedy_agrees, greedy_job};
use serde_json::Value;

/// Whether this CPU has what the kernels need at least (AVX2 and FMA).
fn cpu_runs_the_kernels() -> bool {
    cfg!(target_arch = "x86_64") && cpu_has("avx2") && cpu_has("fma")
}

/// The instruction set cortex's kernels take on this CPU (as `cortex
/// devices` names it), and the instruction a profile's int8 peak counts
/// for it.
fn best_kernels() -> (&'static str, &'static str) {
    if cpu_has("avx512_vnni") && cpu_has("avx512bw") && cpu_has("avx512vl") {
        (
            "AVX-512 VNNI",
            "running vpdpbusd zmm back to back, measured",
        )
    } else if cpu_has("avx_vnni") {
        ("AVX-VNNI", "running vpdpbusd ymm back to back, measured")
    } else {
        ("AVX2", "running vpmaddubsw ymm back to back, measured")
    }
}

/// Whether `/proc/cpuinfo` lists `flag`.
fn cpu_has(flag: &str) -> bool {
    std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .filter(|line| line.starts_with("flags"))
        .any(|line| line.split_whitespace().any(|f| f == flag))
}

#[test]
fn the_kernels_are_registered_where_the_cpu_runs_them() {
    let cortex = Cortex::new();
    let found: Value = serde_json::from_str(&cortex.ok(&["devices", "--json"])).unwrap();
    if !cpu_runs_the_kernels() {
        assert!(found["cortex_kernels"].is_null(), "{found}");
        return;
    }
    let isa = found["cortex_kernels"]
        .as_str()
        .expect("an instruction set");
    assert_eq!(isa, best_kernels().0);
    assert!(
        found["devices"]
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d["name"] == "CortexCPU" && d["kind"] == "accelerator"),
        "{found}"
    );
    let text = cortex.ok(&["devices"]);
    assert!(text.contains(&format!("cortex kernels: {isa}")), "{text}");
}

/// Where llama.cpp placed the model's weights, from its load log (`-vv`).
fn weights_buffers(cortex: &Cortex, kernels: &str) -> String {
    model_weights_buffers(cortex, "default", kernels)
}

/// [`weights_buffers`] of `model`.
fn model_weights_buffers(cortex: &Cortex, model: &str, kernels: &str) -> String {
    let out = cortex.run(&[
        "-vv",
        "--model",
        model,
        "--cpu-kernels",
        kernels,
        "generate",
        "Hi",
        "--max-tokens",
        "1",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter(|l| l.contains("model buffer size"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn the_default_models_weights_go_to_the_kernels_unless_told_otherwise() {
    if !cpu_runs_the_kernels() {
        return;
    }
    let cortex = Cortex::new();
    let with = weights_buffers(&cortex, "cortex");
    assert!(with.contains("CortexCPU model buffer"), "{with}");
    let without = weights_buffers(&cortex, "llama");
    assert!(!without.contains("CortexCPU"), "{without}");
    assert!(without.contains("CPU_Mapped model buffer"), "{without}");
}

#[test]
fn a_batched_greedy_job_answers_alike_with_either_kernels() {
    greedy_answers_agree("default", &["cortex"], 0.3);
}

#[test]
fn the_avx2_and_avx_vnni_kernels_run_on_any_cpu_that_has_them() {
    // What an AVX2-only machine, and one with AVX-VNNI but no AVX-512, run,
    // measurable on an AVX-512 one: the kernels registered with that
    // instruction set at most, and a job answering as the best ones do.
    if !cpu_runs_the_kernels() {
        return;
    }
    let cortex = Cortex::new();
    let vnni = if cpu_has("avx_vnni") {
        "AVX-VNNI"
    } else {
        "AVX2"
    };
    for (kernels, expected) in [("cortex-avx2", "AVX2"), ("cortex-avx-vnni", vnni)] {
        let found: Value =
            serde_json::from_str(&cortex.ok(&["--cpu-kernels", kernels, "devices", "--json"]))
                .unwrap();
        assert_eq!(found["cortex_kernels"], expected, "{kernels}: {found}");
    }
    let mistyped = cortex.run(&["--cpu-kernels", "avx3", "devices"]);
    assert!(!mistyped.status.success());
    let why = String::from_utf8_lossy(&mistyped.stderr);
    assert!(
        why.contains("expected cortex, cortex-avx2, cortex-avx-vnni or llama"),
        "{why}"
    );

    cortex.write(
        "job.jsonl",
        &greedy_job(
            &[
                "The capital of France is",
                "1, 2, 3, 4,",
                "def fibonacci(n):",
            ],
            24,
        ),
    );
    let best = run_job_with(&cortex, "default", "cortex");
    for kernels in ["cortex-avx2", "cortex-avx-vnni"] {
        assert_greedy_agrees(
            ("the best kernels", &best),
            (kernels, &run_job_with(&cortex, "default", kernels)),
            0.5,
            0.3,
        );
    }
}

#[test]
fn a_profiled_bench_counts_the_matrix_products_against_the_peak_of_the_kernels_run() {
    // Figures are not checked (timing belongs to benchmarks): only that the
    // profile is printed and its peak counts the instruction the kernels ran.
    if !cpu_runs_the_kernels() {
        return;
    }
    let cortex = Cortex::new();
    for (kernels, instruction) in [
        ("cortex", best_kernels().1),
        (
            "cortex-avx2",
            "running vpmaddubsw ymm back to back, measured",
        ),
    ] {
        let text = cortex.ok(&[
            "--cpu-kernels",
            kernels,
            "bench",
            "--batch",
            "2",
            "--no-prefix",
            "--engine-only",
            "--profile-ops",
        ]);
        assert!(
            text.contains("time per graph operation, engine, B = 2"),
            "{text}"
        );
        // A product's line names its weights' type (a mixed-type model's
        // layers of one kind split by type).
        assert!(
            text.lines()
                .any(|line| line.starts_with("| MUL_MAT ffn_up q4_1 (host)")),
            "{text}"
        );
        let rate = text
            .lines()
            .find(|line| line.starts_with("matrix products:"))
            .unwrap_or_else(|| panic!("{kernels}: no matrix products line in\n{text}"));
        assert!(
            rate.contains("of the int8 peak") && rate.contains(instruction),
            "{kernels}: {rate}"
        );
    }
}

#[test]
fn a_k_quant_models_weights_go_to_the_kernels_and_answer_alike() {
    // Gemma 3 270M Q4_K_M: Q4_K, Q5_0, Q6_K and Q8_0 matrices, the 4-bit
    // ones packed exactly as Q4_K, Q5_0 exactly (as Q5_1 for the AVX2
    // kernels, Q8_0 for the VNNI ones), Q6_K exactly in planes of 7 bits a
    // quant. The AVX2 and AVX-VNNI kernels run too, for their Q5_1 or Q8_0
    // panels and their own k-quant tiles (AVX-VNNI as AVX2 on a CPU
    // without it).
    if cpu_runs_the_kernels() {
        let cortex = Cortex::new();
        let with = model_weights_buffers(&cortex, "gemma3-270m", "cortex");
        assert!(with.contains("CortexCPU model buffer"), "{with}");
    }
    greedy_answers_agree(
        "gemma3-270m",
        &["cortex", "cortex-avx2", "cortex-avx-vnni"],
        0.5,
    );
}

/// A batched greedy job of `model` gives the same tokens with cortex's
/// kernels (each of `kernels`) and llama.cpp's, but at near-ties, and
/// log-probabilities within `tolerance`.
fn greedy_answers_agree(model: &str, kernels: &[&str], tolerance: f64) {
    let cortex = Cortex::new();
    let prompts = [
        "The capital of France is",
        "Water boils at",
        "1, 2, 3, 4,",
        "The opposite of hot is",
        "A haiku about autumn:",
        "def fibonacci(n):",
        "The largest planet in the solar system is",
        "Translate to French: good morning",
        "Once upon a time, a fox",
        "The chemical symbol for gold is",
    ];
    cortex.write("job.jsonl", &greedy_job(&prompts, 24));
    let theirs = run_job_with(&cortex, model, "llama");
    // The products add floats in another order; where an activation lands
    // a hair's breadth from a rounding boundary of its 8-bit quantization,
    // the two sides round it apart and 30 layers carry that on, so
    // log-probabilities differ by up to ~0.15 (as between llama.cpp's own
    // AVX2 and AVX-512 builds), and a greedy choice can differ only at a
    // near-tie. A wrong kernel gives other tokens from the first one.
    for &kernels in kernels {
        assert_greedy_agrees(
            (kernels, &run_job_with(&cortex, model, kernels)),
            ("llama.cpp's", &theirs),
            0.5,
            tolerance,
        );
    }
    // A rerun promises the same output only where cortex's kernels ran.
    if cpu_runs_the_kernels() {
        assert!(cortex.job(1).outputs_may_vary);
        assert!(!cortex.job(2).outputs_may_vary);
        let status = cortex.ok(&["status", "1"]);
        assert!(status.contains("reruns    may differ: "), "{status}");
        let status = cortex.ok(&["status", "2"]);
        assert!(
            status.contains("reruns    give the same output: every line so far ran"),
            "{status}"
        );
    }
}

/// Runs `job.jsonl` on `model` on the CPU with `--cpu-kernels kernels`; the
/// output file.
fn run_job_with(cortex: &Cortex, model: &str, kernels: &str) -> std::path::PathBuf {
    let out = format!("{kernels}.jsonl");
    cortex.ok(&[
        "--model",
        model,
        "--cpu-kernels",
        kernels,
        "run",
        "job.jsonl",
        "--device",
        "cpu",
        "-o",
        &out,
        "--force",
    ]);
    cortex.dir().join(out)
}
