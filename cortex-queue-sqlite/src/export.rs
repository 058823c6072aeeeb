//! A job's output and error files from one SQLite read snapshot; the core
//! renders and writes them (`export_files`).

use std::path::Path;

use cortex_queue::driver::{check_exportable, export_files};
use cortex_queue::{
    ExportFormat, ExportSummary, ExportedError, ExportedResult, ItemId, JobId, QueueError, Result,
    StoredResult,
};

use crate::jobs::load_job;
use crate::store::{Outcome, Store};

impl Store {
    /// Writes the job's completed items in input order to `output`, and (if
    /// given) its failed, cancelled and invalid requests to `errors`, each
    /// line as `format` renders it, both from one snapshot and each file
    /// atomically. Refuses while the job is still running unless `partial`.
    pub(crate) fn export_from_snapshot(
        &mut self,
        id: JobId,
        output: &Path,
        errors: Option<&Path>,
        partial: bool,
        format: &dyn ExportFormat,
    ) -> Result<ExportSummary> {
        let db_path = self.path.clone();
        self.read_current(|tx| {
            let job = load_job(tx, id)?;
            check_exportable(&job, partial)?;
            let unreadable = |item: i64, e: serde_json::Error| {
                Outcome::Queue(QueueError::Database {
                    path: db_path.clone(),
                    detail: format!("the result of item {item} is unreadable: {e}"),
                })
            };
            export_files::<_, Outcome>(
                &mut (),
                &job,
                (output, errors),
                format,
                |(), sink| {
                    let mut rows = tx.prepare_cached(
                        "SELECT i.id, i.line, i.custom_id, i.endpoint, r.completed_at, r.response, r.body
                         FROM items i JOIN results r ON r.item_id = i.id
                         WHERE i.job_id = ?1 AND i.state = 'completed' ORDER BY i.line",
                    )?;
                    let mut rows = rows.query([id.0])?;
                    while let Some(row) = rows.next()? {
                        let item: i64 = row.get(0)?;
                        let result = match row.get::<_, Option<String>>(5)? {
                            Some(text) => StoredResult::Response(
                                serde_json::from_str(&text).map_err(|e| unreadable(item, e))?,
                            ),
                            None => StoredResult::Rendered(row.get(6)?),
                        };
                        sink(ExportedResult {
                            item: ItemId(item),
                            line: row.get::<_, i64>(1)? as u64,
                            custom_id: row.get(2)?,
                            endpoint: row.get(3)?,
                            completed_at: row.get(4)?,
                            result,
                        })?;
                    }
                    Ok(())
                },
                |(), sink| {
                    let mut rows = tx.prepare_cached(
                        "SELECT line, custom_id, code, message FROM (
                             SELECT line, custom_id, coalesce(error_code, state) AS code,
                                    coalesce(error_message, 'cancelled before it ran to completion') AS message
                             FROM items WHERE job_id = ?1 AND state IN ('failed', 'cancelled')
                             UNION ALL
                             SELECT line, coalesce(custom_id, CAST(line AS TEXT)), 'invalid_input', message
                             FROM input_errors WHERE job_id = ?1)
                         ORDER BY line",
                    )?;
                    let mut rows = rows.query([id.0])?;
                    while let Some(row) = rows.next()? {
                        sink(ExportedError {
                            line: row.get::<_, i64>(0)? as u64,
                            custom_id: row.get(1)?,
                            code: row.get(2)?,
                            message: row.get(3)?,
                        })?;
                    }
                    Ok(())
                },
            )
        })
    }
}
