//! Even chunks ([`crate::EngineConfig::even_chunks`]): a step's prompt
//! chunks cut to one length where that computes its batch in fewer of
//! llama.cpp's micro-batches per token.
//!
//! llama.cpp takes an equal number of tokens from each stream of a run of
//! consecutive streams per micro-batch, so a step of decodes and uneven
//! chunks costs one pass for a token of every stream, then another each
//! time the shortest chunk left ends or a run breaks. Cutting every chunk
//! to one length, and letting a short one go a token a step beside the
//! decodes, leaves one pass for the chunks of each run. The choice is made
//! on the step's real streams (the scheduler does not know them), with the
//! same count of micro-batches the trace reports; the scheduler plans the
//! rest of a cut chunk in the next step.

use std::collections::HashMap;

use cortex_request::RequestId;
use cortex_sched::{PrefillChunk, StepPlan};

use super::StepLoop;
use super::decode::StepBatch;
use super::timeline::{passes, stream_tokens};
use crate::executor::{BatchToken, StreamId};

/// Chunks at most this long go a token a step when the step's chunks are
/// cut to a longer length; longer ones keep theirs. So no prompt waits
/// more than this many steps longer for its first token.
const TRICKLE_TOKENS: usize = 16;

impl StepLoop<'_> {
    /// The plan's batch (see [`StepLoop::build_batch`]), its chunks cut to
    /// one length first where that takes fewer micro-batches per token
    /// (when even chunks are on); also how many chunks were cut.
    pub(super) fn build_even_batch(&self, plan: &mut StepPlan) -> (StepBatch, usize) {
        let batch = self.build_batch(plan);
        if !self.even_chunks {
            return (batch, 0);
        }
        let stream_of = |id| self.stream_of(id);
        match even_length(
            plan,
            &batch.tokens,
            stream_of,
            self.timeline.micro_batch_tokens(),
        ) {
            Some(len) => {
                let cut = even_out(&mut plan.prefill, len);
                (self.build_batch(plan), cut)
            }
            None => (batch, 0),
        }
    }
}

/// What a chunk of `natural` tokens becomes when the step's chunks are cut
/// to `len`: that long, a token, or as it is.
fn evened(natural: usize, len: usize) -> usize {
    if natural >= len {
        len
    } else if natural <= TRICKLE_TOKENS {
        1
    } else {
        natural
    }
}

/// The length to cut `plan`'s chunks to, when that carries more of the
/// plan's tokens per micro-batch than the plan as it is; `None` to keep it.
/// `batch` is the plan's, and `stream_of` gives each chunk's stream.
pub(super) fn even_length(
    plan: &StepPlan,
    batch: &[BatchToken],
    stream_of: impl Fn(RequestId) -> StreamId,
    micro_batch_tokens: usize,
) -> Option<usize> {
    let mut lengths: Vec<usize> = plan
        .prefill
        .iter()
        .map(|c| c.len)
        .filter(|&n| n > 1)
        .collect();
    lengths.sort_unstable_by(|a, b| b.cmp(a));
    lengths.dedup();
    // With one length, cutting to it changes nothing.
    if lengths.len() < 2 {
        return None;
    }
    let counts = stream_tokens(batch);
    let at: HashMap<StreamId, usize> = counts
        .iter()
        .enumerate()
        .map(|(i, &(s, _))| (s, i))
        .collect();
    let cost = |len: Option<usize>| {
        let mut left = counts.clone();
        let mut tokens = plan.decode.len();
        for chunk in &plan.prefill {
            let n = len.map_or(chunk.len, |len| evened(chunk.len, len));
            left[at[&stream_of(chunk.id)]].1 = n;
            tokens += n;
        }
        (tokens, passes(&mut left, micro_batch_tokens))
    };
    let mut best = (None, cost(None));
    for len in lengths {
        let (tokens, passes) = cost(Some(len));
        let (_, (best_tokens, best_passes)) = best;
        // More tokens per pass (no cross-multiplication overflow at these sizes).
        if tokens * best_passes > best_tokens * passes {
            best = (Some(len), (tokens, passes));
        }
    }
    best.0
}

/// Cuts every chunk to `len` (see [`evened`]) and returns how many it cut.
/// A cut chunk no longer ends its prompt, so it does not sample; the
/// scheduler plans its rest next.
pub(super) fn even_out(chunks: &mut [PrefillChunk], len: usize) -> usize {
    let mut cut_chunks = 0;
    for chunk in chunks {
        let cut = evened(chunk.len, len);
        if cut < chunk.len {
            chunk.len = cut;
            chunk.samples = false;
            cut_chunks += 1;
        }
    }
    cut_chunks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_are_cut_where_that_takes_fewer_passes_per_token() {
        // Four decodes (streams 0-3) and chunks of 30, 20 and 10 tokens
        // beside them (streams 4-6): as they are, a token of each, then 9
        // of every chunk, 10 of two, 10 of one: 4 passes for 64 tokens.
        // Cut to 20 (the 10 trickling): a token of each, then 19 of two:
        // 2 passes for 45 tokens, more per pass than at 30 (3 for 55).
        let plan = StepPlan {
            decode: (0..4).map(RequestId).collect(),
            prefill: [30, 20, 10]
                .iter()
                .zip(4..)
                .map(|(&len, id)| PrefillChunk {
                    id: RequestId(id),
                    start: 0,
                    len,
                    samples: true,
                })
                .collect(),
            ..StepPlan::default()
        };
        let stream_of = |id: RequestId| id.0 as StreamId;
        let batch_of = |plan: &StepPlan| -> Vec<BatchToken> {
            let decodes = plan.decode.iter().map(|&id| (id, 1));
            let chunks = plan.prefill.iter().map(|c| (c.id, c.len));
            decodes
                .chain(chunks)
                .flat_map(|(id, n)| {
                    (0..n).map(move |pos| BatchToken {
                        token: 1,
                        pos,
                        stream: stream_of(id),
                        logits: pos + 1 == n,
                    })
                })
                .collect()
        };
        let count = |plan: &StepPlan| passes(&mut stream_tokens(&batch_of(plan)), 512);
        assert_eq!(count(&plan), 4);
        let len = even_length(&plan, &batch_of(&plan), stream_of, 512);
        assert_eq!(len, Some(20));
        let mut evened_plan = plan.clone();
        assert_eq!(even_out(&mut evened_plan.prefill, 20), 2);
        let cut: Vec<(usize, bool)> = evened_plan
            .prefill
            .iter()
            .map(|c| (c.len, c.samples))
            .collect();
        assert_eq!(cut, [(20, false), (20, true), (1, false)]);
        assert_eq!(count(&evened_plan), 2);
        // Chunks of one length are left alone.
        let mut even_plan = plan;
        even_plan.prefill.iter_mut().for_each(|c| c.len = 12);
        assert_eq!(
            even_length(&even_plan, &batch_of(&even_plan), stream_of, 512),
            None
        );
    }
}
