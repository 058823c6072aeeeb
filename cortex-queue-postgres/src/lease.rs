//! Claims under leases, and everything a worker writes back, on PostgreSQL.
//! The rules are the SQLite store's (see `cortex_queue::ClaimOptions` on
//! suspects and lone runs); the statements are written for many claimers.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant};

use cortex_queue::backend::{
    WORKER_STOPPED, alone_level, compact_response, duration_ms, expand_work_with, host_identity,
    is_gone, retry_delay_ms, suspect_group, this_process,
};
use cortex_queue::{
    ClaimOptions, ClaimedItem, FailOutcome, ItemFailure, ItemId, JobId, Lease, LeaseStatus,
    QueueError, Result, WorkerStore,
};
use cortex_request::{Request, RequestId, Response, Work};

use crate::{Failure, Params, PgStore, Tx};

/// How often a worker looks for dead workers of its own host (by pid).
const REAP_EVERY: Duration = Duration::from_secs(2);

/// Registrations without a heartbeat for this long, and with nothing in
/// flight, are removed (their worker is gone; its leases expired already).
const FORGET_WORKER_MS: i64 = 10 * 60 * 1000;

/// One worker death: when, why, and the item of the death before it.
struct Death<'a> {
    now: i64,
    cause: &'a str,
    streak: Option<i64>,
    lone_retry_ms: i64,
}

impl<'a> Death<'a> {
    fn new(tx: &mut Tx<'_>, now: i64, cause: &'a str, lone_retry_ms: i64) -> Result<Self, Failure> {
        let streak = tx
            .query_opt("SELECT item FROM death_streak WHERE id = 1", &[])?
            .and_then(|row| row.get(0));
        Ok(Self {
            now,
            cause,
            streak,
            lone_retry_ms,
        })
    }
}

/// Records what the death that just ended `ended` (item, ran alone) was.
fn set_death_streak(tx: &mut Tx<'_>, ended: &[(i64, bool)]) -> Result<(), Failure> {
    let item = match ended {
        [(item, true)] => Some(*item),
        _ => None,
    };
    tx.execute("UPDATE death_streak SET item = $1 WHERE id = 1", &[&item])
        .map(drop)
}

/// What a worker death does to the items it had in flight (those matching
/// `which`, whose parameters start at `$5`): the SQLite store's rule, in one
/// statement. Adds each ended item to `ended` with whether it ran alone.
fn record_deaths(
    tx: &mut Tx<'_>,
    death: &Death<'_>,
    which: &str,
    args: &Params<'_>,
    touched: &mut BTreeSet<i64>,
    ended: &mut Vec<(i64, bool)>,
) -> Result<(), Failure> {
    let charged = "(i.alone AND i.id IS NOT DISTINCT FROM $3::bigint)";
    let sql = format!(
        "UPDATE items i SET
            state = CASE
                WHEN j.state = 'cancelling' THEN 'cancelled'
                WHEN {charged} AND i.attempts >= j.max_attempts THEN 'failed'
                ELSE 'pending' END,
            attempts = i.attempts - (CASE WHEN {charged} THEN 0 ELSE 1 END),
            deaths = i.deaths + 1,
            error_code = 'worker_lost',
            error_message = CASE
                WHEN {charged}
                THEN $2::text || ', with this item alone in it, as at the death before (' || i.attempts || ' of ' ||
                     j.max_attempts || ' attempts; ' || (i.deaths + 1) || ' deaths in all)'
                WHEN i.alone
                THEN $2::text || ' (not counted as an attempt: it ran alone, but the death before was not its own; ' ||
                     (i.deaths + 1) || ' deaths so far)'
                ELSE $2::text || ' (not counted as an attempt: other items were in flight; ' ||
                     (i.deaths + 1) || ' deaths so far)' END,
            not_before = CASE WHEN i.alone
                THEN $1::bigint + ($4::bigint << least(i.attempts - (CASE WHEN {charged} THEN 0 ELSE 1 END), 5))
                ELSE 0 END,
            worker_id = NULL, lease_expires_at = NULL, updated_at = $1::bigint
         FROM jobs j
         WHERE j.id = i.job_id AND i.state = 'running' AND {which}
         RETURNING i.job_id, i.id, i.alone"
    );
    let mut bound: Vec<&(dyn postgres::types::ToSql + Sync)> = vec![
        &death.now,
        &death.cause,
        &death.streak,
        &death.lone_retry_ms,
    ];
    bound.extend_from_slice(args);
    for row in tx.query(&sql, &bound)? {
        touched.insert(row.get(0));
        ended.push((row.get(1), row.get(2)));
    }
    if !ended.is_empty() {
        tx.notify_work()?;
    }
    Ok(())
}

/// Ends the leases that ran out as one death. Rows another claimer is
/// sweeping right now are skipped, not waited for.
fn expire_leases(
    tx: &mut Tx<'_>,
    now: i64,
    lone_retry_ms: i64,
    touched: &mut BTreeSet<i64>,
) -> Result<(), Failure> {
    let expired = tx.query(
        "SELECT id FROM items WHERE state = 'running' AND lease_expires_at <= $1
         FOR UPDATE SKIP LOCKED",
        &[&now],
    )?;
    if expired.is_empty() {
        return Ok(());
    }
    let ids: Vec<i64> = expired.iter().map(|row| row.get(0)).collect();
    let death = Death::new(tx, now, WORKER_STOPPED, lone_retry_ms)?;
    let mut ended = Vec::new();
    record_deaths(
        tx,
        &death,
        "i.id = ANY($5::bigint[])",
        &[&ids],
        touched,
        &mut ended,
    )?;
    set_death_streak(tx, &ended)
}

impl PgStore {
    /// Registers this process as a worker (once), with its host identity.
    fn ensure_worker(&mut self, model_sha256: Option<&str>) -> Result<i64> {
        if let Some(worker) = self.worker {
            return Ok(worker);
        }
        let (pid, started) = this_process();
        let (pid, started) = (i32::try_from(pid).unwrap_or(i32::MAX), started as i64);
        let host = host_identity();
        let worker = self.run(|tx| {
            Ok(tx
                .query_one(
                    "INSERT INTO workers (host, pid, started, registered_at, heartbeat_at, model_sha256)
                     VALUES ($1, $2, $3, cortex_now(), cortex_now(), $4) RETURNING id",
                    &[&host, &pid, &started, &model_sha256],
                )?
                .get(0))
        })?;
        self.worker = Some(worker);
        Ok(worker)
    }

    /// Workers registered on this host whose process is gone (checked at most
    /// every [`REAP_EVERY`]); workers on other hosts are found by their leases.
    fn dead_workers_here(&mut self, me: i64) -> Result<Vec<i64>> {
        if self.last_reap.is_some_and(|t| t.elapsed() < REAP_EVERY) {
            return Ok(Vec::new());
        }
        self.last_reap = Some(Instant::now());
        let host = host_identity();
        let workers = self.run(|tx| {
            Ok(tx
                .query(
                    "SELECT id, pid, started FROM workers WHERE host = $1 AND id <> $2",
                    &[&host, &me],
                )?
                .iter()
                .map(|row| {
                    (
                        row.get::<_, i64>(0),
                        row.get::<_, i32>(1),
                        row.get::<_, i64>(2),
                    )
                })
                .collect::<Vec<_>>())
        })?;
        Ok(workers
            .into_iter()
            .filter(|&(_, pid, started)| is_gone(pid as u32, started as u64))
            .map(|(id, _, _)| id)
            .collect())
    }

    /// Moves `jobs` to the states their counts imply (after a write committed).
    pub(crate) fn settle_after(&mut self, jobs: &BTreeSet<i64>) -> Result<()> {
        for &job in jobs {
            self.settle(JobId(job))?;
        }
        Ok(())
    }
}

/// Parallel arrays of lease ids and tokens, for `unnest`.
fn lease_arrays(leases: &[Lease]) -> (Vec<i64>, Vec<i64>) {
    leases.iter().map(|l| (l.item.0, l.token)).unzip()
}

impl WorkerStore for PgStore {
    fn claim(&mut self, n: usize, options: &ClaimOptions) -> Result<Vec<ClaimedItem>> {
        let worker = self.ensure_worker(options.model_sha256.as_deref())?;
        let dead = self.dead_workers_here(worker)?;
        let jobs: Option<Vec<i64>> = options
            .jobs
            .as_ref()
            .map(|jobs| jobs.iter().map(|j| j.0).collect());
        // The jobs in scope: those this worker's model may run (computed once
        // per statement), and the ones asked for.
        let filters = |model: usize, jobs: usize| {
            format!(
                "AND job_id = ANY(ARRAY(SELECT id FROM jobs WHERE state IN ('in_progress', 'finalizing')
                   AND (${model}::text IS NULL OR model_sha256 IS NULL OR model_sha256 = ${model}::text)))
                 AND (${jobs}::bigint[] IS NULL OR job_id = ANY(${jobs}::bigint[]))"
            )
        };
        let level_sql = format!(
            "SELECT deaths::bigint FROM items
             WHERE state = 'pending' AND deaths > 0 AND not_before <= $1 {}
             ORDER BY deaths DESC LIMIT 1",
            filters(2, 3)
        );
        // `$1` now, `$2` how many, `$3` lease expiry, `$4` worker, `$5` model,
        // `$6` alone, `$7` jobs, `$8` the level from which suspects run alone.
        let claim_sql = |candidates: &str| {
            format!(
                "UPDATE items SET state = 'running', attempts = attempts + 1, lease_token = lease_token + 1,
                                  lease_expires_at = $3, worker_id = $4, updated_at = $1, alone = $6
                 WHERE id IN ({candidates})
                 RETURNING id, job_id, line, custom_id, endpoint, request, attempts, lease_token"
            )
        };
        let normal_sql = claim_sql(&format!(
            "SELECT id FROM items
             WHERE state = 'pending' AND deaths = 0 AND not_before <= $1 {}
             ORDER BY priority DESC, id LIMIT $2 FOR UPDATE SKIP LOCKED",
            filters(5, 7)
        ));
        let suspects_sql = claim_sql(&format!(
            "SELECT id FROM items
             WHERE state = 'pending' AND deaths > 0 AND not_before <= $1 {}
             ORDER BY least(deaths, $8::bigint) DESC, updated_at, priority DESC, id LIMIT $2 FOR UPDATE SKIP LOCKED",
            filters(5, 7)
        ));
        let lease_ms = duration_ms(options.lease);
        let lone_retry_ms = duration_ms(self.config.lone_retry);
        let place = self.shown.clone();
        let model = options.model_sha256.clone();
        let (mut claimed, touched) = self.run(|tx| {
            let now = tx.now()?;
            let mut touched = BTreeSet::new();
            for dead in &dead {
                let death = Death::new(tx, now, WORKER_STOPPED, lone_retry_ms)?;
                let mut ended = Vec::new();
                record_deaths(
                    tx,
                    &death,
                    "i.worker_id = $5",
                    &[dead],
                    &mut touched,
                    &mut ended,
                )?;
                // A worker that died with nothing in flight was killed from outside: it breaks any streak too.
                set_death_streak(tx, &ended)?;
                tx.execute("DELETE FROM workers WHERE id = $1", &[dead])?;
            }
            expire_leases(tx, now, lone_retry_ms, &mut touched)?;
            tx.execute(
                "UPDATE workers SET heartbeat_at = $2 WHERE id = $1",
                &[&worker, &now],
            )?;
            let level: Option<i64> = if options.suspects {
                tx.query_opt(&level_sql, &[&now, &model, &jobs])?
                    .map(|row| row.get(0))
            } else {
                None
            };
            let expires = now + lease_ms;
            let level_bound = alone_level(n);
            let mut claim =
                |suspect: bool, limit: usize| -> Result<Vec<(String, ClaimedItem)>, Failure> {
                    let alone = suspect && limit == 1;
                    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
                    let mut bound: Vec<&(dyn postgres::types::ToSql + Sync)> =
                        vec![&now, &limit, &expires, &worker, &model, &alone, &jobs];
                    let sql = if suspect {
                        bound.push(&level_bound);
                        &suspects_sql
                    } else {
                        &normal_sql
                    };
                    Ok(tx
                        .query(sql, &bound)?
                        .iter()
                        .map(|row| {
                            let item: i64 = row.get(0);
                            let claimed = ClaimedItem {
                                lease: Lease {
                                    item: ItemId(item),
                                    token: row.get(7),
                                },
                                job: JobId(row.get(1)),
                                line: row.get::<_, i64>(2) as u64,
                                custom_id: row.get(3),
                                endpoint: row.get(4),
                                request: Work::Generate(Request::new(RequestId(item as u64), "")),
                                attempt: row.get::<_, i32>(6) as u32,
                                suspect,
                                alone,
                                lease_expires_at: expires,
                            };
                            (row.get(5), claimed)
                        })
                        .collect())
                };
            let rows = match level {
                Some(level) if suspect_group(n, level) == 1 && !options.alone => {
                    let normal = claim(false, n)?;
                    if normal.is_empty() {
                        claim(true, 1)?
                    } else {
                        normal
                    }
                }
                Some(level) => claim(true, suspect_group(n, level))?,
                None => claim(false, n)?,
            };
            let mut grammars: HashMap<String, Option<String>> = HashMap::new();
            let mut claimed = Vec::with_capacity(rows.len());
            for (request, mut item) in rows {
                touched.insert(item.job.0);
                let mut lookup_failed = None;
                let work = expand_work_with(&request, |sha: &str| {
                    if let Some(text) = grammars.get(sha) {
                        return text.clone();
                    }
                    let text = match tx
                        .query_opt("SELECT text FROM grammars WHERE sha256 = $1", &[&sha])
                    {
                        Ok(row) => row.map(|row| row.get::<_, String>(0)),
                        Err(e) => {
                            lookup_failed = Some(e);
                            None
                        }
                    };
                    grammars.insert(sha.to_owned(), text.clone());
                    text
                });
                if let Some(e) = lookup_failed {
                    return Err(e);
                }
                item.request = work.map_err(|e| QueueError::Database {
                    path: place.clone().into(),
                    detail: format!(
                        "item {}: stored request is unreadable: {e}",
                        item.lease.item
                    ),
                })?;
                item.request.set_id(RequestId(item.lease.item.0 as u64));
                claimed.push(item);
            }
            Ok((claimed, touched))
        })?;
        self.settle_after(&touched)?;
        claimed.sort_by_key(|c| c.lease.item);
        Ok(claimed)
    }

    fn heartbeat(&mut self, leases: &[Lease], lease: Duration) -> Result<Vec<LeaseStatus>> {
        let lease_ms = duration_ms(lease);
        let (ids, tokens) = lease_arrays(leases);
        let worker = self.worker;
        let (statuses, touched) = self.run(|tx| {
            let now = tx.now()?;
            let expires = now + lease_ms;
            let held = tx.query(
                "WITH held AS (
                     UPDATE items i SET lease_expires_at = $3
                     FROM unnest($1::bigint[], $2::bigint[]) AS l(id, token)
                     WHERE i.id = l.id AND i.lease_token = l.token AND i.state = 'running'
                     RETURNING i.id, i.job_id)
                 SELECT held.id, held.job_id, j.state = 'cancelling' FROM held JOIN jobs j ON j.id = held.job_id",
                &[&ids, &tokens, &expires],
            )?;
            let mut touched = BTreeSet::new();
            let mut cancelled = Vec::new();
            let mut alive = HashSet::new();
            for row in &held {
                let (item, job, cancelling): (i64, i64, bool) = (row.get(0), row.get(1), row.get(2));
                if cancelling {
                    cancelled.push(item);
                    touched.insert(job);
                } else {
                    alive.insert(item);
                }
            }
            if !cancelled.is_empty() {
                tx.execute(
                    "UPDATE items SET state = 'cancelled', worker_id = NULL, lease_expires_at = NULL, updated_at = $2
                     WHERE id = ANY($1::bigint[])",
                    &[&cancelled, &now],
                )?;
            }
            if let Some(worker) = worker {
                tx.execute("UPDATE workers SET heartbeat_at = $2 WHERE id = $1", &[&worker, &now])?;
            }
            let statuses = leases
                .iter()
                .map(|l| {
                    if alive.contains(&l.item.0) {
                        LeaseStatus::Held { expires_at: expires }
                    } else if cancelled.contains(&l.item.0) {
                        LeaseStatus::Cancelled
                    } else {
                        LeaseStatus::Lost
                    }
                })
                .collect::<Vec<_>>();
            Ok((statuses, touched))
        })?;
        self.settle_after(&touched)?;
        Ok(statuses)
    }

    fn complete_many(&mut self, done: &[(Lease, &Response)]) -> Result<Vec<Result<()>>> {
        let ids: Vec<i64> = done.iter().map(|(l, _)| l.item.0).collect();
        let tokens: Vec<i64> = done.iter().map(|(l, _)| l.token).collect();
        let bodies: Vec<String> = done.iter().map(|(_, r)| compact_response(r)).collect();
        let prompt: Vec<i64> = done
            .iter()
            .map(|(_, r)| r.usage.prompt_tokens as i64)
            .collect();
        let completion: Vec<i64> = done
            .iter()
            .map(|(_, r)| r.usage.completion_tokens as i64)
            .collect();
        let (written, touched) = self.run(|tx| {
            let rows = tx.query(
                "WITH done AS (
                     UPDATE items i SET state = 'completed', worker_id = NULL, lease_expires_at = NULL,
                                        error_code = NULL, error_message = NULL, updated_at = cortex_now()
                     FROM unnest($1::bigint[], $2::bigint[]) AS l(id, token)
                     WHERE i.id = l.id AND i.lease_token = l.token AND i.state = 'running'
                     RETURNING i.id, i.job_id, i.attempts)
                 INSERT INTO results (item_id, job_id, attempt, response, prompt_tokens, completion_tokens, completed_at)
                 SELECT done.id, done.job_id, done.attempts, r.response, r.prompt, r.completion, cortex_now()
                 FROM done JOIN unnest($1::bigint[], $3::text[], $4::bigint[], $5::bigint[])
                                AS r(id, response, prompt, completion) ON r.id = done.id
                 RETURNING item_id, job_id",
                &[&ids, &tokens, &bodies, &prompt, &completion],
            )?;
            let written: HashSet<i64> = rows.iter().map(|row| row.get(0)).collect();
            let touched: BTreeSet<i64> = rows.iter().map(|row| row.get(1)).collect();
            Ok((written, touched))
        })?;
        self.settle_after(&touched)?;
        Ok(done
            .iter()
            .map(|(lease, _)| {
                if written.contains(&lease.item.0) {
                    Ok(())
                } else {
                    Err(QueueError::LeaseLost {
                        item: lease.item,
                        token: lease.token,
                    })
                }
            })
            .collect())
    }

    fn fail(&mut self, lease: &Lease, failure: &ItemFailure) -> Result<FailOutcome> {
        let (base, cap) = (
            duration_ms(self.config.retry_backoff),
            duration_ms(self.config.max_retry_backoff),
        );
        let (outcome, job) = self.run(|tx| {
            let row = tx.query_opt(
                "SELECT i.job_id, i.attempts, j.max_attempts, cortex_now() FROM items i JOIN jobs j ON j.id = i.job_id
                 WHERE i.id = $1 AND i.lease_token = $2 AND i.state = 'running' FOR UPDATE OF i",
                &[&lease.item.0, &lease.token],
            )?;
            let Some(row) = row else {
                return Err(Failure::Queue(QueueError::LeaseLost { item: lease.item, token: lease.token }));
            };
            let (job, attempts, max_attempts, now): (i64, i32, i32, i64) =
                (row.get(0), row.get(1), row.get(2), row.get(3));
            let attempts = attempts.max(0) as u32;
            let outcome = if failure.retryable && attempts < max_attempts.max(0) as u32 {
                FailOutcome::Retrying { attempts, not_before: now + retry_delay_ms(base, cap, attempts) }
            } else {
                FailOutcome::Failed
            };
            let (state, not_before) = match outcome {
                FailOutcome::Retrying { not_before, .. } => ("pending", not_before),
                FailOutcome::Failed => ("failed", 0),
            };
            tx.execute(
                "UPDATE items SET state = $2, not_before = $3, error_code = $4, error_message = $5,
                                  worker_id = NULL, lease_expires_at = NULL, updated_at = $6
                 WHERE id = $1",
                &[&lease.item.0, &state, &not_before, &failure.code, &failure.message, &now],
            )?;
            if state == "pending" {
                tx.notify_work()?;
            }
            Ok((outcome, job))
        })?;
        self.settle_after(&BTreeSet::from([job]))?;
        Ok(outcome)
    }

    fn release(&mut self, leases: &[Lease]) -> Result<usize> {
        let (ids, tokens) = lease_arrays(leases);
        let touched = self.run(|tx| {
            let rows = tx.query(
                "UPDATE items i SET
                    state = CASE WHEN j.state = 'cancelling' THEN 'cancelled' ELSE 'pending' END,
                    attempts = greatest(i.attempts - 1, 0), not_before = 0,
                    worker_id = NULL, lease_expires_at = NULL, updated_at = cortex_now()
                 FROM unnest($1::bigint[], $2::bigint[]) AS l(id, token), jobs j
                 WHERE i.id = l.id AND i.lease_token = l.token AND i.state = 'running' AND j.id = i.job_id
                 RETURNING i.job_id",
                &[&ids, &tokens],
            )?;
            if !rows.is_empty() {
                tx.notify_work()?;
            }
            Ok(rows.iter().map(|row| row.get::<_, i64>(0)).collect::<Vec<_>>())
        })?;
        self.settle_after(&touched.iter().copied().collect())?;
        Ok(touched.len())
    }

    fn abandon(&mut self, leases: &[Lease], cause: &str) -> Result<usize> {
        let lone_retry_ms = duration_ms(self.config.lone_retry);
        let (ids, tokens) = lease_arrays(leases);
        let (count, touched) = self.run(|tx| {
            let now = tx.now()?;
            let mut touched = BTreeSet::new();
            let death = Death::new(tx, now, cause, lone_retry_ms)?;
            let mut ended = Vec::new();
            record_deaths(
                tx,
                &death,
                "(i.id, i.lease_token) IN (SELECT * FROM unnest($5::bigint[], $6::bigint[]))",
                &[&ids, &tokens],
                &mut touched,
                &mut ended,
            )?;
            set_death_streak(tx, &ended)?;
            Ok((ended.len(), touched))
        })?;
        self.settle_after(&touched)?;
        Ok(count)
    }

    fn unregister_worker(&mut self) -> Result<()> {
        if let Some(worker) = self.worker.take() {
            self.run(|tx| {
                tx.execute("DELETE FROM workers WHERE id = $1", &[&worker])?;
                // Housekeeping: registrations long silent with nothing in flight.
                tx.execute(
                    "DELETE FROM workers w WHERE heartbeat_at < cortex_now() - $1
                       AND NOT EXISTS (SELECT 1 FROM items WHERE worker_id = w.id AND state = 'running')",
                    &[&FORGET_WORKER_MS],
                )
                .map(drop)
            })?;
        }
        Ok(())
    }

    fn wait_for_work(&mut self, longest: Duration) -> Result<()> {
        self.wait_for_notification(longest)
    }
}
