-- Schema version 7: where a job's results go when it ends.
--
-- A job may carry its destination (`output_url`: a local path or an
-- object's URL). When it ends, the trigger below adds an `export` row to the
-- outbox of schema 6, in the transaction that ends it, so the results are
-- written by whichever worker or server takes the row (with the same lease,
-- retries and backoff as a webhook event), even if the process that ended
-- the job is killed right after.
ALTER TABLE jobs ADD COLUMN output_url TEXT;
CREATE FUNCTION cortex_export_at_end() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO webhook_events (job_id, url, type, created_at, next_attempt_at)
    VALUES (NEW.id, NEW.output_url, 'export', cortex_now(), cortex_now());
    RETURN NULL;
END $$;
CREATE TRIGGER jobs_export_at_end AFTER UPDATE OF state ON jobs FOR EACH ROW
WHEN (NEW.output_url IS NOT NULL AND OLD.state IS DISTINCT FROM NEW.state
      AND NEW.state IN ('completed', 'failed', 'cancelled', 'expired'))
EXECUTE FUNCTION cortex_export_at_end();
