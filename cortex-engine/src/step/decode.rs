//! One batch from the plan: build it, decode it with failure isolation,
//! sample its rows in parallel, and record what each stream computed.

use std::collections::HashMap;
use std::time::Instant;

use cortex_request::{RequestId, TokenId, TokenLogprob, TopLogprob};
use cortex_sample::{BatchRow, Constraint, TokenFilter, sample_batch};
use cortex_sched::StepPlan;

use super::{SampledAt, Seq, StepLoop};
use crate::error::EngineError;
use crate::executor::{BatchToken, ExecutorError, StreamId};

/// A row of the batch whose logits are read: which sequence, where its
/// logits are, and what they are for.
pub(super) struct SampleRow {
    seq: RequestId,
    batch_index: usize,
    /// `Some(pos)`: they score the prompt token after position `pos` (a
    /// request that asked for its prompt's log probabilities); `None`:
    /// they choose the sequence's next token.
    scores: Option<usize>,
}

/// A step's batch: its tokens by stream, the rows that sample, and the
/// fillers (stream, position) to remove after the decode.
pub(super) struct StepBatch {
    pub(super) tokens: Vec<BatchToken>,
    pub(super) rows: Vec<SampleRow>,
    pub(super) fillers: Vec<(StreamId, usize)>,
}

impl StepLoop<'_> {
    /// The plan's tokens, ordered by stream: llama.cpp splits a non-unified
    /// batch into micro-batches of consecutive stream ids, so this order lets
    /// the decode tokens of all running streams go in one. A gap of idle
    /// streams between two running ones, up to `gap_fill` of them, gets one
    /// throwaway token per idle stream (no logits) so the runs join; the
    /// fillers' streams and positions are returned to be removed after the
    /// decode. In steady steps ([`crate::EngineConfig::steady_steps`]) a
    /// step that decodes fills every idle stream, gaps and both ends, and
    /// asks for the fillers' logits, so that the decode micro-batch has the
    /// same tokens, streams and outputs from one step to the next.
    pub(super) fn build_batch(&self, plan: &StepPlan) -> StepBatch {
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
        let mut fillers = Vec::new();
        let steady = self.steady && !plan.decode.is_empty();
        // Fillers beyond the plan's tokens, within what one decode may hold.
        let room = self.decode_tokens.saturating_sub(plan.num_tokens());
        // Steady: from the first stream on, as if one before it ran.
        let mut previous: Option<StreamId> = steady.then_some(-1);
        for (stream, id, start, len, samples) in parts {
            if let Some(previous) = previous {
                self.fill_gap(previous, stream, steady, room, &mut batch, &mut fillers);
            }
            previous = Some(stream);
            let tokens = self.sched.tokens(id).expect("planned sequences exist");
            let end = start + len;
            // Positions whose logits score the prompt token after them.
            let scored = self.seqs[&id]
                .prompt_scores
                .as_ref()
                .map_or(0, |s| s.tokens.len() - 1);
            for (pos, &token) in tokens.iter().enumerate().take(end).skip(start) {
                let sample = samples && pos + 1 == end;
                let score = pos < scored;
                let logits = sample || score;
                if logits {
                    rows.push(SampleRow {
                        seq: id,
                        batch_index: batch.len(),
                        scores: (!sample).then_some(pos),
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
        if steady {
            let end =
                StreamId::try_from(self.executor.kv_layout().streams).unwrap_or(StreamId::MAX);
            self.fill_gap(
                previous.unwrap_or(-1),
                end,
                true,
                room,
                &mut batch,
                &mut fillers,
            );
        }
        StepBatch {
            tokens: batch,
            rows,
            fillers,
        }
    }

    /// Fills the idle streams strictly between `before` and `after` with a
    /// throwaway token each, when there are at most `gap_fill` of them (any
    /// number when `steady`), every one has room for it (else the gap
    /// stays: one full stream keeps the runs apart anyway) and the batch
    /// stays within [`crate::EngineConfig::decode_tokens`] (a larger one
    /// the executor refuses, and the step falls back to a decode per
    /// stream). Steady fillers ask for logits, so the outputs keep their
    /// count.
    fn fill_gap(
        &self,
        before: StreamId,
        after: StreamId,
        steady: bool,
        room: usize,
        batch: &mut Vec<BatchToken>,
        fillers: &mut Vec<(StreamId, usize)>,
    ) {
        let gap = (before + 1)..after;
        if gap.is_empty()
            || (!steady && gap.len() > self.gap_fill)
            || fillers.len() + gap.len() > room
        {
            return;
        }
        let positions: Option<Vec<(StreamId, usize)>> = gap
            .map(|stream| Some((stream, self.streams.filler_position(stream)?)))
            .collect();
        for (stream, pos) in positions.into_iter().flatten() {
            batch.push(BatchToken {
                // Any token: its cell is removed and nothing reads its logits.
                token: 0,
                pos,
                stream,
                logits: steady,
            });
            fillers.push((stream, pos));
        }
    }

    pub(super) fn stream_of(&self, id: RequestId) -> StreamId {
        self.seqs[&id].stream.expect("running sequences are bound")
    }

    /// Decodes the batch and samples every row. An executor failure is isolated:
    /// each stream is retried alone; one that still finds no KV slot is
    /// preempted (recomputed later, timing out if that never succeeds), one that
    /// fails otherwise fails. The rest of the step goes on.
    pub(super) fn decode(
        &mut self,
        batch: &[BatchToken],
        rows: &[SampleRow],
    ) -> Vec<(RequestId, TokenId)> {
        match self.decode_and_wait(batch) {
            Ok(()) => self.read_rows(rows),
            Err(error) => {
                tracing::debug!(
                    "a batch of {} tokens failed ({error}): decoding its streams one by one",
                    batch.len()
                );
                self.forget_batch_kv(batch);
                self.decode_one_by_one(batch, rows, &error)
            }
        }
    }

    /// One decode, and the wait for its results on the host, each timed.
    fn decode_and_wait(&mut self, batch: &[BatchToken]) -> Result<(), ExecutorError> {
        let started = Instant::now();
        if self.executor.reads_shared_prefixes() {
            let mut streams: Vec<StreamId> = batch.iter().map(|t| t.stream).collect();
            streams.dedup();
            let shares = self.streams.shared_prefixes(&streams);
            self.executor.share_prefixes(&shares);
        }
        let decoded = self.executor.decode(batch);
        let submitted = Instant::now();
        if decoded.is_ok() {
            self.executor.synchronize();
        }
        let done = Instant::now();
        let (decode, wait) = (
            submitted.duration_since(started).as_secs_f64(),
            done.duration_since(submitted).as_secs_f64(),
        );
        self.tally.decoded_for(decode + wait);
        self.step_times.decode_calls += 1;
        self.step_times.decode += decode;
        self.step_times.wait += wait;
        decoded
    }

    fn decode_one_by_one(
        &mut self,
        batch: &[BatchToken],
        rows: &[SampleRow],
        first_error: &ExecutorError,
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
                self.decode_and_wait(&part)
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
                            scores: r.scores,
                        })
                        .collect();
                    sampled.extend(self.read_rows(&local));
                }
                Err(ExecutorError::NoKvSlot) => {
                    self.forget_batch_kv(&part);
                    if self.sched.preempt(seq_id).is_ok() {
                        self.tally.preempted();
                        self.unbind(seq_id);
                    }
                }
                Err(error) => {
                    self.forget_batch_kv(&part);
                    self.fail_request(owner, EngineError::executor(owner, &error));
                }
            }
        }
        sampled
    }

    /// Removes whatever the executor may have written for the batch's positions.
    fn forget_batch_kv(&mut self, batch: &[BatchToken]) {
        let mut first: HashMap<StreamId, usize> = HashMap::new();
        for t in batch {
            let p = first.entry(t.stream).or_insert(t.pos);
            *p = (*p).min(t.pos);
        }
        for (stream, from) in first {
            self.streams.truncate(stream, from, self.executor.as_mut());
        }
    }

    /// Scores the prompt positions among `rows`, then samples the rest.
    fn read_rows(&mut self, rows: &[SampleRow]) -> Vec<(RequestId, TokenId)> {
        let (scoring, sampling): (Vec<&SampleRow>, Vec<&SampleRow>) =
            rows.iter().partition(|r| r.scores.is_some());
        if !scoring.is_empty() {
            let started = Instant::now();
            for row in scoring {
                self.score_prompt(row);
            }
            self.step_times.sample += started.elapsed().as_secs_f64();
        }
        self.sample_rows(&sampling)
    }

    /// The log probability of the prompt token after the row's position,
    /// and the most likely tokens there, from the row's raw logits.
    fn score_prompt(&mut self, row: &SampleRow) {
        let Some(pos) = row.scores else {
            return;
        };
        let Some(scores) = self
            .seqs
            .get(&row.seq)
            .and_then(|s| s.prompt_scores.as_ref())
        else {
            return;
        };
        let next = scores.tokens[pos + 1].token;
        let (logprob, alternatives) =
            cortex_sample::logprobs(self.executor.logits(row.batch_index), next, scores.top);
        let top = alternatives
            .into_iter()
            .map(|(token, logprob)| TopLogprob {
                token,
                bytes: self.executor.token_bytes(token),
                logprob,
            })
            .collect();
        let scores = self
            .seqs
            .get_mut(&row.seq)
            .and_then(|s| s.prompt_scores.as_mut())
            .expect("looked up above");
        scores.tokens[pos + 1].logprob = Some(logprob);
        scores.tokens[pos + 1].top = top;
    }

    /// The token of each row, in order: taken from the device where it
    /// sampled the row, the argmax of the executor's logits read in place
    /// for a plain greedy row, else drawn by the row's sampler from a copy.
    /// A row the device should have sampled and did not fails its request.
    fn sample_rows(&mut self, rows: &[&SampleRow]) -> Vec<(RequestId, TokenId)> {
        let started = Instant::now();
        let mut tokens: Vec<Option<TokenId>> = vec![None; rows.len()];
        let mut on_host = Vec::new();
        let mut argmax = Vec::new();
        let mut lost = Vec::new();
        for (i, row) in rows.iter().enumerate() {
            let Some(seq) = self.seqs.get(&row.seq) else {
                continue;
            };
            match seq.sampled_at {
                SampledAt::Device => match self.executor.device_sampled(row.batch_index) {
                    Some(token) => {
                        tokens[i] = Some(token);
                        self.step_times.device_sampled += 1;
                    }
                    None => lost.push(seq.owner),
                },
                SampledAt::HostArgmax => argmax.push(i),
                SampledAt::HostSampler => on_host.push(i),
            }
        }
        if !argmax.is_empty() {
            let logits: Vec<&[f32]> = argmax
                .iter()
                .map(|&i| self.executor.logits(rows[i].batch_index))
                .collect();
            for (&i, token) in argmax.iter().zip(cortex_sample::argmax_rows(&logits)) {
                tokens[i] = Some(token);
            }
        }
        if !on_host.is_empty() {
            let host_rows: Vec<&SampleRow> = on_host.iter().map(|&i| rows[i]).collect();
            self.copy_logits(&host_rows);
            for (&i, token) in on_host.iter().zip(self.sample(&host_rows)) {
                tokens[i] = Some(token);
            }
        }
        for owner in lost {
            let error = ExecutorError::Failed("the device returned no sampled token".into());
            self.fail_request(owner, EngineError::executor(owner, &error));
        }
        self.step_times.sample += started.elapsed().as_secs_f64();
        rows.iter()
            .zip(tokens)
            .filter_map(|(row, token)| Some((row.seq, token?)))
            .filter(|(id, _)| self.seqs.contains_key(id))
            .collect()
    }

    fn copy_logits(&mut self, rows: &[&SampleRow]) {
        while self.logits.len() < rows.len() {
            self.logits.push(Vec::new());
        }
        for (buffer, row) in self.logits.iter_mut().zip(rows) {
            let logits = self.executor.logits(row.batch_index);
            buffer.clear();
            buffer.extend_from_slice(logits);
        }
    }

    /// Samples each row from the logits copied for it, in parallel; the
    /// tokens in the rows' order.
    fn sample(&mut self, rows: &[&SampleRow]) -> Vec<TokenId> {
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
        tokens
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
            bytes: self.executor.token_bytes(token),
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
