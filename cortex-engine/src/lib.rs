//! The cortex engine: continuous batching on llama.cpp.
//!
//! This is the only crate that talks to llama.cpp (through `llama-cpp-sys-2`,
//! bound in one module, `llama::sys`). An
//! [`Engine`] runs its step loop on a thread of its own and is driven over
//! channels: submit a [`cortex_request::Request`] and receive its
//! [`EngineEvent`]s (tokens with UTF-8-safe text deltas, then `Finished` with
//! completions, usage and timings, or `Failed`); cancel at any time; read
//! [`EngineStats`]; shut down draining or aborting.
//!
//! Each step takes a plan from `cortex-sched`, builds one llama batch mixing
//! prompt chunks and decode tokens (logits only where a token is sampled),
//! decodes, samples every row with `cortex-sample` in parallel, applies stop
//! conditions (EOS, max tokens, stop ids, stop strings held back until they
//! can no longer form) and streams the text. Every running sequence has a KV
//! stream of its own (llama.cpp's non-unified KV), so a token attends only to
//! its own sequence and large batches stay fast; streams are sized from the
//! requests and grow when a longer one arrives. `cortex-kv`'s block
//! accounting decides what is shared: a prompt prefix is computed once and a
//! new sequence gets it by taking over the finished stream that holds it or by
//! a whole-stream copy (milliseconds, where recomputing costs seconds). A
//! [`Backend`] trait separates the loop from llama.cpp so failures can be
//! injected in tests; [`Engine::health`] reports a loop that died.
//!
//! Models come from `cortex-models` (the registry, and the default model,
//! SmolLM2-135M-Instruct Q4_1, fetched from its Python package); the engine
//! checks any GGUF with `cortex_models::read_gguf` before llama.cpp sees it,
//! so a missing, foreign or truncated file is a clear error naming the path.
//!
//! # Example
//!
//! ```
//! use cortex_engine::{Engine, EngineConfig, EngineEvent};
//! use cortex_models::{DEFAULT_MODEL, ModelCache};
//! use cortex_request::{Request, RequestId, SamplingParams};
//!
//! let model = ModelCache::default_location().ensure(&DEFAULT_MODEL)?; // fetched once
//! let engine = Engine::start(&EngineConfig::new(model))?;
//!
//! let mut request = Request::new(RequestId(1), "The capital of France is");
//! request.sampling = SamplingParams::greedy();
//! request.stop.max_tokens = 8;
//! for event in engine.submit(request)?.iter() {
//!     match event {
//!         EngineEvent::Token { text, .. } => print!("{text}"),
//!         EngineEvent::Finished(response) => {
//!             assert_eq!(response.usage.completion_tokens, 8);
//!             break;
//!         }
//!         EngineEvent::Failed { error, .. } => panic!("{error}"),
//!         _ => {}
//!     }
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Design notes
//!
//! The only crate that names llama.cpp. It binds `llama-cpp-sys-2` (bindgen
//! output) itself, in one module, `llama::sys` (by concern: `model`, `context`,
//! `grammar`, `devices`): the only code in cortex with `unsafe` (the crate is
//! `deny(unsafe_code)`, that module allows it), each call with its `SAFETY` note.
//! A higher-level wrapper would hide the context handle, which cortex needs to
//! change a running context's threads and to give it a persistent threadpool,
//! and ggml's registry, which it needs to load backend modules from places of its
//! choosing. Modules:
//!
//! - `llama::devices`: llama.cpp's backends as run-time modules. llama.cpp is built
//!   with `GGML_BACKEND_DL` and `GGML_CPU_ALL_VARIANTS` (llama-cpp-sys-2's
//!   `dynamic-backends`): `libllama`, `libggml` and `libggml-base` are shared
//!   libraries, and the CPU backend is one module per instruction-set level.
//!   `build.rs` puts the libraries (under the names they load by) and the CPU
//!   modules beside every program the build makes, in `target/<profile>/` and
//!   its `deps/`; programs find the libraries through an `$ORIGIN` run path
//!   (`.cargo/config.toml`). `load_backends` runs once per process: it looks in
//!   the configured `backends_dir`, then the program's own directory (never the
//!   current one); for each backend the first directory that has it wins, each
//!   variant is opened (`libloading`) for its `ggml_backend_score`, the best is
//!   registered with `ggml_backend_load`, and what was skipped is kept with why
//!   (`cortex devices` prints it). GPU modules are built apart from the same
//!   source (`scripts/build-backend.sh`) and found the same way. ggml's
//!   threadpool functions live in the CPU module, so `sys::context` looks them
//!   up through its registry entry. `DeviceChoice` (`auto`: the first GPU, else
//!   the CPU) and `GpuLayers` place a model: `Model::load_on` passes llama.cpp a
//!   one-device list (an empty list for the CPU, so no operation is offloaded)
//!   and the layer count.
//! - `llama::sys::kernels` and `native/`: cortex's CPU kernels, a ggml backend
//!   of its own in C, by concern: the matrix kernels (`kernels.h`: `layout.c`
//!   packs panels, `quantize.c` the activations, `gemm.c` the register tiles,
//!   `kernels_check.c` the scalar reference), attention (`attention.h`:
//!   `attention.c`, `attention_check.c`), and the backend (`backend.c`: what
//!   the device takes and the registry; `buffer.c`: the buffer type that packs
//!   weights; `compute.c`: running the work on the shared threads). Registered by
//!   `load_backends` as an accelerator device, `CortexCPU`, beside the CPU
//!   backend, the way llama.cpp's BLAS backend sits there. Why: llama.cpp has no
//!   fast path for Q4_1 (the default model's layers) on x86; it multiplies one
//!   dot product at a time, unpacking a row's nibbles again for every column and
//!   summing each block across a register. Measured on this machine's zen4
//!   variant: 21.8 GMAC/s per thread at every batch size, against 146-153 for
//!   the kernels. How:
//!   - *Layout.* A weight is packed into panels of 16 rows: lane r of a
//!     512-bit register holds 4 consecutive weights of row r, so one VNNI
//!     `vpdpbusd` adds 4 products to each of 16 rows' sums, a block takes 8 and
//!     no horizontal sum, and up to 8 columns reuse the unpacked weights in
//!     registers. Q4_1 panels take exactly ggml's bytes; Q8_0 (the default
//!     model's output) adds each row's block sum (activations go in as
//!     unsigned bytes, x + 128). An AVX2 path (maddubs/madd, 8 rows a half)
//!     serves CPUs without AVX-512 VNNI; elsewhere nothing is registered.
//!   - *Placement.* llama.cpp offers each CPU weight to an accelerator's buffer
//!     type first, asking the device whether it would run the weight's
//!     operation; the device accepts matrix products of Q4_1 and Q8_0 weights
//!     in whole panels, so those weights are stored in its buffer and packed as
//!     they load (`set_tensor`). The question is asked on the loading thread,
//!     which `Model::load_on` tells whether to accept (`EngineConfig::cpu_kernels`,
//!     `--cpu-kernels cortex|llama`). Once packed, the weight's pages of the
//!     mapped GGUF are dropped from the process (they stay in the page cache),
//!     so the copy does not count twice.
//!   - *Scheduling.* ggml runs an operation where its weight lives, so every
//!     product with a packed weight (and any row lookup in one) comes to the
//!     device; everything else stays on the CPU backend. The buffer type is
//!     host memory, so the CPU reads the products without copies.
//!   - *Threads.* A product runs as two ggml custom operations (quantize the
//!     activations as ggml's Q8_1/Q8_0 do, then multiply panels handed out in
//!     chunks) on a CPU backend of the device's own that shares the threadpool
//!     of the decoding context (`RawContext::decode` sets it): the same threads
//!     run llama.cpp's operations and the kernels', never two pools spinning on
//!     two cores.
//!   - *Attention* (`attention.c`, AVX-512): the device also takes
//!     `FLASH_ATTN_EXT` over an F16 KV cache (no ALiBi, soft-capping or sinks).
//!     Per KV head and block of 8 query rows, every query of the head's group
//!     shares each block of 16 cells of K (converted and transposed once) and
//!     V; scores are computed 16 cells at a time (twelve independent FMA
//!     chains), the softmax takes each query's exact maximum and `exp` 16 at a
//!     time, and the values (with the denominator as one more sum) are added
//!     cell by cell in cell order. So a query's result depends only on its own
//!     cells and their order: the same text gets the same embedding in any
//!     batch, which llama.cpp's kernel (online softmax rescaled at its 16-cell
//!     tiles) does not give. Against llama.cpp's CPU kernel on one thread:
//!     2.7x on 64 sequences of 160 cells, 2.0x on 8 of 2,000, 1.2x on a
//!     512-token causal prefill. Checked against a scalar reference, and the
//!     same sequence 37 cells further along, bit for bit
//!     (`attention_agrees_with_its_reference_wherever_a_sequence_lies`).
//!     llama.cpp's automatic flash-attention setting turns the fused operation
//!     off when it runs on another device than the layer (here: CortexCPU, not
//!     CPU), falling back to an unfused path several times slower; so a context
//!     whose model is wholly on the CPU asks for flash attention explicitly
//!     (`RawContext::new`), which llama.cpp's CPU backend supports for any F16
//!     cache.
//!   - *Numerics.* Every output element is computed by the same operations in
//!     the same order whatever the batch, and bit for bit as a scalar reference
//!     (the unit test `every_kernel_this_cpu_runs_agrees_with_the_scalar_reference`
//!     checks both instruction sets, both formats, batches 1 to 33). Against
//!     llama.cpp the sums are added in another order, so logits differ as they
//!     do between llama.cpp's own CPU variants (perplexity 16.87 against 16.89;
//!     its AVX2 and AVX-512 builds: 16.95 and 16.89), checked by
//!     `cortex_kernels_predict_text_as_well_as_llama_cpps`.
//! - Device memory is accounted in two places. At start, `step::sizing` asks
//!   the backend how much the KV cache may take where it lives
//!   (`Backend::kv_memory_available`: on a GPU its free memory after the model
//!   less a reserve for llama.cpp's buffers, on the CPU the machine's available
//!   memory) and what to use by default (`default_kv_memory`); a fixed layout or
//!   a `kv_memory` past what is available is refused there, so a job that does
//!   not fit fails at start. While running, `Engine::gpu_memory_used` reads the
//!   device's free memory against its reading before the model loaded, or —
//!   where a device's free memory does not move (lavapipe, some integrated GPUs)
//!   — what the engine placed there (the offloaded share of the weights and of
//!   the KV cache as laid out now), whichever is more; the server reports it in
//!   `/api/ps` and `/metrics`.
//! - `llama`: `sys` (the FFI owners: model, context, batch, threadpool, grammar
//!   sampler, backend modules and devices), `Model` (load on a device, tokenize,
//!   token bytes, end-of-generation, KV bytes per token, where it is), `chat` (`ChatRenderer`: the GGUF's Jinja template or a
//!   `EngineConfig::chat_template` file through `cortex-chat`, a leading BOS
//!   dropped when tokenizing adds one; a name llama.cpp knows, or a GGUF
//!   template minijinja cannot compile, through llama.cpp; checked at start),
//!   and
//!   `LlamaEngineBackend`: a context whose KV has one stream per sequence
//!   (non-unified), rebuilt when the engine changes the layout. A `RawGrammar`
//!   holds an `Arc` of the model, whose vocabulary it reads.
//! - `backend`: the `Backend` trait the loop runs on (vocabulary, decode, logits,
//!   KV layout, `copy_stream`, `truncate_stream`, threads, `grammar` for a
//!   request's constraint, one `TokenGrammar` per completion); tests run the loop
//!   over a fake one that keeps every cell of every stream and refuses holes,
//!   double writes and overflows, so a wrong copy or truncation shows.
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
//!   (`EngineConfig::gap_fill`); failure isolation; parallel sampling; what each stream
//!   computed, recorded before the scheduler's commit), `output` (stop
//!   conditions, streamed text), `lifecycle` (the one path that ends a request
//!   and owns the in-flight count; a request that offered tools has the calls
//!   in each completion's text parsed into `tool_calls`; publishing the
//!   statistics), `tally` (every count, sum and mean behind `EngineStats`,
//!   changed only through methods named for what happened), `timeline` (the
//!   step records of a watched loop, for `cortex run --trace`), `threads` (on a shared machine
//!   the engine decodes with the cores other processes leave free: llama.cpp's
//!   threads spin at a barrier after every operation, so a thread descheduled by
//!   another process stalls the rest; measured on 2 cores, B = 16: 220 tokens/s
//!   alone, with two busy processes beside it 28 with 2 threads and 100 with 1).
//! - `engine`: `Engine` (handle): submit (alone or many at once), cancel, stats,
//!   `available_slots`, `health` (running, stopped, or died with the panic's
//!   message: a panic in the loop fails every request in hand with
//!   `EngineError::Died` instead of stranding it), shutdown draining or aborting
//!   (returning how the loop ended).
//! - `protocol`: what the handle and the step loop share — the commands the
//!   handle sends, the state both read (`Shared`: stats, in-flight count,
//!   health), and the event channel (`event_channel`,
//!   `EventSender`, `EventReceiver`: a caller never names the channel crate).
//!   `engine` starts the step loops (`step::StepLoop`) and talks to them only
//!   through it; `step` never imports `engine` (tidy checks that no crate's
//!   top-level modules import each other in a circle).
//! - `system`: this process's resident memory and the machine's, from `/proc`.
//! - `step/embed`: embedding requests. Their inputs are tokenized at intake and
//!   packed across requests, in arrival order, into decodes of at most
//!   `EMBED_SEQUENCES` (64) inputs and 512 tokens (a longer input alone), one
//!   between two generation steps, through `Backend::embed`: in llama.cpp a
//!   second context of its own (embeddings on, the GGUF's pooling or the mean,
//!   one unified KV emptied before each batch, every sequence whole in one
//!   micro-batch), made on the first embedding request and grown to the
//!   largest batch. Vectors are scaled to unit length. A failed batch fails the
//!   requests that had inputs in it (retryable); they do not take a generation
//!   stream.
//! - `text`: `Utf8Stream` releases only complete characters; `StopMatcher`
//!   holds back any tail that could still become a stop string.
//! - `bench`: the engine against a plain loop on the same
//!   llama.cpp, in `llama-batched-bench`'s columns, and the shared-prefix job;
//!   every run starts from one `EngineConfig` (the CLI's settings: model,
//!   threads, device, kernels), and the plain loop loads its model the same
//!   way. `perplexity` measures how well a model predicts a text.
//!
//! Failure isolation: a failed decode truncates the batch's streams and retries
//! each stream alone; one that still finds no KV slot is preempted (recomputed
//! later), one that fails otherwise fails with a retryable `Backend` error; the
//! rest of the step goes on. A request bound again and again without computing
//! anything (or running without progress) fails with `Timeout` after
//! `request_timeout`.
//! Numerics: llama.cpp's logits depend in their last bits on batch shape, so
//! greedy outputs are exactly repeatable for the same schedule, and equal across
//! different schedules except at near-ties. With cortex's kernels (products and
//! attention) on the CPU, a sequence's logits do not depend on the rest of its
//! batch; with llama.cpp's, the flash-attention tiles move their last bits, and
//! an 8-bit activation rounding the other way can carry that up the layers.

// The FFI boundary (`llama::sys`) is the only module allowed `unsafe`.
#![deny(unsafe_code)]

/// Index of the largest logit (the greedy choice), as `cortex-sample` picks it.
pub(crate) fn argmax_row(logits: &[f32]) -> cortex_request::TokenId {
    cortex_sample::argmax(logits)
}

mod backend;
pub mod bench;
mod config;
mod engine;
mod error;
mod events;
mod llama;
mod protocol;
mod step;
mod streams;
mod system;
mod text;

pub use backend::{
    Backend, BackendError, BatchToken, EMBED_SEQUENCES, KvLayout, StreamId, TokenGrammar,
};
pub use config::EngineConfig;
pub use engine::Engine;
pub use error::EngineError;
pub use events::{EngineEvent, EngineStats, StepObserver, StepRecord};
pub use llama::{
    Backends, CpuKernels, Device, DeviceChoice, DeviceKind, GpuLayers, LoadedModule, Model,
    devices, load_backends,
};
pub use protocol::{
    EngineHealth, EngineInfo, EventReceiver, EventSender, Events, Shutdown, event_channel,
};
