//! The engine's [`Executor`] on llama.cpp: one KV stream per sequence.

use std::path::{Path, PathBuf};

use cortex_chat::{Conversation, RenderedChat};
use cortex_engine::{
    BatchToken, EMBED_SEQUENCES, Executor, ExecutorError, KvLayout, PrefixShare, StreamId,
    TokenGrammar,
};
use cortex_request::{ChatMessage, ChatTemplateChoice, TokenId};

use crate::Model;
use crate::chat::{ChatRenderer, ChatRenderers};
use crate::sys::{ContextParams, RawBatch, RawContext, RawGrammar};

/// llama.cpp's limit on sequences (`LLAMA_MAX_SEQ`).
pub(crate) const MAX_STREAMS: usize = 256;

/// Settings of a llama.cpp context besides the KV layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ContextConfig {
    /// Most tokens in one decode call.
    pub max_batch_tokens: usize,
    /// Tokens in one of llama.cpp's micro-batches (its `n_ubatch`).
    pub micro_batch_tokens: usize,
    /// CPU threads.
    pub threads: usize,
    /// Take the argmax of greedy rows on the device that computes the
    /// logits (see [`Executor::sample_on_device`]), where it can.
    pub sample_on_device: bool,
}

/// A model plus a context whose KV cache has one stream per sequence
/// (llama.cpp's non-unified mode: a token attends only to its own stream).
pub(crate) struct LlamaExecutor<'m> {
    model: &'m Model,
    /// What renders chats: the model's own template or the one chosen,
    /// and those requests choose.
    chat: ChatRenderers,
    config: ContextConfig,
    path: PathBuf,
    ctx: Option<RawContext<'m>>,
    layout: KvLayout,
    batch: RawBatch,
    /// The embedding context, made on the first embedding request and
    /// grown to the largest batch; its batch holds as many tokens.
    embedder: Option<(RawContext<'m>, RawBatch)>,
    /// Whether greedy rows may be sampled on the device: asked for, and the
    /// device that computes the logits can.
    device_sampling: bool,
}

impl<'m> LlamaExecutor<'m> {
    /// An executor over `model`; its context is made by the first
    /// [`Executor::set_kv_layout`] (the engine's, once it has sized the KV).
    pub(crate) fn new(model: &'m Model, config: ContextConfig, path: &Path) -> Self {
        Self {
            model,
            chat: ChatRenderers::new(
                ChatRenderer::new(model, None).unwrap_or(ChatRenderer::Missing),
                None,
            ),
            config,
            path: path.to_owned(),
            ctx: None,
            layout: KvLayout {
                streams: 0,
                capacity: 0,
            },
            batch: RawBatch::new(config.max_batch_tokens.max(1)),
            embedder: None,
            device_sampling: config.sample_on_device && model.samples_on_device(),
        }
    }

    /// Renders chats with `template` (a Jinja template's text, or a name
    /// llama.cpp knows) instead of the model's own; a template that does
    /// not compile, or renders no chat, is refused here.
    pub(crate) fn with_chat_template(mut self, template: &str) -> Result<Self, ExecutorError> {
        let chat = ChatRenderer::new(self.model, Some(template))?;
        chat.render(&Conversation::new(&[ChatMessage::user("hi")]))?;
        self.chat = ChatRenderers::new(chat, Some(template.to_owned()));
        Ok(self)
    }

    /// The embedding context and batch, able to take `tokens` tokens in
    /// one decode: made (or remade larger) as needed, emptied.
    fn embedder(
        &mut self,
        tokens: usize,
    ) -> Result<&mut (RawContext<'m>, RawBatch), ExecutorError> {
        let fits = self
            .embedder
            .as_ref()
            .is_some_and(|(_, batch)| batch.capacity() >= tokens);
        if !fits {
            let capacity = tokens.next_power_of_two().max(EMBED_MIN_CELLS);
            self.embedder = None;
            let params = ContextParams {
                cells: capacity,
                sequences: EMBED_SEQUENCES,
                batch: capacity,
                // Pooling needs each sequence whole in one micro-batch.
                micro_batch: capacity,
                threads: self.config.threads,
                // One batch at a time, emptied before each: a unified cache
                // holds just that batch.
                unified: true,
                embeddings: Some(self.model.embedding_pooling()),
            };
            let ctx = RawContext::new(&self.model.raw, &params).map_err(|e| {
                ExecutorError::Failed(format!(
                    "{}: cannot create an embedding context of {capacity} tokens: {e}",
                    self.path.display()
                ))
            })?;
            self.embedder = Some((ctx, RawBatch::new(capacity)));
        }
        let embedder = self.embedder.as_mut().expect("made above");
        embedder.0.clear_memory();
        embedder.1.clear();
        Ok(embedder)
    }

    fn ctx(&self) -> &RawContext<'m> {
        self.ctx
            .as_ref()
            .expect("the engine sets a KV layout first")
    }

    fn ctx_mut(&mut self) -> &mut RawContext<'m> {
        self.ctx
            .as_mut()
            .expect("the engine sets a KV layout first")
    }
}

impl Executor for LlamaExecutor<'_> {
    fn n_vocab(&self) -> usize {
        self.model.n_vocab()
    }

    fn n_ctx_train(&self) -> usize {
        self.model.n_ctx_train()
    }

    fn kv_bytes_per_token(&self) -> usize {
        self.model.kv_bytes_per_token()
    }

    fn kv_layout(&self) -> KvLayout {
        self.layout
    }

    fn device_name(&self) -> String {
        self.model.device().name
    }

    fn kv_memory_available(&self) -> Option<usize> {
        match self.model.gpu_memory() {
            // What llama.cpp allocates beside the KV on the device: the
            // logits of a batch, compute buffers, a margin.
            Some((free, total)) => {
                let logits = self.model.n_vocab() * self.config.max_batch_tokens * 4;
                Some(free.saturating_sub((256 << 20) + logits + total / 20))
            }
            None => cortex_engine::system::meminfo("MemAvailable"),
        }
    }

    fn default_kv_memory(&self) -> Option<usize> {
        let available = self.kv_memory_available();
        if self.model.gpu_memory().is_some() {
            return available;
        }
        let quarter = cortex_engine::system::meminfo("MemTotal").map_or(2 << 30, |total| total / 4);
        Some(available.map_or(quarter, |available| available.min(quarter)))
    }

    fn set_kv_layout(&mut self, layout: KvLayout) -> Result<(), ExecutorError> {
        let streams = layout.streams.clamp(1, MAX_STREAMS);
        let capacity = layout.capacity.max(1).next_multiple_of(256);
        let params = ContextParams {
            cells: streams * capacity,
            sequences: streams,
            batch: self.batch.capacity(),
            micro_batch: self.config.micro_batch_tokens,
            threads: self.config.threads,
            unified: false,
            embeddings: None,
        };
        // The old context's memory goes before the new one is allocated.
        self.ctx = None;
        let ctx = RawContext::new(&self.model.raw, &params).map_err(|e| {
            ExecutorError::Failed(format!(
                "{}: cannot create a context of {streams} streams x {capacity} tokens: {e}",
                self.path.display()
            ))
        })?;
        self.ctx = Some(ctx);
        self.layout = KvLayout { streams, capacity };
        Ok(())
    }

    fn set_threads(&mut self, threads: usize) {
        self.ctx_mut().set_threads(threads);
        if let Some((ctx, _)) = &mut self.embedder {
            ctx.set_threads(threads);
        }
    }

    fn embed(&mut self, inputs: &[Vec<TokenId>]) -> Result<Vec<Vec<f32>>, ExecutorError> {
        if inputs.len() > EMBED_SEQUENCES {
            return Err(ExecutorError::Failed(format!(
                "{} inputs in one embedding batch; at most {EMBED_SEQUENCES}",
                inputs.len()
            )));
        }
        let n_embd = self.model.n_embd();
        let tokens = inputs.iter().map(Vec::len).sum();
        let (ctx, batch) = self.embedder(tokens)?;
        for (seq, input) in (0..).zip(inputs) {
            for (pos, &token) in input.iter().enumerate() {
                batch.push(token as i32, pos, seq, true);
            }
        }
        match ctx.decode(batch) {
            0 => {}
            1 => return Err(ExecutorError::NoKvSlot),
            code => {
                return Err(ExecutorError::Failed(format!(
                    "llama_decode (embeddings) failed with code {code}"
                )));
            }
        }
        (0..inputs.len() as i32)
            .map(|seq| {
                let pooled = ctx.sequence_embedding(seq, n_embd).ok_or_else(|| {
                    ExecutorError::Failed(format!("llama.cpp gave no embedding for input {seq}"))
                })?;
                Ok(normalized(pooled))
            })
            .collect()
    }

    fn tokenize(&self, text: &str, add_bos: bool, parse_special: bool) -> Vec<TokenId> {
        self.model.tokenize(text, add_bos, parse_special)
    }

    fn token_bytes(&self, token: TokenId) -> Vec<u8> {
        self.model.token_bytes(token)
    }

    fn is_end_of_generation(&self, token: TokenId) -> bool {
        self.model.is_end_of_generation(token)
    }

    fn start_end_texts(&self) -> (String, String) {
        self.model.start_end_texts()
    }

    fn apply_chat_template(
        &self,
        conversation: &Conversation<'_>,
        template: &ChatTemplateChoice,
    ) -> Result<RenderedChat, ExecutorError> {
        self.chat.render(self.model, conversation, template)
    }

    fn control_token_text(&self, token: TokenId) -> Vec<u8> {
        self.model.control_token_text(token)
    }

    fn grammar(&self, gbnf: &str) -> Result<Box<dyn TokenGrammar>, ExecutorError> {
        let grammar = RawGrammar::new(&self.model.raw, gbnf).map_err(ExecutorError::Failed)?;
        Ok(Box::new(grammar))
    }

    fn decode(&mut self, batch: &[BatchToken]) -> Result<(), ExecutorError> {
        self.batch.clear();
        for t in batch {
            if !self.batch.push(t.token as i32, t.pos, t.stream, t.logits) {
                return Err(ExecutorError::Failed(format!(
                    "batch of {} tokens exceeds the context's {}",
                    batch.len(),
                    self.batch.capacity()
                )));
            }
        }
        let ctx = self
            .ctx
            .as_mut()
            .expect("the engine sets a KV layout first");
        match ctx.decode(&self.batch) {
            0 => Ok(()),
            1 => Err(ExecutorError::NoKvSlot),
            code => Err(ExecutorError::Failed(format!(
                "llama_decode failed with code {code}"
            ))),
        }
    }

    fn reads_shared_prefixes(&self) -> bool {
        self.model.attention_on_cortex_kernels()
    }

    fn share_prefixes(&mut self, shares: &[PrefixShare]) {
        let streams = self.layout.streams;
        self.ctx_mut().share_prefixes(
            streams,
            shares.iter().map(|s| (s.stream, s.source, s.cells)),
        );
    }

    fn sample_on_device(&mut self, stream: StreamId, greedy: bool) -> bool {
        let on = greedy && self.device_sampling;
        self.ctx_mut().set_device_greedy(stream, on)
    }

    fn device_sampled(&mut self, index: usize) -> Option<TokenId> {
        self.ctx_mut()
            .device_sampled(index)
            .map(|token| token as TokenId)
    }

    fn synchronize(&mut self) {
        self.ctx_mut().synchronize();
    }

    fn graphs_reused(&self) -> u64 {
        self.ctx.as_ref().map_or(0, RawContext::graphs_reused)
    }

    fn logits(&self, index: usize) -> &[f32] {
        self.ctx()
            .logits(index)
            .expect("logits were asked for this row")
    }

    fn copy_stream(&mut self, src: StreamId, dst: StreamId) {
        self.ctx_mut().copy_sequence(src, dst);
    }

    fn truncate_stream(&mut self, stream: StreamId, from: usize) {
        self.ctx_mut().truncate_sequence(stream, from);
    }
}

/// Cells an embedding context starts with.
const EMBED_MIN_CELLS: usize = 512;

/// `v` scaled to unit length (Euclidean), as OpenAI's embeddings are, so a
/// dot product is the cosine similarity.
fn normalized(v: &[f32]) -> Vec<f32> {
    let norm = v
        .iter()
        .map(|x| f64::from(*x) * f64::from(*x))
        .sum::<f64>()
        .sqrt();
    let scale = if norm > 0.0 { (1.0 / norm) as f32 } else { 0.0 };
    v.iter().map(|x| x * scale).collect()
}

impl cortex_sample::TokenFilter for RawGrammar {
    fn allows(&mut self, token: TokenId) -> bool {
        RawGrammar::allows(self, token as i32)
    }

    fn mask(&mut self, logits: &mut [f32]) {
        RawGrammar::mask(self, logits);
    }
}

impl TokenGrammar for RawGrammar {
    fn accept(&mut self, token: TokenId) {
        RawGrammar::accept(self, token as i32);
    }
}
