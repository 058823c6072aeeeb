//! cortex on llama.cpp: the binding.
//!
//! The only crate of cortex that knows llama.cpp (through `llama-cpp-sys-2`,
//! bound in one module, `sys`) and the only one with `unsafe`. It loads a
//! model as a [`cortex_engine::EngineConfig`] places it (backend modules,
//! device, GPU layers, CPU kernels) and starts a [`cortex_engine::Engine`]
//! over it ([`start`]); the engine's step loop, the worker and the server
//! see only the engine's `Executor` trait and handle. Also here: the devices
//! and backend modules ([`load_backends`], [`devices`]), [`Model`], cortex's
//! own CPU kernels (`native/`, a ggml backend in C) and [`mod@bench`], the
//! engine against a plain loop on the same llama.cpp.
//!
//! ```
//! use cortex_engine::{EngineConfig, EngineEvent};
//! use cortex_models::{DEFAULT_MODEL, BlobStore};
//! use cortex_request::{Request, RequestId, SamplingParams};
//!
//! let model = BlobStore::default_location().ensure(&DEFAULT_MODEL)?; // fetched once
//! let engine = cortex_llama::start(&EngineConfig::new(model))?;
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
//! It binds `llama-cpp-sys-2` (bindgen
//! output) itself, in one module, `sys` (by concern: `model`, `context`,
//! `grammar`, `devices`): the only code in cortex with `unsafe` (the crate is
//! `deny(unsafe_code)`, that module allows it; every other crate of cortex
//! forbids it), each call with its `SAFETY` note.
//! A higher-level wrapper would hide the context handle, which cortex needs to
//! change a running context's threads and to give it a persistent threadpool,
//! and ggml's registry, which it needs to load backend modules from places of its
//! choosing. Modules:
//!
//! - `devices`: llama.cpp's backends as run-time modules. llama.cpp is built
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
//! - `sys::kernels` and `native/`: cortex's CPU kernels, a ggml backend
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
//!     unsigned bytes, x + 128). Two 256-bit paths, 8 rows a half, serve
//!     CPUs without AVX-512: AVX-VNNI's `vpdpbusd` on ymm (Alder Lake,
//!     Sierra Forest) with the same layout and offsets, and AVX2's
//!     `vpmaddubsw`/`vpmaddwd` (three instructions where VNNI has one);
//!     elsewhere nothing is registered.
//!   - *Placement.* llama.cpp offers each CPU weight to an accelerator's buffer
//!     type first, asking the device whether it would run the weight's
//!     operation; the device accepts matrix products of the weights it can pack
//!     in whole panels (Q4_1, Q5_1 and Q8_0, and the formats `native/convert.c`
//!     turns into them exactly or within a rounding: Q4_0 into Q4_1, Q4_K
//!     into its own panels, Q5_K into Q5_1, Q6_K into its own quants, 6.6 bits
//!     each in two planes, Q5_0 into Q5_1 for the AVX2 kernels and Q8_0 for
//!     the VNNI ones), so those weights are
//!     stored in its buffer and packed as they load (`set_tensor`). The question is asked on the loading thread,
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
//!   - *Attention* (`attention.c`, AVX-512 or AVX2 from one source,
//!     `attention_passes.h`, alike bit for bit): the device also takes
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
//!     (`attention_agrees_with_its_reference_wherever_a_sequence_lies_and_alike_on_both_isas`).
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
//! - `sys` (the FFI owners: model, context, batch, threadpool, grammar
//!   sampler, backend modules and devices; the device-side greedy sampler
//!   that takes one argmax over a micro-batch's logit rows, `rows_argmax`;
//!   the per-operation timer behind `cortex bench --profile-ops`, `profile`),
//!   `Model` (load on a device, tokenize,
//!   token bytes, end-of-generation, KV bytes per token, where it is), `chat` (`ChatRenderer`: the GGUF's Jinja template or a
//!   `EngineConfig::chat_template` file through `cortex-chat`, a leading BOS
//!   dropped when tokenizing adds one; a name llama.cpp knows, or a GGUF
//!   template minijinja cannot compile, through llama.cpp; checked at start),
//!   and
//!   `LlamaExecutor`: a context whose KV has one stream per sequence
//!   (non-unified), rebuilt when the engine changes the layout. A `RawGrammar`
//!   holds an `Arc` of the model, whose vocabulary it reads.
//! - `bench`: the engine against a plain loop on the same
//!   llama.cpp, in `llama-batched-bench`'s columns, and the shared-prefix job;
//!   every run starts from one `EngineConfig` (the CLI's settings: model,
//!   threads, device, kernels), and the plain loop loads its model the same
//!   way. `perplexity` measures how well a model predicts a text.

// The FFI boundary (`sys`) is the only module allowed `unsafe`.
#![deny(unsafe_code)]

pub mod bench;
mod chat;
mod devices;
mod executor;
mod model;
mod start;
mod sys;

pub use chat::check_chat_template_text;
pub use devices::{Backends, LoadedModule, devices, load_backends};
pub use model::Model;
pub use start::{start, start_observed};

/// Work items of cortex's attention kernel so far, in this process, that
/// read a prompt prefix several sequences hold copies of once for all of
/// them (0 where the kernel does not run: no AVX2, a GPU,
/// `--cpu-kernels llama`). A diagnostic: the tests check with it that
/// shared prefixes reach the kernel.
pub fn shared_prefix_attention_items() -> u64 {
    sys::kernels::attention_group_items()
}
