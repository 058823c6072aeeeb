//! Jobs' and items' ids, states and counts: the job state machine every
//! driver follows (how its counts settle a job), so no driver decides it
//! for itself.

use std::fmt;

/// A job's id (a small integer, unique within one database).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub struct JobId(pub i64);

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// An item's id (unique within one database; also the engine request id).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub struct ItemId(pub i64);

impl fmt::Display for ItemId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Where a job is, following OpenAI's batch states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// Its input is being read and checked (inside the submit transaction, so
    /// only its timestamp is ever seen by others).
    Validating,
    /// Items are waiting or running.
    InProgress,
    /// OpenAI's state between a batch's last item and its output file. A
    /// job's results are written when asked for, so the state machine never
    /// enters it; a job found in it (a database of an earlier cortex, which
    /// used it while the last items ran) settles as one in progress.
    Finalizing,
    /// Every item ended, at least one with a result.
    Completed,
    /// Every item ended and none has a result.
    Failed,
    /// Cancelled while items were running; they stop at their next heartbeat.
    Cancelling,
    /// Cancelled; finished results are kept.
    Cancelled,
    /// Its completion window ended first: finished results are kept, and
    /// the items that had not finished failed with [`BATCH_EXPIRED`].
    Expired,
}

impl JobState {
    /// Every state, in life order.
    pub const ALL: [JobState; 8] = [
        JobState::Validating,
        JobState::InProgress,
        JobState::Finalizing,
        JobState::Completed,
        JobState::Failed,
        JobState::Cancelling,
        JobState::Cancelled,
        JobState::Expired,
    ];

    /// The state's name (`in_progress`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Validating => "validating",
            JobState::InProgress => "in_progress",
            JobState::Finalizing => "finalizing",
            JobState::Completed => "completed",
            JobState::Failed => "failed",
            JobState::Cancelling => "cancelling",
            JobState::Cancelled => "cancelled",
            JobState::Expired => "expired",
        }
    }

    /// Parses a state's name.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == name)
    }

    /// Whether nothing more will happen to the job unless it is resumed or retried.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobState::Completed | JobState::Failed | JobState::Cancelled | JobState::Expired
        )
    }

    /// The job state machine, as every storage driver applies it after a
    /// write: where a job in this state goes given its items' `counts`.
    /// A running job is `in_progress` while any item is pending or running,
    /// then `completed` if something completed (else `failed`), and
    /// `in_progress` again when items became pending (a retry); a
    /// cancelling job is `cancelled` once nothing runs. Other states change
    /// only by an explicit act (submit, cancel, resume) or, for `expired`,
    /// the end of the job's window.
    ///
    /// ```
    /// use cortex_queue::{JobCounts, JobState};
    ///
    /// let counts = JobCounts { total: 2, running: 1, completed: 1, ..JobCounts::default() };
    /// assert_eq!(JobState::InProgress.settled(&counts), JobState::InProgress);
    /// assert_eq!(JobState::Cancelling.settled(&counts), JobState::Cancelling);
    /// let done = JobCounts { total: 2, completed: 1, failed: 1, ..JobCounts::default() };
    /// assert_eq!(JobState::InProgress.settled(&done), JobState::Completed);
    /// ```
    pub fn settled(self, counts: &JobCounts) -> JobState {
        let (pending, running) = (counts.pending, counts.running);
        match self {
            JobState::InProgress | JobState::Finalizing if pending + running == 0 => {
                if counts.completed > 0 {
                    JobState::Completed
                } else {
                    JobState::Failed
                }
            }
            JobState::InProgress | JobState::Finalizing => JobState::InProgress,
            JobState::Cancelling if running == 0 => JobState::Cancelled,
            other => other,
        }
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where an item is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ItemState {
    /// Waiting to be claimed (possibly not before a backoff time).
    Pending,
    /// Claimed under a lease.
    Running,
    /// Has its one result.
    Completed,
    /// Failed for good; its last error is kept.
    Failed,
    /// Cancelled with its job.
    Cancelled,
}

impl ItemState {
    /// The state's name.
    pub fn as_str(self) -> &'static str {
        match self {
            ItemState::Pending => "pending",
            ItemState::Running => "running",
            ItemState::Completed => "completed",
            ItemState::Failed => "failed",
            ItemState::Cancelled => "cancelled",
        }
    }

    /// Parses a state's name.
    pub fn parse(name: &str) -> Option<Self> {
        [
            ItemState::Pending,
            ItemState::Running,
            ItemState::Completed,
            ItemState::Failed,
            ItemState::Cancelled,
        ]
        .into_iter()
        .find(|s| s.as_str() == name)
    }
}

impl fmt::Display for ItemState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

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

#[cfg(test)]
mod state_machine_tests {
    use super::{JobCounts, JobState};

    fn counts(pending: u64, running: u64, completed: u64) -> JobCounts {
        JobCounts {
            total: pending + running + completed + 1,
            pending,
            running,
            completed,
            failed: 1,
            ..JobCounts::default()
        }
    }

    #[test]
    fn every_transition_of_the_job_state_machine() {
        use JobState::*;
        let cases = [
            // (from, pending, running, completed, to)
            (InProgress, 3, 1, 0, InProgress),
            // Running items keep a job in progress to its last one.
            (InProgress, 0, 2, 0, InProgress),
            (InProgress, 0, 0, 4, Completed),
            (InProgress, 0, 0, 0, Failed),
            // A job an earlier cortex left finalizing settles as in progress.
            (Finalizing, 0, 1, 0, InProgress),
            (Finalizing, 1, 0, 0, InProgress),
            (Finalizing, 0, 0, 1, Completed),
            (Finalizing, 0, 0, 0, Failed),
            (Cancelling, 0, 2, 0, Cancelling),
            (Cancelling, 0, 0, 3, Cancelled),
            (Cancelled, 1, 0, 0, Cancelled),
            (Completed, 1, 0, 0, Completed),
            (Failed, 0, 1, 0, Failed),
            (Validating, 5, 0, 0, Validating),
        ];
        for (from, pending, running, completed, to) in cases {
            assert_eq!(
                from.settled(&counts(pending, running, completed)),
                to,
                "{from} with {pending} pending, {running} running, {completed} completed"
            );
        }
    }
}
