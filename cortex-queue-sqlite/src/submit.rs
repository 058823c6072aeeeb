//! Submitting a job in one SQLite transaction.

use cortex_queue::driver::{SubmitTally, compact_work_apart, duration_ms, params_hash};
use cortex_queue::{
    ItemSource, JobId, LineError, NewItem, QueueError, Result, SubmitOptions, Submitted, now_ms,
};
use rusqlite::{ErrorCode, OptionalExtension, params};

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
            let mut insert_item = tx
                .prepare(
                    "INSERT INTO items (job_id, line, custom_id, endpoint, model, request, priority, updated_at)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                )
                .map_err(|e| to_error(&e))?;
            let mut insert_error = tx
                .prepare("INSERT INTO input_errors (job_id, line, custom_id, message) VALUES (?1, ?2, ?3, ?4)")
                .map_err(|e| to_error(&e))?;
            let mut insert_grammar = tx
                .prepare("INSERT OR IGNORE INTO grammars (sha256, text) VALUES (?1, ?2)")
                .map_err(|e| to_error(&e))?;
            // Items of one job mostly share one grammar: stored once.
            let mut last_grammar = String::new();
            let mut first_use = tx
                .prepare("SELECT line FROM items WHERE job_id = ?1 AND custom_id = ?2")
                .map_err(|e| to_error(&e))?;
            for next in &mut *input {
                let parsed = next.map_err(|source| QueueError::Io {
                    path: source_name.into(),
                    source,
                })?;
                let error = match parsed {
                    Ok(item) => {
                        let NewItem {
                            line,
                            custom_id,
                            endpoint,
                            model,
                            request,
                        } = &item;
                        let (json, grammar) = compact_work_apart(request);
                        if let Some((sha, text)) = grammar
                            && sha != last_grammar
                        {
                            insert_grammar
                                .execute(params![sha, text])
                                .map_err(|e| to_error(&e))?;
                            last_grammar = sha;
                        }
                        match insert_item.execute(params![
                            job.0,
                            *line as i64,
                            custom_id,
                            endpoint,
                            model,
                            json,
                            options.priority,
                            now
                        ]) {
                            Ok(_) => {
                                tally.stored();
                                continue;
                            }
                            Err(e)
                                if e.sqlite_error_code()
                                    == Some(ErrorCode::ConstraintViolation) =>
                            {
                                let first: Option<i64> = first_use
                                    .query_row(params![job.0, custom_id], |row| row.get(0))
                                    .optional()
                                    .map_err(|e| to_error(&e))?;
                                LineError::duplicate_custom_id(
                                    *line,
                                    custom_id,
                                    first.map(|l| l as u64),
                                )
                            }
                            Err(e) => return Err(to_error(&e)),
                        }
                    }
                    Err(error) => error,
                };
                if let Some(error) = tally.bad_line(error) {
                    insert_error
                        .execute(params![
                            job.0,
                            error.line as i64,
                            error.custom_id,
                            error.message
                        ])
                        .map_err(|e| to_error(&e))?;
                }
            }
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
