use std::path::PathBuf;
use std::time::Duration;

/// How an engine is set up.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    /// The GGUF model file.
    pub model: PathBuf,
    /// Tokens the shared KV cache holds, across all sequences.
    pub kv_tokens: usize,
    /// Tokens per KV accounting block (the unit of prefix sharing).
    pub block_size: usize,
    /// Sequences decoding at once at most.
    pub max_running: usize,
    /// Tokens per `llama_decode` call at most (decode tokens plus prompt chunks).
    pub max_batch_tokens: usize,
    /// CPU threads for llama.cpp; 0 means all available cores.
    pub threads: usize,
    /// Share the KV of common prompt prefixes between requests.
    pub prefix_sharing: bool,
    /// Fail a running request that makes no progress for this long.
    pub request_timeout: Option<Duration>,
}

impl EngineConfig {
    /// Defaults for `model`: 8,192 KV tokens in 16-token blocks, 64 sequences,
    /// 512-token batches, all cores, prefix sharing on, a 10-minute stall timeout.
    pub fn new(model: impl Into<PathBuf>) -> Self {
        Self {
            model: model.into(),
            kv_tokens: 8192,
            block_size: 16,
            max_running: 64,
            max_batch_tokens: 512,
            threads: 0,
            prefix_sharing: true,
            request_timeout: Some(Duration::from_secs(600)),
        }
    }

    /// The thread count to use: the configured one, or every available core
    /// (llama.cpp's own default of 4 oversubscribes small machines).
    pub fn effective_threads(&self) -> usize {
        if self.threads > 0 {
            self.threads
        } else {
            std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
        }
    }
}
