//! Completion windows: jobs whose window has ended are expired before
//! anything reads or claims them, so no reader sees one still running and
//! no worker takes one of its items.

use cortex_queue::{BATCH_EXPIRED, EXPIRED_MESSAGE, Result, now_ms};
use rusqlite::{Transaction, params};

use crate::store::{Outcome, Store};

/// Ends the jobs whose completion window has ended by `now`: their items
/// that had not finished fail with `batch_expired` (a running one's lease
/// with it: its worker learns at its next heartbeat, and a result it
/// writes later is refused), and the job is `expired`.
pub(crate) fn expire_due(tx: &Transaction<'_>, now: i64) -> rusqlite::Result<()> {
    let due: Vec<i64> = tx
        .prepare_cached(
            "SELECT id FROM jobs INDEXED BY jobs_expiring
             WHERE expires_at IS NOT NULL AND state = 'in_progress' AND expires_at <= ?1",
        )?
        .query_map([now], |row| row.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    for job in due {
        tx.prepare_cached(
            "UPDATE items SET state = 'failed', error_code = ?2, error_message = ?3, worker_id = NULL,
                              lease_expires_at = NULL, lease_token = lease_token + 1, updated_at = ?4
             WHERE job_id = ?1 AND state IN ('pending', 'running')",
        )?
        .execute(params![job, BATCH_EXPIRED, EXPIRED_MESSAGE, now])?;
        tx.prepare_cached("UPDATE jobs SET state = 'expired', expired_at = ?2 WHERE id = ?1")?
            .execute(params![job, now])?;
    }
    Ok(())
}

impl Store {
    /// [`Store::read`], after expiring the jobs whose window has ended (a
    /// write only when there is one).
    pub(crate) fn read_current<T>(
        &mut self,
        f: impl FnMut(&Transaction<'_>) -> Result<T, Outcome>,
    ) -> Result<T> {
        let now = now_ms();
        let due = self.read(|tx| {
            Ok(tx
                .prepare_cached(
                    "SELECT EXISTS (SELECT 1 FROM jobs INDEXED BY jobs_expiring
                     WHERE expires_at IS NOT NULL AND state = 'in_progress' AND expires_at <= ?1)",
                )?
                .query_row([now], |row| row.get::<_, bool>(0))?)
        })?;
        if due {
            self.write(|tx| expire_due(tx, now))?;
        }
        self.read(f)
    }
}
