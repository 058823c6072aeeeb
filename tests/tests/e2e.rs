//! The whole product through the `cortex` binary and the real model: a job
//! from submit to export, kill -9 at random moments, two workers, cancel and
//! resume, SIGTERM, and the user's mistakes. Each test takes the model in
//! turn (two cores run one generating worker well, not several tests' worth).

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use cortex_queue::{ItemState, JobState};
use cortex_tests::{Cortex, prompts, read_jsonl};

static TURN: Mutex<()> = Mutex::new(());

fn turn() -> std::sync::MutexGuard<'static, ()> {
    TURN.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Exports job 1 and checks it holds every item exactly once, in input order.
fn assert_complete_export(cortex: &Cortex, items: usize) -> Vec<serde_json::Value> {
    cortex.ok(&["results", "1", "-o", "out.jsonl", "--errors", "err.jsonl"]);
    let lines = read_jsonl(&cortex.dir().join("out.jsonl"));
    let ids: Vec<String> = lines
        .iter()
        .map(|l| l["custom_id"].as_str().unwrap().to_owned())
        .collect();
    let expected: Vec<String> = (0..items).map(|i| format!("item-{i:04}")).collect();
    assert_eq!(ids, expected, "every custom_id once, in input order");
    assert!(read_jsonl(&cortex.dir().join("err.jsonl")).is_empty());
    lines
}

#[test]
fn a_200_item_job_runs_from_submit_to_a_well_formed_export() {
    let _turn = turn();
    let cortex = Cortex::new();
    cortex.write("p.jsonl", &prompts(200, 8));
    assert_eq!(cortex.ok(&["submit", "p.jsonl"]).trim(), "1");
    cortex.ok(&["worker", "--parallel", "16"]);
    let lines = assert_complete_export(&cortex, 200);
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(line["response"]["status_code"], 200);
        assert_eq!(line["error"], serde_json::Value::Null);
        let body = &line["response"]["body"];
        let expected = if i % 2 == 0 {
            "chat.completion"
        } else {
            "text_completion"
        };
        assert_eq!(body["object"], expected, "{line}");
        let choice = &body["choices"][0];
        let text = if i % 2 == 0 {
            &choice["message"]["content"]
        } else {
            &choice["text"]
        };
        assert!(text.is_string(), "{line}");
        assert!(
            ["stop", "length"].contains(&choice["finish_reason"].as_str().unwrap()),
            "{line}"
        );
        let usage = &body["usage"];
        let (prompt, completion) = (
            usage["prompt_tokens"].as_u64().unwrap(),
            usage["completion_tokens"].as_u64().unwrap(),
        );
        assert!(prompt > 0 && (1..=8).contains(&completion), "{usage}");
        assert_eq!(usage["total_tokens"].as_u64().unwrap(), prompt + completion);
    }
    let job = cortex.job(1);
    assert_eq!(
        (job.state, job.counts.completed),
        (JobState::Completed, 200)
    );
    assert!(cortex.items(1).iter().all(|i| i.attempts == 1));
}

#[test]
fn kill_9_at_random_moments_loses_nothing_and_redoes_nothing_finished() {
    let _turn = turn();
    let cortex = Cortex::new();
    cortex.write("p.jsonl", &prompts(200, 16));
    // A kill costs every in-flight item an attempt and the next worker takes
    // those first; allow more attempts than kills.
    cortex.ok(&["submit", "p.jsonl", "--max-attempts", "30"]);

    // Items finished before each kill, with their attempt count and result time.
    let mut finished_before: BTreeMap<i64, (u32, Option<i64>)> = BTreeMap::new();
    let mut kills = 0;
    let mut seed = 0x2545_f491_u64;
    while kills < 12 {
        let done_before = cortex.job(1).counts.completed;
        let mut worker = cortex.spawn(&["worker", "--parallel", "8"]);
        // A pseudo-random moment after the worker made some progress.
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let progress = 1 + seed % 4;
        let job = cortex.wait_for(1, Duration::from_secs(120), "progress", |j| {
            j.counts.completed >= done_before + progress || j.state.is_terminal()
        });
        std::thread::sleep(Duration::from_millis(seed % 300));
        if job.state.is_terminal() {
            worker.wait().unwrap();
            break;
        }
        worker.kill().unwrap();
        worker.wait().unwrap();
        kills += 1;
        for item in cortex.items(1) {
            if item.state == ItemState::Completed {
                finished_before
                    .entry(item.id.0)
                    .or_insert((item.attempts, item.completed_at));
            }
        }
    }
    assert!(kills >= 10, "only {kills} kills before the job ended");
    cortex.ok(&["worker", "--parallel", "8"]);

    assert_complete_export(&cortex, 200);
    let items = cortex.items(1);
    assert!(items.iter().all(|i| i.state == ItemState::Completed));
    for item in items {
        if let Some(before) = finished_before.get(&item.id.0) {
            assert_eq!(
                *before,
                (item.attempts, item.completed_at),
                "item {} was generated again",
                item.custom_id
            );
        }
    }
    cortex.store().integrity_check().unwrap();
}

#[test]
fn two_workers_finish_one_job_together_without_doing_an_item_twice() {
    let _turn = turn();
    let cortex = Cortex::new();
    cortex.write("p.jsonl", &prompts(60, 8));
    cortex.ok(&["submit", "p.jsonl"]);
    let workers = [
        cortex.spawn(&["--threads", "1", "worker", "--parallel", "4"]),
        cortex.spawn(&["--threads", "1", "worker", "--parallel", "4"]),
    ];
    let mut done_by = Vec::new();
    for worker in workers {
        let output = worker.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{stderr}");
        let done: u64 = stderr
            .split("worker done: ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no summary in {stderr}"));
        done_by.push(done);
    }
    assert_eq!(done_by.iter().sum::<u64>(), 60, "{done_by:?}");
    assert!(
        done_by.iter().all(|&n| n > 0),
        "both workers took part: {done_by:?}"
    );
    assert_complete_export(&cortex, 60);
    assert!(
        cortex.items(1).iter().all(|i| i.attempts == 1),
        "no item was claimed twice"
    );
}

#[test]
fn cancel_mid_job_then_resume_keeps_finished_results_and_completes_the_rest() {
    let _turn = turn();
    let cortex = Cortex::new();
    cortex.write("p.jsonl", &prompts(80, 16));
    cortex.ok(&["submit", "p.jsonl"]);
    let worker = cortex.spawn(&["worker", "--parallel", "8"]);
    cortex.wait_for(1, Duration::from_secs(120), "10 results", |j| {
        j.counts.completed >= 10
    });
    cortex.ok(&["cancel", "1"]);
    // The worker hears of it at its next heartbeat and exits once nothing is left.
    let output = worker.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let cancelled = cortex.job(1);
    assert_eq!(cancelled.state, JobState::Cancelled);
    assert!(cancelled.counts.cancelled > 0 && cancelled.counts.completed >= 10);
    let kept: BTreeMap<_, _> = cortex
        .items(1)
        .into_iter()
        .filter(|i| i.state == ItemState::Completed)
        .map(|i| (i.id, (i.attempts, i.completed_at)))
        .collect();

    let resumed = cortex.ok(&["resume", "1"]);
    assert!(resumed.contains("now in_progress"), "{resumed}");
    cortex.ok(&["worker", "--parallel", "8"]);
    assert_complete_export(&cortex, 80);
    for item in cortex.items(1) {
        if let Some(before) = kept.get(&item.id) {
            assert_eq!(
                *before,
                (item.attempts, item.completed_at),
                "a finished result was redone"
            );
        }
    }
}

#[test]
fn sigterm_stops_a_worker_within_seconds_and_its_items_are_pending_again() {
    let _turn = turn();
    let cortex = Cortex::new();
    cortex.write("p.jsonl", &prompts(60, 200));
    cortex.ok(&["submit", "p.jsonl"]);
    let worker = cortex.spawn(&["worker", "--parallel", "8"]);
    cortex.wait_for(1, Duration::from_secs(120), "items running", |j| {
        j.counts.running > 0
    });
    std::thread::sleep(Duration::from_millis(500));
    let signalled = Instant::now();
    assert!(
        Command::new("kill")
            .args(["-TERM", &worker.id().to_string()])
            .status()
            .unwrap()
            .success()
    );
    let output = worker.wait_with_output().unwrap();
    let took = signalled.elapsed();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        took < Duration::from_secs(10),
        "the worker took {took:?} to stop"
    );
    let job = cortex.job(1);
    assert_eq!(job.counts.running, 0, "nothing is left stuck under a lease");
    assert!(job.counts.pending > 0);
    assert_eq!(job.state, JobState::InProgress);
    // Released items did not use up an attempt.
    assert!(
        cortex
            .items(1)
            .iter()
            .filter(|i| i.state == ItemState::Pending)
            .all(|i| i.attempts == 0)
    );
}

#[test]
fn a_users_mistakes_are_one_line_errors_and_lose_nothing() {
    let _turn = turn();
    let cortex = Cortex::new();
    cortex.write("p.jsonl", &prompts(4, 4));
    cortex.ok(&["submit", "p.jsonl"]);
    cortex.ok(&["worker"]);
    let before = assert_complete_export(&cortex, 4);

    cortex.write("empty.jsonl", "");
    cortex.write("bad.jsonl", "{\"prompt\": \"ok\"}\n{\"prompt\": \"\"}\n");
    cortex.write("corrupt.gguf", "GGUF but not really a model");
    cortex.write("second.jsonl", &prompts(2, 4));
    cortex.ok(&["submit", "second.jsonl"]);
    let cases: [(&[&str], i32, &str); 8] = [
        (
            &["submit", "missing.jsonl"],
            1,
            "missing.jsonl: No such file or directory",
        ),
        (
            &["submit", "empty.jsonl"],
            3,
            "empty.jsonl: no requests in the file",
        ),
        (&["submit", "bad.jsonl"], 3, "line 2: prompt is empty"),
        (&["status", "42"], 4, "no job 42"),
        (&["results", "2"], 5, "job 2 is in_progress"),
        (
            &["--model", "missing.gguf", "worker"],
            1,
            "missing.gguf: No such file or directory",
        ),
        (&["--model", "corrupt.gguf", "worker"], 1, "corrupt.gguf"),
        (
            &["--db", "/proc/no/such/dir/cortex.db", "list"],
            1,
            "cannot open the job database /proc/no/such/dir/cortex.db",
        ),
    ];
    for (args, code, message) in cases {
        let output = cortex.run(args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(code), "{args:?}: {stderr}");
        assert!(
            stderr.starts_with("error: ") && stderr.contains(message),
            "{args:?}: {stderr}"
        );
        let lines = stderr.lines().count();
        let expected_lines = if args == ["submit", "bad.jsonl"] {
            2
        } else {
            1
        };
        assert_eq!(lines, expected_lines, "{args:?}: {stderr}");
    }
    // Nothing that was accepted is gone.
    assert_eq!(assert_complete_export(&cortex, 4), before);
    let jobs: BTreeSet<_> = cortex
        .store()
        .jobs(&Default::default())
        .unwrap()
        .iter()
        .map(|j| j.id.0)
        .collect();
    assert_eq!(jobs, BTreeSet::from([1, 2]));
}
