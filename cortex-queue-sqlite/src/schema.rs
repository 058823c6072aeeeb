//! The database schema and its migrations, versioned by `PRAGMA user_version`.
//!
//! A migration is applied in its own `BEGIN IMMEDIATE` transaction together
//! with the version bump, so two processes opening an old database at once
//! apply it exactly once. The SQL lives in `migrations/`; never edit a
//! released migration, append one.

/// Version 1: jobs, items, results, input errors; per-job counters kept by triggers.
const V1: &str = include_str!("../migrations/0001_jobs_items_results.sql");

/// Version 2: worker processes, so the leases of a worker that died on this
/// host are reclaimed at once instead of after their timeout.
const V2: &str = include_str!("../migrations/0002_workers.sql");

/// Version 3: suspect isolation (deaths per item, charged only when alone)
/// and model binding (the SHA-256 of the model a job needs).
const V3: &str = include_str!("../migrations/0003_suspects_models.sql");

/// Version 4: results as typed responses, rendered at export by the caller.
const V4: &str = include_str!("../migrations/0004_typed_results.sql");

/// Version 5: the item the last worker death was charged to, so that only
/// deaths in a row charge a lone suspect.
const V5: &str = include_str!("../migrations/0005_death_streak.sql");

/// Version 6: output grammars stored once, referred to by SHA-256.
const V6: &str = include_str!("../migrations/0006_grammars.sql");

/// Version 7: the project each job belongs to.
const V7: &str = include_str!("../migrations/0007_projects.sql");

/// Version 8: the worker each item last ran on, each result's latencies,
/// each worker's last heartbeat.
const V8: &str = include_str!("../migrations/0008_item_runs.sql");

/// Version 9: the tokens a running item has generated so far.
const V9: &str = include_str!("../migrations/0009_generated_tokens.sql");

/// Version 10: completion windows (when a job's ends, when it expired).
const V10: &str = include_str!("../migrations/0010_completion_windows.sql");

/// Version 11: webhooks (where a job's end is announced, the outbox of events).
const V11: &str = include_str!("../migrations/0011_webhooks.sql");

/// Version 12: where a job's results go when it ends (an outbox row, `export`).
const V12: &str = include_str!("../migrations/0012_job_outputs.sql");

/// Version 13: whether a worker whose outputs can vary with the batch has
/// claimed any of a job's lines.
const V13: &str = include_str!("../migrations/0013_outputs_may_vary.sql");

/// Migrations in order; `MIGRATIONS[i]` takes the schema from version `i` to `i + 1`.
pub(crate) const MIGRATIONS: [&str; 13] = [V1, V2, V3, V4, V5, V6, V7, V8, V9, V10, V11, V12, V13];

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;
