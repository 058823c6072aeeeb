//! A loaded GGUF model: vocabulary, tokenizer, chat template, KV footprint.

use std::path::Path;
use std::sync::Arc;

use cortex_request::{ChatMessage, TokenId};

use super::chat::ChatRenderer;
use super::sys::{self, RawModel};
use crate::backend::BackendError;
use crate::error::EngineError;
use crate::gguf::read_gguf;

/// A loaded GGUF model (weights, memory-mapped, and vocabulary).
pub struct Model {
    /// Shared with the grammars made for it, which read its vocabulary.
    pub(crate) raw: Arc<RawModel>,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("n_vocab", &self.n_vocab())
            .finish_non_exhaustive()
    }
}

impl Model {
    /// Loads a GGUF file, checking it first so that a missing, foreign or
    /// truncated file is a clear error rather than a failure inside llama.cpp.
    pub fn load(path: &Path) -> Result<Self, EngineError> {
        read_gguf(path)?;
        let raw = RawModel::load(path).map_err(|detail| EngineError::Load {
            path: path.to_owned(),
            detail,
        })?;
        Ok(Self { raw: Arc::new(raw) })
    }

    /// Tokens in the vocabulary.
    pub fn n_vocab(&self) -> usize {
        self.raw.n_vocab()
    }

    /// The context length the model was trained with.
    pub fn n_ctx_train(&self) -> usize {
        self.raw.n_ctx_train()
    }

    /// Tokenizes text as llama.cpp does (the GGUF vocabulary is the tokenizer
    /// of record); `add_bos` adds the model's start token if it uses one.
    pub fn tokenize(&self, text: &str, add_bos: bool, parse_special: bool) -> Vec<TokenId> {
        self.raw
            .tokenize(text, add_bos, parse_special)
            .into_iter()
            .map(|t| t as TokenId)
            .collect()
    }

    /// The bytes of a token (control tokens render as nothing).
    pub fn token_bytes(&self, token: TokenId) -> Vec<u8> {
        self.raw.token_bytes(token as i32)
    }

    /// Whether the token ends generation.
    pub fn is_end_of_generation(&self, token: TokenId) -> bool {
        self.raw.is_end_of_generation(token as i32)
    }

    /// Bytes of KV (f16 keys and values over every layer) one token takes.
    pub fn kv_bytes_per_token(&self) -> usize {
        let m = &self.raw;
        let heads = m.n_head().max(1);
        let arch = m.meta("general.architecture").unwrap_or_default();
        let head_dim = |key: &str| {
            m.meta(&format!("{arch}.attention.{key}"))
                .and_then(|v| v.parse::<usize>().ok())
                .unwrap_or(m.n_embd() / heads)
        };
        m.n_layer() * m.n_head_kv().max(1) * (head_dim("key_length") + head_dim("value_length")) * 2
    }

    /// Size of the model's embedding vectors.
    pub fn n_embd(&self) -> usize {
        self.raw.n_embd()
    }

    /// How embeddings pool token vectors: the GGUF's own pooling type if it
    /// names one (embedding models do), else the mean (a decoder model's
    /// last hidden states averaged over the input, as llama-server's
    /// `--pooling mean`).
    pub(crate) fn embedding_pooling(&self) -> sys::Pooling {
        let arch = self.raw.meta("general.architecture").unwrap_or_default();
        match self.raw.meta(&format!("{arch}.pooling_type")) {
            Some(kind) if kind != "0" => sys::Pooling::Model,
            _ => sys::Pooling::Mean,
        }
    }

    /// Renders messages with the model's own chat template (its Jinja
    /// source, rendered as `transformers` does), ready for the assistant's
    /// reply.
    pub fn apply_chat_template(&self, messages: &[ChatMessage]) -> Result<String, BackendError> {
        ChatRenderer::new(self, None)?.render(messages, None)
    }
}

/// The names of the chat templates llama.cpp renders itself, for
/// `EngineConfig::chat_template`.
pub fn chat_template_names() -> Vec<String> {
    sys::builtin_chat_templates()
}

/// The template a chat-template setting stands for: the text of the file it
/// names, or a name llama.cpp knows.
pub(crate) fn resolve_chat_template(setting: &str) -> Result<String, EngineError> {
    let path = Path::new(setting);
    if path.is_file() {
        return std::fs::read_to_string(path)
            .map_err(|e| EngineError::Model(format!("chat template {}: {e}", path.display())));
    }
    let names = chat_template_names();
    if names.iter().any(|n| n == setting) {
        return Ok(setting.to_owned());
    }
    Err(EngineError::Model(format!(
        "chat template {setting:?} is neither a file nor a template llama.cpp knows ({})",
        names.join(", ")
    )))
}
