//! The SQLite connection: opening, configuration, migrations, and transactions retried while busy.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rusqlite::{Connection, ErrorCode, OpenFlags, Transaction, TransactionBehavior};

use crate::schema::{MIGRATIONS, SCHEMA_VERSION};
use cortex_queue::{QueueError, Result, RetryPolicy, now_ms};

/// How hard SQLite pushes each commit to the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Synchronous {
    /// Every commit is durable before it returns (fsync per commit).
    #[default]
    Full,
    /// Commits survive a process crash but the last ones may be lost on power loss.
    Normal,
}

/// How a [`Store`] uses its database.
#[derive(Debug, Clone, PartialEq)]
pub struct StoreConfig {
    /// Durability of commits.
    pub synchronous: Synchronous,
    /// How long SQLite itself waits for a lock before reporting busy.
    pub busy_timeout: Duration,
    /// How long a call keeps retrying (with jitter) while the database stays
    /// busy before it gives up with [`QueueError::Busy`].
    pub busy_patience: Duration,
    /// When failed items and lone suspects run again.
    pub retry: RetryPolicy,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            synchronous: Synchronous::Full,
            busy_timeout: Duration::from_millis(250),
            busy_patience: Duration::from_secs(120),
            retry: RetryPolicy::default(),
        }
    }
}

/// One connection to a job database. Open one per thread or process.
pub struct Store {
    pub(crate) conn: Connection,
    pub(crate) path: PathBuf,
    pub(crate) config: StoreConfig,
    /// This process's row in `workers`, registered at its first claim.
    pub(crate) worker: Option<i64>,
    jitter: u64,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("path", &self.path)
            .field("worker", &self.worker)
            .finish_non_exhaustive()
    }
}

/// Errors that leave a transaction worth retrying as a whole.
fn is_busy(error: &rusqlite::Error) -> bool {
    matches!(
        error.sqlite_error_code(),
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
    )
}

impl Store {
    /// Opens (creating if needed) the database at `path` with default settings.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_with(path, StoreConfig::default())
    }

    /// Opens (creating if needed) the database at `path`, migrating its schema.
    pub fn open_with(path: impl AsRef<Path>, config: StoreConfig) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let open_error = |detail: String| QueueError::Open {
            path: path.clone(),
            detail,
        };
        if let Some(parent) = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty() && !p.is_dir())
        {
            return Err(open_error(format!(
                "the directory {} does not exist",
                parent.display()
            )));
        }
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn =
            Connection::open_with_flags(&path, flags).map_err(|e| open_error(e.to_string()))?;
        let seed = u64::from(std::process::id()) ^ (now_ms() as u64).rotate_left(17);
        let mut store = Store {
            conn,
            path: path.clone(),
            config,
            worker: None,
            jitter: seed | 1,
        };
        store.configure().map_err(|e| match e {
            QueueError::Database { detail, .. } => open_error(detail),
            other => other,
        })?;
        store.migrate()?;
        Ok(store)
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The settings this store runs with.
    pub fn config(&self) -> &StoreConfig {
        &self.config
    }

    fn configure(&mut self) -> Result<()> {
        self.conn
            .busy_timeout(self.config.busy_timeout)
            .map_err(|e| self.db_error(&e))?;
        let mode: String = self
            .retrying(|conn| conn.query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0)))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(QueueError::Database {
                path: self.path.clone(),
                detail: format!(
                    "cannot use WAL journaling here (SQLite chose {mode:?}); put the database on a local disk"
                ),
            });
        }
        let synchronous = match self.config.synchronous {
            Synchronous::Full => "FULL",
            Synchronous::Normal => "NORMAL",
        };
        // A 64 MiB page cache keeps the index inserts of a big submit in memory;
        // the WAL is cut back to 64 MiB after checkpoints.
        self.conn
            .execute_batch(&format!(
                "PRAGMA synchronous = {synchronous}; PRAGMA foreign_keys = ON; PRAGMA cache_size = -65536; PRAGMA journal_size_limit = 67108864;"
            ))
            .map_err(|e| self.db_error(&e))
    }

    /// The schema version of the open database.
    pub fn schema_version(&self) -> Result<i64> {
        self.conn
            .query_row("PRAGMA user_version", [], |row| row.get(0))
            .map_err(|e| self.db_error(&e))
    }

    fn migrate(&mut self) -> Result<()> {
        let found = self.schema_version()?;
        if found == SCHEMA_VERSION {
            return Ok(());
        }
        if found > SCHEMA_VERSION {
            return Err(QueueError::NewerSchema {
                path: self.path.clone(),
                found,
                supported: SCHEMA_VERSION,
            });
        }
        self.write(|tx| {
            // Read again under the write lock: another process may have migrated meanwhile.
            let mut version: i64 = tx.query_row("PRAGMA user_version", [], |row| row.get(0))?;
            while version < SCHEMA_VERSION {
                tx.execute_batch(MIGRATIONS[version as usize])?;
                version += 1;
            }
            tx.execute_batch(&format!("PRAGMA user_version = {version}"))?;
            Ok(())
        })
    }

    /// Maps a SQLite error to the crate's error, naming the database.
    pub(crate) fn db_error(&self, error: &rusqlite::Error) -> QueueError {
        map_error(&self.path, error)
    }

    /// Starts a `BEGIN IMMEDIATE` transaction, waiting (with jitter) while
    /// another writer holds the database. For long writes that cannot be
    /// replayed (a streamed submit); short ones use [`Store::write`].
    pub(crate) fn begin_immediate(&mut self) -> Result<ImmediateTx<'_>> {
        self.retrying(|conn| conn.execute_batch("BEGIN IMMEDIATE"))?;
        Ok(ImmediateTx {
            conn: &self.conn,
            finished: false,
        })
    }

    /// A pause of 5..50 ms, different per process, so retrying writers spread out.
    fn jitter_pause(&mut self) -> Duration {
        // xorshift64: good enough to decorrelate processes, no dependency.
        self.jitter ^= self.jitter << 13;
        self.jitter ^= self.jitter >> 7;
        self.jitter ^= self.jitter << 17;
        Duration::from_millis(5 + self.jitter % 45)
    }

    /// After a failed attempt begun at `started`: pauses (with jitter) and
    /// returns `Ok` when the database was only busy and patience is left, else the error.
    fn pause_or_give_up(&mut self, started: Instant, error: &rusqlite::Error) -> Result<()> {
        if !is_busy(error) {
            return Err(self.db_error(error));
        }
        if started.elapsed() >= self.config.busy_patience {
            return Err(QueueError::Busy {
                path: self.path.clone(),
                seconds: started.elapsed().as_secs_f64(),
            });
        }
        let pause = self.jitter_pause();
        std::thread::sleep(pause);
        Ok(())
    }

    /// Runs `f` again while the database is busy, up to the configured patience.
    fn retrying<T>(&mut self, mut f: impl FnMut(&Connection) -> rusqlite::Result<T>) -> Result<T> {
        let started = Instant::now();
        loop {
            match f(&self.conn) {
                Ok(value) => return Ok(value),
                Err(e) => self.pause_or_give_up(started, &e)?,
            }
        }
    }

    /// Runs `f` in a `BEGIN IMMEDIATE` transaction and commits; the whole
    /// transaction is retried with jitter while another writer holds the database.
    pub(crate) fn write<T>(
        &mut self,
        mut f: impl FnMut(&Transaction<'_>) -> rusqlite::Result<T>,
    ) -> Result<T> {
        self.write_checked(|tx| f(tx).map_err(Outcome::Sqlite))
    }

    /// Like [`Store::write`], for bodies that can also fail with a queue error
    /// (which rolls the transaction back and is returned as is).
    pub(crate) fn write_checked<T>(
        &mut self,
        f: impl FnMut(&Transaction<'_>) -> Result<T, Outcome>,
    ) -> Result<T> {
        self.transact(TransactionBehavior::Immediate, f)
    }

    /// Runs read-only `f` on one consistent snapshot, retrying while busy.
    pub(crate) fn read<T>(
        &mut self,
        f: impl FnMut(&Transaction<'_>) -> Result<T, Outcome>,
    ) -> Result<T> {
        self.transact(TransactionBehavior::Deferred, f)
    }

    /// Runs `f` in a transaction and commits it, retrying the whole
    /// transaction with jitter while another process holds the database.
    fn transact<T>(
        &mut self,
        behavior: TransactionBehavior,
        mut f: impl FnMut(&Transaction<'_>) -> Result<T, Outcome>,
    ) -> Result<T> {
        let started = Instant::now();
        loop {
            let error = match self.conn.transaction_with_behavior(behavior) {
                Ok(tx) => match f(&tx) {
                    Ok(value) => match tx.commit() {
                        Ok(()) => return Ok(value),
                        Err(e) => e,
                    },
                    Err(Outcome::Queue(e)) => return Err(e),
                    Err(Outcome::Sqlite(e)) => e,
                },
                Err(e) => e,
            };
            self.pause_or_give_up(started, &error)?;
        }
    }

    /// Runs SQLite's `integrity_check` and foreign key check; `Ok` when both pass.
    pub fn integrity_check(&mut self) -> Result<()> {
        let problems = self.read(|tx| {
            let mut problems: Vec<String> = tx
                .prepare("PRAGMA integrity_check")?
                .query_map([], |row| row.get::<_, String>(0))?
                .collect::<rusqlite::Result<_>>()?;
            problems.retain(|p| p != "ok");
            let orphans: i64 =
                tx.query_row("SELECT count(*) FROM pragma_foreign_key_check", [], |row| {
                    row.get(0)
                })?;
            if orphans > 0 {
                problems.push(format!("{orphans} rows break a foreign key"));
            }
            Ok(problems)
        })?;
        if problems.is_empty() {
            Ok(())
        } else {
            Err(QueueError::Database {
                path: self.path.clone(),
                detail: format!("integrity check failed: {}", problems.join("; ")),
            })
        }
    }

    /// Copies the write-ahead log into the database file and truncates it
    /// (SQLite also does this on its own as the log grows).
    pub fn checkpoint(&mut self) -> Result<()> {
        self.retrying(|conn| conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(())))
    }

    /// Limits the database to `pages` pages (of the page size, 4 KiB by default)
    /// for this connection: writes beyond it fail as a full disk would. For
    /// tests and for capping a database's growth.
    pub fn set_max_page_count(&mut self, pages: i64) -> Result<i64> {
        self.retrying(|conn| {
            conn.query_row(&format!("PRAGMA max_page_count = {pages}"), [], |row| {
                row.get(0)
            })
        })
    }
}

/// Maps a SQLite error to the crate's error, naming the database.
pub(crate) fn map_error(path: &Path, error: &rusqlite::Error) -> QueueError {
    match error.sqlite_error_code() {
        Some(ErrorCode::DiskFull) => QueueError::DiskFull {
            path: path.to_path_buf(),
        },
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => QueueError::Busy {
            path: path.to_path_buf(),
            seconds: 0.0,
        },
        _ => QueueError::Database {
            path: path.to_path_buf(),
            detail: error.to_string(),
        },
    }
}

/// An open `BEGIN IMMEDIATE` transaction; rolled back unless committed.
pub(crate) struct ImmediateTx<'a> {
    conn: &'a Connection,
    finished: bool,
}

impl ImmediateTx<'_> {
    pub(crate) fn commit(mut self) -> rusqlite::Result<()> {
        self.finished = true;
        self.conn.execute_batch("COMMIT").inspect_err(|_| {
            let _ = self.conn.execute_batch("ROLLBACK");
        })
    }
}

impl std::ops::Deref for ImmediateTx<'_> {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        self.conn
    }
}

impl Drop for ImmediateTx<'_> {
    fn drop(&mut self) {
        if !self.finished {
            let _ = self.conn.execute_batch("ROLLBACK");
        }
    }
}

/// What can end a transaction body early.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// SQLite failed (retried when busy).
    Sqlite(rusqlite::Error),
    /// The operation itself refused (rolled back, returned as is).
    Queue(QueueError),
}

impl From<rusqlite::Error> for Outcome {
    fn from(error: rusqlite::Error) -> Self {
        Outcome::Sqlite(error)
    }
}

impl From<QueueError> for Outcome {
    fn from(error: QueueError) -> Self {
        Outcome::Queue(error)
    }
}
