-- Schema version 8: what a dashboard shows of each item and worker.
--
-- The worker an item last ran on (host name and pid, kept after it ends),
-- each result's time to first token and duration in the engine, and each
-- worker's last sign of life.
ALTER TABLE items ADD COLUMN ran_by TEXT;
ALTER TABLE results ADD COLUMN first_token_ms INTEGER;
ALTER TABLE results ADD COLUMN duration_ms INTEGER;
ALTER TABLE workers ADD COLUMN heartbeat_at INTEGER;
