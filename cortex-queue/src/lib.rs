//! The cortex job queue's core: what a durable store of batch jobs is,
//! whatever database holds it. Its drivers are sibling crates that only
//! speak SQL: `cortex-queue-sqlite` (one file, one host) and
//! `cortex-queue-postgres` (a queue shared by many hosts). Callers see a
//! queue through the storage boundary ([`WorkerStore`] for workers,
//! [`JobStore`] for the CLI and servers; [`Queue`] is both) and open one
//! with a [`QueueOpener`] for the [`Database`] a user named.
//!
//! What is here is the same on every driver:
//!
//! - the data that crosses the boundary, typed: a job's parsed input
//!   ([`ItemSource`] yielding [`NewItem`]s or [`LineError`]s, as the
//!   wire-format crate `cortex-openai` reads them from JSONL), [`Job`],
//!   [`JobStatus`], [`ClaimedItem`], [`Lease`], [`ExportedResult`]; the queue
//!   knows no JSON shapes: it stores requests and responses as data;
//! - the job state machine ([`JobState::settled`]), which every driver
//!   applies after each write;
//! - the rules: a bad line rejects the whole input unless
//!   [`SubmitOptions::skip_invalid`] records it as failed; the same input
//!   with the same parameters is a [`QueueError::DuplicateJob`] unless
//!   [`SubmitOptions::force`]; a result is written only while its lease
//!   holds, and at most once per item; an item in flight at a worker's death
//!   keeps its attempt and becomes a suspect, claimed with other suspects in
//!   ever smaller groups ([`ClaimOptions::suspects`]) until it runs alone,
//!   and only deaths while alone that follow a lone death of the same item
//!   are charged, so only a poison item ends `worker_lost`; retryable
//!   failures back off exponentially ([`FailOutcome::of`]); a claim with
//!   [`ClaimOptions::model_sha256`] takes only that model's jobs;
//! - exports written atomically, each line in the caller's [`ExportFormat`].
//!
//! The shared driver suite (`cortex-queue-suite`) runs every rule on each
//! driver.
//!
//! ```
//! use std::time::Duration;
//! use cortex_queue::{CompletionWindow, Database, JobState, redact_password};
//!
//! // Where a queue lives: a SQLite file, or a PostgreSQL URL (its
//! // password never shown in messages).
//! assert_eq!(Database::parse("jobs.db").driver(), "sqlite");
//! let url = "postgres://cortex:secret@db.internal/cortex";
//! assert_eq!(Database::parse(url).driver(), "postgres");
//! assert!(!redact_password(url).contains("secret"));
//!
//! // A job's window, and the states it moves through.
//! assert_eq!(CompletionWindow::parse("1h30m")?.duration(), Duration::from_secs(5400));
//! assert!(JobState::Completed.is_terminal() && !JobState::InProgress.is_terminal());
//! # Ok::<(), cortex_queue::BadDuration>(())
//! ```
//!
//! # Design notes
//!
//! The queue's core: no database client, only what every driver shares.
//! `driver.rs` holds the traits every driver implements — `WorkerStore`
//! (claim, heartbeat, progress, complete, fail, release, abandon, unregister,
//! `wait_for_work`) and `JobStore` (submit, job, jobs, status, items, cancel,
//! resume, retry, export, and what a dashboard reads: `job_page`, `item_page`,
//! `item`, `completions`, `workers`) — typed data in and out; `WebhookStore`
//! (`webhook.rs`: the outbox of events a job's end adds, claimed under a lease
//! and retried with `webhook_retry_after`); `window.rs` holds completion
//! windows (`CompletionWindow`, `BATCH_EXPIRED`: a driver expires due jobs
//! before it reads, claims or heartbeats); `Database` (a `--db` value:
//! path, `sqlite://` or `postgres://` URL, shown without its password) and
//! `QueueOpener` (opens a connection on any driver, for a server's threads;
//! each driver makes its own). The rest are the typed data (`jobs`, `lease`,
//! `submit`, `export`, `error`: `LineError` and `InputReport` name every bad
//! line), the job state machine (`JobState::settled`, in `lib.rs`) and the
//! pieces drivers share, documented under `driver` for a driver's author: stored request and
//! response forms (`compact`), `claim_by_rule` — which group of suspects or
//! normal items a claim takes — and `FailOutcome::of` (retry backoff), host and
//! process identity (`process`), `SubmitTally` (the submit loop's counting and
//! its all-or-nothing verdict), `JobStatus::span`/`over` for rates and ETA, and
//! `inspect` (`ItemQuery`/`ItemPage`, `ItemDetail`, `JobActivity` and
//! `Distribution` computed from a job's `CompletionSample`s, `WorkerInfo`; each
//! item records the host and pid it last ran on, each result its time to first
//! token and duration), and
//! `export_files` (the export loop: each driver hands it the rows of one
//! snapshot; it renders them in the caller's format, writes each file
//! atomically and returns the summary). The shared driver suite is its own crate,
//! `cortex-queue-suite` (above the wire format, whose files its cases
//! submit): a driver implements its `DriverUnderTest` and invokes
//! `queue_suite!`; each driver runs it from its own tests
//! (`cargo test -p cortex-queue-sqlite`; `cargo test -p
//! cortex-queue-postgres`, a fresh database per case on
//! `CORTEX_TEST_POSTGRES`), and `queue_storage.rs` holds SQLite's own
//! cases (migrations, a full disk); the queue's
//! benchmarks are `cargo bench -p cortex-tests --bench queue` (SQLite at scale)
//! and `--bench queue_drivers` (both side by side).
//!
//! ## Crashes and poison items
//!
//! A crash costs the user nothing but time: an item in flight when its worker
//! (or engine) died keeps its attempt, unless it was running alone. Such items
//! are suspects (`items.deaths`): claimed only into an idle worker, only with
//! other suspects, `parallel >> deaths` at a time, and the worker claims
//! nothing beside them. A poison item is therefore alone after about
//! log2(parallel) deaths. Only a death while an item runs alone *right after
//! a death that was also its own, alone* is charged (`death_streak` holds the
//! item of the last lone death; a group's death, or a worker found dead with
//! nothing in flight, clears it); after `max_attempts` charges the item fails
//! with `worker_lost`. A poison item kills every worker that runs it, one
//! after another, so it builds the streak; kills from outside land on
//! whatever runs, and between two of them other items die. To keep it that
//! way a worker runs at most one lone suspect per life and not as its first
//! claim (unless nothing else is claimable), lone suspects take turns,
//! longest waiting first, and one whose lone run died waits `lone_retry`
//! (1 s, doubled per charge) before the next: some worker must live through
//! that, and an outside kill of an idle worker ends the streak too.

#![forbid(unsafe_code)]

mod compact;
pub mod driver;
mod error;
mod export;
mod inspect;
// Hidden: for crates that add their own crash points (the worker's
// `generated:ID`) and for the tests; not part of the queue's API.
#[doc(hidden)]
pub mod failpoint;
mod jobs;
mod lease;
mod output_file;
mod process;
mod sql;
mod state;
mod submit;
mod webhook;
mod window;

pub use driver::{Database, JobStore, Queue, QueueOpener, WorkerStore, redact_password};
pub use error::{InputReport, LineError, QueueError};
pub use export::{ExportFormat, ExportSummary, ExportedError, ExportedResult, StoredResult};
pub use inspect::{
    ActivityBucket, CompletionSample, Distribution, ItemDetail, ItemPage, ItemQuery, JobActivity,
    WorkerInfo, host_name, item_detail,
};
pub use jobs::{
    Cancel, ItemRecord, Job, JobDefaults, JobFilter, JobPage, JobStatus, JobTimes, RunningTokens,
};
pub use lease::{
    ClaimOptions, ClaimedItem, DEFAULT_LEASE, FailOutcome, ItemFailure, Lease, LeaseStatus,
    RetryPolicy,
};
pub use output_file::{Destination, OutputFile};
pub use state::{ItemId, ItemState, JobCounts, JobId, JobState};
pub use submit::{DEFAULT_MAX_ATTEMPTS, ItemSource, LineResult, NewItem, SubmitOptions, Submitted};
pub use webhook::{
    EXPORT_EVENT, WEBHOOK_ATTEMPTS, WebhookEvent, WebhookStore, webhook_retry_after,
};
pub use window::{BATCH_EXPIRED, BadDuration, CompletionWindow, EXPIRED_MESSAGE, parse_duration};

/// The project of jobs whose submitter named none (every job the CLI
/// submits, and those from before projects existed).
pub const DEFAULT_PROJECT: &str = "default";

/// The time now in Unix milliseconds, as the queue records it.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Shorthand for this crate's results.
pub type Result<T, E = QueueError> = std::result::Result<T, E>;
