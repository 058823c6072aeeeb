//! The seam between the step loop and what computes logits.

use cortex_chat::{Conversation, RenderedChat};
use cortex_request::{ChatTemplateChoice, TokenId};
use cortex_sample::TokenFilter;

/// A KV stream of the executor, which is also the id of the sequence that runs
/// in it (llama.cpp's `llama_seq_id` in non-unified KV mode).
pub type StreamId = i32;

/// One token of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchToken {
    /// The token.
    pub token: TokenId,
    /// Its position in its stream.
    pub pos: usize,
    /// The stream it extends.
    pub stream: StreamId,
    /// Whether logits are wanted for it.
    pub logits: bool,
}

/// A stream whose first cells are a copy of another stream's (a prompt
/// prefix several sequences share, copied by [`Executor::copy_stream`]), so
/// attention may read the other's cells for it: see
/// [`Executor::share_prefixes`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefixShare {
    /// The stream holding the copy.
    pub stream: StreamId,
    /// The stream it copies (the lowest id holding those cells; perhaps
    /// `stream` itself).
    pub source: StreamId,
    /// Positions `0..cells` are the same bytes in both.
    pub cells: usize,
}

/// Most inputs one [`Executor::embed`] call takes (sequences of the
/// embedding context).
pub const EMBED_SEQUENCES: usize = 64;

/// An executor failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ExecutorError {
    /// No room in the KV cache for the batch (llama.cpp's decode result 1).
    #[error("no free KV cache slot for the batch")]
    NoKvSlot,
    /// Anything else the executor reports.
    #[error("{0}")]
    Failed(String),
}

/// One sequence's grammar state (see [`Executor::grammar`]): which tokens may
/// come next, advanced past each token the sequence takes.
pub trait TokenGrammar: TokenFilter {
    /// Advances past `token`, which the grammar allowed.
    fn accept(&mut self, token: TokenId);
}

/// How the KV cache is laid out: `streams` streams of `capacity` cells each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvLayout {
    /// Streams (one running sequence each).
    pub streams: usize,
    /// Cells per stream: the longest sequence (prompt plus generation) it holds.
    pub capacity: usize,
}

/// What the step loop needs from a model: vocabulary, chat template, and a
/// decode call over a KV cache of separate streams; it executes the loop's
/// batches (named apart from llama.cpp's backends, the device modules one
/// executor runs on).
///
/// Every sequence computes in a stream of its own, so a token attends only to
/// its own sequence's cells (llama.cpp's non-unified KV). Sharing a prefix
/// between streams is a copy of a whole stream followed by a truncation.
///
/// The llama.cpp implementation is the real one; tests use fakes to inject
/// failures and to check what each stream holds.
pub trait Executor {
    /// Entries in a row of logits.
    fn n_vocab(&self) -> usize;
    /// Longest sequence the model handles (its training context).
    fn n_ctx_train(&self) -> usize;
    /// Bytes of KV one token takes in one stream (to size streams against a
    /// memory budget).
    fn kv_bytes_per_token(&self) -> usize;
    /// The current layout.
    fn kv_layout(&self) -> KvLayout;
    /// The device that holds the KV cache, for messages (`CPU`, `Vulkan0`).
    fn device_name(&self) -> String {
        "CPU".into()
    }
    /// Bytes the KV cache can take where it lives, at most: on a GPU its
    /// free memory less a reserve for llama.cpp's buffers, on the CPU the
    /// machine's available memory. `None`: not known (no limit is checked).
    fn kv_memory_available(&self) -> Option<usize> {
        None
    }
    /// The KV budget when none is configured: on a GPU what it has
    /// available, on the CPU a quarter of the machine's memory. `None`:
    /// 1 GiB.
    fn default_kv_memory(&self) -> Option<usize> {
        None
    }
    /// Rebuilds the KV cache with a new layout; everything it held is gone.
    fn set_kv_layout(&mut self, layout: KvLayout) -> Result<(), ExecutorError>;
    /// CPU threads for the next decodes, at most the count the executor was
    /// made with (the engine lowers it while other processes load the cores).
    fn set_threads(&mut self, _threads: usize) {}
    /// Tokenizes text; special tokens in the text are parsed when `parse_special`.
    fn tokenize(&self, text: &str, add_bos: bool, parse_special: bool) -> Vec<TokenId>;
    /// The bytes a token stands for.
    fn token_bytes(&self, token: TokenId) -> Vec<u8>;
    /// Whether the token ends generation (EOS, EOT, ...).
    fn is_end_of_generation(&self, token: TokenId) -> bool;
    /// The texts of the model's start and end tokens (`<s>`, `<|im_end|>`),
    /// as its tokenizer writes them: empty where it has none.
    fn start_end_texts(&self) -> (String, String) {
        (String::new(), String::new())
    }
    /// A fresh grammar constraint (GBNF text, start rule `root`) for one
    /// sequence. Executors without grammar support refuse.
    fn grammar(&self, _gbnf: &str) -> Result<Box<dyn TokenGrammar>, ExecutorError> {
        Err(ExecutorError::Failed(
            "this executor does not support grammars".into(),
        ))
    }
    /// Embeddings of whole inputs (at most [`EMBED_SEQUENCES`]), computed
    /// together in one decode of their own (apart from the streams), one
    /// unit-length vector each, in order. Executors without an embedding
    /// mode refuse.
    fn embed(&mut self, _inputs: &[Vec<TokenId>]) -> Result<Vec<Vec<f32>>, ExecutorError> {
        Err(ExecutorError::Failed(
            "this executor does not compute embeddings".into(),
        ))
    }
    /// Renders a chat with the model's template for generation: the
    /// prompt (ending with the assistant's turn opened), how its output is
    /// read (thinking, calls) and the grammar the tools' choice asks for
    /// (`cortex_chat::ChatTemplate::render_chat`), with the template
    /// `template` chooses.
    fn apply_chat_template(
        &self,
        conversation: &Conversation<'_>,
        template: &ChatTemplateChoice,
    ) -> Result<RenderedChat, ExecutorError>;
    /// The text of a control token (`<|channel|>`, `[TOOL_CALLS]`), which
    /// [`Executor::token_bytes`] renders as nothing: kept where a chat's
    /// output syntax needs it. Executors without control tokens give the
    /// token's bytes.
    fn control_token_text(&self, token: TokenId) -> Vec<u8> {
        self.token_bytes(token)
    }
    /// Computes a batch. On error the KV of the batch's positions is undefined
    /// and the caller truncates the streams involved.
    fn decode(&mut self, batch: &[BatchToken]) -> Result<(), ExecutorError>;
    /// Logits of the `index`-th token of the last batch (which asked for them),
    /// for a stream not sampled on the device.
    fn logits(&self, index: usize) -> &[f32];
    /// Whether the device that computes the logits takes the argmax of
    /// `stream`'s rows from the next decode on (`greedy`), so that one
    /// token per row comes back instead of the vocabulary's logits, or
    /// gives its logits whole (`!greedy`). Returns whether it does: a
    /// executor that cannot returns false, and the loop samples on the host.
    /// The loop calls it as a sequence is bound; an executor makes a change
    /// only when the stream's answer changes.
    fn sample_on_device(&mut self, _stream: StreamId, _greedy: bool) -> bool {
        false
    }
    /// The token the device sampled for the `index`-th token of the last
    /// batch, whose stream it samples.
    fn device_sampled(&mut self, _index: usize) -> Option<TokenId> {
        None
    }
    /// Micro-batches so far whose compute graph the executor reused from the
    /// micro-batch before, in the current KV layout (llama.cpp rebuilds the
    /// graph unless the shape repeats; on a GPU a repeated shape also lets
    /// CUDA replay the launches it recorded). For the trace; 0 where not
    /// known.
    fn graphs_reused(&self) -> u64 {
        0
    }
    /// Waits until the last decode's results are on the host (a GPU
    /// executor queues the work and returns): what the loop times as the
    /// device's share of a step.
    fn synchronize(&mut self) {}
    /// Whether the executor's attention can read a prefix that several
    /// streams of a decode hold copies of once for all of them (then the
    /// loop tells it which before every decode, see
    /// [`Executor::share_prefixes`]).
    fn reads_shared_prefixes(&self) -> bool {
        false
    }
    /// The streams of the next decodes that hold copies of another
    /// stream's first cells. An executor may read the source's cells in their
    /// place, as long as every result stays what the stream's own cells give.
    fn share_prefixes(&mut self, _shares: &[PrefixShare]) {}
    /// Replaces everything `dst` holds with a copy of what `src` holds (in
    /// llama.cpp a copy of the whole stream's buffer, done at the next decode,
    /// before that decode writes anything).
    fn copy_stream(&mut self, src: StreamId, dst: StreamId);
    /// Drops `stream`'s cells from position `from` on.
    fn truncate_stream(&mut self, stream: StreamId, from: usize);
}
