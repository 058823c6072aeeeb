//! Random arrivals, lengths and priorities: every request finishes, the KV
//! pool never overflows, and every plan respects the budget and limits.

use std::collections::{BTreeMap, HashMap};

use cortex_request::{CacheScope, RequestId};
use cortex_sched::{SchedConfig, SchedRequest, Scheduler};
use proptest::prelude::*;

#[derive(Debug, Clone)]
struct Arrival {
    step: u64,
    prompt_len: usize,
    shared_prefix: bool,
    max_new_tokens: usize,
    priority: i32,
}

fn arrival() -> impl Strategy<Value = Arrival> {
    (0u64..40, 1usize..40, any::<bool>(), 1usize..24, -2i32..3).prop_map(
        |(step, prompt_len, shared_prefix, max_new_tokens, priority)| Arrival {
            step,
            prompt_len,
            shared_prefix,
            max_new_tokens,
            priority,
        },
    )
}

fn config() -> impl Strategy<Value = SchedConfig> {
    (
        4usize..64,
        1usize..12,
        1usize..32,
        16usize..48,
        1usize..6,
        0usize..3,
        1u64..16,
        prop::option::of(1i32..4),
        1u64..4,
    )
        .prop_map(
            |(budget, max_running, chunk, kv_blocks, block_size, headroom, aging, gap, cadence)| {
                SchedConfig {
                    max_batch_tokens: budget.max(max_running),
                    max_running,
                    max_prefill_chunk: chunk,
                    kv_blocks,
                    kv_block_size: block_size,
                    admission_headroom_blocks: headroom,
                    aging_steps: aging,
                    prefix_window: 4,
                    prefix_caching: true,
                    priority_preemption_gap: gap,
                    admit_every: cadence,
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn every_request_finishes_and_kv_never_overflows(config in config(), arrivals in prop::collection::vec(arrival(), 1..40), void_every in prop::sample::select(vec![0u64, 16, 29])) {
        let mut sched = Scheduler::new(config.clone()).unwrap();
        let capacity = config.kv_blocks * config.kv_block_size;
        let mut by_step: BTreeMap<u64, Vec<(RequestId, SchedRequest)>> = BTreeMap::new();
        let mut expected = HashMap::new();
        for (i, a) in arrivals.iter().enumerate() {
            let id = RequestId(i as u64);
            let prompt: Vec<u32> = (0..a.prompt_len as u32)
                .map(|t| if a.shared_prefix && t < 24 { t } else { 10_000 + i as u32 * 100 + t })
                .collect();
            let request = SchedRequest { id, prompt, max_new_tokens: a.max_new_tokens, priority: a.priority, cache_scope: CacheScope::SHARED };
            if a.prompt_len + a.max_new_tokens > capacity {
                prop_assert!(sched.add(request).is_err(), "a request larger than the pool is refused");
                continue;
            }
            expected.insert(id, a.max_new_tokens);
            by_step.entry(a.step).or_default().push((id, request));
        }

        let mut generated: HashMap<RequestId, usize> = HashMap::new();
        let mut finished = Vec::new();
        let max_steps = 20_000u64;
        let mut voids = 0;
        for step in 0..max_steps {
            for (_, request) in by_step.remove(&step).unwrap_or_default() {
                sched.add(request).unwrap();
            }
            let plan = sched.schedule();
            prop_assert!(plan.num_tokens() <= config.max_batch_tokens, "budget: {plan}");
            prop_assert!(
                plan.admitted.iter().all(|a| !plan.preempted.contains(&a.id)),
                "admitted and preempted in one plan: {plan}"
            );
            if void_every > 0 && step % void_every == void_every - 1 && voids < 5 && !plan.is_empty() {
                voids += 1;
                // A few times the executor refuses a batch: preempt someone and plan again.
                prop_assert!(sched.preempt_one().is_some());
                if let Err(broken) = sched.kv().verify() {
                    prop_assert!(false, "{}", broken);
                }
                continue;
            }
            prop_assert!(sched.num_running() <= config.max_running);
            prop_assert!(plan.prefill.iter().all(|c| c.len >= 1 && c.len <= config.max_prefill_chunk));
            let mut sampled = Vec::new();
            for &id in &plan.decode {
                sampled.push((id, 1));
            }
            for chunk in plan.prefill.iter().filter(|c| c.samples) {
                sampled.push((chunk.id, 1));
            }
            for &(id, _) in &sampled {
                *generated.entry(id).or_default() += 1;
            }
            for id in &plan.preempted {
                // Recompute keeps generated tokens: nothing is lost.
                prop_assert_eq!(sched.generated(*id), generated.get(id).copied().or(Some(0)));
            }
            finished.extend(sched.commit(&plan, &sampled));
            if let Err(broken) = sched.kv().verify() {
                prop_assert!(false, "{}", broken);
            }
            let kv = sched.kv_stats();
            prop_assert!(kv.used_blocks + kv.cached_blocks + kv.free_blocks == kv.total_blocks);
            if !sched.has_work() && by_step.is_empty() {
                break;
            }
            prop_assert!(!plan.is_empty() || sched.num_running() == 0 || !by_step.is_empty(),
                "running requests always make progress");
        }
        prop_assert!(!sched.has_work(), "not finished after {max_steps} steps");
        prop_assert_eq!(finished.len(), expected.len());
        for id in finished {
            prop_assert_eq!(generated[&id], expected[&id], "{} generated exactly max_new_tokens", id);
        }
        prop_assert_eq!(sched.kv_stats().used_blocks, 0);
    }
}
