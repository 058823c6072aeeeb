//! The cortex job queue on PostgreSQL: the same jobs, items, leases and
//! results as the SQLite [`Store`](cortex_queue::Store), for a queue that
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

#![forbid(unsafe_code)]

mod export;
mod jobs;
mod lease;
mod submit;
pub mod testing;

use std::collections::HashMap;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::{Duration, Instant};

use cortex_queue::{Database, QueueError, QueueOpener, Result};
use postgres::error::SqlState;
use postgres::fallible_iterator::FallibleIterator;
use postgres::types::ToSql;
use postgres::{Client, NoTls, Row, Statement, Transaction};

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// `MIGRATIONS[i]` takes the schema from version `i` to `i + 1`; never edit a released one.
const MIGRATIONS: [&str; 1] = [include_str!("../migrations/0001_queue.sql")];

/// The channel idle workers listen on.
const WORK_CHANNEL: &str = "cortex_work";

/// How a [`PgStore`] behaves.
#[derive(Debug, Clone, PartialEq)]
pub struct PgConfig {
    /// First retry delay of a failed item; doubled per attempt.
    pub retry_backoff: Duration,
    /// Longest retry delay.
    pub max_retry_backoff: Duration,
    /// How long a lone suspect whose worker died waits before it runs alone
    /// again (see the SQLite [`StoreConfig`](cortex_queue::StoreConfig)).
    pub lone_retry: Duration,
    /// How long a call keeps reconnecting after the connection was lost
    /// before it gives up with an error.
    pub reconnect_patience: Duration,
    /// How long a connection attempt may take.
    pub connect_timeout: Duration,
}

impl Default for PgConfig {
    fn default() -> Self {
        Self {
            retry_backoff: Duration::from_secs(2),
            max_retry_backoff: Duration::from_secs(300),
            lone_retry: Duration::from_secs(1),
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

/// A live connection and the statements prepared on it.
pub(crate) struct Conn {
    client: Client,
    statements: HashMap<String, Statement>,
    listening: bool,
}

/// Where a body's statements go: a transaction, or (for bodies of one
/// statement, or of statements that need not commit together) straight to
/// the connection, each statement committing on its own: no `BEGIN` and
/// `COMMIT` round trips.
enum Target<'a> {
    Transaction(Transaction<'a>),
    Autocommit(&'a mut Client),
}

/// A transaction (or an autocommit session) with the connection's prepared
/// statements at hand.
pub(crate) struct Tx<'a> {
    target: Target<'a>,
    statements: &'a mut HashMap<String, Statement>,
}

/// A parameter list.
pub(crate) type Params<'a> = [&'a (dyn ToSql + Sync)];

/// Runs one `postgres` call on whichever target.
macro_rules! on_target {
    ($self:expr, $client:ident => $call:expr) => {
        match &mut $self.target {
            Target::Transaction($client) => $call,
            Target::Autocommit($client) => $call,
        }
    };
}

impl<'a> Tx<'a> {
    fn statement(&mut self, sql: &str) -> Result<Statement, postgres::Error> {
        if let Some(statement) = self.statements.get(sql) {
            return Ok(statement.clone());
        }
        let statement = on_target!(self, c => c.prepare(sql))?;
        self.statements.insert(sql.to_owned(), statement.clone());
        Ok(statement)
    }

    pub(crate) fn query(&mut self, sql: &str, params: &Params<'_>) -> Result<Vec<Row>, Failure> {
        let statement = self.statement(sql)?;
        Ok(on_target!(self, c => c.query(&statement, params))?)
    }

    pub(crate) fn query_opt(
        &mut self,
        sql: &str,
        params: &Params<'_>,
    ) -> Result<Option<Row>, Failure> {
        let statement = self.statement(sql)?;
        Ok(on_target!(self, c => c.query_opt(&statement, params))?)
    }

    pub(crate) fn query_one(&mut self, sql: &str, params: &Params<'_>) -> Result<Row, Failure> {
        let statement = self.statement(sql)?;
        Ok(on_target!(self, c => c.query_one(&statement, params))?)
    }

    pub(crate) fn execute(&mut self, sql: &str, params: &Params<'_>) -> Result<u64, Failure> {
        let statement = self.statement(sql)?;
        Ok(on_target!(self, c => c.execute(&statement, params))?)
    }

    /// The database server's time (Unix ms), the clock every lease is read against.
    pub(crate) fn now(&mut self) -> Result<i64, Failure> {
        Ok(self.query_one("SELECT cortex_now()", &[])?.get(0))
    }

    /// Wakes idle workers once this transaction commits.
    pub(crate) fn notify_work(&mut self) -> Result<(), Failure> {
        self.execute("SELECT pg_notify('cortex_work', '')", &[])
            .map(drop)
    }

    /// The transaction itself, for what the cache does not cover (COPY,
    /// portals); `None` in an autocommit session.
    pub(crate) fn transaction(&mut self) -> Option<&mut Transaction<'a>> {
        match &mut self.target {
            Target::Transaction(tx) => Some(tx),
            Target::Autocommit(_) => None,
        }
    }

    fn commit(self) -> Result<(), Failure> {
        match self.target {
            Target::Transaction(tx) => Ok(tx.commit()?),
            Target::Autocommit(_) => Ok(()),
        }
    }
}

/// What can end a transaction body early.
#[derive(Debug)]
pub(crate) enum Failure {
    /// PostgreSQL failed (retried when the connection was lost or the
    /// transaction lost a deadlock or serialization race).
    Pg(postgres::Error),
    /// The operation itself refused (rolled back, returned as is).
    Queue(QueueError),
}

impl From<postgres::Error> for Failure {
    fn from(error: postgres::Error) -> Self {
        Failure::Pg(error)
    }
}

impl From<QueueError> for Failure {
    fn from(error: QueueError) -> Self {
        Failure::Queue(error)
    }
}

/// The connection itself is gone (server restart, network): reconnect and retry.
fn is_connection_lost(error: &postgres::Error) -> bool {
    if error.is_closed() {
        return true;
    }
    match error.code() {
        Some(code) => [
            SqlState::ADMIN_SHUTDOWN,
            SqlState::CRASH_SHUTDOWN,
            SqlState::CANNOT_CONNECT_NOW,
            SqlState::CONNECTION_FAILURE,
            SqlState::CONNECTION_EXCEPTION,
        ]
        .contains(code),
        // No SQLSTATE: an I/O error on the socket.
        None => error.as_db_error().is_none(),
    }
}

/// The transaction lost a race it can win by running again.
fn is_transient(error: &postgres::Error) -> bool {
    matches!(
        error.code(),
        Some(code) if *code == SqlState::T_R_DEADLOCK_DETECTED
            || *code == SqlState::T_R_SERIALIZATION_FAILURE
    )
}

/// A PostgreSQL error's own words (the server's message, not the driver's wrapping).
fn describe(error: &postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => db.message().to_owned(),
        None => {
            let mut text = error.to_string();
            let mut source = std::error::Error::source(error);
            while let Some(cause) = source {
                let cause = cause.to_string();
                if !text.contains(&cause) {
                    text = format!("{text}: {cause}");
                }
                source = cause_of(source);
            }
            text
        }
    }
}

fn cause_of<'a>(
    error: Option<&'a (dyn std::error::Error + 'static)>,
) -> Option<&'a (dyn std::error::Error + 'static)> {
    error.and_then(std::error::Error::source)
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

    /// Creates the database `name` on the server `server_url` names (dropping
    /// one of that name first), for tests and throwaway queues; returns its URL.
    pub fn create_database(server_url: &str, name: &str) -> Result<String> {
        let place = PathBuf::from(cortex_queue::redact_password(server_url));
        let fail = |e: postgres::Error| QueueError::Open {
            path: place.clone(),
            detail: describe(&e),
        };
        if !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(QueueError::Open {
                path: place,
                detail: format!("{name:?} is not a plain database name"),
            });
        }
        let mut client = postgres::Config::from_str(server_url)
            .map_err(fail)?
            .connect(NoTls)
            .map_err(fail)?;
        // One statement per call: DROP/CREATE DATABASE refuse to run in a transaction.
        for statement in [
            "SET client_min_messages = warning".to_owned(),
            format!("DROP DATABASE IF EXISTS {name}"),
            format!("CREATE DATABASE {name}"),
        ] {
            client.batch_execute(&statement).map_err(fail)?;
        }
        let scheme_end = server_url.find("://").map_or(0, |i| i + 3);
        let path_start = server_url[scheme_end..]
            .find('/')
            .map_or(server_url.len(), |i| scheme_end + i);
        let query = server_url[path_start..]
            .find('?')
            .map_or("", |i| &server_url[path_start + i..]);
        Ok(format!("{}/{name}{query}", &server_url[..path_start]))
    }

    /// An opener for a server or worker thread: each call connects anew.
    pub fn opener(url: &str, config: PgConfig) -> QueueOpener {
        let url = url.to_owned();
        QueueOpener::new(Database::Postgres(url.clone()), move || {
            Ok(Box::new(PgStore::connect_with(&url, config.clone())?))
        })
    }

    /// The schema version of the database.
    pub fn schema_version(&mut self) -> Result<i64> {
        self.run(|tx| {
            Ok(tx
                .query_one("SELECT version FROM cortex_schema", &[])?
                .get(0))
        })
    }

    /// Checks every job's counters (summed over shards) against its items
    /// and results; `Ok` when they agree.
    pub fn check_counts(&mut self) -> Result<()> {
        let wrong: Vec<i64> = self.run(|tx| {
            Ok(tx
                .query(
                    "WITH actual AS (
                         SELECT job_id, count(*) FILTER (WHERE state = 'pending') AS pending,
                                count(*) FILTER (WHERE state = 'running') AS running,
                                count(*) FILTER (WHERE state = 'completed') AS completed,
                                count(*) FILTER (WHERE state = 'failed') AS failed,
                                count(*) FILTER (WHERE state = 'cancelled') AS cancelled,
                                0::bigint AS prompt_tokens, 0::bigint AS completion_tokens
                         FROM items GROUP BY job_id
                         UNION ALL
                         SELECT job_id, 0, 0, 0, 0, 0, sum(prompt_tokens)::bigint, sum(completion_tokens)::bigint
                         FROM results GROUP BY job_id),
                     actual_sums AS (
                         SELECT job_id, sum(pending) AS pending, sum(running) AS running, sum(completed) AS completed,
                                sum(failed) AS failed, sum(cancelled) AS cancelled,
                                sum(prompt_tokens) AS prompt_tokens, sum(completion_tokens) AS completion_tokens
                         FROM actual GROUP BY job_id),
                     kept AS (
                         SELECT job_id, sum(pending) AS pending, sum(running) AS running, sum(completed) AS completed,
                                sum(failed) AS failed, sum(cancelled) AS cancelled,
                                sum(prompt_tokens) AS prompt_tokens, sum(completion_tokens) AS completion_tokens
                         FROM job_counts GROUP BY job_id)
                     SELECT coalesce(a.job_id, k.job_id) FROM actual_sums a FULL JOIN kept k ON k.job_id = a.job_id
                     WHERE (coalesce(a.pending, 0), coalesce(a.running, 0), coalesce(a.completed, 0),
                            coalesce(a.failed, 0), coalesce(a.cancelled, 0), coalesce(a.prompt_tokens, 0),
                            coalesce(a.completion_tokens, 0))
                        <> (coalesce(k.pending, 0), coalesce(k.running, 0), coalesce(k.completed, 0),
                            coalesce(k.failed, 0), coalesce(k.cancelled, 0), coalesce(k.prompt_tokens, 0),
                            coalesce(k.completion_tokens, 0))
                     ORDER BY 1",
                    &[],
                )?
                .iter()
                .map(|row| row.get(0))
                .collect())
        })?;
        if wrong.is_empty() {
            Ok(())
        } else {
            Err(QueueError::Database {
                path: self.place(),
                detail: format!("the counters of jobs {wrong:?} disagree with their items"),
            })
        }
    }

    /// The workers registered now, as (host identity, pid, items in flight),
    /// by host: which hosts serve the queue.
    pub fn workers(&mut self) -> Result<Vec<(String, i32, i64)>> {
        self.run(|tx| {
            Ok(tx
                .query(
                    "SELECT w.host, w.pid,
                            (SELECT count(*) FROM items i WHERE i.worker_id = w.id AND i.state = 'running')
                     FROM workers w ORDER BY w.host, w.pid",
                    &[],
                )?
                .iter()
                .map(|row| (row.get(0), row.get(1), row.get(2)))
                .collect())
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
        let mut pg = postgres::Config::from_str(&self.url)
            .map_err(|e| open_error(format!("not a PostgreSQL URL: {e}")))?;
        pg.connect_timeout(self.config.connect_timeout);
        if pg.get_application_name().is_none() {
            pg.application_name("cortex");
        }
        let client = pg.connect(NoTls).map_err(|e| open_error(describe(&e)))?;
        let mut conn = Conn {
            client,
            statements: HashMap::new(),
            listening: false,
        };
        self.migrate(&mut conn)?;
        Ok(conn)
    }

    /// Creates or upgrades the schema under an advisory lock, so that many
    /// workers starting at once migrate it exactly once.
    fn migrate(&self, conn: &mut Conn) -> Result<()> {
        let place = self.place();
        let database = |e: postgres::Error| QueueError::Database {
            path: place.clone(),
            detail: describe(&e),
        };
        let mut tx = conn.client.transaction().map_err(database)?;
        tx.execute("SELECT pg_advisory_xact_lock(7306157711)", &[])
            .map_err(database)?;
        tx.batch_execute("CREATE TABLE IF NOT EXISTS cortex_schema (version BIGINT NOT NULL)")
            .map_err(database)?;
        let found: Option<i64> = tx
            .query_opt("SELECT version FROM cortex_schema", &[])
            .map_err(database)?
            .map(|row| row.get(0));
        let found = found.unwrap_or(0);
        if found > SCHEMA_VERSION {
            return Err(QueueError::NewerSchema {
                path: place,
                found,
                supported: SCHEMA_VERSION,
            });
        }
        for migration in &MIGRATIONS[found as usize..] {
            tx.batch_execute(migration).map_err(database)?;
        }
        if found < SCHEMA_VERSION {
            tx.execute("DELETE FROM cortex_schema", &[])
                .map_err(database)?;
            tx.execute(
                "INSERT INTO cortex_schema (version) VALUES ($1)",
                &[&SCHEMA_VERSION],
            )
            .map_err(database)?;
        }
        tx.commit().map_err(database)
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

/// One run of a transaction body, committed if it succeeds.
fn attempt<T>(
    conn: &mut Conn,
    in_transaction: bool,
    body: &mut impl FnMut(&mut Tx<'_>) -> Result<T, Failure>,
) -> Result<T, Failure> {
    let target = if in_transaction {
        Target::Transaction(conn.client.transaction()?)
    } else {
        Target::Autocommit(&mut conn.client)
    };
    let mut tx = Tx {
        target,
        statements: &mut conn.statements,
    };
    let value = body(&mut tx)?;
    tx.commit()?;
    Ok(value)
}

/// Maps a PostgreSQL error to the crate's error, naming the database.
fn pg_error(place: &std::path::Path, error: &postgres::Error) -> QueueError {
    match error.code() {
        Some(code) if *code == SqlState::DISK_FULL => QueueError::DiskFull {
            path: place.to_path_buf(),
        },
        _ => QueueError::Database {
            path: place.to_path_buf(),
            detail: describe(error),
        },
    }
}

/// Reads a count column (never negative). that may be NULL.
pub(crate) fn count(row: &Row, index: usize) -> u64 {
    u64::try_from(row.get::<_, i64>(index)).unwrap_or(0)
}
