//! The cortex job queue: a durable store of batch jobs, their items, results
//! and input errors, behind a storage boundary ([`WorkerStore`] for workers,
//! [`JobStore`] for the CLI and servers; [`Queue`] is both). The job state
//! machine ([`JobState::settled`]) and the rules below are the same on every
//! backend. This crate is the embedded SQLite backend; `cortex-queue-postgres`
//! is the one for queues shared by many hosts. [`Database`] reads a `--db`
//! value (a path or a `postgres://` URL) and [`QueueOpener`] opens either.
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
//! # Example
//!
//! ```
//! use cortex_queue::{
//!     ClaimOptions, ExportFormat, ExportedError, ExportedResult, ItemSource, Job, JobState,
//!     JobStore, LineResult, NewItem, StoredResult, Store, SubmitOptions, WorkerStore,
//! };
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
//!             tool_calls: Vec::new(),
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

#![forbid(unsafe_code)]

pub mod backend;
mod compact;
mod error;
mod export;
// Hidden: for crates that add their own crash points (the worker's
// `generated:ID`) and for the tests; not part of the queue's API.
#[doc(hidden)]
pub mod failpoint;
mod jobs;
mod lease;
mod process;
mod schema;
mod store;
mod submit;

use std::fmt;

pub use backend::{Database, JobStore, Queue, QueueOpener, WorkerStore, redact_password};
pub use error::{InputReport, QueueError};
pub use export::{ExportFormat, ExportSummary, ExportedError, ExportedResult, StoredResult};
pub use jobs::{ItemRecord, Job, JobCounts, JobFilter, JobStatus, JobTimes};
pub use lease::{ClaimOptions, ClaimedItem, FailOutcome, ItemFailure, Lease, LeaseStatus};
pub use schema::SCHEMA_VERSION;
pub use store::{Store, StoreConfig, Synchronous, now_ms};
pub use submit::{
    ItemSource, JobDefaults, LineError, LineResult, NewItem, SubmitOptions, Submitted,
};

/// The project of jobs whose submitter named none (every job the CLI
/// submits, and those from before projects existed).
pub const DEFAULT_PROJECT: &str = "default";

/// Shorthand for this crate's results.
pub type Result<T, E = QueueError> = std::result::Result<T, E>;

/// A job's id (a small integer, unique within one database).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub struct JobId(pub i64);

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// An item's id (unique within one database; also the engine request id).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub struct ItemId(pub i64);

impl fmt::Display for ItemId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Where a job is, following OpenAI's batch states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// Its input is being read and checked (inside the submit transaction, so
    /// only its timestamp is ever seen by others).
    Validating,
    /// Items are waiting or running.
    InProgress,
    /// No item is waiting any more; the last ones are running.
    Finalizing,
    /// Every item ended, at least one with a result.
    Completed,
    /// Every item ended and none has a result.
    Failed,
    /// Cancelled while items were running; they stop at their next heartbeat.
    Cancelling,
    /// Cancelled; finished results are kept.
    Cancelled,
}

impl JobState {
    /// Every state, in life order.
    pub const ALL: [JobState; 7] = [
        JobState::Validating,
        JobState::InProgress,
        JobState::Finalizing,
        JobState::Completed,
        JobState::Failed,
        JobState::Cancelling,
        JobState::Cancelled,
    ];

    /// The state's name (`in_progress`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Validating => "validating",
            JobState::InProgress => "in_progress",
            JobState::Finalizing => "finalizing",
            JobState::Completed => "completed",
            JobState::Failed => "failed",
            JobState::Cancelling => "cancelling",
            JobState::Cancelled => "cancelled",
        }
    }

    /// Parses a state's name.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == name)
    }

    /// Whether nothing more will happen to the job unless it is resumed or retried.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobState::Completed | JobState::Failed | JobState::Cancelled
        )
    }

    /// The job state machine, as every storage backend applies it after a
    /// write: where a job in this state goes given its items' `counts`.
    /// A running job is `finalizing` once nothing is pending, `completed`
    /// once nothing is pending or running and something completed (else
    /// `failed`), and `in_progress` again when items became pending (a
    /// retry); a cancelling job is `cancelled` once nothing runs. Other
    /// states change only by an explicit act (submit, cancel, resume).
    ///
    /// ```
    /// use cortex_queue::{JobCounts, JobState};
    ///
    /// let counts = JobCounts { total: 2, running: 1, completed: 1, ..JobCounts::default() };
    /// assert_eq!(JobState::InProgress.settled(&counts), JobState::Finalizing);
    /// assert_eq!(JobState::Cancelling.settled(&counts), JobState::Cancelling);
    /// ```
    pub fn settled(self, counts: &JobCounts) -> JobState {
        let (pending, running) = (counts.pending, counts.running);
        match self {
            JobState::InProgress | JobState::Finalizing if pending + running == 0 => {
                if counts.completed > 0 {
                    JobState::Completed
                } else {
                    JobState::Failed
                }
            }
            JobState::InProgress | JobState::Finalizing if pending == 0 => JobState::Finalizing,
            JobState::InProgress | JobState::Finalizing => JobState::InProgress,
            JobState::Cancelling if running == 0 => JobState::Cancelled,
            other => other,
        }
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where an item is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ItemState {
    /// Waiting to be claimed (possibly not before a backoff time).
    Pending,
    /// Claimed under a lease.
    Running,
    /// Has its one result.
    Completed,
    /// Failed for good; its last error is kept.
    Failed,
    /// Cancelled with its job.
    Cancelled,
}

impl ItemState {
    /// The state's name.
    pub fn as_str(self) -> &'static str {
        match self {
            ItemState::Pending => "pending",
            ItemState::Running => "running",
            ItemState::Completed => "completed",
            ItemState::Failed => "failed",
            ItemState::Cancelled => "cancelled",
        }
    }

    /// Parses a state's name.
    pub fn parse(name: &str) -> Option<Self> {
        [
            ItemState::Pending,
            ItemState::Running,
            ItemState::Completed,
            ItemState::Failed,
            ItemState::Cancelled,
        ]
        .into_iter()
        .find(|s| s.as_str() == name)
    }
}

impl fmt::Display for ItemState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod state_machine_tests {
    use super::{JobCounts, JobState};

    fn counts(pending: u64, running: u64, completed: u64) -> JobCounts {
        JobCounts {
            total: pending + running + completed + 1,
            pending,
            running,
            completed,
            failed: 1,
            ..JobCounts::default()
        }
    }

    #[test]
    fn every_transition_of_the_job_state_machine() {
        use JobState::*;
        let cases = [
            // (from, pending, running, completed, to)
            (InProgress, 3, 1, 0, InProgress),
            (InProgress, 0, 2, 0, Finalizing),
            (InProgress, 0, 0, 4, Completed),
            (InProgress, 0, 0, 0, Failed),
            (Finalizing, 0, 1, 0, Finalizing),
            (Finalizing, 1, 0, 0, InProgress),
            (Finalizing, 0, 0, 1, Completed),
            (Finalizing, 0, 0, 0, Failed),
            (Cancelling, 0, 2, 0, Cancelling),
            (Cancelling, 0, 0, 3, Cancelled),
            (Cancelled, 1, 0, 0, Cancelled),
            (Completed, 1, 0, 0, Completed),
            (Failed, 0, 1, 0, Failed),
            (Validating, 5, 0, 0, Validating),
        ];
        for (from, pending, running, completed, to) in cases {
            assert_eq!(
                from.settled(&counts(pending, running, completed)),
                to,
                "{from} with {pending} pending, {running} running, {completed} completed"
            );
        }
    }
}
