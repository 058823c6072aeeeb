//! The llama.cpp backend: the only module that names llama types.

use std::num::NonZeroU32;
use std::path::Path;
use std::sync::OnceLock;

use cortex_request::{ChatMessage, TokenId};
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::{LlamaChatMessage, LlamaModel};
use llama_cpp_2::token::LlamaToken;
use llama_cpp_2::{DecodeError, LogOptions};

use crate::backend::{Backend, BackendError, BatchToken, SeqSlot};
use crate::error::EngineError;
use crate::gguf::read_gguf;

/// llama.cpp's process-wide initialisation, done once. Code in the same
/// process that drives llama-cpp-2 directly (benchmarks, comparison tests) must
/// use this instance: llama.cpp may only be initialised once.
pub fn llama() -> &'static LlamaBackend {
    static BACKEND: OnceLock<LlamaBackend> = OnceLock::new();
    BACKEND.get_or_init(|| {
        // llama.cpp logs every load step to stderr; route it to `tracing` instead.
        llama_cpp_2::send_logs_to_tracing(LogOptions::default());
        LlamaBackend::init().expect("llama.cpp is initialised only here")
    })
}

/// A loaded GGUF model (weights and vocabulary).
pub struct Model {
    inner: LlamaModel,
}

impl AsRef<LlamaModel> for Model {
    fn as_ref(&self) -> &LlamaModel {
        &self.inner
    }
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("n_vocab", &self.inner.n_vocab())
            .finish_non_exhaustive()
    }
}

impl Model {
    /// Loads a GGUF file, checking it first so that a missing, foreign or
    /// truncated file is a clear error rather than a failure inside llama.cpp.
    pub fn load(path: &Path) -> Result<Self, EngineError> {
        read_gguf(path)?;
        let inner = LlamaModel::load_from_file(llama(), path, &LlamaModelParams::default())
            .map_err(|e| EngineError::Load {
                path: path.to_owned(),
                detail: e.to_string(),
            })?;
        Ok(Self { inner })
    }

    /// Tokens in the vocabulary.
    pub fn n_vocab(&self) -> usize {
        self.inner.n_vocab() as usize
    }

    /// The context length the model was trained with.
    pub fn n_ctx_train(&self) -> usize {
        self.inner.n_ctx_train() as usize
    }

    /// Tokenizes text as llama.cpp does (the GGUF vocabulary is the tokenizer of record).
    pub fn tokenize(&self, text: &str, add_bos: bool, parse_special: bool) -> Vec<TokenId> {
        self.inner
            .vocab()
            .tokenize(text.as_bytes(), add_bos, parse_special)
            .into_iter()
            .map(|t| t.0 as TokenId)
            .collect()
    }

    /// The bytes of a token (special tokens render as their text).
    pub fn token_bytes(&self, token: TokenId) -> Vec<u8> {
        self.inner
            .vocab()
            .token_to_piece(LlamaToken(token as i32), false, None)
    }

    /// Whether the token ends generation.
    pub fn is_end_of_generation(&self, token: TokenId) -> bool {
        self.inner.vocab().is_eog(LlamaToken(token as i32))
    }

    /// Renders messages with the model's own chat template, ready for the
    /// assistant's reply.
    pub fn apply_chat_template(&self, messages: &[ChatMessage]) -> Result<String, BackendError> {
        let template = self.inner.chat_template(None).map_err(|e| {
            BackendError::Failed(format!("the model has no usable chat template: {e}"))
        })?;
        let chat = messages
            .iter()
            .map(|m| LlamaChatMessage::new(m.role.clone(), m.content.clone()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| BackendError::Failed(format!("chat message: {e}")))?;
        self.inner
            .apply_chat_template(&template, &chat, true)
            .map_err(|e| BackendError::Failed(format!("chat template: {e}")))
    }
}

/// Settings of a llama.cpp context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContextConfig {
    /// Tokens the unified KV cache holds, across all sequences.
    pub kv_tokens: usize,
    /// Sequence ids available.
    pub sequences: usize,
    /// Most tokens in one decode call.
    pub max_batch_tokens: usize,
    /// CPU threads.
    pub threads: usize,
}

/// A model plus a context with one unified KV cache shared by all sequences.
pub struct LlamaEngineBackend<'m> {
    model: &'m Model,
    ctx: LlamaContext<'m>,
    batch: LlamaBatch<'static>,
    batch_capacity: usize,
    kv_tokens: usize,
    sequences: usize,
}

impl<'m> LlamaEngineBackend<'m> {
    /// Creates the context.
    pub fn new(model: &'m Model, config: ContextConfig, path: &Path) -> Result<Self, EngineError> {
        let load_error = |detail: String| EngineError::Load {
            path: path.to_owned(),
            detail,
        };
        let sequences = config.sequences.clamp(1, 256);
        let kv =
            u32::try_from(config.kv_tokens).map_err(|_| load_error("KV size too large".into()))?;
        let batch = config.max_batch_tokens.max(1);
        let threads = i32::try_from(config.threads.max(1)).unwrap_or(1);
        let params = LlamaContextParams::default()
            .with_n_ctx(NonZeroU32::new(kv))
            .with_n_batch(batch as u32)
            // Larger micro-batches only grow llama.cpp's compute buffers.
            .with_n_ubatch(batch.min(512) as u32)
            .with_n_seq_max(sequences as u32)
            .with_kv_unified(true)
            .with_n_threads(threads)
            .with_n_threads_batch(threads);
        let ctx = model
            .inner
            .new_context(llama(), params)
            .map_err(|e| load_error(format!("cannot create a context: {e}")))?;
        let kv_tokens = ctx.n_ctx() as usize;
        Ok(Self {
            model,
            ctx,
            batch: LlamaBatch::new(batch, 1),
            batch_capacity: batch,
            kv_tokens,
            sequences,
        })
    }
}

impl Backend for LlamaEngineBackend<'_> {
    fn n_vocab(&self) -> usize {
        self.model.n_vocab()
    }

    fn n_ctx_train(&self) -> usize {
        self.model.n_ctx_train()
    }

    fn kv_capacity(&self) -> usize {
        self.kv_tokens
    }

    fn max_sequences(&self) -> usize {
        self.sequences
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

    fn apply_chat_template(&self, messages: &[ChatMessage]) -> Result<String, BackendError> {
        self.model.apply_chat_template(messages)
    }

    fn decode(&mut self, batch: &[BatchToken]) -> Result<(), BackendError> {
        if batch.len() > self.batch_capacity {
            return Err(BackendError::Failed(format!(
                "batch of {} tokens exceeds the context's {}",
                batch.len(),
                self.batch_capacity
            )));
        }
        self.batch.clear();
        for t in batch {
            self.batch
                .add(LlamaToken(t.token as i32), t.pos as i32, &[t.seq], t.logits)
                .map_err(|e| BackendError::Failed(e.to_string()))?;
        }
        self.ctx.decode(&mut self.batch).map_err(|e| match e {
            DecodeError::NoKvCacheSlot => BackendError::NoKvSlot,
            other => BackendError::Failed(other.to_string()),
        })
    }

    fn logits(&self, index: usize) -> &[f32] {
        self.ctx.get_logits_ith(index as i32)
    }

    fn copy_sequence(&mut self, src: SeqSlot, dst: SeqSlot, from: usize, to: usize) {
        // Positions are bounded by the context size, far below u32::MAX.
        let _ = self
            .ctx
            .copy_kv_cache_seq(src, dst, Some(from as u32), Some(to as u32));
    }

    fn remove_sequence(&mut self, seq: SeqSlot, from: usize, to: Option<usize>) {
        let _ =
            self.ctx
                .clear_kv_cache_seq(Some(seq as u32), Some(from as u32), to.map(|t| t as u32));
    }
}
