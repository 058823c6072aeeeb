//! The engine handle and its step loop (on a thread of its own).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cortex_kv::BlockState;
use cortex_request::{
    Completion, FinishReason, Limits, Prompt, Request, RequestId, Response, Timings, TokenId, Usage,
};
use cortex_sample::{BatchRow, Sampler, sample_batch};
use cortex_sched::{SchedConfig, SchedError, SchedRequest, Scheduler, StepPlan};

use crate::backend::{Backend, BackendError, BatchToken, SeqSlot};
use crate::config::EngineConfig;
use crate::error::EngineError;
use crate::events::{EngineEvent, EngineStats};
use crate::llama::{ContextConfig, LlamaEngineBackend, Model};
use crate::slots::Slots;
use crate::text::{StopMatcher, StopScan, Utf8Stream};

/// How to stop an engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shutdown {
    /// Refuse new requests, finish the ones in hand, then stop.
    Drain,
    /// Cancel everything in hand (each gets a `cancelled` finish) and stop.
    Abort,
}

enum Command {
    Submit {
        request: Request,
        events: flume::Sender<EngineEvent>,
    },
    SubmitMany(Vec<(Request, flume::Sender<EngineEvent>)>),
    Cancel(RequestId),
    Shutdown(Shutdown),
}

/// What the engine learned about its model and context at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineInfo {
    /// Entries in a row of logits.
    pub n_vocab: usize,
    /// The model's training context.
    pub n_ctx_train: usize,
    /// Tokens the KV cache holds.
    pub kv_tokens: usize,
    /// Longest sequence (prompt plus generation) a request may have.
    pub max_sequence_tokens: usize,
    /// Sequences running at once at most.
    pub max_running: usize,
}

struct Shared {
    stats: Mutex<EngineStats>,
    in_flight: AtomicUsize,
    accepting: AtomicBool,
}

/// A running engine: a step loop on its own thread, driven over channels.
///
/// Submit a [`Request`] and receive its [`EngineEvent`]s; cancel at any time;
/// read [`EngineStats`]; ask [`Engine::available_slots`] to keep it full;
/// [`Engine::shutdown`] draining or aborting. Dropping it aborts.
pub struct Engine {
    commands: flume::Sender<Command>,
    shared: Arc<Shared>,
    info: EngineInfo,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

/// Settings of the step loop that do not depend on the backend.
#[derive(Debug, Clone, PartialEq)]
pub struct LoopConfig {
    /// Tokens per KV block.
    pub block_size: usize,
    /// Sequences running at once at most.
    pub max_running: usize,
    /// Tokens per decode call at most.
    pub max_batch_tokens: usize,
    /// Share KV of common prompt prefixes.
    pub prefix_sharing: bool,
    /// Fail running requests that make no progress for this long.
    pub request_timeout: Option<Duration>,
}

impl From<&EngineConfig> for LoopConfig {
    fn from(c: &EngineConfig) -> Self {
        Self {
            block_size: c.block_size,
            max_running: c.max_running,
            max_batch_tokens: c.max_batch_tokens,
            prefix_sharing: c.prefix_sharing,
            request_timeout: c.request_timeout,
        }
    }
}

impl Engine {
    /// Loads the model with llama.cpp and starts the loop. Returns once the
    /// model is loaded, or with the reason it could not be.
    pub fn start(config: &EngineConfig) -> Result<Self, EngineError> {
        let loop_config = LoopConfig::from(config);
        let sequences = (config.max_running * 2).clamp(1, 256);
        let context = ContextConfig {
            kv_tokens: config.kv_tokens,
            sequences,
            max_batch_tokens: config.max_batch_tokens,
            threads: config.effective_threads(),
        };
        let path = config.model.clone();
        Self::spawn(loop_config, move |run| {
            let model = Model::load(&path)?;
            let backend = LlamaEngineBackend::new(&model, context, &path)?;
            run(Box::new(backend));
            Ok(())
        })
    }

    /// Starts the loop over a backend made by `make` on the engine thread
    /// (tests use this to run the loop over a fake backend).
    pub fn start_with_backend<B, F>(config: LoopConfig, make: F) -> Result<Self, EngineError>
    where
        B: Backend,
        F: FnOnce() -> Result<B, EngineError> + Send + 'static,
    {
        Self::spawn(config, move |run| {
            let backend = make()?;
            run(Box::new(backend));
            Ok(())
        })
    }

    /// Spawns the engine thread. `body` builds a backend (borrowing whatever it
    /// loads on that thread) and hands it to the loop runner it is given.
    fn spawn<F>(config: LoopConfig, body: F) -> Result<Self, EngineError>
    where
        F: FnOnce(&mut dyn FnMut(Box<dyn Backend + '_>)) -> Result<(), EngineError>
            + Send
            + 'static,
    {
        let (commands, receiver) = flume::unbounded();
        let (ready_tx, ready_rx) = flume::bounded::<Result<EngineInfo, EngineError>>(1);
        let shared = Arc::new(Shared {
            stats: Mutex::new(EngineStats::default()),
            in_flight: AtomicUsize::new(0),
            accepting: AtomicBool::new(true),
        });
        let loop_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("cortex-engine".into())
            .spawn(move || {
                let ready_for_error = ready_tx.clone();
                let mut runner = |backend: Box<dyn Backend + '_>| match StepLoop::new(
                    backend,
                    &config,
                    receiver.clone(),
                    Arc::clone(&loop_shared),
                ) {
                    Ok(mut step_loop) => {
                        let _ = ready_tx.send(Ok(step_loop.info));
                        step_loop.run();
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                };
                if let Err(e) = body(&mut runner) {
                    let _ = ready_for_error.send(Err(e));
                }
            })
            .map_err(|e| EngineError::Model(format!("cannot start the engine thread: {e}")))?;
        match ready_rx.recv() {
            Ok(Ok(info)) => Ok(Self {
                commands,
                shared,
                info,
                thread: Some(thread),
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => {
                let _ = thread.join();
                Err(EngineError::Stopped)
            }
        }
    }

    /// Model and context facts.
    pub fn info(&self) -> EngineInfo {
        self.info
    }

    /// Submits a request; its events arrive on the returned receiver, ending
    /// with `Finished` or `Failed`.
    pub fn submit(&self, request: Request) -> Result<flume::Receiver<EngineEvent>, EngineError> {
        let (tx, rx) = flume::unbounded();
        self.submit_to(request, tx)?;
        Ok(rx)
    }

    /// Submits a request whose events go to `events` (one channel can serve
    /// many requests; events carry the request id).
    pub fn submit_to(
        &self,
        request: Request,
        events: flume::Sender<EngineEvent>,
    ) -> Result<(), EngineError> {
        if !self.shared.accepting.load(Ordering::SeqCst) {
            return Err(EngineError::Stopped);
        }
        self.shared.in_flight.fetch_add(1, Ordering::SeqCst);
        self.commands
            .send(Command::Submit { request, events })
            .map_err(|_| {
                self.shared.in_flight.fetch_sub(1, Ordering::SeqCst);
                EngineError::Stopped
            })
    }

    /// Submits several requests that reach the engine together, before its
    /// next step (so a batch is scheduled the same way every time).
    pub fn submit_many(
        &self,
        requests: Vec<Request>,
    ) -> Result<Vec<flume::Receiver<EngineEvent>>, EngineError> {
        let (pairs, receivers): (Vec<_>, Vec<_>) = requests
            .into_iter()
            .map(|request| {
                let (tx, rx) = flume::unbounded();
                ((request, tx), rx)
            })
            .unzip();
        self.send_many(pairs)?;
        Ok(receivers)
    }

    /// [`Engine::submit_many`] with every event going to one channel.
    pub fn submit_many_to(
        &self,
        requests: Vec<Request>,
        events: &flume::Sender<EngineEvent>,
    ) -> Result<(), EngineError> {
        self.send_many(requests.into_iter().map(|r| (r, events.clone())).collect())
    }

    fn send_many(
        &self,
        pairs: Vec<(Request, flume::Sender<EngineEvent>)>,
    ) -> Result<(), EngineError> {
        if !self.shared.accepting.load(Ordering::SeqCst) {
            return Err(EngineError::Stopped);
        }
        let count = pairs.len();
        self.shared.in_flight.fetch_add(count, Ordering::SeqCst);
        self.commands.send(Command::SubmitMany(pairs)).map_err(|_| {
            self.shared.in_flight.fetch_sub(count, Ordering::SeqCst);
            EngineError::Stopped
        })
    }

    /// Cancels a request wherever it is; it finishes with reason `cancelled`.
    /// Unknown ids are ignored (the request may have just finished).
    pub fn cancel(&self, id: RequestId) {
        let _ = self.commands.send(Command::Cancel(id));
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> EngineStats {
        *self
            .shared
            .stats
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Requests submitted and not yet ended.
    pub fn in_flight(&self) -> usize {
        self.shared.in_flight.load(Ordering::SeqCst)
    }

    /// How many more requests to submit now to keep the engine busy: enough
    /// to fill every running slot once more, so a waiting request is always at
    /// hand when one finishes.
    pub fn available_slots(&self) -> usize {
        (self.info.max_running * 2).saturating_sub(self.in_flight())
    }

    /// Stops the engine and waits for its thread.
    pub fn shutdown(mut self, mode: Shutdown) {
        self.stop(mode);
    }

    fn stop(&mut self, mode: Shutdown) {
        self.shared.accepting.store(false, Ordering::SeqCst);
        let _ = self.commands.send(Command::Shutdown(mode));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.stop(Shutdown::Abort);
    }
}

/// One request as the loop tracks it.
struct Live {
    events: flume::Sender<EngineEvent>,
    prompt_tokens: usize,
    cached_prompt_tokens: usize,
    completions: Vec<Option<Completion>>,
    seqs: Vec<RequestId>,
    submitted: Instant,
    started: Option<Instant>,
    first_token: Option<Instant>,
}

/// One completion (one scheduler sequence).
struct Seq {
    owner: RequestId,
    index: u32,
    sampler: Sampler,
    utf8: Utf8Stream,
    stops: StopMatcher,
    stop_token_ids: Vec<TokenId>,
    ignore_eos: bool,
    text: String,
    tokens: Vec<TokenId>,
    slot: Option<SeqSlot>,
    /// Leading full blocks whose cells this sequence's slot is recorded as holding.
    held_blocks: usize,
    /// When it last computed anything (or was first bound).
    last_progress: Instant,
    /// Whether it computed anything since it was last bound: a request that is
    /// bound again and again without progress (backend out of KV each time)
    /// keeps its old clock and times out.
    progressed_since_bind: bool,
}

struct StepLoop<'b> {
    backend: Box<dyn Backend + 'b>,
    sched: Scheduler,
    info: EngineInfo,
    block_size: usize,
    max_running: usize,
    timeout: Option<Duration>,
    commands: flume::Receiver<Command>,
    shared: Arc<Shared>,
    slots: Slots,
    live: HashMap<RequestId, Live>,
    seqs: HashMap<RequestId, Seq>,
    next_seq: u64,
    draining: bool,
    stats: EngineStats,
    ttft_sum: f64,
    latency_sum: f64,
    latency_count: u64,
    logits: Vec<Vec<f32>>,
}

/// A row of the batch that samples: which sequence, and where its logits are.
struct SampleRow {
    seq: RequestId,
    batch_index: usize,
}

impl<'b> StepLoop<'b> {
    fn new(
        backend: Box<dyn Backend + 'b>,
        config: &LoopConfig,
        commands: flume::Receiver<Command>,
        shared: Arc<Shared>,
    ) -> Result<Self, EngineError> {
        let block_size = config.block_size.max(1);
        let kv_tokens = backend.kv_capacity();
        let kv_blocks = kv_tokens / block_size;
        let max_sequence_tokens = backend.n_ctx_train().min(kv_blocks * block_size);
        // Every running sequence must fit one decode token into each step.
        let max_running = config
            .max_running
            .clamp(1, backend.max_sequences().max(2) / 2)
            .min(config.max_batch_tokens.max(1));
        let sched = Scheduler::new(SchedConfig {
            max_batch_tokens: config.max_batch_tokens,
            max_running,
            max_prefill_chunk: config.max_batch_tokens,
            kv_blocks,
            kv_block_size: block_size,
            admission_headroom_blocks: max_running.min(kv_blocks / 8),
            aging_steps: 64,
            prefix_window: 16,
            prefix_caching: config.prefix_sharing,
        })
        .map_err(|e| EngineError::Model(e.to_string()))?;
        let info = EngineInfo {
            n_vocab: backend.n_vocab(),
            n_ctx_train: backend.n_ctx_train(),
            kv_tokens,
            max_sequence_tokens,
            max_running,
        };
        let slots = Slots::new(backend.max_sequences());
        Ok(Self {
            backend,
            sched,
            info,
            block_size,
            max_running,
            timeout: config.request_timeout,
            commands,
            shared,
            slots,
            live: HashMap::new(),
            seqs: HashMap::new(),
            next_seq: 0,
            draining: false,
            stats: EngineStats::default(),
            ttft_sum: 0.0,
            latency_sum: 0.0,
            latency_count: 0,
            logits: Vec::new(),
        })
    }

    fn run(&mut self) {
        loop {
            if !self.receive_commands() {
                break;
            }
            if !self.sched.has_work() {
                if self.draining {
                    break;
                }
                continue;
            }
            self.check_timeouts();
            let started = Instant::now();
            self.step();
            self.stats.busy_seconds += started.elapsed().as_secs_f64();
            self.publish_stats();
        }
        self.publish_stats();
    }

    /// Handles pending commands, blocking when idle. Returns false to stop.
    fn receive_commands(&mut self) -> bool {
        loop {
            let command = if self.sched.has_work() || self.draining {
                match self.commands.try_recv() {
                    Ok(c) => c,
                    Err(flume::TryRecvError::Empty) => return true,
                    Err(flume::TryRecvError::Disconnected) => return self.sched.has_work(),
                }
            } else {
                // About to block: make the idle state visible first.
                self.publish_stats();
                match self.commands.recv() {
                    Ok(c) => c,
                    Err(_) => return false,
                }
            };
            match command {
                Command::Submit { request, events } => self.admit_request(&request, events),
                Command::SubmitMany(pairs) => {
                    for (request, events) in pairs {
                        self.admit_request(&request, events);
                    }
                }
                Command::Cancel(id) => self.cancel(id),
                Command::Shutdown(Shutdown::Drain) => self.draining = true,
                Command::Shutdown(Shutdown::Abort) => {
                    let ids: Vec<RequestId> = self.live.keys().copied().collect();
                    for id in ids {
                        self.cancel(id);
                    }
                    // Anything submitted meanwhile is refused.
                    while let Ok(command) = self.commands.try_recv() {
                        let refused = match command {
                            Command::Submit { request, events } => vec![(request, events)],
                            Command::SubmitMany(pairs) => pairs,
                            Command::Cancel(_) | Command::Shutdown(_) => Vec::new(),
                        };
                        for (request, events) in refused {
                            self.shared.in_flight.fetch_sub(1, Ordering::SeqCst);
                            let _ = events.send(EngineEvent::Failed {
                                id: request.id,
                                error: EngineError::Stopped,
                            });
                        }
                    }
                    return false;
                }
            }
        }
    }

    /// Validates, renders and tokenizes a request, then queues its completions.
    fn admit_request(&mut self, request: &Request, events: flume::Sender<EngineEvent>) {
        let id = request.id;
        let refuse = |this: &mut Self, error: EngineError| {
            this.shared.in_flight.fetch_sub(1, Ordering::SeqCst);
            this.stats.requests_finished += 1;
            this.stats.requests_failed += 1;
            let _ = events.send(EngineEvent::Failed { id, error });
        };
        if self.live.contains_key(&id) {
            return refuse(self, EngineError::DuplicateId(id));
        }
        if let Err(e) = request.validate(&Limits::default()) {
            return refuse(self, EngineError::invalid(id, &e));
        }
        let prompt = match self.tokenize_prompt(request) {
            Ok(tokens) => tokens,
            Err(e) => return refuse(self, e),
        };
        let limit = self.info.max_sequence_tokens;
        if prompt.len() >= limit {
            return refuse(
                self,
                EngineError::PromptTooLong {
                    id,
                    prompt_tokens: prompt.len(),
                    limit,
                },
            );
        }
        // Generation stops at the context's end: `length`, like max_tokens.
        let max_new = (request.stop.max_tokens as usize).min(limit - prompt.len());
        let now = Instant::now();
        let mut seqs = Vec::new();
        for index in 0..request.n {
            let seq_id = RequestId(self.next_seq);
            self.next_seq += 1;
            let added = self.sched.add(SchedRequest {
                id: seq_id,
                prompt: prompt.clone(),
                max_new_tokens: max_new,
                priority: request.priority,
            });
            if let Err(e) = added {
                for s in &seqs {
                    let _ = self.sched.abort(*s);
                    self.seqs.remove(s);
                }
                let error = match e {
                    SchedError::TooLong { .. } => EngineError::PromptTooLong {
                        id,
                        prompt_tokens: prompt.len(),
                        limit,
                    },
                    other => EngineError::Model(other.to_string()),
                };
                return refuse(self, error);
            }
            // Each completion has its own stream: seed + index, or one derived
            // from the request id, so runs repeat.
            let mut sampling = request.sampling.clone();
            sampling.seed = sampling.seed.map(|s| s.wrapping_add(u64::from(index)));
            let fallback =
                id.0.wrapping_mul(0x9E37_79B9_7F4A_7C15)
                    .wrapping_add(u64::from(index));
            self.seqs.insert(
                seq_id,
                Seq {
                    owner: id,
                    index,
                    sampler: Sampler::new(sampling, fallback),
                    utf8: Utf8Stream::default(),
                    stops: StopMatcher::new(request.stop.stop.clone()),
                    stop_token_ids: request.stop.stop_token_ids.clone(),
                    ignore_eos: request.stop.ignore_eos,
                    text: String::new(),
                    tokens: Vec::new(),
                    slot: None,
                    held_blocks: 0,
                    last_progress: now,
                    progressed_since_bind: true,
                },
            );
            seqs.push(seq_id);
        }
        self.stats.prompt_tokens += (prompt.len() * seqs.len()) as u64;
        self.live.insert(
            id,
            Live {
                events,
                prompt_tokens: prompt.len(),
                cached_prompt_tokens: 0,
                completions: vec![None; request.n as usize],
                seqs,
                submitted: now,
                started: None,
                first_token: None,
            },
        );
    }

    fn tokenize_prompt(&self, request: &Request) -> Result<Vec<TokenId>, EngineError> {
        let tokens = match &request.prompt {
            Prompt::Text(text) => self.backend.tokenize(text, true, true),
            Prompt::Tokens(tokens) => {
                let vocab = self.info.n_vocab;
                if let Some(bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
                    return Err(EngineError::Invalid {
                        id: request.id,
                        field: "prompt".into(),
                        message: format!("token id {bad} is outside the vocabulary of {vocab}"),
                    });
                }
                tokens.clone()
            }
            Prompt::Chat(messages) => {
                let text = self.backend.apply_chat_template(messages).map_err(|e| {
                    EngineError::Invalid {
                        id: request.id,
                        field: "messages".into(),
                        message: e.to_string(),
                    }
                })?;
                self.backend.tokenize(&text, true, true)
            }
        };
        if tokens.is_empty() {
            return Err(EngineError::Invalid {
                id: request.id,
                field: "prompt".into(),
                message: "the prompt has no tokens".into(),
            });
        }
        Ok(tokens)
    }

    /// One step: plan, bind KV, decode, sample, emit.
    fn step(&mut self) {
        self.reclaim_slots();
        let plan = self.sched.schedule();
        self.stats.steps += 1;
        for &id in &plan.preempted {
            self.stats.preemptions += 1;
            self.unbind(id);
        }
        self.drop_evicted();
        for admission in &plan.admitted {
            self.bind(admission.id, admission.cached_tokens);
        }
        if plan.is_empty() {
            return;
        }
        let (batch, rows) = self.build_batch(&plan);
        let sampled = self.decode(&batch, &rows);
        self.stats.prefill_tokens += plan.prefill.iter().map(|c| c.len as u64).sum::<u64>();
        let finished_by_length = self.sched.commit(&plan, &sampled);
        self.record_computed(&plan);
        for (seq, token) in sampled {
            let at_length = finished_by_length.contains(&seq);
            self.on_token(seq, token, at_length);
        }
    }

    /// Makes sure admissions find a free backend sequence: retired ones (kept
    /// only for their cached prefix blocks) give theirs up, oldest first.
    fn reclaim_slots(&mut self) {
        let wanted = self.max_running.saturating_sub(self.sched.num_running());
        while self.slots.free_count() < wanted {
            let Some(slot) = self.slots.oldest_retired() else {
                break;
            };
            for (block, _) in self.slots.held_by(slot) {
                if !self.slots.shared_elsewhere(block, slot) {
                    self.sched.evict_cached(block);
                }
                self.slots.release(slot, block);
            }
            self.backend.remove_sequence(slot, 0, None);
            self.slots.free_if_empty(slot);
        }
    }

    /// Drops the cells of blocks the accounting evicted.
    fn drop_evicted(&mut self) {
        for block in self.sched.drain_evicted() {
            if let Some((depth, holders)) = self.slots.forget_block(block) {
                for slot in holders {
                    let from = depth * self.block_size;
                    self.backend
                        .remove_sequence(slot, from, Some(from + self.block_size));
                    self.slots.free_if_empty(slot);
                }
            }
        }
    }

    /// Gives an admitted sequence a backend slot and copies in the KV of the
    /// prefix blocks it reuses.
    fn bind(&mut self, id: RequestId, cached_tokens: usize) {
        let slot = self
            .slots
            .take()
            .expect("reclaim_slots keeps a slot per admission");
        let reused = cached_tokens / self.block_size;
        let blocks: Vec<_> = self
            .sched
            .kv()
            .blocks_of(id.0)
            .map(|b| b[..reused].to_vec())
            .unwrap_or_default();
        for (depth, &block) in blocks.iter().enumerate() {
            let (source, _) = self
                .slots
                .holder_of(block)
                .expect("every cached block has cells somewhere");
            let from = depth * self.block_size;
            self.backend
                .copy_sequence(source, slot, from, from + self.block_size);
            self.slots.hold(slot, block, depth);
        }
        let seq = self.seqs.get_mut(&id).expect("admitted sequences exist");
        seq.slot = Some(slot);
        seq.held_blocks = reused;
        if seq.progressed_since_bind {
            seq.last_progress = Instant::now();
        }
        seq.progressed_since_bind = false;
        self.stats.prefill_tokens_saved += cached_tokens as u64;
        let live = self.live.get_mut(&seq.owner).expect("owners exist");
        live.started.get_or_insert_with(Instant::now);
        if seq.index == 0 && seq.tokens.is_empty() {
            live.cached_prompt_tokens = cached_tokens.min(live.prompt_tokens);
        }
    }

    /// Takes a sequence's slot away (finished, failed, cancelled, preempted),
    /// after the accounting has released it: cells of blocks the accounting
    /// keeps and no one else holds stay, the slot then retired; the rest go.
    fn unbind(&mut self, id: RequestId) {
        let Some(seq) = self.seqs.get_mut(&id) else {
            return;
        };
        let Some(slot) = seq.slot.take() else { return };
        seq.held_blocks = 0;
        let mut kept: Vec<usize> = Vec::new();
        for (block, depth) in self.slots.held_by(slot) {
            let live = matches!(
                self.sched.kv().block_state(block),
                Some(BlockState::Used | BlockState::Cached)
            );
            if live && !self.slots.shared_elsewhere(block, slot) {
                kept.push(depth);
            } else {
                self.slots.release(slot, block);
            }
        }
        kept.sort_unstable();
        let mut from = 0;
        for depth in kept {
            let start = depth * self.block_size;
            if start > from {
                self.backend.remove_sequence(slot, from, Some(start));
            }
            from = start + self.block_size;
        }
        self.backend.remove_sequence(slot, from, None);
        self.slots.park(slot);
    }

    fn build_batch(&self, plan: &StepPlan) -> (Vec<BatchToken>, Vec<SampleRow>) {
        let mut batch = Vec::with_capacity(plan.num_tokens());
        let mut rows = Vec::with_capacity(plan.num_samples());
        for &id in &plan.decode {
            let tokens = self.sched.tokens(id).expect("planned sequences exist");
            let slot = self.seqs[&id].slot.expect("running sequences are bound");
            rows.push(SampleRow {
                seq: id,
                batch_index: batch.len(),
            });
            batch.push(BatchToken {
                token: tokens[tokens.len() - 1],
                pos: tokens.len() - 1,
                seq: slot,
                logits: true,
            });
        }
        for chunk in &plan.prefill {
            let tokens = self
                .sched
                .tokens(chunk.id)
                .expect("planned sequences exist");
            let slot = self.seqs[&chunk.id]
                .slot
                .expect("running sequences are bound");
            let end = chunk.start + chunk.len;
            for (pos, &token) in tokens.iter().enumerate().take(end).skip(chunk.start) {
                let logits = chunk.samples && pos + 1 == end;
                if logits {
                    rows.push(SampleRow {
                        seq: chunk.id,
                        batch_index: batch.len(),
                    });
                }
                batch.push(BatchToken {
                    token,
                    pos,
                    seq: slot,
                    logits,
                });
            }
        }
        (batch, rows)
    }

    /// Decodes the batch and samples every row. A backend failure is isolated:
    /// each sequence is retried alone; one that still finds no KV slot is
    /// preempted (recomputed later, timing out if that never succeeds), one that
    /// fails otherwise fails. The rest of the step goes on.
    fn decode(&mut self, batch: &[BatchToken], rows: &[SampleRow]) -> Vec<(RequestId, TokenId)> {
        let started = Instant::now();
        let decoded = self.backend.decode(batch);
        self.stats.decode_seconds += started.elapsed().as_secs_f64();
        match decoded {
            Ok(()) => {
                self.copy_logits(rows, |row| row.batch_index);
                self.sample(rows)
            }
            Err(error) => {
                self.forget_batch_kv(batch);
                self.decode_one_by_one(batch, rows, &error)
            }
        }
    }

    fn decode_one_by_one(
        &mut self,
        batch: &[BatchToken],
        rows: &[SampleRow],
        first_error: &BackendError,
    ) -> Vec<(RequestId, TokenId)> {
        let mut sampled = Vec::new();
        let mut slots: Vec<SeqSlot> = batch.iter().map(|t| t.seq).collect();
        slots.sort_unstable();
        slots.dedup();
        // A batch of one sequence has already failed alone.
        let alone = slots.len() == 1;
        for slot in slots {
            let part: Vec<BatchToken> = batch.iter().copied().filter(|t| t.seq == slot).collect();
            let seq_rows: Vec<&SampleRow> = rows
                .iter()
                .filter(|r| batch[r.batch_index].seq == slot)
                .collect();
            let found = self
                .seqs
                .iter()
                .find(|(_, s)| s.slot == Some(slot))
                .map(|(id, s)| (*id, s.owner));
            let Some((seq_id, owner)) = found else {
                continue;
            };
            let result = if alone {
                Err(first_error.clone())
            } else {
                self.backend.decode(&part)
            };
            match result {
                Ok(()) => {
                    // Logits now sit at the row's index within `part`.
                    let local: Vec<SampleRow> = seq_rows
                        .iter()
                        .map(|r| SampleRow {
                            seq: r.seq,
                            batch_index: part
                                .iter()
                                .position(|t| t.pos == batch[r.batch_index].pos)
                                .unwrap_or(0),
                        })
                        .collect();
                    self.copy_logits(&local, |row| row.batch_index);
                    sampled.extend(self.sample(&local));
                }
                Err(BackendError::NoKvSlot) => {
                    self.forget_batch_kv(&part);
                    if self.sched.preempt(seq_id).is_ok() {
                        self.stats.preemptions += 1;
                        self.unbind(seq_id);
                    }
                }
                Err(error) => {
                    self.forget_batch_kv(&part);
                    self.fail_request(owner, EngineError::backend(owner, &error));
                }
            }
        }
        sampled
    }

    /// Removes whatever the backend may have written for the batch's positions.
    fn forget_batch_kv(&mut self, batch: &[BatchToken]) {
        let mut first: HashMap<SeqSlot, usize> = HashMap::new();
        for t in batch {
            let p = first.entry(t.seq).or_insert(t.pos);
            *p = (*p).min(t.pos);
        }
        for (slot, from) in first {
            self.backend.remove_sequence(slot, from, None);
        }
    }

    fn copy_logits(&mut self, rows: &[SampleRow], index: impl Fn(&SampleRow) -> usize) {
        while self.logits.len() < rows.len() {
            self.logits.push(Vec::new());
        }
        for (buffer, row) in self.logits.iter_mut().zip(rows) {
            let logits = self.backend.logits(index(row));
            buffer.clear();
            buffer.extend_from_slice(logits);
        }
    }

    /// Samples each row from the logits copied for it, in parallel.
    fn sample(&mut self, rows: &[SampleRow]) -> Vec<(RequestId, TokenId)> {
        let order: HashMap<RequestId, usize> =
            rows.iter().enumerate().map(|(i, r)| (r.seq, i)).collect();
        let mut samplers: Vec<(usize, &mut Sampler)> = self
            .seqs
            .iter_mut()
            .filter_map(|(id, seq)| order.get(id).map(|&i| (i, &mut seq.sampler)))
            .collect();
        samplers.sort_unstable_by_key(|(i, _)| *i);
        let mut batch: Vec<BatchRow<'_>> = samplers
            .into_iter()
            .zip(self.logits.iter_mut())
            .map(|((i, sampler), logits)| BatchRow {
                sampler,
                logits: logits.as_mut_slice(),
                history: self.sched.tokens(rows[i].seq).unwrap_or(&[]),
            })
            .collect();
        let tokens = sample_batch(&mut batch);
        rows.iter().map(|r| r.seq).zip(tokens).collect()
    }

    /// Records the full blocks the step computed as held by their sequence's slot.
    fn record_computed(&mut self, plan: &StepPlan) {
        let ids = plan
            .decode
            .iter()
            .copied()
            .chain(plan.prefill.iter().map(|c| c.id));
        let now = Instant::now();
        for id in ids {
            // Gone (failed) or unbound (preempted when its part of the batch
            // failed): it computed nothing.
            let Some(seq) = self.seqs.get_mut(&id).filter(|s| s.slot.is_some()) else {
                continue;
            };
            seq.last_progress = now;
            seq.progressed_since_bind = true;
            let (Some(slot), Some((_, computed)), Some(blocks)) = (
                seq.slot,
                self.sched.kv().tokens_of(id.0),
                self.sched.kv().blocks_of(id.0),
            ) else {
                continue;
            };
            let full = computed / self.block_size;
            for (depth, &block) in blocks.iter().enumerate().take(full).skip(seq.held_blocks) {
                self.slots.hold(slot, block, depth);
            }
            seq.held_blocks = seq.held_blocks.max(full);
        }
    }

    /// Applies stop conditions to a sampled token and streams its text.
    fn on_token(&mut self, id: RequestId, token: TokenId, at_length: bool) {
        let Some(seq) = self.seqs.get_mut(&id) else {
            return;
        };
        let owner = seq.owner;
        self.stats.generated_tokens += 1;
        seq.tokens.push(token);
        let is_end = !seq.ignore_eos && self.backend.is_end_of_generation(token);
        let is_stop_token = seq.stop_token_ids.contains(&token);
        let mut finish = if is_end {
            Some(FinishReason::Eos)
        } else if is_stop_token {
            Some(FinishReason::Stop)
        } else {
            None
        };
        let mut delta = String::new();
        if finish.is_none() {
            let text = seq.utf8.push(&self.backend.token_bytes(token));
            match seq.stops.push(&text) {
                StopScan::Continue(released) => delta = released,
                StopScan::Stopped(released) => {
                    delta = released;
                    finish = Some(FinishReason::Stop);
                }
            }
        }
        if finish.is_none() && at_length {
            finish = Some(FinishReason::Length);
        }
        if matches!(finish, Some(FinishReason::Eos | FinishReason::Length)) {
            // Nothing more can complete a character or a stop string.
            let tail = seq.utf8.finish();
            delta.push_str(&seq.stops.push(&tail).into_text());
            delta.push_str(&seq.stops.finish());
        }
        seq.text.push_str(&delta);
        let index = seq.index;
        if let Some(live) = self.live.get_mut(&owner) {
            live.first_token.get_or_insert_with(Instant::now);
            let _ = live.events.send(EngineEvent::Token {
                id: owner,
                index,
                token,
                text: delta,
            });
        }
        if let Some(reason) = finish {
            self.finish_seq(id, reason, !at_length);
        }
    }

    /// Ends one completion; ends its request when it was the last.
    fn finish_seq(&mut self, id: RequestId, reason: FinishReason, still_scheduled: bool) {
        // The accounting releases first, so unbinding sees which blocks stay.
        if still_scheduled {
            let _ = self.sched.finish(id);
        }
        self.unbind(id);
        let Some(seq) = self.seqs.remove(&id) else {
            return;
        };
        let Some(live) = self.live.get_mut(&seq.owner) else {
            return;
        };
        live.completions[seq.index as usize] = Some(Completion {
            index: seq.index,
            text: seq.text,
            tokens: seq.tokens,
            finish_reason: reason,
        });
        if live.completions.iter().all(Option::is_some) {
            self.finish_request(seq.owner);
        }
    }

    fn finish_request(&mut self, id: RequestId) {
        let Some(live) = self.live.remove(&id) else {
            return;
        };
        let now = Instant::now();
        let completions: Vec<Completion> = live.completions.into_iter().flatten().collect();
        let completion_tokens: usize = completions.iter().map(|c| c.tokens.len()).sum();
        let timings = Timings {
            queued: live.started.unwrap_or(now).duration_since(live.submitted),
            first_token: live.first_token.map(|t| t.duration_since(live.submitted)),
            finished: now.duration_since(live.submitted),
        };
        if let Some(ttft) = timings.first_token {
            self.ttft_sum += ttft.as_secs_f64();
        }
        self.latency_sum += timings.finished.as_secs_f64();
        self.latency_count += 1;
        let response = Response {
            id,
            completions,
            usage: Usage {
                prompt_tokens: live.prompt_tokens as u32,
                completion_tokens: completion_tokens as u32,
                cached_prompt_tokens: live.cached_prompt_tokens as u32,
            },
            timings,
        };
        self.stats.requests_finished += 1;
        self.shared.in_flight.fetch_sub(1, Ordering::SeqCst);
        let _ = live.events.send(EngineEvent::Finished(response));
    }

    /// Fails a whole request (every completion), releasing its KV.
    fn fail_request(&mut self, id: RequestId, error: EngineError) {
        let Some(live) = self.live.remove(&id) else {
            return;
        };
        for seq in &live.seqs {
            let _ = self.sched.abort(*seq);
            self.unbind(*seq);
            self.seqs.remove(seq);
        }
        self.stats.requests_finished += 1;
        self.stats.requests_failed += 1;
        self.shared.in_flight.fetch_sub(1, Ordering::SeqCst);
        let _ = live.events.send(EngineEvent::Failed { id, error });
    }

    /// Ends a request with reason `cancelled`, keeping the text generated so far.
    fn cancel(&mut self, id: RequestId) {
        let Some(live) = self.live.get(&id) else {
            return;
        };
        let open: Vec<RequestId> = live
            .seqs
            .iter()
            .copied()
            .filter(|s| self.seqs.contains_key(s))
            .collect();
        for seq in open {
            if let Some(s) = self.seqs.get_mut(&seq) {
                let tail = s.stops.finish();
                s.text.push_str(&tail);
            }
            self.finish_seq(seq, FinishReason::Cancelled, true);
        }
    }

    fn check_timeouts(&mut self) {
        let Some(limit) = self.timeout else { return };
        let now = Instant::now();
        let stalled: Vec<(RequestId, u64)> = self
            .seqs
            .values()
            // Running, or sent back to the queue without having computed
            // anything since it was admitted: either way, stuck.
            .filter(|s| {
                (s.slot.is_some() || !s.progressed_since_bind)
                    && now.duration_since(s.last_progress) > limit
            })
            .map(|s| (s.owner, now.duration_since(s.last_progress).as_secs()))
            .collect();
        for (owner, seconds) in stalled {
            self.fail_request(owner, EngineError::Timeout { id: owner, seconds });
        }
    }

    fn publish_stats(&mut self) {
        let kv = self.sched.kv_stats();
        self.stats.waiting = self.sched.num_waiting();
        self.stats.running = self.sched.num_running();
        self.stats.kv_utilisation = kv.utilisation;
        if self.stats.busy_seconds > 0.0 {
            self.stats.generated_tokens_per_second =
                self.stats.generated_tokens as f64 / self.stats.busy_seconds;
        }
        if self.latency_count > 0 {
            self.stats.mean_time_to_first_token = self.ttft_sum / self.latency_count as f64;
            self.stats.mean_latency = self.latency_sum / self.latency_count as f64;
        }
        *self
            .shared
            .stats
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = self.stats;
    }
}

impl StopScan {
    fn into_text(self) -> String {
        match self {
            StopScan::Continue(text) | StopScan::Stopped(text) => text,
        }
    }
}
