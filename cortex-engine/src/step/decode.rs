//! One batch from the plan: build it, decode it with failure isolation,
//! sample its rows in parallel, and record what each stream computed.

use std::collections::HashMap;
use std::time::Instant;

use cortex_request::{RequestId, TokenId, TokenLogprob, TopLogprob};
use cortex_sample::{BatchRow, Constraint, TokenFilter, sample_batch};
use cortex_sched::StepPlan;

use super::{Seq, StepLoop};
use crate::backend::{BackendError, BatchToken, StreamId};
use crate::error::EngineError;

/// A row of the batch that samples: which sequence, and where its logits are.
pub(super) struct SampleRow {
    seq: RequestId,
    batch_index: usize,
}

impl StepLoop<'_> {
    /// The plan's tokens, ordered by stream: llama.cpp splits a non-unified
    /// batch into micro-batches of consecutive stream ids, so this order lets
    /// the decode tokens of all running streams go in one.
    pub(super) fn build_batch(&self, plan: &StepPlan) -> (Vec<BatchToken>, Vec<SampleRow>) {
        let mut parts: Vec<(StreamId, RequestId, usize, usize, bool)> = plan
            .decode
            .iter()
            .map(|&id| {
                let len = self
                    .sched
                    .tokens(id)
                    .expect("planned sequences exist")
                    .len();
                (self.stream_of(id), id, len - 1, 1, true)
            })
            .chain(
                plan.prefill
                    .iter()
                    .map(|c| (self.stream_of(c.id), c.id, c.start, c.len, c.samples)),
            )
            .collect();
        parts.sort_unstable_by_key(|p| p.0);
        let mut batch = Vec::with_capacity(plan.num_tokens());
        let mut rows = Vec::with_capacity(plan.num_samples());
        for (stream, id, start, len, samples) in parts {
            let tokens = self.sched.tokens(id).expect("planned sequences exist");
            let end = start + len;
            for (pos, &token) in tokens.iter().enumerate().take(end).skip(start) {
                let logits = samples && pos + 1 == end;
                if logits {
                    rows.push(SampleRow {
                        seq: id,
                        batch_index: batch.len(),
                    });
                }
                batch.push(BatchToken {
                    token,
                    pos,
                    stream,
                    logits,
                });
            }
        }
        (batch, rows)
    }

    fn stream_of(&self, id: RequestId) -> StreamId {
        self.seqs[&id].stream.expect("running sequences are bound")
    }

    /// Decodes the batch and samples every row. A backend failure is isolated:
    /// each stream is retried alone; one that still finds no KV slot is
    /// preempted (recomputed later, timing out if that never succeeds), one that
    /// fails otherwise fails. The rest of the step goes on.
    pub(super) fn decode(
        &mut self,
        batch: &[BatchToken],
        rows: &[SampleRow],
    ) -> Vec<(RequestId, TokenId)> {
        let started = Instant::now();
        let decoded = self.backend.decode(batch);
        self.tally.decoded_for(started.elapsed().as_secs_f64());
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
        let mut streams: Vec<StreamId> = batch.iter().map(|t| t.stream).collect();
        streams.dedup();
        // A batch of one stream has already failed alone.
        let alone = streams.len() == 1;
        for stream in streams {
            let part: Vec<BatchToken> = batch
                .iter()
                .copied()
                .filter(|t| t.stream == stream)
                .collect();
            let found = self
                .seqs
                .iter()
                .find(|(_, s)| s.stream == Some(stream))
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
                    let local: Vec<SampleRow> = rows
                        .iter()
                        .filter(|r| batch[r.batch_index].stream == stream)
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
                        self.tally.preempted();
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
        let mut first: HashMap<StreamId, usize> = HashMap::new();
        for t in batch {
            let p = first.entry(t.stream).or_insert(t.pos);
            *p = (*p).min(t.pos);
        }
        for (stream, from) in first {
            self.streams.truncate(stream, from, self.backend.as_mut());
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
        let mut samplers: Vec<(usize, &mut Seq)> = self
            .seqs
            .iter_mut()
            .filter_map(|(id, seq)| order.get(id).map(|&i| (i, seq)))
            .collect();
        samplers.sort_unstable_by_key(|(i, _)| *i);
        let mut batch: Vec<BatchRow<'_>> = samplers
            .into_iter()
            .zip(self.logits.iter_mut())
            .map(|((i, seq), logits)| BatchRow {
                sampler: &mut seq.sampler,
                logits: logits.as_mut_slice(),
                history: self.sched.tokens(rows[i].seq).unwrap_or(&[]),
                // Log probabilities are reported after the constraint, so
                // such rows mask before they draw.
                constraint: seq.grammar.as_deref_mut().map(|grammar| Constraint {
                    filter: grammar as &mut dyn TokenFilter,
                    mask_first: seq.top_logprobs.is_some(),
                }),
            })
            .collect();
        let tokens = sample_batch(&mut batch);
        drop(batch);
        for (i, (row, &token)) in rows.iter().zip(&tokens).enumerate() {
            if let Some(grammar) = self.seqs.get_mut(&row.seq).and_then(|s| s.grammar.as_mut()) {
                grammar.accept(token);
            }
            self.record_logprob(row.seq, token, i);
        }
        rows.iter().map(|r| r.seq).zip(tokens).collect()
    }

    /// For a sequence that reports log probabilities: those of `token` and
    /// the most likely alternatives, from the `row`-th logits buffer (as the
    /// sampler left it: bias and penalties applied, no temperature).
    fn record_logprob(&mut self, id: RequestId, token: TokenId, row: usize) {
        let Some(seq) = self.seqs.get_mut(&id) else {
            return;
        };
        let Some(top) = seq.top_logprobs else {
            return;
        };
        let (logprob, alternatives) = cortex_sample::logprobs(&self.logits[row], token, top);
        let entry = |token: TokenId, logprob: f32| TopLogprob {
            token,
            bytes: self.backend.token_bytes(token),
            logprob,
        };
        seq.logprobs.push(TokenLogprob {
            chosen: entry(token, logprob),
            top: alternatives
                .into_iter()
                .map(|(token, logprob)| entry(token, logprob))
                .collect(),
        });
    }

    /// Records, before the scheduler commits the step, the positions each
    /// stream computed and the full blocks among them (so a sequence that the
    /// commit ends still leaves its blocks with a holder).
    pub(super) fn record_computed(&mut self, plan: &StepPlan) {
        let computed = plan
            .decode
            .iter()
            .map(|&id| (id, self.sched.tokens(id).map_or(0, <[TokenId]>::len)))
            .chain(plan.prefill.iter().map(|c| (c.id, c.start + c.len)));
        let now = Instant::now();
        for (id, end) in computed {
            // Gone (failed) or unbound (preempted when its part of the batch
            // failed): it computed nothing.
            let Some(seq) = self.seqs.get_mut(&id).filter(|s| s.stream.is_some()) else {
                continue;
            };
            seq.last_progress = now;
            seq.progressed_since_bind = true;
            let stream = seq.stream.expect("filtered");
            let table = self.sched.kv().blocks_of(id.0).unwrap_or(&[]);
            self.streams.computed(stream, table, end);
        }
    }
}
