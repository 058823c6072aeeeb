//! The queue on PostgreSQL with real worker processes and the real model:
//! workers on several hosts (distinct host identities on loopback) sharing a
//! job, a stopped worker whose lease ran out, and the database server
//! restarted under a running job. (kill -9 at random moments on PostgreSQL
//! is in `e2e.rs`, beside the same test on SQLite.) Skipped without a test
//! server (`CORTEX_TEST_POSTGRES`); `scripts/test.sh` starts one.

use std::collections::BTreeSet;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use cortex_queue::{ItemState, JobState};
use cortex_queue_postgres::PgStore;
use cortex_tests::{Cortex, prompts, read_jsonl, wait_for_workers, worker_done};

static TURN: Mutex<()> = Mutex::new(());

fn turn() -> std::sync::MutexGuard<'static, ()> {
    TURN.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A worker process that claims as host `host`.
fn worker_on(cortex: &Cortex, host: &str, args: &[&str]) -> Child {
    cortex
        .command(args)
        .env("CORTEX_HOST_ID", host)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start a worker")
}

fn signal(child: &Child, name: &str) {
    let status = Command::new("kill")
        .args([format!("-{name}"), child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -{name}");
}

/// Exports job 1 and checks every item is there once, in input order.
fn assert_each_item_once(cortex: &Cortex, items: usize) {
    cortex.ok(&["results", "1", "-o", "out.jsonl", "--errors", "err.jsonl"]);
    let ids: Vec<String> = read_jsonl(&cortex.dir().join("out.jsonl"))
        .iter()
        .map(|l| l["custom_id"].as_str().unwrap().to_owned())
        .collect();
    let expected: Vec<String> = (0..items).map(|i| format!("item-{i:04}")).collect();
    assert_eq!(ids, expected, "every custom_id once, in input order");
    assert!(read_jsonl(&cortex.dir().join("err.jsonl")).is_empty());
    cortex.check_store();
}

#[test]
fn four_workers_on_four_hosts_finish_one_job_and_no_item_runs_twice() {
    let _turn = turn();
    let Some(cortex) = Cortex::on_postgres("hosts") else {
        return;
    };
    cortex.write("p.jsonl", &prompts(400, 4));
    cortex.ok(&["submit", "p.jsonl"]);
    let hosts = ["gpu-host-a", "gpu-host-b", "gpu-host-c", "gpu-host-d"];
    let workers: Vec<Child> = hosts
        .iter()
        .map(|host| {
            worker_on(
                &cortex,
                host,
                &["--threads", "1", "worker", "--parallel", "8"],
            )
        })
        .collect();
    // Each registers under its own host identity.
    let mut store = PgStore::connect(cortex.postgres_url().unwrap()).unwrap();
    let mut seen = BTreeSet::new();
    let started = Instant::now();
    while seen.len() < hosts.len() && started.elapsed() < Duration::from_secs(120) {
        for (host, _, _) in store.workers().unwrap() {
            seen.insert(host);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let done_by = wait_for_workers(workers);
    println!("four hosts: items done per worker {done_by:?}");
    assert_eq!(
        seen,
        hosts
            .iter()
            .map(|h| (*h).to_owned())
            .collect::<BTreeSet<_>>()
    );
    assert_eq!(done_by.iter().sum::<u64>(), 400, "{done_by:?}");
    assert_each_item_once(&cortex, 400);
    let items = cortex.items(1);
    assert!(
        items
            .iter()
            .all(|i| i.state == ItemState::Completed && i.attempts == 1),
        "no item was claimed twice"
    );
    assert!(store.workers().unwrap().is_empty(), "workers unregister");
}

#[test]
fn a_stopped_worker_cannot_write_after_its_lease_and_workers_ride_out_a_database_restart() {
    let _turn = turn();
    let Some(cortex) = Cortex::on_postgres("zombie") else {
        return;
    };
    let items = 60;
    cortex.write("p.jsonl", &prompts(items, 24));
    cortex.ok(&["submit", "p.jsonl"]);
    // Leases of 3 s (the harness's setting): the zombie loses its items soon.
    let mut zombie = worker_on(
        &cortex,
        "host-zombie",
        &["--threads", "1", "worker", "--parallel", "8"],
    );
    cortex.wait_for(1, Duration::from_secs(120), "items running", |job| {
        job.counts.running > 0
    });
    signal(&zombie, "STOP");
    let stopped_at = Instant::now();
    let held: Vec<i64> = cortex
        .items(1)
        .iter()
        .filter(|i| i.state == ItemState::Running)
        .map(|i| i.id.0)
        .collect();
    assert!(!held.is_empty());

    std::thread::sleep(Duration::from_secs(4));
    let rescuer = worker_on(
        &cortex,
        "host-rescuer",
        &["--threads", "1", "worker", "--parallel", "8"],
    );
    // Some items done by the rescuer, then the database goes down and up.
    cortex.wait_for(1, Duration::from_secs(120), "progress", |job| {
        job.counts.completed >= 10
    });
    if let Ok(dir) = std::env::var("CORTEX_TEST_POSTGRES_DIR") {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/postgres.sh");
        let status = Command::new("bash")
            .args([script, "restart", &dir])
            .status()
            .unwrap();
        assert!(status.success(), "restart PostgreSQL");
        println!("PostgreSQL restarted mid-job");
    } else {
        println!("CORTEX_TEST_POSTGRES_DIR not set: the restart part is skipped");
    }
    let rescued = rescuer.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&rescued.stderr);
    assert!(rescued.status.success(), "{stderr}");
    let job = cortex.job(1);
    assert_eq!(job.state, JobState::Completed, "{job:?}");
    let before: Vec<_> = cortex
        .items(1)
        .iter()
        .map(|i| (i.id, i.attempts, i.completed_at))
        .collect();

    // The zombie wakes: its leases are gone; whatever it finishes is refused.
    signal(&zombie, "CONT");
    let status = zombie.wait().unwrap();
    println!(
        "zombie stopped {:.0} s holding {} items; exit {status}",
        stopped_at.elapsed().as_secs_f64(),
        held.len()
    );
    let after: Vec<_> = cortex
        .items(1)
        .iter()
        .map(|i| (i.id, i.attempts, i.completed_at))
        .collect();
    assert_eq!(before, after, "nothing was written after the lease ran out");
    assert_each_item_once(&cortex, items);
    assert!(
        worker_done(&stderr).unwrap_or(0) as usize >= held.len(),
        "the rescuer did the zombie's items: {stderr}"
    );
}
