//! The cortex engine: continuous batching over a [`Executor`].
//!
//! An [`Engine`] runs its step loops on a thread of its own and is driven
//! over channels: submit a [`cortex_request::Request`] and receive its
//! [`EngineEvent`]s (tokens with UTF-8-safe text deltas, then `Finished` with
//! completions, usage and timings, or `Failed`); cancel at any time; read
//! [`EngineStats`]; shut down draining or aborting.
//!
//! Each step takes a plan from `cortex-sched`, builds one batch mixing
//! prompt chunks and decode tokens (logits only where a token is sampled),
//! decodes, samples every row with `cortex-sample` in parallel, applies stop
//! conditions (EOS, max tokens, stop ids, stop strings held back until they
//! can no longer form) and streams the text. Every running sequence has a KV
//! stream of its own, so a token attends only to its own sequence and large
//! batches stay fast; streams are sized from the requests and grow when a
//! longer one arrives. `cortex-kv`'s block accounting decides what is shared:
//! a prompt prefix is computed once and a new sequence gets it by taking over
//! the finished stream that holds it or by a whole-stream copy (milliseconds,
//! where recomputing costs seconds). [`Engine::health`] reports a loop that
//! died.
//!
//! This crate knows no model library. What computes logits is an [`Executor`];
//! the one over llama.cpp is in `cortex-llama` (the binding: the FFI, backend
//! modules and devices, the model, cortex's CPU kernels), which loads a model
//! as an [`EngineConfig`] places it and starts the loops with
//! [`Engine::launch`]. The worker and the server use only the handle types
//! here, so llama.cpp compiles into the binding and the programs alone. The
//! `test-support` feature adds `Engine::start_with_executor` and
//! `EngineConfig::for_fake_executor` and `fake::FakeExecutor`, for tests over
//! a fake executor.
//!
//! # Example
//!
//! A binding implements [`Executor`] over its library and starts the loops
//! with [`Engine::launch`]; `cortex_llama::start` does this over llama.cpp.
//! Here, a model that answers `!` to everything:
//!
//! ```
//! use cortex_engine::{Executor, ExecutorError, BatchToken, ComputedOn, Engine, EngineConfig, EngineEvent};
//! use cortex_engine::{KvLayout, StreamId};
//! use cortex_request::{ChatMessage, Request, RequestId, SamplingParams, TokenId};
//!
//! /// Bytes are tokens; every next token is `!`.
//! struct Exclaim {
//!     layout: KvLayout,
//!     logits: Vec<f32>,
//! }
//!
//! impl Executor for Exclaim {
//!     fn n_vocab(&self) -> usize { 256 }
//!     fn tokenize(&self, text: &str, _bos: bool, _special: bool) -> Vec<TokenId> {
//!         text.bytes().map(TokenId::from).collect()
//!     }
//!     fn token_bytes(&self, token: TokenId) -> Vec<u8> { vec![token as u8] }
//!     fn decode(&mut self, _batch: &[BatchToken]) -> Result<(), ExecutorError> { Ok(()) }
//!     fn logits(&self, _row: usize) -> &[f32] { &self.logits }
//! #   fn n_ctx_train(&self) -> usize { 1024 }
//! #   fn kv_bytes_per_token(&self) -> usize { 1 }
//! #   fn kv_layout(&self) -> KvLayout { self.layout }
//! #   fn set_kv_layout(&mut self, layout: KvLayout) -> Result<(), ExecutorError> {
//! #       self.layout = layout;
//! #       Ok(())
//! #   }
//! #   fn is_end_of_generation(&self, _token: TokenId) -> bool { false }
//! #   fn apply_chat_template(&self, c: &cortex_chat::Conversation<'_>, _: &cortex_request::ChatTemplateChoice) -> Result<cortex_chat::RenderedChat, ExecutorError> {
//! #       let prompt = c.messages.iter().map(|m| m.content.as_str()).collect();
//! #       Ok(cortex_chat::RenderedChat { prompt, syntax: cortex_chat::OutputSyntax::plain(), grammar: None })
//! #   }
//! #   fn copy_stream(&mut self, _src: StreamId, _dst: StreamId) {}
//! #   fn truncate_stream(&mut self, _stream: StreamId, _from: usize) {}
//!     // ... the KV layout, end of generation, chat template, stream copies.
//! }
//!
//! let mut config = EngineConfig::new("exclaim");
//! config.kv_memory = 1 << 20;
//! let engine = Engine::launch(None, move |launch| {
//!     let mut logits = vec![0.0; 256];
//!     logits[usize::from(b'!')] = 1.0;
//!     let layout = KvLayout { streams: 1, capacity: 64 };
//!     let sized = config.for_device(ComputedOn::Cpu).per_loop();
//!     launch.run(&sized, vec![Box::new(Exclaim { layout, logits })]);
//!     Ok(())
//! })?;
//!
//! let mut request = Request::new(RequestId(1), "Hello");
//! request.sampling = SamplingParams::greedy();
//! request.stop.max_tokens = 3;
//! for event in engine.submit(request)?.iter() {
//!     if let EngineEvent::Finished(response) = event {
//!         assert_eq!(response.completions[0].text, "!!!");
//!         break;
//!     }
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Design notes
//!
//! - Device memory is accounted in two places. At start, `step::sizing` asks
//!   the executor how much the KV cache may take where it lives
//!   (`Executor::kv_memory_available`: on a GPU its free memory after the model
//!   less a reserve for llama.cpp's buffers, on the CPU the machine's available
//!   memory) and what to use by default (`default_kv_memory`); a fixed layout or
//!   a `kv_memory` past what is available is refused there, so a job that does
//!   not fit fails at start. While running, `Engine::gpu_memory_used` asks the
//!   binding's [`ModelPlacement`] with the KV bytes laid out now; the server
//!   reports it in `/api/ps` and `/metrics`.
//! - `placement`: where a model runs, as plain values (`DeviceChoice`,
//!   `GpuLayers`, `CpuKernels`: settings; `Device`: a report) and the
//!   `ModelPlacement` a binding gives [`Launch::place`].
//! - `executor`: the `Executor` trait the loop runs on (vocabulary, decode, logits,
//!   KV layout, `copy_stream`, `truncate_stream`, threads, `grammar` for a
//!   request's constraint, one `TokenGrammar` per completion); tests run the loop
//!   over a checking one (`checking_executor_tests`) that keeps every cell of every
//!   stream and refuses holes, double writes and overflows, so a wrong copy or
//!   truncation shows. `fake`: the plain executor other crates' tests start an
//!   engine on (`test-support`).
//! - `streams`: the KV binding. Every running sequence has a stream of its own,
//!   so a token attends only to its own cells and B = 64 decodes as fast as
//!   llama.cpp's own batched bench (one unified cache made every token attend
//!   over every sequence's cells). `cortex-kv`'s accounting still decides what is
//!   shared: an admission reusing `k` cached blocks takes over a retired stream
//!   holding them (no copy) or gets a free stream filled by a whole-stream copy
//!   from a holder, cut back to `k` blocks (a memcpy of a few MB, against seconds
//!   to recompute a long prefix on a CPU). A finished sequence's stream stays
//!   retired while it holds cached blocks; admissions reclaim the oldest.
//!   `Streams::verify` checks its invariants against the accounting after every
//!   step in debug builds: each stream free, running or retired; chains are
//!   prefixes from depth 0 whose blocks are live; `holders` matches the chains;
//!   every cached block has a holder; `chain * B <= len <= capacity`.
//! - `step`: the step loop on the engine thread, started from the
//!   `EngineConfig` itself (one settings struct from the CLI to the loop;
//!   `parallel` keeps the flag's name until `sizing` turns it into the streams
//!   that fit, which the scheduler takes as its `max_running`), by concern: `intake`
//!   (commands; validating, rendering with the request's `tools`,
//!   tokenizing; one scheduler sequence per completion), `sizing` (the KV layout: streams start at 256 cells and at least
//!   double when a longer request arrives, up to the model's context and the KV
//!   memory budget, past which fewer streams run rather than a request failing;
//!   growing preempts running sequences, which are recomputed), `decode` (the
//!   batch, ordered by stream so llama.cpp decodes all running streams in one
//!   micro-batch, idle streams in the gaps filled with a throwaway token
//!   (`EngineConfig::gap_fill`), or in steady steps every idle stream with
//!   logits asked for (`EngineConfig::steady_steps`: with the scheduler's
//!   `admit_every`, consecutive steps keep one shape for llama.cpp's graph
//!   reuse and CUDA graphs); failure isolation; parallel sampling; what each stream
//!   computed, recorded before the scheduler's commit), `even` (with
//!   `EngineConfig::even_chunks`, a step's prompt chunks cut to one length
//!   where the timeline's count of llama.cpp's micro-batches says that
//!   carries more tokens per micro-batch, on the step's real streams; the
//!   scheduler plans the rest of a cut chunk next), `output` (stop
//!   conditions, streamed text), `outbox` (a step's events, each channel's
//!   handed over in one message at the step's end; a batched channel's
//!   tokens wait up to its delay, an end never), `lifecycle` (the one path that ends a request
//!   and owns the in-flight count; a request that offered tools has the calls
//!   in each completion's text parsed into `tool_calls`; publishing the
//!   statistics, which the loop does with an end, before it waits, and every
//!   50 ms), `tally` (every count, sum and mean behind `EngineStats`,
//!   changed only through methods named for what happened), `timeline` (the
//!   step records of a watched loop, for `cortex run --trace`), `threads` (on a shared machine
//!   the engine decodes with the cores other processes leave free: llama.cpp's
//!   threads spin at a barrier after every operation, so a thread descheduled by
//!   another process stalls the rest; measured on 2 cores, B = 16: 220 tokens/s
//!   alone, with two busy processes beside it 28 with 2 threads and 100 with 1).
//! - `engine`: `Engine` (handle): `launch` (a binding's body runs on the
//!   engine thread, loads what its executors borrow, says where the model is
//!   and hands one executor per step loop to `Launch::run`), submit (alone or many at once), cancel, stats,
//!   `available_slots`, `health` (running, stopped, or died with the panic's
//!   message: a panic in the loop fails every request in hand with
//!   `EngineError::Died` instead of stranding it), shutdown draining or aborting
//!   (returning how the loop ended).
//! - `protocol`: what the handle and the step loop share — the commands the
//!   handle sends, the state both read (`Shared`: stats, in-flight count,
//!   health), and the event channel (`event_channel`, `event_channel_batched`,
//!   `EventSender`, `EventReceiver`: a caller never names the channel crate;
//!   a step's events for a channel travel as one message).
//!   `engine` starts the step loops (`step::StepLoop`) and talks to them only
//!   through it; `step` never imports `engine` (tidy checks that no crate's
//!   top-level modules import each other in a circle).
//! - `system`: this process's resident memory and the machine's, from `/proc`.
//! - `step/embed`: embedding requests. Their inputs are tokenized at intake and
//!   packed across requests, in arrival order, into decodes of at most
//!   `EMBED_SEQUENCES` (64) inputs and 512 tokens (a longer input alone), one
//!   between two generation steps, through `Executor::embed`: in llama.cpp a
//!   second context of its own (embeddings on, the GGUF's pooling or the mean,
//!   one unified KV emptied before each batch, every sequence whole in one
//!   micro-batch), made on the first embedding request and grown to the
//!   largest batch. Vectors are scaled to unit length. A failed batch fails the
//!   requests that had inputs in it (retryable); they do not take a generation
//!   stream.
//! - `text`: `Utf8Stream` releases only complete characters; `StopMatcher`
//!   holds back any tail that could still become a stop string.
//!
//! Failure isolation: a failed decode truncates the batch's streams and retries
//! each stream alone; one that still finds no KV slot is preempted (recomputed
//! later), one that fails otherwise fails with a retryable `Executor` error; the
//! rest of the step goes on. A request bound again and again without computing
//! anything (or running without progress) fails with `Timeout` after
//! `request_timeout`.
//! Numerics: llama.cpp's logits depend in their last bits on batch shape, so
//! greedy outputs are exactly repeatable for the same schedule, and equal across
//! different schedules except at near-ties. With cortex's kernels (products and
//! attention) on the CPU, a sequence's logits do not depend on the rest of its
//! batch; with llama.cpp's, the flash-attention tiles move their last bits, and
//! an 8-bit activation rounding the other way can carry that up the layers.

#![forbid(unsafe_code)]

#[cfg(test)]
mod checking_executor_tests;
mod config;
mod engine;
mod error;
mod events;
mod executor;
#[cfg(any(test, feature = "test-support"))]
pub mod fake;
mod placement;
mod protocol;
mod step;
mod streams;
pub mod system;
mod text;

pub use config::{ComputedOn, EngineConfig};
pub use engine::{Engine, Launch};
pub use error::EngineError;
pub use events::{EngineEvent, EngineStats, StepObserver, StepRecord};
pub use executor::{
    BatchToken, EMBED_SEQUENCES, Executor, ExecutorError, KvLayout, PrefixShare, StreamId,
    TokenGrammar,
};
pub use placement::{CpuKernels, Device, DeviceChoice, DeviceKind, GpuLayers, ModelPlacement};
pub use protocol::{
    EngineHealth, EngineInfo, EventReceiver, EventSender, Events, Shutdown, event_channel,
    event_channel_batched,
};
