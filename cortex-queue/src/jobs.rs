//! Jobs: their state machine, status, listing, cancel, resume and retry.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use rusqlite::{OptionalExtension, Row, Transaction, params};

use crate::store::{Outcome, Store, now_ms};
use crate::submit::JobDefaults;
use crate::{
    ExportFormat, ExportSummary, ItemId, ItemSource, ItemState, JobId, JobState, JobStore,
    QueueError, Result, SubmitOptions, Submitted,
};

/// How many requests of a job are where.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct JobCounts {
    /// Every non-blank input line (items plus invalid lines).
    pub total: u64,
    /// Waiting to be claimed.
    pub pending: u64,
    /// Claimed by a worker.
    pub running: u64,
    /// With a result.
    pub completed: u64,
    /// Failed for good, including invalid input lines.
    pub failed: u64,
    /// Cancelled.
    pub cancelled: u64,
    /// Invalid input lines (recorded with `skip_invalid`), part of `failed`.
    pub invalid: u64,
}

impl JobCounts {
    /// Requests that ended one way or another.
    pub fn finished(&self) -> u64 {
        self.completed + self.failed + self.cancelled
    }
}

/// When the job entered each state (Unix ms; the last time, for states it re-entered).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct JobTimes {
    /// Submission.
    pub created_at: i64,
    /// Input checking started.
    pub validating_at: Option<i64>,
    /// Items became claimable.
    pub in_progress_at: Option<i64>,
    /// The last pending item was claimed.
    pub finalizing_at: Option<i64>,
    /// Every item ended, with results.
    pub completed_at: Option<i64>,
    /// Every item ended, none with a result.
    pub failed_at: Option<i64>,
    /// Cancel requested while items ran.
    pub cancelling_at: Option<i64>,
    /// Cancelled.
    pub cancelled_at: Option<i64>,
}

/// A job as stored.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Job {
    /// Its id.
    pub id: JobId,
    /// Where it is.
    pub state: JobState,
    /// The input file's name as given at submit.
    pub source_name: String,
    /// SHA-256 of the input file's bytes (hex).
    pub source_sha256: String,
    /// The model it was submitted for (its name).
    pub model: String,
    /// That model's identity (the GGUF's SHA-256): only workers running it
    /// claim the job. `None`: any worker.
    pub model_sha256: Option<String>,
    /// Defaults applied to its lines.
    pub defaults: JobDefaults,
    /// Labels given at submit.
    pub metadata: BTreeMap<String, String>,
    /// The project it belongs to ([`crate::DEFAULT_PROJECT`] unless its submitter named one).
    pub project: String,
    /// Claim priority (higher first).
    pub priority: i32,
    /// Attempts per item before a retryable failure is final.
    pub max_attempts: u32,
    /// Requests by state.
    pub counts: JobCounts,
    /// Prompt tokens of the results so far.
    pub prompt_tokens: u64,
    /// Generated tokens of the results so far.
    pub completion_tokens: u64,
    /// State timestamps.
    pub times: JobTimes,
}

/// A job with its recent throughput and an estimate of the time left.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct JobStatus {
    /// The job.
    pub job: Job,
    /// The span the rates are measured over (the last minute of work, or less).
    #[serde(rename = "window_seconds", with = "seconds")]
    pub window: Duration,
    /// Items completed per second over the window.
    pub items_per_second: f64,
    /// Generated tokens per second over the window.
    pub tokens_per_second: f64,
    /// Time left at the recent rate (`None` when finished or nothing completed lately).
    #[serde(rename = "eta_seconds", with = "optional_seconds")]
    pub eta: Option<Duration>,
}

impl JobStatus {
    /// The span a status's rates are measured over (Unix ms, start and end):
    /// the last `window` of the job's work, ending `now` or when it ended.
    pub fn span(job: &Job, now: i64, window: Duration) -> (i64, i64) {
        let window_ms = i64::try_from(window.as_millis())
            .unwrap_or(i64::MAX / 4)
            .max(1);
        let t = &job.times;
        let end = match job.state {
            JobState::Completed => t.completed_at,
            JobState::Failed => t.failed_at,
            JobState::Cancelled => t.cancelled_at,
            _ => None,
        }
        .unwrap_or(now);
        let start = (end - window_ms).max(t.in_progress_at.unwrap_or(t.created_at));
        (start, end)
    }

    /// The status of `job` with `items` completed and `tokens` generated
    /// during `span` (from [`JobStatus::span`]), and the ETA that rate gives.
    pub fn over(job: Job, (start, end): (i64, i64), items: u64, tokens: u64) -> Self {
        let span = ((end - start).max(1000) as f64) / 1000.0;
        let items_per_second = items as f64 / span;
        let remaining = job.counts.pending + job.counts.running;
        let eta = (!job.state.is_terminal() && items_per_second > 0.0)
            .then(|| Duration::from_secs_f64(remaining as f64 / items_per_second));
        JobStatus {
            window: Duration::from_millis((end - start).max(0) as u64),
            items_per_second,
            tokens_per_second: tokens as f64 / span,
            eta,
            job,
        }
    }
}

/// Durations as seconds (a number) in JSON.
mod seconds {
    use std::time::Duration;

    pub(super) fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }

    pub(super) fn deserialize<'de, D: serde::Deserializer<'de>>(
        d: D,
    ) -> Result<Duration, D::Error> {
        let secs: f64 = serde::Deserialize::deserialize(d)?;
        Duration::try_from_secs_f64(secs).map_err(serde::de::Error::custom)
    }
}

/// Optional durations as seconds (a number or null) in JSON.
mod optional_seconds {
    use std::time::Duration;

    pub(super) fn serialize<S: serde::Serializer>(
        d: &Option<Duration>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_some(&d.as_secs_f64()),
            None => s.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: serde::Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        let secs: Option<f64> = serde::Deserialize::deserialize(d)?;
        secs.map(|s| Duration::try_from_secs_f64(s).map_err(serde::de::Error::custom))
            .transpose()
    }
}

/// Which jobs to list.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct JobFilter {
    /// Only jobs in this state.
    pub state: Option<JobState>,
    /// Only jobs whose metadata has this key with this value.
    pub metadata: Option<(String, String)>,
    /// Only jobs of this project.
    pub project: Option<String>,
    /// At most this many (newest first).
    pub limit: Option<usize>,
}

/// One item as stored (for inspection and tests).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ItemRecord {
    /// Its id.
    pub id: ItemId,
    /// Its input line.
    pub line: u64,
    /// The caller's id.
    pub custom_id: String,
    /// Where it is.
    pub state: ItemState,
    /// Attempts charged so far (claims, less those given back).
    pub attempts: u32,
    /// Times a worker or engine died while it was in flight.
    pub deaths: u32,
    /// Its current lease token.
    pub lease_token: i64,
    /// The last error's code.
    pub error_code: Option<String>,
    /// The last error's message.
    pub error_message: Option<String>,
    /// When its result was written (Unix ms).
    pub completed_at: Option<i64>,
}

const JOB_COLUMNS: &str = "id, state, source_name, source_sha256, model, defaults, metadata, priority, max_attempts,
    lines, invalid, n_pending, n_running, n_completed, n_failed, n_cancelled, prompt_tokens, completion_tokens,
    created_at, validating_at, in_progress_at, finalizing_at, completed_at, failed_at, cancelling_at, cancelled_at,
    model_sha256, project";

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
        },
    })
}

pub(crate) fn load_job(tx: &Transaction<'_>, job: JobId) -> Result<Job, Outcome> {
    tx.prepare_cached(&format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?1"))?
        .query_row([job.0], job_from_row)
        .optional()?
        .ok_or(Outcome::Queue(QueueError::NoSuchJob(job)))
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

fn wrong_state(job: &Job, hint: impl Into<String>) -> Outcome {
    Outcome::Queue(QueueError::wrong_state(job, hint))
}

impl JobStore for Store {
    /// The job `id`.
    fn job(&mut self, id: JobId) -> Result<Job> {
        self.read(|tx| load_job(tx, id))
    }

    /// Jobs matching `filter`, newest first.
    fn jobs(&mut self, filter: &JobFilter) -> Result<Vec<Job>> {
        let limit = filter
            .limit
            .map_or(-1, |l| i64::try_from(l).unwrap_or(i64::MAX));
        let (key, value) = filter.metadata.clone().unzip();
        self.read(|tx| {
            let jobs = tx
                .prepare_cached(&format!(
                    "SELECT {JOB_COLUMNS} FROM jobs
                     WHERE state <> 'validating' AND (?1 IS NULL OR state = ?1)
                       AND (?2 IS NULL OR json_extract(metadata, '$.' || json_quote(?2)) = ?3)
                       AND (?5 IS NULL OR project = ?5)
                     ORDER BY id DESC LIMIT ?4"
                ))?
                .query_map(
                    params![
                        filter.state.map(JobState::as_str),
                        key,
                        value,
                        limit,
                        filter.project
                    ],
                    job_from_row,
                )?
                .collect::<rusqlite::Result<_>>()?;
            Ok(jobs)
        })
    }

    fn status_over(&mut self, id: JobId, window: Duration) -> Result<JobStatus> {
        self.read(|tx| {
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
            Ok(JobStatus::over(
                job,
                (start, end),
                items.max(0) as u64,
                tokens.max(0) as u64,
            ))
        })
    }

    /// Every item of a job in input order (for inspection; reads the whole job).
    fn items(&mut self, id: JobId) -> Result<Vec<ItemRecord>> {
        self.read(|tx| {
            load_job(tx, id)?;
            let items = tx
                .prepare_cached(
                    "SELECT i.id, i.line, i.custom_id, i.state, i.attempts, i.lease_token, i.error_code, i.error_message,
                            r.completed_at, i.deaths
                     FROM items i LEFT JOIN results r ON r.item_id = i.id WHERE i.job_id = ?1 ORDER BY i.line",
                )?
                .query_map([id.0], |row| {
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
                    })
                })?
                .collect::<rusqlite::Result<_>>()?;
            Ok(items)
        })
    }

    /// Cancels a job: pending items are cancelled now; running ones learn it at
    /// their next heartbeat. Finished results stay.
    fn cancel(&mut self, id: JobId) -> Result<Job> {
        self.write_checked(|tx| {
            let job = load_job(tx, id)?;
            match job.state {
                JobState::Cancelling | JobState::Cancelled => return Ok(job),
                state if state.is_terminal() => {
                    return Err(wrong_state(&job, "it has already ended; nothing to cancel"));
                }
                _ => {}
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
            let job = load_job(tx, id)?;
            match job.state {
                JobState::Cancelled | JobState::Cancelling | JobState::Failed => {}
                JobState::Completed => {
                    return Err(wrong_state(&job, "it finished; use retry to run its failed items again"));
                }
                _ => return Err(wrong_state(&job, "it is still running; nothing to resume")),
            }
            let now = now_ms();
            let resumed = tx.execute(
                "UPDATE items SET state = 'pending', attempts = 0, not_before = 0, error_code = NULL,
                                  error_message = NULL, updated_at = ?2
                 WHERE job_id = ?1 AND state IN ('cancelled', 'failed')",
                params![id.0, now],
            )?;
            set_state(tx, id.0, JobState::InProgress, now)?;
            settle(tx, id.0, now)?;
            Ok((load_job(tx, id)?, resumed as u64))
        })
    }

    /// Puts a job's failed items back to pending with fresh attempts (invalid
    /// input lines stay failed). Returns the job and how many items were retried.
    fn retry_failed(&mut self, id: JobId) -> Result<(Job, u64)> {
        self.write_checked(|tx| {
            let job = load_job(tx, id)?;
            if matches!(job.state, JobState::Cancelling) {
                return Err(wrong_state(&job, "wait until it is cancelled, then resume it"));
            }
            let now = now_ms();
            let retried = tx.execute(
                "UPDATE items SET state = 'pending', attempts = 0, not_before = 0, error_code = NULL,
                                  error_message = NULL, updated_at = ?2
                 WHERE job_id = ?1 AND state = 'failed'",
                params![id.0, now],
            )?;
            if retried > 0 && job.state.is_terminal() {
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
