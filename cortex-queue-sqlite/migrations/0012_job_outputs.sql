-- Schema version 12: where a job's results go when it ends.
--
-- A job may carry its destination (`output_url`: a local path or an
-- object's URL). When it ends, the trigger below adds an `export` row to the
-- outbox of schema 11, in the transaction that ends it, so the results are
-- written by whichever worker or server takes the row (with the same lease,
-- retries and backoff as a webhook event), even if the process that ended
-- the job is killed right after.
ALTER TABLE jobs ADD COLUMN output_url TEXT;
CREATE TRIGGER jobs_export_at_end AFTER UPDATE OF state ON jobs
WHEN NEW.output_url IS NOT NULL AND OLD.state IS NOT NEW.state
     AND NEW.state IN ('completed', 'failed', 'cancelled', 'expired')
BEGIN
    INSERT INTO webhook_events (job_id, url, type, created_at, next_attempt_at)
    VALUES (NEW.id, NEW.output_url, 'export',
            CASE NEW.state WHEN 'completed' THEN NEW.completed_at WHEN 'failed' THEN NEW.failed_at
                           WHEN 'cancelled' THEN NEW.cancelled_at ELSE NEW.expired_at END,
            CASE NEW.state WHEN 'completed' THEN NEW.completed_at WHEN 'failed' THEN NEW.failed_at
                           WHEN 'cancelled' THEN NEW.cancelled_at ELSE NEW.expired_at END);
END;
