//! Jobs on PostgreSQL: reading them (counts summed over their shards),
//! their state machine under the job's row lock, cancel, resume and retry.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use cortex_queue::driver::{ITEM_COLUMN_COUNT, ITEM_COLUMNS, LISTED_COLUMNS, listed_items};
use cortex_queue::{
    Cancel, CompletionSample, ExportFormat, ExportSummary, ItemDetail, ItemId, ItemPage, ItemQuery,
    ItemRecord, ItemSource, ItemState, Job, JobCounts, JobFilter, JobId, JobPage, JobState,
    JobStatus, JobStore, JobTimes, QueueError, Result, RunningTokens, SubmitOptions, Submitted,
    WorkerInfo, host_name, item_detail,
};
use postgres::Row;

use crate::session::{Failure, Tx};
use crate::{PgStore, count};

/// Which jobs a [`JobFilter`] takes (`j`: jobs; `$1` state, `$2` and `$3`
/// a metadata key and value, `$4` project, `$5` model).
const JOB_FILTER: &str = "j.state <> 'validating' AND ($1::text IS NULL OR j.state = $1::text)
    AND ($2::text IS NULL OR j.metadata ->> $2::text = $3::text)
    AND ($4::text IS NULL OR j.project = $4::text) AND ($5::text IS NULL OR j.model = $5::text)";

/// The jobs `filter` takes, newest first, its page only.
fn matching_jobs(tx: &mut Tx<'_>, filter: &JobFilter) -> Result<Vec<Job>, Failure> {
    let limit = filter.limit.map(|l| i64::try_from(l).unwrap_or(i64::MAX));
    let offset = i64::try_from(filter.offset).unwrap_or(i64::MAX);
    let state = filter.state.map(JobState::as_str);
    let (key, value) = filter.metadata.clone().unzip();
    Ok(tx
        .query(
            &format!("{JOB_SELECT} WHERE {JOB_FILTER} ORDER BY j.id DESC LIMIT $6 OFFSET $7"),
            &[
                &state,
                &key,
                &value,
                &filter.project,
                &filter.model,
                &limit,
                &offset,
            ],
        )?
        .iter()
        .map(job_from_row)
        .collect())
}

/// The lines `--skip-invalid` refused, as listed items (see
/// [`listed_items`]).
const REFUSED_LINES: &str =
    "SELECT 0::bigint, e.line, coalesce(e.custom_id, e.line::text), 'failed', 0,
        0::bigint, 'invalid_input', e.message, NULL::bigint, 0, NULL::text, NULL::bigint,
        NULL::bigint, e.job_id, '', 'null', NULL::text
    FROM input_errors e";

/// A nullable count or duration column (negative read as 0).
fn optional_count(row: &Row, i: usize) -> Option<u64> {
    row.get::<_, Option<i64>>(i).map(|v| v.max(0) as u64)
}

fn item_from_row(row: &Row) -> ItemRecord {
    let count = |i: usize| optional_count(row, i);
    ItemRecord {
        id: ItemId(row.get(0)),
        line: row.get::<_, i64>(1) as u64,
        custom_id: row.get(2),
        state: ItemState::parse(row.get(3)).unwrap_or(ItemState::Failed),
        attempts: row.get::<_, i32>(4).max(0) as u32,
        lease_token: row.get(5),
        error_code: row.get(6),
        error_message: row.get(7),
        completed_at: row.get(8),
        deaths: row.get::<_, i32>(9).max(0) as u32,
        ran_by: row.get(10),
        completion_tokens: count(11),
        duration_ms: count(12),
    }
}

/// A job's columns and its counts summed over shards (`count` columns 11..=17).
const JOB_SELECT: &str = "SELECT j.id, j.state, j.source_name, j.source_sha256, j.model, j.defaults, j.metadata::text,
        j.priority, j.max_attempts, j.lines, j.invalid,
        coalesce(c.pending, 0), coalesce(c.running, 0), coalesce(c.completed, 0), coalesce(c.failed, 0),
        coalesce(c.cancelled, 0), coalesce(c.prompt_tokens, 0), coalesce(c.completion_tokens, 0),
        j.created_at, j.validating_at, j.in_progress_at, j.finalizing_at, j.completed_at, j.failed_at,
        j.cancelling_at, j.cancelled_at, j.model_sha256, j.project, j.expires_at, j.expired_at,
        j.notify_url, j.output_url, j.outputs_may_vary
    FROM jobs j LEFT JOIN LATERAL (
        SELECT sum(pending)::bigint AS pending, sum(running)::bigint AS running,
               sum(completed)::bigint AS completed, sum(failed)::bigint AS failed,
               sum(cancelled)::bigint AS cancelled, sum(prompt_tokens)::bigint AS prompt_tokens,
               sum(completion_tokens)::bigint AS completion_tokens
        FROM job_counts WHERE job_id = j.id) c ON true";

fn job_from_row(row: &Row) -> Job {
    let state: String = row.get(1);
    let invalid = count(row, 10);
    Job {
        id: JobId(row.get(0)),
        state: JobState::parse(&state).unwrap_or(JobState::Failed),
        source_name: row.get(2),
        source_sha256: row.get(3),
        model: row.get(4),
        model_sha256: row.get(26),
        project: row.get(27),
        defaults: serde_json::from_str(row.get(5)).unwrap_or_default(),
        metadata: serde_json::from_str(row.get(6)).unwrap_or_default(),
        priority: row.get(7),
        max_attempts: row.get::<_, i32>(8).max(0) as u32,
        counts: JobCounts {
            total: count(row, 9),
            pending: count(row, 11),
            running: count(row, 12),
            completed: count(row, 13),
            failed: count(row, 14) + invalid,
            cancelled: count(row, 15),
            invalid,
        },
        prompt_tokens: count(row, 16),
        completion_tokens: count(row, 17),
        times: JobTimes {
            created_at: row.get(18),
            validating_at: row.get(19),
            in_progress_at: row.get(20),
            finalizing_at: row.get(21),
            completed_at: row.get(22),
            failed_at: row.get(23),
            cancelling_at: row.get(24),
            cancelled_at: row.get(25),
            expires_at: row.get(28),
            expired_at: row.get(29),
        },
        notify_url: row.get(30),
        output_url: row.get(31),
        outputs_may_vary: row.get(32),
    }
}

pub(crate) fn load_job(tx: &mut Tx<'_>, job: JobId) -> Result<Job, Failure> {
    tx.query_opt(&format!("{JOB_SELECT} WHERE j.id = $1"), &[&job.0])?
        .map(|row| job_from_row(&row))
        .ok_or(Failure::Queue(QueueError::NoSuchJob(job)))
}

/// Locks the job's row (every explicit state change and every settle takes
/// it, so they happen one at a time per job) and reads the job.
fn lock_job(tx: &mut Tx<'_>, job: JobId) -> Result<Job, Failure> {
    tx.query_opt("SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE", &[&job.0])?
        .ok_or(Failure::Queue(QueueError::NoSuchJob(job)))?;
    load_job(tx, job)
}

/// Takes an expired job's window away: it was resumed or retried, so what
/// runs now runs to its end (the window it had is over).
fn drop_window(tx: &mut Tx<'_>, job: JobId) -> Result<(), Failure> {
    tx.execute(
        "UPDATE jobs SET expires_at = NULL WHERE id = $1 AND state = 'expired'",
        &[&job.0],
    )
    .map(drop)
}

fn set_state(tx: &mut Tx<'_>, job: JobId, state: JobState, now: i64) -> Result<(), Failure> {
    // Column names come from the fixed state list, never from input.
    tx.execute(
        &format!("UPDATE jobs SET state = $2, {state}_at = $3 WHERE id = $1"),
        &[&job.0, &state.as_str(), &now],
    )
    .map(drop)
}

/// Applies the state machine to a job whose row this transaction locked.
fn settle_locked(tx: &mut Tx<'_>, job: &Job, now: i64) -> Result<Job, Failure> {
    let next = job.state.settled(&job.counts);
    if next == job.state {
        return Ok(job.clone());
    }
    set_state(tx, job.id, next, now)?;
    load_job(tx, job.id)
}

impl PgStore {
    /// Moves a job to the state its counts imply. Runs after each write has
    /// committed: counts are summed from committed shards only, so whichever
    /// writer commits last sees them all and makes the move.
    pub(crate) fn settle(&mut self, id: JobId) -> Result<Job> {
        let job = self.run_autocommit(|tx| load_job(tx, id))?;
        if job.state.settled(&job.counts) == job.state {
            return Ok(job);
        }
        self.run(|tx| {
            let job = lock_job(tx, id)?;
            let now = tx.now()?;
            settle_locked(tx, &job, now)
        })
    }

    /// `jobs` as read, each put right where a writer that died between its
    /// commit and its settle left it behind its counts.
    fn settled(&mut self, jobs: Vec<Job>) -> Result<Vec<Job>> {
        jobs.into_iter()
            .map(|job| {
                if job.state.settled(&job.counts) == job.state {
                    Ok(job)
                } else {
                    self.settle(job.id)
                }
            })
            .collect()
    }

    /// An explicit change of a job's state, under its row lock.
    fn change_job<T>(
        &mut self,
        id: JobId,
        mut change: impl FnMut(&mut Tx<'_>, &Job, i64) -> Result<T, Failure>,
    ) -> Result<T> {
        self.expire_due_jobs()?;
        let value = self.run(|tx| {
            let job = lock_job(tx, id)?;
            let now = tx.now()?;
            change(tx, &job, now)
        })?;
        // Writers that committed meanwhile may have left the counts at a turn.
        self.settle_after(&BTreeSet::from([id.0]))?;
        Ok(value)
    }
}

/// Items of `job` in `states` become pending with fresh attempts; how many.
fn restart_items(tx: &mut Tx<'_>, job: JobId, states: &[&str], now: i64) -> Result<u64, Failure> {
    let states: Vec<String> = states.iter().map(|s| (*s).to_owned()).collect();
    let restarted = tx.execute(
        "UPDATE items SET state = 'pending', attempts = 0, not_before = 0, error_code = NULL,
                          error_message = NULL, updated_at = $2
         WHERE job_id = $1 AND state = ANY($3::text[])",
        &[&job.0, &now, &states],
    )?;
    if restarted > 0 {
        tx.notify_work()?;
    }
    Ok(restarted)
}

impl JobStore for PgStore {
    fn submit_items(
        &mut self,
        input: &mut dyn ItemSource,
        source_name: &str,
        options: &SubmitOptions,
    ) -> Result<Submitted> {
        self.submit_by_copy(input, source_name, options)
    }

    fn job(&mut self, id: JobId) -> Result<Job> {
        self.expire_due_jobs()?;
        self.settle(id)
    }

    fn jobs(&mut self, filter: &JobFilter) -> Result<Vec<Job>> {
        self.expire_due_jobs()?;
        let jobs = self.run_autocommit(|tx| matching_jobs(tx, filter))?;
        self.settled(jobs)
    }

    fn job_page(&mut self, filter: &JobFilter) -> Result<JobPage> {
        self.expire_due_jobs()?;
        let state = filter.state.map(JobState::as_str);
        let (key, value) = filter.metadata.clone().unzip();
        let (matching, jobs, models) = self.run_autocommit(|tx| {
            let matching: i64 = tx
                .query_opt(
                    &format!("SELECT count(*) FROM jobs j WHERE {JOB_FILTER}"),
                    &[&state, &key, &value, &filter.project, &filter.model],
                )?
                .map_or(0, |row| row.get(0));
            let models: Vec<String> = tx
                .query(
                    "SELECT DISTINCT model FROM jobs
                     WHERE state <> 'validating' AND ($1::text IS NULL OR project = $1::text) ORDER BY model",
                    &[&filter.project],
                )?
                .iter()
                .map(|row| row.get(0))
                .collect();
            Ok((matching, matching_jobs(tx, filter)?, models))
        })?;
        Ok(JobPage {
            matching: matching.max(0) as u64,
            jobs: self.settled(jobs)?,
            models,
        })
    }

    fn status_over(&mut self, id: JobId, window: Duration) -> Result<JobStatus> {
        self.expire_due_jobs()?;
        self.settle(id)?;
        self.run(|tx| {
            let job = load_job(tx, id)?;
            let (start, end) = JobStatus::span(&job, tx.now()?, window);
            let row = tx.query_one(
                "SELECT count(*), coalesce(sum(completion_tokens), 0)::bigint FROM results
                 WHERE job_id = $1 AND completed_at > $2 AND completed_at <= $3",
                &[&id.0, &start, &end],
            )?;
            // A running item's tokens, spread evenly over its run (from its
            // claim, `updated_at`), count in the span for the part run in it.
            let running = tx.query_one(
                "SELECT coalesce(sum(generated_tokens), 0)::bigint,
                        coalesce(sum(generated_tokens
                                     * GREATEST($3::bigint - GREATEST(updated_at, $2::bigint), 0)::float8
                                     / GREATEST($3::bigint - updated_at, 1)), 0)::bigint
                 FROM items WHERE job_id = $1 AND state = 'running' AND generated_tokens > 0",
                &[&id.0, &start, &end],
            )?;
            Ok(JobStatus::over(
                job,
                (start, end),
                count(&row, 0),
                count(&row, 1),
                RunningTokens {
                    so_far: count(&running, 0),
                    in_span: count(&running, 1),
                },
            ))
        })
    }

    fn items(&mut self, id: JobId) -> Result<Vec<ItemRecord>> {
        self.expire_due_jobs()?;
        self.run(|tx| {
            load_job(tx, id)?;
            Ok(tx
                .query(
                    &format!(
                        "SELECT {ITEM_COLUMNS} FROM items i LEFT JOIN results r ON r.item_id = i.id
                         WHERE i.job_id = $1 ORDER BY i.line"
                    ),
                    &[&id.0],
                )?
                .iter()
                .map(item_from_row)
                .collect())
        })
    }

    fn item_page(&mut self, id: JobId, query: &ItemQuery) -> Result<ItemPage> {
        self.expire_due_jobs()?;
        let state = query.state.map(ItemState::as_str);
        let text = query.custom_id.as_deref().filter(|t| !t.is_empty());
        let limit = i64::try_from(query.limit).unwrap_or(i64::MAX);
        let offset = i64::try_from(query.offset).unwrap_or(i64::MAX);
        self.run(|tx| {
            let source = listed_items(&load_job(tx, id)?, REFUSED_LINES);
            let matches = "i.job_id = $1 AND ($2::text IS NULL OR i.state = $2::text)
                           AND ($3::text IS NULL OR strpos(i.custom_id, $3::text) > 0)";
            let matching: i64 = tx
                .query_opt(
                    &format!("SELECT count(*) FROM {source} i WHERE {matches}"),
                    &[&id.0, &state, &text],
                )?
                .map_or(0, |row| row.get(0));
            let items = tx
                .query(
                    &format!(
                        "SELECT {LISTED_COLUMNS} FROM {source} i
                         WHERE {matches} ORDER BY i.line LIMIT $4 OFFSET $5"
                    ),
                    &[&id.0, &state, &text, &limit, &offset],
                )?
                .iter()
                .map(item_from_row)
                .collect();
            Ok(ItemPage {
                matching: matching.max(0) as u64,
                items,
            })
        })
    }

    fn item(&mut self, id: JobId, line: u64) -> Result<ItemDetail> {
        self.expire_due_jobs()?;
        let line_number = i64::try_from(line).unwrap_or(i64::MAX);
        self.run(|tx| {
            let source = listed_items(&load_job(tx, id)?, REFUSED_LINES);
            let row = tx
                .query_opt(
                    &format!(
                        "SELECT {LISTED_COLUMNS}, i.endpoint, i.request, i.response FROM {source} i
                         WHERE i.job_id = $1 AND i.line = $2"
                    ),
                    &[&id.0, &line_number],
                )?
                .ok_or(Failure::Queue(QueueError::NoSuchItem { job: id, line }))?;
            Ok(item_detail(
                item_from_row(&row),
                row.get(ITEM_COLUMN_COUNT),
                row.get(ITEM_COLUMN_COUNT + 1),
                row.get(ITEM_COLUMN_COUNT + 2),
            ))
        })
    }

    fn completions(&mut self, id: JobId) -> Result<Vec<CompletionSample>> {
        self.expire_due_jobs()?;
        self.run(|tx| {
            load_job(tx, id)?;
            Ok(tx
                .query(
                    "SELECT completed_at, completion_tokens, first_token_ms, duration_ms FROM results
                     WHERE job_id = $1",
                    &[&id.0],
                )?
                .iter()
                .map(|row| {
                    let ms = |i: usize| optional_count(row, i);
                    CompletionSample {
                        completed_at: row.get(0),
                        completion_tokens: row.get::<_, i64>(1).max(0) as u64,
                        first_token_ms: ms(2),
                        duration_ms: ms(3),
                    }
                })
                .collect())
        })
    }

    fn workers(&mut self) -> Result<Vec<WorkerInfo>> {
        self.run(|tx| {
            Ok(tx
                .query(
                    "SELECT w.id, w.host, w.pid, w.model_sha256, w.registered_at, w.heartbeat_at,
                            (SELECT count(*) FROM items i WHERE i.worker_id = w.id AND i.state = 'running')
                     FROM workers w ORDER BY w.id",
                    &[],
                )?
                .iter()
                .map(|row| WorkerInfo {
                    id: row.get(0),
                    host: host_name(row.get(1)).to_owned(),
                    pid: row.get::<_, i32>(2).max(0) as u32,
                    model_sha256: row.get(3),
                    registered_at: row.get(4),
                    heartbeat_at: row.get(5),
                    running: row.get::<_, i64>(6).max(0) as u64,
                })
                .collect())
        })
    }

    fn cancel(&mut self, id: JobId) -> Result<Job> {
        self.change_job(id, |tx, job, now| {
            if job.cancel_step()? == Cancel::Already {
                return Ok(job.clone());
            }
            tx.execute(
                "UPDATE items SET state = 'cancelled', updated_at = $2 WHERE job_id = $1 AND state = 'pending'",
                &[&id.0, &now],
            )?;
            set_state(tx, id, JobState::Cancelling, now)?;
            let job = load_job(tx, id)?;
            settle_locked(tx, &job, now)
        })
    }

    fn resume(&mut self, id: JobId) -> Result<(Job, u64)> {
        self.change_job(id, |tx, job, now| {
            job.check_resumable()?;
            let resumed = restart_items(tx, id, &["cancelled", "failed"], now)?;
            drop_window(tx, id)?;
            set_state(tx, id, JobState::InProgress, now)?;
            let job = load_job(tx, id)?;
            Ok((settle_locked(tx, &job, now)?, resumed))
        })
    }

    fn retry_failed(&mut self, id: JobId) -> Result<(Job, u64)> {
        self.change_job(id, |tx, job, now| {
            job.check_retryable()?;
            let retried = restart_items(tx, id, &["failed"], now)?;
            if retried > 0 && job.state.is_terminal() {
                drop_window(tx, id)?;
                set_state(tx, id, JobState::InProgress, now)?;
            }
            let job = load_job(tx, id)?;
            Ok((settle_locked(tx, &job, now)?, retried))
        })
    }

    fn export_with(
        &mut self,
        id: JobId,
        output: &Path,
        errors: Option<&Path>,
        partial: bool,
        format: &dyn ExportFormat,
    ) -> Result<ExportSummary> {
        self.expire_due_jobs()?;
        self.export_from_cursor(id, output, errors, partial, format)
    }

    fn location(&self) -> String {
        self.shown.clone()
    }
}
