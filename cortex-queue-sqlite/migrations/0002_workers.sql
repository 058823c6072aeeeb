-- Schema version 2: worker processes, so the leases of a worker that died on
-- this host are reclaimed at once instead of after their timeout.
CREATE TABLE workers (
    id            INTEGER PRIMARY KEY,
    host          TEXT    NOT NULL,
    pid           INTEGER NOT NULL,
    started       INTEGER NOT NULL,
    registered_at INTEGER NOT NULL
);
CREATE INDEX workers_host ON workers (host);
ALTER TABLE items ADD COLUMN worker_id INTEGER;
CREATE INDEX items_worker ON items (worker_id) WHERE state = 'running';
