//! Commands in: submissions are validated, rendered, tokenized and queued
//! as one scheduler sequence per completion; cancellations and shutdowns.

use std::sync::Arc;
use std::time::Instant;

use cortex_chat::{Conversation, OutputSyntax};

use cortex_request::{CacheScope, Limits, Prompt, PromptToken, Request, RequestId, TokenId, Work};
use cortex_sample::Sampler;
use cortex_sched::{SchedError, SchedRequest};

use super::{ChatReading, Live, PromptScores, SampledAt, Seq, StepLoop};
use crate::error::EngineError;
use crate::events::EngineEvent;
use crate::executor::TokenGrammar;
use crate::protocol::EventSender;
use crate::protocol::{Command, Shutdown};
use crate::text::{StopMatcher, Utf8Stream};

impl StepLoop<'_> {
    /// Handles pending commands, blocking when idle. Returns false to stop.
    pub(super) fn receive_commands(&mut self) -> bool {
        loop {
            let command = if self.has_work() || self.draining {
                match self.commands.try_recv() {
                    Ok(c) => c,
                    Err(flume::TryRecvError::Empty) => return true,
                    Err(flume::TryRecvError::Disconnected) => return self.has_work(),
                }
            } else {
                // About to block: make the idle state and every event visible first.
                self.deliver(true);
                if let Some(governor) = &mut self.threads {
                    governor.pause();
                }
                match self.commands.recv() {
                    Ok(c) => c,
                    Err(_) => return false,
                }
            };
            match command {
                Command::Submit(pairs) => {
                    for (work, events) in pairs {
                        match &work {
                            Work::Generate(request) => self.admit_request(request, events),
                            Work::Embed(request) => self.admit_embedding(request, events),
                            other => self.report_end(
                                &events,
                                EngineEvent::Failed {
                                    id: other.id(),
                                    error: EngineError::Model(format!(
                                        "this engine cannot run {other:?}"
                                    )),
                                },
                            ),
                        }
                    }
                }
                Command::Cancel(id) => self.cancel(id),
                Command::Vocabulary(query) => query(self.executor.as_ref()),
                Command::Shutdown(Shutdown::Drain) => self.draining = true,
                Command::Shutdown(Shutdown::Abort) => {
                    let ids: Vec<RequestId> = self.live.keys().copied().collect();
                    for id in ids {
                        self.cancel(id);
                    }
                    self.fail_embeddings(&EngineError::Stopped);
                    self.refuse_pending(&EngineError::Stopped);
                    return false;
                }
            }
        }
    }

    /// Fails every submission still in the channel with `error`.
    pub(super) fn refuse_pending(&mut self, error: &EngineError) {
        while let Ok(command) = self.commands.try_recv() {
            if let Command::Submit(pairs) = command {
                for (work, events) in pairs {
                    self.report_end(
                        &events,
                        EngineEvent::Failed {
                            id: work.id(),
                            error: error.clone(),
                        },
                    );
                }
            }
        }
    }

    /// Validates, renders and tokenizes a request, then queues its completions.
    fn admit_request(&mut self, request: &Request, events: EventSender) {
        let id = request.id;
        match self.queue_completions(request) {
            Ok((seqs, prompt_tokens)) => {
                let n = request.n as usize;
                self.tally
                    .prompt((prompt_tokens.iter().sum::<usize>() * n) as u64);
                self.live.insert(
                    id,
                    Live {
                        events,
                        n: request.n,
                        cached_prompt_tokens: vec![0; prompt_tokens.len()],
                        prompt_tokens,
                        completions: vec![None; seqs.len()],
                        seqs,
                        submitted: Instant::now(),
                        started: None,
                        first_token: None,
                    },
                );
            }
            Err(error) => self.report_end(&events, EngineEvent::Failed { id, error }),
        }
    }

    /// Adds one scheduler sequence per completion (or parks them until the
    /// streams grow); all or nothing. Returns them and each prompt's length.
    fn queue_completions(
        &mut self,
        request: &Request,
    ) -> Result<(Vec<RequestId>, Vec<usize>), EngineError> {
        let id = request.id;
        if self.live.contains_key(&id) {
            return Err(EngineError::DuplicateId(id));
        }
        request
            .validate(&Limits::default())
            .map_err(|e| EngineError::invalid(id, &e))?;
        self.check_token_fields(request)?;
        if let Some(gbnf) = &request.grammar {
            // Whoever submitted it, a grammar reaches llama.cpp's parser only
            // once it is known to load and run there within bounds.
            cortex_grammar::check(gbnf).map_err(|e| EngineError::Invalid {
                id,
                field: "grammar".into(),
                message: e.to_string(),
            })?;
        }
        // Generation stops at the context's end (`length`), but a max_tokens
        // no context of the model's could ever hold is a mistake, refused
        // as OpenAI refuses one (the default of 256 fits every model).
        if request.stop.max_tokens as usize > self.info.n_ctx_train.max(1) {
            return Err(EngineError::Invalid {
                id,
                field: "max_tokens".into(),
                message: format!(
                    "{} is more than this model's context of {} tokens (prompt and generation together)",
                    request.stop.max_tokens, self.info.n_ctx_train
                ),
            });
        }
        let (prompts, chat) = self.tokenize_prompts(request)?;
        let limit = self.info.max_sequence_tokens;
        if let Some(long) = prompts.iter().find(|p| p.len() >= limit) {
            return Err(EngineError::PromptTooLong {
                id,
                prompt_tokens: long.len(),
                limit,
            });
        }
        for prompt in &prompts {
            self.timeline.prompt(prompt);
        }
        // The request's own grammar (response_format, grammar), else the one
        // the chat's tools ask for (a forced call, the generic tools format).
        let gbnf = request
            .grammar
            .as_deref()
            .or_else(|| chat.as_ref().and_then(|c| c.grammar.as_deref()));
        let grammar = |executor: &dyn crate::executor::Executor| {
            gbnf.map(|gbnf| executor.grammar(gbnf))
                .transpose()
                .map_err(|e| EngineError::Invalid {
                    id,
                    field: "grammar".into(),
                    message: e.to_string(),
                })
        };
        // One grammar per completion, all made before anything is queued.
        // (Parsed again for each: llama.cpp's copy of a grammar costs more
        // than a parse, its stacks rebound by a scan of every rule.)
        let mut grammars = (0..request.choices())
            .map(|_| grammar(self.executor.as_ref()))
            .collect::<Result<Vec<_>, _>>()?
            .into_iter();
        let now = Instant::now();
        let mut seqs = Vec::with_capacity(request.choices() as usize);
        // Completion p × n + k continues prompt p.
        let completions = prompts
            .iter()
            .flat_map(|prompt| (0..request.n).map(move |_| prompt))
            .zip(0..);
        for (prompt, index) in completions {
            // Generation stops at the context's end: `length`, like max_tokens.
            // A prompt scored with no new tokens still draws one, dropped.
            let max_new = (request.stop.max_tokens.max(1) as usize).min(limit - prompt.len());
            let seq_id = RequestId(self.next_seq);
            self.next_seq += 1;
            // A scored prompt is computed whole: a scope of its own shares
            // no cached prefix (whose positions' logits are gone), yet
            // finds its own blocks again after a preemption.
            let cache_scope = match request.prompt_logprobs {
                Some(_) => CacheScope::private(seq_id.0),
                None => request.cache_scope,
            };
            let sched_request = SchedRequest {
                id: seq_id,
                prompt: prompt.clone(),
                max_new_tokens: max_new,
                priority: request.priority,
                cache_scope,
            };
            if prompt.len() + max_new <= self.streams.capacity() {
                if let Err(e) = self.sched.add(sched_request) {
                    for s in &seqs {
                        let _ = self.sched.abort(*s);
                        self.seqs.remove(s);
                    }
                    self.oversize.retain(|r| !seqs.contains(&r.id));
                    return Err(match e {
                        SchedError::TooLong { .. } => EngineError::PromptTooLong {
                            id,
                            prompt_tokens: prompt.len(),
                            limit,
                        },
                        other => EngineError::Model(other.to_string()),
                    });
                }
            } else {
                self.oversize.push(sched_request);
            }
            let grammar = grammars.next().expect("one grammar per completion");
            let reading = chat.as_ref().map(|c| Arc::clone(&c.reading));
            let mut seq = new_seq(request, index, grammar, reading, now);
            seq.prompt_scores = request.prompt_logprobs.map(|top| PromptScores {
                top: top as usize,
                tokens: prompt
                    .iter()
                    .map(|&token| PromptToken {
                        token,
                        bytes: self.executor.token_bytes(token),
                        logprob: None,
                        top: Vec::new(),
                    })
                    .collect(),
            });
            self.seqs.insert(seq_id, seq);
            seqs.push(seq_id);
        }
        Ok((seqs, prompts.iter().map(Vec::len).collect()))
    }

    /// Each prompt's tokens: one for a text, tokens or chat prompt, one per
    /// entry of a prompt list; for a chat, how its output is read and the
    /// grammar its tools ask for.
    fn tokenize_prompts(
        &self,
        request: &Request,
    ) -> Result<(Vec<Vec<TokenId>>, Option<ChatOutput>), EngineError> {
        if request.tools.is_some() && !matches!(request.prompt, Prompt::Chat(_)) {
            return Err(EngineError::Invalid {
                id: request.id,
                field: "tools".into(),
                message: "tools are offered through a chat template: give messages, not a prompt"
                    .into(),
            });
        }
        if let Prompt::Chat(messages) = &request.prompt {
            let conversation = Conversation {
                messages,
                tools: request.tools.as_ref(),
                variables: request.template_variables.as_deref(),
            };
            let rendered = self
                .executor
                .apply_chat_template(&conversation, &request.chat_template)
                .map_err(|e| EngineError::Invalid {
                    id: request.id,
                    field: "messages".into(),
                    message: e.to_string(),
                })?;
            let tokens = self.executor.tokenize(&rendered.prompt, true, true);
            self.check_prompt(request, &tokens, "messages")?;
            let kept = self.kept_tokens(&rendered.syntax);
            let chat = ChatOutput {
                reading: Arc::new(ChatReading {
                    syntax: rendered.syntax,
                    kept,
                }),
                grammar: rendered.grammar,
            };
            return Ok((vec![tokens], Some(chat)));
        }
        let several = matches!(request.prompt, Prompt::Several(_));
        let parts = request.prompt.parts();
        let prompts = parts
            .iter()
            .enumerate()
            .map(|(i, part)| {
                let field = if several {
                    format!("prompt[{i}]")
                } else {
                    "prompt".to_owned()
                };
                self.tokenize_prompt(request, part, &field)
            })
            .collect::<Result<_, _>>()?;
        Ok((prompts, None))
    }

    fn tokenize_prompt(
        &self,
        request: &Request,
        prompt: &Prompt,
        field: &str,
    ) -> Result<Vec<TokenId>, EngineError> {
        let tokens = match prompt {
            Prompt::Text(text) => self.executor.tokenize(text, true, true),
            Prompt::Tokens(tokens) => {
                self.check_vocabulary(tokens)
                    .map_err(|message| EngineError::Invalid {
                        id: request.id,
                        field: field.into(),
                        message,
                    })?;
                tokens.clone()
            }
            Prompt::Chat(_) => unreachable!("chats are rendered by tokenize_prompts"),
            Prompt::Several(_) => unreachable!("lists do not nest: refused by validate"),
        };
        self.check_prompt(request, &tokens, field)?;
        Ok(tokens)
    }

    fn check_prompt(
        &self,
        request: &Request,
        tokens: &[TokenId],
        field: &str,
    ) -> Result<(), EngineError> {
        if tokens.is_empty() {
            return Err(EngineError::Invalid {
                id: request.id,
                field: field.into(),
                message: "the prompt has no tokens".into(),
            });
        }
        Ok(())
    }

    /// The control tokens a chat's output syntax writes as its markers
    /// (`<|channel|>`, `[TOOL_CALLS]`): each marker that is one token the
    /// vocabulary renders as nothing, kept as text in this output.
    fn kept_tokens(&self, syntax: &OutputSyntax) -> Vec<TokenId> {
        let mut kept: Vec<TokenId> = syntax
            .marker_texts()
            .into_iter()
            .filter_map(
                |marker| match self.executor.tokenize(marker, false, true)[..] {
                    [token] if self.executor.token_bytes(token).is_empty() => Some(token),
                    _ => None,
                },
            )
            .collect();
        kept.sort_unstable();
        kept.dedup();
        kept
    }
}

/// How a chat's completions are read, and the grammar its tools ask for.
struct ChatOutput {
    reading: Arc<ChatReading>,
    grammar: Option<String>,
}

impl StepLoop<'_> {
    /// Refuses `logit_bias` and `stop_token_ids` entries for tokens the
    /// model does not have (they could never mean anything).
    fn check_token_fields(&self, request: &Request) -> Result<(), EngineError> {
        let invalid = |field: &str, message: String| EngineError::Invalid {
            id: request.id,
            field: field.into(),
            message,
        };
        let biased: Vec<TokenId> = request.sampling.logit_bias.keys().copied().collect();
        self.check_vocabulary(&biased)
            .map_err(|message| invalid("logit_bias", message))?;
        self.check_vocabulary(&request.stop.stop_token_ids)
            .map_err(|message| invalid("stop_token_ids", message))
    }

    /// Refuses token ids the model's vocabulary does not have.
    pub(super) fn check_vocabulary(&self, tokens: &[TokenId]) -> Result<(), String> {
        let vocab = self.info.n_vocab;
        match tokens.iter().find(|&&t| t as usize >= vocab) {
            Some(bad) => Err(format!(
                "token id {bad} is outside the vocabulary of {vocab}"
            )),
            None => Ok(()),
        }
    }
}

/// The loop's state for completion `index` of `request`.
fn new_seq(
    request: &Request,
    index: u32,
    grammar: Option<Box<dyn TokenGrammar>>,
    reading: Option<Arc<ChatReading>>,
    now: Instant,
) -> Seq {
    // Each completion has its own stream of random numbers: seed + index, or
    // one derived from the request id, so runs repeat.
    let mut sampling = request.sampling.clone();
    sampling.seed = sampling.seed.map(|s| s.wrapping_add(u64::from(index)));
    let fallback = request
        .id
        .0
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(u64::from(index));
    // A row that needs only the argmax of the raw logits may be sampled
    // where they are computed; the rest go through the sampler.
    // A scored prompt needs its rows' logits whole: never the device's argmax.
    let sampled_at = if sampling.is_plain_argmax()
        && grammar.is_none()
        && request.logprobs.is_none()
        && request.prompt_logprobs.is_none()
    {
        SampledAt::HostArgmax
    } else {
        SampledAt::HostSampler
    };
    Seq {
        owner: request.id,
        index,
        sampler: Sampler::new(sampling, fallback),
        sampled_at,
        utf8: Utf8Stream::default(),
        stops: StopMatcher::new(request.stop.stop.clone()),
        stop_token_ids: request.stop.stop_token_ids.clone(),
        ignore_eos: request.stop.ignore_eos,
        text: String::new(),
        tokens: Vec::new(),
        top_logprobs: request.logprobs.map(|top| top as usize),
        omit_reasoning: request.omit_reasoning,
        output: reading
            .as_ref()
            .filter(|r| !r.syntax.is_plain())
            .map(|r| cortex_chat::OutputStream::new(r.syntax.clone())),
        reading,
        logprobs: Vec::new(),
        prompt_scores: None,
        generates_nothing: request.stop.max_tokens == 0,
        grammar,
        stream: None,
        last_progress: now,
        progressed_since_bind: true,
    }
}
