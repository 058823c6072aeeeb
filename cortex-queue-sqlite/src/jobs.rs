//! Jobs in SQL: loading, settling by the core's state machine, status,
//! listing, cancel, resume and retry.

use std::path::Path;
use std::time::Duration;

use cortex_queue::driver::{ITEM_COLUMN_COUNT, ITEM_COLUMNS, LISTED_COLUMNS, listed_items};
use cortex_queue::{
    Cancel, CompletionSample, ExportFormat, ExportSummary, ItemDetail, ItemId, ItemPage, ItemQuery,
    ItemRecord, ItemSource, ItemState, Job, JobCounts, JobFilter, JobId, JobPage, JobState,
    JobStatus, JobStore, JobTimes, QueueError, Result, RunningTokens, SubmitOptions, Submitted,
    WorkerInfo, host_name, item_detail, now_ms,
};
use rusqlite::{OptionalExtension, Row, ToSql, Transaction, named_params, params};

use crate::expiry::expire_due;
use crate::store::{Outcome, Store};

const JOB_COLUMNS: &str = "id, state, source_name, source_sha256, model, defaults, metadata, priority, max_attempts,
    lines, invalid, n_pending, n_running, n_completed, n_failed, n_cancelled, prompt_tokens, completion_tokens,
    created_at, validating_at, in_progress_at, finalizing_at, completed_at, failed_at, cancelling_at, cancelled_at,
    model_sha256, project, expires_at, expired_at, notify_url, output_url, outputs_may_vary";

/// The lines `--skip-invalid` refused, as listed items (see
/// [`listed_items`]).
const REFUSED_LINES: &str =
    "SELECT 0, e.line, coalesce(e.custom_id, CAST(e.line AS TEXT)), 'failed', 0, 0,
        'invalid_input', e.message, NULL, 0, NULL, NULL, NULL, e.job_id, '', 'null', NULL
    FROM input_errors e";

/// A nullable count or duration column (negative read as 0).
fn optional_count(row: &Row<'_>, i: usize) -> rusqlite::Result<Option<u64>> {
    row.get::<_, Option<i64>>(i)
        .map(|v| v.map(|v| v.max(0) as u64))
}

fn item_from_row(row: &Row<'_>) -> rusqlite::Result<ItemRecord> {
    let count = |i: usize| optional_count(row, i);
    Ok(ItemRecord {
        id: ItemId(row.get(0)?),
        line: row.get::<_, i64>(1)? as u64,
        custom_id: row.get(2)?,
        state: ItemState::parse(&row.get::<_, String>(3)?).unwrap_or(ItemState::Failed),
        attempts: row.get(4)?,
        lease_token: row.get(5)?,
        error_code: row.get(6)?,
        error_message: row.get(7)?,
        completed_at: row.get(8)?,
        deaths: row.get(9)?,
        ran_by: row.get(10)?,
        completion_tokens: count(11)?,
        duration_ms: count(12)?,
    })
}

/// Which jobs a [`JobFilter`] takes (named parameters `:state`, `:key`,
/// `:value`, `:project`, `:model`).
const JOB_FILTER: &str = "state <> 'validating' AND (:state IS NULL OR state = :state)
    AND (:key IS NULL OR json_extract(metadata, '$.' || json_quote(:key)) = :value)
    AND (:project IS NULL OR project = :project) AND (:model IS NULL OR model = :model)";

/// A [`JobFilter`]'s values, for [`JOB_FILTER`]'s named parameters.
struct FilterValues<'a> {
    filter: &'a JobFilter,
    state: Option<&'static str>,
    key: Option<String>,
    value: Option<String>,
}

impl<'a> FilterValues<'a> {
    fn of(filter: &'a JobFilter) -> Self {
        let (key, value) = filter.metadata.clone().unzip();
        Self {
            filter,
            state: filter.state.map(JobState::as_str),
            key,
            value,
        }
    }

    fn params(&self) -> Vec<(&'static str, &dyn ToSql)> {
        vec![
            (":state", &self.state),
            (":key", &self.key),
            (":value", &self.value),
            (":project", &self.filter.project),
            (":model", &self.filter.model),
        ]
    }
}

/// The jobs `filter` takes, newest first, its page only.
fn matching_jobs(tx: &Transaction<'_>, filter: &JobFilter) -> rusqlite::Result<Vec<Job>> {
    let limit = filter
        .limit
        .map_or(-1, |l| i64::try_from(l).unwrap_or(i64::MAX));
    let offset = i64::try_from(filter.offset).unwrap_or(i64::MAX);
    let values = FilterValues::of(filter);
    let mut params = values.params();
    params.extend([(":limit", &limit as &dyn ToSql), (":offset", &offset)]);
    tx.prepare_cached(&format!(
        "SELECT {JOB_COLUMNS} FROM jobs WHERE {JOB_FILTER} ORDER BY id DESC LIMIT :limit OFFSET :offset"
    ))?
    .query_map(params.as_slice(), job_from_row)?
    .collect()
}

fn job_from_row(row: &Row<'_>) -> rusqlite::Result<Job> {
    let text = |i: usize| row.get::<_, String>(i);
    let count = |i: usize| row.get::<_, i64>(i).map(|v| v.max(0) as u64);
    let state = text(1)?;
    let invalid = count(10)?;
    Ok(Job {
        id: JobId(row.get(0)?),
        state: JobState::parse(&state).unwrap_or(JobState::Failed),
        source_name: text(2)?,
        source_sha256: text(3)?,
        model: text(4)?,
        model_sha256: row.get(26)?,
        project: text(27)?,
        defaults: serde_json::from_str(&text(5)?).unwrap_or_default(),
        metadata: serde_json::from_str(&text(6)?).unwrap_or_default(),
        priority: row.get(7)?,
        max_attempts: row.get(8)?,
        counts: JobCounts {
            total: count(9)?,
            pending: count(11)?,
            running: count(12)?,
            completed: count(13)?,
            failed: count(14)? + invalid,
            cancelled: count(15)?,
            invalid,
        },
        prompt_tokens: count(16)?,
        completion_tokens: count(17)?,
        times: JobTimes {
            created_at: row.get(18)?,
            validating_at: row.get(19)?,
            in_progress_at: row.get(20)?,
            finalizing_at: row.get(21)?,
            completed_at: row.get(22)?,
            failed_at: row.get(23)?,
            cancelling_at: row.get(24)?,
            cancelled_at: row.get(25)?,
            expires_at: row.get(28)?,
            expired_at: row.get(29)?,
        },
        notify_url: row.get(30)?,
        output_url: row.get(31)?,
        outputs_may_vary: row.get(32)?,
    })
}

pub(crate) fn load_job(tx: &Transaction<'_>, job: JobId) -> Result<Job, Outcome> {
    tx.prepare_cached(&format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?1"))?
        .query_row([job.0], job_from_row)
        .optional()?
        .ok_or(Outcome::Queue(QueueError::NoSuchJob(job)))
}

/// Takes an expired job's window away: it was resumed or retried, so what
/// runs now runs to its end (the window it had is over).
fn drop_window(tx: &Transaction<'_>, job: i64) -> rusqlite::Result<()> {
    tx.execute(
        "UPDATE jobs SET expires_at = NULL WHERE id = ?1 AND state = 'expired'",
        [job],
    )
    .map(drop)
}

fn set_state(tx: &Transaction<'_>, job: i64, state: JobState, now: i64) -> rusqlite::Result<()> {
    // Column names come from the fixed state list, never from input.
    tx.execute(
        &format!("UPDATE jobs SET state = ?2, {state}_at = ?3 WHERE id = ?1"),
        params![job, state.as_str(), now],
    )
    .map(drop)
}

/// Moves a job to the state its item counts imply. Called in every
/// transaction that changes items, so the state is never stale.
pub(crate) fn settle(tx: &Transaction<'_>, job: i64, now: i64) -> rusqlite::Result<()> {
    let (state, pending, running, completed): (String, i64, i64, i64) = tx
        .prepare_cached("SELECT state, n_pending, n_running, n_completed FROM jobs WHERE id = ?1")?
        .query_row([job], |row| {
            Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
        })?;
    let Some(state) = JobState::parse(&state) else {
        return Ok(());
    };
    let count = |n: i64| u64::try_from(n).unwrap_or(0);
    let counts = JobCounts {
        pending: count(pending),
        running: count(running),
        completed: count(completed),
        ..JobCounts::default()
    };
    let next = state.settled(&counts);
    if next != state {
        set_state(tx, job, next, now)?;
    }
    Ok(())
}

impl JobStore for Store {
    /// The job `id`.
    fn job(&mut self, id: JobId) -> Result<Job> {
        self.read_current(|tx| load_job(tx, id))
    }

    /// Jobs matching `filter`, newest first.
    fn jobs(&mut self, filter: &JobFilter) -> Result<Vec<Job>> {
        self.read_current(|tx| Ok(matching_jobs(tx, filter)?))
    }

    fn job_page(&mut self, filter: &JobFilter) -> Result<JobPage> {
        self.read_current(|tx| {
            let matching: i64 = tx
                .prepare_cached(&format!("SELECT count(*) FROM jobs WHERE {JOB_FILTER}"))?
                .query_row(FilterValues::of(filter).params().as_slice(), |row| {
                    row.get(0)
                })?;
            let models = tx
                .prepare_cached(
                    "SELECT DISTINCT model FROM jobs
                     WHERE state <> 'validating' AND (:project IS NULL OR project = :project) ORDER BY model",
                )?
                .query_map(named_params! { ":project": filter.project }, |row| row.get(0))?
                .collect::<rusqlite::Result<_>>()?;
            Ok(JobPage {
                matching: matching.max(0) as u64,
                jobs: matching_jobs(tx, filter)?,
                models,
            })
        })
    }

    fn status_over(&mut self, id: JobId, window: Duration) -> Result<JobStatus> {
        self.read_current(|tx| {
            let job = load_job(tx, id)?;
            let (start, end) = JobStatus::span(&job, now_ms(), window);
            let (items, tokens): (i64, i64) = tx
                .prepare_cached(
                    "SELECT count(*), coalesce(sum(completion_tokens), 0) FROM results
                     WHERE job_id = ?1 AND completed_at > ?2 AND completed_at <= ?3",
                )?
                .query_row(params![id.0, start, end], |row| {
                    Ok((row.get(0)?, row.get(1)?))
                })?;
            // A running item's tokens, spread evenly over its run (from its
            // claim, `updated_at`), count in the span for the part run in it.
            let (so_far, in_span): (i64, f64) = tx
                .prepare_cached(
                    "SELECT coalesce(sum(generated_tokens), 0),
                            coalesce(sum(generated_tokens * max(?3 - max(updated_at, ?2), 0)
                                         / max(?3 - updated_at, 1.0)), 0.0)
                     FROM items WHERE job_id = ?1 AND state = 'running' AND generated_tokens > 0",
                )?
                .query_row(params![id.0, start, end], |row| {
                    Ok((row.get(0)?, row.get(1)?))
                })?;
            Ok(JobStatus::over(
                job,
                (start, end),
                items.max(0) as u64,
                tokens.max(0) as u64,
                RunningTokens {
                    so_far: so_far.max(0) as u64,
                    in_span: in_span.max(0.0).round() as u64,
                },
            ))
        })
    }

    /// Every item of a job in input order (for inspection; reads the whole job).
    fn items(&mut self, id: JobId) -> Result<Vec<ItemRecord>> {
        self.read_current(|tx| {
            load_job(tx, id)?;
            let items = tx
                .prepare_cached(&format!(
                    "SELECT {ITEM_COLUMNS} FROM items i LEFT JOIN results r ON r.item_id = i.id
                     WHERE i.job_id = ?1 ORDER BY i.line"
                ))?
                .query_map([id.0], item_from_row)?
                .collect::<rusqlite::Result<_>>()?;
            Ok(items)
        })
    }

    fn item_page(&mut self, id: JobId, query: &ItemQuery) -> Result<ItemPage> {
        let state = query.state.map(ItemState::as_str);
        let text = query.custom_id.as_deref().filter(|t| !t.is_empty());
        let limit = i64::try_from(query.limit).unwrap_or(i64::MAX);
        let offset = i64::try_from(query.offset).unwrap_or(i64::MAX);
        self.read_current(|tx| {
            let source = listed_items(&load_job(tx, id)?, REFUSED_LINES);
            let matches = "i.job_id = ?1 AND (?2 IS NULL OR i.state = ?2) AND (?3 IS NULL OR instr(i.custom_id, ?3) > 0)";
            let matching: i64 = tx
                .prepare_cached(&format!("SELECT count(*) FROM {source} i WHERE {matches}"))?
                .query_row(params![id.0, state, text], |row| row.get(0))?;
            let items = tx
                .prepare_cached(&format!(
                    "SELECT {LISTED_COLUMNS} FROM {source} i
                     WHERE {matches} ORDER BY i.line LIMIT ?4 OFFSET ?5"
                ))?
                .query_map(params![id.0, state, text, limit, offset], item_from_row)?
                .collect::<rusqlite::Result<_>>()?;
            Ok(ItemPage {
                matching: matching.max(0) as u64,
                items,
            })
        })
    }

    fn item(&mut self, id: JobId, line: u64) -> Result<ItemDetail> {
        let line_number = i64::try_from(line).unwrap_or(i64::MAX);
        self.read_current(|tx| {
            let source = listed_items(&load_job(tx, id)?, REFUSED_LINES);
            tx.prepare_cached(&format!(
                "SELECT {LISTED_COLUMNS}, i.endpoint, i.request, i.response FROM {source} i
                 WHERE i.job_id = ?1 AND i.line = ?2"
            ))?
            .query_row(params![id.0, line_number], |row| {
                Ok(item_detail(
                    item_from_row(row)?,
                    row.get(ITEM_COLUMN_COUNT)?,
                    &row.get::<_, String>(ITEM_COLUMN_COUNT + 1)?,
                    row.get::<_, Option<String>>(ITEM_COLUMN_COUNT + 2)?
                        .as_deref(),
                ))
            })
            .optional()?
            .ok_or(Outcome::Queue(QueueError::NoSuchItem { job: id, line }))
        })
    }

    fn completions(&mut self, id: JobId) -> Result<Vec<CompletionSample>> {
        self.read_current(|tx| {
            load_job(tx, id)?;
            let samples = tx
                .prepare_cached(
                    "SELECT completed_at, completion_tokens, first_token_ms, duration_ms FROM results
                     WHERE job_id = ?1",
                )?
                .query_map([id.0], |row| {
                    let ms = |i: usize| optional_count(row, i);
                    Ok(CompletionSample {
                        completed_at: row.get(0)?,
                        completion_tokens: row.get::<_, i64>(1)?.max(0) as u64,
                        first_token_ms: ms(2)?,
                        duration_ms: ms(3)?,
                    })
                })?
                .collect::<rusqlite::Result<_>>()?;
            Ok(samples)
        })
    }

    fn workers(&mut self) -> Result<Vec<WorkerInfo>> {
        self.read_current(|tx| {
            let workers = tx
                .prepare_cached(
                    "SELECT w.id, w.host, w.pid, w.model_sha256, w.registered_at, w.heartbeat_at,
                            (SELECT count(*) FROM items i WHERE i.worker_id = w.id AND i.state = 'running')
                     FROM workers w ORDER BY w.id",
                )?
                .query_map([], |row| {
                    Ok(WorkerInfo {
                        id: row.get(0)?,
                        host: host_name(&row.get::<_, String>(1)?).to_owned(),
                        pid: row.get(2)?,
                        model_sha256: row.get(3)?,
                        registered_at: row.get(4)?,
                        heartbeat_at: row.get(5)?,
                        running: row.get::<_, i64>(6)?.max(0) as u64,
                    })
                })?
                .collect::<rusqlite::Result<_>>()?;
            Ok(workers)
        })
    }

    /// Cancels a job: pending items are cancelled now; running ones learn it at
    /// their next heartbeat. Finished results stay.
    fn cancel(&mut self, id: JobId) -> Result<Job> {
        self.write_checked(|tx| {
            expire_due(tx, now_ms())?;
            let job = load_job(tx, id)?;
            if job.cancel_step()? == Cancel::Already {
                return Ok(job);
            }
            let now = now_ms();
            tx.execute(
                "UPDATE items SET state = 'cancelled', updated_at = ?2 WHERE job_id = ?1 AND state = 'pending'",
                params![id.0, now],
            )?;
            set_state(tx, id.0, JobState::Cancelling, now)?;
            settle(tx, id.0, now)?;
            load_job(tx, id)
        })
    }

    /// Resumes a cancelled or failed job: its unfinished items (cancelled or
    /// failed) are pending again with fresh attempts. Returns the job and how
    /// many items were resumed.
    fn resume(&mut self, id: JobId) -> Result<(Job, u64)> {
        self.write_checked(|tx| {
            expire_due(tx, now_ms())?;
            load_job(tx, id)?.check_resumable()?;
            let now = now_ms();
            let resumed = tx.execute(
                "UPDATE items SET state = 'pending', attempts = 0, not_before = 0, error_code = NULL,
                                  error_message = NULL, updated_at = ?2
                 WHERE job_id = ?1 AND state IN ('cancelled', 'failed')",
                params![id.0, now],
            )?;
            drop_window(tx, id.0)?;
            set_state(tx, id.0, JobState::InProgress, now)?;
            settle(tx, id.0, now)?;
            Ok((load_job(tx, id)?, resumed as u64))
        })
    }

    /// Puts a job's failed items back to pending with fresh attempts (invalid
    /// input lines stay failed). Returns the job and how many items were retried.
    fn retry_failed(&mut self, id: JobId) -> Result<(Job, u64)> {
        self.write_checked(|tx| {
            expire_due(tx, now_ms())?;
            let job = load_job(tx, id)?;
            job.check_retryable()?;
            let now = now_ms();
            let retried = tx.execute(
                "UPDATE items SET state = 'pending', attempts = 0, not_before = 0, error_code = NULL,
                                  error_message = NULL, updated_at = ?2
                 WHERE job_id = ?1 AND state = 'failed'",
                params![id.0, now],
            )?;
            if retried > 0 && job.state.is_terminal() {
                drop_window(tx, id.0)?;
                set_state(tx, id.0, JobState::InProgress, now)?;
            }
            settle(tx, id.0, now)?;
            Ok((load_job(tx, id)?, retried as u64))
        })
    }

    fn submit_items(
        &mut self,
        input: &mut dyn ItemSource,
        source_name: &str,
        options: &SubmitOptions,
    ) -> Result<Submitted> {
        self.submit_in_one_transaction(input, source_name, options)
    }

    fn export_with(
        &mut self,
        id: JobId,
        output: &Path,
        errors: Option<&Path>,
        partial: bool,
        format: &dyn ExportFormat,
    ) -> Result<ExportSummary> {
        self.export_from_snapshot(id, output, errors, partial, format)
    }

    fn location(&self) -> String {
        format!("sqlite:{}", self.path.display())
    }
}
