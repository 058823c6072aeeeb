-- Schema version 6: webhooks.
--
-- Where a job's end is announced (NULL: nowhere), and the outbox of events
-- to deliver: a row is added in the same transaction that ends the job
-- (`completed`, `failed`, `cancelled` or `expired`), by the trigger below,
-- so a process killed right after the end still has it delivered by the
-- next one. A deliverer holds a row for a while (`lease_expires_at`);
-- `next_attempt_at` NULL means delivered or given up.
ALTER TABLE jobs ADD COLUMN notify_url TEXT;
CREATE TABLE webhook_events (
    id               BIGSERIAL PRIMARY KEY,
    job_id           BIGINT  NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    url              TEXT    NOT NULL,
    type             TEXT    NOT NULL,
    created_at       BIGINT  NOT NULL,
    attempts         INTEGER NOT NULL DEFAULT 0,
    next_attempt_at  BIGINT,
    lease_expires_at BIGINT,
    delivered_at     BIGINT,
    last_error       TEXT
);
CREATE INDEX webhook_events_due ON webhook_events (next_attempt_at) WHERE next_attempt_at IS NOT NULL;
CREATE INDEX webhook_events_job ON webhook_events (job_id);
CREATE FUNCTION cortex_announce_end() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO webhook_events (job_id, url, type, created_at, next_attempt_at)
    VALUES (NEW.id, NEW.notify_url, 'batch.' || NEW.state, cortex_now(), cortex_now());
    RETURN NULL;
END $$;
CREATE TRIGGER jobs_announce_end AFTER UPDATE OF state ON jobs FOR EACH ROW
WHEN (NEW.notify_url IS NOT NULL AND OLD.state IS DISTINCT FROM NEW.state
      AND NEW.state IN ('completed', 'failed', 'cancelled', 'expired'))
EXECUTE FUNCTION cortex_announce_end();
