//! Scenario traces of the scheduler, one line per step, as insta snapshots.
//! Each sampled token is `1000 + step`; requests finish at `max_new_tokens`.

use cortex_request::{CacheScope, RequestId};
use cortex_sched::{SchedConfig, SchedRequest, Scheduler};

fn request(id: u64, prompt: Vec<u32>, max_new_tokens: usize, priority: i32) -> SchedRequest {
    SchedRequest {
        id: RequestId(id),
        prompt,
        max_new_tokens,
        priority,
        cache_scope: CacheScope::SHARED,
    }
}

/// Distinct tokens per request, so nothing is shared by accident.
fn own_prompt(id: u64, len: u32) -> Vec<u32> {
    (0..len).map(|t| id as u32 * 1000 + t).collect()
}

/// Runs until idle (or `max_steps`), adding `arrivals` at their step; returns the trace.
fn trace(config: SchedConfig, mut arrivals: Vec<(u64, SchedRequest)>, max_steps: u64) -> String {
    let mut sched = Scheduler::new(config).unwrap();
    let mut out = String::new();
    for step in 1..=max_steps {
        arrivals.retain(|(at, r)| {
            if *at == step {
                sched.add(r.clone()).unwrap();
                false
            } else {
                true
            }
        });
        let plan = sched.schedule();
        let token = 1000 + step as u32;
        let mut sampled: Vec<_> = plan.decode.iter().map(|&id| (id, token)).collect();
        sampled.extend(
            plan.prefill
                .iter()
                .filter(|c| c.samples)
                .map(|c| (c.id, token)),
        );
        let finished = sched.commit(&plan, &sampled);
        out.push_str(&plan.to_string());
        if !finished.is_empty() {
            let ids: Vec<String> = finished.iter().map(|id| id.0.to_string()).collect();
            out.push_str(&format!(" => finished[{}]", ids.join(" ")));
        }
        let kv = sched.kv_stats();
        out.push_str(&format!(
            "  (kv {}/{} used, {} cached)\n",
            kv.used_blocks, kv.total_blocks, kv.cached_blocks
        ));
        if !sched.has_work() && arrivals.is_empty() {
            break;
        }
    }
    out
}

fn config() -> SchedConfig {
    SchedConfig {
        max_batch_tokens: 64,
        max_running: 8,
        max_prefill_chunk: 64,
        kv_blocks: 64,
        kv_block_size: 4,
        admission_headroom_blocks: 0,
        aging_steps: 8,
        prefix_window: 8,
        prefix_caching: true,
        priority_preemption_gap: None,
        admit_every: 1,
    }
}

#[test]
fn fifo_within_a_priority() {
    let config = SchedConfig {
        max_running: 2,
        ..config()
    };
    let arrivals = (1..=4)
        .map(|id| (1, request(id, own_prompt(id, 6), 2, 0)))
        .collect();
    insta::assert_snapshot!(trace(config, arrivals, 20));
}

#[test]
fn higher_priority_first_and_aging_prevents_starvation() {
    // One slot, each request holds it 3 steps, priority-2 requests arrive every
    // 2 steps: a backlog of them builds up. Low-priority 1 (arrived at step 1)
    // ranks like a priority-2 request arriving 2 * aging_steps = 16 steps later,
    // so it runs before those that arrive from step 17 on, not after all of them.
    let config = SchedConfig {
        max_running: 1,
        ..config()
    };
    let mut arrivals = vec![(1, request(1, own_prompt(1, 4), 1, 0))];
    for (i, step) in (2..18).zip((1..40).step_by(2)) {
        arrivals.push((step, request(i, own_prompt(i, 4), 3, 2)));
    }
    insta::assert_snapshot!(trace(config, arrivals, 60));
}

#[test]
fn token_budget_and_chunked_prefill() {
    // A 40-token prompt is chunked around two decoding requests within a 16-token budget.
    let config = SchedConfig {
        max_batch_tokens: 16,
        max_prefill_chunk: 12,
        ..config()
    };
    let arrivals = vec![
        (1, request(1, own_prompt(1, 3), 6, 0)),
        (1, request(2, own_prompt(2, 3), 6, 0)),
        (2, request(3, own_prompt(3, 40), 2, 0)),
    ];
    insta::assert_snapshot!(trace(config, arrivals, 20));
}

#[test]
fn preemption_by_recompute_when_kv_runs_out() {
    // 6 blocks of 4 tokens: two requests that each need KV for 13 tokens
    // (4 blocks) cannot both fit; the newer one is preempted, waits, and is
    // recomputed (prompt plus the tokens it had generated).
    let config = SchedConfig {
        kv_blocks: 6,
        ..config()
    };
    let arrivals = vec![
        (1, request(1, own_prompt(1, 4), 10, 0)),
        (1, request(2, own_prompt(2, 4), 10, 0)),
    ];
    insta::assert_snapshot!(trace(config, arrivals, 40));
}

#[test]
fn lower_priority_is_preempted_first() {
    let config = SchedConfig {
        kv_blocks: 6,
        ..config()
    };
    let arrivals = vec![
        (1, request(1, own_prompt(1, 4), 10, 0)),
        (1, request(2, own_prompt(2, 4), 10, 5)),
    ];
    insta::assert_snapshot!(trace(config, arrivals, 40));
}

#[test]
fn a_much_more_important_request_takes_a_slot_at_once() {
    // Two slots held by long priority-0 requests; a priority-100 request
    // arriving at step 3 preempts the newer of them (gap 50), runs, and the
    // preempted one is recomputed after it. A priority-10 request (below the
    // gap) waits for a free slot.
    let config = SchedConfig {
        max_running: 2,
        priority_preemption_gap: Some(50),
        ..config()
    };
    let arrivals = vec![
        (1, request(1, own_prompt(1, 4), 8, 0)),
        (1, request(2, own_prompt(2, 4), 8, 0)),
        (3, request(3, own_prompt(3, 4), 2, 100)),
        (3, request(4, own_prompt(4, 4), 2, 10)),
    ];
    insta::assert_snapshot!(trace(config, arrivals, 40));
}

#[test]
fn cached_prefixes_are_admitted_first_and_shared_prefixes_computed_once() {
    let shared: Vec<u32> = (0..16).collect();
    let with_shared = |id: u64| {
        let mut p = shared.clone();
        p.extend(own_prompt(id, 3));
        p
    };
    let config = SchedConfig {
        max_running: 2,
        ..config()
    };
    let arrivals = vec![
        // 1 computes the shared prefix; 2 arrives with it and waits (deferred)
        // rather than computing it a second time, then reuses it.
        (1, request(1, with_shared(1), 2, 0)),
        (1, request(2, with_shared(2), 2, 0)),
        // Later, 3 (no shared prefix) is ahead of 4 (shared) in the queue, but 4
        // can reuse cached blocks, so it is admitted first.
        (5, request(3, own_prompt(3, 10), 2, 0)),
        (5, request(4, with_shared(4), 2, 0)),
        (5, request(5, own_prompt(5, 10), 2, 0)),
    ];
    insta::assert_snapshot!(trace(config, arrivals, 30));
}

#[test]
fn kv_full_blocks_admission_at_the_head() {
    // The 30-token head does not fit beside the running request; a small one
    // behind it is not let past (no starvation of large requests).
    let config = SchedConfig {
        kv_blocks: 10,
        ..config()
    };
    let arrivals = vec![
        (1, request(1, own_prompt(1, 12), 4, 0)),
        (2, request(2, own_prompt(2, 30), 1, 0)),
        (2, request(3, own_prompt(3, 2), 1, 0)),
    ];
    insta::assert_snapshot!(trace(config, arrivals, 30));
}

#[test]
fn errors_name_the_request_and_the_problem() {
    let mut sched = Scheduler::new(SchedConfig {
        kv_blocks: 4,
        kv_block_size: 4,
        ..config()
    })
    .unwrap();
    assert_eq!(
        sched.add(request(1, vec![], 4, 0)).unwrap_err().to_string(),
        "request req-1 has an empty prompt"
    );
    assert_eq!(
        sched
            .add(request(2, own_prompt(2, 10), 7, 0))
            .unwrap_err()
            .to_string(),
        "request req-2 needs 17 tokens of KV; the pool holds 16"
    );
    sched.add(request(3, own_prompt(3, 2), 1, 0)).unwrap();
    assert_eq!(
        sched
            .add(request(3, own_prompt(3, 2), 1, 0))
            .unwrap_err()
            .to_string(),
        "request req-3 is already scheduled"
    );
    assert_eq!(
        sched.finish(RequestId(9)).unwrap_err().to_string(),
        "unknown request req-9"
    );
    assert_eq!(
        Scheduler::new(SchedConfig {
            max_running: 0,
            ..config()
        })
        .unwrap_err()
        .to_string(),
        "invalid scheduler configuration: max_running must be at least 1"
    );
}

#[test]
fn abort_releases_kv_wherever_the_request_is() {
    let config = SchedConfig {
        max_running: 1,
        ..config()
    };
    let mut sched = Scheduler::new(config).unwrap();
    sched.add(request(1, own_prompt(1, 8), 10, 0)).unwrap();
    sched.add(request(2, own_prompt(2, 8), 10, 0)).unwrap();
    let plan = sched.schedule();
    sched.commit(&plan, &[(RequestId(1), 5)]);
    assert!(sched.is_running(RequestId(1)));
    sched.abort(RequestId(2)).unwrap(); // waiting
    sched.abort(RequestId(1)).unwrap(); // running
    assert!(!sched.has_work());
    assert_eq!(sched.kv_stats().used_blocks, 0);
    sched.kv().verify().unwrap();
}

#[test]
fn a_budget_smaller_than_the_running_set_is_refused() {
    let err = Scheduler::new(SchedConfig {
        max_batch_tokens: 4,
        max_running: 8,
        ..config()
    })
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid scheduler configuration: max_batch_tokens must be at least max_running"
    );
}

#[test]
fn with_a_cadence_requests_join_together_on_admitting_steps() {
    // Two slots, joins every 4th step while anything runs: the first pair
    // starts at once (nothing ran), and a slot freed in between stays empty
    // until a step that is a multiple of 4, where waiting requests join
    // together.
    let config = SchedConfig {
        max_running: 2,
        admit_every: 4,
        ..config()
    };
    let arrivals = (1..=5)
        .map(|id| (1, request(id, own_prompt(id, 6), 1 + id as usize, 0)))
        .collect();
    insta::assert_snapshot!(trace(config, arrivals, 24));
}
