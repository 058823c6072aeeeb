//! Throughput benchmarks of the engine against a plain llama-cpp-2 loop doing
//! the same work, printed in `llama-batched-bench`'s columns.

use std::fmt::Write as _;
use std::num::NonZeroU32;
use std::path::Path;
use std::time::{Duration, Instant};

use cortex_request::{Prompt, Request, RequestId, SamplingParams, TokenId};
use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::token::LlamaToken;

use crate::{Engine, EngineConfig, EngineError, EngineEvent, Model, llama};

/// One row of a batched-bench table.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BenchRow {
    /// Prompt tokens per sequence.
    pub pp: usize,
    /// Generated tokens per sequence.
    pub tg: usize,
    /// Sequences.
    pub b: usize,
    /// Prompt processing time.
    pub t_pp: Duration,
    /// Generation time.
    pub t_tg: Duration,
}

impl BenchRow {
    /// KV cells used at the end: `B * (PP + TG)`.
    pub fn n_kv(&self) -> usize {
        self.b * (self.pp + self.tg)
    }
    /// Prompt tokens per second.
    pub fn s_pp(&self) -> f64 {
        (self.b * self.pp) as f64 / self.t_pp.as_secs_f64()
    }
    /// Generated tokens per second.
    pub fn s_tg(&self) -> f64 {
        (self.b * self.tg) as f64 / self.t_tg.as_secs_f64()
    }
    /// Total time.
    pub fn t(&self) -> Duration {
        self.t_pp + self.t_tg
    }
    /// All tokens per second.
    pub fn s(&self) -> f64 {
        self.n_kv() as f64 / self.t().as_secs_f64()
    }
}

/// Settings shared by both sides of a comparison.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchSettings {
    /// CPU threads.
    pub threads: usize,
    /// Prompt tokens per sequence.
    pub pp: usize,
    /// Generated tokens per sequence.
    pub tg: usize,
}

/// Deterministic pseudo-random prompt tokens (plain ids, no special tokens).
fn prompt_tokens(seed: u64, len: usize, vocab: usize) -> Vec<TokenId> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (1000 + state % (vocab as u64 - 2000)) as TokenId
        })
        .collect()
}

fn kv_tokens_for(b: usize, pp: usize, tg: usize) -> usize {
    // Room for every sequence plus a block of slack each, rounded to 256.
    (b * (pp + tg + 32)).div_ceil(256) * 256
}

/// The plain loop: one decode of all prompts, then `tg` decodes of one token
/// per sequence, greedy argmax in between. No scheduler, no events.
pub fn raw_row(model: &Model, settings: &BenchSettings, b: usize) -> Result<BenchRow, EngineError> {
    let BenchSettings { threads, pp, tg } = *settings;
    let batch_tokens = (b * pp).max(512);
    let load_error = |detail: String| EngineError::Model(format!("raw loop: {detail}"));
    let params = LlamaContextParams::default()
        .with_n_ctx(NonZeroU32::new(kv_tokens_for(b, pp, tg) as u32))
        .with_n_batch(batch_tokens as u32)
        .with_n_ubatch(batch_tokens.min(512) as u32)
        .with_n_seq_max(b as u32)
        .with_kv_unified(true)
        .with_n_threads(threads as i32)
        .with_n_threads_batch(threads as i32);
    let mut ctx = model
        .as_ref()
        .new_context(llama(), params)
        .map_err(|e| load_error(e.to_string()))?;
    let mut batch = LlamaBatch::new(batch_tokens, 1);
    let vocab = model.n_vocab();
    let start = Instant::now();
    for s in 0..b {
        let tokens = prompt_tokens(s as u64, pp, vocab);
        for (i, &t) in tokens.iter().enumerate() {
            batch
                .add(LlamaToken(t as i32), i as i32, &[s as i32], i + 1 == pp)
                .map_err(|e| load_error(e.to_string()))?;
        }
    }
    ctx.decode(&mut batch)
        .map_err(|e| load_error(e.to_string()))?;
    let mut next: Vec<TokenId> = (0..b)
        .map(|s| crate::argmax_row(ctx.get_logits_ith(((s + 1) * pp - 1) as i32)))
        .collect();
    let t_pp = start.elapsed();
    let start = Instant::now();
    for step in 0..tg {
        batch.clear();
        for (s, &t) in next.iter().enumerate() {
            batch
                .add(LlamaToken(t as i32), (pp + step) as i32, &[s as i32], true)
                .map_err(|e| load_error(e.to_string()))?;
        }
        ctx.decode(&mut batch)
            .map_err(|e| load_error(e.to_string()))?;
        for (s, token) in next.iter_mut().enumerate() {
            *token = crate::argmax_row(ctx.get_logits_ith(s as i32));
        }
    }
    Ok(BenchRow {
        pp,
        tg,
        b,
        t_pp,
        t_tg: start.elapsed(),
    })
}

/// The same work through the engine: `b` greedy requests of `pp` prompt
/// tokens, each generating `tg + 1` tokens (the first comes from the prompt's
/// logits, then `tg` decode steps), EOS ignored. PP time runs until every
/// request has its first token.
pub fn engine_row(
    model_path: &Path,
    settings: &BenchSettings,
    b: usize,
) -> Result<BenchRow, EngineError> {
    let BenchSettings { threads, pp, tg } = *settings;
    let mut config = EngineConfig::new(model_path);
    config.kv_tokens = kv_tokens_for(b, pp, tg);
    config.max_running = b;
    config.max_batch_tokens = (b * pp).max(512);
    config.threads = threads;
    config.prefix_sharing = false;
    config.request_timeout = None;
    let engine = Engine::start(&config)?;
    let vocab = engine.info().n_vocab;
    let requests = (0..b)
        .map(|s| {
            let mut r = Request::new(
                RequestId(s as u64),
                Prompt::Tokens(prompt_tokens(s as u64, pp, vocab)),
            );
            r.sampling = SamplingParams::greedy();
            r.stop.max_tokens = (tg + 1) as u32;
            r.stop.ignore_eos = true;
            r
        })
        .collect();
    let (tx, rx) = flume::unbounded();
    let start = Instant::now();
    engine.submit_many_to(requests, &tx)?;
    let (mut first_tokens, mut finished) = (vec![false; b], 0);
    let mut t_pp = None;
    while finished < b {
        match rx.recv().map_err(|_| EngineError::Stopped)? {
            EngineEvent::Token { id, .. } => {
                first_tokens[id.0 as usize] = true;
                if t_pp.is_none() && first_tokens.iter().all(|&f| f) {
                    t_pp = Some(start.elapsed());
                }
            }
            EngineEvent::Finished(_) => finished += 1,
            EngineEvent::Failed { error, .. } => return Err(error),
        }
    }
    let total = start.elapsed();
    let t_pp = t_pp.unwrap_or(total);
    if std::env::var_os("CORTEX_BENCH_VERBOSE").is_some() {
        let stats = engine.stats();
        eprintln!(
            "  B={b}: wall {:.3}s, in steps {:.3}s, in decode {:.3}s",
            total.as_secs_f64(),
            stats.busy_seconds,
            stats.decode_seconds
        );
    }
    Ok(BenchRow {
        pp,
        tg,
        b,
        t_pp,
        t_tg: total - t_pp,
    })
}

/// `llama-batched-bench`'s header.
pub fn table_header() -> String {
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
pub fn table_line(row: &BenchRow) -> String {
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

/// Outcome of one run of the shared-prefix job.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PrefixRun {
    /// Whether prefix sharing was on.
    pub sharing: bool,
    /// Wall time of the whole job.
    pub elapsed: Duration,
    /// Prompt tokens computed.
    pub prefill_tokens: u64,
    /// Prompt tokens reused.
    pub saved_tokens: u64,
    /// Tokens generated.
    pub generated_tokens: u64,
}

/// `requests` prompts sharing a `prefix`-token prefix, each with `distinct`
/// tokens of its own, generating `tg` tokens each, greedy, EOS ignored.
pub fn prefix_run(
    model_path: &Path,
    threads: usize,
    (requests, prefix, distinct, tg): (usize, usize, usize, usize),
    sharing: bool,
) -> Result<PrefixRun, EngineError> {
    let mut config = EngineConfig::new(model_path);
    config.kv_tokens = kv_tokens_for(requests, prefix + distinct, tg).max(8192);
    config.max_running = requests;
    config.max_batch_tokens = 512;
    config.threads = threads;
    config.prefix_sharing = sharing;
    config.request_timeout = None;
    let engine = Engine::start(&config)?;
    let vocab = engine.info().n_vocab;
    let shared = prompt_tokens(9_999, prefix, vocab);
    let batch = (0..requests)
        .map(|i| {
            let mut tokens = shared.clone();
            tokens.extend(prompt_tokens(i as u64, distinct, vocab));
            let mut r = Request::new(RequestId(i as u64), Prompt::Tokens(tokens));
            r.sampling = SamplingParams::greedy();
            r.stop.max_tokens = tg as u32;
            r.stop.ignore_eos = true;
            r
        })
        .collect();
    let (tx, rx) = flume::unbounded();
    let start = Instant::now();
    engine.submit_many_to(batch, &tx)?;
    let mut finished = 0;
    while finished < requests {
        match rx.recv().map_err(|_| EngineError::Stopped)? {
            EngineEvent::Finished(_) => finished += 1,
            EngineEvent::Failed { error, .. } => return Err(error),
            EngineEvent::Token { .. } => {}
        }
    }
    let elapsed = start.elapsed();
    let stats = engine.stats();
    Ok(PrefixRun {
        sharing,
        elapsed,
        prefill_tokens: stats.prefill_tokens,
        saved_tokens: stats.prefill_tokens_saved,
        generated_tokens: stats.generated_tokens,
    })
}

/// Peak resident memory of this process, from `/proc/self/status` (Linux).
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The faster of two rows (by total time).
fn best(a: Option<BenchRow>, b: BenchRow) -> BenchRow {
    match a {
        Some(a) if a.t() <= b.t() => a,
        _ => b,
    }
}

/// Runs the batched table (for `batch_sizes`) and, when `prefix_job`, the
/// shared-prefix table, and returns the report. Each batched row is the best
/// of `repeats` runs, raw and engine alternating, so that noise from the
/// machine hits both sides alike.
pub fn full_report(
    model_path: &Path,
    threads: usize,
    batch_sizes: &[usize],
    repeats: usize,
    prefix_job: bool,
    mut progress: impl FnMut(&str),
) -> Result<String, EngineError> {
    let settings = BenchSettings {
        threads,
        pp: 32,
        tg: 128,
    };
    let model = Model::load(model_path)?;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "model: {}\nthreads: {threads}\nbest of {repeats} runs per row, raw and engine alternating\n",
        model_path.display()
    );
    let mut pairs = Vec::new();
    for &b in batch_sizes {
        let (mut best_raw, mut best_engine) = (None, None);
        for round in 1..=repeats.max(1) {
            progress(&format!("batched: B = {b}, run {round} of {repeats}"));
            best_raw = Some(best(best_raw, raw_row(&model, &settings, b)?));
            best_engine = Some(best(best_engine, engine_row(model_path, &settings, b)?));
        }
        if let (Some(engine), Some(raw)) = (best_engine, best_raw) {
            pairs.push((engine, raw));
        }
    }
    let _ = writeln!(out, "engine (cortex, full step loop):\n{}", table_header());
    for (engine, _) in &pairs {
        let _ = writeln!(out, "{}", table_line(engine));
    }
    let _ = writeln!(
        out,
        "\nraw llama-cpp-2 loop (same work, no engine):\n{}",
        table_header()
    );
    for (_, raw) in &pairs {
        let _ = writeln!(out, "{}", table_line(raw));
    }
    let _ = writeln!(
        out,
        "\nengine / raw:\n| {:>4} | {:>8} | {:>8} | {:>8} |",
        "B", "S_PP", "S_TG", "S"
    );
    for (engine, raw) in &pairs {
        let _ = writeln!(
            out,
            "| {:>4} | {:>8.3} | {:>8.3} | {:>8.3} |",
            engine.b,
            engine.s_pp() / raw.s_pp(),
            engine.s_tg() / raw.s_tg(),
            engine.s() / raw.s()
        );
    }

    if !prefix_job {
        return Ok(out);
    }
    let shape = (64, 512, 32, 64);
    let _ = writeln!(
        out,
        "\nshared prefix: {} prompts, {}-token common prefix + {} own tokens, TG = {}",
        shape.0, shape.1, shape.2, shape.3
    );
    let _ = writeln!(
        out,
        "| sharing | {:>8} | {:>14} | {:>12} | {:>12} |",
        "time s", "prefill tokens", "saved tokens", "gen t/s"
    );
    let mut times = Vec::new();
    for sharing in [true, false] {
        progress(&format!(
            "shared prefix: sharing {}",
            if sharing { "on" } else { "off" }
        ));
        let run = prefix_run(model_path, threads, shape, sharing)?;
        let _ = writeln!(
            out,
            "| {:>7} | {:>8.2} | {:>14} | {:>12} | {:>12.1} |",
            if sharing { "on" } else { "off" },
            run.elapsed.as_secs_f64(),
            run.prefill_tokens,
            run.saved_tokens,
            run.generated_tokens as f64 / run.elapsed.as_secs_f64()
        );
        times.push(run.elapsed.as_secs_f64());
    }
    let _ = writeln!(
        out,
        "sharing on is {:.2}x faster than off",
        times[1] / times[0]
    );
    if let Some(rss) = peak_rss_bytes() {
        let _ = writeln!(out, "\npeak RSS: {:.1} MiB", rss as f64 / (1024.0 * 1024.0));
    }
    Ok(out)
}
