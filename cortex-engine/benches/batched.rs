//! The engine against a plain llama.cpp loop on the default model, in
//! `llama-batched-bench`'s columns, plus the shared-prefix job.
//!
//! Run: `cargo bench -p cortex-engine`. `CORTEX_BENCH_B=1,4` chooses the batch
//! sizes; `CORTEX_BENCH_REPEAT=N` takes the best of N runs per row (default
//! 2); `CORTEX_BENCH_PREFIX=0` skips the shared-prefix job.

use cortex_engine::{EngineConfig, bench};
use cortex_models::{DEFAULT_MODEL, ModelCache};

fn main() {
    let model = ModelCache::default_location()
        .ensure(&DEFAULT_MODEL)
        .expect("default model");
    let mut engine = EngineConfig::new(&model);
    engine.threads = engine.effective_threads();
    let sizes: Vec<usize> = std::env::var("CORTEX_BENCH_B")
        .ok()
        .map(|v| v.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 4, 16, 32, 64]);
    let prefix_job = std::env::var("CORTEX_BENCH_PREFIX").map_or(true, |v| v != "0");
    let repeats = std::env::var("CORTEX_BENCH_REPEAT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let plan = bench::ReportPlan {
        engine,
        batch_sizes: sizes,
        repeats,
        raw: true,
        prefix_job,
    };
    let report =
        bench::run_report(&plan, |step| eprintln!("running {step}...")).expect("benchmark");
    println!("{report}");
}
