-- Schema version 1: jobs, items, results, input errors; per-job counters kept by triggers.
CREATE TABLE jobs (
    id                INTEGER PRIMARY KEY,
    state             TEXT    NOT NULL,
    source_name       TEXT    NOT NULL,
    source_sha256     TEXT    NOT NULL,
    params_sha256     TEXT    NOT NULL,
    model             TEXT    NOT NULL,
    defaults          TEXT    NOT NULL,
    metadata          TEXT    NOT NULL,
    priority          INTEGER NOT NULL DEFAULT 0,
    max_attempts      INTEGER NOT NULL,
    lines             INTEGER NOT NULL DEFAULT 0,
    invalid           INTEGER NOT NULL DEFAULT 0,
    n_pending         INTEGER NOT NULL DEFAULT 0,
    n_running         INTEGER NOT NULL DEFAULT 0,
    n_completed       INTEGER NOT NULL DEFAULT 0,
    n_failed          INTEGER NOT NULL DEFAULT 0,
    n_cancelled       INTEGER NOT NULL DEFAULT 0,
    prompt_tokens     INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    created_at        INTEGER NOT NULL,
    validating_at     INTEGER,
    in_progress_at    INTEGER,
    finalizing_at     INTEGER,
    completed_at      INTEGER,
    failed_at         INTEGER,
    cancelling_at     INTEGER,
    cancelled_at      INTEGER
);
CREATE INDEX jobs_source ON jobs (source_sha256, params_sha256);
CREATE INDEX jobs_state ON jobs (state);

CREATE TABLE items (
    id               INTEGER PRIMARY KEY,
    job_id           INTEGER NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    line             INTEGER NOT NULL,
    custom_id        TEXT    NOT NULL,
    endpoint         TEXT    NOT NULL,
    model            TEXT,
    request          TEXT    NOT NULL,
    priority         INTEGER NOT NULL DEFAULT 0,
    state            TEXT    NOT NULL DEFAULT 'pending',
    attempts         INTEGER NOT NULL DEFAULT 0,
    lease_token      INTEGER NOT NULL DEFAULT 0,
    lease_expires_at INTEGER,
    not_before       INTEGER NOT NULL DEFAULT 0,
    error_code       TEXT,
    error_message    TEXT,
    updated_at       INTEGER NOT NULL,
    UNIQUE (job_id, custom_id)
);
-- What claim walks: waiting items, highest job priority first, then input order.
CREATE INDEX items_ready ON items (priority DESC, id) WHERE state = 'pending';
-- What claim sweeps: leases that ran out.
CREATE INDEX items_leased ON items (lease_expires_at) WHERE state = 'running';
-- Cancel, resume, retry and export touch one job's items of one state.
CREATE INDEX items_job_state ON items (job_id, state);

CREATE TABLE results (
    item_id           INTEGER PRIMARY KEY REFERENCES items (id) ON DELETE CASCADE,
    job_id            INTEGER NOT NULL,
    attempt           INTEGER NOT NULL,
    body              TEXT    NOT NULL,
    prompt_tokens     INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    completed_at      INTEGER NOT NULL
);
-- Throughput over a recent window reads only that window.
CREATE INDEX results_job_time ON results (job_id, completed_at, completion_tokens);

CREATE TABLE input_errors (
    job_id    INTEGER NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    line      INTEGER NOT NULL,
    custom_id TEXT,
    message   TEXT    NOT NULL,
    PRIMARY KEY (job_id, line)
) WITHOUT ROWID;

-- Per-job counters, so status never counts rows.
CREATE TRIGGER items_count_insert AFTER INSERT ON items BEGIN
    UPDATE jobs SET
        n_pending   = n_pending   + (NEW.state = 'pending'),
        n_running   = n_running   + (NEW.state = 'running'),
        n_completed = n_completed + (NEW.state = 'completed'),
        n_failed    = n_failed    + (NEW.state = 'failed'),
        n_cancelled = n_cancelled + (NEW.state = 'cancelled')
    WHERE id = NEW.job_id;
END;
CREATE TRIGGER items_count_update AFTER UPDATE OF state ON items WHEN OLD.state IS NOT NEW.state BEGIN
    UPDATE jobs SET
        n_pending   = n_pending   + (NEW.state = 'pending')   - (OLD.state = 'pending'),
        n_running   = n_running   + (NEW.state = 'running')   - (OLD.state = 'running'),
        n_completed = n_completed + (NEW.state = 'completed') - (OLD.state = 'completed'),
        n_failed    = n_failed    + (NEW.state = 'failed')    - (OLD.state = 'failed'),
        n_cancelled = n_cancelled + (NEW.state = 'cancelled') - (OLD.state = 'cancelled')
    WHERE id = NEW.job_id;
END;
CREATE TRIGGER results_tokens AFTER INSERT ON results BEGIN
    UPDATE jobs SET
        prompt_tokens     = prompt_tokens     + NEW.prompt_tokens,
        completion_tokens = completion_tokens + NEW.completion_tokens
    WHERE id = NEW.job_id;
END;
