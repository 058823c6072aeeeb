//! Submitting a job in one SQLite transaction.

use cortex_queue::driver::{LineSink, SubmitTally, duration_ms, params_hash, store_lines};
use cortex_queue::{
    ItemSource, JobId, LineError, NewItem, QueueError, Result, SubmitOptions, Submitted, now_ms,
};
use rusqlite::{ErrorCode, OptionalExtension, Statement, params};

use crate::store::{Store, map_error};

impl Store {
    /// Stores a job and all its items in one transaction, so no partial job
    /// is ever visible. Every line is checked; with bad lines the job is
    /// rejected with a report of all of them unless `options.skip_invalid`.
    /// `source_name` names the input in messages and listings.
    pub(crate) fn submit_in_one_transaction(
        &mut self,
        input: &mut dyn ItemSource,
        source_name: &str,
        options: &SubmitOptions,
    ) -> Result<Submitted> {
        let db_path = self.path.clone();
        let to_error = |e: &rusqlite::Error| map_error(&db_path, e);
        let now = now_ms();
        let expires_at = options
            .completion_window
            .map(|w| now.saturating_add(duration_ms(w.duration())));
        let params_sha = params_hash(options);
        let defaults_json = serde_json::to_string(&options.defaults).expect("defaults serialize");
        let metadata_json = serde_json::to_string(&options.metadata).expect("metadata serializes");

        let tx = self.begin_immediate()?;
        tx.execute(
            "INSERT INTO jobs (state, source_name, source_sha256, params_sha256, model, defaults, metadata,
                               priority, max_attempts, created_at, validating_at, model_sha256, project, expires_at, notify_url, output_url)
             VALUES ('validating', ?1, '', ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?8, ?9, ?10, ?11, ?12, ?13)",
            params![source_name, params_sha, options.model, defaults_json, metadata_json, options.priority, options.max_attempts.max(1), now, options.model_sha256, options.project, expires_at, options.notify_url, options.output_url],
        )
        .map_err(|e| to_error(&e))?;
        let job = JobId(tx.last_insert_rowid());

        let mut tally = SubmitTally::new(options);
        {
            let mut sink = SqliteLines {
                job,
                priority: options.priority,
                now,
                insert_item: tx
                    .prepare(
                        "INSERT INTO items (job_id, line, custom_id, endpoint, model, request, priority, updated_at)
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                    )
                    .map_err(|e| to_error(&e))?,
                insert_error: tx
                    .prepare("INSERT INTO input_errors (job_id, line, custom_id, message) VALUES (?1, ?2, ?3, ?4)")
                    .map_err(|e| to_error(&e))?,
                insert_grammar: tx
                    .prepare("INSERT OR IGNORE INTO grammars (sha256, text) VALUES (?1, ?2)")
                    .map_err(|e| to_error(&e))?,
                first_use: tx
                    .prepare("SELECT line FROM items WHERE job_id = ?1 AND custom_id = ?2")
                    .map_err(|e| to_error(&e))?,
                last_grammar: String::new(),
                to_error: &to_error,
            };
            store_lines(input, source_name, &mut tally, &mut sink)?;
        }
        // On a rejection, dropping the transaction rolls everything back.
        let (lines, invalid) = tally.accepted(source_name)?;
        let source_sha = input.source_sha256();
        if !options.force {
            let earlier: Option<(i64, String)> = tx
                .query_row(
                    "SELECT id, state FROM jobs WHERE source_sha256 = ?1 AND params_sha256 = ?2 AND id <> ?3
                     ORDER BY id DESC LIMIT 1",
                    params![source_sha, params_sha, job.0],
                    |row| Ok((row.get(0)?, row.get(1)?)),
                )
                .optional()
                .map_err(|e| to_error(&e))?;
            if let Some((existing, state)) = earlier {
                return Err(QueueError::duplicate_job(
                    JobId(existing),
                    &state,
                    source_name,
                ));
            }
        }
        tx.execute(
            "UPDATE jobs SET source_sha256 = ?2, lines = ?3, invalid = ?4, state = 'in_progress', in_progress_at = ?5
             WHERE id = ?1",
            params![job.0, source_sha, lines as i64, invalid as i64, now_ms()],
        )
        .map_err(|e| to_error(&e))?;
        tx.commit().map_err(|e| to_error(&e))?;
        Ok(tally.submitted(job))
    }
}

/// A submission's writes on SQLite: prepared statements of its transaction.
struct SqliteLines<'t, 'e> {
    job: JobId,
    priority: i32,
    now: i64,
    insert_item: Statement<'t>,
    insert_error: Statement<'t>,
    insert_grammar: Statement<'t>,
    first_use: Statement<'t>,
    /// Items of one job mostly share one grammar: stored once.
    last_grammar: String,
    to_error: &'e dyn Fn(&rusqlite::Error) -> QueueError,
}

impl LineSink for SqliteLines<'_, '_> {
    fn item(
        &mut self,
        item: &NewItem,
        request: &str,
        grammar: Option<(String, &str)>,
    ) -> Result<Option<LineError>> {
        let to_error = self.to_error;
        if let Some((sha, text)) = grammar
            && sha != self.last_grammar
        {
            self.insert_grammar
                .execute(params![sha, text])
                .map_err(|e| to_error(&e))?;
            self.last_grammar = sha;
        }
        let NewItem {
            line,
            custom_id,
            endpoint,
            model,
            ..
        } = item;
        match self.insert_item.execute(params![
            self.job.0,
            *line as i64,
            custom_id,
            endpoint,
            model,
            request,
            self.priority,
            self.now
        ]) {
            Ok(_) => Ok(None),
            Err(e) if e.sqlite_error_code() == Some(ErrorCode::ConstraintViolation) => {
                let first: Option<i64> = self
                    .first_use
                    .query_row(params![self.job.0, custom_id], |row| row.get(0))
                    .optional()
                    .map_err(|e| to_error(&e))?;
                Ok(Some(LineError::duplicate_custom_id(
                    *line,
                    custom_id,
                    first.map(|l| l as u64),
                )))
            }
            Err(e) => Err(to_error(&e)),
        }
    }

    fn bad_line(&mut self, error: LineError) -> Result<()> {
        self.insert_error
            .execute(params![
                self.job.0,
                error.line as i64,
                error.custom_id,
                error.message
            ])
            .map_err(|e| (self.to_error)(&e))?;
        Ok(())
    }
}
