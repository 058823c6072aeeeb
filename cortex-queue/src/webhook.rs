//! The outbox of a job's end: each job that names a URL
//! ([`crate::SubmitOptions::notify_url`]) has an event added when it ends,
//! in the transaction that ends it, and delivered at least once by
//! whichever worker or server takes it, with retries and backoff; a job that
//! names a destination ([`crate::SubmitOptions::output_url`]) has an
//! [`EXPORT_EVENT`] row added the same way, taken and retried the same way,
//! its results written there.

use std::time::Duration;

use crate::{JobId, Result};

/// One event to deliver.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WebhookEvent {
    /// Its id, the same on every attempt (receivers use it to drop repeats).
    pub id: i64,
    /// The job that ended.
    pub job: JobId,
    /// Where it goes.
    pub url: String,
    /// `batch.completed`, `batch.failed`, `batch.cancelled` or
    /// `batch.expired`; or [`EXPORT_EVENT`].
    pub kind: String,
    /// When the job ended (Unix ms).
    pub created_at: i64,
    /// Attempts made before this one.
    pub attempts: u32,
    /// When it was delivered (Unix ms), once it has been.
    pub delivered_at: Option<i64>,
    /// The last attempt's error, while it has not been delivered.
    pub last_error: Option<String>,
}

/// The kind of an outbox row that writes the job's results to its `url`.
pub const EXPORT_EVENT: &str = "export";

/// Attempts after which an event is given up.
pub const WEBHOOK_ATTEMPTS: u32 = 16;

/// How long to wait after the `attempts`-th failed attempt: 1 s, doubling,
/// at most an hour (16 attempts span about five hours).
pub fn webhook_retry_after(attempts: u32) -> Duration {
    Duration::from_secs(1u64 << attempts.saturating_sub(1).min(12)).min(Duration::from_secs(3600))
}

/// Where a queue keeps its webhook events.
pub trait WebhookStore {
    /// Takes up to `n` events that are due (not delivered, not given up,
    /// their next attempt's time come, held by no one) for `lease`: no other
    /// deliverer takes them meanwhile.
    fn claim_webhooks(&mut self, n: usize, lease: Duration) -> Result<Vec<WebhookEvent>>;

    /// Records an event as delivered.
    fn webhook_delivered(&mut self, id: i64) -> Result<()>;

    /// Records a failed attempt: the event is tried again after
    /// [`webhook_retry_after`], or given up after [`WEBHOOK_ATTEMPTS`].
    fn webhook_failed(&mut self, id: i64, error: &str) -> Result<()>;

    /// A job's events, oldest first.
    fn webhooks(&mut self, job: JobId) -> Result<Vec<WebhookEvent>>;

    /// When the next attempt of any event not yet delivered nor given up is
    /// due (Unix ms; a held one's when its hold ends), if there is one.
    fn next_webhook_at(&mut self) -> Result<Option<i64>>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_back_off_from_a_second_to_an_hour() {
        let waits: Vec<u64> = (1..=16).map(|a| webhook_retry_after(a).as_secs()).collect();
        assert_eq!(&waits[..4], [1, 2, 4, 8]);
        assert_eq!(waits[12], 3600);
        assert_eq!(waits[15], 3600);
    }
}
