-- Schema version 10: completion windows.
--
-- When a job's window ends (NULL: it has none), and when it expired: what
-- had not finished then failed with `batch_expired`.
ALTER TABLE jobs ADD COLUMN expires_at INTEGER;
ALTER TABLE jobs ADD COLUMN expired_at INTEGER;
-- What every claim and read looks at: running jobs whose window may have ended.
CREATE INDEX jobs_expiring ON jobs (expires_at) WHERE expires_at IS NOT NULL AND state = 'in_progress';
