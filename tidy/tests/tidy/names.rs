//! Names: "backend" means llama.cpp's modules only, in code, comments,
//! strings and manifests.

use super::*;

/// "Backend" names llama.cpp's device modules (and cortex's own CPU
/// backend among them), nothing else: the engine's trait for what runs a
/// model is the `Executor`, queue storage a driver (ARCHITECTURE.md's
/// glossary). Outside the binding, which loads those modules, nothing
/// defined is named with the word but where the modules are looked for.
#[test]
fn backend_names_only_llama_cpps_modules() {
    let root = workspace_root();
    let mut files = Vec::new();
    for member in std::fs::read_dir(&root).unwrap() {
        let src = member.unwrap().path().join("src");
        if src.is_dir() && !src.starts_with(root.join("cortex-llama")) {
            rust_sources(&src, &mut files);
        }
    }
    let defines = [
        "trait", "struct", "enum", "type", "fn", "mod", "const", "static",
    ];
    let mut offenders = Vec::new();
    for file in &files {
        let code = code_of(&std::fs::read_to_string(file).unwrap());
        let words: Vec<&str> = code
            .split(|c: char| !c.is_alphanumeric() && c != '_')
            .filter(|word| !word.is_empty())
            .collect();
        for pair in words.windows(2) {
            // Where the modules are looked for (`backends_dir`) is about them.
            let name = pair[1].to_lowercase();
            if defines.contains(&pair[0])
                && name.contains("backend")
                && !name.contains("backends_dir")
            {
                offenders.push(format!(
                    "{}: {} {}",
                    file.strip_prefix(&root).unwrap_or(file).display(),
                    pair[0],
                    pair[1]
                ));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "\"backend\" names llama.cpp's modules only (the engine's trait is the Executor, queue storage a driver):\n{}",
        offenders.join("\n")
    );
}

/// The same rule in what tidy's definition check does not read: comments,
/// strings, error codes and manifests, outside the binding. A line may say
/// "backend" only about llama.cpp's modules and devices (it names one of
/// them, or a device field) or PostgreSQL's own (`pg_backend_pid`).
#[test]
fn backend_in_comments_strings_and_manifests_means_llama_cpps_modules() {
    let root = workspace_root();
    let mut files = vec![root.join("Cargo.toml")];
    for member in std::fs::read_dir(&root).unwrap() {
        let member = member.unwrap().path();
        if !member.is_dir() || member.ends_with("cortex-llama") || member.ends_with("target") {
            continue;
        }
        for dir in ["src", "tests", "examples", "benches"] {
            if member.join(dir).is_dir() {
                rust_sources(&member.join(dir), &mut files);
            }
        }
        if member.join("Cargo.toml").is_file() {
            files.push(member.join("Cargo.toml"));
        }
    }
    // What a line says "backend" about when it is llama.cpp's.
    let about_modules = [
        "module",
        "vulkan",
        "cpu",
        "cuda",
        "ggml",
        "llama",
        "device",
        "backends",
        "pg_",
        "backend\"",
        ".backend",
        "backend:",
        "backend ==",
        // The error code's old name, kept readable for error files written before.
        "backend_error",
    ];
    let mut offenders = Vec::new();
    for file in &files {
        // This test names the word in its own rule.
        if file.ends_with("tidy/tests/tidy/names.rs") {
            continue;
        }
        for (number, line) in std::fs::read_to_string(file).unwrap().lines().enumerate() {
            let lower = line.to_lowercase();
            if lower.contains("backend") && !about_modules.iter().any(|word| lower.contains(word)) {
                offenders.push(format!(
                    "{}:{}: {}",
                    file.strip_prefix(&root).unwrap_or(file).display(),
                    number + 1,
                    line.trim()
                ));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "\"backend\" names llama.cpp's modules only; an engine runs an executor, the queue a driver:\n{}",
        offenders.join("\n")
    );
}
