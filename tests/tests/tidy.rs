//! Tidy: the workspace's structural invariants (ARCHITECTURE.md), checked
//! from `cargo metadata` and the sources, in the manner of rust-analyzer's
//! `xtask tidy`. A failure names the crate or file and the rule.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A dependency and the only crates that may have it.
const CONFINED: &[(&str, &[&str], &str)] = &[
    (
        "rusqlite",
        &["cortex-queue"],
        "a database client only in its queue backend",
    ),
    (
        "postgres",
        &["cortex-queue-postgres"],
        "a database client only in its queue backend",
    ),
    (
        "tokio-postgres",
        &["cortex-queue-postgres"],
        "a database client only in its queue backend",
    ),
    (
        "sqlx",
        &["cortex-queue-postgres"],
        "a database client only in its queue backend",
    ),
    (
        "postgres-native-tls",
        &["cortex-queue-postgres"],
        "a database client (and its TLS) only in its queue backend",
    ),
    (
        "llama-cpp-sys-2",
        &["cortex-engine"],
        "llama.cpp only in the engine",
    ),
    (
        "llama-cpp-2",
        &["cortex-engine"],
        "llama.cpp only in the engine",
    ),
    (
        "libloading",
        &["cortex-engine"],
        "loading native code only in the engine's FFI",
    ),
    (
        "anyhow",
        &["cortex-cli"],
        "anyhow only in the CLI (libraries have typed errors)",
    ),
    (
        "tokio",
        &["cortex-server"],
        "an async runtime only in the server",
    ),
    (
        "async-std",
        &["cortex-server"],
        "an async runtime only in the server",
    ),
    (
        "axum",
        &["cortex-server"],
        "a web framework only in the server",
    ),
    (
        "hyper",
        &["cortex-server"],
        "a web framework only in the server",
    ),
    (
        "hyper-util",
        &["cortex-server"],
        "a web framework only in the server",
    ),
    (
        "actix-web",
        &["cortex-server"],
        "a web framework only in the server",
    ),
];

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_owned()
}

fn metadata() -> serde_json::Value {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(workspace_root())
        .output()
        .expect("run cargo metadata");
    assert!(
        output.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("cargo metadata's JSON")
}

fn packages(metadata: &serde_json::Value) -> &Vec<serde_json::Value> {
    metadata["packages"].as_array().expect("packages")
}

#[test]
fn dependencies_stay_in_their_crates() {
    let metadata = metadata();
    let mut problems = Vec::new();
    for package in packages(&metadata) {
        let name = package["name"].as_str().unwrap();
        for dependency in package["dependencies"].as_array().unwrap() {
            let dep = dependency["name"].as_str().unwrap();
            for (confined, allowed, rule) in CONFINED {
                if dep == *confined && !allowed.contains(&name) {
                    problems.push(format!("{name} depends on {dep}: {rule}"));
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_crate_graph_has_no_cycles_and_the_engine_sits_below_the_queue_users() {
    let metadata = metadata();
    let packages = packages(&metadata);
    let deps_of = |name: &str| -> Vec<String> {
        packages
            .iter()
            .find(|p| p["name"] == name)
            .map(|p| {
                p["dependencies"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|d| d["kind"].is_null())
                    .map(|d| d["name"].as_str().unwrap().to_owned())
                    .filter(|d| d.starts_with("cortex-"))
                    .collect()
            })
            .unwrap_or_default()
    };
    // The policy crates know nothing of the engine, the queue or the worker.
    for base in [
        "cortex-request",
        "cortex-sample",
        "cortex-kv",
        "cortex-sched",
    ] {
        for dep in deps_of(base) {
            assert!(
                [
                    "cortex-request",
                    "cortex-sample",
                    "cortex-kv",
                    "cortex-sched"
                ]
                .contains(&dep.as_str()),
                "{base} depends on {dep}: the policy crates sit below the engine and the queue"
            );
        }
    }
    // The grammar compiler is a leaf: JSON in, GBNF out.
    assert_eq!(deps_of("cortex-grammar"), Vec::<String>::new());
    // The engine and the queue do not know each other; the worker joins them.
    assert!(!deps_of("cortex-engine").contains(&"cortex-queue".to_owned()));
    assert!(!deps_of("cortex-queue").contains(&"cortex-engine".to_owned()));
    assert!(!deps_of("cortex-worker").contains(&"cortex-cli".to_owned()));
}

fn rust_sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_sources(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn every_module_says_what_it_is_for() {
    let metadata = metadata();
    let mut files = Vec::new();
    for package in packages(&metadata) {
        let manifest = Path::new(package["manifest_path"].as_str().unwrap());
        let src = manifest.parent().unwrap().join("src");
        if src.is_dir() {
            rust_sources(&src, &mut files);
        }
    }
    assert!(files.len() > 20, "found only {} source files", files.len());
    let missing: Vec<String> = files
        .iter()
        .filter(|file| {
            let text = std::fs::read_to_string(file).unwrap();
            !text
                .lines()
                .find(|line| !line.trim().is_empty())
                .is_some_and(|line| line.starts_with("//!"))
        })
        .map(|file| file.display().to_string())
        .collect();
    assert!(
        missing.is_empty(),
        "these modules lack a `//!` header saying what they are for:\n{}",
        missing.join("\n")
    );
}

#[test]
fn unsafe_code_lives_only_in_the_engines_ffi_modules() {
    let mut files = Vec::new();
    rust_sources(&workspace_root(), &mut files);
    // Spelled in pieces so that this file does not match itself.
    let needles: Vec<String> = [" {", " fn", " impl"]
        .iter()
        .map(|rest| ["unsafe", rest].concat())
        .collect();
    let has_unsafe = |path: &Path| {
        let text = std::fs::read_to_string(path).unwrap();
        text.lines().any(|line| {
            let code = line.split("//").next().unwrap_or("");
            needles.iter().any(|needle| code.contains(needle.as_str()))
        })
    };
    let ffi = workspace_root().join("cortex-engine/src/llama/sys");
    assert!(
        has_unsafe(&ffi.join("context.rs")),
        "the FFI module is where the rule looks for unsafe code"
    );
    let offenders: Vec<String> = files
        .iter()
        .filter(|f| !f.components().any(|c| c.as_os_str() == "target"))
        .filter(|f| !f.starts_with(&ffi))
        .filter(|f| has_unsafe(f))
        .map(|f| f.display().to_string())
        .collect();
    assert!(
        offenders.is_empty(),
        "unsafe code outside cortex-engine/src/llama/sys/:\n{}",
        offenders.join("\n")
    );
}

#[test]
fn openai_json_shapes_live_only_in_the_wire_format_crate() {
    // The names of OpenAI's response objects, spelled in pieces so that this
    // file does not match itself.
    let needles: Vec<String> = [
        ("chat", ".completion"),
        ("text", "_completion"),
        ("batch", "_req_"),
        ("\"obj", "ect\""),
    ]
    .iter()
    .map(|(a, b)| [*a, *b].concat())
    .collect();
    let mut files = Vec::new();
    for krate in [
        "cortex-queue",
        "cortex-worker",
        "cortex-engine",
        "cortex-cli",
        "cortex-request",
        "cortex-server",
    ] {
        rust_sources(&workspace_root().join(krate).join("src"), &mut files);
    }
    let offenders: Vec<String> = files
        .iter()
        .filter(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            // Doc comments may show an input line; code may not render one.
            text.lines()
                .filter(|line| !line.trim_start().starts_with("//"))
                .any(|line| needles.iter().any(|n| line.contains(n.as_str())))
        })
        .map(|f| f.display().to_string())
        .collect();
    assert!(
        offenders.is_empty(),
        "OpenAI response shapes outside cortex-openai:\n{}",
        offenders.join("\n")
    );
}
