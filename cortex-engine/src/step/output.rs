//! Each sampled token: stop conditions (end of generation, stop ids, stop
//! strings, length) and the text it adds, streamed as an event.

use std::time::Instant;

use cortex_request::{FinishReason, RequestId, TokenId};

use super::StepLoop;
use crate::events::EngineEvent;
use crate::text::StopScan;

impl StepLoop<'_> {
    /// Applies stop conditions to a sampled token and streams its text.
    pub(super) fn on_token(&mut self, id: RequestId, token: TokenId, at_length: bool) {
        let Some(seq) = self.seqs.get_mut(&id) else {
            return;
        };
        if seq.generates_nothing {
            // The token only ended the scored prompt's computation.
            self.finish_seq(id, FinishReason::Length, !at_length);
            return;
        }
        let owner = seq.owner;
        self.tally.generated();
        seq.tokens.push(token);
        let is_end = !seq.ignore_eos && self.executor.is_end_of_generation(token);
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
            let kept = seq
                .reading
                .as_ref()
                .is_some_and(|r| r.kept.binary_search(&token).is_ok());
            let bytes = if kept {
                self.executor.control_token_text(token)
            } else {
                self.executor.token_bytes(token)
            };
            let text = seq.utf8.push(&bytes);
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
        // A chat read for thinking or calls tells what it can of its text so
        // far, and the rest when it ends.
        let told = match &mut seq.output {
            Some(output) => {
                let mut told = output.push(&delta);
                if finish.is_some() {
                    told.extend(output.finish());
                }
                if seq.omit_reasoning {
                    told.reasoning.clear();
                }
                told
            }
            None => cortex_chat::OutputDelta {
                content: delta,
                ..Default::default()
            },
        };
        let index = seq.index;
        // Sampling recorded this token's log probabilities last.
        let logprob = (seq.top_logprobs.is_some() && !is_end && !is_stop_token)
            .then(|| seq.logprobs.last().cloned())
            .flatten();
        if let Some(live) = self.live.get_mut(&owner) {
            live.first_token.get_or_insert_with(Instant::now);
            self.outbox.push(
                &live.events,
                EngineEvent::Token {
                    id: owner,
                    index,
                    token,
                    text: told.content,
                    reasoning: told.reasoning,
                    calls: told.calls,
                    call_pieces: told.call_pieces,
                    logprob,
                },
            );
        }
        if let Some(reason) = finish {
            self.finish_seq(id, reason, !at_length);
        }
    }
}

impl StopScan {
    fn into_text(self) -> String {
        match self {
            StopScan::Continue(text) | StopScan::Stopped(text) => text,
        }
    }
}
