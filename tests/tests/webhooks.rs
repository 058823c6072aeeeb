//! Webhooks from the real binary to a receiver that checks them with the
//! `standardwebhooks` package: signed as OpenAI signs its webhooks,
//! retried with backoff until the receiver takes them, and delivered even
//! when the worker is killed right after the job ends.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use cortex_queue::JobId;

use cortex_tests::{Cortex, Server, free_port, prompts, python, python_check, read_jsonl};

/// A key in the Standard Webhooks form.
const SECRET: &str = "whsec_Y29ydGV4LXRlc3Qtd2ViaG9vay1zZWNyZXQta2V5";

/// The receiver (tests/python/webhook_receiver.py), killed when dropped.
struct Receiver {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Receiver {
    /// Starts one that answers 500 to the first `fail_first` attempts of each event.
    fn start(dir: &Path, fail_first: u32) -> Self {
        Self::start_on(dir, fail_first, 0)
    }

    /// [`Receiver::start`] on `port` (0: a free one).
    fn start_on(dir: &Path, fail_first: u32, port: u16) -> Self {
        let (port_file, log) = (dir.join("receiver.port"), dir.join("receiver.jsonl"));
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/webhook_receiver.py");
        let child = Command::new(python())
            .arg(script)
            .args([
                SECRET,
                &port_file.display().to_string(),
                &log.display().to_string(),
            ])
            .arg(fail_first.to_string())
            .arg(port.to_string())
            .spawn()
            .expect("start the receiver");
        let started = Instant::now();
        let port = loop {
            if let Ok(text) = std::fs::read_to_string(&port_file) {
                break text.trim().parse().expect("a port");
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the receiver did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        Self { child, port, log }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/hook", self.port)
    }

    /// Every attempt it saw.
    fn attempts(&self) -> Vec<serde_json::Value> {
        if self.log.exists() {
            read_jsonl(&self.log)
        } else {
            Vec::new()
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn with_secret() -> Cortex {
    let mut cortex = Cortex::new();
    cortex.set_env("CORTEX_WEBHOOK_SECRET", SECRET);
    cortex
}

#[test]
fn a_job_end_is_signed_retried_after_failures_and_delivered() {
    let cortex = with_secret();
    let receiver = Receiver::start(cortex.dir(), 2);
    cortex.write("p.jsonl", &prompts(4, 4));
    cortex.ok(&["run", "p.jsonl", "--notify", &receiver.url()]);
    // `run` waits for the retries (1 s, then 2 s) before it exits.
    let attempts = receiver.attempts();
    assert_eq!(attempts.len(), 3, "{attempts:?}");
    let statuses: Vec<u64> = attempts
        .iter()
        .map(|a| a["status"].as_u64().unwrap())
        .collect();
    assert_eq!(statuses, [500, 500, 200]);
    for attempt in &attempts {
        assert_eq!(attempt["verified"], true, "{attempt}");
        assert_eq!(attempt["id"], attempts[0]["id"], "one id across retries");
        let event = &attempt["event"];
        assert_eq!(event["object"], "event");
        assert_eq!(event["type"], "batch.completed");
        assert_eq!(event["data"]["id"], "batch_1");
    }
    let events = cortex.store().webhooks(JobId(1)).unwrap();
    assert_eq!(events.len(), 1);
    assert!(events[0].delivered_at.is_some(), "{events:?}");
    assert_eq!(events[0].attempts, 3);
}

#[test]
fn a_worker_killed_right_after_the_job_ends_leaves_the_event_for_the_next() {
    let cortex = with_secret();
    // No receiver yet: whatever the dying worker might send in the instant
    // between the job's end and its death finds nobody.
    let port = free_port();
    cortex.write("p.jsonl", &prompts(1, 4));
    let url = format!("http://127.0.0.1:{port}/hook");
    cortex.ok(&["submit", "p.jsonl", "--notify", &url]);
    // The job's only result commits, ending the job, and the worker dies.
    cortex.killed_at(&["worker"], "complete:committed@1");
    assert_eq!(cortex.job(1).state, cortex_queue::JobState::Completed);
    let pending = cortex.store().webhooks(JobId(1)).unwrap();
    assert_eq!((pending.len(), pending[0].delivered_at), (1, None));

    // The next worker, with nothing left to generate, delivers it.
    let receiver = Receiver::start_on(cortex.dir(), 0, port);
    cortex.ok(&["worker"]);
    let attempts = receiver.attempts();
    assert_eq!(attempts.len(), 1, "{attempts:?}");
    assert_eq!(attempts[0]["verified"], true);
    assert_eq!(attempts[0]["event"]["type"], "batch.completed");
}

/// A job that carries its destination is announced only once its results
/// are written: while the write fails, the event waits.
#[test]
fn the_end_is_announced_after_the_results_are_written() {
    let cortex = with_secret();
    let receiver = Receiver::start(cortex.dir(), 0);
    cortex.write("p.jsonl", &prompts(1, 4));
    // A folder that is not there yet: the write fails until it is.
    cortex.ok(&[
        "submit",
        "p.jsonl",
        "--notify",
        &receiver.url(),
        "--output",
        "later/out.jsonl",
    ]);
    cortex.ok(&["worker"]);
    assert_eq!(cortex.job(1).state, cortex_queue::JobState::Completed);
    assert!(
        receiver.attempts().is_empty(),
        "announced before the results were written"
    );
    let waiting = cortex.store().webhooks(JobId(1)).unwrap();
    assert!(
        waiting.iter().all(|e| e.delivered_at.is_none()),
        "{waiting:?}"
    );

    // Once the folder is there, a worker's next attempt (after the backoff
    // the failures earned) writes the results, then announces the end.
    std::fs::create_dir(cortex.dir().join("later")).unwrap();
    let output = cortex.dir().join("later/out.jsonl");
    let mut worker = cortex.spawn(&["worker", "--follow"]);
    let started = Instant::now();
    while receiver.attempts().is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "never announced"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    cortex_tests::signal(worker.id(), "TERM");
    worker.wait().unwrap();
    assert_eq!(read_jsonl(&output).len(), 1);
    let attempts = receiver.attempts();
    assert_eq!(attempts.len(), 1, "{attempts:?}");
    assert_eq!(attempts[0]["event"]["type"], "batch.completed");
    let rows = cortex.store().webhooks(JobId(1)).unwrap();
    let delivered = |kind: &str| {
        rows.iter()
            .find(|e| e.kind == kind)
            .and_then(|e| e.delivered_at)
            .unwrap_or_else(|| panic!("{kind} not done: {rows:?}"))
    };
    assert!(delivered(cortex_queue::EXPORT_EVENT) <= delivered("batch.completed"));
}

/// Batches created through the Batch API announce their end at the
/// server's webhook_url, signed with its secret.
#[test]
fn the_server_announces_the_end_of_its_batches() {
    let cortex = with_secret();
    let receiver = Receiver::start(cortex.dir(), 0);
    let server = Server::start(
        &cortex,
        &["--webhook-url", &receiver.url(), "--parallel", "4"],
    );
    let lines: String = (0..3)
        .map(|i| {
            format!(
                "{}\n",
                serde_json::json!({"custom_id": format!("b-{i}"), "method": "POST", "url": "/v1/chat/completions",
                                   "body": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}})
            )
        })
        .collect();
    let input = cortex.write("batch.jsonl", &lines);
    let printed = python_check("webhook_batch.py", &[Path::new(&server.url()), &input]);
    let batch = printed.trim().to_owned();
    let started = Instant::now();
    let attempts = loop {
        let attempts = receiver.attempts();
        if !attempts.is_empty() {
            break attempts;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no event for {batch}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(attempts[0]["verified"], true, "{attempts:?}");
    assert_eq!(attempts[0]["event"]["type"], "batch.completed");
    assert_eq!(attempts[0]["event"]["data"]["id"], batch.as_str());
}

#[test]
fn a_notify_url_must_be_http() {
    let cortex = Cortex::new();
    cortex.write("p.jsonl", &prompts(1, 4));
    cortex.refused(
        &["submit", "p.jsonl", "--notify", "ftp://example/hook"],
        &["--notify", "expected an http:// or https:// URL"],
    );
    cortex.refused(
        &["--webhook-secret", "nope!", "config"],
        &["webhook-secret", "whsec_"],
    );
}
