-- Schema version 3: suspect isolation and model binding.
--
-- deaths: how many times a worker (or its engine) died while the item was in
--   flight. Such deaths do not use up attempts; they make the item a suspect,
--   run in ever smaller groups of suspects until it runs alone.
-- alone: the current claim runs the item with nothing else in flight, so a
--   death now is the item's own doing and is charged as an attempt.
ALTER TABLE items ADD COLUMN deaths INTEGER NOT NULL DEFAULT 0;
ALTER TABLE items ADD COLUMN alone INTEGER NOT NULL DEFAULT 0;
-- What a suspect claim walks: the most suspected first.
CREATE INDEX items_suspects ON items (deaths DESC, priority DESC, id) WHERE state = 'pending' AND deaths > 0;

-- The identity of the model a job needs (the GGUF's SHA-256); NULL lets any
-- worker run it (jobs from before version 3).
ALTER TABLE jobs ADD COLUMN model_sha256 TEXT;
-- The model each worker serves, so status can say whether any serves a job.
ALTER TABLE workers ADD COLUMN model_sha256 TEXT;
