//! The seam between the step loop and what computes logits.

use cortex_request::{ChatMessage, TokenId};

/// A KV sequence id of the backend (llama.cpp's `llama_seq_id`).
pub type SeqSlot = i32;

/// One token of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchToken {
    /// The token.
    pub token: TokenId,
    /// Its position in its sequence.
    pub pos: usize,
    /// The sequence it extends.
    pub seq: SeqSlot,
    /// Whether logits are wanted for it.
    pub logits: bool,
}

/// A backend failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    /// No room in the KV cache for the batch (llama.cpp's decode result 1).
    #[error("no free KV cache slot for the batch")]
    NoKvSlot,
    /// Anything else the backend reports.
    #[error("{0}")]
    Failed(String),
}

/// What the step loop needs from a model: vocabulary, chat template, and a
/// decode call over a shared KV cache with sequence operations.
///
/// The llama.cpp implementation is the real one; tests use a fake to inject
/// failures.
pub trait Backend {
    /// Entries in a row of logits.
    fn n_vocab(&self) -> usize;
    /// Longest sequence the model handles (its training context).
    fn n_ctx_train(&self) -> usize;
    /// Tokens the KV cache holds across all sequences.
    fn kv_capacity(&self) -> usize;
    /// Sequence ids the backend supports at once.
    fn max_sequences(&self) -> usize;
    /// Tokenizes text; special tokens in the text are parsed when `parse_special`.
    fn tokenize(&self, text: &str, add_bos: bool, parse_special: bool) -> Vec<TokenId>;
    /// The bytes a token stands for.
    fn token_bytes(&self, token: TokenId) -> Vec<u8>;
    /// Whether the token ends generation (EOS, EOT, ...).
    fn is_end_of_generation(&self, token: TokenId) -> bool;
    /// Renders a chat with the model's template, ending with the assistant's turn.
    fn apply_chat_template(&self, messages: &[ChatMessage]) -> Result<String, BackendError>;
    /// Computes a batch. On error the KV of the batch's positions is undefined
    /// and the caller removes it.
    fn decode(&mut self, batch: &[BatchToken]) -> Result<(), BackendError>;
    /// Logits of the `index`-th token of the last batch (which asked for them).
    fn logits(&self, index: usize) -> &[f32];
    /// Makes `dst` share `src`'s KV for positions `from..to`.
    fn copy_sequence(&mut self, src: SeqSlot, dst: SeqSlot, from: usize, to: usize);
    /// Drops `seq`'s KV for positions `from..to` (`None`: to the end).
    fn remove_sequence(&mut self, seq: SeqSlot, from: usize, to: Option<usize>);
}
