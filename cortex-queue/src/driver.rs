//! The storage boundary: what a worker needs of a queue ([`WorkerStore`]),
//! what the CLI and a server need ([`JobStore`]), and the pieces every
//! driver shares (the job state machine is [`JobState::settled`](crate::JobState::settled)).
//!
//! Each driver crate implements both (`cortex_queue_sqlite::Store`,
//! `cortex_queue_postgres::PgStore`). Data goes in and out typed: no SQL and
//! no JSON shapes cross this boundary.

use std::path::Path;
use std::time::Duration;

use cortex_request::Response;

use crate::{
    ClaimOptions, ClaimedItem, CompletionSample, ExportFormat, ExportSummary, FailOutcome,
    ItemDetail, ItemFailure, ItemPage, ItemQuery, ItemRecord, ItemSource, Job, JobFilter, JobId,
    JobPage, JobStatus, Lease, LeaseStatus, Result, SubmitOptions, Submitted, WebhookStore,
    WorkerInfo,
};

/// What a worker does with a queue: claim items under leases and write back
/// what became of them. Every write presents the lease; a write under a lease
/// that is no longer held records nothing.
pub trait WorkerStore {
    /// Claims up to `n` items: suspects first when allowed (see
    /// [`ClaimOptions::suspects`]), else pending items by job priority and
    /// input order. Each claim raises the item's attempt count and lease token.
    fn claim(&mut self, n: usize, options: &ClaimOptions) -> Result<Vec<ClaimedItem>>;

    /// Extends each lease by `lease` if it is still held; reports leases lost
    /// to another worker and items whose job was cancelled (which end now).
    fn heartbeat(&mut self, leases: &[Lease], lease: Duration) -> Result<Vec<LeaseStatus>>;

    /// Records how many tokens each item has generated so far in its current
    /// attempt, which a job's status counts while the item runs. Extends no
    /// lease; returns the leases that are no longer held (lost, or their
    /// job's window ended), whose items should stop.
    fn progress(&mut self, generated: &[(Lease, u64)]) -> Result<Vec<Lease>>;

    /// Records several results at once; each entry is `Err(LeaseLost)` on its
    /// own when its lease is no longer held.
    fn complete_many(&mut self, done: &[(Lease, &Response)]) -> Result<Vec<Result<()>>>;

    /// Records `response` as the item's one result, if `lease` is still held.
    fn complete(&mut self, lease: &Lease, response: &Response) -> Result<()> {
        self.complete_many(&[(*lease, response)])?.remove(0)
    }

    /// Records a failed attempt, if `lease` is still held: a retryable failure
    /// goes back to pending with exponential backoff until the job's
    /// `max_attempts`; anything else fails the item now.
    fn fail(&mut self, lease: &Lease, failure: &ItemFailure) -> Result<FailOutcome>;

    /// Gives items back without using up an attempt: pending again at once
    /// (cancelled if their job is cancelling). Returns how many were held.
    fn release(&mut self, leases: &[Lease]) -> Result<usize>;

    /// Ends the attempts of items whose engine died under them, as a worker
    /// death would, recording `cause` as their last error. Returns how many
    /// leases were held.
    fn abandon(&mut self, leases: &[Lease], cause: &str) -> Result<usize>;

    /// Removes this worker's registration (its leases must have been
    /// completed, failed or released first; any left simply expire).
    fn unregister_worker(&mut self) -> Result<()>;

    /// Waits, when a claim found nothing, until work may have arrived: at
    /// most `longest`, less where the driver hears of new work (PostgreSQL's
    /// `LISTEN`). A driver without notifications polls every quarter second.
    fn wait_for_work(&mut self, longest: Duration) -> Result<()> {
        std::thread::sleep(longest.min(Duration::from_millis(250)));
        Ok(())
    }
}

/// What the CLI and a server do with a queue: submit, inspect, steer and
/// export jobs.
pub trait JobStore {
    /// Stores a job and all its items so that no partial job is ever
    /// visible. Every line is checked; with bad lines the job is rejected
    /// with a report of all of them unless `options.skip_invalid`.
    fn submit_items(
        &mut self,
        input: &mut dyn ItemSource,
        source_name: &str,
        options: &SubmitOptions,
    ) -> Result<Submitted>;

    /// The job `id`.
    fn job(&mut self, id: JobId) -> Result<Job>;

    /// Jobs matching `filter`, newest first.
    fn jobs(&mut self, filter: &JobFilter) -> Result<Vec<Job>>;

    /// One page of the jobs matching `filter` (its `offset` and `limit`),
    /// how many match in all, and the models of the filter's project: what a
    /// list with a pager shows, without reading every job.
    fn job_page(&mut self, filter: &JobFilter) -> Result<JobPage>;

    /// The job with its throughput over the last `window` of its work and an
    /// ETA; constant time in the job's size.
    fn status_over(&mut self, id: JobId, window: Duration) -> Result<JobStatus>;

    /// [`JobStore::status_over`] the last minute.
    fn status(&mut self, id: JobId) -> Result<JobStatus> {
        self.status_over(id, Duration::from_secs(60))
    }

    /// Every item of a job in input order (for inspection; reads the whole job).
    fn items(&mut self, id: JobId) -> Result<Vec<ItemRecord>>;

    /// One page of a job's items in input order, with how many match in all.
    fn item_page(&mut self, id: JobId, query: &ItemQuery) -> Result<ItemPage>;

    /// The item of job `id` on input line `line`, with its request and result.
    fn item(&mut self, id: JobId, line: u64) -> Result<ItemDetail>;

    /// When each of a job's results was written, its tokens and latencies
    /// (for [`crate::JobActivity`]).
    fn completions(&mut self, id: JobId) -> Result<Vec<CompletionSample>>;

    /// The worker processes registered on the queue, oldest first.
    fn workers(&mut self) -> Result<Vec<WorkerInfo>>;

    /// Cancels a job: pending items are cancelled now; running ones learn it
    /// at their next heartbeat. Finished results stay.
    fn cancel(&mut self, id: JobId) -> Result<Job>;

    /// Resumes a cancelled or failed job: its cancelled and failed items are
    /// pending again with fresh attempts. Returns the job and how many items.
    fn resume(&mut self, id: JobId) -> Result<(Job, u64)>;

    /// Puts a job's failed items back to pending with fresh attempts (invalid
    /// input lines stay failed). Returns the job and how many items.
    fn retry_failed(&mut self, id: JobId) -> Result<(Job, u64)>;

    /// Writes the job's completed items in input order to `output`, and (if
    /// given) its failed, cancelled and invalid requests to `errors`, each
    /// line as `format` renders it, from one snapshot, each file atomically.
    /// Refuses while the job is still running unless `partial`.
    fn export_with(
        &mut self,
        id: JobId,
        output: &Path,
        errors: Option<&Path>,
        partial: bool,
        format: &dyn ExportFormat,
    ) -> Result<ExportSummary>;

    /// Which database this is, for messages (`sqlite:PATH`, a URL without
    /// its password).
    fn location(&self) -> String;
}

/// A whole queue: what workers, the CLI and servers use, on any driver.
pub trait Queue: WorkerStore + JobStore + WebhookStore + Send + std::fmt::Debug {}

impl<T: WorkerStore + JobStore + WebhookStore + Send + std::fmt::Debug + ?Sized> Queue for T {}

// What a driver is written with. A third driver (a crate of its own,
// like `cortex-queue-sqlite` and `cortex-queue-postgres`) implements
// `WorkerStore` and `JobStore` over its storage and uses these, so that the
// rules are the same everywhere; its tests then run the shared suite
// (`cortex-queue-suite`: implement `DriverUnderTest`, invoke `queue_suite!`).
// Applications see a queue only through the traits above.

/// Stored forms: a request kept apart from what its job shares (a grammar
/// once per job), and a response without what can be rebuilt.
pub use crate::compact::{compact_response, compact_work_apart, expand_work_with};
/// Export: the loop that renders one snapshot's rows in the caller's format
/// and writes each file atomically; a driver feeds it through a `RowSink`.
pub use crate::export::{RowSink, check_exportable, export_files};
/// Claims and deaths: which group of suspects or normal items a claim takes,
/// how alone a suspect must run, and the worker-stopped error code.
pub use crate::lease::{WORKER_STOPPED, alone_level, claim_by_rule, duration_ms, suspect_group};
/// Who holds a lease: this host and process, and whether another is gone.
pub use crate::process::{host_identity, is_gone, this_process};
/// Listing: the SQL of a job's items as the API lists them.
pub use crate::sql::{
    DeathSpelling, ITEM_COLUMN_COUNT, ITEM_COLUMNS, LISTED_COLUMNS, death_assignments, listed_items,
};
/// Submitting: the loop (a driver writes each line through a `LineSink`),
/// its counting and its all-or-nothing verdict, the errors kept per job,
/// and the hash that finds a resubmission.
pub use crate::submit::{KEEP_ERRORS, LineSink, SubmitTally, params_hash, store_lines};

/// Where a queue lives, as a user names it: a path or `sqlite://PATH`
/// (SQLite), or a `postgres://` / `postgresql://` URL.
#[derive(Clone, PartialEq, Eq)]
pub enum Database {
    /// A SQLite file.
    Sqlite(std::path::PathBuf),
    /// A PostgreSQL connection URL (kept whole, password included).
    Postgres(String),
}

impl Database {
    /// Reads a `--db` value or `CORTEX_DB`.
    pub fn parse(text: &str) -> Self {
        if text.starts_with("postgres://") || text.starts_with("postgresql://") {
            Database::Postgres(text.to_owned())
        } else {
            let path = text.strip_prefix("sqlite://").unwrap_or(text);
            Database::Sqlite(path.into())
        }
    }

    /// The driver's name: `sqlite` or `postgres`.
    pub fn driver(&self) -> &'static str {
        match self {
            Database::Sqlite(_) => "sqlite",
            Database::Postgres(_) => "postgres",
        }
    }
}

/// Shows the database without a password (safe for logs and messages).
impl std::fmt::Display for Database {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Database::Sqlite(path) => write!(f, "{}", path.display()),
            Database::Postgres(url) => f.write_str(&redact_password(url)),
        }
    }
}

impl std::fmt::Debug for Database {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Database({}: {self})", self.driver())
    }
}

/// `url` with its passwords replaced by `***`: the one in its user info
/// (`user:password@`) and any `password=` parameter of its query.
pub fn redact_password(url: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let mut shown = redact_user_info(base);
    if let Some(query) = query {
        let parameters: Vec<String> = query
            .split('&')
            .map(|parameter| match parameter.split_once('=') {
                Some((name, _)) if name.eq_ignore_ascii_case("password") => format!("{name}=***"),
                _ => parameter.to_owned(),
            })
            .collect();
        shown.push('?');
        shown.push_str(&parameters.join("&"));
    }
    shown
}

fn redact_user_info(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_owned();
    };
    let rest = &url[scheme_end..];
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => match rest[..at].find(':') {
            Some(colon) => format!(
                "{}{}:***{}",
                &url[..scheme_end],
                &rest[..colon],
                &rest[at..]
            ),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

/// Opens connections to one queue, on whichever driver (each driver crate
/// makes its own: `Store::opener`, `PgStore::opener`): a server opens one
/// for its handlers and one for its worker thread.
#[derive(Clone)]
pub struct QueueOpener {
    database: Database,
    open: std::sync::Arc<dyn Fn() -> Result<Box<dyn Queue>> + Send + Sync>,
}

impl QueueOpener {
    /// An opener of `database` that calls `open` for each connection.
    pub fn new(
        database: Database,
        open: impl Fn() -> Result<Box<dyn Queue>> + Send + Sync + 'static,
    ) -> Self {
        Self {
            database,
            open: std::sync::Arc::new(open),
        }
    }

    /// A new connection.
    pub fn open(&self) -> Result<Box<dyn Queue>> {
        (self.open)()
    }

    /// Which database it opens.
    pub fn database(&self) -> &Database {
        &self.database
    }
}

impl std::fmt::Debug for QueueOpener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("QueueOpener").field(&self.database).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_select_the_driver() {
        assert_eq!(
            Database::parse("jobs.db"),
            Database::Sqlite("jobs.db".into())
        );
        assert_eq!(
            Database::parse("sqlite:///var/lib/cortex.db"),
            Database::Sqlite("/var/lib/cortex.db".into())
        );
        assert_eq!(Database::parse("postgres://u@h/db").driver(), "postgres");
        assert_eq!(Database::parse("postgresql://u@h/db").driver(), "postgres");
    }

    #[test]
    fn passwords_are_never_shown() {
        let db = Database::parse("postgres://cortex:s3cret@db.internal:5432/jobs");
        assert_eq!(
            db.to_string(),
            "postgres://cortex:***@db.internal:5432/jobs"
        );
        assert!(!format!("{db:?}").contains("s3cret"));
        assert_eq!(
            redact_password("postgres://cortex@host/db"),
            "postgres://cortex@host/db"
        );
        assert_eq!(
            redact_password("postgres://host/db?x=@"),
            "postgres://host/db?x=@"
        );
        assert_eq!(
            redact_password("postgres://u:a@host/db?sslmode=require&password=s3cret&user=u"),
            "postgres://u:***@host/db?sslmode=require&password=***&user=u"
        );
        assert!(
            !format!("{:?}", Database::parse("postgres://h/db?PASSWORD=s3cret")).contains("s3cret")
        );
    }
}
