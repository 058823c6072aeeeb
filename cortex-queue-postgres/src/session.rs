//! A connection's sessions: transactions (or autocommit runs) with the
//! connection's prepared statements at hand, what can end them, and how
//! PostgreSQL's errors are read (lost connection, lost race, or a real error).

use std::collections::HashMap;

use cortex_queue::QueueError;
use postgres::error::SqlState;
use postgres::types::ToSql;
use postgres::{Client, Row, Statement, Transaction};

/// Wakes the workers waiting on `LISTEN cortex_work` (at commit).
pub(crate) const NOTIFY_WORK: &str = "SELECT pg_notify('cortex_work', '')";

/// A live connection and the statements prepared on it.
pub(crate) struct Conn {
    pub(crate) client: Client,
    pub(crate) statements: HashMap<String, Statement>,
    pub(crate) listening: bool,
}

/// Where a body's statements go: a transaction, or (for bodies of one
/// statement, or of statements that need not commit together) straight to
/// the connection, each statement committing on its own: no `BEGIN` and
/// `COMMIT` round trips.
pub(crate) enum Target<'a> {
    Transaction(Transaction<'a>),
    Autocommit(&'a mut Client),
}

/// A transaction (or an autocommit session) with the connection's prepared
/// statements at hand.
pub(crate) struct Tx<'a> {
    pub(crate) target: Target<'a>,
    pub(crate) statements: &'a mut HashMap<String, Statement>,
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
        self.execute(NOTIFY_WORK, &[]).map(drop)
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
pub(crate) fn is_connection_lost(error: &postgres::Error) -> bool {
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
pub(crate) fn is_transient(error: &postgres::Error) -> bool {
    matches!(
        error.code(),
        Some(code) if *code == SqlState::T_R_DEADLOCK_DETECTED
            || *code == SqlState::T_R_SERIALIZATION_FAILURE
    )
}

/// A PostgreSQL error's own words (the server's message, not the driver's wrapping).
pub(crate) fn describe(error: &postgres::Error) -> String {
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

/// One run of a transaction body, committed if it succeeds.
pub(crate) fn attempt<T>(
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
pub(crate) fn pg_error(place: &std::path::Path, error: &postgres::Error) -> QueueError {
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
