//! What `cortex bench` prints: its table, or the same figures as JSON.

use cortex_engine::bench::{BenchReport, BenchRow, ReportPlan};
use serde_json::json;

use super::print_json;

/// The report as a table, or as JSON with `json`.
pub(crate) fn bench_report(
    report: &BenchReport,
    plan: &ReportPlan,
    json: bool,
) -> anyhow::Result<()> {
    if !json {
        outln!("{report}")?;
        return Ok(());
    }
    let row = |r: &BenchRow| {
        json!({
            "pp": r.pp, "tg": r.tg, "b": r.b, "n_kv": r.n_kv(),
            "t_pp": r.t_pp.as_secs_f64(), "s_pp": r.s_pp(),
            "t_tg": r.t_tg.as_secs_f64(), "s_tg": r.s_tg(),
            "t": r.t().as_secs_f64(), "s": r.s(),
        })
    };
    print_json(&json!({
        "model": report.model,
        "threads": plan.engine.threads,
        "device": plan.engine.device.to_string(),
        "cpu_kernels": plan.engine.cpu_kernels.to_string(),
        "repeats": plan.repeats,
        "batched": report.batched.iter().map(|b| json!({
            "engine": row(&b.engine),
            "raw": b.raw.as_ref().map(row),
        })).collect::<Vec<_>>(),
        "prefix": report.prefix.iter().map(|p| json!({
            "sharing": p.sharing,
            "seconds": p.elapsed.as_secs_f64(),
            "prefill_tokens": p.prefill_tokens,
            "saved_tokens": p.saved_tokens,
            "generated_tokens": p.generated_tokens,
        })).collect::<Vec<_>>(),
        "peak_rss_bytes": report.peak_rss_bytes,
    }))
}
