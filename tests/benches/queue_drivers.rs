//! The queue's two drivers side by side, no model (a fake generation):
//! submit lines/s, claim+complete items/s with 1, 4 and 16 concurrent
//! claimers, and status latency on a big job. Prints a table; asserts nothing.
//!
//! ```text
//! CORTEX_BENCH_POSTGRES=postgres://cortex:cortex@127.0.0.1:55432/cortex \
//!     cargo bench -p cortex-tests --bench queue_drivers
//! ```
//!
//! `CORTEX_BENCH_SIZES` (default `100000,1000000`) sets the submit sizes
//! (the largest also serves the status figure), `CORTEX_BENCH_CLAIM_ITEMS`
//! (default 20000) the items of each claim run, `CORTEX_BENCH_BATCH` (16)
//! the items per claim. Without `CORTEX_BENCH_POSTGRES` only SQLite runs.

use std::time::{Duration, Instant};

use cortex_queue::{ClaimOptions, ItemSource, JobId, LineResult, NewItem, Queue, SubmitOptions};
use cortex_queue_postgres::PgStore;
use cortex_queue_sqlite::{Store, StoreConfig, Synchronous};
use cortex_request::{
    Completion, FinishReason, Request, RequestId, Response, Timings, Usage, Work,
};

/// `n` generated items (a short chat-sized prompt each), without JSON parsing:
/// what is measured is the store.
struct Items {
    next: u64,
    n: u64,
    tag: String,
}

impl Iterator for Items {
    type Item = std::io::Result<LineResult>;
    fn next(&mut self) -> Option<Self::Item> {
        if self.next >= self.n {
            return None;
        }
        self.next += 1;
        let i = self.next;
        let mut request = Request::new(
            RequestId(0),
            format!("Question {i} of {}: what is {i} + {i}?", self.tag),
        );
        request.stop.max_tokens = 16;
        Some(Ok(Ok(NewItem {
            line: i,
            custom_id: format!("item-{i}"),
            endpoint: "/v1/completions".into(),
            model: None,
            request: Work::Generate(request),
        })))
    }
}

impl ItemSource for Items {
    fn source_sha256(&mut self) -> String {
        format!("bench-{}-{}", self.tag, self.n)
    }
}

fn answer(id: RequestId) -> Response {
    Response {
        id,
        completions: vec![Completion {
            index: 0,
            text: "The answer is a number.".into(),
            tokens: Vec::new(),
            finish_reason: FinishReason::Length,
            logprobs: None,
            prompt_logprobs: None,
            tool_calls: Vec::new(),
            reasoning: None,
        }],
        usage: Usage {
            prompt_tokens: 20,
            completion_tokens: 16,
            cached_prompt_tokens: 0,
        },
        timings: Timings::default(),
        embeddings: Vec::new(),
    }
}

/// How to open one driver's connections for a run.
#[derive(Clone)]
enum Driver {
    /// A SQLite file.
    Sqlite(std::path::PathBuf),
    /// A database URL, and the server's (to make fresh databases).
    Postgres(String, String),
}

impl Driver {
    /// An empty queue of the same kind, named `name`.
    fn fresh(&self, name: &str) -> Driver {
        match self {
            Driver::Sqlite(path) => Driver::Sqlite(path.with_file_name(format!("{name}.db"))),
            Driver::Postgres(_, server) => Driver::Postgres(
                PgStore::create_database(server, name).unwrap(),
                server.clone(),
            ),
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Driver::Sqlite(_) => "sqlite",
            Driver::Postgres(..) => "postgres",
        }
    }

    fn open(&self) -> Box<dyn Queue> {
        match self {
            // The worker's setting: commits survive a crash of the process.
            Driver::Sqlite(path) => Box::new(
                Store::open_with(
                    path,
                    StoreConfig {
                        synchronous: Synchronous::Full,
                        ..StoreConfig::default()
                    },
                )
                .unwrap(),
            ),
            Driver::Postgres(url, _) => Box::new(PgStore::connect(url).unwrap()),
        }
    }
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

fn submit(driver: &Driver, n: u64, tag: &str) -> (JobId, Duration) {
    let mut queue = driver.open();
    let started = Instant::now();
    let mut options = SubmitOptions::new("bench");
    options.force = true;
    let job = queue
        .submit_items(
            &mut Items {
                next: 0,
                n,
                tag: tag.to_owned(),
            },
            tag,
            &options,
        )
        .unwrap()
        .job;
    (job, started.elapsed())
}

/// `claimers` threads claiming `batch` at a time and completing at once
/// until `items` of `job` are done (or it has none left); items per second.
fn claim_and_complete(
    driver: &Driver,
    job: Option<JobId>,
    items: u64,
    claimers: usize,
    batch: usize,
) -> f64 {
    let done_so_far = std::sync::atomic::AtomicU64::new(0);
    let started = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..claimers {
            scope.spawn(|| {
                let mut queue = driver.open();
                let options = ClaimOptions {
                    jobs: job.map(|job| vec![job]),
                    ..ClaimOptions::default()
                };
                while done_so_far.load(std::sync::atomic::Ordering::Relaxed) < items {
                    let claimed = queue.claim(batch, &options).unwrap();
                    if claimed.is_empty() {
                        break;
                    }
                    done_so_far
                        .fetch_add(claimed.len() as u64, std::sync::atomic::Ordering::Relaxed);
                    let responses: Vec<Response> =
                        claimed.iter().map(|c| answer(c.request.id())).collect();
                    let done: Vec<_> = claimed
                        .iter()
                        .zip(&responses)
                        .map(|(c, r)| (c.lease, r))
                        .collect();
                    for outcome in queue.complete_many(&done).unwrap() {
                        outcome.unwrap();
                    }
                }
                queue.unregister_worker().unwrap();
            });
        }
    });
    done_so_far.into_inner() as f64 / started.elapsed().as_secs_f64()
}

fn main() {
    let sizes: Vec<u64> = env_or("CORTEX_BENCH_SIZES", "100000,1000000")
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let claim_items: u64 = env_or("CORTEX_BENCH_CLAIM_ITEMS", "20000").parse().unwrap();
    let batch: usize = env_or("CORTEX_BENCH_BATCH", "16").parse().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut drivers = vec![Driver::Sqlite(dir.path().join("bench.db"))];
    match std::env::var("CORTEX_BENCH_POSTGRES") {
        Ok(server) if !server.is_empty() => {
            let url = PgStore::create_database(&server, "cortex_bench").unwrap();
            drivers.push(Driver::Postgres(url, server));
        }
        _ => eprintln!("CORTEX_BENCH_POSTGRES not set: SQLite only"),
    }
    println!("| driver | measure | figure |");
    println!("|---|---|---|");
    for driver in &drivers {
        let name = driver.name();
        let mut largest = None;
        for &n in &sizes {
            let (job, took) = submit(driver, n, &format!("submit-{n}"));
            println!(
                "| {name} | submit {n} lines | {:.0} lines/s ({:.1} s) |",
                n as f64 / took.as_secs_f64(),
                took.as_secs_f64()
            );
            largest = Some(job);
        }
        if let Some(job) = largest {
            // A big job, partly done: status reads its counters and one index range.
            let mut queue = driver.open();
            let options = ClaimOptions {
                jobs: Some(vec![job]),
                ..ClaimOptions::default()
            };
            let claimed = queue.claim(1000, &options).unwrap();
            let responses: Vec<Response> = claimed.iter().map(|c| answer(c.request.id())).collect();
            let done: Vec<_> = claimed
                .iter()
                .zip(&responses)
                .map(|(c, r)| (c.lease, r))
                .collect();
            queue.complete_many(&done).unwrap();
            let mut times: Vec<f64> = (0..20)
                .map(|_| {
                    let started = Instant::now();
                    queue.status(job).unwrap();
                    started.elapsed().as_secs_f64() * 1000.0
                })
                .collect();
            times.sort_by(f64::total_cmp);
            println!(
                "| {name} | status of a {}-item job | {:.2} ms median, {:.2} ms max |",
                sizes.iter().max().unwrap(),
                times[times.len() / 2],
                times[times.len() - 1]
            );
            // What a fleet does: claim whatever is next in a queue this size.
            let rate = claim_and_complete(driver, None, claim_items, 16, batch);
            println!(
                "| {name} | claim+complete with all those items queued, 16 claimers, {batch} per claim | {rate:.0} items/s |"
            );
            let started = Instant::now();
            queue.cancel(job).unwrap();
            println!(
                "| {name} | cancel the rest of that job | {:.1} s |",
                started.elapsed().as_secs_f64()
            );
        }
        for claimers in [1, 4, 16] {
            // Each run on an empty queue, so that it measures claims, not the
            // big job's history.
            let driver = &driver.fresh(&format!("cortex_bench_claim_{claimers}"));
            let (job, _) = submit(driver, claim_items, &format!("claim-{claimers}"));
            let rate = claim_and_complete(driver, Some(job), claim_items, claimers, batch);
            println!(
                "| {name} | claim+complete, {claimers} claimers, {batch} per claim | {rate:.0} items/s |"
            );
            let job_now = driver.open().job(job).unwrap();
            assert_eq!(job_now.counts.completed, claim_items, "{job_now:?}");
        }
    }
}
