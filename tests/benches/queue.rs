//! Queue overhead: submit rate, claim + complete cost per item, status latency
//! on a big job, database size per item. Prints figures; asserts nothing.
//!
//! `cargo bench -p cortex-tests --bench queue` (CORTEX_BENCH_BIG_JOB sets the big job's size,
//! 1,000,000 by default).

use cortex_queue::{JobStore, WorkerStore};
use cortex_queue_sqlite::{Store, StoreConfig, Synchronous};
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use cortex_openai::{InputReader, SubmitJsonl};
use cortex_queue::{ClaimOptions, JobDefaults, JobId, SubmitOptions};
use cortex_request::{Completion, FinishReason, Response, Timings, Usage};

fn write_input(path: &Path, lines: usize) {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    for i in 0..lines {
        if i % 2 == 0 {
            writeln!(
                out,
                r#"{{"custom_id": "req-{i}", "method": "POST", "url": "/v1/chat/completions", "body": {{"messages": [{{"role": "system", "content": "You are a helpful assistant."}}, {{"role": "user", "content": "Summarise item {i} in one sentence."}}], "max_tokens": 64, "temperature": 0.7}}}}"#
            )
            .unwrap();
        } else {
            writeln!(out, r#"{{"prompt": "Continue the story number {i}:", "max_tokens": 64, "top_p": 0.9, "seed": {i}}}"#).unwrap();
        }
    }
    out.flush().unwrap();
}

fn response(id: cortex_request::RequestId) -> Response {
    Response {
        id,
        completions: vec![Completion {
            index: 0,
            text: "A short generated answer of about a dozen tokens, as a small model writes."
                .into(),
            tokens: vec![1; 16],
            finish_reason: FinishReason::Stop,
            logprobs: None,
            prompt_logprobs: None,
            tool_calls: Vec::new(),
            reasoning: None,
        }],
        usage: Usage {
            prompt_tokens: 24,
            completion_tokens: 16,
            cached_prompt_tokens: 0,
        },
        timings: Timings::default(),
        embeddings: Vec::new(),
    }
}

fn database_bytes(store: &Store) -> u64 {
    let path = store.path();
    let wal = path.with_extension("db-wal");
    [path.to_path_buf(), wal]
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum()
}

fn submit(store: &mut Store, dir: &Path, name: &str, lines: usize) -> (JobId, Duration) {
    let input = dir.join(name);
    write_input(&input, lines);
    let started = Instant::now();
    let job = store
        .submit_file(&input, &SubmitOptions::new("bench"))
        .unwrap()
        .job;
    (job, started.elapsed())
}

/// Claims in batches of `batch` and completes either one transaction per item or one per batch.
fn claim_complete(
    store: &mut Store,
    jobs: Option<JobId>,
    items: usize,
    batch: usize,
    batched_commit: bool,
) -> Duration {
    let options = ClaimOptions {
        jobs: jobs.map(|j| vec![j]),
        ..ClaimOptions::default()
    };
    let started = Instant::now();
    let mut done = 0;
    while done < items {
        let claimed = store.claim(batch, &options).unwrap();
        assert!(!claimed.is_empty(), "ran out of items");
        if batched_commit {
            let responses: Vec<Response> =
                claimed.iter().map(|c| response(c.request.id())).collect();
            let done_now: Vec<_> = claimed
                .iter()
                .zip(&responses)
                .map(|(c, r)| (c.lease, r))
                .collect();
            for outcome in store.complete_many(&done_now).unwrap() {
                outcome.unwrap();
            }
        } else {
            for c in &claimed {
                store.complete(&c.lease, &response(c.request.id())).unwrap();
            }
        }
        done += claimed.len();
    }
    started.elapsed() / u32::try_from(done).unwrap()
}

fn main() {
    let big_job: usize = std::env::var("CORTEX_BENCH_BIG_JOB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let dir =
        tempfile::tempdir_in(std::env::var("CORTEX_BENCH_DIR").unwrap_or_else(|_| ".".into()))
            .unwrap();
    let mut store = Store::open(dir.path().join("bench.db")).unwrap();
    println!(
        "cortex-queue benchmark (synchronous=FULL, WAL; database in {})",
        dir.path().display()
    );

    let input = dir.path().join("parse.jsonl");
    write_input(&input, 100_000);
    let started = Instant::now();
    let reader = std::io::BufReader::new(std::fs::File::open(&input).unwrap());
    let parsed = InputReader::new(reader, JobDefaults::default())
        .filter(|l| matches!(l, Ok(Ok(_))))
        .count();
    let took = started.elapsed();
    println!(
        "parse + validate only, {parsed} lines: {:.0} lines/s",
        parsed as f64 / took.as_secs_f64()
    );

    let (_, took) = submit(&mut store, dir.path(), "100k.jsonl", 100_000);
    println!(
        "submit 100,000 lines: {:.2} s = {:.0} lines/s (target >= 50,000)",
        took.as_secs_f64(),
        100_000.0 / took.as_secs_f64()
    );

    let per_item = claim_complete(&mut store, None, 20_000, 32, false);
    println!(
        "claim (batches of 32) + complete (one commit each): {:.0} us/item",
        per_item.as_secs_f64() * 1e6
    );
    let per_item = claim_complete(&mut store, None, 20_000, 32, true);
    println!(
        "claim (batches of 32) + complete_many (one commit per batch): {:.0} us/item (target <= 200)",
        per_item.as_secs_f64() * 1e6
    );

    let mut relaxed = Store::open_with(
        store.path(),
        StoreConfig {
            synchronous: Synchronous::Normal,
            ..StoreConfig::default()
        },
    )
    .unwrap();
    let per_item = claim_complete(&mut relaxed, None, 20_000, 32, false);
    println!(
        "  the same with synchronous=NORMAL (no fsync per commit): {:.0} us/item",
        per_item.as_secs_f64() * 1e6
    );
    drop(relaxed);

    store.checkpoint().unwrap();
    let before = database_bytes(&store);
    let (big, took) = submit(&mut store, dir.path(), "big.jsonl", big_job);
    println!(
        "submit {big_job} lines: {:.1} s = {:.0} lines/s",
        took.as_secs_f64(),
        big_job as f64 / took.as_secs_f64()
    );
    store.checkpoint().unwrap();
    let per_item_bytes = (database_bytes(&store).saturating_sub(before)) as f64 / big_job as f64;
    // Work part of the big job so its status has a full throughput window to read.
    claim_complete(&mut store, Some(big), 20_000.min(big_job / 2), 32, true);

    let mut latencies: Vec<Duration> = (0..50)
        .map(|_| {
            let started = Instant::now();
            let status = store.status(big).unwrap();
            assert_eq!(status.job.counts.total, big_job as u64);
            started.elapsed()
        })
        .collect();
    latencies.sort();
    println!(
        "status on a {big_job}-item job: median {:.2} ms, max {:.2} ms (target <= 100 ms)",
        latencies[latencies.len() / 2].as_secs_f64() * 1e3,
        latencies[latencies.len() - 1].as_secs_f64() * 1e3
    );
    let started = Instant::now();
    let jobs = store.jobs(&Default::default()).unwrap();
    println!(
        "list {} jobs: {:.2} ms",
        jobs.len(),
        started.elapsed().as_secs_f64() * 1e3
    );
    println!("database size: {per_item_bytes:.0} bytes per pending item (request JSON, indexes)");
    let total_items = 100_000 + big_job;
    println!(
        "whole database: {:.1} MiB for {total_items} items and 40,000+ results",
        database_bytes(&store) as f64 / (1 << 20) as f64
    );
}
