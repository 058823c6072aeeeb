//! Submitting a job on PostgreSQL: every item streamed in with `COPY`, in
//! one transaction, so no partial job is ever visible.

use std::collections::HashMap;
use std::io::Write;

use cortex_queue::driver::{LineSink, SubmitTally, duration_ms, params_hash, store_lines};
use cortex_queue::{
    ItemSource, JobId, LineError, NewItem, QueueError, Result, SubmitOptions, Submitted,
};

use crate::PgStore;

/// Appends `text` as one field of a `COPY … FORMAT text` row.
fn copy_field(row: &mut String, text: Option<&str>) {
    if !row.is_empty() {
        row.push('\t');
    }
    let Some(text) = text else {
        row.push_str("\\N");
        return;
    };
    for c in text.chars() {
        match c {
            '\\' => row.push_str("\\\\"),
            '\n' => row.push_str("\\n"),
            '\r' => row.push_str("\\r"),
            '\t' => row.push_str("\\t"),
            c => row.push(c),
        }
    }
}

impl PgStore {
    /// Stores a job and its items in one transaction (items by `COPY`).
    /// Not retried on a lost connection: the input is read once; the
    /// transaction rolls back and the caller submits again.
    pub(crate) fn submit_by_copy(
        &mut self,
        input: &mut dyn ItemSource,
        source_name: &str,
        options: &SubmitOptions,
    ) -> Result<Submitted> {
        let params_sha = params_hash(options);
        let defaults_json = serde_json::to_string(&options.defaults).expect("defaults serialize");
        let metadata_json = serde_json::to_string(&options.metadata).expect("metadata serializes");
        let max_attempts = i32::try_from(options.max_attempts.max(1)).unwrap_or(i32::MAX);
        let place = std::path::PathBuf::from(&self.shown);
        let conn = self.connection().map_err(|detail| QueueError::Database {
            path: place.clone(),
            detail,
        })?;
        let pg = |e: postgres::Error| crate::session::pg_error(&place, &e);
        let window_ms: Option<i64> = options.completion_window.map(|w| duration_ms(w.duration()));
        let mut tx = conn.client.transaction().map_err(pg)?;
        let job = JobId(
            tx.query_one(
                "INSERT INTO jobs (state, source_name, source_sha256, params_sha256, model, defaults, metadata,
                                   priority, max_attempts, created_at, validating_at, model_sha256, project, expires_at, notify_url, output_url)
                 VALUES ('validating', $1, '', $2, $3, $4, $5::text::jsonb, $6, $7, cortex_now(), cortex_now(), $8, $9,
                         cortex_now() + $10::bigint, $11, $12)
                 RETURNING id",
                &[&source_name, &params_sha, &options.model, &defaults_json, &metadata_json,
                  &options.priority, &max_attempts, &options.model_sha256, &options.project, &window_ms, &options.notify_url, &options.output_url],
            )
            .map_err(pg)?
            .get(0),
        );
        let mut tally = SubmitTally::new(options);
        // The COPY borrows the transaction until it finishes.
        let (grammars, bad_lines) = {
            let mut sink = CopyLines {
                job_text: job.0.to_string(),
                priority_text: options.priority.to_string(),
                now_text: cortex_queue::now_ms().to_string(),
                copy: tx
                    .copy_in(
                        "COPY items (job_id, line, custom_id, endpoint, model, request, priority, updated_at)
                         FROM STDIN (FORMAT text)",
                    )
                    .map_err(pg)?,
                row: String::new(),
                first_use: HashMap::new(),
                grammars: HashMap::new(),
                bad_lines: Vec::new(),
                place: &place,
            };
            store_lines(input, source_name, &mut tally, &mut sink)?;
            let CopyLines {
                copy,
                grammars,
                bad_lines,
                ..
            } = sink;
            copy.finish().map_err(pg)?;
            (grammars, bad_lines)
        };
        // On a rejection, dropping the transaction rolls everything back.
        let (lines, invalid) = tally.accepted(source_name)?;
        for (sha, text) in &grammars {
            tx.execute(
                "INSERT INTO grammars (sha256, text) VALUES ($1, $2) ON CONFLICT (sha256) DO NOTHING",
                &[sha, text],
            )
            .map_err(pg)?;
        }
        for chunk in bad_lines.chunks(10_000) {
            let lines: Vec<i64> = chunk.iter().map(|e| e.line as i64).collect();
            let ids: Vec<Option<String>> = chunk.iter().map(|e| e.custom_id.clone()).collect();
            let messages: Vec<String> = chunk.iter().map(|e| e.message.clone()).collect();
            tx.execute(
                "INSERT INTO input_errors (job_id, line, custom_id, message)
                 SELECT $1, * FROM unnest($2::bigint[], $3::text[], $4::text[])",
                &[&job.0, &lines, &ids, &messages],
            )
            .map_err(pg)?;
        }
        let source_sha = input.source_sha256();
        if !options.force {
            let earlier = tx
                .query_opt(
                    "SELECT id, state FROM jobs WHERE source_sha256 = $1 AND params_sha256 = $2 AND id <> $3
                     ORDER BY id DESC LIMIT 1",
                    &[&source_sha, &params_sha, &job.0],
                )
                .map_err(pg)?;
            if let Some(row) = earlier {
                return Err(QueueError::duplicate_job(
                    JobId(row.get(0)),
                    row.get(1),
                    source_name,
                ));
            }
        }
        tx.execute(
            "UPDATE jobs SET source_sha256 = $2, lines = $3, invalid = $4, state = 'in_progress',
                             in_progress_at = cortex_now()
             WHERE id = $1",
            &[&job.0, &source_sha, &(lines as i64), &(invalid as i64)],
        )
        .map_err(pg)?;
        tx.execute(crate::session::NOTIFY_WORK, &[]).map_err(pg)?;
        tx.commit().map_err(pg)?;
        Ok(tally.submitted(job))
    }
}

/// A submission's writes on PostgreSQL: items streamed by `COPY`; the
/// grammars and bad lines gathered for after it.
struct CopyLines<'c, 'p> {
    job_text: String,
    priority_text: String,
    now_text: String,
    copy: postgres::CopyInWriter<'c>,
    /// Scratch: one row's text.
    row: String,
    /// Each custom_id's line.
    first_use: HashMap<String, u64>,
    /// Each grammar stored apart, by SHA-256.
    grammars: HashMap<String, String>,
    bad_lines: Vec<LineError>,
    place: &'p std::path::Path,
}

impl LineSink for CopyLines<'_, '_> {
    fn item(
        &mut self,
        item: &NewItem,
        request: &str,
        grammar: Option<(String, &str)>,
    ) -> Result<Option<LineError>> {
        let NewItem {
            line,
            custom_id,
            endpoint,
            model,
            ..
        } = item;
        if let Some(&first) = self.first_use.get(custom_id) {
            return Ok(Some(LineError::duplicate_custom_id(
                *line,
                custom_id,
                Some(first),
            )));
        }
        if let Some((sha, text)) = grammar {
            self.grammars.entry(sha).or_insert_with(|| text.to_owned());
        }
        let row = &mut self.row;
        row.clear();
        copy_field(row, Some(&self.job_text));
        copy_field(row, Some(&line.to_string()));
        copy_field(row, Some(custom_id));
        copy_field(row, Some(endpoint));
        copy_field(row, model.as_deref());
        copy_field(row, Some(request));
        copy_field(row, Some(&self.priority_text));
        copy_field(row, Some(&self.now_text));
        row.push('\n');
        self.copy
            .write_all(row.as_bytes())
            .map_err(|e| QueueError::Database {
                path: self.place.to_owned(),
                detail: format!("while sending items: {e}"),
            })?;
        self.first_use.insert(custom_id.clone(), *line);
        Ok(None)
    }

    fn bad_line(&mut self, error: LineError) -> Result<()> {
        self.bad_lines.push(error);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::copy_field;

    #[test]
    fn copy_fields_escape_what_the_text_format_treats_specially() {
        let mut row = String::new();
        copy_field(&mut row, Some("a\tb\\c\nd\re"));
        copy_field(&mut row, None);
        copy_field(&mut row, Some("plain"));
        assert_eq!(row, "a\\tb\\\\c\\nd\\re\t\\N\tplain");
    }
}
