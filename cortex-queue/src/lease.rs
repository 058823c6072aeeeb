//! Leases and what a worker learns and reports under them, with the rules
//! every driver claims and retries by (suspect groups, backoff).

use std::time::Duration;

use cortex_request::Work;

use crate::{ItemId, JobId};

/// How long a claim holds an item unless a worker renews it (workers renew
/// at a third of it): a dead worker's items are free again after this.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(60);

/// When a failed item, or a lone suspect whose worker died, may run again:
/// the rules every driver retries by, with one set of defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// First retry delay of a failed item; doubled per attempt.
    pub retry_backoff: Duration,
    /// Longest retry delay.
    pub max_retry_backoff: Duration,
    /// How long a suspect whose lone run ended in a worker death waits
    /// before it runs alone again (doubled per attempt charged, up to 32
    /// times): some worker must stay alive meanwhile, and kills from outside
    /// hit idle and busy workers alike, ending the streak of deaths that
    /// charges a lone suspect (a poison item's deaths stay in a row).
    pub lone_retry: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            retry_backoff: Duration::from_secs(2),
            max_retry_backoff: Duration::from_secs(300),
            lone_retry: Duration::from_secs(1),
        }
    }
}

/// The right to write an item's outcome: valid while its token is the item's current one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lease {
    /// The item.
    pub item: ItemId,
    /// The lease token this claim got (raised by every claim of the item).
    pub token: i64,
}

/// How to claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimOptions {
    /// How long a lease lasts without a heartbeat.
    pub lease: Duration,
    /// Claim only from these jobs (all jobs when `None`).
    pub jobs: Option<Vec<JobId>>,
    /// The SHA-256 of the model this worker runs: only jobs submitted for it
    /// (or for no particular model) are claimed. `None` claims from every job.
    pub model_sha256: Option<String>,
    /// Whether suspects may be claimed: items that were in flight when a
    /// worker died. They come as a group of their own ([`ClaimedItem::suspect`]),
    /// which the caller must run with nothing else in flight, claiming nothing
    /// more until the group is done. Set it only when nothing is in flight.
    pub suspects: bool,
    /// Whether a suspect may be claimed to run alone (one deep enough that a
    /// death charges it an attempt). Kills from outside land on whatever is
    /// running; a worker that takes at most one lone suspect per life, and
    /// not as its first claim, spreads them thin, so bad luck seldom charges
    /// an innocent item twice, while a poison item kills every worker that
    /// runs it anyway. When nothing else is claimable it is taken regardless.
    pub alone: bool,
    /// Whether a line's output on this worker depends only on the line, its
    /// settings and its seed, not on what runs beside it (the engine's
    /// `same_output`). A worker without it marks each job it claims from
    /// ([`crate::Job::outputs_may_vary`]).
    pub same_output: bool,
}

impl Default for ClaimOptions {
    fn default() -> Self {
        Self {
            lease: Duration::from_secs(60),
            jobs: None,
            model_sha256: None,
            suspects: true,
            alone: true,
            same_output: false,
        }
    }
}

/// An item handed to a worker.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimedItem {
    /// Present it to heartbeat, complete or fail.
    pub lease: Lease,
    /// Its job.
    pub job: JobId,
    /// Its 1-based input line.
    pub line: u64,
    /// The caller's id.
    pub custom_id: String,
    /// The format its output is rendered in (an endpoint path).
    pub endpoint: String,
    /// What to compute; its `id` is the item id.
    pub request: Work,
    /// Which attempt this is (1 for the first claim; a worker death that
    /// was not the item's own doing gives its attempt back).
    pub attempt: u32,
    /// Part of a suspect group: its worker must run nothing else beside it.
    pub suspect: bool,
    /// A suspect claimed alone: if its worker dies now, it is charged.
    pub alone: bool,
    /// When the lease runs out unless extended (Unix ms).
    pub lease_expires_at: i64,
}

/// What a heartbeat learned about one lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseStatus {
    /// Still held, now until this time (Unix ms).
    Held {
        /// The new expiry.
        expires_at: i64,
    },
    /// The job was cancelled: the item is now cancelled; stop working on it.
    Cancelled,
    /// Another worker took the item over (the lease had expired) or it ended:
    /// stop working on it; its result would not be recorded.
    Lost,
}

/// Why an item's attempt failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemFailure {
    /// A short stable code (`prompt_too_long`, `executor_error`, ...).
    pub code: String,
    /// What happened.
    pub message: String,
    /// Whether another attempt may succeed.
    pub retryable: bool,
}

/// What became of a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailOutcome {
    /// Back to pending, not to be claimed before `not_before` (Unix ms).
    Retrying {
        /// Attempts made so far.
        attempts: u32,
        /// Earliest next claim.
        not_before: i64,
    },
    /// Failed for good (not retryable, or out of attempts).
    Failed,
}

impl FailOutcome {
    /// What a failed attempt leads to, at `now` (Unix ms), after `attempts`
    /// of the job's `max_attempts`: another try after the backoff
    /// (`base_ms` doubled per attempt, at most `cap_ms`) if the failure is
    /// retryable and attempts are left, else failed for good.
    pub fn of(
        failure: &ItemFailure,
        attempts: u32,
        max_attempts: u32,
        now: i64,
        (base_ms, cap_ms): (i64, i64),
    ) -> Self {
        if failure.retryable && attempts < max_attempts {
            FailOutcome::Retrying {
                attempts,
                not_before: now + retry_delay_ms(base_ms, cap_ms, attempts),
            }
        } else {
            FailOutcome::Failed
        }
    }

    /// The item's state and earliest next claim (Unix ms, 0: none) after it.
    pub fn item_state(self) -> (&'static str, i64) {
        match self {
            FailOutcome::Retrying { not_before, .. } => ("pending", not_before),
            FailOutcome::Failed => ("failed", 0),
        }
    }
}

/// What a lease that ran out records as the item's last error.
pub const WORKER_STOPPED: &str =
    "its worker stopped while generating it (crash, kill or lost lease)";

/// The claim rule every driver follows, given the deepest suspect `level`
/// ready to run (if any suspects are allowed and ready): `claim(suspects,
/// limit)` claims that many normal items or suspects. Suspects come as a
/// group of `n >> level`; a group of one is a lone run, taken only when
/// `options.alone` allows, else normal items first if there are any.
pub fn claim_by_rule<T, E>(
    n: usize,
    level: Option<i64>,
    options: &ClaimOptions,
    mut claim: impl FnMut(bool, usize) -> Result<Vec<T>, E>,
) -> Result<Vec<T>, E> {
    match level {
        Some(level) if suspect_group(n, level) == 1 && !options.alone => {
            // Not this worker's turn for a lone suspect: other work first, if there is any.
            let normal = claim(false, n)?;
            if normal.is_empty() {
                claim(true, 1)
            } else {
                Ok(normal)
            }
        }
        Some(level) => claim(true, suspect_group(n, level)),
        None => claim(false, n),
    }
}

/// How many suspects of `level` deaths run together: half as many per death,
/// so a poison item is alone after about log2(`n`) deaths.
pub fn suspect_group(n: usize, level: i64) -> usize {
    let shift = u32::try_from(level.clamp(0, 63)).unwrap_or(63);
    n.checked_shr(shift).unwrap_or(0).max(1)
}

/// The suspect level from which items run alone (see [`suspect_group`]).
pub fn alone_level(n: usize) -> i64 {
    i64::from(n.max(1).ilog2())
}

/// The wait before the next attempt after `attempts` failed ones: `base`
/// doubled per attempt after the first, at most `cap` (all in ms).
fn retry_delay_ms(base: i64, cap: i64, attempts: u32) -> i64 {
    base.saturating_mul(1_i64 << attempts.saturating_sub(1).min(30))
        .min(cap)
}

/// `d` in whole milliseconds (saturating).
pub fn duration_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX / 4)
}
