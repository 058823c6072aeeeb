//! What the engine tells its callers: per-request events and engine-wide statistics.

use cortex_request::{RequestId, Response, TokenId, TokenLogprob, ToolCall, ToolCallDelta};

use crate::EngineError;

/// What the engine reports about a request.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum EngineEvent {
    /// A token was generated. `text` is the new text it completes (possibly
    /// empty while a multi-byte character or a possible stop string is pending).
    Token {
        /// The request.
        id: RequestId,
        /// Which of its `n` completions.
        index: u32,
        /// The token.
        token: TokenId,
        /// New text of the answer, never splitting a character and never
        /// part of a stop string (for a chat whose output is read for
        /// thinking or calls, without them: see `reasoning` and `calls`).
        text: String,
        /// New text of the model's thinking (a chat whose template marks it).
        reasoning: String,
        /// Calls written whole with this token (a chat offering tools).
        calls: Vec<ToolCall>,
        /// The pieces of calls this token wrote: a call's name once whole,
        /// then its arguments as they come (what `calls` holds whole).
        call_pieces: Vec<ToolCallDelta>,
        /// The token's log probability and the most likely alternatives,
        /// when the request asked for them (not for the token that ended
        /// the completion, EOS or a stop id, which is not part of it).
        logprob: Option<TokenLogprob>,
    },
    /// The request ended (normally, by cancellation, or with every completion done).
    Finished(Response),
    /// The request failed; no further events follow.
    Failed {
        /// The request.
        id: RequestId,
        /// Why.
        error: EngineError,
    },
}

impl EngineEvent {
    /// The request the event is about.
    pub fn id(&self) -> RequestId {
        match self {
            EngineEvent::Token { id, .. } | EngineEvent::Failed { id, .. } => *id,
            EngineEvent::Finished(response) => response.id,
        }
    }

    /// Whether this is the request's last event.
    pub fn is_terminal(&self) -> bool {
        !matches!(self, EngineEvent::Token { .. })
    }
}

/// One step of the engine, as a trace records it: what went into the
/// batch, what attention read, and where the time went.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct StepRecord {
    /// The step's number, from 1.
    pub step: u64,
    /// Seconds since the engine started, at the step's start.
    pub at: f64,
    /// Sequences that decoded one token in it.
    pub decode_sequences: usize,
    /// Tokens generated in it: one per decoding sequence, and one for each
    /// prompt that it finished computing.
    pub generated_tokens: usize,
    /// Prompt chunks computed in it.
    pub prefill_chunks: usize,
    /// Prompt tokens computed in it.
    pub prefill_tokens: usize,
    /// KV streams the batch wrote to.
    pub streams: usize,
    /// Cells those streams hold after the step: what attention had to read.
    pub kv_cells_used: usize,
    /// Cells llama.cpp's attention spanned: every stream of the batch as
    /// long as its longest, in 256-cell granules (the difference to
    /// `kv_cells_used` is padding).
    pub kv_cells_attended: usize,
    /// Micro-batches llama.cpp computes the batch in, each a pass over the
    /// weights: one per run of consecutive streams, more where prompt chunks
    /// and decodes share a step.
    pub micro_batches: usize,
    /// Of those micro-batches, the ones whose compute graph llama.cpp
    /// reused from the micro-batch before (same shape: tokens, streams,
    /// outputs, cells spanned) instead of building it again.
    pub graphs_reused: usize,
    /// Throwaway tokens that filled idle streams between running ones so
    /// that their runs went in one micro-batch (see
    /// [`crate::EngineConfig::gap_fill`]); removed after the decode.
    pub gap_fillers: usize,
    /// Prompt chunks the step cut to its one chunk length, or to a token,
    /// so that its batch took fewer micro-batches per token (see
    /// [`crate::EngineConfig::even_chunks`]); the rest runs in later steps.
    pub chunks_evened: usize,
    /// Decode calls the step made: one, or more when the executor refused
    /// the step's batch and each stream was then decoded alone (a step
    /// several times slower).
    pub decode_calls: usize,
    /// Seconds in `llama_decode`: on the CPU the whole computation; on a GPU
    /// building the graph, setting its inputs and queueing its work.
    pub decode_seconds: f64,
    /// Seconds waiting after `llama_decode` until its results were on the
    /// host: on a GPU the rest of the device's work and the copy back (of
    /// every sampled row's logits, or of one token per row sampled there).
    pub wait_seconds: f64,
    /// Seconds choosing tokens: reading what came back (tokens sampled on
    /// the device, or logits) and sampling on the host.
    pub sample_seconds: f64,
    /// Tokens of the step the device sampled (greedy rows with
    /// [`crate::EngineConfig::sample_on_device`]); the rest of
    /// `generated_tokens` were sampled on the host.
    pub device_sampled_tokens: usize,
    /// Seconds of the step's other host work: planning, binding KV,
    /// building the batch, detokenizing, stop checks, events.
    pub host_seconds: f64,
    /// Seconds between the end of the previous step and this one: taking
    /// commands, statistics, waiting for work.
    pub gap_seconds: f64,
    /// Seconds rebuilding the KV cache with longer streams before the step
    /// (a request longer than the streams came: a new llama.cpp context,
    /// its KV and buffers allocated); in no other time of the record.
    pub kv_rebuild_seconds: f64,
    /// Which of the engine's step loops ran it (from 0; see
    /// [`crate::EngineConfig::step_loops`]).
    pub step_loop: usize,
}

/// What watches the engine's steps (given to [`crate::Engine::launch`], as
/// `cortex_llama::start_observed` does). It is called on the engine thread
/// between decodes: it must be quick.
pub trait StepObserver: Send {
    /// A step ended.
    fn step(&mut self, record: &StepRecord);
    /// A request's prompt was taken in (its tokens, once however many
    /// completions it asks for): what a job's distinct prefixes are.
    fn prompt(&mut self, _tokens: &[TokenId]) {}
}

/// Counters and gauges of a running engine.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
#[non_exhaustive]
pub struct EngineStats {
    /// Steps (decode calls) run.
    pub steps: u64,
    /// Prompt tokens of finished and running requests.
    pub prompt_tokens: u64,
    /// Prompt tokens actually computed (prefill), recomputation included.
    pub prefill_tokens: u64,
    /// Prompt tokens not computed because their KV was shared.
    pub prefill_tokens_saved: u64,
    /// Tokens generated.
    pub generated_tokens: u64,
    /// Requests finished (any reason) and failed.
    pub requests_finished: u64,
    /// Requests failed.
    pub requests_failed: u64,
    /// Preemptions (recompute).
    pub preemptions: u64,
    /// Requests waiting.
    pub waiting: usize,
    /// Sequences running.
    pub running: usize,
    /// Fraction of KV blocks held by sequences.
    pub kv_utilisation: f64,
    /// KV streams (each holds one running sequence, or a cached prefix).
    pub kv_streams: usize,
    /// Cells per stream: the longest sequence a stream holds now.
    pub kv_stream_tokens: usize,
    /// Bytes of the KV cache as laid out now (every stream's cells).
    pub kv_bytes: u64,
    /// Streams kept only for their cached prefix.
    pub kv_retired_streams: usize,
    /// Shared prefixes attached by copying a holder's stream.
    pub prefix_copies: u64,
    /// Shared prefixes attached by taking over the retired stream holding them.
    pub prefix_takeovers: u64,
    /// Times the KV was rebuilt with longer streams for a longer request.
    pub kv_resizes: u64,
    /// Cached prefix blocks evicted to make room.
    pub kv_evicted_blocks: u64,
    /// CPU threads decoding now when the engine adapts them (0 when the
    /// configured count is kept).
    pub threads: usize,
    /// Seconds spent in steps.
    pub busy_seconds: f64,
    /// Seconds of those spent inside the executor's decode (the rest is the
    /// engine's own overhead: planning, sampling, events).
    pub decode_seconds: f64,
    /// Generated tokens per busy second.
    pub generated_tokens_per_second: f64,
    /// Mean time to first token of finished requests, seconds.
    pub mean_time_to_first_token: f64,
    /// Mean latency of finished requests, seconds.
    pub mean_latency: f64,
}

impl EngineStats {
    /// The figures of an engine whose step loops have `each` of these:
    /// counts and gauges add up, times are the longest loop's (they ran at
    /// once), rates add up, means are weighted by finished requests.
    pub fn combined(each: &[EngineStats]) -> EngineStats {
        let Some(first) = each.first() else {
            return EngineStats::default();
        };
        if each.len() == 1 {
            return *first;
        }
        let mut all = EngineStats::default();
        let finished: u64 = each.iter().map(|s| s.requests_finished).sum();
        let weighted = |mean: fn(&EngineStats) -> f64| {
            if finished == 0 {
                0.0
            } else {
                each.iter()
                    .map(|s| mean(s) * s.requests_finished as f64)
                    .sum::<f64>()
                    / finished as f64
            }
        };
        all.mean_time_to_first_token = weighted(|s| s.mean_time_to_first_token);
        all.mean_latency = weighted(|s| s.mean_latency);
        let blocks: f64 = each.iter().map(|s| s.kv_utilisation).sum();
        all.kv_utilisation = blocks / each.len() as f64;
        for s in each {
            all.steps += s.steps;
            all.prompt_tokens += s.prompt_tokens;
            all.prefill_tokens += s.prefill_tokens;
            all.prefill_tokens_saved += s.prefill_tokens_saved;
            all.generated_tokens += s.generated_tokens;
            all.requests_finished += s.requests_finished;
            all.requests_failed += s.requests_failed;
            all.preemptions += s.preemptions;
            all.waiting += s.waiting;
            all.running += s.running;
            all.kv_streams += s.kv_streams;
            all.kv_stream_tokens = all.kv_stream_tokens.max(s.kv_stream_tokens);
            all.kv_bytes += s.kv_bytes;
            all.kv_retired_streams += s.kv_retired_streams;
            all.prefix_copies += s.prefix_copies;
            all.prefix_takeovers += s.prefix_takeovers;
            all.kv_resizes += s.kv_resizes;
            all.kv_evicted_blocks += s.kv_evicted_blocks;
            all.threads = all.threads.max(s.threads);
            all.busy_seconds = all.busy_seconds.max(s.busy_seconds);
            all.decode_seconds = all.decode_seconds.max(s.decode_seconds);
            all.generated_tokens_per_second += s.generated_tokens_per_second;
        }
        all
    }
}
