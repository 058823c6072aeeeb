//! Embedding requests: inputs tokenized at intake, then packed across
//! requests, in arrival order, into decodes of their own (at most
//! [`EMBED_SEQUENCES`] inputs and [`EMBED_BATCH_TOKENS`] tokens each), one
//! between two generation steps. A request ends when its last input is done.

use std::time::Instant;

use cortex_request::{EmbeddingRequest, Prompt, RequestId, Response, Timings, TokenId, Usage};

use super::StepLoop;
use crate::error::EngineError;
use crate::events::EngineEvent;
use crate::executor::EMBED_SEQUENCES;
use crate::protocol::EventSender;

/// Tokens one embedding decode takes at most (a longer input goes alone).
/// In one unified cache every token of a batch attends over the whole
/// batch's cells (masked), a cost that grows with the batch's square:
/// measured on 2 cores with 2,000 short inputs, 2,048 tokens gave 210
/// tokens/s, 512 gave 230-237, 256 gave 220-231.
pub(super) const EMBED_BATCH_TOKENS: usize = 512;

/// An embedding request in the loop.
pub(super) struct PendingEmbed {
    id: RequestId,
    events: EventSender,
    inputs: Vec<Vec<TokenId>>,
    vectors: Vec<Vec<f32>>,
    submitted: Instant,
    started: Option<Instant>,
}

impl StepLoop<'_> {
    /// Validates and tokenizes an embedding request and queues it.
    pub(super) fn admit_embedding(&mut self, request: &EmbeddingRequest, events: EventSender) {
        let id = request.id;
        match self.tokenize_inputs(request) {
            Ok(inputs) => {
                self.tally
                    .prompt(inputs.iter().map(|i| i.len() as u64).sum::<u64>());
                self.embeds.push_back(PendingEmbed {
                    id,
                    events,
                    vectors: Vec::with_capacity(inputs.len()),
                    inputs,
                    submitted: Instant::now(),
                    started: None,
                });
            }
            Err(error) => self.report_end(&events, EngineEvent::Failed { id, error }),
        }
    }

    fn tokenize_inputs(
        &self,
        request: &EmbeddingRequest,
    ) -> Result<Vec<Vec<TokenId>>, EngineError> {
        let id = request.id;
        let invalid = |message: String| EngineError::Invalid {
            id,
            field: "input".into(),
            message,
        };
        if self.live.contains_key(&id) || self.embeds.iter().any(|e| e.id == id) {
            return Err(EngineError::DuplicateId(id));
        }
        request.validate().map_err(|e| invalid(e.to_string()))?;
        let limit = self.info.n_ctx_train;
        request
            .inputs
            .iter()
            .enumerate()
            .map(|(i, input)| {
                let tokens = match input {
                    Prompt::Text(text) => self.executor.tokenize(text, true, true),
                    Prompt::Tokens(tokens) => {
                        self.check_vocabulary(tokens)
                            .map_err(|e| invalid(format!("input[{i}]: {e}")))?;
                        tokens.clone()
                    }
                    Prompt::Chat(_) | Prompt::Several(_) => unreachable!("refused by validate"),
                };
                if tokens.is_empty() {
                    return Err(invalid(format!("input[{i}] has no tokens")));
                }
                if tokens.len() > limit {
                    return Err(EngineError::PromptTooLong {
                        id,
                        prompt_tokens: tokens.len(),
                        limit,
                    });
                }
                Ok(tokens)
            })
            .collect()
    }

    /// Computes the next batch of waiting inputs and ends the requests it
    /// completes; a failed decode fails the requests that had inputs in it.
    pub(super) fn embed_step(&mut self) {
        // (request position in the queue, input index) of each batch entry.
        let mut picked: Vec<(usize, usize)> = Vec::new();
        let mut tokens = 0;
        'fill: for (at, pending) in self.embeds.iter().enumerate() {
            for index in pending.vectors.len()..pending.inputs.len() {
                let len = pending.inputs[index].len();
                if picked.len() == EMBED_SEQUENCES
                    || (!picked.is_empty() && tokens + len > EMBED_BATCH_TOKENS)
                {
                    break 'fill;
                }
                picked.push((at, index));
                tokens += len;
            }
        }
        let batch: Vec<Vec<TokenId>> = picked
            .iter()
            .map(|&(at, index)| self.embeds[at].inputs[index].clone())
            .collect();
        let now = Instant::now();
        for &(at, _) in &picked {
            self.embeds[at].started.get_or_insert(now);
        }
        self.tally.step();
        self.tally.prefilled(tokens as u64);
        match self.executor.embed(&batch) {
            Ok(vectors) => {
                for (&(at, _), vector) in picked.iter().zip(vectors) {
                    self.embeds[at].vectors.push(vector);
                }
            }
            Err(error) => {
                let mut failed: Vec<usize> = picked.iter().map(|&(at, _)| at).collect();
                failed.dedup();
                for at in failed.into_iter().rev() {
                    let pending = self.embeds.remove(at).expect("picked from the queue");
                    let error = EngineError::executor(pending.id, &error);
                    self.report_end(
                        &pending.events,
                        EngineEvent::Failed {
                            id: pending.id,
                            error,
                        },
                    );
                }
                return;
            }
        }
        while self
            .embeds
            .front()
            .is_some_and(|p| p.vectors.len() == p.inputs.len())
        {
            let pending = self.embeds.pop_front().expect("checked");
            self.finish_embedding(pending);
        }
    }

    fn finish_embedding(&mut self, pending: PendingEmbed) {
        let now = Instant::now();
        let timings = Timings {
            queued: pending
                .started
                .unwrap_or(now)
                .duration_since(pending.submitted),
            first_token: None,
            finished: now.duration_since(pending.submitted),
        };
        let response = Response {
            id: pending.id,
            completions: Vec::new(),
            usage: Usage {
                prompt_tokens: pending.inputs.iter().map(|i| i.len() as u32).sum(),
                ..Usage::default()
            },
            timings,
            embeddings: pending.vectors,
        };
        self.report_end(&pending.events, EngineEvent::Finished(response));
    }

    /// Fails every embedding request in hand with `error`.
    pub(super) fn fail_embeddings(&mut self, error: &EngineError) {
        while let Some(pending) = self.embeds.pop_front() {
            self.report_end(
                &pending.events,
                EngineEvent::Failed {
                    id: pending.id,
                    error: error.clone(),
                },
            );
        }
    }
}
