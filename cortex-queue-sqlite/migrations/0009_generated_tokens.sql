-- Schema version 9: how far a running item has got.
--
-- The tokens the running attempt has generated so far, as its worker last
-- reported them (every few seconds), so that a job's status counts tokens
-- as they are generated, not only when items finish. Claiming resets it.
ALTER TABLE items ADD COLUMN generated_tokens INTEGER NOT NULL DEFAULT 0;
