//! The scheduler planning an engine's steps for four requests, two of
//! which share a prompt's start, under a small token budget and KV cache:
//! each step's plan (prefill chunks, decodes, admissions, why admission
//! stopped), with a made-up token sampled for each row that samples.
//!
//! ```text
//! cargo run -p cortex-sched --example plan_steps
//! ```

use std::process::ExitCode;

use cortex_request::{CacheScope, RequestId};
use cortex_sched::{SchedConfig, SchedError, SchedRequest, Scheduler};

#[cfg_attr(test, allow(dead_code))]
fn main() -> ExitCode {
    match plan() {
        Ok(steps) => {
            steps.iter().for_each(|step| println!("{step}"));
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("plan_steps: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Each step's plan, as text, until every request has finished.
fn plan() -> Result<Vec<String>, SchedError> {
    let mut sched = Scheduler::new(SchedConfig {
        max_batch_tokens: 16,
        max_running: 3,
        kv_blocks: 12,
        kv_block_size: 4,
        ..SchedConfig::default()
    })?;
    let shared: Vec<u32> = (100..112).collect();
    let prompts = [
        shared.iter().copied().chain([1, 2]).collect::<Vec<_>>(),
        shared.iter().copied().chain([3]).collect(),
        (200..205).collect(),
        (300..320).collect(),
    ];
    for (i, prompt) in prompts.into_iter().enumerate() {
        sched.add(SchedRequest {
            id: RequestId(i as u64 + 1),
            prompt,
            max_new_tokens: 3,
            priority: 0,
            cache_scope: CacheScope::SHARED,
        })?;
    }
    let mut steps = Vec::new();
    while sched.has_work() && steps.len() < 100 {
        let plan = sched.schedule();
        steps.push(plan.to_string());
        // Every decoding row and every prompt's last chunk samples a token.
        let sampled: Vec<_> = plan
            .decode
            .iter()
            .copied()
            .chain(plan.prefill.iter().filter(|c| c.samples).map(|c| c.id))
            .map(|id| (id, 7))
            .collect();
        for finished in sched.commit(&plan, &sampled) {
            steps.push(format!("  request {} finished", finished.0));
        }
    }
    Ok(steps)
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_request_finishes_within_the_budget() {
        let steps = super::plan().unwrap();
        let finished = steps.iter().filter(|s| s.ends_with("finished")).count();
        assert_eq!(finished, 4, "{steps:#?}");
        assert!(steps.len() < 100, "{steps:#?}");
    }
}
