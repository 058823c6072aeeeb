//! Administration: the schema and its migrations, creating databases (for
//! tests and throwaway queues), and looking inside a queue (its counters'
//! consistency, its workers).

use std::path::PathBuf;

use cortex_queue::{QueueError, Result};

use crate::PgStore;
use crate::session::{Conn, describe};

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// `MIGRATIONS[i]` takes the schema from version `i` to `i + 1`; never edit a released one.
const MIGRATIONS: [&str; 8] = [
    include_str!("../migrations/0001_queue.sql"),
    include_str!("../migrations/0002_projects.sql"),
    include_str!("../migrations/0003_item_runs.sql"),
    include_str!("../migrations/0004_generated_tokens.sql"),
    include_str!("../migrations/0005_completion_windows.sql"),
    include_str!("../migrations/0006_webhooks.sql"),
    include_str!("../migrations/0007_job_outputs.sql"),
    include_str!("../migrations/0008_outputs_may_vary.sql"),
];

impl PgStore {
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
        let mut client =
            crate::tls::connect(server_url, |_| {}).map_err(|detail| QueueError::Open {
                path: place.clone(),
                detail,
            })?;
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

    /// Creates or upgrades the schema under an advisory lock, so that many
    /// workers starting at once migrate it exactly once.
    pub(crate) fn migrate(&self, conn: &mut Conn) -> Result<()> {
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
}
