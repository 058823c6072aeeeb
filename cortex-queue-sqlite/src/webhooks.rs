//! The webhook outbox: events the `jobs_announce_end` trigger adds when a
//! job ends, taken by deliverers under a lease.

use std::time::Duration;

use cortex_queue::driver::duration_ms;
use cortex_queue::{
    JobId, Result, WEBHOOK_ATTEMPTS, WebhookEvent, WebhookStore, now_ms, webhook_retry_after,
};
use rusqlite::{Row, params};

use crate::store::Store;

const EVENT_COLUMNS: &str = "id, job_id, url, type, created_at, attempts, delivered_at, last_error";

fn event_from_row(row: &Row<'_>) -> rusqlite::Result<WebhookEvent> {
    Ok(WebhookEvent {
        id: row.get(0)?,
        job: JobId(row.get(1)?),
        url: row.get(2)?,
        kind: row.get(3)?,
        created_at: row.get(4)?,
        attempts: row.get::<_, i64>(5)?.max(0) as u32,
        delivered_at: row.get(6)?,
        last_error: row.get(7)?,
    })
}

impl WebhookStore for Store {
    fn claim_webhooks(&mut self, n: usize, lease: Duration) -> Result<Vec<WebhookEvent>> {
        let limit = i64::try_from(n).unwrap_or(i64::MAX);
        let lease_ms = duration_ms(lease);
        self.write(|tx| {
            let now = now_ms();
            tx.prepare_cached(&format!(
                "UPDATE webhook_events SET lease_expires_at = ?2 + ?3
                 WHERE id IN (SELECT id FROM webhook_events INDEXED BY webhook_events_due
                              WHERE next_attempt_at IS NOT NULL AND next_attempt_at <= ?2
                                AND (lease_expires_at IS NULL OR lease_expires_at <= ?2)
                              ORDER BY next_attempt_at LIMIT ?1)
                 RETURNING {EVENT_COLUMNS}"
            ))?
            .query_map(params![limit, now, lease_ms], event_from_row)?
            .collect()
        })
    }

    fn webhook_delivered(&mut self, id: i64) -> Result<()> {
        self.write(|tx| {
            tx.execute(
                "UPDATE webhook_events SET delivered_at = ?2, next_attempt_at = NULL,
                        lease_expires_at = NULL, last_error = NULL, attempts = attempts + 1
                 WHERE id = ?1",
                params![id, now_ms()],
            )
            .map(drop)
        })
    }

    fn webhook_failed(&mut self, id: i64, error: &str) -> Result<()> {
        self.write(|tx| {
            let attempts: i64 = tx.query_row(
                "SELECT attempts + 1 FROM webhook_events WHERE id = ?1",
                [id],
                |row| row.get(0),
            )?;
            let attempts = attempts.max(0) as u32;
            let next = (attempts < WEBHOOK_ATTEMPTS)
                .then(|| now_ms() + duration_ms(webhook_retry_after(attempts)));
            tx.execute(
                "UPDATE webhook_events SET attempts = ?2, next_attempt_at = ?3,
                        lease_expires_at = NULL, last_error = ?4
                 WHERE id = ?1",
                params![id, attempts, next, error],
            )
            .map(drop)
        })
    }

    fn next_webhook_at(&mut self) -> Result<Option<i64>> {
        self.read(|tx| {
            Ok(tx
                .prepare_cached(
                    "SELECT min(max(next_attempt_at, coalesce(lease_expires_at, 0)))
                     FROM webhook_events INDEXED BY webhook_events_due
                     WHERE next_attempt_at IS NOT NULL",
                )?
                .query_row([], |row| row.get(0))?)
        })
    }

    fn webhooks(&mut self, job: JobId) -> Result<Vec<WebhookEvent>> {
        self.read(|tx| {
            Ok(tx
                .prepare_cached(&format!(
                    "SELECT {EVENT_COLUMNS} FROM webhook_events WHERE job_id = ?1 ORDER BY id"
                ))?
                .query_map([job.0], event_from_row)?
                .collect::<rusqlite::Result<_>>()?)
        })
    }
}
