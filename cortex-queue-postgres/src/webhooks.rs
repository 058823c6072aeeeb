//! The webhook outbox: events the `jobs_announce_end` trigger adds when a
//! job ends, taken by deliverers under a lease (`SKIP LOCKED`: deliverers
//! on many hosts never take the same event at once).

use std::time::Duration;

use cortex_queue::driver::duration_ms;
use cortex_queue::{
    JobId, Result, WEBHOOK_ATTEMPTS, WebhookEvent, WebhookStore, webhook_retry_after,
};
use postgres::Row;

use crate::PgStore;

const EVENT_COLUMNS: &str = "id, job_id, url, type, created_at, attempts, delivered_at, last_error";

fn event_from_row(row: &Row) -> WebhookEvent {
    WebhookEvent {
        id: row.get(0),
        job: JobId(row.get(1)),
        url: row.get(2),
        kind: row.get(3),
        created_at: row.get(4),
        attempts: row.get::<_, i32>(5).max(0) as u32,
        delivered_at: row.get(6),
        last_error: row.get(7),
    }
}

impl WebhookStore for PgStore {
    fn claim_webhooks(&mut self, n: usize, lease: Duration) -> Result<Vec<WebhookEvent>> {
        let limit = i64::try_from(n).unwrap_or(i64::MAX);
        let lease_ms = duration_ms(lease);
        self.run(|tx| {
            Ok(tx
                .query(
                    &format!(
                        "UPDATE webhook_events SET lease_expires_at = cortex_now() + $2
                         WHERE id IN (SELECT id FROM webhook_events
                                      WHERE next_attempt_at IS NOT NULL AND next_attempt_at <= cortex_now()
                                        AND (lease_expires_at IS NULL OR lease_expires_at <= cortex_now())
                                      ORDER BY next_attempt_at LIMIT $1 FOR UPDATE SKIP LOCKED)
                         RETURNING {EVENT_COLUMNS}"
                    ),
                    &[&limit, &lease_ms],
                )?
                .iter()
                .map(event_from_row)
                .collect())
        })
    }

    fn webhook_delivered(&mut self, id: i64) -> Result<()> {
        self.run_autocommit(|tx| {
            tx.execute(
                "UPDATE webhook_events SET delivered_at = cortex_now(), next_attempt_at = NULL,
                        lease_expires_at = NULL, last_error = NULL, attempts = attempts + 1
                 WHERE id = $1",
                &[&id],
            )
            .map(drop)
        })
    }

    fn webhook_failed(&mut self, id: i64, error: &str) -> Result<()> {
        self.run(|tx| {
            let Some(row) = tx.query_opt(
                "SELECT attempts + 1 FROM webhook_events WHERE id = $1 FOR UPDATE",
                &[&id],
            )?
            else {
                return Ok(());
            };
            let attempts = row.get::<_, i32>(0).max(0) as u32;
            let wait: Option<i64> =
                (attempts < WEBHOOK_ATTEMPTS).then(|| duration_ms(webhook_retry_after(attempts)));
            tx.execute(
                "UPDATE webhook_events SET attempts = $2, next_attempt_at = cortex_now() + $3,
                        lease_expires_at = NULL, last_error = $4
                 WHERE id = $1",
                &[&id, &(attempts as i32), &wait, &error],
            )
            .map(drop)
        })
    }

    fn next_webhook_at(&mut self) -> Result<Option<i64>> {
        self.run_autocommit(|tx| {
            Ok(tx
                .query_one(
                    "SELECT min(GREATEST(next_attempt_at, coalesce(lease_expires_at, 0)))::bigint
                     FROM webhook_events WHERE next_attempt_at IS NOT NULL",
                    &[],
                )?
                .get(0))
        })
    }

    fn webhooks(&mut self, job: JobId) -> Result<Vec<WebhookEvent>> {
        self.run_autocommit(|tx| {
            Ok(tx
                .query(
                    &format!(
                        "SELECT {EVENT_COLUMNS} FROM webhook_events WHERE job_id = $1 ORDER BY id"
                    ),
                    &[&job.0],
                )?
                .iter()
                .map(event_from_row)
                .collect())
        })
    }
}
