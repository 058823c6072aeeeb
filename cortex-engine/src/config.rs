//! The engine's settings, and how they turn into llama.cpp's.

use std::path::PathBuf;
use std::time::Duration;

/// How an engine is set up.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct EngineConfig {
    /// The GGUF model file.
    pub model: PathBuf,
    /// Sequences decoding at once at most; each gets a KV stream of its own.
    pub max_running: usize,
    /// Cells of each stream: the longest sequence (prompt plus generation) one
    /// request may have. `None` sizes streams from the requests themselves:
    /// they start small and grow (the KV is rebuilt, running requests are
    /// recomputed) when a longer request arrives, up to the model's context
    /// and `kv_memory`.
    pub stream_tokens: Option<usize>,
    /// Most bytes the KV cache may take when streams are sized automatically;
    /// past it, fewer sequences run at once rather than long requests failing.
    /// 0 means a quarter of the machine's memory.
    pub kv_memory: usize,
    /// Tokens per KV accounting block (the unit of prefix sharing).
    pub block_size: usize,
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
    /// Sequences decoding at once by default: on the default model and a
    /// 2-core machine, throughput rises up to 64 sequences and flattens past it
    /// (see `cortex bench`), while memory grows with every stream.
    pub const DEFAULT_MAX_RUNNING: usize = 64;

    /// Defaults for `model`: 64 sequences, streams sized from the requests,
    /// 16-token blocks, 512-token batches, all cores, prefix sharing on, a
    /// 10-minute stall timeout.
    pub fn new(model: impl Into<PathBuf>) -> Self {
        Self {
            model: model.into(),
            max_running: Self::DEFAULT_MAX_RUNNING,
            stream_tokens: None,
            kv_memory: 0,
            block_size: 16,
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

    /// The KV memory budget in bytes: the configured one, or a quarter of the
    /// machine's memory (2 GiB when that cannot be read).
    pub fn effective_kv_memory(&self) -> usize {
        if self.kv_memory > 0 {
            return self.kv_memory;
        }
        total_memory().map_or(2 << 30, |bytes| bytes / 4)
    }
}

/// Physical memory of the machine, from `/proc/meminfo` (Linux).
fn total_memory() -> Option<usize> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
