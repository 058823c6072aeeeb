//! Claiming items under leases in SQLite, reaping this host's dead
//! workers, and everything a worker writes back.

use std::collections::BTreeSet;
use std::sync::OnceLock;
use std::time::Duration;

use cortex_queue::driver::{
    DeathSpelling, WORKER_STOPPED, alone_level, claim_by_rule, compact_response, death_assignments,
    duration_ms, expand_work_with, host_identity, is_gone, this_process,
};
use cortex_queue::failpoint;
use cortex_queue::{
    ClaimOptions, ClaimedItem, FailOutcome, ItemFailure, ItemId, JobId, Lease, LeaseStatus,
    QueueError, Result, WorkerStore, now_ms,
};
use cortex_request::{Request, RequestId, Response, Work};
use rusqlite::{OptionalExtension, Transaction, params};

use crate::expiry::expire_due;
use crate::jobs::settle;
use crate::store::{Outcome, Store};

fn host() -> &'static str {
    static HOST: OnceLock<String> = OnceLock::new();
    HOST.get_or_init(host_identity)
}

/// Ends the in-flight items of workers on this host whose process is gone:
/// each such worker is one death.
fn reap_dead_workers(
    tx: &Transaction<'_>,
    me: i64,
    now: i64,
    lone_retry_ms: i64,
    touched: &mut BTreeSet<i64>,
) -> rusqlite::Result<()> {
    let workers: Vec<(i64, u32, i64)> = tx
        .prepare_cached("SELECT id, pid, started FROM workers WHERE host = ?1 AND id <> ?2")?
        .query_map(params![host(), me], |row| {
            Ok((row.get(0)?, row.get(1)?, row.get(2)?))
        })?
        .collect::<rusqlite::Result<_>>()?;
    for (worker, pid, started) in workers {
        if is_gone(pid, started as u64) {
            let death = Death::new(tx, now, WORKER_STOPPED, lone_retry_ms)?;
            let mut ended = Vec::new();
            record_deaths(
                tx,
                &death,
                "worker_id = ?4",
                &[&worker],
                touched,
                &mut ended,
            )?;
            // A worker that died with nothing in flight was killed from
            // outside: it breaks any streak too.
            set_death_streak(tx, &ended)?;
            tx.execute("DELETE FROM workers WHERE id = ?1", [worker])?;
        }
    }
    Ok(())
}

/// One worker death: when, why, what the death before it was (the streak's
/// item), and the lone suspects' retry delay in ms.
struct Death<'a> {
    now: i64,
    cause: &'a str,
    streak: Option<i64>,
    lone_retry_ms: i64,
}

impl<'a> Death<'a> {
    /// A death now, following whatever the last one was.
    fn new(
        tx: &Transaction<'_>,
        now: i64,
        cause: &'a str,
        lone_retry_ms: i64,
    ) -> rusqlite::Result<Self> {
        Ok(Self {
            now,
            cause,
            streak: death_streak(tx)?,
            lone_retry_ms,
        })
    }
}

/// The item whose lone run the last death was, if it was one.
fn death_streak(tx: &Transaction<'_>) -> rusqlite::Result<Option<i64>> {
    tx.prepare_cached("SELECT item FROM death_streak WHERE id = 1")?
        .query_row([], |row| row.get(0))
        .optional()
        .map(Option::flatten)
}

/// Records what the death that just ended `ended` (item, ran alone) was.
fn set_death_streak(tx: &Transaction<'_>, ended: &[(i64, bool)]) -> rusqlite::Result<()> {
    let item = match ended {
        [(item, true)] => Some(*item),
        _ => None,
    };
    tx.prepare_cached("UPDATE death_streak SET item = ?1 WHERE id = 1")?
        .execute([item])
        .map(drop)
}

/// What a worker death does to the items it had in flight (those matching
/// `which`, with `?1` bound to now, `?2` to the cause, `?3` to the streak's
/// item and `?4..` to `args`): the rule of `cortex_queue::driver::
/// death_assignments`, charged when the item ran alone and the death before
/// this one (`streak`) was also its own, alone. Each ended item is added to
/// `ended` with whether it ran alone.
fn record_deaths(
    tx: &Transaction<'_>,
    death: &Death<'_>,
    which: &str,
    args: &[&dyn rusqlite::ToSql],
    touched: &mut BTreeSet<i64>,
    ended: &mut Vec<(i64, bool)>,
) -> rusqlite::Result<()> {
    let lone_retry = death.lone_retry_ms.to_string();
    let assignments = death_assignments(&DeathSpelling {
        item: "",
        job_state: "(SELECT state FROM jobs WHERE jobs.id = items.job_id)",
        max_attempts: "(SELECT max_attempts FROM jobs WHERE jobs.id = items.job_id)",
        charged: "(alone = 1 AND id IS ?3)",
        alone: "alone = 1",
        cause: "?2",
        now: "?1",
        lone_retry: &lone_retry,
        smaller: "min",
    });
    let sql = format!(
        "UPDATE items SET {assignments}
         WHERE state = 'running' AND {which}
         RETURNING job_id, id, alone"
    );
    let mut bound: Vec<&dyn rusqlite::ToSql> = vec![&death.now, &death.cause, &death.streak];
    bound.extend_from_slice(args);
    let mut statement = tx.prepare_cached(&sql)?;
    let mut rows = statement.query(bound.as_slice())?;
    while let Some(row) = rows.next()? {
        touched.insert(row.get(0)?);
        // `alone` describes the claim that just ended (the next claim sets it).
        ended.push((row.get(1)?, row.get::<_, bool>(2)?));
    }
    Ok(())
}

/// Ends the leases that ran out (their worker died, hung or lost touch)
/// as one death.
fn expire_leases(
    tx: &Transaction<'_>,
    now: i64,
    lone_retry_ms: i64,
    touched: &mut BTreeSet<i64>,
) -> rusqlite::Result<()> {
    let death = Death::new(tx, now, WORKER_STOPPED, lone_retry_ms)?;
    let mut ended = Vec::new();
    record_deaths(
        tx,
        &death,
        "lease_expires_at <= ?1",
        &[],
        touched,
        &mut ended,
    )?;
    if ended.is_empty() {
        return Ok(());
    }
    set_death_streak(tx, &ended)
}

fn settle_all(tx: &Transaction<'_>, jobs: &BTreeSet<i64>, now: i64) -> rusqlite::Result<()> {
    jobs.iter().try_for_each(|&job| settle(tx, job, now))
}

impl Store {
    /// Registers this process as a worker (once), so that its leases can be
    /// reclaimed at once if it dies.
    fn ensure_worker(&mut self, model_sha256: Option<&str>) -> Result<i64> {
        if let Some(worker) = self.worker {
            return Ok(worker);
        }
        let (pid, started) = this_process();
        let worker = self.write(|tx| {
            tx.execute(
                "INSERT INTO workers (host, pid, started, registered_at, heartbeat_at, model_sha256) VALUES (?1, ?2, ?3, ?4, ?4, ?5)",
                params![host(), pid, started as i64, now_ms(), model_sha256],
            )?;
            Ok(tx.last_insert_rowid())
        })?;
        self.worker = Some(worker);
        Ok(worker)
    }
}

impl WorkerStore for Store {
    /// Removes this process's worker registration (its leases must have been
    /// completed, failed or released first; any left simply expire).
    fn unregister_worker(&mut self) -> Result<()> {
        if let Some(worker) = self.worker.take() {
            self.write(|tx| {
                tx.execute("DELETE FROM workers WHERE id = ?1", [worker])
                    .map(drop)
            })?;
        }
        Ok(())
    }

    /// Claims up to `n` items in one statement: items whose lease expired
    /// first, then pending items (highest job priority first, then input
    /// order). Each claim raises the item's attempt count and lease token.
    fn claim(&mut self, n: usize, options: &ClaimOptions) -> Result<Vec<ClaimedItem>> {
        let worker = self.ensure_worker(options.model_sha256.as_deref())?;
        let mut job_filter = String::new();
        if let Some(jobs) = &options.jobs {
            let ids: Vec<String> = jobs.iter().map(|j| j.0.to_string()).collect();
            job_filter = format!("AND job_id IN ({})", ids.join(","));
        }
        // ?5: the worker's model; jobs for another model are not its to run.
        let model_filter = "AND job_id IN (SELECT id FROM jobs WHERE ?5 IS NULL OR model_sha256 IS NULL OR model_sha256 = ?5)";
        let level_sql = format!(
            "SELECT deaths FROM items INDEXED BY items_suspects
             WHERE state = 'pending' AND deaths > 0 AND not_before <= ?1 {job_filter} {model_filter}
             ORDER BY deaths DESC LIMIT 1"
        );
        // Two orders, each walking its own partial index: normal items by job
        // priority and input order (`items_ready`; the few suspects among them
        // are skipped), suspects most suspected first (`items_suspects`). Items
        // deep enough to run alone (?7) take turns, longest waiting first: an
        // item whose lone run was hit by an outside kill goes to the back, so
        // kills that come at the same moment after each start do not keep
        // charging the same innocent item.
        let claim_sql = |candidates: &str| {
            format!(
                "UPDATE items SET state = 'running', attempts = attempts + 1, lease_token = lease_token + 1,
                                  lease_expires_at = ?3, worker_id = ?4, updated_at = ?1, alone = ?6, generated_tokens = 0,
                                  ran_by = (SELECT substr(host, 1, instr(host || '/', '/') - 1) || ' pid ' || pid
                                            FROM workers WHERE id = ?4)
                 WHERE id IN ({candidates})
                 RETURNING id, job_id, line, custom_id, endpoint, request, attempts, lease_token"
            )
        };
        let normal_sql = claim_sql(&format!(
            "SELECT id FROM items INDEXED BY items_ready
             WHERE state = 'pending' AND not_before <= ?1 AND deaths = 0 {job_filter} {model_filter}
             ORDER BY priority DESC, id LIMIT ?2"
        ));
        let suspects_sql = claim_sql(&format!(
            "SELECT id FROM items INDEXED BY items_suspects
             WHERE state = 'pending' AND deaths > 0 AND not_before <= ?1 {job_filter} {model_filter}
             ORDER BY min(deaths, ?7) DESC, updated_at, priority DESC, id LIMIT ?2"
        ));
        let lease_ms = duration_ms(options.lease);
        let lone_retry_ms = duration_ms(self.config.retry.lone_retry);
        let db_path = self.path.clone();
        let model = options.model_sha256.clone();
        let same_output = options.same_output;
        let mut claimed = self.write_checked(|tx| {
            let now = now_ms();
            let mut touched = BTreeSet::new();
            reap_dead_workers(tx, worker, now, lone_retry_ms, &mut touched)?;
            expire_leases(tx, now, lone_retry_ms, &mut touched)?;
            expire_due(tx, now)?;
            tx.prepare_cached("UPDATE workers SET heartbeat_at = ?2 WHERE id = ?1")?
                .execute(params![worker, now])?;
            let level: Option<i64> = if options.suspects {
                tx.prepare_cached(&level_sql)?
                    .query_row(params![now, 0, 0, 0, model], |row| row.get(0))
                    .optional()?
            } else {
                None
            };
            let expires = now + lease_ms;
            let level_bound = alone_level(n);
            let claim = |suspect: bool,
                         limit: usize|
             -> rusqlite::Result<Vec<(i64, String, ClaimedItem)>> {
                let alone = suspect && limit == 1;
                let limit = i64::try_from(limit).unwrap_or(i64::MAX);
                let mut bound: Vec<&dyn rusqlite::ToSql> =
                    vec![&now, &limit, &expires, &worker, &model, &alone];
                let sql = if suspect {
                    bound.push(&level_bound);
                    &suspects_sql
                } else {
                    &normal_sql
                };
                tx.prepare_cached(sql)?
                    .query_map(bound.as_slice(), |row| {
                        let item = row.get(0)?;
                        let claimed = ClaimedItem {
                            lease: Lease {
                                item: ItemId(item),
                                token: row.get(7)?,
                            },
                            job: JobId(row.get(1)?),
                            line: row.get::<_, i64>(2)? as u64,
                            custom_id: row.get(3)?,
                            endpoint: row.get(4)?,
                            request: Work::Generate(Request::new(RequestId(item as u64), "")),
                            attempt: row.get(6)?,
                            suspect,
                            alone,
                            lease_expires_at: expires,
                        };
                        Ok((item, row.get(5)?, claimed))
                    })?
                    .collect::<rusqlite::Result<_>>()
            };
            let rows = claim_by_rule(n, level, options, claim)?;
            failpoint::hit("claim", "");
            let mut claimed = Vec::with_capacity(rows.len());
            for (item, request, mut item_claimed) in rows {
                touched.insert(item_claimed.job.0);
                let grammar = |sha: &str| {
                    tx.prepare_cached("SELECT text FROM grammars WHERE sha256 = ?1")
                        .and_then(|mut s| s.query_row([sha], |row| row.get(0)).optional())
                        .ok()
                        .flatten()
                };
                item_claimed.request =
                    expand_work_with(&request, grammar).map_err(|e| QueueError::Database {
                        path: db_path.clone(),
                        detail: format!("item {item}: stored request is unreadable: {e}"),
                    })?;
                item_claimed.request.set_id(RequestId(item as u64));
                claimed.push(item_claimed);
            }
            if !same_output {
                let jobs: BTreeSet<i64> = claimed.iter().map(|c| c.job.0).collect();
                for job in jobs {
                    tx.prepare_cached(
                        "UPDATE jobs SET outputs_may_vary = 1 WHERE id = ?1 AND outputs_may_vary = 0",
                    )?
                    .execute([job])?;
                }
            }
            settle_all(tx, &touched, now)?;
            Ok(claimed)
        })?;
        claimed.sort_by_key(|c| c.lease.item);
        Ok(claimed)
    }

    /// Ends the attempts of items whose engine died under them, as a worker
    /// death would (see [`ClaimOptions::suspects`]), recording `cause` (the
    /// engine's error) as their last error. Returns how many leases were held.
    fn abandon(&mut self, leases: &[Lease], cause: &str) -> Result<usize> {
        let lone_retry_ms = duration_ms(self.config.retry.lone_retry);
        self.write(|tx| {
            let now = now_ms();
            let mut touched = BTreeSet::new();
            // One death, whatever it had in flight.
            let death = Death::new(tx, now, cause, lone_retry_ms)?;
            let mut ended = Vec::new();
            for lease in leases {
                record_deaths(
                    tx,
                    &death,
                    "id = ?4 AND lease_token = ?5",
                    &[&lease.item.0, &lease.token],
                    &mut touched,
                    &mut ended,
                )?;
            }
            set_death_streak(tx, &ended)?;
            settle_all(tx, &touched, now)?;
            Ok(ended.len())
        })
    }

    /// Extends each lease by `lease` if it is still held; reports leases lost
    /// to another worker and items whose job was cancelled (which end now).
    fn heartbeat(&mut self, leases: &[Lease], lease: Duration) -> Result<Vec<LeaseStatus>> {
        let lease_ms = duration_ms(lease);
        let worker = self.worker;
        self.write(|tx| {
            let now = now_ms();
            // Items of a job whose window ended lose their leases here.
            expire_due(tx, now)?;
            let mut touched = BTreeSet::new();
            if let Some(worker) = worker {
                tx.prepare_cached("UPDATE workers SET heartbeat_at = ?2 WHERE id = ?1")?
                    .execute(params![worker, now])?;
            }
            let mut extend = tx.prepare_cached(
                "UPDATE items SET lease_expires_at = ?3
                 WHERE id = ?1 AND lease_token = ?2 AND state = 'running'
                 RETURNING job_id, (SELECT state FROM jobs WHERE jobs.id = items.job_id)",
            )?;
            let mut statuses = Vec::with_capacity(leases.len());
            for held in leases {
                let row: Option<(i64, String)> = extend
                    .query_row(params![held.item.0, held.token, now + lease_ms], |row| Ok((row.get(0)?, row.get(1)?)))
                    .optional()?;
                statuses.push(match row {
                    None => LeaseStatus::Lost,
                    Some((job, state)) if state == "cancelling" => {
                        tx.execute(
                            "UPDATE items SET state = 'cancelled', worker_id = NULL, lease_expires_at = NULL, updated_at = ?2
                             WHERE id = ?1",
                            params![held.item.0, now],
                        )?;
                        touched.insert(job);
                        LeaseStatus::Cancelled
                    }
                    Some(_) => LeaseStatus::Held { expires_at: now + lease_ms },
                });
            }
            settle_all(tx, &touched, now)?;
            Ok(statuses)
        })
    }

    fn progress(&mut self, generated: &[(Lease, u64)]) -> Result<Vec<Lease>> {
        if generated.is_empty() {
            return Ok(Vec::new());
        }
        self.write(|tx| {
            expire_due(tx, now_ms())?;
            let mut record = tx.prepare_cached(
                "UPDATE items SET generated_tokens = ?3
                 WHERE id = ?1 AND lease_token = ?2 AND state = 'running'",
            )?;
            let mut gone = Vec::new();
            for (held, tokens) in generated {
                let tokens = i64::try_from(*tokens).unwrap_or(i64::MAX);
                if record.execute(params![held.item.0, held.token, tokens])? == 0 {
                    gone.push(*held);
                }
            }
            Ok(gone)
        })
    }

    /// Records several results in one transaction (one disk sync); each entry
    /// is `Err(LeaseLost)` on its own when its lease is no longer held.
    fn complete_many(&mut self, done: &[(Lease, &Response)]) -> Result<Vec<Result<()>>> {
        let outcomes = self.write(|tx| {
            let now = now_ms();
            let mut touched = BTreeSet::new();
            let mut finish = tx.prepare_cached(
                "UPDATE items SET state = 'completed', worker_id = NULL, lease_expires_at = NULL,
                                  error_code = NULL, error_message = NULL, updated_at = ?3
                 WHERE id = ?1 AND lease_token = ?2 AND state = 'running'
                 RETURNING job_id, attempts",
            )?;
            let mut insert = tx.prepare_cached(
                "INSERT INTO results (item_id, job_id, attempt, body, response, prompt_tokens, completion_tokens, completed_at,
                                      first_token_ms, duration_ms)
                 VALUES (?1, ?2, ?3, '', ?4, ?5, ?6, ?7, ?8, ?9)",
            )?;
            let mut outcomes = Vec::with_capacity(done.len());
            for (lease, response) in done {
                let row: Option<(i64, i64)> = finish
                    .query_row(params![lease.item.0, lease.token, now], |row| Ok((row.get(0)?, row.get(1)?)))
                    .optional()?;
                let Some((job, attempt)) = row else {
                    outcomes.push(Err(QueueError::LeaseLost { item: lease.item, token: lease.token }));
                    continue;
                };
                insert.execute(params![
                    lease.item.0,
                    job,
                    attempt,
                    compact_response(response),
                    response.usage.prompt_tokens,
                    response.usage.completion_tokens,
                    now,
                    response.timings.first_token.map(duration_ms),
                    duration_ms(response.timings.finished)
                ])?;
                touched.insert(job);
                outcomes.push(Ok(()));
            }
            failpoint::hit("complete:written", "");
            settle_all(tx, &touched, now)?;
            Ok(outcomes)
        })?;
        failpoint::hit("complete:committed", "");
        Ok(outcomes)
    }

    /// Records a failed attempt, if `lease` is still held: a retryable failure
    /// goes back to pending with exponential backoff until the job's
    /// `max_attempts`; anything else fails the item now. The error is kept.
    fn fail(&mut self, lease: &Lease, failure: &ItemFailure) -> Result<FailOutcome> {
        let (base, cap) = (
            duration_ms(self.config.retry.retry_backoff),
            duration_ms(self.config.retry.max_retry_backoff),
        );
        self.write_checked(|tx| {
            let now = now_ms();
            let row: Option<(i64, u32, u32)> = tx
                .query_row(
                    "SELECT i.job_id, i.attempts, j.max_attempts FROM items i JOIN jobs j ON j.id = i.job_id
                     WHERE i.id = ?1 AND i.lease_token = ?2 AND i.state = 'running'",
                    params![lease.item.0, lease.token],
                    |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
                )
                .optional()?;
            let Some((job, attempts, max_attempts)) = row else {
                return Err(Outcome::Queue(QueueError::LeaseLost { item: lease.item, token: lease.token }));
            };
            let outcome = FailOutcome::of(failure, attempts, max_attempts, now, (base, cap));
            let (state, not_before) = outcome.item_state();
            tx.execute(
                "UPDATE items SET state = ?2, not_before = ?3, error_code = ?4, error_message = ?5,
                                  worker_id = NULL, lease_expires_at = NULL, updated_at = ?6
                 WHERE id = ?1",
                params![lease.item.0, state, not_before, failure.code, failure.message, now],
            )?;
            settle(tx, job, now)?;
            Ok(outcome)
        })
    }

    /// Gives items back without using up an attempt (a worker shutting down):
    /// they are pending again at once (cancelled if their job is cancelling).
    /// Returns how many leases were still held.
    fn release(&mut self, leases: &[Lease]) -> Result<usize> {
        self.write(|tx| {
            let now = now_ms();
            let mut touched = BTreeSet::new();
            let mut give_back = tx.prepare_cached(
                "UPDATE items SET
                    state = CASE (SELECT state FROM jobs WHERE jobs.id = items.job_id)
                            WHEN 'cancelling' THEN 'cancelled' ELSE 'pending' END,
                    attempts = max(attempts - 1, 0), not_before = 0,
                    worker_id = NULL, lease_expires_at = NULL, updated_at = ?3
                 WHERE id = ?1 AND lease_token = ?2 AND state = 'running'
                 RETURNING job_id",
            )?;
            let mut released = 0;
            for lease in leases {
                if let Some(job) = give_back
                    .query_row(params![lease.item.0, lease.token, now], |row| row.get(0))
                    .optional()?
                {
                    touched.insert(job);
                    released += 1;
                }
            }
            settle_all(tx, &touched, now)?;
            Ok(released)
        })
    }
}
