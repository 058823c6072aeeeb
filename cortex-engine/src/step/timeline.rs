//! The trace of a watched loop: a record of each step (what it held, how
//! long it decoded, the host time around it) and each prompt taken in, for
//! its observer. An unwatched loop builds no records.

use std::time::Instant;

use cortex_request::TokenId;
use cortex_sched::StepPlan;

use crate::events::{StepObserver, StepRecord};

pub(super) struct Timeline {
    observer: Option<Box<dyn StepObserver>>,
    /// When the loop started, and when its last step ended.
    started_at: Instant,
    last_step_end: Option<Instant>,
}

impl Timeline {
    pub(super) fn new(observer: Option<Box<dyn StepObserver>>) -> Self {
        Self {
            observer,
            started_at: Instant::now(),
            last_step_end: None,
        }
    }

    /// A request's prompt was taken in.
    pub(super) fn prompt(&mut self, tokens: &[TokenId]) {
        if let Some(observer) = &mut self.observer {
            observer.prompt(tokens);
        }
    }

    /// The record of step number `step`, started at `started` with `plan`,
    /// when the loop is watched.
    pub(super) fn begin(&self, step: u64, started: Instant, plan: &StepPlan) -> Option<StepRecord> {
        self.observer.as_ref()?;
        Some(StepRecord {
            step,
            at: started.duration_since(self.started_at).as_secs_f64(),
            decode_sequences: plan.decode.len(),
            generated_tokens: plan.num_samples(),
            prefill_chunks: plan.prefill.len(),
            prefill_tokens: plan.prefill.iter().map(|c| c.len).sum(),
            gap_seconds: self
                .last_step_end
                .map_or(0.0, |end| started.duration_since(end).as_secs_f64()),
            ..StepRecord::default()
        })
    }

    /// The step begun at `started` ended now, after `decode_seconds` in the
    /// backend's decode: its record goes to the observer.
    pub(super) fn end(
        &mut self,
        record: Option<StepRecord>,
        started: Instant,
        decode_seconds: f64,
    ) {
        let ended = Instant::now();
        if let (Some(observer), Some(mut record)) = (&mut self.observer, record) {
            record.decode_seconds = decode_seconds;
            record.host_seconds =
                (ended.duration_since(started).as_secs_f64() - decode_seconds).max(0.0);
            observer.step(&record);
        }
        self.last_step_end = Some(ended);
    }
}
