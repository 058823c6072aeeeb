//! What `cortex bench` prints: its table, or the same figures as JSON.

use std::fmt::Write as _;

use cortex_llama::bench::{BenchReport, BenchRow, Int8Peak, OpTime, PREFIX_JOB, ReportPlan};
use serde_json::json;

use super::print_json;

/// The report as a table, or as JSON with `json`.
pub(crate) fn bench_report(
    report: &BenchReport,
    plan: &ReportPlan,
    json: bool,
) -> anyhow::Result<()> {
    if !json {
        outln!("{}", report_tables(report))?;
        return Ok(());
    }
    let ops = |ops: &[OpTime]| {
        ops.iter()
            .map(|op| json!({"op": op.name, "calls": op.calls, "seconds": op.total.as_secs_f64(), "multiply_adds": op.multiply_adds, "host": op.host}))
            .collect::<Vec<_>>()
    };
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
            "engine_ops": ops(&b.engine_ops),
            "raw_ops": ops(&b.raw_ops),
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

/// The report as tables: `llama-batched-bench`'s columns for the engine
/// and the plain loop, their ratio, the shared-prefix job, peak memory.
fn report_tables(report: &BenchReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "model: {}\nthreads: {}\ndevice: {}, CPU kernels: {}\nbest of {} runs per row{}\n",
        report.model.display(),
        match report.plan.engine.threads {
            0 => "for the device (every core, adapted to other processes' load; on a GPU that holds the whole model, one a step loop)".to_owned(),
            n => n.to_string(),
        },
        report.plan.engine.device,
        report.plan.engine.cpu_kernels,
        report.plan.repeats.max(1),
        if report.plan.raw {
            ", raw and engine alternating"
        } else {
            ""
        }
    );
    let _ = writeln!(out, "engine (cortex, full step loop):\n{}", table_header());
    for row in &report.batched {
        let _ = writeln!(out, "{}", table_line(&row.engine));
    }
    if report.plan.raw {
        let _ = writeln!(
            out,
            "\nplain llama.cpp loop (same work, no engine):\n{}",
            table_header()
        );
        for raw in report.batched.iter().filter_map(|r| r.raw) {
            let _ = writeln!(out, "{}", table_line(&raw));
        }
        let _ = writeln!(
            out,
            "\nengine / raw:\n| {:>4} | {:>8} | {:>8} | {:>8} |",
            "B", "S_PP", "S_TG", "S"
        );
        for row in &report.batched {
            if let Some(raw) = row.raw {
                let e = row.engine;
                let _ = writeln!(
                    out,
                    "| {:>4} | {:>8.3} | {:>8.3} | {:>8.3} |",
                    e.b,
                    e.s_pp() / raw.s_pp(),
                    e.s_tg() / raw.s_tg(),
                    e.s() / raw.s()
                );
            }
        }
    }
    for row in &report.batched {
        for (side, ops) in [("engine", &row.engine_ops), ("plain loop", &row.raw_ops)] {
            if !ops.is_empty() {
                let peak = report.int8_peak;
                let _ = write!(out, "\n{}", ops_table(side, row.engine.b, ops, peak));
            }
        }
    }
    if let [on, off] = report.prefix.as_slice() {
        let (requests, prefix, distinct, tg) = PREFIX_JOB;
        let _ = writeln!(
            out,
            "\nshared prefix: {requests} prompts, {prefix}-token common prefix + {distinct} own tokens, TG = {tg}"
        );
        let _ = writeln!(
            out,
            "| sharing | {:>8} | {:>14} | {:>12} | {:>12} |",
            "time s", "prefill tokens", "saved tokens", "gen t/s"
        );
        for run in [on, off] {
            let _ = writeln!(
                out,
                "| {:>7} | {:>8.2} | {:>14} | {:>12} | {:>12.1} |",
                if run.sharing { "on" } else { "off" },
                run.elapsed.as_secs_f64(),
                run.prefill_tokens,
                run.saved_tokens,
                run.generated_tokens as f64 / run.elapsed.as_secs_f64()
            );
        }
        let _ = writeln!(
            out,
            "sharing on is {:.2}x faster than off",
            off.elapsed.as_secs_f64() / on.elapsed.as_secs_f64()
        );
    }
    if let Some(rss) = report.peak_rss_bytes {
        let _ = writeln!(out, "\npeak RSS: {:.1} MiB", rss as f64 / (1024.0 * 1024.0));
    }
    out.trim_end().to_owned()
}

/// Rows of an operation profile shown; the rest are summed in one line.
const OPS_SHOWN: usize = 16;

/// Where one side's profiled run spent its time, by graph operation.
fn ops_table(side: &str, b: usize, ops: &[OpTime], peak: Option<Int8Peak>) -> String {
    let total: f64 = ops.iter().map(|op| op.total.as_secs_f64()).sum();
    let mut out = format!(
        "time per graph operation, {side}, B = {b} (each computed alone and waited for: \
         {total:.3} s in all)\n| {:<40} | {:>8} | {:>9} | {:>8} | {:>5} |\n|{}|\n",
        "operation",
        "calls",
        "total ms",
        "mean us",
        "share",
        "------------------------------------------|----------|-----------|----------|-------"
    );
    let line = |out: &mut String, name: &str, calls: u64, seconds: f64| {
        let _ = writeln!(
            out,
            "| {name:<40} | {calls:>8} | {:>9.1} | {:>8.1} | {:>4.0}% |",
            seconds * 1e3,
            seconds * 1e6 / calls.max(1) as f64,
            100.0 * seconds / total.max(f64::MIN_POSITIVE)
        );
    };
    for op in ops.iter().take(OPS_SHOWN) {
        line(&mut out, &op.name, op.calls, op.total.as_secs_f64());
    }
    let rest = &ops[ops.len().min(OPS_SHOWN)..];
    if !rest.is_empty() {
        let calls = rest.iter().map(|op| op.calls).sum();
        let seconds = rest.iter().map(|op| op.total.as_secs_f64()).sum();
        line(&mut out, &format!("{} others", rest.len()), calls, seconds);
    }
    out.push_str(&matrix_rate(ops, peak));
    out
}

/// The matrix products' multiply-adds per second: those the CPU computed
/// beside the int8 peak of its cores, those a GPU computed apart (the CPU's
/// peak says nothing of them).
fn matrix_rate(ops: &[OpTime], peak: Option<Int8Peak>) -> String {
    let mut text = String::new();
    for host in [true, false] {
        let products = ops
            .iter()
            .filter(|op| op.multiply_adds > 0 && op.host == host);
        let (multiply_adds, seconds) = products.fold((0u64, 0.0), |(m, s), op| {
            (m + op.multiply_adds, s + op.total.as_secs_f64())
        });
        if multiply_adds == 0 || seconds <= 0.0 {
            continue;
        }
        let rate = multiply_adds as f64 / seconds;
        let _ = write!(
            text,
            "matrix products{}: {:.1} G multiply-adds in {:.1} ms, {:.1} G/s",
            if host { "" } else { " on the GPU" },
            multiply_adds as f64 / 1e9,
            seconds * 1e3,
            rate / 1e9
        );
        if let (true, Some(peak)) = (host, peak) {
            let _ = write!(
                text,
                " = {:.0}% of the int8 peak, {:.0} G/s ({} cores running {} back to back, measured)",
                100.0 * rate / peak.per_second,
                peak.per_second / 1e9,
                peak.cores,
                peak.instruction
            );
        }
        text.push('\n');
    }
    text
}

/// `llama-batched-bench`'s header.
fn table_header() -> String {
    format!(
        "| {:>5} | {:>5} | {:>4} | {:>6} | {:>8} | {:>8} | {:>8} | {:>8} | {:>8} | {:>8} |\n|{}|",
        "PP",
        "TG",
        "B",
        "N_KV",
        "T_PP s",
        "S_PP t/s",
        "T_TG s",
        "S_TG t/s",
        "T s",
        "S t/s",
        "-------|-------|------|--------|----------|----------|----------|----------|----------|----------"
    )
}

/// One table line in `llama-batched-bench`'s format.
fn table_line(row: &BenchRow) -> String {
    format!(
        "| {:>5} | {:>5} | {:>4} | {:>6} | {:>8.3} | {:>8.2} | {:>8.3} | {:>8.2} | {:>8.3} | {:>8.2} |",
        row.pp,
        row.tg,
        row.b,
        row.n_kv(),
        row.t_pp.as_secs_f64(),
        row.s_pp(),
        row.t_tg.as_secs_f64(),
        row.s_tg(),
        row.t().as_secs_f64(),
        row.s()
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn product(name: &str, multiply_adds: u64, millis: u64, host: bool) -> OpTime {
        OpTime {
            name: name.to_owned(),
            calls: 1,
            total: Duration::from_millis(millis),
            multiply_adds,
            host,
        }
    }

    #[test]
    fn the_cpus_peak_measures_only_the_products_the_cpu_computed() {
        let peak = Int8Peak {
            cores: 2,
            per_second: 512e9,
            instruction: "vpdpbusd zmm",
        };
        // 512 G/s against a peak of 512 G/s on the CPU; 4,000 G/s on a GPU.
        let ops = [
            product("MUL_MAT ffn_up q4_K (host)", 512_000_000, 1, true),
            product("MUL_MAT ffn_up q4_K", 4_000_000_000, 1, false),
            product("RMS_NORM norm", 0, 5, false),
        ];
        let text = matrix_rate(&ops, Some(peak));
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(
            lines[0].starts_with(
                "matrix products: 0.5 G multiply-adds in 1.0 ms, 512.0 G/s = 100% of the int8 peak"
            ),
            "{text}"
        );
        assert_eq!(
            lines[1],
            "matrix products on the GPU: 4.0 G multiply-adds in 1.0 ms, 4000.0 G/s"
        );
        // A model wholly on a GPU: no line compares with the CPU's peak.
        let text = matrix_rate(&ops[1..], Some(peak));
        assert!(!text.contains("peak"), "{text}");
    }
}
