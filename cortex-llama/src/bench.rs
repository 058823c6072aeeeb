//! Throughput benchmarks of the engine against a plain loop on llama.cpp
//! doing the same work, printed in `llama-batched-bench`'s columns.

use std::time::{Duration, Instant};

use cortex_engine::{Engine, EngineConfig, EngineError, EngineEvent};
use cortex_request::{Prompt, Request, RequestId, SamplingParams, TokenId, Work};

use crate::Model;
pub use crate::sys::profile::OpTime;
use crate::sys::{self, ContextParams, RawBatch, RawContext, profile};

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
    /// CPU threads; 0: the engine's for the device (every core, adapted to
    /// other processes' load; one a loop on a GPU that holds the whole
    /// model), and every core for the plain loop.
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

/// `threads`, or every core when it is 0.
fn cores(threads: usize) -> usize {
    let mut config = EngineConfig::new("");
    config.threads = threads;
    config.effective_threads()
}

/// Cells per stream for `pp + tg` tokens plus a little slack, in llama.cpp's
/// 256-cell granules.
fn stream_tokens_for(pp: usize, tg: usize) -> usize {
    (pp + tg + 32).next_multiple_of(256)
}

/// A plain loop's context and batch over `model`.
struct PlainLoop<'m> {
    ctx: RawContext<'m>,
    batch: RawBatch,
}

impl<'m> PlainLoop<'m> {
    fn new(model: &'m Model, params: &ContextParams) -> Result<Self, EngineError> {
        let ctx = RawContext::new(&model.raw, params)
            .map_err(|e| EngineError::Model(format!("plain loop: {e}")))?;
        Ok(Self {
            ctx,
            batch: RawBatch::new(params.batch),
        })
    }

    /// One sequence of up to `tokens` tokens (rounded up to whole 256-cell
    /// granules), its prompt decoded in one batch.
    fn single_sequence(
        model: &'m Model,
        tokens: usize,
        threads: usize,
    ) -> Result<Self, EngineError> {
        let cells = tokens.next_multiple_of(256);
        Self::new(
            model,
            &ContextParams {
                cells,
                sequences: 1,
                batch: cells,
                micro_batch: EngineConfig::CPU_MICRO_BATCH_TOKENS,
                threads: cores(threads),
                unified: true,
                embeddings: None,
            },
        )
    }

    fn push(&mut self, token: TokenId, pos: usize, seq: usize, logits: bool) {
        assert!(
            self.batch.push(token as i32, pos, seq as i32, logits),
            "the batch was sized for this"
        );
    }

    fn decode(&mut self) -> Result<(), EngineError> {
        match self.ctx.decode(&self.batch) {
            0 => Ok(()),
            code => Err(EngineError::Model(format!(
                "plain loop: decode failed ({code})"
            ))),
        }
    }

    fn argmax(&self, index: usize) -> TokenId {
        cortex_sample::argmax(self.ctx.logits(index).expect("logits were asked for"))
    }
}

/// The plain loop, as `llama-batched-bench` does it: one stream per sequence
/// (non-unified KV), one decode of all prompts, then `tg` decodes of one
/// token per sequence, greedy argmax in between. No scheduler, no events.
pub fn raw_row(model: &Model, settings: &BenchSettings, b: usize) -> Result<BenchRow, EngineError> {
    let BenchSettings { threads, pp, tg } = *settings;
    let threads = cores(threads);
    let mut run = PlainLoop::new(
        model,
        &ContextParams {
            cells: b * stream_tokens_for(pp, tg),
            sequences: b,
            batch: (b * pp).max(512),
            // llama-batched-bench's -ub 512, as bench_peers runs it.
            micro_batch: 512,
            threads,
            unified: false,
            embeddings: None,
        },
    )?;
    let vocab = model.n_vocab();
    // Warm up as llama-batched-bench does, then clear what it wrote.
    for (i, &t) in prompt_tokens(7, 16, vocab).iter().enumerate() {
        run.push(t, i, 0, false);
    }
    run.decode()?;
    run.batch.clear();
    run.ctx.truncate_sequence(0, 0);
    let start = Instant::now();
    for s in 0..b {
        for (i, &t) in prompt_tokens(s as u64, pp, vocab).iter().enumerate() {
            run.push(t, i, s, i + 1 == pp);
        }
    }
    run.decode()?;
    let mut next: Vec<TokenId> = (0..b).map(|s| run.argmax((s + 1) * pp - 1)).collect();
    let t_pp = start.elapsed();
    let start = Instant::now();
    for step in 0..tg {
        run.batch.clear();
        for (s, &t) in next.iter().enumerate() {
            run.push(t, pp + step, s, true);
        }
        run.decode()?;
        for (s, token) in next.iter_mut().enumerate() {
            *token = run.argmax(s);
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

/// Greedy decoding on llama.cpp alone: one sequence, one token per decode, no
/// engine. The reference the engine's greedy output is checked against.
pub fn greedy_reference(
    model: &Model,
    prompt: &[TokenId],
    max_tokens: usize,
    threads: usize,
) -> Result<Vec<TokenId>, EngineError> {
    let mut run = PlainLoop::single_sequence(model, prompt.len() + max_tokens, threads)?;
    for (i, &t) in prompt.iter().enumerate() {
        run.push(t, i, 0, i + 1 == prompt.len());
    }
    run.decode()?;
    let mut last = prompt.len() - 1;
    let mut out = Vec::new();
    for pos in prompt.len()..prompt.len() + max_tokens {
        let next = run.argmax(last);
        out.push(next);
        if model.is_end_of_generation(next) {
            break;
        }
        run.batch.clear();
        run.push(next, pos, 0, true);
        run.decode()?;
        last = 0;
    }
    Ok(out)
}

/// How well `model` predicts `text`: the exponential of the mean negative
/// log-likelihood of each token given those before it (as llama.cpp's
/// `llama-perplexity` measures, here over one window of at most `window`
/// tokens). Lower is better; it compares ways of computing the same model
/// (kernels, devices) by quality, where their logits differ by rounding.
pub fn perplexity(
    model: &Model,
    text: &str,
    window: usize,
    threads: usize,
) -> Result<f64, EngineError> {
    let mut tokens = model.tokenize(text, true, false);
    tokens.truncate(window.max(2));
    if tokens.len() < 2 {
        return Err(EngineError::Model(
            "perplexity needs at least two tokens".into(),
        ));
    }
    let mut run = PlainLoop::single_sequence(model, tokens.len(), threads)?;
    for (i, &t) in tokens.iter().enumerate() {
        run.push(t, i, 0, i + 1 < tokens.len());
    }
    run.decode()?;
    let mut total = 0.0;
    for (i, &next) in tokens.iter().enumerate().skip(1) {
        let logits = run.ctx.logits(i - 1).expect("logits were asked for");
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum: f64 = logits.iter().map(|&l| f64::from(l - max).exp()).sum();
        total += sum.ln() + f64::from(max) - f64::from(logits[next as usize]);
    }
    Ok((total / (tokens.len() - 1) as f64).exp())
}

/// One short request through each of the engine's step loops before
/// timing, as `llama-batched-bench` warms up its context (the first decode
/// allocates).
fn warm_up(engine: &Engine) -> Result<(), EngineError> {
    let info = engine.info();
    let requests = (0..info.step_loops as u64)
        .map(|i| {
            let mut r = Request::new(
                RequestId(u64::MAX - i),
                Prompt::Tokens(prompt_tokens(7, 16, info.n_vocab)),
            );
            r.sampling = SamplingParams::greedy();
            r.stop.max_tokens = 1;
            r
        })
        .collect();
    for events in engine.submit_many(requests)? {
        for event in &events {
            match event {
                EngineEvent::Failed { error, .. } => return Err(error),
                event if event.is_terminal() => break,
                _ => {}
            }
        }
    }
    Ok(())
}

/// The same work through the engine: `b` greedy requests of `pp` prompt
/// tokens, each generating `tg + 1` tokens (the first comes from the prompt's
/// logits, then `tg` decode steps), EOS ignored. PP time runs until every
/// request has its first token. The engine starts from `base` (model,
/// device, kernels) with the row's sizes.
pub fn engine_row(
    base: &EngineConfig,
    settings: &BenchSettings,
    b: usize,
) -> Result<BenchRow, EngineError> {
    let BenchSettings { threads, pp, tg } = *settings;
    let mut config = base.clone();
    config.stream_tokens = Some(stream_tokens_for(pp, tg));
    config.parallel = b;
    config.max_batch_tokens = (b * pp).max(512);
    config.threads = threads;
    config.prefix_sharing = false;
    config.request_timeout = None;
    let engine = crate::start(&config)?;
    warm_up(&engine)?;
    let vocab = engine.info().n_vocab;
    let requests: Vec<Request> = (0..b)
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
    let (tx, rx) = cortex_engine::event_channel();
    let start = Instant::now();
    engine.submit_many_to(requests.into_iter().map(Work::Generate).collect(), &tx)?;
    let (mut first_tokens, mut finished) = (vec![false; b], 0);
    let mut t_pp = None;
    while finished < b {
        match rx.recv().ok_or(EngineError::Stopped)? {
            EngineEvent::Token { id, .. } => {
                first_tokens[id.0 as usize] = true;
                if t_pp.is_none() && first_tokens.iter().all(|&f| f) {
                    t_pp = Some(start.elapsed());
                }
            }
            EngineEvent::Finished(_) => finished += 1,
            EngineEvent::Failed { error, .. } => return Err(error),
            _ => {}
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
/// tokens of its own, generating `tg` tokens each, greedy, EOS ignored, on
/// an engine set up as `base` says.
pub fn prefix_run(
    base: &EngineConfig,
    (requests, prefix, distinct, tg): (usize, usize, usize, usize),
    sharing: bool,
) -> Result<PrefixRun, EngineError> {
    let mut config = base.clone();
    config.parallel = requests;
    config.max_batch_tokens = 512;
    config.prefix_sharing = sharing;
    config.request_timeout = None;
    let engine = crate::start(&config)?;
    let vocab = engine.info().n_vocab;
    let shared = prompt_tokens(9_999, prefix, vocab);
    let batch: Vec<Request> = (0..requests)
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
    let (tx, rx) = cortex_engine::event_channel();
    let start = Instant::now();
    engine.submit_many_to(batch.into_iter().map(Work::Generate).collect(), &tx)?;
    let mut finished = 0;
    while finished < requests {
        match rx.recv().ok_or(EngineError::Stopped)? {
            EngineEvent::Finished(_) => finished += 1,
            EngineEvent::Failed { error, .. } => return Err(error),
            _ => {}
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

/// The int8 multiply-add peak of the cores a benchmark used: what its
/// matrix products are measured against.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Int8Peak {
    /// Cores (threads) counted.
    pub cores: usize,
    /// Multiply-adds a second of all of them, each running the instruction
    /// back to back at once.
    pub per_second: f64,
    /// The instruction: AVX-512 VNNI's `vpdpbusd` zmm (64 multiply-adds),
    /// AVX-VNNI's `vpdpbusd` ymm or AVX2's `vpmaddubsw` ymm (32).
    pub instruction: &'static str,
}

impl Int8Peak {
    /// How long each core runs the instruction.
    const MEASURED_FOR: f64 = 0.25;

    /// Measures `cores` cores of this machine running the int8 instruction
    /// of `kernels`, the instruction set cortex's kernels run with
    /// ([`Backends::cortex_kernels`](crate::Backends::cortex_kernels):
    /// AVX-512 VNNI, AVX-VNNI or AVX2, as `--cpu-kernels` let them; AVX2's
    /// where they do not run), all at once. Measured, not computed from a
    /// clock: `/proc/cpuinfo`'s is the host's nominal one in a VM (2.6 GHz
    /// on an Intel Xeon guest whose two cores ran `vpmaddubsw` at 3.5), and
    /// a core may run 512-bit work at a lower clock. `None` on a CPU that
    /// runs none of them.
    pub fn measure(cores: usize, kernels: Option<&str>) -> Option<Int8Peak> {
        use sys::kernels::KernelIsa;
        let isa = match kernels.and_then(KernelIsa::named) {
            Some(isa) => isa,
            None if KernelIsa::Avx2.supported() => KernelIsa::Avx2,
            None => return None,
        };
        let cores = cores.max(1);
        let per_second: f64 = std::thread::scope(|scope| {
            let threads: Vec<_> = (0..cores)
                .map(|_| {
                    scope.spawn(move || sys::kernels::int8_per_second(isa, Self::MEASURED_FOR))
                })
                .collect();
            threads
                .into_iter()
                .map(|thread| thread.join().unwrap_or(0.0))
                .sum()
        });
        let instruction = match isa {
            KernelIsa::Avx512 => "vpdpbusd zmm",
            KernelIsa::AvxVnni => "vpdpbusd ymm",
            KernelIsa::Avx2 => "vpmaddubsw ymm",
        };
        (per_second > 0.0).then_some(Int8Peak {
            cores,
            per_second,
            instruction,
        })
    }
}

/// Peak resident memory of this process, from `/proc/self/status` (Linux).
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// `run()`, its graph operations timed when `profiled` (else none).
fn profiled_if<T>(
    profiled: bool,
    run: impl FnOnce() -> Result<T, EngineError>,
) -> Result<(T, Vec<OpTime>), EngineError> {
    if !profiled {
        return Ok((run()?, Vec::new()));
    }
    profile::start();
    let result = run();
    let ops = profile::finish();
    Ok((result?, ops))
}

/// The faster of two rows (by total time).
fn best(a: Option<BenchRow>, b: BenchRow) -> BenchRow {
    match a {
        Some(a) if a.t() <= b.t() => a,
        _ => b,
    }
}

/// What to measure in [`run_report`].
#[derive(Debug, Clone, PartialEq)]
pub struct ReportPlan {
    /// The engine every run starts from: the model, its threads (0: every
    /// core, which the engine adapts to other processes' load), device, GPU
    /// layers and CPU kernels. The plain loop loads the model the same way.
    pub engine: EngineConfig,
    /// Batch sizes of the batched table.
    pub batch_sizes: Vec<usize>,
    /// Prompt tokens of each sequence of a batched row (llama-batched-bench's PP).
    pub prompt_tokens: usize,
    /// Tokens each sequence of a batched row generates (its TG).
    pub generated_tokens: usize,
    /// Runs per batched row (the best is kept).
    pub repeats: usize,
    /// Also run the plain llama.cpp loop for each row.
    pub raw: bool,
    /// Also run the shared-prefix job, sharing on and off.
    pub prefix_job: bool,
    /// Time every graph operation of each row's last run (which makes
    /// those runs slower: see [`BatchedRow::engine_ops`]).
    pub profile_ops: bool,
}

/// One batched row: the engine, and the plain loop when it ran.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchedRow {
    /// The engine's row.
    pub engine: BenchRow,
    /// The plain loop's row, when measured.
    pub raw: Option<BenchRow>,
    /// With [`ReportPlan::profile_ops`], the engine's time per graph
    /// operation in its last run, the costliest first. Each operation is
    /// computed and waited for alone (no fusion, no CUDA graphs), so the
    /// times add up to more than the row took unprofiled, and that run's
    /// row is slower too.
    pub engine_ops: Vec<OpTime>,
    /// The same for the plain loop's last run.
    pub raw_ops: Vec<OpTime>,
}

/// Everything [`run_report`] measured.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchReport {
    /// The model file.
    pub model: std::path::PathBuf,
    /// What was measured.
    pub plan: ReportPlan,
    /// The batched table, one row per batch size.
    pub batched: Vec<BatchedRow>,
    /// The shared-prefix job, sharing on then off, when it ran.
    pub prefix: Vec<PrefixRun>,
    /// Peak resident memory of the process.
    pub peak_rss_bytes: Option<u64>,
    /// The int8 peak of the cores the engine ran on, with the instruction
    /// set its kernels ran with: what its matrix products are measured
    /// against.
    pub int8_peak: Option<Int8Peak>,
}

/// A batched row's prompt and generated tokens per sequence unless asked
/// otherwise: llama-batched-bench's `-npp 32 -ntg 128`, as the peers run it.
pub const BATCHED_TOKENS: (usize, usize) = (32, 128);

/// The shape of the shared-prefix job: requests, prefix tokens, own tokens, TG.
pub const PREFIX_JOB: (usize, usize, usize, usize) = (64, 512, 32, 64);

/// Runs the batched table and, when asked, the shared-prefix job. Each
/// batched row is the best of `repeats` runs, raw and engine alternating, so
/// that noise from the machine hits both sides alike.
pub fn run_report(
    plan: &ReportPlan,
    mut progress: impl FnMut(&str),
) -> Result<BenchReport, EngineError> {
    let base = &plan.engine;
    let settings = BenchSettings {
        threads: base.threads,
        pp: plan.prompt_tokens,
        tg: plan.generated_tokens,
    };
    // The plain loop's own copy of the model, only when it runs.
    let model = if plan.raw {
        Some(crate::start::load_model(base)?)
    } else {
        None
    };
    let repeats = plan.repeats.max(1);
    let mut batched = Vec::new();
    for &b in &plan.batch_sizes {
        let (mut best_raw, mut best_engine) = (None, None);
        let (mut raw_ops, mut engine_ops) = (Vec::new(), Vec::new());
        for round in 1..=repeats {
            progress(&format!("batched: B = {b}, run {round} of {repeats}"));
            let profiled = plan.profile_ops && round == repeats;
            if let Some(model) = &model {
                let (row, ops) = profiled_if(profiled, || raw_row(model, &settings, b))?;
                best_raw = Some(best(best_raw, row));
                raw_ops = ops;
            }
            let (row, ops) = profiled_if(profiled, || engine_row(base, &settings, b))?;
            best_engine = Some(best(best_engine, row));
            engine_ops = ops;
        }
        if let Some(engine) = best_engine {
            batched.push(BatchedRow {
                engine,
                raw: best_raw,
                engine_ops,
                raw_ops,
            });
        }
    }
    let mut prefix = Vec::new();
    if plan.prefix_job {
        for sharing in [true, false] {
            progress(&format!(
                "shared prefix: sharing {}",
                if sharing { "on" } else { "off" }
            ));
            prefix.push(prefix_run(base, PREFIX_JOB, sharing)?);
        }
    }
    Ok(BenchReport {
        model: base.model.clone(),
        plan: plan.clone(),
        batched,
        prefix,
        peak_rss_bytes: peak_rss_bytes(),
        // Only the profiled rows' tables compare with it.
        int8_peak: plan
            .profile_ops
            .then(|| {
                Int8Peak::measure(
                    cores(base.threads),
                    crate::devices::load_backends(base.backends_dir.as_deref(), base.cpu_kernels)
                        .cortex_kernels,
                )
            })
            .flatten(),
    })
}
