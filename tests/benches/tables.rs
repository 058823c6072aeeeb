//! Tables in and out at scale: rows/s for a 1,000,000-row Parquet table
//! submitted from a local file and from an S3-compatible server (s3s-fs on
//! loopback), beside the same rows as JSONL; and for its results written as
//! a Parquet table locally and to the server (and as JSONL). Everything goes
//! through the `cortex` binary, as a user runs it (process start and model
//! lookup included). Interleaved rounds; medians with the spread. Prints
//! figures; asserts nothing.
//!
//! `CORTEX_TEST_S3_SERVER=$(bash scripts/s3-server.sh) cargo bench -p cortex-tests --bench tables`
//! (CORTEX_BENCH_ROWS sets the table's size, 1,000,000 by default;
//! CORTEX_BENCH_ROUNDS the rounds, 3).

use std::path::Path;
use std::time::{Duration, Instant};

use cortex_queue::ClaimOptions;
use cortex_request::{Completion, FinishReason, Response, Timings, Usage};
use cortex_tests::{Cortex, S3Server, TABLE_TEMPLATE, python_check, table_rows_as_jsonl};

fn timed(cortex: &Cortex, args: &[&str]) -> Duration {
    let started = Instant::now();
    cortex.ok(args);
    started.elapsed()
}

/// Completes every item of job 1 (as a worker would, without a model).
fn complete_all(cortex: &Cortex) {
    let mut store = cortex.store();
    let options = ClaimOptions::default();
    loop {
        let claimed = store.claim(512, &options).unwrap();
        if claimed.is_empty() {
            return;
        }
        let responses: Vec<Response> = claimed
            .iter()
            .map(|c| Response {
                id: c.request.id(),
                completions: vec![Completion {
                    index: 0,
                    text: "A short generated answer of about a dozen tokens.".into(),
                    tokens: vec![1; 12],
                    finish_reason: FinishReason::Stop,
                    logprobs: None,
                    prompt_logprobs: None,
                    tool_calls: Vec::new(),
                    reasoning: None,
                }],
                usage: Usage {
                    prompt_tokens: 20,
                    completion_tokens: 12,
                    cached_prompt_tokens: 0,
                },
                timings: Timings::default(),
                embeddings: Vec::new(),
            })
            .collect();
        let done: Vec<_> = claimed
            .iter()
            .zip(&responses)
            .map(|(c, r)| (c.lease, r))
            .collect();
        for outcome in store.complete_many(&done).unwrap() {
            outcome.unwrap();
        }
    }
}

fn report(what: &str, rows: usize, times: &[Duration]) {
    let mut rates: Vec<f64> = times
        .iter()
        .map(|t| rows as f64 / t.as_secs_f64())
        .collect();
    rates.sort_by(f64::total_cmp);
    println!(
        "{what:<44} median {:>8.0} rows/s  (spread {:.0}–{:.0}, {} rounds)",
        rates[rates.len() / 2],
        rates[0],
        rates[rates.len() - 1],
        rates.len()
    );
}

fn main() {
    let rows: usize = std::env::var("CORTEX_BENCH_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let rounds: usize = std::env::var("CORTEX_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let s3 = S3Server::start().expect("no S3 server: set CORTEX_TEST_S3_SERVER");
    let files = tempfile::tempdir().unwrap();
    let table = files.path().join("rows.parquet");
    python_check(
        "parquet_tables.py",
        &[Path::new("plain"), &table, Path::new(&rows.to_string())],
    );
    s3.boto3(&["put", "data", "rows.parquet", table.to_str().unwrap()]);
    // The same requests as JSONL lines.
    let jsonl = files.path().join("rows.jsonl");
    std::fs::write(&jsonl, table_rows_as_jsonl(rows)).unwrap();
    println!(
        "cortex tables benchmark: {rows} rows ({:.1} MB Parquet, {:.1} MB JSONL), s3s-fs on loopback",
        std::fs::metadata(&table).unwrap().len() as f64 / 1e6,
        std::fs::metadata(&jsonl).unwrap().len() as f64 / 1e6
    );

    let (table, jsonl) = (table.to_str().unwrap(), jsonl.to_str().unwrap());
    let template = ["--prompt-template", TABLE_TEMPLATE, "--id-column", "id"];
    let mut times: [Vec<Duration>; 6] = Default::default();
    for round in 0..rounds {
        let local = Cortex::new();
        times[0].push(timed(&local, &["submit", jsonl]));
        let local = Cortex::new();
        let mut args = vec!["submit", table];
        args.extend(template);
        times[1].push(timed(&local, &args));
        let mut remote = Cortex::new();
        s3.configure(&mut remote);
        let mut args = vec!["submit", "s3://data/rows.parquet"];
        args.extend(template);
        times[2].push(timed(&remote, &args));

        complete_all(&remote);
        times[3].push(timed(&remote, &["results", "1", "-o", "out.jsonl"]));
        times[4].push(timed(&remote, &["results", "1", "-o", "out.parquet"]));
        let key = format!("s3://data/out-{round}.parquet");
        times[5].push(timed(&remote, &["results", "1", "-o", &key]));
        eprintln!("round {} of {rounds} done", round + 1);
    }
    report("submit, JSONL file", rows, &times[0]);
    report("submit, Parquet file (prompt template)", rows, &times[1]);
    report("submit, Parquet object on S3 (template)", rows, &times[2]);
    report("results, JSONL file", rows, &times[3]);
    report("results, Parquet file", rows, &times[4]);
    report("results, Parquet object to S3", rows, &times[5]);
    println!("(the queue's submit rate of JSONL, 50,000 lines/s, is the bar)");
}
