//! The step loop: one thread that owns the executor, the scheduler, the KV
//! binding and every request in flight. Each step plans with `cortex-sched`,
//! binds admitted sequences to KV streams, decodes one batch, samples, and
//! applies stop conditions. Split by concern:
//!
//! - `intake`: commands (submit, cancel, shutdown); validating, rendering and
//!   tokenizing requests and queueing their completions;
//! - `sizing`: the KV layout (streams x cells per stream), grown when a
//!   longer request arrives;
//! - `decode`: one batch from the plan, decode with failure isolation,
//!   sampling, and what each stream computed;
//! - `output`: stop conditions and the streamed text of each token;
//! - `outbox`: a step's events, handed to each channel together;
//! - `lifecycle`: the one path that ends a request (finished, failed,
//!   cancelled, refused), timeouts, and publishing the statistics;
//! - `tally`: the running figures behind `EngineStats`, one owner for them;
//! - `timeline`: the record of each step for an observer (a trace);
//! - `embed`: embedding requests, packed into decodes of their own between
//!   generation steps.
//!
//! Which stream each sequence runs in is [`crate::streams`].

mod decode;
mod embed;
mod even;
mod intake;
mod lifecycle;
mod outbox;
mod output;
mod sizing;
mod tally;
mod threads;
mod timeline;

use std::collections::{HashMap, VecDeque};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cortex_kv::BlockId;
use cortex_request::{Completion, PromptToken, RequestId, TokenId, TokenLogprob};
use cortex_sample::Sampler;
use cortex_sched::{Admission, SchedRequest, Scheduler, StepPlan};

use crate::config::EngineConfig;
use crate::error::EngineError;
use crate::events::{EngineEvent, StepObserver};
use crate::executor::{BatchToken, Executor, StreamId, TokenGrammar};
use crate::protocol::{Command, EngineHealth, EngineInfo, EventSender, Shared, panic_message};
use crate::streams::{Streams, ToBind};
use crate::text::{StopMatcher, Utf8Stream};

use self::decode::StepBatch;
use self::outbox::Outbox;
use self::sizing::Sizing;
use self::tally::Tally;
use self::threads::ThreadGovernor;
use self::timeline::Timeline;

/// One request as the loop tracks it.
struct Live {
    events: EventSender,
    /// Completions of each prompt: completion `p × n + k` continues prompt `p`.
    n: u32,
    /// Each prompt's length, and how much of it was found cached.
    prompt_tokens: Vec<usize>,
    cached_prompt_tokens: Vec<usize>,
    completions: Vec<Option<Completion>>,
    seqs: Vec<RequestId>,
    submitted: Instant,
    started: Option<Instant>,
    first_token: Option<Instant>,
}

/// Where a sequence's tokens are chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SampledAt {
    /// The argmax, taken by the device that computes the logits: one token
    /// per row comes back instead of the vocabulary's logits.
    Device,
    /// The argmax of the logits, read where the executor left them.
    HostArgmax,
    /// The sequence's sampler, from a copy of the logits (randomness, bias,
    /// penalties, a grammar or log probabilities).
    HostSampler,
}

/// Seconds of one step by where they went (see [`crate::StepRecord`]).
#[derive(Debug, Clone, Copy, Default)]
struct StepTimes {
    /// In the executor's decode call.
    decode: f64,
    /// Waiting for the device's results after it.
    wait: f64,
    /// Reading tokens or logits back and sampling.
    sample: f64,
    /// Tokens the device sampled (the rest were sampled on the host).
    device_sampled: usize,
    /// Calls to the executor's decode: one, or more when it refused the
    /// step's batch and each stream was decoded alone.
    decode_calls: usize,
    /// Rebuilding the KV cache with longer streams before the step.
    kv_rebuild: f64,
}

/// How a chat's output is read, shared by its completions.
struct ChatReading {
    syntax: cortex_chat::OutputSyntax,
    /// Control tokens kept as their text (the syntax's markers).
    kept: Vec<TokenId>,
}

/// One completion (one scheduler sequence).
struct Seq {
    owner: RequestId,
    index: u32,
    sampler: Sampler,
    /// Where its tokens are chosen: decided as it is taken in (whether it
    /// needs more than the argmax) and as it is bound (whether the device
    /// takes the argmax).
    sampled_at: SampledAt,
    utf8: Utf8Stream,
    stops: StopMatcher,
    stop_token_ids: Vec<TokenId>,
    ignore_eos: bool,
    text: String,
    tokens: Vec<TokenId>,
    /// Alternatives per position when the request asked for log
    /// probabilities, and those of each token sampled so far.
    top_logprobs: Option<usize>,
    logprobs: Vec<TokenLogprob>,
    /// For a request that scores its prompt: alternatives per position,
    /// and each prompt token's entry, filled in as its position's logits
    /// are computed.
    prompt_scores: Option<PromptScores>,
    /// The request asked for no new tokens (`max_tokens` 0, only with
    /// `prompt_scores`): the one token the loop draws to end the prompt's
    /// computation is dropped.
    generates_nothing: bool,
    /// For a chat: how its text is read (thinking, calls) when it ends.
    reading: Option<Arc<ChatReading>>,
    /// For a chat read for thinking or calls: its text read as it comes.
    output: Option<cortex_chat::OutputStream>,
    /// Its thinking is left out (told neither as it comes nor at the end).
    omit_reasoning: bool,
    /// The request's grammar, in this completion's state.
    grammar: Option<Box<dyn TokenGrammar>>,
    /// The KV stream it runs in, while running.
    stream: Option<StreamId>,
    /// When it last computed anything (or was first bound).
    last_progress: Instant,
    /// Whether it computed anything since it was last bound: a request that is
    /// bound again and again without progress (executor out of KV each time)
    /// keeps its old clock and times out.
    progressed_since_bind: bool,
}

/// A prompt's tokens with their log probabilities (see
/// [`cortex_request::Request::prompt_logprobs`]).
struct PromptScores {
    top: usize,
    tokens: Vec<PromptToken>,
}

pub(crate) struct StepLoop<'b> {
    // The model and its KV: the executor, the scheduler's plan and block
    // accounting, the streams sequences run in, and how they are sized.
    executor: Box<dyn Executor + Send + 'b>,
    sched: Scheduler,
    streams: Streams,
    sizing: Sizing,
    info: EngineInfo,
    /// The decode threads, adapted to the cores other processes leave free.
    threads: Option<ThreadGovernor>,
    // The handle's side: commands in, what both read, whether to stop.
    commands: flume::Receiver<Command>,
    shared: Arc<Shared>,
    draining: bool,
    // Requests in flight: each request, its completions, embedding requests
    // waiting for a decode, completions waiting for longer streams.
    live: HashMap<RequestId, Live>,
    seqs: HashMap<RequestId, Seq>,
    /// Embedding requests, in arrival order.
    embeds: VecDeque<embed::PendingEmbed>,
    /// Completions whose prompt plus generation exceed the streams' cells:
    /// they enter the scheduler once the streams have grown.
    oversize: Vec<SchedRequest>,
    next_seq: u64,
    timeout: Option<Duration>,
    /// Idle streams a step fills at most per gap between running ones
    /// ([`EngineConfig::gap_fill`]).
    gap_fill: usize,
    /// Whether a step's prompt chunks are cut to one length where that
    /// takes fewer micro-batches per token ([`EngineConfig::even_chunks`]).
    even_chunks: bool,
    /// Tokens a decode call may hold ([`EngineConfig::decode_tokens`]):
    /// fillers go only where they fit.
    decode_tokens: usize,
    /// Whether every decoding step spans all streams, idle ones filled with
    /// a token whose logits are computed ([`EngineConfig::steady_steps`]).
    steady: bool,
    // What is measured and watched.
    tally: Tally,
    timeline: Timeline,
    /// Where the current step's time went.
    step_times: StepTimes,
    /// Scratch: each sampled row's logits, reused between steps.
    logits: Vec<Vec<f32>>,
    /// Events made since the last delivery.
    outbox: Outbox,
    /// When the statistics were last published.
    stats_published: Instant,
}

/// How stale a busy loop's published statistics may grow (a request's end
/// and going idle publish them at once).
const STATS_EVERY: Duration = Duration::from_millis(50);

impl<'b> StepLoop<'b> {
    pub(crate) fn new(
        mut executor: Box<dyn Executor + Send + 'b>,
        config: &EngineConfig,
        commands: flume::Receiver<Command>,
        shared: Arc<Shared>,
        observer: Option<Box<dyn StepObserver>>,
    ) -> Result<Self, EngineError> {
        // `config` is one loop's, sized for the device (`EngineConfig::per_loop`).
        let sizing = Sizing::new(config, executor.as_ref())?;
        let layout = sizing.layout(sizing.initial_capacity());
        // The executor's first context: an error here (memory) stops the start.
        executor
            .set_kv_layout(layout)
            .map_err(|e| EngineError::Model(e.to_string()))?;
        let layout = executor.kv_layout();
        let sched = Scheduler::new(sizing.sched_config(layout))
            .map_err(|e| EngineError::Model(e.to_string()))?;
        let info = EngineInfo {
            n_vocab: executor.n_vocab(),
            n_ctx_train: executor.n_ctx_train(),
            max_sequence_tokens: sizing.max_sequence_tokens(),
            parallel: config.parallel.max(1),
            step_loops: 1,
        };
        Ok(Self {
            streams: Streams::new(layout.streams, layout.capacity, sizing.block_size()),
            executor,
            sched,
            sizing,
            threads: config.adaptive_threads().map(ThreadGovernor::new),
            info,
            timeout: config.request_timeout,
            gap_fill: config.gap_fill.unwrap_or(EngineConfig::CPU_GAP_FILL),
            even_chunks: config.even_chunks.unwrap_or(EngineConfig::CPU_EVEN_CHUNKS),
            decode_tokens: config.decode_tokens(),
            steady: config.steady_steps > 0,
            commands,
            shared,
            live: HashMap::new(),
            seqs: HashMap::new(),
            embeds: VecDeque::new(),
            oversize: Vec::new(),
            next_seq: 0,
            draining: false,
            tally: Tally::new(config.adaptive_threads().unwrap_or(0)),
            timeline: Timeline::new(observer, config.micro_batch_tokens()),
            step_times: StepTimes::default(),
            logits: Vec::new(),
            outbox: Outbox::default(),
            stats_published: Instant::now(),
        })
    }

    pub(crate) fn info(&self) -> EngineInfo {
        self.info
    }

    /// Runs the loop; a panic inside it fails every request in hand with the
    /// panic's message and marks the engine dead instead of leaving them hanging.
    pub(crate) fn run_guarded(&mut self) {
        if let Err(panic) = std::panic::catch_unwind(AssertUnwindSafe(|| self.run())) {
            self.die(panic_message(panic.as_ref()));
        }
    }

    fn run(&mut self) {
        loop {
            if !self.receive_commands() {
                break;
            }
            if !self.has_work() {
                if self.draining {
                    break;
                }
                continue;
            }
            self.check_timeouts();
            self.adapt_threads();
            let started = Instant::now();
            if self.has_generation_work() {
                self.step();
            }
            if !self.embeds.is_empty() {
                self.embed_step();
            }
            self.tally.busy_for(started.elapsed().as_secs_f64());
            self.deliver(false);
        }
        self.deliver(true);
    }

    /// Hands over the events that are due (all of them when `everything`:
    /// the loop is about to wait or stop). The statistics are published
    /// first when a request's end is among them, so whoever hears of an end
    /// sees it counted, when the loop waits, and otherwise every
    /// [`STATS_EVERY`]: reading the KV's figures walks all its blocks, which
    /// on a GPU's large cache costs more than a short step's host work.
    fn deliver(&mut self, everything: bool) {
        if everything || self.outbox.holds_end() || self.stats_published.elapsed() >= STATS_EVERY {
            self.publish_stats();
            self.stats_published = Instant::now();
        }
        self.outbox.flush(everything);
    }

    /// Decodes with the cores other processes leave free (see `threads`).
    fn adapt_threads(&mut self) {
        let Some(governor) = &mut self.threads else {
            return;
        };
        if let Some(threads) = governor.tick(Instant::now()) {
            tracing::info!(
                threads,
                "decoding with {threads} thread(s): other processes use the rest"
            );
            self.executor.set_threads(threads);
            self.tally.threads(threads);
        }
    }

    fn has_work(&self) -> bool {
        self.has_generation_work() || !self.embeds.is_empty()
    }

    fn has_generation_work(&self) -> bool {
        self.sched.has_work() || !self.oversize.is_empty()
    }

    /// One step: plan, bind KV, decode, sample, emit.
    fn step(&mut self) {
        let started = Instant::now();
        self.step_times = StepTimes::default();
        if !self.oversize.is_empty() {
            self.grow_streams();
            self.step_times.kv_rebuild = started.elapsed().as_secs_f64();
        }
        let mut plan = self.sched.schedule();
        let step = self.tally.step();
        let mut record = self.timeline.begin(step, started, &plan);
        for &id in &plan.preempted {
            self.tally.preempted();
            self.unbind(id);
        }
        self.drop_evicted();
        self.bind_admitted(&plan);
        if !plan.is_empty() {
            let (
                StepBatch {
                    tokens: batch,
                    rows,
                    fillers,
                },
                chunks_evened,
            ) = self.build_even_batch(&mut plan);
            if let Some(record) = &mut record {
                record.prefill_tokens = plan.prefill.iter().map(|c| c.len).sum();
                record.generated_tokens = plan.num_samples();
                record.chunks_evened = chunks_evened;
                (
                    record.streams,
                    record.kv_cells_used,
                    record.kv_cells_attended,
                ) = attention_span(&batch);
                record.micro_batches = self.timeline.micro_batches(&batch);
                record.gap_fillers = fillers.len();
            }
            let reused_before = record.as_ref().map(|_| self.executor.graphs_reused());
            let sampled = self.decode(&batch, &rows);
            if let (Some(record), Some(before)) = (&mut record, reused_before) {
                let reused = self.executor.graphs_reused().saturating_sub(before);
                record.graphs_reused = usize::try_from(reused).unwrap_or(usize::MAX);
            }
            for &(stream, pos) in &fillers {
                self.streams.truncate(stream, pos, self.executor.as_mut());
            }
            self.tally
                .prefilled(plan.prefill.iter().map(|c| c.len as u64).sum::<u64>());
            self.record_computed(&plan);
            let finished_by_length = self.sched.commit(&plan, &sampled);
            for (seq, token) in sampled {
                let at_length = finished_by_length.contains(&seq);
                self.on_token(seq, token, at_length);
            }
        }
        #[cfg(debug_assertions)]
        self.verify_kv();
        self.timeline.end(record, started, self.step_times);
    }

    /// Binds the plan's admissions to streams, copying in reused prefixes.
    fn bind_admitted(&mut self, plan: &StepPlan) {
        if plan.admitted.is_empty() {
            return;
        }
        let block_size = self.sizing.block_size();
        // Longest first chunk first: the streams of a step's full chunks
        // then sit side by side, not parted by a shorter one's, which ends
        // a micro-batch sooner (the binding keeps this order among
        // admissions that reuse as much).
        let first_chunk: HashMap<RequestId, usize> =
            plan.prefill.iter().map(|c| (c.id, c.len)).collect();
        let mut admitted: Vec<&Admission> = plan.admitted.iter().collect();
        admitted.sort_by_key(|a| std::cmp::Reverse(first_chunk.get(&a.id).copied()));
        let admissions = admitted
            .into_iter()
            .map(|a| ToBind {
                seq: a.id,
                reused: self
                    .sched
                    .kv()
                    .blocks_of(a.id.0)
                    .map(|b| b[..a.cached_tokens / block_size].to_vec())
                    .unwrap_or_default(),
            })
            .collect();
        let mut orphans = Vec::new();
        let bound = self.streams.bind_all(
            admissions,
            self.sched.kv(),
            self.executor.as_mut(),
            &mut orphans,
        );
        self.evict(&orphans);
        let now = Instant::now();
        for (id, stream, binding) in bound {
            let cached = plan
                .admitted
                .iter()
                .find(|a| a.id == id)
                .map_or(0, |a| a.cached_tokens);
            self.tally.bound(binding, cached);
            let seq = self.seqs.get_mut(&id).expect("admitted sequences exist");
            seq.stream = Some(stream);
            let argmax_only = seq.sampled_at != SampledAt::HostSampler;
            seq.sampled_at = match self.executor.sample_on_device(stream, argmax_only) {
                true => SampledAt::Device,
                false if argmax_only => SampledAt::HostArgmax,
                false => SampledAt::HostSampler,
            };
            if seq.progressed_since_bind {
                seq.last_progress = now;
            }
            seq.progressed_since_bind = false;
            let live = self.live.get_mut(&seq.owner).expect("owners exist");
            live.started.get_or_insert(now);
            if seq.index.is_multiple_of(live.n) && seq.tokens.is_empty() {
                let prompt = (seq.index / live.n) as usize;
                live.cached_prompt_tokens[prompt] = cached.min(live.prompt_tokens[prompt]);
            }
        }
    }

    /// Takes a sequence's stream away (finished, failed, cancelled,
    /// preempted), after the accounting has released its blocks.
    fn unbind(&mut self, id: RequestId) {
        let Some(stream) = self.seqs.get_mut(&id).and_then(|s| s.stream.take()) else {
            return;
        };
        let mut orphans = Vec::new();
        self.streams.release(
            stream,
            self.sched.kv(),
            self.executor.as_mut(),
            &mut orphans,
        );
        self.evict(&orphans);
    }

    /// Drops the cells of blocks the accounting evicted.
    fn drop_evicted(&mut self) {
        let mut orphans = Vec::new();
        for block in self.sched.drain_evicted() {
            self.streams
                .evicted(block, self.executor.as_mut(), &mut orphans);
        }
        self.evict(&orphans);
    }

    /// Evicts cached blocks whose cells no stream holds any more.
    fn evict(&mut self, orphans: &[BlockId]) {
        for &block in orphans {
            self.sched.evict_cached(block);
        }
    }

    #[cfg(debug_assertions)]
    fn verify_kv(&self) {
        let kv = self.sched.kv();
        let table = |seq: RequestId| kv.blocks_of(seq.0);
        if let Err(problem) = self.streams.verify(kv, table) {
            panic!("KV binding invariant broken: {problem}");
        }
    }

    /// The loop died: every request in hand and every command not yet read
    /// fails with the reason, and the engine reports itself dead.
    fn die(&mut self, message: String) {
        // Dead before anyone hears of it: a caller woken by a failure sees it.
        self.shared
            .accepting
            .store(false, std::sync::atomic::Ordering::SeqCst);
        self.shared.set_health(EngineHealth::Died(message.clone()));
        let error = EngineError::Died(message);
        let ids: Vec<RequestId> = self.live.keys().copied().collect();
        for id in ids {
            if let Some(live) = self.live.remove(&id) {
                self.report_end(
                    &live.events,
                    EngineEvent::Failed {
                        id,
                        error: error.clone(),
                    },
                );
            }
        }
        self.fail_embeddings(&error);
        self.refuse_pending(&error);
        self.deliver(true);
    }
}

/// The KV a batch's attention reads: the streams it writes to, the cells
/// they hold after it, and the cells llama.cpp spans (each of those streams
/// as long as the longest, in 256-cell granules).
fn attention_span(batch: &[BatchToken]) -> (usize, usize, usize) {
    let mut ends: HashMap<StreamId, usize> = HashMap::new();
    for token in batch {
        let end = ends.entry(token.stream).or_insert(0);
        *end = (*end).max(token.pos + 1);
    }
    let used: usize = ends.values().sum();
    let longest = ends.values().copied().max().unwrap_or(0);
    (
        ends.len(),
        used,
        ends.len() * longest.next_multiple_of(sizing::GRANULE),
    )
}
