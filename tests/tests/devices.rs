//! Backends as modules and the devices they offer, through the binary: the
//! CPU backend's best variant for this machine is loaded from the build's
//! modules, unknown devices and KV caches that cannot fit are refused at
//! start with what to lower, and — where the Vulkan module has been built
//! beside the binary (`scripts/build-backend.sh vulkan`, which
//! `scripts/test.sh` runs) — the whole GPU path on Mesa's software Vulkan
//! driver: offload, KV on the device, logits read back, greedy agreement
//! with the CPU, a job, a served request and device memory in `/api/ps` and
//! `/metrics`, and greedy rows sampled on the device (llama.cpp's backend
//! sampling) giving what the host's sampling gives; on the CPU too, where
//! cortex's kernels take the argmax.

use std::path::Path;

use cortex_tests::{Cortex, Server, binary, greedy_job, http, read_jsonl};
use serde_json::{Value, json};

fn devices_json(cortex: &Cortex) -> Value {
    serde_json::from_str(&cortex.ok(&["devices", "--json"])).expect("devices --json")
}

#[test]
fn the_cpu_backend_is_a_module_and_its_best_variant_is_loaded() {
    let cortex = Cortex::new();
    let found = devices_json(&cortex);
    let modules = found["modules"].as_array().expect("modules");
    let cpu = modules
        .iter()
        .find(|m| m["backend"] == "CPU")
        .unwrap_or_else(|| panic!("no CPU module loaded: {found:#}"));
    let file = cpu["path"].as_str().unwrap();
    assert!(
        Path::new(file)
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("libggml-cpu-"),
        "{file}"
    );
    // Every variant this machine can run scored no better than the one chosen.
    let best = cpu["score"].as_i64().expect("a CPU variant has a score");
    assert!(best > 0, "{found:#}");
    for skipped in found["skipped"].as_array().unwrap() {
        let why = skipped["why"].as_str().unwrap();
        // An AMX variant is passed over where the system does not save AMX
        // tile data (some virtual machines offer AMX in CPUID only).
        assert!(
            why == "a better variant was loaded"
                || why == "not for this machine's CPU"
                || why.starts_with(
                    "its kernels use AMX, which this system does not let processes use"
                ),
            "{skipped}"
        );
    }
    let devices = found["devices"].as_array().unwrap();
    let cpu_device = devices
        .iter()
        .find(|d| d["kind"] == "cpu")
        .expect("the CPU");
    assert!(cpu_device["memory_total"].as_u64().unwrap() > 1 << 30);
    let text = cortex.ok(&["devices"]);
    assert!(
        text.contains("CPU from ") && text.contains("(score "),
        "{text}"
    );
    // cortex's kernels own no memory: they are not shown as a device with none.
    assert!(!text.contains("0 MiB free of 0 MiB"), "{text}");
}

#[test]
fn unknown_devices_and_kv_caches_that_cannot_fit_are_refused_at_start() {
    let cortex = Cortex::new();
    cortex.write("one.jsonl", "{\"prompt\": \"Hi\", \"max_tokens\": 2}\n");
    cortex.refused(
        &["run", "one.jsonl", "--device", "warp9"],
        &["no device \"warp9\": this machine has CPU"],
    );
    // 256 sequences of 8,192 tokens: about 46 GiB of KV on the default model.
    let mut fixed = Cortex::new();
    fixed.set_env("CORTEX_CONTEXT", "8192");
    fixed.write("one.jsonl", "{\"prompt\": \"Hi\", \"max_tokens\": 2}\n");
    fixed.refused(
        &["run", "one.jsonl", "--parallel", "256"],
        &[
            "a KV cache of 256 sequences of 8192 tokens needs",
            "CPU has",
            "lower --parallel or --context",
        ],
    );
    fixed.set_env("CORTEX_CONTEXT", "0");
    fixed.set_env("CORTEX_KV_MEMORY_MIB", "100000000");
    fixed.refused(
        &["run", "one.jsonl"],
        &[
            "kv_memory_mib = 100000000 is more than the",
            "lower kv_memory_mib",
        ],
    );
}

/// A cortex that sees Mesa's software Vulkan device (lavapipe), if the
/// Vulkan module has been built beside the binary; `None` (and why) if not,
/// which fails the test where CI requires Vulkan.
fn on_vulkan() -> Option<Cortex> {
    let module = binary().with_file_name("libggml-vulkan.so");
    if !module.is_file() {
        assert!(
            std::env::var_os("CORTEX_REQUIRE_VULKAN").is_none(),
            "{} is missing: scripts/test.sh builds it with scripts/build-backend.sh vulkan",
            module.display()
        );
        eprintln!(
            "skipped: no Vulkan module at {} (bash scripts/build-backend.sh vulkan builds it)",
            module.display()
        );
        return None;
    }
    let mut cortex = Cortex::new();
    // lavapipe is a CPU-type device, which ggml's Vulkan backend skips
    // unless it is named.
    cortex.set_env("GGML_VK_VISIBLE_DEVICES", "0");
    Some(cortex)
}

fn vulkan_device(cortex: &Cortex) -> String {
    let found = devices_json(cortex);
    let device = found["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["backend"] == "Vulkan")
        .unwrap_or_else(|| panic!("no Vulkan device: {found:#}"))
        .clone();
    assert_eq!(device["kind"], "gpu", "{device}");
    assert!(device["memory_total"].as_u64().unwrap() > 0, "{device}");
    device["name"].as_str().unwrap().to_lowercase()
}

#[test]
fn greedy_on_vulkan_agrees_with_the_cpu_and_a_job_runs_there() {
    let Some(cortex) = on_vulkan() else { return };
    let device = vulkan_device(&cortex);
    let prompts = ["The capital of France is", "Water boils at", "1, 2, 3, 4,"];
    cortex.write("job.jsonl", &greedy_job(&prompts, 10));
    cortex.ok(&[
        "run",
        "job.jsonl",
        "--device",
        &device,
        "-o",
        "gpu.jsonl",
        "--force",
    ]);
    cortex.ok(&[
        "run",
        "job.jsonl",
        "--device",
        "cpu",
        "-o",
        "cpu.jsonl",
        "--force",
    ]);
    // Equal, or where they part the CPU's token is a near-tie in the Vulkan
    // logits (the backends round differently).
    cortex_tests::assert_greedy_agrees(
        ("Vulkan", &cortex.dir().join("gpu.jsonl")),
        ("the CPU", &cortex.dir().join("cpu.jsonl")),
        0.25,
        f64::INFINITY,
    );
}

#[test]
fn tokens_sampled_on_the_device_are_those_the_host_samples() {
    let Some(cortex) = on_vulkan() else { return };
    let device = vulkan_device(&cortex);
    device_and_host_sample_alike(&cortex, &["--device", &device]);
}

/// On the CPU, cortex's kernels take the argmax of greedy rows in the graph
/// (after the output projection they computed), and llama.cpp copies no
/// logits out: the tokens are those the host's argmax takes.
#[test]
fn greedy_rows_sampled_by_cortexs_cpu_kernels_are_those_the_host_samples() {
    let cortex = Cortex::new();
    device_and_host_sample_alike(&cortex, &["--cpu-kernels", "cortex"]);
}

/// The same greedy and seeded jobs with `--sample-on-device` false and
/// true give the same texts; with it on, every greedy token came from the
/// device and no seeded one.
fn device_and_host_sample_alike(cortex: &Cortex, device: &[&str]) {
    // Prompts that share no 16-token block, so that no prefix is copied
    // between streams: on lavapipe a release build crashes or hangs where
    // streams copy a prefix (also before device sampling existed; CUDA is
    // unaffected), which is not what this test is about.
    // Few and short: lavapipe computes a step in seconds.
    let prompts = [
        "The capital of France is",
        "Water boils at",
        "A haiku about autumn:",
        "Rust is a language that",
    ];
    let job = |name: &str, sampling: Value| {
        let lines: String = prompts
            .iter()
            .enumerate()
            .map(|(i, prompt)| {
                let mut line = json!({"custom_id": format!("{name}-{i}"), "prompt": prompt,
                                      "max_tokens": 6});
                line.as_object_mut()
                    .unwrap()
                    .extend(sampling.as_object().unwrap().clone());
                format!("{line}\n")
            })
            .collect();
        cortex.write(&format!("{name}.jsonl"), &lines);
    };
    // Greedy and seeded rows in jobs of their own: llama.cpp splits a batch
    // into micro-batches differently where some of its rows are sampled on
    // the device, and lavapipe's kernels round by batch shape, so a mixed
    // batch parts at near-ties as two batch sizes do.
    job("greedy", json!({"temperature": 0}));
    job(
        "seeded",
        json!({"temperature": 0.8, "top_p": 0.9, "seed": 7}),
    );
    let run = |name: &str, on_device: &str| {
        let out = format!("{name}-{on_device}.jsonl");
        let job = format!("{name}.jsonl");
        let trace = format!("{name}-{on_device}.trace");
        let mut args = vec!["run", job.as_str()];
        args.extend_from_slice(device);
        args.extend_from_slice(&[
            "--sample-on-device",
            on_device,
            "--trace",
            &trace,
            "-o",
            &out,
            "--force",
        ]);
        let output = cortex.run(&args);
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert!(output.status.success(), "{stderr}");
        let texts: Vec<(String, Value)> = read_jsonl(&cortex.dir().join(&out))
            .into_iter()
            .map(|l| {
                let text = l["response"]["body"]["choices"][0]["text"].clone();
                (l["custom_id"].as_str().unwrap().to_owned(), text)
            })
            .collect();
        (texts, stderr)
    };
    // "N of M sampled on the device", from a trace's summary.
    let sampled = |trace: &str| -> (u64, u64) {
        let line = trace
            .lines()
            .find(|l| l.contains(" sampled on the device"))
            .unwrap_or_else(|| panic!("no sampling line: {trace}"));
        let words: Vec<&str> = line.rsplit("; ").next().unwrap().split(' ').collect();
        (words[0].parse().unwrap(), words[2].parse().unwrap())
    };
    for name in ["greedy", "seeded"] {
        let (on_host, host_trace) = run(name, "false");
        let (on_device, device_trace) = run(name, "true");
        assert_eq!(on_host, on_device, "{name}: the same texts either way");
        assert_eq!(sampled(&host_trace).0, 0, "{host_trace}");
        let (device, all) = sampled(&device_trace);
        // Greedy rows came back as tokens; seeded ones are drawn on the
        // host either way.
        let expected = if name == "greedy" { all } else { 0 };
        assert!(all > 0 && device == expected, "{device_trace}");
    }
}

#[test]
fn cortex_serve_answers_on_vulkan_and_reports_device_memory() {
    let Some(cortex) = on_vulkan() else { return };
    let device = vulkan_device(&cortex);
    let server = Server::start(&cortex, &["--device", &device, "--parallel", "2"]);
    let body = json!({"model": "default", "prompt": "Hello", "max_tokens": 4, "temperature": 0});
    let (status, text) =
        http(server.port, "POST", "/v1/completions", &body.to_string()).expect("an answer");
    assert_eq!(status, 200, "{text}");
    let (status, text) = http(server.port, "GET", "/api/ps", "").expect("an answer");
    assert_eq!(status, 200, "{text}");
    let ps: Value = serde_json::from_str(&text).unwrap();
    let model = &ps["models"][0];
    assert!(model["size_vram"].as_u64().unwrap() > 0, "{text}");
    let (_, metrics) = http(server.port, "GET", "/metrics", "").expect("metrics");
    let line = metrics
        .lines()
        .find(|l| l.starts_with("cortex_device_memory_used_bytes{"))
        .unwrap_or_else(|| panic!("no device memory gauge:\n{metrics}"));
    assert!(line.contains("device=\"Vulkan0\""), "{line}");
}

#[test]
fn a_kv_cache_past_the_vulkan_devices_memory_is_refused_at_start() {
    let Some(mut cortex) = on_vulkan() else {
        return;
    };
    let device = vulkan_device(&cortex);
    cortex.set_env("CORTEX_CONTEXT", "8192");
    cortex.write("one.jsonl", "{\"prompt\": \"Hi\", \"max_tokens\": 2}\n");
    cortex.refused(
        &["run", "one.jsonl", "--device", &device, "--parallel", "256"],
        &[
            "a KV cache of 256 sequences of 8192 tokens needs",
            "Vulkan0 has",
            "lower --parallel or --context",
        ],
    );
}
