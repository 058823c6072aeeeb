//! The scheduler: admission, prefill chunking, preemption, priorities and prefix reuse.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use cortex_kv::{KvCache, KvError, KvStats};
use cortex_request::{CacheScope, RequestId, TokenId};

use crate::plan::{Admission, AdmissionStop, PrefillChunk, StepPlan};

/// Limits and policies of a [`Scheduler`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchedConfig {
    /// Tokens computed per step at most (decode tokens plus prefill chunks).
    pub max_batch_tokens: usize,
    /// Sequences running at once at most.
    pub max_running: usize,
    /// Longest prefill chunk of one request in one step.
    pub max_prefill_chunk: usize,
    /// Blocks in the KV pool.
    pub kv_blocks: usize,
    /// Tokens per KV block.
    pub kv_block_size: usize,
    /// Free blocks a request must leave after its prompt to be admitted, so
    /// running requests have room to decode before anyone is preempted.
    pub admission_headroom_blocks: usize,
    /// A waiting request gains one priority level per this many steps waited.
    pub aging_steps: u64,
    /// How many waiting requests of the head's priority are examined for a
    /// cached prefix when choosing whom to admit.
    pub prefix_window: usize,
    /// Reuse KV of shared prompt prefixes (off: every prompt is computed whole).
    pub prefix_caching: bool,
    /// When every sequence slot is taken, a waiting request whose priority
    /// exceeds the lowest running one's by at least this much preempts it
    /// (recomputed later; it waits again by its own priority). `None`:
    /// running requests are never preempted for priority (only for KV).
    pub priority_preemption_gap: Option<i32>,
    /// Waiting requests join only on every `admit_every`-th step while
    /// others run (at once when nothing runs). Between joins every step
    /// decodes the same sequences, so a batch of one shape repeats, which a
    /// GPU can replay instead of launching its work again; a slot that
    /// frees waits at most `admit_every - 1` steps. 1: joins on every step.
    pub admit_every: u64,
}

impl Default for SchedConfig {
    fn default() -> Self {
        Self {
            max_batch_tokens: 512,
            max_running: 64,
            max_prefill_chunk: 512,
            kv_blocks: 256,
            kv_block_size: 16,
            admission_headroom_blocks: 1,
            aging_steps: 64,
            prefix_window: 16,
            prefix_caching: true,
            priority_preemption_gap: None,
            admit_every: 1,
        }
    }
}

/// A request as the scheduler sees it: tokens, a length limit and a priority.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchedRequest {
    /// Its id, unique among the scheduler's requests.
    pub id: RequestId,
    /// The prompt's tokens (at least one).
    pub prompt: Vec<TokenId>,
    /// Tokens to generate at most.
    pub max_new_tokens: usize,
    /// Higher is served first.
    pub priority: i32,
    /// Whose cached prompt prefixes it may reuse (see
    /// [`cortex_request::Request::cache_scope`]).
    pub cache_scope: CacheScope,
}

/// Requests the scheduler refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchedError {
    /// The id is already in use.
    #[error("request {0} is already scheduled")]
    Duplicate(RequestId),
    /// No tokens to condition on.
    #[error("request {0} has an empty prompt")]
    EmptyPrompt(RequestId),
    /// Prompt plus generation could never fit the KV pool, even alone.
    #[error("request {id} needs {tokens} tokens of KV; the pool holds {capacity}")]
    TooLong {
        /// The request.
        id: RequestId,
        /// Prompt plus `max_new_tokens`.
        tokens: usize,
        /// Tokens the whole pool holds.
        capacity: usize,
    },
    /// The id is not scheduled.
    #[error("unknown request {0}")]
    Unknown(RequestId),
    /// The scheduler configuration is unusable.
    #[error("invalid scheduler configuration: {0}")]
    InvalidConfig(String),
}

/// Counters since the scheduler was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SchedStats {
    /// Steps planned.
    pub steps: u64,
    /// Requests admitted (re-admissions after preemption included).
    pub admissions: u64,
    /// Preemptions.
    pub preemptions: u64,
    /// Requests finished, aborted or completed.
    pub finished: u64,
    /// Prompt tokens not computed thanks to cached prefixes.
    pub cached_prompt_tokens: u64,
    /// Tokens computed (prefill and decode).
    pub computed_tokens: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Waiting,
    Prefill,
    Decode,
}

#[derive(Debug)]
struct Entry {
    priority: i32,
    cache_scope: CacheScope,
    max_new_tokens: usize,
    prompt_len: usize,
    /// Prompt then generated tokens.
    tokens: Vec<TokenId>,
    /// Tokens with KV computed (valid while running).
    computed: usize,
    /// Tokens with a KV slot reserved (valid while running).
    reserved: usize,
    phase: Phase,
    /// Order key in the waiting queue.
    queue_key: (i64, u64),
}

impl Entry {
    fn generated(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }
}

/// Continuous batching as a state machine: requests in, step plans out.
///
/// Each [`Scheduler::schedule`] call fills one step's token budget:
///
/// 1. **Decode first.** Every decoding request gets one token, most important
///    first. If the KV pool cannot hold its next token, the running request
///    with the lowest priority (the newest among equals) is preempted: its
///    blocks are released and it returns to the front of the queue, to be
///    recomputed later. A request may have to preempt itself.
/// 2. **Continue prefills** of admitted requests, in admission order, chunked to
///    the remaining budget and `max_prefill_chunk`.
/// 3. **Admit** waiting requests while the budget, `max_running` and the KV pool
///    allow: preempted requests first, then by priority with aging (a request
///    gains one level per `aging_steps` steps waited, so nothing starves) and
///    FIFO within a priority. Among the waiting requests of the head's priority,
///    one that can reuse a cached prefix goes first; one whose prefix is being
///    computed by a running request waits for it instead of computing it again.
///    Admission stops at the first request that does not fit, so large
///    requests are not starved by small ones.
///
/// After the engine has run the step it calls [`Scheduler::commit`] with the
/// sampled tokens; requests that reach `max_new_tokens` finish there, others
/// end through [`Scheduler::finish`] (EOS, stop strings) or
/// [`Scheduler::abort`].
#[derive(Debug)]
pub struct Scheduler {
    config: SchedConfig,
    kv: KvCache,
    entries: HashMap<RequestId, Entry>,
    waiting: BTreeMap<(i64, u64), RequestId>,
    preempted: VecDeque<RequestId>,
    /// Running requests in admission order.
    running: Vec<RequestId>,
    step: u64,
    arrivals: u64,
    stats: SchedStats,
}

impl Scheduler {
    /// A scheduler with an empty KV pool as `config` describes.
    pub fn new(config: SchedConfig) -> Result<Self, SchedError> {
        let invalid = |what: &str| Err(SchedError::InvalidConfig(what.to_owned()));
        if config.max_batch_tokens == 0 {
            return invalid("max_batch_tokens must be at least 1");
        }
        if config.max_running == 0 {
            return invalid("max_running must be at least 1");
        }
        if config.max_prefill_chunk == 0 {
            return invalid("max_prefill_chunk must be at least 1");
        }
        if config.max_batch_tokens < config.max_running {
            // Otherwise the same decoders would win the budget every step.
            return invalid("max_batch_tokens must be at least max_running");
        }
        if config.aging_steps == 0 {
            return invalid("aging_steps must be at least 1");
        }
        let mut kv = KvCache::new(config.kv_blocks, config.kv_block_size)
            .map_err(|e: KvError| SchedError::InvalidConfig(e.to_string()))?;
        kv.set_prefix_caching(config.prefix_caching);
        Ok(Self {
            config,
            kv,
            entries: HashMap::new(),
            waiting: BTreeMap::new(),
            preempted: VecDeque::new(),
            running: Vec::new(),
            step: 0,
            arrivals: 0,
            stats: SchedStats::default(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &SchedConfig {
        &self.config
    }

    /// The KV accounting (read-only; the scheduler owns it).
    pub fn kv(&self) -> &KvCache {
        &self.kv
    }

    /// KV pool statistics.
    pub fn kv_stats(&self) -> KvStats {
        self.kv.stats()
    }

    /// Counters since creation.
    pub fn stats(&self) -> SchedStats {
        self.stats
    }

    /// Requests waiting (preempted ones included).
    pub fn num_waiting(&self) -> usize {
        self.waiting.len() + self.preempted.len()
    }

    /// Requests running.
    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    /// Whether any request is waiting or running.
    pub fn has_work(&self) -> bool {
        !self.entries.is_empty()
    }

    /// A request's tokens so far: prompt, then generated tokens.
    pub fn tokens(&self, id: RequestId) -> Option<&[TokenId]> {
        self.entries.get(&id).map(|e| e.tokens.as_slice())
    }

    /// Tokens generated so far by a request.
    pub fn generated(&self, id: RequestId) -> Option<usize> {
        self.entries.get(&id).map(Entry::generated)
    }

    /// Whether the request is running (prefilling or decoding).
    pub fn is_running(&self, id: RequestId) -> bool {
        self.entries
            .get(&id)
            .is_some_and(|e| e.phase != Phase::Waiting)
    }

    /// Queues a request.
    pub fn add(&mut self, request: SchedRequest) -> Result<(), SchedError> {
        let SchedRequest {
            id,
            prompt,
            max_new_tokens,
            priority,
            cache_scope,
        } = request;
        if self.entries.contains_key(&id) {
            return Err(SchedError::Duplicate(id));
        }
        if prompt.is_empty() {
            return Err(SchedError::EmptyPrompt(id));
        }
        let capacity = self.config.kv_blocks * self.config.kv_block_size;
        let tokens = prompt.len() + max_new_tokens;
        if tokens > capacity {
            return Err(SchedError::TooLong {
                id,
                tokens,
                capacity,
            });
        }
        let entry = Entry {
            priority,
            cache_scope,
            max_new_tokens,
            prompt_len: prompt.len(),
            tokens: prompt,
            computed: 0,
            reserved: 0,
            phase: Phase::Waiting,
            queue_key: (0, 0),
        };
        self.entries.insert(id, entry);
        self.enqueue(id);
        Ok(())
    }

    /// Puts a request in the waiting queue, keyed so that priority `p` entering
    /// at step `t` ranks like priority 0 entering at `t - p * aging_steps`.
    fn enqueue(&mut self, id: RequestId) {
        let entry = self.entries.get_mut(&id).expect("enqueued requests exist");
        let aging = self.config.aging_steps as i64;
        let key = (
            self.step as i64 - i64::from(entry.priority) * aging,
            self.arrivals,
        );
        self.arrivals += 1;
        entry.queue_key = key;
        entry.phase = Phase::Waiting;
        self.waiting.insert(key, id);
    }

    /// Plans the next step. An empty plan means nothing can run now.
    pub fn schedule(&mut self) -> StepPlan {
        self.step += 1;
        self.stats.steps += 1;
        let mut plan = StepPlan {
            step: self.step,
            ..StepPlan::default()
        };
        let mut budget = self.config.max_batch_tokens;
        self.plan_decodes(&mut plan, &mut budget);
        self.plan_prefills(&mut plan, &mut budget);
        self.plan_admissions(&mut plan, &mut budget);
        plan
    }

    fn plan_decodes(&mut self, plan: &mut StepPlan, budget: &mut usize) {
        let mut decoding: Vec<RequestId> = self
            .running
            .iter()
            .copied()
            .filter(|id| self.entries[id].phase == Phase::Decode)
            .collect();
        // Most important first, so they get KV before anyone is preempted.
        decoding.sort_by_key(|id| {
            let e = &self.entries[id];
            (std::cmp::Reverse(e.priority), e.queue_key.1)
        });
        for id in decoding {
            if *budget == 0 {
                break;
            }
            if !self.entries.contains_key(&id) || self.entries[&id].phase != Phase::Decode {
                continue; // preempted meanwhile
            }
            if self.reserve_next_slot(id, plan) {
                plan.decode.push(id);
                *budget -= 1;
            }
        }
    }

    /// Reserves KV for `id`'s next token, preempting others as needed. Returns
    /// false if `id` itself had to be preempted.
    fn reserve_next_slot(&mut self, id: RequestId, plan: &mut StepPlan) -> bool {
        loop {
            let entry = &self.entries[&id];
            if entry.reserved >= entry.tokens.len() {
                return true;
            }
            let token = entry.tokens[entry.reserved];
            match self.kv.append(id.0, token) {
                Ok(()) => {
                    self.entries.get_mut(&id).expect("exists").reserved += 1;
                }
                Err(KvError::OutOfBlocks { .. }) => {
                    let victim = self.choose_victim();
                    self.preempt_into(victim, plan);
                    if victim == id {
                        return false;
                    }
                }
                Err(e) => unreachable!("running request {id} lost its KV: {e}"),
            }
        }
    }

    /// Lowest priority first, newest among equals.
    fn choose_victim(&self) -> RequestId {
        *self
            .running
            .iter()
            .min_by_key(|id| {
                let e = &self.entries[id];
                (e.priority, std::cmp::Reverse(e.queue_key.1))
            })
            .expect("a running request needs KV, so one is running")
    }

    fn preempt_into(&mut self, id: RequestId, plan: &mut StepPlan) {
        self.kv.free(id.0).expect("running requests hold KV");
        self.running.retain(|&r| r != id);
        plan.decode.retain(|&r| r != id);
        plan.prefill.retain(|c| c.id != id);
        // Admitted earlier in this very plan: it never ran, so it is not admitted either.
        plan.admitted.retain(|a| a.id != id);
        let entry = self.entries.get_mut(&id).expect("exists");
        entry.phase = Phase::Waiting;
        entry.computed = 0;
        entry.reserved = 0;
        self.preempted.push_back(id);
        plan.preempted.push(id);
        self.stats.preemptions += 1;
    }

    fn plan_prefills(&mut self, plan: &mut StepPlan, budget: &mut usize) {
        for &id in &self.running {
            if *budget == 0 {
                break;
            }
            if self.entries[&id].phase == Phase::Prefill {
                self.plan_next_chunk(id, plan, budget);
            }
        }
    }

    /// Plans the next chunk of `id`'s prompt within the remaining budget.
    fn plan_next_chunk(&self, id: RequestId, plan: &mut StepPlan, budget: &mut usize) {
        let entry = &self.entries[&id];
        let remaining = entry.tokens.len() - entry.computed;
        let len = remaining.min(*budget).min(self.config.max_prefill_chunk);
        plan.prefill.push(PrefillChunk {
            id,
            start: entry.computed,
            len,
            samples: len == remaining,
        });
        *budget -= len;
    }

    fn plan_admissions(&mut self, plan: &mut StepPlan, budget: &mut usize) {
        // Requests preempted in this step wait at least one step: taking their
        // blocks straight back would only thrash.
        let mut deferred: HashSet<RequestId> = plan.preempted.iter().copied().collect();
        if !self.running.is_empty()
            && self.num_waiting() > 0
            && !self.step.is_multiple_of(self.config.admit_every.max(1))
        {
            plan.admission_stop = Some(AdmissionStop::Cadence);
            return;
        }
        plan.admission_stop = Some(loop {
            if self.running.len() >= self.config.max_running {
                match self.priority_victim(&deferred, plan) {
                    Some(victim) => {
                        self.preempt_for_priority(victim, plan, budget);
                        deferred.insert(victim);
                        continue;
                    }
                    None => break AdmissionStop::MaxRunning,
                }
            }
            if *budget == 0 {
                break AdmissionStop::BudgetExhausted;
            }
            let Some(id) = self.next_candidate(&deferred) else {
                break AdmissionStop::QueueEmpty;
            };
            let Entry {
                tokens,
                cache_scope,
                ..
            } = &self.entries[&id];
            let probe = self.kv.probe_in(*cache_scope, tokens);
            if probe.pending_tokens > probe.cached_tokens {
                deferred.insert(id);
                plan.deferred.push(id);
                continue;
            }
            let needed = self.kv.blocks_needed_in(*cache_scope, tokens)
                + self.config.admission_headroom_blocks;
            let available = self.kv.available_blocks();
            // With nothing running, headroom cannot be freed by anyone: waive it.
            let fits = needed <= available
                || (self.running.is_empty()
                    && needed - self.config.admission_headroom_blocks <= available);
            if !fits {
                break AdmissionStop::KvFull {
                    id,
                    needed,
                    available,
                };
            }
            self.admit(id, plan, budget);
        });
    }

    /// The running request to preempt for the next waiting one, when
    /// priority preemption is on and the gap is wide enough.
    /// Only requests that ran before this step are victims: undoing an
    /// admission of this very plan would spend its budget for nothing.
    fn priority_victim(&self, deferred: &HashSet<RequestId>, plan: &StepPlan) -> Option<RequestId> {
        let gap = i64::from(self.config.priority_preemption_gap?);
        let candidate = self.next_candidate(deferred)?;
        if self.preempted.contains(&candidate) {
            return None;
        }
        let victim = *self
            .running
            .iter()
            .filter(|id| plan.admitted.iter().all(|a| a.id != **id))
            .min_by_key(|id| {
                let e = &self.entries[id];
                (e.priority, std::cmp::Reverse(e.queue_key.1))
            })?;
        let (want, hold) = (
            self.entries[&candidate].priority,
            self.entries[&victim].priority,
        );
        if i64::from(want) - i64::from(hold) < gap {
            return None;
        }
        // Never for a request that would not fit once the victim is out: the
        // victim would lose its place for nothing, and the two can take
        // turns preempting each other for ever.
        let wanted = &self.entries[&candidate];
        let needed = self.kv.blocks_needed_in(wanted.cache_scope, &wanted.tokens)
            + self.config.admission_headroom_blocks;
        let available = self.kv.available_blocks() + self.kv.blocks_freed_by(victim.0);
        (needed <= available).then_some(victim)
    }

    /// Preempts `id` for a more important request: unlike a preemption for
    /// KV, it waits again in its priority's place rather than first in line,
    /// or it would take its slot straight back. The tokens it had in this
    /// plan go back to the budget, for the request that takes its place.
    fn preempt_for_priority(&mut self, id: RequestId, plan: &mut StepPlan, budget: &mut usize) {
        *budget += usize::from(plan.decode.contains(&id))
            + plan
                .prefill
                .iter()
                .filter(|c| c.id == id)
                .map(|c| c.len)
                .sum::<usize>();
        self.preempt_into(id, plan);
        self.preempted.retain(|&p| p != id);
        let key = self.entries[&id].queue_key;
        self.waiting.insert(key, id);
    }

    /// The next request to admit: preempted ones first, then the waiting
    /// queue's head, or a request of the head's priority with a longer cached
    /// prefix within `prefix_window`.
    fn next_candidate(&self, deferred: &HashSet<RequestId>) -> Option<RequestId> {
        if let Some(&id) = self.preempted.iter().find(|id| !deferred.contains(id)) {
            return Some(id);
        }
        let mut open = self.waiting.values().filter(|id| !deferred.contains(id));
        let head = *open.next()?;
        if !self.kv.has_cached_prefixes() || self.config.prefix_window <= 1 {
            return Some(head);
        }
        let priority = self.entries[&head].priority;
        let head_entry = &self.entries[&head];
        let mut best = (
            self.kv
                .probe_in(head_entry.cache_scope, &head_entry.tokens)
                .cached_tokens,
            head,
        );
        for &id in open.take(self.config.prefix_window - 1) {
            let entry = &self.entries[&id];
            if entry.priority != priority {
                break;
            }
            let cached = self
                .kv
                .probe_in(entry.cache_scope, &entry.tokens)
                .cached_tokens;
            if cached > best.0 {
                best = (cached, id);
            }
        }
        Some(best.1)
    }

    fn admit(&mut self, id: RequestId, plan: &mut StepPlan, budget: &mut usize) {
        let entry = self.entries.get_mut(&id).expect("candidates exist");
        if let Some(position) = self.preempted.iter().position(|&p| p == id) {
            self.preempted.remove(position);
        } else {
            self.waiting.remove(&entry.queue_key);
        }
        let allocation = self
            .kv
            .allocate_in(id.0, entry.cache_scope, &entry.tokens)
            .expect("admission checked the blocks");
        entry.phase = Phase::Prefill;
        entry.computed = allocation.cached_tokens;
        entry.reserved = entry.tokens.len();
        self.running.push(id);
        self.stats.admissions += 1;
        self.stats.cached_prompt_tokens += allocation.cached_tokens as u64;
        plan.admitted.push(Admission {
            id,
            cached_tokens: allocation.cached_tokens,
        });
        self.plan_next_chunk(id, plan, budget);
    }

    /// Records that `plan` ran: its chunks and decode tokens now have KV, and
    /// `sampled` holds the token drawn for each row that samples (any order).
    /// Returns the requests that reached `max_new_tokens`; they are finished
    /// and their KV released (computed blocks stay cached).
    pub fn commit(&mut self, plan: &StepPlan, sampled: &[(RequestId, TokenId)]) -> Vec<RequestId> {
        for chunk in &plan.prefill {
            if let Some(entry) = self
                .entries
                .get_mut(&chunk.id)
                .filter(|e| e.phase == Phase::Prefill)
            {
                entry.computed = entry.computed.max(chunk.start + chunk.len);
                self.stats.computed_tokens += chunk.len as u64;
                self.kv
                    .mark_computed(chunk.id.0, entry.computed)
                    .expect("running requests hold KV");
            }
        }
        for id in &plan.decode {
            if let Some(entry) = self
                .entries
                .get_mut(id)
                .filter(|e| e.phase == Phase::Decode)
            {
                entry.computed = entry.reserved;
                self.stats.computed_tokens += 1;
                self.kv
                    .mark_computed(id.0, entry.computed)
                    .expect("running requests hold KV");
            }
        }
        let mut finished = Vec::new();
        for &(id, token) in sampled {
            let Some(entry) = self.entries.get_mut(&id) else {
                continue; // aborted while the step ran
            };
            if entry.phase == Phase::Waiting || entry.computed < entry.tokens.len() {
                continue; // preempted, or a chunk that does not sample
            }
            entry.tokens.push(token);
            entry.phase = Phase::Decode;
            if entry.generated() >= entry.max_new_tokens {
                finished.push(id);
            }
        }
        for &id in &finished {
            self.remove(id);
        }
        finished
    }

    /// Ends a request (EOS, stop string, ...), releasing its KV.
    pub fn finish(&mut self, id: RequestId) -> Result<(), SchedError> {
        if self.entries.contains_key(&id) {
            self.remove(id);
            Ok(())
        } else {
            Err(SchedError::Unknown(id))
        }
    }

    /// Cancels a request wherever it is (waiting or running). Same as `finish`.
    pub fn abort(&mut self, id: RequestId) -> Result<(), SchedError> {
        self.finish(id)
    }

    fn remove(&mut self, id: RequestId) {
        let entry = self.entries.remove(&id).expect("callers check");
        match entry.phase {
            Phase::Waiting => {
                if self.waiting.remove(&entry.queue_key).is_none() {
                    self.preempted.retain(|&p| p != id);
                }
            }
            Phase::Prefill | Phase::Decode => {
                self.running.retain(|&r| r != id);
                self.kv.free(id.0).expect("running requests hold KV");
            }
        }
        self.stats.finished += 1;
    }

    /// Cached blocks evicted since the last call (an engine drops their KV).
    pub fn drain_evicted(&mut self) -> Vec<cortex_kv::BlockId> {
        self.kv.drain_evicted()
    }

    /// Evicts a cached block now (an engine reclaiming the memory behind it).
    pub fn evict_cached(&mut self, block: cortex_kv::BlockId) -> bool {
        self.kv.evict(block)
    }

    /// Replaces the configuration and the KV pool (an engine that rebuilt its
    /// KV cache with a new size). Nothing may be running: preempt first.
    /// Waiting requests keep their place and tokens; cached prefixes are gone.
    pub fn reset_kv(&mut self, config: SchedConfig) -> Result<(), SchedError> {
        if !self.running.is_empty() {
            return Err(SchedError::InvalidConfig(
                "the KV pool cannot change while requests run".into(),
            ));
        }
        let fresh = Scheduler::new(config)?;
        self.config = fresh.config;
        self.kv = fresh.kv;
        Ok(())
    }

    /// Preempts a running request now (its executor could not take its tokens):
    /// its KV is released and it returns to the front of the queue, to be
    /// recomputed. Whatever the last plan holds for it is ignored by `commit`.
    pub fn preempt(&mut self, id: RequestId) -> Result<(), SchedError> {
        if !self.is_running(id) {
            return Err(SchedError::Unknown(id));
        }
        let mut ignored = StepPlan::default();
        self.preempt_into(id, &mut ignored);
        Ok(())
    }

    /// Preempts the running request the policy would pick (lowest priority,
    /// newest), for an engine whose executor ran out of KV despite the
    /// accounting. Returns it, or `None` when nothing runs. The last plan is
    /// void: the engine plans again.
    pub fn preempt_one(&mut self) -> Option<RequestId> {
        if self.running.is_empty() {
            return None;
        }
        let victim = self.choose_victim();
        self.preempt(victim).ok()?;
        Some(victim)
    }
}
