-- Schema version 3: what a dashboard shows of each item.
--
-- The worker an item last ran on (host name and pid, kept after it ends),
-- and each result's time to first token and duration in the engine.
ALTER TABLE items ADD COLUMN ran_by TEXT;
ALTER TABLE results ADD COLUMN first_token_ms BIGINT;
ALTER TABLE results ADD COLUMN duration_ms BIGINT;
