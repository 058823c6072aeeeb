//! Planning cost per step with 256 running and 10,000 waiting requests.
//!
//! Run: `cargo bench -p cortex-sched`

use std::time::Instant;

use cortex_request::{CacheScope, RequestId};
use cortex_sched::{SchedConfig, SchedRequest, Scheduler};

const RUNNING: usize = 256;
const WAITING: usize = 10_000;

fn run(label: &str, kv_blocks: usize) {
    let config = SchedConfig {
        max_batch_tokens: 8192,
        max_running: RUNNING,
        max_prefill_chunk: 8192,
        kv_blocks,
        kv_block_size: 16,
        admission_headroom_blocks: 0,
        ..SchedConfig::default()
    };
    let mut sched = Scheduler::new(config).expect("valid config");
    for i in 0..(RUNNING + WAITING) as u64 {
        let prompt: Vec<u32> = (0..48).map(|t| (i as u32 * 31 + t) % 49_152).collect();
        let request = SchedRequest {
            id: RequestId(i),
            prompt,
            max_new_tokens: 1000, // long enough to stay running while measured
            priority: (i % 3) as i32,
            cache_scope: CacheScope::SHARED,
        };
        sched.add(request).expect("fits");
    }
    // Warm up: admit and prefill the running set.
    for _ in 0..8 {
        let plan = sched.schedule();
        let mut sampled: Vec<_> = plan.decode.iter().map(|&id| (id, 9)).collect();
        sampled.extend(plan.prefill.iter().filter(|c| c.samples).map(|c| (c.id, 7)));
        sched.commit(&plan, &sampled);
    }

    let steps = 200;
    let mut planning = std::time::Duration::ZERO;
    let mut committing = std::time::Duration::ZERO;
    let mut last = None;
    for _ in 0..steps {
        let start = Instant::now();
        let plan = sched.schedule();
        planning += start.elapsed();
        let sampled: Vec<_> = plan.decode.iter().map(|&id| (id, 9)).collect();
        let start = Instant::now();
        sched.commit(&plan, &sampled);
        committing += start.elapsed();
        last = plan.admission_stop;
    }
    let stats = sched.stats();
    println!(
        "{label}: {} running, {} waiting, kv {}/{} blocks; schedule() {:.1} µs/step, commit() {:.1} µs/step \
         ({steps} steps, {} preemptions, admission stopped by {last:?})",
        sched.num_running(),
        sched.num_waiting(),
        sched.kv_stats().used_blocks,
        sched.kv_stats().total_blocks,
        planning.as_secs_f64() * 1e6 / f64::from(steps),
        committing.as_secs_f64() * 1e6 / f64::from(steps),
        stats.preemptions,
    );
}

fn main() {
    // Room for every running request to decode: admission stops at max_running.
    run("max-running bound", RUNNING * 70);
    // Room for fewer than 256 to grow: the head of the queue is tried each step
    // and running requests are preempted as the pool fills.
    run("kv bound", RUNNING * 8);
}
