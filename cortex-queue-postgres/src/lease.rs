//! Claims under leases, and everything a worker writes back, on PostgreSQL.
//! The rules are the SQLite store's (see `cortex_queue::ClaimOptions` on
//! suspects and lone runs); the statements are written for many claimers.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant};

use cortex_queue::driver::{
    DeathSpelling, WORKER_STOPPED, alone_level, claim_by_rule, compact_response, death_assignments,
    duration_ms, expand_work_with, host_identity, is_gone, this_process,
};
use cortex_queue::{
    ClaimOptions, ClaimedItem, FailOutcome, ItemFailure, ItemId, JobId, Lease, LeaseStatus,
    QueueError, Result, WorkerStore, failpoint,
};
use cortex_request::{Request, RequestId, Response, Work};

use crate::PgStore;
use crate::session::{Failure, Params, Tx};

/// How often a worker looks for dead workers of its own host (by pid).
const REAP_EVERY: Duration = Duration::from_secs(2);

/// How often a claiming worker refreshes its registration's heartbeat.
const WORKER_HEARTBEAT: Duration = Duration::from_secs(5);

/// Registrations without a heartbeat for this long, and with nothing in
/// flight, are removed (their worker is gone; its leases expired already).
const FORGET_WORKER_MS: i64 = 10 * 60 * 1000;

/// What a worker death does to the items it had in flight (those matching
/// `which`, whose parameters start at `$3`): the rule of `cortex_queue::
/// driver::death_assignments`, in one statement that also records what the death was for the next one (the
/// death streak: the item, when it ran alone and alone died). Returns the
/// ended items as (job, item, ran alone).
fn record_deaths(
    tx: &mut Tx<'_>,
    cause: &str,
    lone_retry_ms: i64,
    which: &str,
    args: &Params<'_>,
) -> Result<Vec<(i64, i64, bool)>, Failure> {
    let assignments = death_assignments(&DeathSpelling {
        item: "i.",
        job_state: "j.state",
        max_attempts: "j.max_attempts",
        charged: "(i.alone AND i.id IS NOT DISTINCT FROM (SELECT item FROM streak))",
        alone: "i.alone",
        cause: "$1::text",
        now: "cortex_now()",
        lone_retry: "$2::bigint",
        smaller: "least",
    });
    let sql = format!(
        "WITH streak AS (SELECT item FROM death_streak WHERE id = 1),
         ended AS (
         UPDATE items i SET {assignments}
         FROM jobs j
         WHERE j.id = i.job_id AND i.state = 'running' AND {which}
         RETURNING i.job_id, i.id, i.alone),
         next_streak AS (
             UPDATE death_streak SET item = (SELECT CASE WHEN count(*) = 1 AND bool_and(alone) THEN max(id) END FROM ended)
             WHERE id = 1 AND EXISTS (SELECT 1 FROM ended))
         SELECT job_id, id, alone FROM ended"
    );
    let mut bound: Vec<&(dyn postgres::types::ToSql + Sync)> = vec![&cause, &lone_retry_ms];
    bound.extend_from_slice(args);
    Ok(tx
        .query(&sql, &bound)?
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2)))
        .collect())
}

/// Ends the leases that ran out as one death. Rows another claimer is
/// sweeping right now are skipped, not waited for.
fn expire_leases(tx: &mut Tx<'_>, lone_retry_ms: i64) -> Result<Vec<(i64, i64, bool)>, Failure> {
    record_deaths(
        tx,
        WORKER_STOPPED,
        lone_retry_ms,
        "i.id IN (SELECT id FROM items WHERE state = 'running' AND lease_expires_at <= cortex_now()
                  FOR UPDATE SKIP LOCKED)",
        &[],
    )
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
    /// every [`REAP_EVERY`] unless `now`); workers on other hosts are found by
    /// their leases.
    fn dead_workers_here(&mut self, me: i64, now: bool) -> Result<Vec<i64>> {
        if !now && self.last_reap.is_some_and(|t| t.elapsed() < REAP_EVERY) {
            return Ok(Vec::new());
        }
        self.last_reap = Some(Instant::now());
        let host = host_identity();
        let workers = self.run_autocommit(|tx| {
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
        self.expire_due_jobs()?;
        let claimed = self.claim_after_reaping(n, options, false)?;
        if !claimed.is_empty() {
            return Ok(claimed);
        }
        // Nothing to claim: maybe because a worker of this host died since
        // the last look; its items come back at once, not when leases run out.
        self.claim_after_reaping(n, options, true)
    }

    fn heartbeat(&mut self, leases: &[Lease], lease: Duration) -> Result<Vec<LeaseStatus>> {
        // Items of a job whose window ended lose their leases here.
        self.expire_due_jobs()?;
        self.heartbeat_leases(leases, lease)
    }

    fn complete_many(&mut self, done: &[(Lease, &Response)]) -> Result<Vec<Result<()>>> {
        self.complete_leases(done)
    }

    fn progress(&mut self, generated: &[(Lease, u64)]) -> Result<Vec<Lease>> {
        if generated.is_empty() {
            return Ok(Vec::new());
        }
        self.expire_due_jobs()?;
        let (leases, tokens): (Vec<Lease>, Vec<i64>) = generated
            .iter()
            .map(|(l, t)| (*l, i64::try_from(*t).unwrap_or(i64::MAX)))
            .unzip();
        let (ids, lease_tokens) = lease_arrays(&leases);
        let held: HashSet<i64> = self.run_autocommit(|tx| {
            Ok(tx
                .query(
                    "UPDATE items i SET generated_tokens = l.generated
                     FROM unnest($1::bigint[], $2::bigint[], $3::bigint[]) AS l(id, token, generated)
                     WHERE i.id = l.id AND i.lease_token = l.token AND i.state = 'running'
                     RETURNING i.id",
                    &[&ids, &lease_tokens, &tokens],
                )?
                .iter()
                .map(|row| row.get(0))
                .collect())
        })?;
        Ok(leases
            .into_iter()
            .filter(|l| !held.contains(&l.item.0))
            .collect())
    }

    fn fail(&mut self, lease: &Lease, failure: &ItemFailure) -> Result<FailOutcome> {
        self.fail_lease(lease, failure)
    }

    fn release(&mut self, leases: &[Lease]) -> Result<usize> {
        self.release_leases(leases)
    }

    fn abandon(&mut self, leases: &[Lease], cause: &str) -> Result<usize> {
        self.abandon_leases(leases, cause)
    }

    fn unregister_worker(&mut self) -> Result<()> {
        self.unregister()
    }

    fn wait_for_work(&mut self, longest: Duration) -> Result<()> {
        self.wait_for_notification(longest)
    }
}

impl PgStore {
    /// One claim, after ending the leases of this host's dead workers (when
    /// it is time to look, or `reap_now`) and the leases that ran out.
    fn claim_after_reaping(
        &mut self,
        n: usize,
        options: &ClaimOptions,
        reap_now: bool,
    ) -> Result<Vec<ClaimedItem>> {
        let worker = self.ensure_worker(options.model_sha256.as_deref())?;
        let lone_retry_ms = duration_ms(self.config.retry.lone_retry);
        let mut touched = BTreeSet::new();
        let dead = self.dead_workers_here(worker, reap_now)?;
        if reap_now && dead.is_empty() {
            return Ok(Vec::new());
        }
        if !dead.is_empty() {
            self.run(|tx| {
                for dead in &dead {
                    let ended = record_deaths(
                        tx,
                        WORKER_STOPPED,
                        lone_retry_ms,
                        "i.worker_id = $3",
                        &[dead],
                    )?;
                    if ended.is_empty() {
                        // A worker that died with nothing in flight was killed
                        // from outside: it breaks any streak too.
                        tx.execute("UPDATE death_streak SET item = NULL WHERE id = 1", &[])?;
                    }
                    touched.extend(ended.iter().map(|e| e.0));
                    tx.execute("DELETE FROM workers WHERE id = $1", &[dead])?;
                }
                tx.notify_work()
            })?;
        }
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
             WHERE state = 'pending' AND deaths > 0 AND not_before <= cortex_now() {}
             ORDER BY deaths DESC LIMIT 1",
            filters(1, 2)
        );
        // `$1` how many, `$2` lease in ms, `$3` worker, `$4` model, `$5`
        // alone, `$6` jobs, `$7` the level from which suspects run alone.
        let claim_sql = |candidates: &str| {
            format!(
                "UPDATE items SET state = 'running', attempts = attempts + 1, lease_token = lease_token + 1,
                                  lease_expires_at = cortex_now() + $2, worker_id = $3, updated_at = cortex_now(),
                                  alone = $5, generated_tokens = 0,
                                  ran_by = (SELECT split_part(host, '/', 1) || ' pid ' || pid FROM workers WHERE id = $3)
                 WHERE id IN ({candidates})
                 RETURNING id, job_id, line, custom_id, endpoint, request, attempts, lease_token, lease_expires_at"
            )
        };
        let normal_sql = claim_sql(&format!(
            "SELECT id FROM items
             WHERE state = 'pending' AND deaths = 0 AND not_before <= cortex_now() {}
             ORDER BY priority DESC, id LIMIT $1 FOR UPDATE SKIP LOCKED",
            filters(4, 6)
        ));
        let suspects_sql = claim_sql(&format!(
            "SELECT id FROM items
             WHERE state = 'pending' AND deaths > 0 AND not_before <= cortex_now() {}
             ORDER BY least(deaths, $7::bigint) DESC, updated_at, priority DESC, id LIMIT $1 FOR UPDATE SKIP LOCKED",
            filters(4, 6)
        ));
        let lease_ms = duration_ms(options.lease);
        let place = self.shown.clone();
        let model = options.model_sha256.clone();
        let same_output = options.same_output;
        let beat = self
            .last_worker_heartbeat
            .is_none_or(|t| t.elapsed() >= WORKER_HEARTBEAT);
        // Statements that need not commit together: no transaction round trips.
        let mut claimed = self.run_autocommit(|tx| {
            for (job, _, _) in expire_leases(tx, lone_retry_ms)? {
                touched.insert(job);
            }
            if beat {
                tx.execute(
                    "UPDATE workers SET heartbeat_at = cortex_now() WHERE id = $1",
                    &[&worker],
                )?;
            }
            let level: Option<i64> = if options.suspects {
                tx.query_opt(&level_sql, &[&model, &jobs])?
                    .map(|row| row.get(0))
            } else {
                None
            };
            let level_bound = alone_level(n);
            let claim =
                |suspect: bool, limit: usize| -> Result<Vec<(String, ClaimedItem)>, Failure> {
                    let alone = suspect && limit == 1;
                    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
                    let mut bound: Vec<&(dyn postgres::types::ToSql + Sync)> =
                        vec![&limit, &lease_ms, &worker, &model, &alone, &jobs];
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
                                lease_expires_at: row.get(8),
                            };
                            (row.get(5), claimed)
                        })
                        .collect())
                };
            let rows = claim_by_rule(n, level, options, claim)?;
            failpoint::hit("claim", "");
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
            if !same_output && !claimed.is_empty() {
                let jobs: Vec<i64> = claimed.iter().map(|c| c.job.0).collect();
                tx.execute(
                    "UPDATE jobs SET outputs_may_vary = true WHERE id = ANY($1) AND NOT outputs_may_vary",
                    &[&jobs],
                )?;
            }
            Ok(claimed)
        })?;
        if beat {
            self.last_worker_heartbeat = Some(Instant::now());
        }
        self.settle_after(&touched)?;
        claimed.sort_by_key(|c| c.lease.item);
        Ok(claimed)
    }

    fn heartbeat_leases(&mut self, leases: &[Lease], lease: Duration) -> Result<Vec<LeaseStatus>> {
        let lease_ms = duration_ms(lease);
        let (ids, tokens) = lease_arrays(leases);
        let worker = self.worker;
        let (statuses, touched) = self.run_autocommit(|tx| {
            let held = tx.query(
                "WITH held AS (
                     UPDATE items i SET lease_expires_at = cortex_now() + $3
                     FROM unnest($1::bigint[], $2::bigint[]) AS l(id, token)
                     WHERE i.id = l.id AND i.lease_token = l.token AND i.state = 'running'
                     RETURNING i.id, i.job_id, i.lease_expires_at)
                 SELECT held.id, held.job_id, j.state = 'cancelling', held.lease_expires_at
                 FROM held JOIN jobs j ON j.id = held.job_id",
                &[&ids, &tokens, &lease_ms],
            )?;
            let mut touched = BTreeSet::new();
            let mut cancelled = Vec::new();
            let mut alive = HashMap::new();
            for row in &held {
                let (item, job, cancelling): (i64, i64, bool) = (row.get(0), row.get(1), row.get(2));
                if cancelling {
                    cancelled.push(item);
                    touched.insert(job);
                } else {
                    alive.insert(item, row.get::<_, i64>(3));
                }
            }
            if !cancelled.is_empty() {
                tx.execute(
                    "UPDATE items SET state = 'cancelled', worker_id = NULL, lease_expires_at = NULL,
                                      updated_at = cortex_now()
                     WHERE id = ANY($1::bigint[]) AND state = 'running'",
                    &[&cancelled],
                )?;
            }
            if let Some(worker) = worker {
                tx.execute("UPDATE workers SET heartbeat_at = cortex_now() WHERE id = $1", &[&worker])?;
            }
            let statuses = leases
                .iter()
                .map(|l| match alive.get(&l.item.0) {
                    Some(&expires_at) => LeaseStatus::Held { expires_at },
                    None if cancelled.contains(&l.item.0) => LeaseStatus::Cancelled,
                    None => LeaseStatus::Lost,
                })
                .collect::<Vec<_>>();
            Ok((statuses, touched))
        })?;
        self.settle_after(&touched)?;
        Ok(statuses)
    }

    fn complete_leases(&mut self, done: &[(Lease, &Response)]) -> Result<Vec<Result<()>>> {
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
        let first_token: Vec<Option<i64>> = done
            .iter()
            .map(|(_, r)| r.timings.first_token.map(duration_ms))
            .collect();
        let finished: Vec<i64> = done
            .iter()
            .map(|(_, r)| duration_ms(r.timings.finished))
            .collect();
        // One statement: the items end and their results are written together
        // (a crash before it ends writes nothing: `complete:written` is here).
        failpoint::hit("complete:written", "");
        let (written, touched) = self.run_autocommit(|tx| {
            let rows = tx.query(
                "WITH done AS (
                     UPDATE items i SET state = 'completed', worker_id = NULL, lease_expires_at = NULL,
                                        error_code = NULL, error_message = NULL, updated_at = cortex_now()
                     FROM unnest($1::bigint[], $2::bigint[]) AS l(id, token)
                     WHERE i.id = l.id AND i.lease_token = l.token AND i.state = 'running'
                     RETURNING i.id, i.job_id, i.attempts)
                 INSERT INTO results (item_id, job_id, attempt, response, prompt_tokens, completion_tokens, completed_at,
                                      first_token_ms, duration_ms)
                 SELECT done.id, done.job_id, done.attempts, r.response, r.prompt, r.completion, cortex_now(),
                        r.first_token, r.finished
                 FROM done JOIN unnest($1::bigint[], $3::text[], $4::bigint[], $5::bigint[], $6::bigint[], $7::bigint[])
                                AS r(id, response, prompt, completion, first_token, finished) ON r.id = done.id
                 RETURNING item_id, job_id",
                &[&ids, &tokens, &bodies, &prompt, &completion, &first_token, &finished],
            )?;
            let written: HashSet<i64> = rows.iter().map(|row| row.get(0)).collect();
            let touched: BTreeSet<i64> = rows.iter().map(|row| row.get(1)).collect();
            Ok((written, touched))
        })?;
        failpoint::hit("complete:committed", "");
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

    fn fail_lease(&mut self, lease: &Lease, failure: &ItemFailure) -> Result<FailOutcome> {
        let (base, cap) = (
            duration_ms(self.config.retry.retry_backoff),
            duration_ms(self.config.retry.max_retry_backoff),
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
            let outcome = FailOutcome::of(
                failure,
                attempts.max(0) as u32,
                max_attempts.max(0) as u32,
                now,
                (base, cap),
            );
            let (state, not_before) = outcome.item_state();
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

    fn release_leases(&mut self, leases: &[Lease]) -> Result<usize> {
        let (ids, tokens) = lease_arrays(leases);
        let touched = self.run_autocommit(|tx| {
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

    fn abandon_leases(&mut self, leases: &[Lease], cause: &str) -> Result<usize> {
        let lone_retry_ms = duration_ms(self.config.retry.lone_retry);
        let (ids, tokens) = lease_arrays(leases);
        // One statement: the death and the streak it leaves.
        let ended = self.run_autocommit(|tx| {
            record_deaths(
                tx,
                cause,
                lone_retry_ms,
                "(i.id, i.lease_token) IN (SELECT * FROM unnest($3::bigint[], $4::bigint[]))",
                &[&ids, &tokens],
            )
        })?;
        self.settle_after(&ended.iter().map(|e| e.0).collect())?;
        Ok(ended.len())
    }

    fn unregister(&mut self) -> Result<()> {
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
}
