-- Schema version 11: webhooks.
--
-- Where a job's end is announced (NULL: nowhere), and the outbox of events
-- to deliver: a row is added in the same transaction that ends the job
-- (`completed`, `failed`, `cancelled` or `expired`), by the trigger below,
-- so a process killed right after the end still has it delivered by the
-- next one. A deliverer holds a row for a while (`lease_expires_at`);
-- `next_attempt_at` NULL means delivered or given up.
ALTER TABLE jobs ADD COLUMN notify_url TEXT;
CREATE TABLE webhook_events (
    id               INTEGER PRIMARY KEY,
    job_id           INTEGER NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    url              TEXT    NOT NULL,
    type             TEXT    NOT NULL,
    created_at       INTEGER NOT NULL,
    attempts         INTEGER NOT NULL DEFAULT 0,
    next_attempt_at  INTEGER,
    lease_expires_at INTEGER,
    delivered_at     INTEGER,
    last_error       TEXT
);
CREATE INDEX webhook_events_due ON webhook_events (next_attempt_at) WHERE next_attempt_at IS NOT NULL;
CREATE INDEX webhook_events_job ON webhook_events (job_id);
CREATE TRIGGER jobs_announce_end AFTER UPDATE OF state ON jobs
WHEN NEW.notify_url IS NOT NULL AND OLD.state IS NOT NEW.state
     AND NEW.state IN ('completed', 'failed', 'cancelled', 'expired')
BEGIN
    INSERT INTO webhook_events (job_id, url, type, created_at, next_attempt_at)
    VALUES (NEW.id, NEW.notify_url, 'batch.' || NEW.state,
            CASE NEW.state WHEN 'completed' THEN NEW.completed_at WHEN 'failed' THEN NEW.failed_at
                           WHEN 'cancelled' THEN NEW.cancelled_at ELSE NEW.expired_at END,
            CASE NEW.state WHEN 'completed' THEN NEW.completed_at WHEN 'failed' THEN NEW.failed_at
                           WHEN 'cancelled' THEN NEW.cancelled_at ELSE NEW.expired_at END);
END;
