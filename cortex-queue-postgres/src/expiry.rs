//! Completion windows: jobs whose window has ended are expired before
//! anything reads, changes or claims them, so no reader sees one still
//! running and no worker takes one of its items.

use cortex_queue::{BATCH_EXPIRED, EXPIRED_MESSAGE, Result};

use crate::PgStore;

impl PgStore {
    /// Ends the jobs whose completion window has ended: their items that
    /// had not finished fail with `batch_expired` (a running one's lease
    /// with it: its worker learns at its next heartbeat, and a result it
    /// writes later is refused), and each job is `expired`. One cheap read
    /// when none is due.
    pub(crate) fn expire_due_jobs(&mut self) -> Result<()> {
        let due = self.run_autocommit(|tx| {
            Ok(tx
                .query_one(
                    "SELECT EXISTS (SELECT 1 FROM jobs
                     WHERE expires_at IS NOT NULL AND state = 'in_progress' AND expires_at <= cortex_now())",
                    &[],
                )?
                .get::<_, bool>(0))
        })?;
        if !due {
            return Ok(());
        }
        self.run(|tx| {
            // Row locks: of two processes expiring at once, the second finds
            // the job no longer in progress once the first commits.
            let jobs: Vec<i64> = tx
                .query(
                    "SELECT id FROM jobs
                     WHERE expires_at IS NOT NULL AND state = 'in_progress' AND expires_at <= cortex_now()
                     ORDER BY id FOR UPDATE",
                    &[],
                )?
                .iter()
                .map(|row| row.get(0))
                .collect();
            if jobs.is_empty() {
                return Ok(());
            }
            tx.execute(
                "UPDATE items SET state = 'failed', error_code = $2, error_message = $3, worker_id = NULL,
                                  lease_expires_at = NULL, lease_token = lease_token + 1,
                                  updated_at = cortex_now()
                 WHERE job_id = ANY($1::bigint[]) AND state IN ('pending', 'running')",
                &[&jobs, &BATCH_EXPIRED, &EXPIRED_MESSAGE],
            )?;
            tx.execute(
                "UPDATE jobs SET state = 'expired', expired_at = cortex_now() WHERE id = ANY($1::bigint[])",
                &[&jobs],
            )?;
            Ok(())
        })
    }
}
