//! The cortex job queue on PostgreSQL: the same jobs, items, leases and
//! results as the SQLite driver (`cortex_queue_sqlite::Store`), for a queue that
//! workers on many hosts share.
//!
//! [`PgStore`] implements [`WorkerStore`](cortex_queue::WorkerStore) and
//! [`JobStore`](cortex_queue::JobStore), so `cortex-worker`, the CLI and the
//! server run on it unchanged. What differs underneath:
//!
//! - A claim is one `UPDATE … WHERE id IN (SELECT … ORDER BY priority DESC,
//!   id LIMIT n FOR UPDATE SKIP LOCKED)`: concurrent claimers skip each
//!   other's rows instead of waiting. Every write presents the lease token.
//! - Per-job counts live in `job_counts`, one row per job and writing
//!   connection (a shard), moved once per statement by a trigger: many
//!   workers finishing one job's items do not queue on one row. A job's
//!   state follows from the summed counts ([`JobState::settled`](cortex_queue::JobState::settled)),
//!   applied under the job's row lock after each write commits.
//! - Time is the database server's clock (`cortex_now()`), so leases mean
//!   the same on every host; a worker whose lease ran out is found by that
//!   alone (and, on its own host, by its process being gone).
//! - Idle workers wait on `LISTEN cortex_work`; writes that make items
//!   claimable `NOTIFY` it.
//! - A lost connection (the server restarted, the network dropped) is
//!   retried with backoff for [`PgConfig::reconnect_patience`]; a write whose
//!   commit went unanswered is safe to repeat, since its lease token no
//!   longer matches once it took effect.
//!
//! # Example
//!
//! ```no_run
//! use cortex_queue::{ClaimOptions, JobStore, WorkerStore};
//! use cortex_queue_postgres::PgStore;
//!
//! let mut queue = PgStore::connect("postgres://cortex@db.internal/cortex")?;
//! for job in queue.jobs(&Default::default())? {
//!     println!("{} {} {}/{}", job.id, job.state, job.counts.finished(), job.counts.total);
//! }
//! let claimed = queue.claim(8, &ClaimOptions::default())?;
//! queue.release(&claimed.iter().map(|c| c.lease).collect::<Vec<_>>())?;
//! # Ok::<(), cortex_queue::QueueError>(())
//! ```
//!
//! # Design notes
//!
//! The queue on PostgreSQL (the synchronous `postgres` client: the queue API,
//! the worker and the CLI are blocking; its tokio runtime stays inside this
//! crate). `PgStore` implements `WorkerStore` and `JobStore`; the CLI builds it
//! from `--db postgres://…` (feature `postgres` of `cortex-cli`, on by default).
//!
//! - TLS (`tls`): libpq's `sslmode` (`disable`, `prefer`, `require`,
//!   `verify-ca`, `verify-full`) and `sslrootcert` are taken off the URL (the
//!   client parses only three modes) and turned into a `native-tls` connector
//!   (the system's OpenSSL) that checks what the mode says.
//!
//! - Schema (`migrations/`, version in `cortex_schema`, applied under a
//!   transaction-scoped advisory lock; a newer schema is refused): the SQLite
//!   schema's concepts at its latest version, plus `workers.heartbeat_at` and
//!   `job_counts`. Time is `cortex_now()`, the server's clock in ms, so every
//!   host reads leases against one clock.
//! - Claim: `UPDATE items … WHERE id IN (SELECT id … ORDER BY priority DESC, id
//!   LIMIT n FOR UPDATE SKIP LOCKED)` over partial indexes (`items_ready`,
//!   `items_suspects`); the expired-lease sweep before it is one statement too
//!   (`record_deaths`: the rule of `cortex_queue::driver::death_assignments`
//!   plus the death streak's update in one CTE, rows another claimer sweeps
//!   skipped). Statements that need not commit
//!   together run without `BEGIN`/`COMMIT` (autocommit), so a claim is about four
//!   round trips and a `complete_many` two.
//! - Counters: statement-level triggers with transition tables add each
//!   statement's net change per job to `job_counts(job_id, shard)`, the shard
//!   being the writing connection's (`pg_backend_pid() % 16`), job ids in order.
//!   Many workers finishing one job's items update different rows instead of
//!   queueing on one. A job's counts are the sum of its shards.
//! - The state machine under concurrency: a transaction sees only committed
//!   counts, so two workers finishing the last two items could each see the
//!   other's as running. So `settle` runs after each write commits, reads the
//!   summed counts, and only when `JobState::settled` says the state moves
//!   takes the job's row lock (`FOR UPDATE`) and checks again: whoever commits
//!   last sees everything. Reads settle too, so a writer killed between commit
//!   and settle leaves nothing stale. Cancel, resume and retry take the row lock.
//! - Dead workers: on another host, by lease expiry alone; on this host (same
//!   host identity), by pid and start time as in SQLite, every 2 s. Workers
//!   refresh `heartbeat_at` at claims; long-silent registrations are removed.
//! - Idle workers `LISTEN cortex_work` (`WorkerStore::wait_for_work`); submit,
//!   release, retryable failures, resume and retry `NOTIFY` it.
//! - Connection loss: every call runs in `run`/`run_autocommit`, which on a lost
//!   connection (I/O error, `57P01` admin shutdown, …) reconnects and runs the
//!   whole body again with backoff (100 ms doubling to 5 s) for
//!   `reconnect_patience` (5 min); deadlocks and serialization failures are
//!   retried at once. A body that committed but whose reply was lost is safe to
//!   repeat: its lease tokens no longer match. Submit is not retried (its input
//!   is read once); it is all or nothing either way.
//! - Submit streams items with `COPY … FROM STDIN` inside one transaction;
//!   duplicate `custom_id`s are found in memory (with the line that first used
//!   it) so the copy never fails half-way. Export runs in one `REPEATABLE READ`
//!   snapshot through a cursor (portal, 5,000 rows a fetch).
//! - `check_counts` compares every job's counters with its items and results
//!   (the shared suite's consistency check, as `integrity_check` is for SQLite).

#![forbid(unsafe_code)]

mod admin;
mod expiry;
mod export;
mod jobs;
mod lease;
mod session;
mod submit;
mod tls;
mod webhooks;

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use cortex_queue::{Database, QueueError, QueueOpener, Result, RetryPolicy};
use postgres::Row;
use postgres::fallible_iterator::FallibleIterator;
use session::{Conn, Failure, Tx, attempt, describe, is_connection_lost, is_transient, pg_error};

pub use admin::SCHEMA_VERSION;

/// The channel idle workers listen on.
const WORK_CHANNEL: &str = "cortex_work";

/// How a [`PgStore`] behaves.
#[derive(Debug, Clone, PartialEq)]
pub struct PgConfig {
    /// When failed items and lone suspects run again.
    pub retry: RetryPolicy,
    /// How long a call keeps reconnecting after the connection was lost
    /// before it gives up with an error.
    pub reconnect_patience: Duration,
    /// How long a connection attempt may take.
    pub connect_timeout: Duration,
}

impl Default for PgConfig {
    fn default() -> Self {
        Self {
            retry: RetryPolicy::default(),
            reconnect_patience: Duration::from_secs(300),
            connect_timeout: Duration::from_secs(10),
        }
    }
}

/// One connection to a queue in a PostgreSQL database, reconnecting when
/// the connection is lost. Open one per thread or process.
pub struct PgStore {
    url: String,
    /// The URL without its password, for messages.
    shown: String,
    pub(crate) config: PgConfig,
    conn: Option<Conn>,
    /// This process's row in `workers`, registered at its first claim.
    pub(crate) worker: Option<i64>,
    /// When this store last looked for dead workers on its host.
    pub(crate) last_reap: Option<Instant>,
    /// When a claim last refreshed this worker's registration.
    pub(crate) last_worker_heartbeat: Option<Instant>,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("database", &self.shown)
            .field("worker", &self.worker)
            .finish_non_exhaustive()
    }
}

impl PgStore {
    /// Connects to the database at `url` (`postgres://user[:password]@host[:port]/db`)
    /// with default settings, creating or migrating the queue's tables.
    pub fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, PgConfig::default())
    }

    /// Connects with `config`; the first connection is not retried, so a
    /// wrong address or password is an error at once.
    pub fn connect_with(url: &str, config: PgConfig) -> Result<Self> {
        let mut store = PgStore {
            url: url.to_owned(),
            shown: cortex_queue::redact_password(url),
            config,
            conn: None,
            worker: None,
            last_reap: None,
            last_worker_heartbeat: None,
        };
        store.conn = Some(store.open_connection()?);
        Ok(store)
    }

    /// An opener for a server or worker thread: each call connects anew.
    pub fn opener(url: &str, config: PgConfig) -> QueueOpener {
        let url = url.to_owned();
        QueueOpener::new(Database::Postgres(url.clone()), move || {
            Ok(Box::new(PgStore::connect_with(&url, config.clone())?))
        })
    }

    fn place(&self) -> PathBuf {
        PathBuf::from(&self.shown)
    }

    fn open_connection(&self) -> Result<Conn> {
        let open_error = |detail: String| QueueError::Open {
            path: self.place(),
            detail,
        };
        let client = tls::connect(&self.url, |pg| {
            pg.connect_timeout(self.config.connect_timeout);
            if pg.get_application_name().is_none() {
                pg.application_name("cortex");
            }
        })
        .map_err(open_error)?;
        let mut conn = Conn {
            client,
            statements: HashMap::new(),
            listening: false,
        };
        self.migrate(&mut conn)?;
        Ok(conn)
    }

    /// Runs `body` in a transaction and commits it. A lost connection is
    /// reconnected and the whole transaction run again (with backoff, for
    /// [`PgConfig::reconnect_patience`]); so is a lost deadlock.
    pub(crate) fn run<T>(
        &mut self,
        body: impl FnMut(&mut Tx<'_>) -> Result<T, Failure>,
    ) -> Result<T> {
        self.run_as(true, body)
    }

    /// [`PgStore::run`] without a transaction: each statement commits on
    /// its own (for bodies of one statement, or whose statements need not
    /// commit together), saving the `BEGIN` and `COMMIT` round trips.
    pub(crate) fn run_autocommit<T>(
        &mut self,
        body: impl FnMut(&mut Tx<'_>) -> Result<T, Failure>,
    ) -> Result<T> {
        self.run_as(false, body)
    }

    fn run_as<T>(
        &mut self,
        in_transaction: bool,
        mut body: impl FnMut(&mut Tx<'_>) -> Result<T, Failure>,
    ) -> Result<T> {
        let started = Instant::now();
        let mut pause = Duration::from_millis(100);
        let place = self.place();
        loop {
            let lost = match self.connection() {
                Err(detail) => detail,
                Ok(conn) => match attempt(conn, in_transaction, &mut body) {
                    Ok(value) => return Ok(value),
                    Err(Failure::Queue(e)) => return Err(e),
                    Err(Failure::Pg(e)) if is_transient(&e) => continue,
                    Err(Failure::Pg(e)) if is_connection_lost(&e) => describe(&e),
                    Err(Failure::Pg(e)) => return Err(pg_error(&place, &e)),
                },
            };
            self.conn = None;
            if started.elapsed() >= self.config.reconnect_patience {
                return Err(QueueError::Database {
                    path: place,
                    detail: format!(
                        "lost the connection and could not get it back in {:.0} s: {lost}",
                        started.elapsed().as_secs_f64()
                    ),
                });
            }
            tracing::warn!(
                database = %self.shown,
                retry_in_ms = pause.as_millis() as u64,
                "lost the connection to the queue ({lost}); reconnecting"
            );
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_secs(5));
        }
    }

    /// The live connection, reconnecting if it was lost; why not, if it cannot.
    fn connection(&mut self) -> Result<&mut Conn, String> {
        if self.conn.as_ref().is_some_and(|c| c.client.is_closed()) {
            self.conn = None;
        }
        if self.conn.is_none() {
            self.conn = Some(self.open_connection().map_err(|e| e.to_string())?);
        }
        Ok(self.conn.as_mut().expect("connected above"))
    }

    /// Waits until a write makes items claimable (`NOTIFY cortex_work`) or
    /// `longest` passed.
    pub(crate) fn wait_for_notification(&mut self, longest: Duration) -> Result<()> {
        let place = self.place();
        let conn = match self.connection() {
            Ok(conn) => conn,
            Err(why) => {
                tracing::warn!(database = %self.shown, "cannot reconnect: {why}");
                std::thread::sleep(longest.min(Duration::from_secs(1)));
                return Ok(());
            }
        };
        if !conn.listening {
            if let Err(e) = conn.client.batch_execute(&format!("LISTEN {WORK_CHANNEL}")) {
                if is_connection_lost(&e) {
                    self.conn = None;
                    return Ok(());
                }
                return Err(QueueError::Database {
                    path: place,
                    detail: describe(&e),
                });
            }
            conn.listening = true;
        }
        let lost = {
            let mut notifications = conn.client.notifications();
            // What arrived already comes at once; else wait for one.
            let got = notifications.timeout_iter(longest).next();
            // Several writes often notify together: one wake-up for all.
            let _ = notifications.iter().count();
            matches!(got, Err(ref e) if is_connection_lost(e))
        };
        if lost {
            self.conn = None;
        }
        Ok(())
    }
}

/// Reads a count column (never negative). that may be NULL.
pub(crate) fn count(row: &Row, index: usize) -> u64 {
    u64::try_from(row.get::<_, i64>(index)).unwrap_or(0)
}
