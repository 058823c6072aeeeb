//! The KV layout: how many streams, how many cells each.
//!
//! With one stream per sequence, a stream's cells bound the longest request
//! (prompt plus generation), and streams times cells is the KV memory. Unless
//! the user fixes the cells per stream, they start at one granule and grow to
//! fit the longest request seen so far (at least doubling, so a job causes a
//! handful of rebuilds at most, nearly always before anything runs). Past the
//! memory budget, fewer streams run rather than a long request failing.

use cortex_sched::SchedConfig;

use super::StepLoop;
use crate::config::EngineConfig;
use crate::error::EngineError;
use crate::executor::{Executor, KvLayout};
use crate::streams::Streams;

/// llama.cpp pads cells per stream to this.
pub(super) const GRANULE: usize = 256;

fn mib(bytes: usize) -> usize {
    bytes >> 20
}

#[derive(Debug, Clone)]
pub(super) struct Sizing {
    parallel: usize,
    /// Cells per stream when the user fixed the context: theirs, in whole
    /// granules (llama.cpp's padding).
    fixed: Option<usize>,
    /// The context the user fixed, exactly: the longest sequence (prompt
    /// plus generation) a request may have, though its stream holds more.
    context: Option<usize>,
    /// Cells the memory budget allows, across all streams.
    budget_cells: usize,
    /// Cells the streams of one step span at most (fewer, longer streams
    /// for long requests).
    step_cells: usize,
    /// Longest sequence the model takes, in whole granules.
    model_limit: usize,
    block_size: usize,
    max_batch_tokens: usize,
    prefix_sharing: bool,
    /// Steps between joins ([`EngineConfig::steady_steps`]; at least 1).
    admit_every: u64,
}

impl Sizing {
    /// The sizing for `config` on `executor`, refused when the KV cache it
    /// asks for cannot fit the memory of the device that holds it (so a job
    /// that does not fit fails at start, saying what to lower, never midway).
    pub(super) fn new(config: &EngineConfig, executor: &dyn Executor) -> Result<Self, EngineError> {
        config.check_limits()?;
        let per_token = executor.kv_bytes_per_token().max(1);
        let parallel = config.parallel.max(1);
        let fixed = config
            .stream_tokens
            .map(|t| t.max(1).next_multiple_of(GRANULE));
        let available = executor.kv_memory_available();
        let device = executor.device_name();
        let refuse = |message: String| Err(EngineError::Model(message));
        let budget = if config.kv_memory > 0 {
            if let Some(available) = available
                && config.kv_memory > available
            {
                return refuse(format!(
                    "kv_memory_mib = {} is more than the {} MiB {device} has for the KV cache: lower kv_memory_mib",
                    mib(config.kv_memory),
                    mib(available)
                ));
            }
            config.kv_memory
        } else {
            // The device's share for each of the loops that run on it.
            executor.default_kv_memory().unwrap_or(1 << 30) / config.step_loops.max(1)
        };
        match (fixed, available) {
            (Some(cells), Some(available)) if parallel * cells * per_token > available => {
                return refuse(format!(
                    "a KV cache of {parallel} sequences of {cells} tokens needs {} MiB; {device} has {} MiB for it: lower --parallel or --context",
                    mib(parallel * cells * per_token),
                    mib(available)
                ));
            }
            (None, _) if budget / per_token < GRANULE => {
                return refuse(format!(
                    "{device} has {} MiB for the KV cache, less than one sequence of {GRANULE} tokens needs ({} MiB): lower --gpu-layers, or free memory",
                    mib(budget),
                    mib(GRANULE * per_token).max(1)
                ));
            }
            _ => {}
        }
        Ok(Self {
            parallel,
            fixed,
            context: config.stream_tokens.map(|t| t.max(1)),
            budget_cells: budget / per_token,
            step_cells: config.step_cells.max(GRANULE),
            model_limit: (executor.n_ctx_train() / GRANULE * GRANULE).max(GRANULE),
            block_size: config.block_size.max(1),
            max_batch_tokens: config.max_batch_tokens.max(1),
            prefix_sharing: config.prefix_sharing,
            admit_every: config.steady_steps.max(1) as u64,
        })
    }

    pub(super) fn block_size(&self) -> usize {
        self.block_size
    }

    /// The longest sequence a request may have: the context the user fixed,
    /// or the model's context within the memory budget of one stream.
    pub(super) fn max_sequence_tokens(&self) -> usize {
        self.context.unwrap_or_else(|| {
            self.model_limit
                .min(self.budget_cells / GRANULE * GRANULE)
                .max(GRANULE)
        })
    }

    pub(super) fn initial_capacity(&self) -> usize {
        self.fixed.unwrap_or(GRANULE)
    }

    /// Cells per stream for a sequence of `need` tokens, at least doubling
    /// `current` so that growing happens rarely.
    fn grown(&self, current: usize, need: usize) -> usize {
        need.next_multiple_of(GRANULE)
            .max(current * 2)
            .min(self.max_sequence_tokens())
    }

    /// Streams of `capacity` cells: one per running sequence, fewer when the
    /// memory budget or the step's cell span cannot hold them all.
    pub(super) fn layout(&self, capacity: usize) -> KvLayout {
        let streams = match self.fixed {
            Some(_) => self.parallel,
            None => (self.budget_cells.min(self.step_cells) / capacity).clamp(1, self.parallel),
        };
        KvLayout { streams, capacity }
    }

    /// The scheduler for a layout: its pool is every stream's cells, so KV
    /// never runs out while each sequence fits its stream.
    pub(super) fn sched_config(&self, layout: KvLayout) -> SchedConfig {
        SchedConfig {
            max_batch_tokens: self.max_batch_tokens.max(layout.streams),
            max_running: layout.streams,
            max_prefill_chunk: self.max_batch_tokens,
            kv_blocks: layout.streams * layout.capacity / self.block_size,
            kv_block_size: self.block_size,
            admission_headroom_blocks: 0,
            aging_steps: 64,
            prefix_window: 16,
            prefix_caching: self.prefix_sharing,
            // The KV binding takes over or copies the streams of requests
            // that left; preempting running ones to admit others in the same
            // step can leave it without a stream (seen with priority
            // preemption under load), so the engine does not use it yet.
            priority_preemption_gap: None,
            admit_every: self.admit_every,
        }
    }
}

impl StepLoop<'_> {
    /// Rebuilds the KV with streams long enough for the parked requests:
    /// running sequences are preempted (recomputed later), cached prefixes
    /// are dropped. If the executor cannot make the larger cache, the parked
    /// requests fail and the old layout stays.
    pub(super) fn grow_streams(&mut self) {
        let need = self
            .oversize
            .iter()
            .map(|r| r.prompt.len() + r.max_new_tokens)
            .max()
            .unwrap_or(0);
        let old = self.executor.kv_layout();
        let capacity = self.sizing.grown(old.capacity, need);
        let running: Vec<_> = self
            .seqs
            .iter()
            .filter(|(_, s)| s.stream.is_some())
            .map(|(id, _)| *id)
            .collect();
        for id in running {
            if self.sched.preempt(id).is_ok() {
                self.tally.preempted();
            }
            if let Some(seq) = self.seqs.get_mut(&id) {
                seq.stream = None;
            }
        }
        let layout = self.sizing.layout(capacity);
        if let Err(error) = self.executor.set_kv_layout(layout) {
            self.fail_oversize(&error.to_string());
            self.executor
                .set_kv_layout(old)
                .expect("the previous KV layout fits again");
        }
        let layout = self.executor.kv_layout();
        self.streams = Streams::new(layout.streams, layout.capacity, self.sizing.block_size);
        self.tally.kv_rebuilt(self.sched.kv_stats().evictions);
        self.sched
            .reset_kv(self.sizing.sched_config(layout))
            .expect("nothing runs while the KV is rebuilt");
        for request in std::mem::take(&mut self.oversize) {
            self.sched
                .add(request)
                .expect("the streams now fit every parked request");
        }
    }

    fn fail_oversize(&mut self, detail: &str) {
        let owners: Vec<_> = self
            .oversize
            .drain(..)
            .filter_map(|r| self.seqs.get(&r.id).map(|s| s.owner))
            .collect();
        for owner in owners {
            let error = EngineError::Model(format!("cannot grow the KV cache: {detail}"));
            self.fail_request(owner, error);
        }
    }
}
