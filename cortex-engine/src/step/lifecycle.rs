//! How requests end, and the counters that follow them. Every request that
//! was submitted ends exactly once through [`StepLoop::report_end`], which
//! owns the in-flight count and the finished/failed counters.

use std::sync::atomic::Ordering;
use std::time::Instant;

use cortex_request::{Completion, FinishReason, RequestId, Response, Timings, Usage};

use super::StepLoop;
use crate::error::EngineError;
use crate::events::EngineEvent;
use crate::protocol::EventSender;

impl StepLoop<'_> {
    /// Queues a request's last event and counts its end (the statistics
    /// are published before the event is delivered).
    pub(super) fn report_end(&mut self, events: &EventSender, event: EngineEvent) {
        debug_assert!(event.is_terminal());
        self.tally
            .request_ended(matches!(event, EngineEvent::Failed { .. }));
        self.shared.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.outbox.push(events, event);
    }

    /// Ends one completion; ends its request when it was the last.
    pub(super) fn finish_seq(
        &mut self,
        id: RequestId,
        reason: FinishReason,
        still_scheduled: bool,
    ) {
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
        let logprobs = seq.top_logprobs.map(|_| {
            let mut logprobs = seq.logprobs;
            // One per token kept (none when the request generates nothing:
            // the token drawn to end its prompt is dropped).
            logprobs.truncate(seq.tokens.len());
            // The token that ended it (EOS or a stop id) is not part of the output.
            let ended_by_token = reason == FinishReason::Eos
                || seq
                    .tokens
                    .last()
                    .is_some_and(|t| seq.stop_token_ids.contains(t));
            if ended_by_token {
                logprobs.truncate(seq.tokens.len().saturating_sub(1));
            }
            logprobs
        });
        let mut parsed = match &seq.reading {
            Some(reading) if !reading.syntax.is_plain() => reading.syntax.parse(&seq.text),
            _ => cortex_chat::ParsedOutput {
                content: seq.text,
                ..Default::default()
            },
        };
        if seq.omit_reasoning {
            parsed.reasoning = None;
        }
        live.completions[seq.index as usize] = Some(Completion {
            index: seq.index,
            text: parsed.content,
            tokens: seq.tokens,
            finish_reason: reason,
            logprobs,
            prompt_logprobs: seq.prompt_scores.map(|scores| scores.tokens),
            tool_calls: parsed.tool_calls,
            reasoning: parsed.reasoning,
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
        self.tally.latency(&timings);
        let response = Response {
            id,
            completions,
            usage: Usage {
                prompt_tokens: live.prompt_tokens.iter().sum::<usize>() as u32,
                completion_tokens: completion_tokens as u32,
                cached_prompt_tokens: live.cached_prompt_tokens.iter().sum::<usize>() as u32,
            },
            timings,
            embeddings: Vec::new(),
        };
        self.report_end(&live.events, EngineEvent::Finished(response));
    }

    /// Fails a whole request (every completion), releasing its KV.
    pub(super) fn fail_request(&mut self, id: RequestId, error: EngineError) {
        let Some(live) = self.live.remove(&id) else {
            return;
        };
        for seq in &live.seqs {
            let _ = self.sched.abort(*seq);
            self.oversize.retain(|r| r.id != *seq);
            self.unbind(*seq);
            self.seqs.remove(seq);
        }
        self.report_end(&live.events, EngineEvent::Failed { id, error });
    }

    /// Ends a request with reason `cancelled`, keeping the text generated so far.
    pub(super) fn cancel(&mut self, id: RequestId) {
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
            self.oversize.retain(|r| r.id != seq);
            if let Some(s) = self.seqs.get_mut(&seq) {
                let tail = s.stops.finish();
                s.text.push_str(&tail);
            }
            self.finish_seq(seq, FinishReason::Cancelled, true);
        }
    }

    pub(super) fn check_timeouts(&mut self) {
        let Some(limit) = self.timeout else { return };
        let now = Instant::now();
        let stalled: Vec<(RequestId, u64)> = self
            .seqs
            .values()
            // Running, or sent back to the queue without having computed
            // anything since it was admitted: either way, stuck.
            .filter(|s| {
                (s.stream.is_some() || !s.progressed_since_bind)
                    && now.duration_since(s.last_progress) > limit
            })
            .map(|s| (s.owner, now.duration_since(s.last_progress).as_secs()))
            .collect();
        for (owner, seconds) in stalled {
            self.fail_request(owner, EngineError::Timeout { id: owner, seconds });
        }
    }

    pub(super) fn publish_stats(&mut self) {
        let kv = self.sched.kv_stats();
        let (sched, streams) = (&self.sched, &self.streams);
        let waiting = sched.num_waiting() + self.oversize.len();
        let kv_bytes =
            (streams.count() * streams.capacity() * self.executor.kv_bytes_per_token()) as u64;
        let stats = self.tally.snapshot(kv.evictions, |stats| {
            stats.waiting = waiting;
            stats.running = sched.num_running();
            stats.kv_utilisation = kv.utilisation;
            stats.kv_streams = streams.count();
            stats.kv_stream_tokens = streams.capacity();
            stats.kv_bytes = kv_bytes;
            stats.kv_retired_streams = streams.retired();
        });
        *self
            .shared
            .stats
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = stats;
    }
}
