//! `cortex serve` through the real binary, the real model and the official
//! clients: the `openai` and `ollama` Python packages unmodified, `/metrics`
//! read by `prometheus_client`'s parser (`tests/python/serve_clients.py`);
//! body limits; kill -9 of the server during a batch and a restart; SIGTERM
//! releasing claimed items; 64 streams beside a running batch. Each test
//! takes the model in turn.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use cortex_queue::{ItemState, JobState};
use cortex_tests::{Cortex, Server, prompts, python_check, read_jsonl};

static TURN: Mutex<()> = Mutex::new(());

fn turn() -> std::sync::MutexGuard<'static, ()> {
    TURN.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

const KEY: &str = "test-key-0123";

#[test]
fn the_official_clients_work_against_cortex_serve() {
    let _turn = turn();
    let cortex = Cortex::new();
    // A job submitted by the CLI before the server starts: the server works
    // it, and it is listed as a batch.
    cortex.write("cli.jsonl", &prompts(4, 4));
    cortex.ok(&["submit", "cli.jsonl"]);
    let server = Server::start(&cortex, &["--api-key", KEY, "--parallel", "8"]);
    cortex.wait_for(1, Duration::from_secs(120), "the CLI job", |j| {
        j.state == JobState::Completed
    });

    // A body over the limit is refused from its Content-Length, before it is read.
    let mut stream = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    write!(
        stream,
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        64 << 20
    )
    .unwrap();
    let mut head = [0u8; 4096];
    let n = stream.read(&mut head).unwrap();
    let answer = String::from_utf8_lossy(&head[..n]);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("over the size limit"), "{answer}");

    let printed = python_check(
        "serve_clients.py",
        &[
            std::path::Path::new(&server.url()),
            std::path::Path::new(KEY),
            cortex.dir(),
        ],
    );
    println!("{printed}");
    assert!(printed.contains("ALL CHECKS PASSED"), "{printed}");
}

#[test]
fn a_server_killed_during_a_batch_finishes_it_after_a_restart() {
    let _turn = turn();
    let cortex = Cortex::new();
    cortex.write("p.jsonl", &prompts(60, 24));
    cortex.ok(&["submit", "p.jsonl"]);
    let server = Server::start(&cortex, &["--parallel", "8"]);
    cortex.wait_for(1, Duration::from_secs(120), "some results", |j| {
        j.counts.completed >= 10
    });
    server.signal("KILL");
    drop(server);
    let before: Vec<_> = cortex
        .items(1)
        .into_iter()
        .filter(|i| i.state == ItemState::Completed)
        .collect();
    assert!(before.len() < 60, "the kill came too late to test anything");
    let server = Server::start(&cortex, &["--parallel", "8"]);
    let job = cortex.wait_for(1, Duration::from_secs(300), "the job", |j| {
        j.state.is_terminal()
    });
    drop(server);
    assert_eq!(job.state, JobState::Completed, "{job:?}");
    assert_eq!(job.counts.completed, 60);
    let after = cortex.items(1);
    for item in &before {
        let now = after.iter().find(|i| i.id == item.id).unwrap();
        assert_eq!(
            (now.attempts, now.completed_at),
            (item.attempts, item.completed_at),
            "a finished item was redone"
        );
    }
    assert!(after.iter().all(|i| i.attempts <= 2), "{after:?}");
    cortex.ok(&["results", "1", "-o", "out.jsonl"]);
    let ids: Vec<String> = read_jsonl(&cortex.dir().join("out.jsonl"))
        .iter()
        .map(|l| l["custom_id"].as_str().unwrap().to_owned())
        .collect();
    let expected: Vec<String> = (0..60).map(|i| format!("item-{i:04}")).collect();
    assert_eq!(ids, expected, "every item once, in input order");
}

#[test]
fn sigterm_stops_the_server_and_releases_its_claimed_items() {
    let _turn = turn();
    let cortex = Cortex::new();
    cortex.write("p.jsonl", &prompts(60, 200));
    cortex.ok(&["submit", "p.jsonl"]);
    let mut server = Server::start(&cortex, &["--parallel", "8"]);
    cortex.wait_for(1, Duration::from_secs(120), "items running", |j| {
        j.counts.running > 0
    });
    let signalled = Instant::now();
    server.signal("TERM");
    let status = server.child.wait().unwrap();
    let took = signalled.elapsed();
    let mut stderr = String::new();
    if let Some(mut e) = server.child.stderr.take() {
        let _ = e.read_to_string(&mut stderr);
    }
    assert!(status.success(), "{status}: {stderr}");
    assert!(
        stderr.contains(&format!("dashboard: {}/", server.url())),
        "it says where its dashboard is: {stderr}"
    );
    assert!(
        took < Duration::from_secs(10),
        "the server took {took:?} to stop"
    );
    let job = cortex.job(1);
    assert_eq!(job.counts.running, 0, "nothing is left under a lease");
    assert!(job.counts.pending > 0);
    assert!(
        cortex
            .items(1)
            .iter()
            .filter(|i| i.state == ItemState::Pending)
            .all(|i| i.attempts == 0),
        "released items keep their attempts"
    );
}

#[test]
fn sixty_four_streams_beside_a_running_batch_all_complete() {
    let _turn = turn();
    let cortex = Cortex::new();
    cortex.write("p.jsonl", &prompts(400, 48));
    cortex.ok(&["submit", "p.jsonl"]);
    let server = Server::start(&cortex, &["--parallel", "64"]);
    cortex.wait_for(1, Duration::from_secs(120), "the batch running", |j| {
        j.counts.completed > 0
    });
    let before = cortex.job(1).counts.completed;
    let printed = python_check(
        "serve_load.py",
        &[
            std::path::Path::new(&server.url()),
            std::path::Path::new("64"),
            std::path::Path::new("32"),
        ],
    );
    println!("{printed}");
    let after = cortex.job(1).counts.completed;
    assert!(
        after > before,
        "the batch made no progress while the streams ran"
    );
    println!(
        "batch items completed while the streams ran: {}",
        after - before
    );
}
