//! A job's output and error files from PostgreSQL: one snapshot
//! (`REPEATABLE READ`), rows fetched through a cursor a few thousand at a
//! time, so a 50-million-item job streams to disk without being held in memory.

use std::path::Path;

use cortex_queue::driver::{check_exportable, export_files};
use cortex_queue::{
    ExportFormat, ExportSummary, ExportedError, ExportedResult, ItemId, JobId, QueueError, Result,
    StoredResult,
};
use postgres::Row;

use crate::PgStore;
use crate::jobs::load_job;
use crate::session::{Failure, Tx};

/// Rows per fetch from the cursor.
const FETCH: i32 = 5_000;

/// The transaction a cursor lives in (exports always run in one).
fn in_transaction<'b, 'a>(
    tx: &'b mut Tx<'a>,
) -> Result<&'b mut postgres::Transaction<'a>, Failure> {
    tx.transaction().ok_or_else(|| {
        Failure::Queue(QueueError::Database {
            path: std::path::PathBuf::new(),
            detail: "an export needs a transaction (a cursor lives in one)".into(),
        })
    })
}

/// Runs `sql` (one parameter: the job) as a cursor, handing each row to `each`.
fn for_each_row(
    tx: &mut Tx<'_>,
    sql: &str,
    job: JobId,
    mut each: impl FnMut(&Row) -> Result<(), Failure>,
) -> Result<(), Failure> {
    let portal = in_transaction(tx)?.bind(sql, &[&job.0])?;
    loop {
        let rows = in_transaction(tx)?.query_portal(&portal, FETCH)?;
        if rows.is_empty() {
            return Ok(());
        }
        rows.iter().try_for_each(&mut each)?;
    }
}

impl PgStore {
    pub(crate) fn export_from_cursor(
        &mut self,
        id: JobId,
        output: &Path,
        errors: Option<&Path>,
        partial: bool,
        format: &dyn ExportFormat,
    ) -> Result<ExportSummary> {
        self.settle(id)?;
        let place = std::path::PathBuf::from(&self.shown);
        self.run(|tx| {
            in_transaction(tx)?
                .batch_execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")?;
            let job = load_job(tx, id)?;
            check_exportable(&job, partial)?;
            export_files::<_, Failure>(
                tx,
                &job,
                (output, errors),
                format,
                |tx, sink| {
                    for_each_row(
                        tx,
                        "SELECT i.id, i.line, i.custom_id, i.endpoint, r.completed_at, r.response
                         FROM items i JOIN results r ON r.item_id = i.id
                         WHERE i.job_id = $1 AND i.state = 'completed' ORDER BY i.line",
                        id,
                        |row| {
                            let item: i64 = row.get(0);
                            let response = serde_json::from_str(row.get(5)).map_err(|e| {
                                QueueError::Database {
                                    path: place.clone(),
                                    detail: format!("the result of item {item} is unreadable: {e}"),
                                }
                            })?;
                            sink(ExportedResult {
                                item: ItemId(item),
                                line: row.get::<_, i64>(1) as u64,
                                custom_id: row.get(2),
                                endpoint: row.get(3),
                                completed_at: row.get(4),
                                result: StoredResult::Response(response),
                            })
                        },
                    )
                },
                |tx, sink| {
                    for_each_row(
                        tx,
                        "SELECT line, custom_id, code, message FROM (
                             SELECT line, custom_id, coalesce(error_code, state) AS code,
                                    coalesce(error_message, 'cancelled before it ran to completion') AS message
                             FROM items WHERE job_id = $1 AND state IN ('failed', 'cancelled')
                             UNION ALL
                             SELECT line, coalesce(custom_id, line::text), 'invalid_input', message
                             FROM input_errors WHERE job_id = $1) AS e
                         ORDER BY line",
                        id,
                        |row| {
                            sink(ExportedError {
                                line: row.get::<_, i64>(0) as u64,
                                custom_id: row.get(1),
                                code: row.get(2),
                                message: row.get(3),
                            })
                        },
                    )
                },
            )
        })
    }
}
