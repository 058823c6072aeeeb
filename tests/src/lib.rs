//! End-to-end tests of cortex: the built `cortex` binary against the real
//! default model, with real process kills. This library is the harness; the
//! tests are in `tests/`.
//!
//! The binary is the one `cargo test --workspace` builds beside this crate's
//! test executables (`target/<profile>/cortex`); run the tests that way (or
//! `cargo build -p cortex-cli` first) so it is current.
//!
//! ```no_run
//! let cortex = cortex_tests::Cortex::new();
//! cortex.write("p.jsonl", "{\"prompt\": \"Hi\", \"max_tokens\": 4}\n");
//! assert_eq!(cortex.ok(&["submit", "p.jsonl"]).trim(), "1");
//! ```

#![forbid(unsafe_code)]

mod server;

pub use server::{Server, free_port, http, raw_http};

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use cortex_queue::{ItemRecord, Job, JobId, Queue};
use cortex_queue_postgres::PgStore;
use cortex_queue_sqlite::Store;

/// The `cortex` binary built for this profile.
pub fn binary() -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable's path");
    // target/<profile>/deps/<test> -> target/<profile>/cortex
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>");
    let binary = profile_dir.join(format!("cortex{}", std::env::consts::EXE_SUFFIX));
    assert!(
        binary.is_file(),
        "{} is missing: run `cargo test --workspace` or `cargo build -p cortex-cli` first",
        binary.display()
    );
    binary
}

/// A private cortex installation: its own working directory, data directory
/// and database (the model cache is the shared default one).
pub struct Cortex {
    dir: tempfile::TempDir,
    binary: PathBuf,
    env: Vec<(String, String)>,
    /// The PostgreSQL queue's URL, when this installation uses one.
    postgres: Option<String>,
}

impl Default for Cortex {
    fn default() -> Self {
        Self::new()
    }
}

impl Cortex {
    /// A fresh installation with 3-second leases (heartbeats every second).
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("a temp dir");
        let env = vec![
            (
                "CORTEX_DATA_DIR".into(),
                dir.path().join("data").display().to_string(),
            ),
            (
                "XDG_CONFIG_HOME".into(),
                dir.path().join("config").display().to_string(),
            ),
            ("CORTEX_LEASE_SECONDS".into(), "3".into()),
        ];
        Self {
            dir,
            binary: binary(),
            env,
            postgres: None,
        }
    }

    /// An installation whose queue is a fresh database on the test
    /// PostgreSQL server (`CORTEX_TEST_POSTGRES`); `None`, after saying so,
    /// when there is none and none is required (`CORTEX_REQUIRE_POSTGRES=1`).
    pub fn on_postgres(name: &str) -> Option<Self> {
        let url = cortex_queue_postgres::testing::fresh_database(&format!("e2e_{name}"))?;
        let mut cortex = Self::new();
        cortex.set_env("CORTEX_DB", &url);
        cortex.postgres = Some(url);
        Some(cortex)
    }

    /// Gives this installation a model registry of its own (so it can add
    /// and remove names freely), holding the known models the shared cache
    /// has already fetched (hard links where the file system allows, so
    /// nothing is fetched or copied).
    /// Returns the registry's root.
    pub fn private_models(&mut self) -> PathBuf {
        let shared = cortex_models::Registry::default_location();
        let cache = self.dir.path().join("cache");
        let root = cache.join("models");
        let blobs = root.join("blobs");
        std::fs::create_dir_all(&blobs).expect("a registry directory");
        for spec in cortex_models::KNOWN_MODELS {
            let blob = shared.cache().ensure(spec).expect("a known model");
            let name = blob.file_name().expect("a blob name").to_owned();
            // A hard link where the file system allows it, else a copy.
            if std::fs::hard_link(&blob, blobs.join(&name)).is_err() {
                std::fs::copy(&blob, blobs.join(&name)).expect("copy a blob");
            }
            let mut stamp = name.clone();
            stamp.push(".verified");
            if std::fs::metadata(blobs.join(&name))
                .and_then(|m| m.modified())
                .ok()
                == std::fs::metadata(&blob).and_then(|m| m.modified()).ok()
            {
                // Same bytes, same time: the stamp holds (a copy is hashed once instead).
                std::fs::copy(blob.with_file_name(&stamp), blobs.join(&stamp)).expect("its stamp");
            }
        }
        self.set_env("CORTEX_CACHE_DIR", &cache.display().to_string());
        root
    }

    /// How to run this installation from another program: the binary, the
    /// working directory and the environment (for the Python checks that
    /// run cortex themselves).
    pub fn settings(&self) -> serde_json::Value {
        serde_json::json!({
            "binary": self.binary,
            "dir": self.dir.path(),
            "env": self.env.iter().cloned().collect::<std::collections::BTreeMap<_, _>>(),
        })
    }

    /// The PostgreSQL queue's URL, if this installation uses one.
    pub fn postgres_url(&self) -> Option<&str> {
        self.postgres.as_deref()
    }

    /// Sets an environment variable for every later command.
    pub fn set_env(&mut self, name: &str, value: &str) {
        self.env.push((name.into(), value.into()));
    }

    /// The working directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The database.
    pub fn db(&self) -> PathBuf {
        self.dir.path().join("data").join("cortex.db")
    }

    /// Writes a file in the working directory.
    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, text).expect("write a test file");
        path
    }

    /// A command for the binary, in the working directory, with this installation's settings.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(&self.binary);
        command.args(args).current_dir(self.dir.path());
        for name in [
            "CORTEX_DB",
            "CORTEX_MODEL",
            "CORTEX_PARALLEL",
            "CORTEX_THREADS",
            "CORTEX_FAILPOINT",
        ] {
            command.env_remove(name);
        }
        for (name, value) in &self.env {
            command.env(name, value);
        }
        command
    }

    /// Runs to the end and returns the output.
    pub fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("run cortex")
    }

    /// Runs, asserts success, returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let output = self.run(args);
        assert!(
            output.status.success(),
            "cortex {args:?} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// Runs `cortex ARGS`, which must fail with every one of `expected` in
    /// what it printed to stderr; returns that.
    pub fn refused(&self, args: &[&str], expected: &[&str]) -> String {
        let output = self.run(args);
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert!(
            !output.status.success(),
            "cortex {args:?} succeeded: {stderr}"
        );
        for text in expected {
            assert!(stderr.contains(text), "{text}\n{stderr}");
        }
        stderr
    }

    /// Starts in the background (output kept for the caller to read).
    pub fn spawn(&self, args: &[&str]) -> Child {
        self.command(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start cortex")
    }

    /// Opens the queue directly (SQLite or PostgreSQL), to look at what the binary did.
    pub fn store(&self) -> Box<dyn Queue> {
        match &self.postgres {
            Some(url) => Box::new(PgStore::connect(url).expect("connect to the queue")),
            None => Box::new(Store::open(self.db()).expect("open the database")),
        }
    }

    /// The backend's own consistency check (SQLite's integrity check, or
    /// PostgreSQL's counters against the items).
    pub fn check_store(&self) {
        match &self.postgres {
            Some(url) => PgStore::connect(url).unwrap().check_counts().unwrap(),
            None => Store::open(self.db()).unwrap().integrity_check().unwrap(),
        }
    }

    /// The job as stored.
    pub fn job(&self, id: i64) -> Job {
        self.store().job(JobId(id)).expect("the job")
    }

    /// The job, once the queue and the job exist.
    fn maybe_job(&self, id: i64) -> Option<Job> {
        if self.postgres.is_none() && !self.db().exists() {
            return None;
        }
        self.store().job(JobId(id)).ok()
    }

    /// The job's items as stored.
    pub fn items(&self, id: i64) -> Vec<ItemRecord> {
        self.store().items(JobId(id)).expect("the items")
    }

    /// Waits until `condition` holds on the job, or panics after `limit`.
    pub fn wait_for(
        &self,
        id: i64,
        limit: Duration,
        what: &str,
        condition: impl Fn(&Job) -> bool,
    ) -> Job {
        let started = Instant::now();
        loop {
            // A command just spawned may not have created the queue or the
            // job yet: that is waited for too.
            let job = self.maybe_job(id);
            if let Some(job) = job.as_ref().filter(|job| condition(job)) {
                return job.clone();
            }
            assert!(
                started.elapsed() < limit,
                "waited {limit:?} for {what}; job is {job:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Sends `signal` (a `kill` name: `TERM`, `INT`, `KILL`) to the process `pid`.
pub fn signal(pid: u32, signal: &str) {
    let sent = Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .status()
        .expect("run kill");
    assert!(sent.success(), "kill -{signal} {pid} failed");
}

/// How many items a `cortex worker` said it completed (`worker done: N completed, ...`).
pub fn worker_done(stderr: &str) -> Option<u64> {
    stderr
        .split("worker done: ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

/// Waits for each worker process to end; each must succeed and say how many
/// items it completed. Returns those numbers in order.
pub fn wait_for_workers(workers: impl IntoIterator<Item = Child>) -> Vec<u64> {
    workers
        .into_iter()
        .map(|worker| {
            let output = worker.wait_with_output().expect("wait for a worker");
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert!(output.status.success(), "{stderr}");
            worker_done(&stderr).unwrap_or_else(|| panic!("no summary in {stderr}"))
        })
        .collect()
}

/// The prompt of [`completion_prompts`].
pub const CAPITAL_PROMPT: &str = "The capital of France is";

/// `n` greedy plain-completion lines of [`CAPITAL_PROMPT`] (no chat template
/// needed), with ids `TAG-0`, `TAG-1`, ...
pub fn completion_prompts(n: usize, tag: &str) -> String {
    (0..n)
        .map(|i| {
            serde_json::json!({
                "custom_id": format!("{tag}-{i}"),
                "prompt": CAPITAL_PROMPT,
                "max_tokens": 8, "temperature": 0,
            })
            .to_string()
                + "\n"
        })
        .collect()
}

/// What `model` says to [`CAPITAL_PROMPT`], greedy, 8 tokens: what every
/// output of [`completion_prompts`] run on it must be.
pub fn capital_reference(cortex: &Cortex, model: &str) -> String {
    cortex
        .ok(&[
            "--model",
            model,
            "generate",
            CAPITAL_PROMPT,
            "--max-tokens",
            "8",
            "--temperature",
            "0",
        ])
        .trim()
        .to_owned()
}

/// The text of each output line of job `job` (exported to `JOB.out.jsonl`).
pub fn output_texts(cortex: &Cortex, job: &str) -> Vec<String> {
    let out = format!("{job}.out.jsonl");
    cortex.ok(&["results", job, "-o", &out]);
    read_jsonl(&cortex.dir().join(out))
        .iter()
        .map(|l| {
            let choice = &l["response"]["body"]["choices"][0];
            choice["text"]
                .as_str()
                .or_else(|| choice["message"]["content"].as_str())
                .expect("a text")
                .to_owned()
        })
        .collect()
}

/// `n` short prompts alternating OpenAI chat lines and plain completion lines,
/// with ids `item-0000`, `item-0001`, ... in input order.
pub fn prompts(n: usize, max_tokens: u32) -> String {
    let topics = [
        "the sea",
        "a robot",
        "autumn",
        "a city at night",
        "bread",
        "mountains",
        "a library",
        "rain",
    ];
    let mut text = String::new();
    for i in 0..n {
        let topic = topics[i % topics.len()];
        let line = if i % 2 == 0 {
            serde_json::json!({
                "custom_id": format!("item-{i:04}"), "method": "POST", "url": "/v1/chat/completions",
                "body": { "messages": [{ "role": "user", "content": format!("Write one sentence about {topic}.") }],
                          "max_tokens": max_tokens, "temperature": 0.5, "seed": i },
            })
        } else {
            serde_json::json!({
                "custom_id": format!("item-{i:04}"), "prompt": format!("A short note about {topic}:"),
                "max_tokens": max_tokens, "temperature": 0,
            })
        };
        text.push_str(&line.to_string());
        text.push('\n');
    }
    text
}

/// The output lines of an export, parsed.
pub fn read_jsonl(path: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path).expect("read the export");
    text.lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect()
}

/// A greedy plain-completion job of `prompts` (ids `p0`, `p1`, ...), each
/// `max_tokens` long with its top 5 log-probabilities: what
/// [`greedy_completions`] reads back and [`assert_greedy_agrees`] compares.
pub fn greedy_job(prompts: &[&str], max_tokens: u32) -> String {
    prompts
        .iter()
        .enumerate()
        .map(|(i, prompt)| {
            serde_json::json!({"custom_id": format!("p{i}"), "prompt": prompt,
                "max_tokens": max_tokens, "temperature": 0, "logprobs": 5})
            .to_string()
                + "\n"
        })
        .collect()
}

/// The greedy completions of a batch output file with `logprobs`, by
/// `custom_id`: each line's tokens and, per token, its top log-probabilities.
pub fn greedy_completions(output: &Path) -> Vec<(String, Vec<String>, Vec<serde_json::Value>)> {
    let mut out: Vec<_> = read_jsonl(output)
        .into_iter()
        .map(|line| {
            let choice = &line["response"]["body"]["choices"][0];
            let logprobs = &choice["logprobs"];
            let tokens = logprobs["tokens"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_str().unwrap().to_owned())
                .collect();
            let top = logprobs["top_logprobs"].as_array().unwrap().clone();
            (line["custom_id"].as_str().unwrap().to_owned(), tokens, top)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// Two runs of the same greedy job on code that rounds differently (another
/// backend, other kernels) agree: every line's tokens are equal, or where
/// they part, `b`'s token is a near-tie (within `tie` in log-probability) of
/// the one `a` chose; before that, each token's log-probability differs by
/// at most `tolerance`.
pub fn assert_greedy_agrees(
    (a_name, a): (&str, &Path),
    (b_name, b): (&str, &Path),
    tie: f64,
    tolerance: f64,
) {
    let (a, b) = (greedy_completions(a), greedy_completions(b));
    assert_eq!(
        a.len(),
        b.len(),
        "{a_name} and {b_name} answered different lines"
    );
    for ((id, a_tokens, a_top), (_, b_tokens, b_top)) in a.iter().zip(&b) {
        assert!(
            !a_tokens.is_empty(),
            "{id}: nothing generated with {a_name}"
        );
        let parted = a_tokens.iter().zip(b_tokens).position(|(x, y)| x != y);
        if let Some(at) = parted {
            let top = a_top[at].as_object().unwrap();
            let chosen = top[&a_tokens[at]].as_f64().unwrap();
            let theirs = top.get(&b_tokens[at]).and_then(serde_json::Value::as_f64);
            assert!(
                theirs.is_some_and(|t| chosen - t < tie),
                "{id}: at token {at} {a_name} chose {:?}, {b_name} {:?}, not a near-tie: {top:?}",
                a_tokens[at],
                b_tokens[at]
            );
        }
        for at in 0..parted.unwrap_or(a_tokens.len().min(b_tokens.len())) {
            let mine = a_top[at][&a_tokens[at]].as_f64().unwrap();
            let theirs = b_top[at][&b_tokens[at]].as_f64().unwrap();
            assert!(
                (mine - theirs).abs() <= tolerance,
                "{id}: token {at} ({:?}) has log-probability {mine} with {a_name}, {theirs} with {b_name}",
                a_tokens[at]
            );
        }
    }
}

/// The `response.body` of the output line with `custom_id` (panics if none).
pub fn response_body(outputs: &[serde_json::Value], custom_id: &str) -> serde_json::Value {
    outputs
        .iter()
        .find(|o| o["custom_id"] == custom_id)
        .map(|o| o["response"]["body"].clone())
        .unwrap_or_else(|| panic!("no output line for {custom_id}"))
}

/// The Python interpreter of the environment with the official client
/// packages (`scripts/python-env.sh` makes it; `scripts/test.sh` passes it
/// as `CORTEX_TEST_PYTHON`).
pub fn python() -> PathBuf {
    let python = std::env::var_os("CORTEX_TEST_PYTHON").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/python-env/bin/python"),
        PathBuf::from,
    );
    assert!(
        python.is_file(),
        "{} is missing: run `bash scripts/python-env.sh` (scripts/test.sh does) first",
        python.display()
    );
    python
}

/// Runs one of the Python checks in `tests/python/` with `args`; panics
/// with its output unless it succeeds. Returns what it printed.
pub fn python_check(script: &str, args: &[&Path]) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("python")
        .join(script);
    let output = Command::new(python())
        .arg(&path)
        .args(args)
        .output()
        .expect("run python");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{script} failed:\n{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}
