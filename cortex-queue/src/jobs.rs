//! What a job is as stored and shown: its counts, times, status and filters.

use std::collections::BTreeMap;
use std::time::Duration;

use cortex_request::{ChatTemplateChoice, SamplingParams, StopConditions};

use crate::{ItemId, ItemState, JobCounts, JobId, JobState, QueueError};

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
    /// When its completion window ends (`None`: it has none).
    #[serde(default)]
    pub expires_at: Option<i64>,
    /// Expired.
    #[serde(default)]
    pub expired_at: Option<i64>,
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
    /// Where its end is announced (a webhook URL), if anywhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notify_url: Option<String>,
    /// Where its results are written when it ends (a path or an object's
    /// URL), if anywhere: an [`crate::EXPORT_EVENT`] row of the outbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_url: Option<String>,
    /// Whether a worker where a line's output can change with what runs
    /// beside it (see [`crate::ClaimOptions::same_output`]) has claimed any
    /// of its lines: then its outputs are not promised to repeat.
    #[serde(default)]
    pub outputs_may_vary: bool,
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
    /// Generated tokens per second over the window, counting the tokens of
    /// running items as they are generated.
    pub tokens_per_second: f64,
    /// Tokens the running items have generated so far (as their workers last
    /// reported, every few seconds); `job.completion_tokens` counts finished ones.
    #[serde(default)]
    pub running_tokens: u64,
    /// Time left at the recent rate (`None` when finished, or while nothing
    /// is being generated or no item has finished to tell how long one is).
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
            JobState::Expired => t.expired_at,
            _ => None,
        }
        .unwrap_or(now);
        let start = (end - window_ms).max(t.in_progress_at.unwrap_or(t.created_at));
        (start, end)
    }

    /// The status of `job` with `items` completed during `span` (from
    /// [`JobStatus::span`]) and `tokens` generated in it, of which
    /// `running.in_span` by items still running (`running.so_far` in all).
    ///
    /// The ETA divides the tokens still to come (an item as long as the
    /// finished ones average, less what running items have made) by the
    /// token rate; before any item has finished, by the rate of finishing.
    pub fn over(
        job: Job,
        (start, end): (i64, i64),
        items: u64,
        tokens: u64,
        running: RunningTokens,
    ) -> Self {
        let span = ((end - start).max(1000) as f64) / 1000.0;
        let items_per_second = items as f64 / span;
        let tokens_per_second = (tokens + running.in_span) as f64 / span;
        let remaining = job.counts.pending + job.counts.running;
        let eta = if job.state.is_terminal() {
            None
        } else if job.counts.completed > 0 && tokens_per_second > 0.0 {
            let mean = job.completion_tokens as f64 / job.counts.completed as f64;
            let to_come = (remaining as f64 * mean - running.so_far as f64).max(0.0);
            Some(Duration::from_secs_f64(to_come / tokens_per_second))
        } else if items_per_second > 0.0 {
            Some(Duration::from_secs_f64(remaining as f64 / items_per_second))
        } else {
            None
        };
        JobStatus {
            window: Duration::from_millis((end - start).max(0) as u64),
            items_per_second,
            tokens_per_second,
            running_tokens: running.so_far,
            eta,
            job,
        }
    }
}

/// The tokens a job's running items have generated: in all, and within the
/// span a status measures (each item's count spread evenly over its run so far).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RunningTokens {
    /// In all, as last reported.
    pub so_far: u64,
    /// The part generated within the span.
    pub in_span: u64,
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
    /// Only jobs for this model (its name as the job records it).
    pub model: Option<String>,
    /// Skip this many of those that match (newest first).
    pub offset: usize,
    /// At most this many (newest first).
    pub limit: Option<usize>,
}

/// One page of jobs, with what a pager and a model filter need.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct JobPage {
    /// How many jobs match the filter in all.
    pub matching: u64,
    /// The page (newest first).
    pub jobs: Vec<Job>,
    /// The models the filter's project has jobs for (the model filter itself
    /// left out), sorted.
    pub models: Vec<String>,
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
    /// Where it last ran: its worker's host name and pid.
    #[serde(default)]
    pub ran_by: Option<String>,
    /// Tokens its result generated.
    #[serde(default)]
    pub completion_tokens: Option<u64>,
    /// From entering the engine to its end (ms), where its result recorded it.
    #[serde(default)]
    pub duration_ms: Option<u64>,
}

/// A job's default sampling and stop settings; each line's own fields override them.
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct JobDefaults {
    /// Sampling defaults.
    pub sampling: SamplingParams,
    /// Stop defaults (`max_tokens`, stop strings, ...).
    pub stop: StopConditions,
    /// The system prompt of chat requests that bring none (a registered
    /// model's `SYSTEM`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    /// Leave the model's thinking out of chat results (`include_reasoning:
    /// false` on every line that does not say).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub omit_reasoning: bool,
    /// The chat template of the model the job was submitted for (a name
    /// of weights other names share, each with its own template); jobs
    /// from before it was kept render with their engine's.
    #[serde(skip_serializing_if = "ChatTemplateChoice::is_engine")]
    pub chat_template: ChatTemplateChoice,
}

/// What cancelling a job does now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cancel {
    /// Its pending items are cancelled at once, its running ones at their
    /// next heartbeat.
    Now,
    /// It is cancelling or cancelled already: nothing more to do.
    Already,
}

impl Job {
    /// Whether the job can be cancelled: not once it has ended otherwise.
    pub fn cancel_step(&self) -> Result<Cancel, QueueError> {
        match self.state {
            JobState::Cancelling | JobState::Cancelled => Ok(Cancel::Already),
            state if state.is_terminal() => Err(QueueError::wrong_state(
                self.id,
                self.state,
                "it has already ended; nothing to cancel",
            )),
            _ => Ok(Cancel::Now),
        }
    }

    /// Whether the job can be resumed (its cancelled and failed items run
    /// again): once cancelled, failed or expired, not while it runs nor
    /// once it completed.
    pub fn check_resumable(&self) -> Result<(), QueueError> {
        match self.state {
            JobState::Cancelled | JobState::Cancelling | JobState::Failed | JobState::Expired => {
                Ok(())
            }
            JobState::Completed => Err(QueueError::wrong_state(
                self.id,
                self.state,
                "it finished; use retry to run its failed items again",
            )),
            _ => Err(QueueError::wrong_state(
                self.id,
                self.state,
                "it is still running; nothing to resume",
            )),
        }
    }

    /// Whether the job's failed items can be retried: not while it is
    /// being cancelled.
    pub fn check_retryable(&self) -> Result<(), QueueError> {
        if self.state == JobState::Cancelling {
            return Err(QueueError::wrong_state(
                self.id,
                self.state,
                "wait until it is cancelled, then resume it",
            ));
        }
        Ok(())
    }
}
