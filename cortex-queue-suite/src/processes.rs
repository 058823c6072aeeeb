//! Several worker processes against one queue: concurrency, kill -9 at
//! chosen points (failpoints), a stopped zombie worker, and dead-worker reclaim.
//!
//! The workers are the driver's test binary run again with `CHILD_ROLE` set:
//! the `child_process_entry` test that [`queue_suite!`](crate::queue_suite)
//! adds at the binary's root calls [`child_process_entry`] and does nothing
//! in a normal run.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use crate::{DriverUnderTest, response_for, submit_prompts, write_prompts};
use cortex_openai::{ExportJsonl, SubmitJsonl};
use cortex_queue::{
    ClaimOptions, ItemState, JobId, JobState, LeaseStatus, Queue, QueueError, SubmitOptions,
};

const ROLE: &str = "CHILD_ROLE";
const DB: &str = "CHILD_DB";
const LEASE_MS: &str = "CHILD_LEASE_MS";

fn env_ms(name: &str, default: u64) -> Duration {
    Duration::from_millis(
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default),
    )
}

/// Entry point of the child processes, which open the queue with `open`;
/// a no-op when run as a normal test.
pub fn child_process_entry(open: fn(&str) -> Box<dyn Queue>) {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let mut store = open(&std::env::var(DB).unwrap());
    let options = ClaimOptions {
        lease: env_ms(LEASE_MS, 60_000),
        ..ClaimOptions::default()
    };
    match role.as_str() {
        "worker" => run_worker(store.as_mut(), &options),
        "hold" => {
            // Claim some items, say so, and hang until killed.
            let claimed = store.claim(5, &options).unwrap();
            println!("claimed {}", claimed.len());
            sleep(Duration::from_secs(600));
        }
        "zombie" => {
            let claimed = store.claim(1, &options).unwrap().remove(0);
            println!("claimed {} {}", claimed.lease.item, claimed.lease.token);
            // The parent stops this process here for longer than the lease.
            sleep(Duration::from_millis(300));
            let heartbeat = store.heartbeat(&[claimed.lease], options.lease).unwrap();
            let mut zombie_answer = response_for(&claimed);
            zombie_answer.completions[0].text = "stale zombie answer".into();
            let complete = store.complete(&claimed.lease, &zombie_answer);
            println!(
                "heartbeat {heartbeat:?} complete {}",
                complete.as_ref().map_or_else(QueueError::code, |()| "ok")
            );
            let refused = heartbeat == [LeaseStatus::Lost]
                && matches!(complete, Err(QueueError::LeaseLost { .. }));
            std::process::exit(if refused { 0 } else { 3 });
        }
        other => panic!("unknown child role {other}"),
    }
}

/// Claims in batches, "generates" for a moment, heartbeats, completes; exits
/// when no job has anything left to claim or run.
fn run_worker(store: &mut dyn Queue, options: &ClaimOptions) {
    let mut done = 0;
    loop {
        let claimed = store.claim(8, options).unwrap();
        if claimed.is_empty() {
            let busy = store
                .jobs(&Default::default())
                .unwrap()
                .iter()
                .any(|j| !j.state.is_terminal());
            if !busy {
                break;
            }
            sleep(Duration::from_millis(20));
            continue;
        }
        let leases: Vec<_> = claimed.iter().map(|c| c.lease).collect();
        sleep(Duration::from_millis(2));
        let statuses = store.heartbeat(&leases, options.lease).unwrap();
        for (item, status) in claimed.iter().zip(statuses) {
            if matches!(status, LeaseStatus::Held { .. }) {
                store.complete(&item.lease, &response_for(item)).unwrap();
                done += 1;
            }
        }
    }
    println!("completed {done}");
}

fn spawn(role: &str, db: &str, lease_ms: u64, failpoint: Option<&str>) -> Child {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args([
            "child_process_entry",
            "--exact",
            "--nocapture",
            "--test-threads=1",
            "--quiet",
        ])
        .env(ROLE, role)
        .env(DB, db)
        .env(LEASE_MS, lease_ms.to_string())
        .env_remove("CORTEX_FAILPOINT")
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    if let Some(point) = failpoint {
        command.env("CORTEX_FAILPOINT", point);
    }
    command.spawn().unwrap()
}

/// Reads the child's stdout until a line starting with `prefix`.
fn wait_for_line(child: &mut Child, prefix: &str) -> String {
    let stdout = child.stdout.as_mut().unwrap();
    let mut reader = BufReader::new(stdout);
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            reader.read_line(&mut line).unwrap() > 0,
            "child ended before printing {prefix:?}"
        );
        if line.starts_with(prefix) {
            return line.trim().to_owned();
        }
    }
}

/// Every item of the job has exactly one result, and the export says the same.
fn assert_exactly_one_result_each(
    b: &dyn DriverUnderTest,
    store: &mut dyn Queue,
    job: JobId,
    items: usize,
) {
    let dir = b.scratch();
    let records = store.items(job).unwrap();
    assert_eq!(records.len(), items);
    let unfinished: Vec<_> = records
        .iter()
        .filter(|r| r.state != ItemState::Completed)
        .collect();
    assert!(unfinished.is_empty(), "unfinished items: {unfinished:?}");
    let output = dir.join("out.jsonl");
    let summary = store.export(job, &output, None, false).unwrap();
    assert_eq!(summary.results, items as u64);
    let text = std::fs::read_to_string(&output).unwrap();
    let ids: Vec<String> = text
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["custom_id"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    let unique: BTreeSet<_> = ids.iter().collect();
    assert_eq!(
        (ids.len(), unique.len()),
        (items, items),
        "one output line per item"
    );
    assert_eq!(store.job(job).unwrap().state, JobState::Completed);
    b.check();
}

pub fn four_worker_processes_share_a_job_and_no_item_is_claimed_twice(b: &dyn DriverUnderTest) {
    let dir = b.scratch();
    let db = b.location();
    let mut store = b.open();
    let job = submit_prompts(store.as_mut(), dir, "p.jsonl", 400);

    let children: Vec<Child> = (0..4).map(|_| spawn("worker", &db, 60_000, None)).collect();
    let mut per_worker = Vec::new();
    for mut child in children {
        let line = wait_for_line(&mut child, "completed ");
        assert!(child.wait().unwrap().success());
        per_worker.push(line["completed ".len()..].parse::<usize>().unwrap());
    }
    assert_eq!(per_worker.iter().sum::<usize>(), 400, "{per_worker:?}");
    assert_exactly_one_result_each(b, store.as_mut(), job, 400);
    // With live workers and long leases nothing is ever taken from a live lease.
    assert!(
        store
            .items(job)
            .unwrap()
            .iter()
            .all(|i| i.attempts == 1 && i.lease_token == 1)
    );
}

pub fn kill_9_at_every_failpoint_loses_nothing_and_records_each_result_once(
    b: &dyn DriverUnderTest,
) {
    if !cortex_queue::failpoint::ENABLED {
        panic!(
            "this test build has no failpoints: switch on cortex-queue's `failpoints` feature in the driver's dev-dependencies"
        );
    }
    let dir = b.scratch();
    let db = b.location();
    let mut store = b.open();
    let items = 120;
    // A crash costs the items in flight no attempt (they were not alone), so
    // the default attempts are enough however many crashes there are.
    let options = SubmitOptions::new("m");
    let job = store
        .submit_file(&write_prompts(dir, "p.jsonl", items), &options)
        .unwrap()
        .job;

    // Each crash leaves leases held by a dead process; with a 10-minute lease
    // only the dead-worker reclaim lets the next worker go on.
    let crashes = [
        "claim@2",
        "complete:written@3",
        "complete:committed@2",
        "claim@1",
        "complete:written@1",
        "complete:committed@5",
    ];
    let mut committed_before_kill = BTreeMap::new();
    for point in crashes {
        let before: BTreeMap<_, _> = store
            .items(job)
            .unwrap()
            .into_iter()
            .map(|i| (i.id, i))
            .collect();
        let mut child = spawn("worker", &db, 600_000, Some(point));
        let status = child.wait().unwrap();
        assert_eq!(
            status.signal(),
            Some(9),
            "{point}: the child must die by SIGKILL, got {status:?}"
        );
        b.check();
        for item in store.items(job).unwrap() {
            if item.state == ItemState::Completed && before[&item.id].state != ItemState::Completed
            {
                committed_before_kill.insert(item.id, item.attempts);
            }
        }
    }
    assert!(!committed_before_kill.is_empty());

    let started = Instant::now();
    let mut child = spawn("worker", &db, 600_000, None);
    wait_for_line(&mut child, "completed ");
    assert!(child.wait().unwrap().success());
    assert!(
        started.elapsed() < Duration::from_secs(120),
        "items stayed stuck under dead workers' leases"
    );
    assert_exactly_one_result_each(b, store.as_mut(), job, items);

    // Nothing finished before a kill was generated again.
    let after: BTreeMap<_, _> = store
        .items(job)
        .unwrap()
        .into_iter()
        .map(|i| (i.id, i.attempts))
        .collect();
    for (item, attempts) in committed_before_kill {
        assert_eq!(
            after[&item], attempts,
            "item {item} was redone after its result was committed"
        );
    }
}

pub fn a_dead_workers_leases_are_reclaimed_at_once(b: &dyn DriverUnderTest) {
    let dir = b.scratch();
    let db = b.location();
    let mut store = b.open();
    let job = submit_prompts(store.as_mut(), dir, "p.jsonl", 5);
    let mut child = spawn("hold", &db, 600_000, None);
    assert_eq!(wait_for_line(&mut child, "claimed "), "claimed 5");
    // Alive: its 10-minute leases are respected.
    assert!(store.claim(5, &ClaimOptions::default()).unwrap().is_empty());
    child.kill().unwrap();
    child.wait().unwrap();
    // They come back as suspects, in small groups, their attempts given back.
    let mut reclaimed = 0;
    loop {
        let group = store.claim(5, &ClaimOptions::default()).unwrap();
        if group.is_empty() {
            break;
        }
        assert!(group.len() <= 2, "{group:?}");
        for claimed in &group {
            assert_eq!(
                (claimed.attempt, claimed.lease.token, claimed.suspect),
                (1, 2, true)
            );
            store
                .complete(&claimed.lease, &response_for(claimed))
                .unwrap();
        }
        reclaimed += group.len();
    }
    assert_eq!(reclaimed, 5);
    assert_exactly_one_result_each(b, store.as_mut(), job, 5);
}

pub fn a_stopped_zombie_worker_cannot_heartbeat_or_write_its_stale_result(b: &dyn DriverUnderTest) {
    let dir = b.scratch();
    let db = b.location();
    let mut store = b.open();
    let job = submit_prompts(store.as_mut(), dir, "p.jsonl", 1);
    let mut child = spawn("zombie", &db, 300, None);
    wait_for_line(&mut child, "claimed ");
    let pid = child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-STOP", &pid])
            .status()
            .unwrap()
            .success()
    );

    // Its lease runs out while it is stopped (it is alive, so only time frees the item).
    let claimed = loop {
        if let Some(c) = store.claim(1, &ClaimOptions::default()).unwrap().pop() {
            break c;
        }
        sleep(Duration::from_millis(50));
    };
    assert_eq!((claimed.attempt, claimed.suspect), (1, true));
    store
        .complete(&claimed.lease, &response_for(&claimed))
        .unwrap();
    assert!(
        Command::new("kill")
            .args(["-CONT", &pid])
            .status()
            .unwrap()
            .success()
    );

    let report = wait_for_line(&mut child, "heartbeat ");
    let status = child.wait().unwrap();
    assert!(
        status.success(),
        "the zombie's stale writes were not refused: {report}"
    );
    assert_eq!(report, "heartbeat [Lost] complete lease_lost");
    assert_exactly_one_result_each(b, store.as_mut(), job, 1);
    let output = std::fs::read_to_string(dir.join("out.jsonl")).unwrap();
    assert!(output.contains("answer to item-0") && !output.contains("zombie"));
}
