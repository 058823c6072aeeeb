//! The step loop's running figures, with one owner: every count, sum and
//! mean behind [`EngineStats`] changes here, through a method named for what
//! happened, and leaves as one snapshot with the loop's gauges filled in.

use cortex_request::Timings;

use crate::events::EngineStats;
use crate::streams::Binding;

pub(super) struct Tally {
    stats: EngineStats,
    ttft_sum: f64,
    latency_sum: f64,
    latency_count: u64,
    /// Evictions counted by accounting pools replaced since (KV rebuilt).
    evicted_before_reset: u64,
}

impl Tally {
    /// Nothing counted yet; `threads` as the loop starts with them (0: fixed).
    pub(super) fn new(threads: usize) -> Self {
        Self {
            stats: EngineStats {
                threads,
                ..EngineStats::default()
            },
            ttft_sum: 0.0,
            latency_sum: 0.0,
            latency_count: 0,
            evicted_before_reset: 0,
        }
    }

    /// Counts a step (a generation step or an embedding decode); returns its number.
    pub(super) fn step(&mut self) -> u64 {
        self.stats.steps += 1;
        self.stats.steps
    }

    /// Prompt tokens of a request taken in.
    pub(super) fn prompt(&mut self, tokens: u64) {
        self.stats.prompt_tokens += tokens;
    }

    /// Prompt tokens computed by a decode.
    pub(super) fn prefilled(&mut self, tokens: u64) {
        self.stats.prefill_tokens += tokens;
    }

    /// One token sampled.
    pub(super) fn generated(&mut self) {
        self.stats.generated_tokens += 1;
    }

    /// A sequence preempted (its KV given up, recomputed later).
    pub(super) fn preempted(&mut self) {
        self.stats.preemptions += 1;
    }

    /// A sequence bound to a stream the way `binding` says, with
    /// `cached_tokens` of its prompt already in the KV.
    pub(super) fn bound(&mut self, binding: Binding, cached_tokens: usize) {
        match binding {
            Binding::Copied => self.stats.prefix_copies += 1,
            Binding::TakenOver => self.stats.prefix_takeovers += 1,
            Binding::Fresh => {}
        }
        self.stats.prefill_tokens_saved += cached_tokens as u64;
    }

    /// Seconds spent inside the executor's decode.
    pub(super) fn decoded_for(&mut self, seconds: f64) {
        self.stats.decode_seconds += seconds;
    }

    /// Seconds the loop worked (a pass with work in it).
    pub(super) fn busy_for(&mut self, seconds: f64) {
        self.stats.busy_seconds += seconds;
    }

    /// The threads the executor decodes with now.
    pub(super) fn threads(&mut self, threads: usize) {
        self.stats.threads = threads;
    }

    /// The KV was rebuilt; the accounting pool it replaced had evicted
    /// `evictions` blocks.
    pub(super) fn kv_rebuilt(&mut self, evictions: u64) {
        self.evicted_before_reset += evictions;
        self.stats.kv_resizes += 1;
    }

    /// A request ended (`failed` or not).
    pub(super) fn request_ended(&mut self, failed: bool) {
        self.stats.requests_finished += 1;
        if failed {
            self.stats.requests_failed += 1;
        }
    }

    /// A request's time to its first token and to its end.
    pub(super) fn latency(&mut self, timings: &Timings) {
        if let Some(ttft) = timings.first_token {
            self.ttft_sum += ttft.as_secs_f64();
        }
        self.latency_sum += timings.finished.as_secs_f64();
        self.latency_count += 1;
    }

    /// The figures now: the rates and means, the evictions of the current
    /// pool (`evictions`) added to those before it, and the loop's gauges
    /// as `gauges` sets them.
    pub(super) fn snapshot(
        &mut self,
        evictions: u64,
        gauges: impl FnOnce(&mut EngineStats),
    ) -> EngineStats {
        let stats = &mut self.stats;
        stats.kv_evicted_blocks = self.evicted_before_reset + evictions;
        if stats.busy_seconds > 0.0 {
            stats.generated_tokens_per_second = stats.generated_tokens as f64 / stats.busy_seconds;
        }
        if self.latency_count > 0 {
            stats.mean_time_to_first_token = self.ttft_sum / self.latency_count as f64;
            stats.mean_latency = self.latency_sum / self.latency_count as f64;
        }
        gauges(stats);
        *stats
    }
}
