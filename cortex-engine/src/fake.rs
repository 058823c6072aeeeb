//! A fake executor, for tests of what sits on the engine (the worker, the
//! model pool, the server) where no model's behaviour matters: failure
//! injection and scheduling. Behind the `test-support` feature.
//!
//! Its model: text is bytes (each byte a token in 1..=30), every next token
//! is [`FakeExecutor::TOKEN`] (`f`), nothing ends generation but the limits.

use std::time::Duration;

use cortex_chat::{Conversation, OutputSyntax, RenderedChat};
use cortex_request::{ChatTemplateChoice, TokenId};

use crate::executor::{BatchToken, Executor, ExecutorError, KvLayout, StreamId};

/// An executor that always says the same token (see the module documentation).
#[derive(Debug, Clone)]
pub struct FakeExecutor {
    layout: KvLayout,
    logits: Vec<Vec<f32>>,
    decodes: usize,
    panic_after: Option<usize>,
    decode_time: Duration,
}

impl Default for FakeExecutor {
    fn default() -> Self {
        Self::new()
    }
}

impl FakeExecutor {
    /// Entries in a row of logits.
    pub const VOCAB: usize = 32;
    /// The token every step samples: `f`.
    pub const TOKEN: TokenId = 5;

    /// One 256-cell stream to start with, decodes that take no time.
    pub fn new() -> Self {
        Self {
            layout: KvLayout {
                streams: 1,
                capacity: 256,
            },
            logits: Vec::new(),
            decodes: 0,
            panic_after: None,
            decode_time: Duration::ZERO,
        }
    }

    /// Panics on the decode after `decodes` of them, as a bug in an executor
    /// would (the loop dies with the panic's message).
    pub fn panicking_after(mut self, decodes: usize) -> Self {
        self.panic_after = Some(decodes);
        self
    }

    /// Each decode takes `time` (so that several requests are in flight
    /// when something happens).
    pub fn decoding_for(mut self, time: Duration) -> Self {
        self.decode_time = time;
        self
    }
}

impl Executor for FakeExecutor {
    fn n_vocab(&self) -> usize {
        Self::VOCAB
    }
    fn n_ctx_train(&self) -> usize {
        4096
    }
    fn kv_bytes_per_token(&self) -> usize {
        64
    }
    fn kv_layout(&self) -> KvLayout {
        self.layout
    }
    fn set_kv_layout(&mut self, layout: KvLayout) -> Result<(), ExecutorError> {
        self.layout = layout;
        Ok(())
    }
    fn tokenize(&self, text: &str, _add_bos: bool, _parse_special: bool) -> Vec<TokenId> {
        text.bytes().map(|b| TokenId::from(b % 30 + 1)).collect()
    }
    fn token_bytes(&self, token: TokenId) -> Vec<u8> {
        vec![b'a' + (token as u8 % 26)]
    }
    fn is_end_of_generation(&self, _token: TokenId) -> bool {
        false
    }
    fn apply_chat_template(
        &self,
        conversation: &Conversation<'_>,
        _template: &ChatTemplateChoice,
    ) -> Result<RenderedChat, ExecutorError> {
        Ok(RenderedChat {
            prompt: conversation
                .messages
                .iter()
                .map(|m| m.content.as_str())
                .collect(),
            syntax: OutputSyntax::plain(),
            grammar: None,
        })
    }
    fn decode(&mut self, batch: &[BatchToken]) -> Result<(), ExecutorError> {
        self.decodes += 1;
        if self.panic_after.is_some_and(|n| self.decodes > n) {
            panic!("injected executor bug at decode {}", self.decodes);
        }
        if !self.decode_time.is_zero() {
            std::thread::sleep(self.decode_time);
        }
        let mut row = vec![0.0; Self::VOCAB];
        row[Self::TOKEN as usize] = 10.0;
        self.logits = vec![row; batch.len()];
        Ok(())
    }
    fn logits(&self, index: usize) -> &[f32] {
        &self.logits[index]
    }
    fn copy_stream(&mut self, _src: StreamId, _dst: StreamId) {}
    fn truncate_stream(&mut self, _stream: StreamId, _from: usize) {}
}
