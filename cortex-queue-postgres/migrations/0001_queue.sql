-- Schema version 1 of the PostgreSQL queue: the concepts of the SQLite
-- store's six versions (jobs, items, typed results, input errors, workers,
-- suspects and the death streak, grammars stored once), plus per-job
-- counters in shards and workers' heartbeats.

-- Milliseconds since the Unix epoch on the database server's clock: every
-- host compares leases against the same clock.
CREATE FUNCTION cortex_now() RETURNS bigint LANGUAGE sql STABLE AS
$$ SELECT (extract(epoch FROM statement_timestamp()) * 1000)::bigint $$;

CREATE TABLE jobs (
    id                BIGSERIAL PRIMARY KEY,
    state             TEXT    NOT NULL,
    source_name       TEXT    NOT NULL,
    source_sha256     TEXT    NOT NULL,
    params_sha256     TEXT    NOT NULL,
    model             TEXT    NOT NULL,
    model_sha256      TEXT,
    defaults          TEXT    NOT NULL,
    metadata          JSONB   NOT NULL,
    priority          INTEGER NOT NULL DEFAULT 0,
    max_attempts      INTEGER NOT NULL,
    lines             BIGINT  NOT NULL DEFAULT 0,
    invalid           BIGINT  NOT NULL DEFAULT 0,
    created_at        BIGINT  NOT NULL,
    validating_at     BIGINT,
    in_progress_at    BIGINT,
    finalizing_at     BIGINT,
    completed_at      BIGINT,
    failed_at         BIGINT,
    cancelling_at     BIGINT,
    cancelled_at      BIGINT
);
CREATE INDEX jobs_source ON jobs (source_sha256, params_sha256);

-- Item counts and tokens per job, split in shards (one per writing
-- connection, by backend pid) so that many workers finishing items of one
-- job do not queue on one row. A job's counts are the sum of its shards.
CREATE TABLE job_counts (
    job_id            BIGINT  NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    shard             INTEGER NOT NULL,
    pending           BIGINT  NOT NULL DEFAULT 0,
    running           BIGINT  NOT NULL DEFAULT 0,
    completed         BIGINT  NOT NULL DEFAULT 0,
    failed            BIGINT  NOT NULL DEFAULT 0,
    cancelled         BIGINT  NOT NULL DEFAULT 0,
    prompt_tokens     BIGINT  NOT NULL DEFAULT 0,
    completion_tokens BIGINT  NOT NULL DEFAULT 0,
    PRIMARY KEY (job_id, shard)
);

CREATE TABLE workers (
    id            BIGSERIAL PRIMARY KEY,
    host          TEXT    NOT NULL,
    pid           INTEGER NOT NULL,
    started       BIGINT  NOT NULL,
    registered_at BIGINT  NOT NULL,
    heartbeat_at  BIGINT  NOT NULL,
    model_sha256  TEXT
);
CREATE INDEX workers_host ON workers (host);

CREATE TABLE items (
    id               BIGSERIAL PRIMARY KEY,
    job_id           BIGINT  NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    line             BIGINT  NOT NULL,
    custom_id        TEXT    NOT NULL,
    endpoint         TEXT    NOT NULL,
    model            TEXT,
    request          TEXT    NOT NULL,
    priority         INTEGER NOT NULL DEFAULT 0,
    state            TEXT    NOT NULL DEFAULT 'pending',
    attempts         INTEGER NOT NULL DEFAULT 0,
    lease_token      BIGINT  NOT NULL DEFAULT 0,
    lease_expires_at BIGINT,
    not_before       BIGINT  NOT NULL DEFAULT 0,
    error_code       TEXT,
    error_message    TEXT,
    updated_at       BIGINT  NOT NULL,
    worker_id        BIGINT,
    -- Worker deaths while in flight, and whether the current claim runs it alone.
    deaths           INTEGER NOT NULL DEFAULT 0,
    alone            BOOLEAN NOT NULL DEFAULT false,
    UNIQUE (job_id, custom_id)
);
-- What a claim walks: waiting items, highest job priority first, then input order.
CREATE INDEX items_ready ON items (priority DESC, id) WHERE state = 'pending' AND deaths = 0;
-- Suspects, the most suspected first.
CREATE INDEX items_suspects ON items (deaths DESC, priority DESC, id) WHERE state = 'pending' AND deaths > 0;
-- Leases that ran out.
CREATE INDEX items_leased ON items (lease_expires_at) WHERE state = 'running';
-- Cancel, resume, retry, export and inspection read one job in input order.
CREATE INDEX items_job_line ON items (job_id, line);

CREATE TABLE results (
    item_id           BIGINT  PRIMARY KEY REFERENCES items (id) ON DELETE CASCADE,
    job_id            BIGINT  NOT NULL,
    attempt           INTEGER NOT NULL,
    response          TEXT    NOT NULL,
    prompt_tokens     BIGINT  NOT NULL,
    completion_tokens BIGINT  NOT NULL,
    completed_at      BIGINT  NOT NULL
);
-- Throughput over a recent window reads only that window.
CREATE INDEX results_job_time ON results (job_id, completed_at) INCLUDE (completion_tokens);

CREATE TABLE input_errors (
    job_id    BIGINT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    line      BIGINT NOT NULL,
    custom_id TEXT,
    message   TEXT   NOT NULL,
    PRIMARY KEY (job_id, line)
);

-- The item the last worker death was charged to (see the SQLite schema, version 5).
CREATE TABLE death_streak (
    id   INTEGER PRIMARY KEY CHECK (id = 1),
    item BIGINT
);
INSERT INTO death_streak (id, item) VALUES (1, NULL);

CREATE TABLE grammars (
    sha256 TEXT PRIMARY KEY,
    text   TEXT NOT NULL
);

-- Counters move once per statement, by the difference its rows made, in
-- this connection's shard; job ids in order so two statements never wait
-- on each other's shard rows in opposite orders.
CREATE FUNCTION cortex_count_items() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO job_counts AS c (job_id, shard, pending, running, completed, failed, cancelled)
        SELECT job_id, pg_backend_pid() % 16,
               count(*) FILTER (WHERE state = 'pending'), count(*) FILTER (WHERE state = 'running'),
               count(*) FILTER (WHERE state = 'completed'), count(*) FILTER (WHERE state = 'failed'),
               count(*) FILTER (WHERE state = 'cancelled')
        FROM new_rows GROUP BY job_id ORDER BY job_id
        ON CONFLICT (job_id, shard) DO UPDATE SET
            pending = c.pending + EXCLUDED.pending, running = c.running + EXCLUDED.running,
            completed = c.completed + EXCLUDED.completed, failed = c.failed + EXCLUDED.failed,
            cancelled = c.cancelled + EXCLUDED.cancelled;
    ELSE
        -- The net change is the new rows' counts less the old rows' (an
        -- item never changes job): two linear scans, no join.
        INSERT INTO job_counts AS c (job_id, shard, pending, running, completed, failed, cancelled)
        SELECT job_id, pg_backend_pid() % 16, sum(pending), sum(running), sum(completed), sum(failed), sum(cancelled)
        FROM (
            SELECT job_id, (state = 'pending')::int AS pending, (state = 'running')::int AS running,
                   (state = 'completed')::int AS completed, (state = 'failed')::int AS failed,
                   (state = 'cancelled')::int AS cancelled
            FROM new_rows
            UNION ALL
            SELECT job_id, -(state = 'pending')::int, -(state = 'running')::int, -(state = 'completed')::int,
                   -(state = 'failed')::int, -(state = 'cancelled')::int
            FROM old_rows
        ) AS change
        GROUP BY job_id
        HAVING sum(pending) <> 0 OR sum(running) <> 0 OR sum(completed) <> 0 OR sum(failed) <> 0
            OR sum(cancelled) <> 0
        ORDER BY job_id
        ON CONFLICT (job_id, shard) DO UPDATE SET
            pending = c.pending + EXCLUDED.pending, running = c.running + EXCLUDED.running,
            completed = c.completed + EXCLUDED.completed, failed = c.failed + EXCLUDED.failed,
            cancelled = c.cancelled + EXCLUDED.cancelled;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER items_count_insert AFTER INSERT ON items
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION cortex_count_items();
CREATE TRIGGER items_count_update AFTER UPDATE ON items
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION cortex_count_items();

CREATE FUNCTION cortex_count_tokens() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO job_counts AS c (job_id, shard, prompt_tokens, completion_tokens)
    SELECT job_id, pg_backend_pid() % 16, sum(prompt_tokens), sum(completion_tokens)
    FROM new_rows GROUP BY job_id ORDER BY job_id
    ON CONFLICT (job_id, shard) DO UPDATE SET
        prompt_tokens = c.prompt_tokens + EXCLUDED.prompt_tokens,
        completion_tokens = c.completion_tokens + EXCLUDED.completion_tokens;
    RETURN NULL;
END $$;
CREATE TRIGGER results_tokens AFTER INSERT ON results
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION cortex_count_tokens();
