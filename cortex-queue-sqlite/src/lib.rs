//! The cortex job queue in one SQLite file: the embedded driver of
//! [`cortex_queue`], for one host. It speaks SQL and nothing else: the
//! types, the traits it implements ([`WorkerStore`], [`JobStore`]), the job
//! state machine and the rules are the core's; `cortex-queue-postgres` is its
//! sibling for queues shared by many hosts.
//!
//! A [`Store`] is one connection to a database file; any number of processes
//! may open the same file at once (SQLite WAL). The life of a job:
//!
//! - [`JobStore::submit_items`] takes a job's parsed input (an [`ItemSource`]:
//!   typed requests or line errors, as the wire-format crate `cortex-openai`
//!   reads them from JSONL) and stores the job and all its items in one
//!   transaction: input with a bad line is rejected as a whole with an
//!   [`InputReport`] naming every bad line, unless
//!   [`SubmitOptions::skip_invalid`] records them as failed instead. The same
//!   input with the same parameters is refused as a
//!   [`QueueError::DuplicateJob`] unless [`SubmitOptions::force`]. The queue
//!   knows no JSON shapes: it stores requests and responses as data.
//! - Workers [`WorkerStore::claim`] items under a lease (a token that every later
//!   write must present), [`WorkerStore::heartbeat`] to keep it, and
//!   [`WorkerStore::complete`] or [`WorkerStore::fail`] them. A result is written only
//!   while the lease holds, and at most once per item. Leases of a worker
//!   process that died on this host are reclaimed at once; others expire.
//!   An item in flight at a worker's death keeps its attempt and becomes a
//!   suspect, claimed only with other suspects in ever smaller groups
//!   ([`ClaimOptions::suspects`]) until it runs alone; only deaths while
//!   alone that follow a lone death of the same item are charged (a poison
//!   item kills worker after worker; outside kills hit whatever runs), so
//!   only a poison item ends `worker_lost`.
//! - Jobs record the SHA-256 of their model; a claim with
//!   [`ClaimOptions::model_sha256`] takes only that model's jobs.
//! - [`JobStore::cancel`], [`JobStore::resume`], [`JobStore::retry_failed`],
//!   [`JobStore::status`] (counts, tokens, throughput, ETA in O(1) per job),
//!   [`JobStore::jobs`] and [`JobStore::export_with`] (an output and an error file
//!   in the caller's [`ExportFormat`], written atomically).
//!
//! Every write runs in `BEGIN IMMEDIATE` and is retried with jitter while
//! another process holds the database, so callers do not see "database is
//! locked"; a full disk is a [`QueueError::DiskFull`] after which the database
//! is intact and usable. The schema is versioned (`PRAGMA user_version`) and
//! migrated on open.
//!
//! [`WorkerStore`]: cortex_queue::WorkerStore
//! [`WorkerStore::claim`]: cortex_queue::WorkerStore::claim
//! [`WorkerStore::heartbeat`]: cortex_queue::WorkerStore::heartbeat
//! [`WorkerStore::complete`]: cortex_queue::WorkerStore::complete
//! [`WorkerStore::fail`]: cortex_queue::WorkerStore::fail
//! [`JobStore`]: cortex_queue::JobStore
//! [`JobStore::submit_items`]: cortex_queue::JobStore::submit_items
//! [`JobStore::cancel`]: cortex_queue::JobStore::cancel
//! [`JobStore::resume`]: cortex_queue::JobStore::resume
//! [`JobStore::retry_failed`]: cortex_queue::JobStore::retry_failed
//! [`JobStore::status`]: cortex_queue::JobStore::status
//! [`JobStore::jobs`]: cortex_queue::JobStore::jobs
//! [`JobStore::export_with`]: cortex_queue::JobStore::export_with
//! [`ItemSource`]: cortex_queue::ItemSource
//! [`InputReport`]: cortex_queue::InputReport
//! [`SubmitOptions::skip_invalid`]: cortex_queue::SubmitOptions::skip_invalid
//! [`SubmitOptions::force`]: cortex_queue::SubmitOptions::force
//! [`QueueError::DuplicateJob`]: cortex_queue::QueueError::DuplicateJob
//! [`QueueError::DiskFull`]: cortex_queue::QueueError::DiskFull
//! [`ClaimOptions::suspects`]: cortex_queue::ClaimOptions::suspects
//! [`ClaimOptions::model_sha256`]: cortex_queue::ClaimOptions::model_sha256
//! [`ExportFormat`]: cortex_queue::ExportFormat
//!
//! # Example
//!
//! ```
//! use cortex_queue::{
//!     ClaimOptions, ExportFormat, ExportedError, ExportedResult, ItemSource, Job, JobState,
//!     JobStore, LineResult, NewItem, StoredResult, SubmitOptions, WorkerStore,
//! };
//! use cortex_queue_sqlite::Store;
//! use cortex_request::{Completion, FinishReason, Request, RequestId, Response, Timings, Usage};
//!
//! // The lines of a job, already parsed (reading JSONL is the wire-format
//! // crate's business: `cortex_openai::SubmitJsonl`).
//! struct Lines(std::vec::IntoIter<LineResult>);
//! impl Iterator for Lines {
//!     type Item = std::io::Result<LineResult>;
//!     fn next(&mut self) -> Option<Self::Item> {
//!         self.0.next().map(Ok)
//!     }
//! }
//! impl ItemSource for Lines {
//!     fn source_sha256(&mut self) -> String {
//!         "example".into()
//!     }
//! }
//! let line = |line: u64, custom_id: &str, prompt: &str| {
//!     Ok(NewItem {
//!         line,
//!         custom_id: custom_id.into(),
//!         endpoint: "/v1/completions".into(),
//!         model: None,
//!         request: Request::new(RequestId(0), prompt).into(),
//!     })
//! };
//! let mut lines = Lines(vec![line(1, "a", "Hi"), line(2, "b", "Once upon a time")].into_iter());
//!
//! let dir = tempfile::tempdir()?;
//! let mut store = Store::open(dir.path().join("cortex.db"))?;
//! let submitted =
//!     store.submit_items(&mut lines, "prompts", &SubmitOptions::new("SmolLM2-135M-Instruct"))?;
//! assert_eq!(submitted.items, 2);
//!
//! // A worker: claim, generate (here: a canned answer), complete.
//! for claimed in store.claim(16, &ClaimOptions::default())? {
//!     let response = Response {
//!         id: claimed.request.id(),
//!         completions: vec![Completion {
//!             index: 0,
//!             text: format!("Hello, {}!", claimed.custom_id),
//!             tokens: vec![1, 2],
//!             finish_reason: FinishReason::Eos,
//!             logprobs: None,
//!             prompt_logprobs: None,
//!             tool_calls: Vec::new(),
//!             reasoning: None,
//!         }],
//!         usage: Usage { prompt_tokens: 5, completion_tokens: 2, cached_prompt_tokens: 0 },
//!         timings: Timings::default(),
//!         embeddings: Vec::new(),
//!     };
//!     store.complete(&claimed.lease, &response)?;
//! }
//!
//! let status = store.status(submitted.job)?;
//! assert_eq!(status.job.state, JobState::Completed);
//! assert_eq!(status.job.counts.completed, 2);
//!
//! // Results in input order, each line as the format renders it.
//! struct Plain;
//! impl ExportFormat for Plain {
//!     fn result_line(&self, _: &Job, r: &ExportedResult) -> String {
//!         match &r.result {
//!             StoredResult::Response(response) => {
//!                 format!("{}\t{}", r.custom_id, response.completions[0].text)
//!             }
//!             StoredResult::Rendered(body) => body.clone(),
//!         }
//!     }
//!     fn error_line(&self, _: &Job, e: &ExportedError) -> String {
//!         format!("{}\t{}", e.custom_id, e.message)
//!     }
//! }
//! let output = dir.path().join("results.txt");
//! store.export_with(submitted.job, &output, None, false, &Plain)?;
//! assert_eq!(std::fs::read_to_string(&output)?, "a\tHello, a!\nb\tHello, b!\n");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Design notes
//!
//! The queue in one SQLite file (bundled SQLite), the only crate with
//! `rusqlite`; it speaks SQL and nothing else. A `Store` is one connection
//! (`Store::opener` makes a `QueueOpener`); any number of processes open the
//! same file (WAL). `store` (opening, pragmas, migrations, busy retries,
//! transactions), `schema`, and one module per part of the traits: `jobs`,
//! `lease`, `submit`, `export`.
//!
//! - Schema (`migrations/*.sql`, versioned by `PRAGMA user_version`, each
//!   migration applied in one `BEGIN IMMEDIATE` with its version bump; a newer
//!   database is refused): `jobs` (source name and SHA-256, parameter hash, model,
//!   defaults, metadata, priority, max attempts, per-state counters and
//!   timestamps), `items` (line, custom_id unique per job, endpoint, the request as
//!   JSON without its default fields — `compact.rs`, about the prompt's size
//!   plus a few bytes; an embedding request as `{"embed": {"inputs": [...]}}` — state, attempts, deaths, whether the current claim runs
//!   it alone, lease token and expiry, backoff time, last error, owning worker),
//!   `results` (primary key = item: one output per item), `input_errors`,
//!   `workers` (host + boot id, pid, process start time, model), `grammars`
//!   (an output grammar once per SHA-256; items refer to it, so a 50,000-item
//!   structured job stores its schema's grammar once) and `death_streak`.
//!   Triggers keep each job's counters and token sums, so status reads one row
//!   plus one index range (the last minute of results): O(1) in the job's size.
//! - Submit (`submit_items`) takes an `ItemSource` — parsed lines from
//!   `cortex-openai`'s `InputReader` (BOM, CRLF, blank lines, non-UTF-8, cut-off
//!   last line; both formats, unknown fields, sampling validation through
//!   `cortex-request`) and the input's hash — inside one transaction;
//!   duplicate `custom_id`s are caught by the unique index, not a set in
//!   memory. Any bad line rolls everything back and the `InputReport` lists every
//!   one; `skip_invalid` stores them in `input_errors` instead. The same file and
//!   parameters twice is `DuplicateJob` unless `force`.
//! - Claim is one `UPDATE … WHERE id IN (pending, of jobs for the worker's
//!   model, by job priority and input order) RETURNING`, raising `attempts` and
//!   `lease_token`. Before it, in the same transaction: leases of workers on
//!   this host whose process is gone (pid + start time from `/proc`) end as
//!   one death per worker, then the leases that ran out as one more
//!   (`record_deaths`): pending again as a suspect with the attempt given back,
//!   or — when it ran alone and the previous death was its own lone run too —
//!   charged, and failed `worker_lost` once out of attempts; items of
//!   cancelling jobs end cancelled. With `suspects` allowed (the worker is idle)
//!   and suspects ready, the claim takes only suspects, the most suspected
//!   first, `n >> deaths` of them (alone when that is 1; lone suspects longest
//!   waiting first, and only when `alone` allows, else normal items if there
//!   are any). `abandon` applies the
//!   same rule to the leases of a worker whose engine died, with the engine's
//!   message as the error. Heartbeat, complete, fail and release all match on
//!   `lease_token`; a lost lease is `LeaseLost`. Retryable failures back off
//!   exponentially until `max_attempts`. Every write settles the job's state with `JobState::settled`, the state
//!   machine as one pure function of the item counts, tested on its own (the
//!   PostgreSQL driver calls it too): in_progress → finalizing when
//!   nothing is pending → completed / failed; cancelling → cancelled when
//!   nothing runs.
//! - Every write is `BEGIN IMMEDIATE`, retried whole with jitter while another
//!   process holds the lock (up to `busy_patience`); `SQLITE_FULL` is `DiskFull`
//!   and leaves the database intact. Results are stored as typed responses
//!   (schema v4; older rows keep their rendered body). Export (`export_with`)
//!   reads one snapshot, hands every result and error to the caller's
//!   `ExportFormat` for its line, and writes a temp file, fsync, rename,
//!   directory fsync.
//! - Failpoints for the crash tests, compiled only with the `failpoints`
//!   feature (the test build): `CORTEX_FAILPOINT=claim|complete:written|
//!   complete:committed|generated:CUSTOM_ID[@N]` makes the process SIGKILL
//!   itself there (`failpoint::hit` is public so the worker adds its own).

#![forbid(unsafe_code)]

mod expiry;
mod export;
mod jobs;
mod lease;
mod schema;
mod store;
mod submit;
mod webhooks;

pub use schema::SCHEMA_VERSION;
pub use store::{Store, StoreConfig, Synchronous};

use cortex_queue::{Database, QueueOpener};

impl Store {
    /// An opener of the SQLite database at `path`, for callers that take
    /// any driver (a server opens one connection for its handlers and one
    /// for its worker thread).
    pub fn opener(path: impl Into<std::path::PathBuf>) -> QueueOpener {
        let path = path.into();
        QueueOpener::new(Database::Sqlite(path.clone()), move || {
            Ok(Box::new(Store::open(&path)?))
        })
    }
}
