//! The `cortex` binary's output without a model: help, config, job listings,
//! status and errors, as insta snapshots (times, speeds and paths redacted).
//! Generation through the binary is covered by the `tests` crate.

use std::path::Path;
use std::process::{Command, Output};

fn cortex(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cortex"))
        .args(args)
        .current_dir(dir)
        .env("CORTEX_DATA_DIR", dir.join("data"))
        .env("XDG_CONFIG_HOME", dir.join("config"))
        .env("CORTEX_CACHE_DIR", dir.join("cache"))
        .env_remove("CORTEX_DB")
        .env_remove("CORTEX_MODEL")
        .env_remove("CORTEX_PARALLEL")
        .env_remove("CORTEX_THREADS")
        .output()
        .unwrap()
}

/// `YYYY-MM-DD HH:MM:SS` -> `[time]`, the temp dir -> `[dir]`.
fn redact(text: &str, dir: &Path) -> String {
    let text = text.replace(&dir.display().to_string(), "[dir]");
    let bytes = text.as_bytes();
    let shape = b"dddd-dd-dd dd:dd:dd";
    let mut out = String::new();
    let mut i = 0;
    while i < bytes.len() {
        let fits = bytes.len() - i >= shape.len()
            && shape.iter().zip(&bytes[i..]).all(|(s, b)| {
                if *s == b'd' {
                    b.is_ascii_digit()
                } else {
                    s == b
                }
            });
        if fits {
            out.push_str("[time]");
            i += shape.len();
        } else {
            let c = text[i..].chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// Exit code, stdout and stderr, redacted, for a snapshot.
fn transcript(dir: &Path, args: &[&str]) -> String {
    let output = cortex(dir, args);
    format!(
        "$ cortex {}\nexit: {}\n--- stdout\n{}--- stderr\n{}",
        args.join(" "),
        output.status.code().unwrap_or(-1),
        redact(&String::from_utf8_lossy(&output.stdout), dir),
        redact(&String::from_utf8_lossy(&output.stderr), dir)
    )
}

fn write(dir: &Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).unwrap();
}

const GOOD: &str = r#"{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}}
{"prompt": "Once upon a time", "max_tokens": 4}
"#;

#[test]
fn help() {
    let dir = tempfile::tempdir().unwrap();
    insta::assert_snapshot!(transcript(dir.path(), &["--help"]));
    insta::assert_snapshot!("submit_help", transcript(dir.path(), &["submit", "--help"]));
}

#[test]
fn config_shows_values_and_their_sources() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "cortex.toml",
        "parallel = 4\nlease_seconds = 30\n",
    );
    insta::assert_snapshot!(transcript(dir.path(), &["--threads", "2", "config"]));
    write(dir.path(), "cortex.toml", "paralel = 4\n");
    insta::assert_snapshot!("config_typo", transcript(dir.path(), &["config"]));
}

#[test]
fn submit_list_status_cancel_and_results() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "prompts.jsonl", GOOD);
    let mut log = String::new();
    for args in [
        &["submit", "prompts.jsonl", "--metadata", "team=search"][..],
        &["submit", "prompts.jsonl"],
        &["list"],
        &["status", "1"],
        &["results", "1"],
        &["cancel", "1"],
        &["status"],
        &["results", "1"],
        &["resume", "1"],
        &["list", "--state", "in_progress"],
        &["list", "--state", "bogus"],
        &["status", "7"],
    ] {
        log.push_str(&transcript(dir.path(), args));
        log.push('\n');
    }
    insta::assert_snapshot!(log);
}

#[test]
fn bad_input_and_bad_places_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "empty.jsonl", "");
    write(
        dir.path(),
        "bad.jsonl",
        "{\"prompt\": \"ok\"}\n{\"prompt\": \"x\", \"top_p\": 3}\nnot json\n",
    );
    write(dir.path(), "model.gguf", "this is not a model");
    let mut log = String::new();
    for args in [
        &["submit", "missing.jsonl"][..],
        &["submit", "empty.jsonl"],
        &["submit", "bad.jsonl"],
        &["submit", "bad.jsonl", "--skip-invalid"],
        &["--db", "/proc/cortex/no.db", "list"],
        &["--model", "model.gguf", "generate", "hi"],
        &["--model", "missing.gguf", "run", "bad.jsonl"],
    ] {
        log.push_str(&transcript(dir.path(), args));
        log.push('\n');
    }
    insta::assert_snapshot!(log);
}

#[test]
fn json_output_parses() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "prompts.jsonl", GOOD);
    assert!(
        cortex(dir.path(), &["submit", "prompts.jsonl"])
            .status
            .success()
    );
    let parse = |args: &[&str]| -> serde_json::Value {
        let output = cortex(dir.path(), args);
        assert!(output.status.success(), "{args:?}");
        serde_json::from_slice(&output.stdout).unwrap()
    };
    let status = parse(&["status", "1", "--json"]);
    assert_eq!(status["job"]["counts"]["pending"], 2);
    assert_eq!(status["eta_seconds"], serde_json::Value::Null);
    assert_eq!(parse(&["list", "--json"])[0]["state"], "in_progress");
    // Left to the device (64 on the CPU, 256 a step loop on a GPU).
    assert_eq!(parse(&["config", "--json"])["parallel"]["value"], "0");
    assert_eq!(parse(&["cancel", "1", "--json"])["state"], "cancelled");
}

#[test]
fn every_setting_shows_in_the_help_the_file_the_environment_and_config() {
    let dir = tempfile::tempdir().unwrap();
    let output = cortex(dir.path(), &["config", "--json"]);
    let settings: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let help = String::from_utf8(cortex(dir.path(), &["config", "--help"]).stdout).unwrap();
    let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut checked = 0;
    for key in settings.as_object().unwrap().keys() {
        // Shown, not settings: the queue driver the database URL names, where
        // pulled models are, the [server.keys] table.
        if ["db_driver", "model_cache", "server.keys"].contains(&key.as_str()) {
            continue;
        }
        let name = key.trim_start_matches("server.");
        let flag = if name == "api_keys" {
            "api-key".to_owned()
        } else {
            name.replace('_', "-")
        };
        let env = format!("[env: CORTEX_{}]", name.to_uppercase());
        assert!(
            help.contains(&format!("--{flag} ")),
            "--{flag} in `config --help`"
        );
        assert!(help.contains(&env), "{env}");
        checked += 1;
    }
    assert!(checked >= 38, "only {checked} settings");
    // The default shown is the library's: 0 sequences leaves them to the device.
    assert!(help.contains("--parallel <N>"));
    // Each command lists only what applies to it.
    let status = String::from_utf8(cortex(dir.path(), &["status", "--help"]).stdout).unwrap();
    assert!(
        status.contains("--db ") && !status.contains("--threads") && !status.contains("--port")
    );
    let worker = String::from_utf8(cortex(dir.path(), &["worker", "--help"]).stdout).unwrap();
    assert!(worker.contains("--parallel") && !worker.contains("--port"));
    // Before the command's name a setting must apply to it.
    let wrong = cortex(dir.path(), &["--port", "9000", "status"]);
    assert_eq!(wrong.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&wrong.stderr).contains("--port does not apply to `cortex status`")
    );
}

#[test]
fn a_reader_that_stops_early_ends_the_command_quietly() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_cortex"))
        .arg("config")
        .current_dir(dir.path())
        .env("CORTEX_DATA_DIR", dir.path().join("data"))
        .env("XDG_CONFIG_HOME", dir.path().join("config"))
        .env("CORTEX_CACHE_DIR", dir.path().join("cache"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // `cortex config | head -1`: one line read, then the pipe closed.
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.starts_with("# config file"), "{first}");
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(output.status.code(), Some(0), "{stderr}");
}
