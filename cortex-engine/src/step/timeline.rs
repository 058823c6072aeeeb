//! The trace of a watched loop: a record of each step (what it held, how
//! long it decoded, the host time around it) and each prompt taken in, for
//! its observer. An unwatched loop builds no records.

use std::time::Instant;

use cortex_request::TokenId;
use cortex_sched::StepPlan;

use super::StepTimes;
use crate::events::{StepObserver, StepRecord};
use crate::executor::{BatchToken, StreamId};

/// How many micro-batches of at most `micro_batch_tokens` llama.cpp computes
/// a batch in (each one pass over the weights). With one stream per sequence
/// it splits a batch `split_equal`, sequentially: a micro-batch is a run of
/// consecutive stream ids, each giving the same number of tokens. So a gap
/// between running streams, or a prompt chunk beside decodes, costs another
/// pass. `batch` is ordered by stream, as the step builds it.
fn micro_batches(batch: &[BatchToken], micro_batch_tokens: usize) -> usize {
    passes(&mut stream_tokens(batch), micro_batch_tokens)
}

/// Each stream of `batch` (ordered by stream) with its number of tokens.
pub(super) fn stream_tokens(batch: &[BatchToken]) -> Vec<(StreamId, usize)> {
    let mut counts: Vec<(StreamId, usize)> = Vec::new();
    for token in batch {
        match counts.last_mut() {
            Some((stream, n)) if *stream == token.stream => *n += 1,
            _ => counts.push((token.stream, 1)),
        }
    }
    counts
}

/// The micro-batches of [`micro_batches`] for a batch of `left` tokens per
/// stream (ordered by stream; used up on the way).
pub(super) fn passes(left: &mut [(StreamId, usize)], micro_batch_tokens: usize) -> usize {
    let mut passes = 0;
    while let Some(first) = left.iter().position(|&(_, n)| n > 0) {
        let mut end = first + 1;
        while end < left.len() && left[end].1 > 0 && left[end].0 == left[end - 1].0 + 1 {
            end += 1;
        }
        let run = &mut left[first..end];
        let fewest = run.iter().map(|&(_, n)| n).min().unwrap_or(1);
        let each = fewest.min((micro_batch_tokens / run.len()).max(1));
        for (_, n) in run.iter_mut() {
            *n -= each;
        }
        passes += 1;
    }
    passes
}

pub(super) struct Timeline {
    observer: Option<Box<dyn StepObserver>>,
    /// llama.cpp's micro-batch size in this engine's context.
    micro_batch_tokens: usize,
    /// When the loop started, and when its last step ended.
    started_at: Instant,
    last_step_end: Option<Instant>,
}

impl Timeline {
    pub(super) fn new(observer: Option<Box<dyn StepObserver>>, micro_batch_tokens: usize) -> Self {
        Self {
            observer,
            micro_batch_tokens,
            started_at: Instant::now(),
            last_step_end: None,
        }
    }

    /// The micro-batches llama.cpp computes `batch` in (see [`micro_batches`]).
    pub(super) fn micro_batches(&self, batch: &[BatchToken]) -> usize {
        micro_batches(batch, self.micro_batch_tokens)
    }

    /// llama.cpp's micro-batch size in this engine's context.
    pub(super) fn micro_batch_tokens(&self) -> usize {
        self.micro_batch_tokens
    }

    /// A request's prompt was taken in.
    pub(super) fn prompt(&mut self, tokens: &[TokenId]) {
        if let Some(observer) = &mut self.observer {
            observer.prompt(tokens);
        }
    }

    /// The record of step number `step`, started at `started` with `plan`,
    /// when the loop is watched. Its prompt and generated tokens are set
    /// once the batch is built (even chunks may cut the plan's chunks).
    pub(super) fn begin(&self, step: u64, started: Instant, plan: &StepPlan) -> Option<StepRecord> {
        self.observer.as_ref()?;
        Some(StepRecord {
            step,
            at: started.duration_since(self.started_at).as_secs_f64(),
            decode_sequences: plan.decode.len(),
            prefill_chunks: plan.prefill.len(),
            gap_seconds: self
                .last_step_end
                .map_or(0.0, |end| started.duration_since(end).as_secs_f64()),
            ..StepRecord::default()
        })
    }

    /// The step begun at `started` ended now, its time spent as `times`
    /// says: its record goes to the observer.
    pub(super) fn end(&mut self, record: Option<StepRecord>, started: Instant, times: StepTimes) {
        let ended = Instant::now();
        if let (Some(observer), Some(mut record)) = (&mut self.observer, record) {
            record.decode_seconds = times.decode;
            record.wait_seconds = times.wait;
            record.sample_seconds = times.sample;
            record.device_sampled_tokens = times.device_sampled;
            record.decode_calls = times.decode_calls;
            record.kv_rebuild_seconds = times.kv_rebuild;
            record.host_seconds = (ended.duration_since(started).as_secs_f64()
                - times.decode
                - times.wait
                - times.sample
                - times.kv_rebuild)
                .max(0.0);
            observer.step(&record);
        }
        self.last_step_end = Some(ended);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(streams: &[(StreamId, usize)]) -> Vec<BatchToken> {
        streams
            .iter()
            .flat_map(|&(stream, n)| {
                (0..n).map(move |pos| BatchToken {
                    token: 1,
                    pos,
                    stream,
                    logits: pos + 1 == n,
                })
            })
            .collect()
    }

    #[test]
    fn llama_cpp_splits_at_gaps_between_streams_and_at_uneven_chunks() {
        assert_eq!(micro_batches(&[], 512), 0);
        // Decodes in consecutive streams: one pass.
        assert_eq!(
            micro_batches(&batch(&[(0, 1), (1, 1), (2, 1), (3, 1)]), 512),
            1
        );
        // A gap (stream 2 idle): two.
        assert_eq!(
            micro_batches(&batch(&[(0, 1), (1, 1), (3, 1), (4, 1)]), 512),
            2
        );
        // A 20-token prompt chunk beside decodes: one token from each, then
        // the chunk's other 19.
        assert_eq!(micro_batches(&batch(&[(0, 1), (1, 20), (2, 1)]), 512), 2);
        // A 512-token chunk alone: one; 600 tokens: two.
        assert_eq!(micro_batches(&batch(&[(5, 512)]), 512), 1);
        assert_eq!(micro_batches(&batch(&[(5, 600)]), 512), 2);
        // Two chunks side by side: 256 tokens of each per pass.
        assert_eq!(micro_batches(&batch(&[(0, 300), (1, 300)]), 512), 2);
        // Larger micro-batches hold a long chunk whole.
        assert_eq!(micro_batches(&batch(&[(5, 600)]), 2048), 1);
        assert_eq!(micro_batches(&batch(&[(0, 1), (1, 600), (2, 1)]), 2048), 2);
    }
}
