//! `cortex bench`: the engine against a plain llama.cpp loop on this machine.

use cortex_llama::bench::{self, ReportPlan};

use crate::cli::BenchArgs;
use crate::config::Config;
use crate::output;

pub(crate) fn bench(config: &Config, args: &BenchArgs) -> anyhow::Result<()> {
    let model = config.resolve_model()?;
    let plan = ReportPlan {
        // The batched rows and the prefix job set their own parallelism.
        engine: config.engine_config(&model),
        batch_sizes: args.batch.clone(),
        prompt_tokens: args.pp.max(1),
        generated_tokens: args.tg.max(1),
        repeats: args.repeat.max(1),
        raw: !args.engine_only,
        prefix_job: !args.no_prefix,
        profile_ops: args.profile_ops,
    };
    let report = bench::run_report(&plan, |line| eprintln!("{line}"))?;
    output::bench_report(&report, &plan, args.json)
}
