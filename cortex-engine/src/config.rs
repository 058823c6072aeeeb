//! The engine's settings: the step loop's, and where the binding puts the
//! model (read by `cortex-llama`, which loads it).

use std::path::PathBuf;
use std::time::Duration;

use crate::error::EngineError;
use crate::placement::{CpuKernels, DeviceChoice, GpuLayers};

/// How an engine is set up.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct EngineConfig {
    /// The GGUF model file.
    pub model: PathBuf,
    /// Sequences decoding at once at most (`--parallel`, llama.cpp's
    /// `n_parallel`); each gets a KV stream of its own. Fewer run when the KV
    /// memory or [`EngineConfig::step_cells`] cannot hold that many streams.
    /// 0: as many as suit the device ([`EngineConfig::CPU_PARALLEL`] on the
    /// CPU, [`EngineConfig::GPU_PARALLEL`] on a GPU).
    pub parallel: usize,
    /// Requests the engine will be given in all, when the caller knows (a
    /// `cortex run` of a 3-line job: 3). Left to the device, `parallel` is
    /// then no more than this: llama.cpp allocates and zeroes every stream's
    /// cells when it makes the KV cache, so a one-line job on an 8B model would
    /// otherwise wait for 64 streams (2 GiB) it never uses. `None`: unknown (a
    /// server, a worker of the whole queue).
    pub work_bound: Option<usize>,
    /// Cells of each stream: the longest sequence (prompt plus generation) one
    /// request may have. `None` sizes streams from the requests themselves:
    /// they start small and grow (the KV is rebuilt, running requests are
    /// recomputed) when a longer request arrives, up to the model's context
    /// and `kv_memory`.
    pub stream_tokens: Option<usize>,
    /// Most bytes the KV cache may take when streams are sized automatically;
    /// past it, fewer sequences run at once rather than long requests failing.
    /// 0 means: on a GPU, the memory it has free after the model (less a
    /// reserve for llama.cpp's buffers); on the CPU, a quarter of the
    /// machine's memory. More than the device has is refused at start.
    pub kv_memory: usize,
    /// KV cells that the streams of one step span at most (streams times
    /// cells per stream), when streams are sized automatically: with long
    /// requests fewer sequences decode at once. In llama.cpp's attention every
    /// sequence of a batch attends over as many cells as the longest one
    /// holds, so wide batches of long, uneven sequences pay for padding;
    /// cortex's attention skips it, yet measured on the default model a mixed
    /// chat job still ran fastest at 16 sequences of 1,024 cells (49.4 s
    /// against 60.8 s at 64 with cortex's kernels; 11% faster with llama.cpp's),
    /// while short requests run fastest 64 at a time. 0: for the device
    /// ([`EngineConfig::CPU_STEP_CELLS`] on the CPU; no bound but the
    /// memory on a GPU, where attention over padding costs next to nothing
    /// beside a step's fixed cost).
    pub step_cells: usize,
    /// Tokens per KV accounting block (the unit of prefix sharing).
    pub block_size: usize,
    /// Step loops sharing the device, each with its own KV cache and
    /// sequences (`parallel` split between them): while one waits for a GPU
    /// to finish its step, another plans, samples and streams its own, so
    /// the device is not idle through the host's share of every step. 0: for
    /// the device ([`EngineConfig::CPU_STEP_LOOPS`],
    /// [`EngineConfig::GPU_STEP_LOOPS`]).
    pub step_loops: usize,
    /// Idle streams at most that a step fills with one throwaway token each
    /// to join the running streams on either side into one of llama.cpp's
    /// micro-batches (it splits a batch at every gap between stream ids,
    /// and on a GPU each micro-batch costs about a step's fixed cost while a
    /// token costs next to nothing). The token is removed right after the
    /// decode. `None`: for the device ([`EngineConfig::CPU_GAP_FILL`],
    /// [`EngineConfig::GPU_GAP_FILL`]).
    pub gap_fill: Option<usize>,
    /// Cut a step's prompt chunks to one length where that has llama.cpp
    /// compute the step in fewer micro-batches per token, counted on the
    /// step's own streams (it takes an equal number of tokens from each
    /// stream of a micro-batch, so uneven chunks cost one more each time the
    /// shortest ends): a chunk at least that long is cut to it, one of at
    /// most 16 tokens goes a token a step beside the decode tokens, a longer
    /// one keeps its length; the rest of a cut prompt comes in later steps.
    /// `None`: for the device ([`EngineConfig::CPU_EVEN_CHUNKS`],
    /// [`EngineConfig::GPU_EVEN_CHUNKS`]).
    pub even_chunks: Option<bool>,
    /// Steady steps: when above 0, waiting requests join only on every
    /// `steady_steps`-th step while others run, and every step that decodes
    /// spans all the loop's streams, each idle one with a throwaway token
    /// whose logits are computed and dropped. Between joins every step then
    /// has one shape (the same tokens, streams and outputs), so llama.cpp
    /// reuses its graph and CUDA replays the launches it recorded instead
    /// of launching every kernel again (on a GPU a step of a small model is
    /// mostly launches). The price: a freed slot waits up to
    /// `steady_steps - 1` steps, and idle streams are computed. 0 (the
    /// default): off. Measured on an H200 at 16, it ran the distinct,
    /// shared-prefix and chat jobs 3.5x, 2.5x and 2.3x slower: a join step
    /// takes in only as many prompts as one batch holds, so streams fill
    /// 16 times more slowly, and most steps are idle fillers; graphs were
    /// already reused on half the steps without it.
    pub steady_steps: usize,
    /// Tokens per `llama_decode` call at most (decode tokens plus prompt
    /// chunks; there is always room for every running sequence's token).
    pub max_batch_tokens: usize,
    /// Tokens in one of llama.cpp's micro-batches at most (its `n_ubatch`):
    /// it computes a decode call in passes over the weights of at most this
    /// many tokens. 0: for the device ([`EngineConfig::CPU_MICRO_BATCH_TOKENS`];
    /// on a GPU a whole decode call, [`EngineConfig::GPU_MICRO_BATCH_TOKENS`],
    /// because there a pass costs about the same at 256 tokens as at 512,
    /// so a step that holds more, prompt chunks and fillers beside its
    /// decode tokens, should not take two).
    pub micro_batch_tokens: usize,
    /// CPU threads for llama.cpp, each step loop's. 0: for the device: every
    /// available core, adapting to the load of other processes, unless a GPU
    /// holds the whole model ([`EngineConfig::GPU_THREADS`]).
    pub threads: usize,
    /// Share the KV of common prompt prefixes between requests.
    pub prefix_sharing: bool,
    /// Fail a running request that makes no progress for this long.
    pub request_timeout: Option<Duration>,
    /// The device that runs the model and holds its KV cache: the first GPU
    /// when there is one (`auto`), the CPU, or a device by name.
    pub device: DeviceChoice,
    /// Layers of the model on that GPU (all by default; the rest on the CPU).
    pub gpu_layers: GpuLayers,
    /// How llama.cpp reads the model's file: mapped into memory (`true`),
    /// read through buffers (`false`; to a GPU, from pinned memory while
    /// the next chunk is read), or its own choice (`None`: mapped, unless a
    /// device cannot take mapped weights).
    pub mmap: Option<bool>,
    /// Which code multiplies the weights on the CPU: cortex's kernels where
    /// they have the weights' format (the default), or llama.cpp's.
    pub cpu_kernels: CpuKernels,
    /// Let the device that computes the logits take the argmax of greedy
    /// rows itself, inside the decode (one token per row comes back instead
    /// of the vocabulary's logits): a GPU, or cortex's CPU kernels (not
    /// llama.cpp's). Rows that need more (randomness, bias, penalties, a
    /// grammar, log probabilities) are always sampled on the host. On the
    /// CPU it saves llama.cpp's copy of every row's logits (a 64-row step of
    /// Gemma 3's 262,144-token vocabulary: 64 MiB) and the host's pass over
    /// them. On by default: llama.cpp adds
    /// every sequence's sampler to every micro-batch of a step, which once
    /// made a mixed chat job slower, but with gaps filled
    /// ([`EngineConfig::gap_fill`]) steps are one micro-batch or two, and on
    /// an H200 it ran the chat, distinct and shared-prefix jobs 1.37x, 1.29x
    /// and 1.16x faster than host sampling.
    pub sample_on_device: bool,
    /// A directory of llama.cpp backend modules to look in before the
    /// program's own directory (see `cortex_llama::load_backends`).
    pub backends_dir: Option<PathBuf>,
    /// Render chats with this template instead of the model's own (for a
    /// GGUF without one): the name of a template llama.cpp knows (`chatml`,
    /// `llama3`, `gemma`, ...: `chat_template_names`), a file holding one, or
    /// the template's text (Jinja).
    pub chat_template: Option<String>,
}

/// What computes a model's layers: the device [`EngineConfig::for_device`]
/// sizes settings for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ComputedOn {
    /// The CPU, or a GPU sized as the CPU is: an integrated one, which shares
    /// the CPU's memory, or one drawn in software, at the CPU's speed.
    Cpu,
    /// A GPU with memory of its own, some layers left to the CPU.
    GpuAndCpu,
    /// A GPU with memory of its own holding every layer.
    Gpu,
}

impl EngineConfig {
    /// A size chosen for the device the model runs on (see
    /// [`EngineConfig::for_device`]).
    pub const FOR_DEVICE: usize = 0;

    /// Sequences decoding at once on the CPU by default: on the default
    /// model and a 2-core machine, short requests run fastest 64 at a time
    /// (long ones are held to fewer by [`EngineConfig::step_cells`]).
    pub const CPU_PARALLEL: usize = 64;

    /// Sequences decoding at once on a GPU by default: llama.cpp's most
    /// (`LLAMA_MAX_SEQ`). A step's cost on a GPU is mostly fixed (launches,
    /// the graph, the host's work), so the widest batch runs a job fastest.
    pub const GPU_PARALLEL: usize = 256;

    /// KV cells one step spans at most on the CPU by default: 64 streams of
    /// 256 cells, 32 of 512, 16 of 1,024 (see [`EngineConfig::step_cells`]).
    pub const CPU_STEP_CELLS: usize = 16_384;

    /// Step loops on the CPU by default: one (the CPU computes every step,
    /// so a second loop would only take its cores).
    pub const CPU_STEP_LOOPS: usize = 1;

    /// Step loops on a GPU by default: two, each up to
    /// [`EngineConfig::GPU_PARALLEL`] sequences, one preparing its step while
    /// the device computes the other's.
    pub const GPU_STEP_LOOPS: usize = 2;

    /// Idle streams filled per gap by default on the CPU: a few. There a
    /// throwaway token costs its full share of the step's compute, a
    /// micro-batch another pass over the weights; on a mixed chat job of 160
    /// items (AMD EPYC, 2 cores) 4 ran it in 7.4 s against 9.6 s with none
    /// and 8.2 s with every gap filled (medians of 3).
    pub const CPU_GAP_FILL: usize = 4;

    /// Idle streams filled per gap by default on a GPU: every one (see
    /// [`EngineConfig::gap_fill`]).
    pub const GPU_GAP_FILL: usize = usize::MAX;

    /// Even chunks on the CPU by default (see [`EngineConfig::even_chunks`]).
    pub const CPU_EVEN_CHUNKS: bool = false;

    /// Even chunks on a GPU by default: a micro-batch there costs about a
    /// step's fixed cost whatever it holds (10 ms on an H200 with the
    /// default model). Counted on a CPU run planned as a GPU loop's, it took
    /// the distinct, prefix and chat jobs in 6% fewer, 1% more and 4% fewer
    /// micro-batches.
    pub const GPU_EVEN_CHUNKS: bool = true;

    /// Tokens per decode call by default: every sequence's decode token and
    /// a prompt chunk or two beside them, on the CPU and on a GPU alike. On
    /// a GPU each micro-batch costs a step about the same whatever it holds,
    /// and prompt chunks of different lengths are micro-batches of their
    /// own: at 2,048 a mixed chat job split each step into 25 of them and
    /// ran 1.3x slower than at 512 (measured on an H200).
    pub const DEFAULT_BATCH_TOKENS: usize = 512;

    /// Most tokens per decode call a setting may ask for (`max_batch_tokens`),
    /// and most sequences (`parallel`): far beyond any machine's use, low
    /// enough that an executor can allocate a batch of them.
    pub const MOST_BATCH_TOKENS: usize = 1 << 20;

    /// Most sequences `parallel` may ask for (see
    /// [`EngineConfig::MOST_BATCH_TOKENS`]).
    pub const MOST_PARALLEL: usize = 1 << 20;

    /// Tokens in one of llama.cpp's micro-batches (its `n_ubatch`) at most
    /// on the CPU.
    pub const CPU_MICRO_BATCH_TOKENS: usize = 512;

    /// The same on a GPU: no bound but the decode call's own
    /// ([`EngineConfig::decode_tokens`]).
    pub const GPU_MICRO_BATCH_TOKENS: usize = usize::MAX;

    /// llama.cpp threads of each step loop when a GPU holds the whole model:
    /// one. All that llama.cpp computes on the CPU then is the input
    /// embeddings (a row looked up per token, microseconds a step), yet a
    /// pool of threads makes every decode wake them, and between graphs
    /// ggml's threads poll for work for far longer than a GPU step lasts, so
    /// they never rest: two loops of one thread per core kept twice as many
    /// threads spinning as the machine has cores, beside the loops' own host
    /// work and the GPU's launches.
    pub const GPU_THREADS: usize = 1;

    /// Defaults for `model`: sequences, step loops and KV span for the
    /// device, streams sized from the requests, 16-token blocks, 512-token
    /// batches, all cores, prefix sharing on, a 10-minute stall timeout.
    pub fn new(model: impl Into<PathBuf>) -> Self {
        Self {
            model: model.into(),
            parallel: Self::FOR_DEVICE,
            work_bound: None,
            stream_tokens: None,
            kv_memory: 0,
            step_cells: Self::FOR_DEVICE,
            step_loops: Self::FOR_DEVICE,
            gap_fill: None,
            even_chunks: None,
            steady_steps: 0,
            block_size: 16,
            max_batch_tokens: Self::DEFAULT_BATCH_TOKENS,
            micro_batch_tokens: Self::FOR_DEVICE,
            threads: 0,
            prefix_sharing: true,
            request_timeout: Some(Duration::from_secs(600)),
            device: DeviceChoice::Auto,
            gpu_layers: GpuLayers::All,
            mmap: None,
            cpu_kernels: CpuKernels::Cortex,
            sample_on_device: true,
            backends_dir: None,
            chat_template: None,
        }
    }

    /// Settings for tests over a fake executor (`Engine::start_with_executor`):
    /// `parallel` sequences, `block_size`-token blocks, 64-token batches,
    /// streams that grow within 1 GiB, sharing on, fixed threads, no timeout.
    #[cfg(any(test, feature = "test-support"))]
    pub fn for_fake_executor(parallel: usize, block_size: usize) -> Self {
        Self {
            parallel,
            block_size,
            max_batch_tokens: 64,
            kv_memory: 1 << 30,
            step_cells: usize::MAX,
            threads: 1,
            request_timeout: None,
            ..Self::new("fake")
        }
    }

    /// These settings with every size left to the device chosen for the one
    /// that computes the model (`computed_on`).
    pub fn for_device(&self, computed_on: ComputedOn) -> Self {
        let on_gpu = computed_on != ComputedOn::Cpu;
        let pick = |value: usize, cpu: usize, gpu: usize| match value {
            Self::FOR_DEVICE if on_gpu => gpu,
            Self::FOR_DEVICE => cpu,
            value => value,
        };
        let step_loops = pick(self.step_loops, Self::CPU_STEP_LOOPS, Self::GPU_STEP_LOOPS);
        // Left to the device, every loop runs as many as suit it, and no more
        // than the work there is (at least one a loop).
        let parallel = match self.parallel {
            Self::FOR_DEVICE => {
                let suited = if on_gpu {
                    Self::GPU_PARALLEL
                } else {
                    Self::CPU_PARALLEL
                } * step_loops;
                self.work_bound
                    .map_or(suited, |work| suited.min(work.max(step_loops)))
            }
            parallel => parallel,
        };
        let threads = match self.threads {
            Self::FOR_DEVICE if computed_on == ComputedOn::Gpu => Self::GPU_THREADS,
            threads => threads,
        };
        Self {
            parallel,
            step_loops,
            threads,
            step_cells: pick(self.step_cells, Self::CPU_STEP_CELLS, usize::MAX),
            micro_batch_tokens: pick(
                self.micro_batch_tokens,
                Self::CPU_MICRO_BATCH_TOKENS,
                Self::GPU_MICRO_BATCH_TOKENS,
            ),
            gap_fill: Some(self.gap_fill.unwrap_or(if on_gpu {
                Self::GPU_GAP_FILL
            } else {
                Self::CPU_GAP_FILL
            })),
            even_chunks: Some(self.even_chunks.unwrap_or(if on_gpu {
                Self::GPU_EVEN_CHUNKS
            } else {
                Self::CPU_EVEN_CHUNKS
            })),
            ..self.clone()
        }
    }

    /// Tokens the step loop plans per decode at most: the batch budget, and
    /// never less than one per sequence.
    pub fn planned_tokens(&self) -> usize {
        self.max_batch_tokens.max(self.parallel).max(1)
    }

    /// Tokens one decode call of a loop may hold (of a loop's settings, see
    /// [`EngineConfig::per_loop`]): what it plans, and one throwaway token
    /// for each idle stream between running ones ([`EngineConfig::gap_fill`]),
    /// of which there are fewer than its sequences. An executor takes batches
    /// this large.
    pub fn decode_tokens(&self) -> usize {
        self.planned_tokens().saturating_add(self.parallel.max(1))
    }

    /// Refuses sizes no executor could allocate, naming the setting (checked
    /// before anything is allocated for them).
    pub fn check_limits(&self) -> Result<(), EngineError> {
        let refuse = |setting: &str, value: usize, most: usize, what: &str| {
            let flag = setting.replace('_', "-");
            Err(EngineError::Model(format!(
                "{setting} = {value} is more than the {most} {what} cortex allows: lower --{flag}"
            )))
        };
        if self.max_batch_tokens > Self::MOST_BATCH_TOKENS {
            return refuse(
                "batch_tokens",
                self.max_batch_tokens,
                Self::MOST_BATCH_TOKENS,
                "tokens per decode",
            );
        }
        if self.parallel > Self::MOST_PARALLEL {
            return refuse("parallel", self.parallel, Self::MOST_PARALLEL, "sequences");
        }
        Ok(())
    }

    /// Tokens in one of llama.cpp's micro-batches for these settings (left
    /// to the device and not yet sized for one: as on the CPU).
    pub fn micro_batch_tokens(&self) -> usize {
        let most = match self.micro_batch_tokens {
            Self::FOR_DEVICE => Self::CPU_MICRO_BATCH_TOKENS,
            most => most,
        };
        self.decode_tokens().min(most)
    }

    /// The settings of each of [`EngineConfig::step_loops`] loops (sized
    /// ones, see [`EngineConfig::for_device`]): the sequences and a set KV
    /// memory shared out between them.
    pub fn per_loop(&self) -> Self {
        let loops = self.step_loops.max(1);
        Self {
            parallel: self.parallel.div_ceil(loops).max(1),
            kv_memory: self.kv_memory / loops,
            step_loops: loops,
            ..self.clone()
        }
    }

    /// The most threads the step loop adapts llama.cpp's to, following the
    /// cores other processes leave free; `None` when the threads were set
    /// (then they are kept as set).
    pub(crate) fn adaptive_threads(&self) -> Option<usize> {
        (self.threads == 0).then(|| self.effective_threads())
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

#[cfg(test)]
mod tests {
    use super::{ComputedOn, EngineConfig};

    #[test]
    fn sizes_no_executor_could_allocate_are_refused_by_name() {
        let mut config = EngineConfig::new("m");
        assert!(config.check_limits().is_ok());
        config.max_batch_tokens = usize::MAX;
        let error = config.check_limits().unwrap_err().to_string();
        assert!(
            error.contains("batch_tokens = ") && error.contains("--batch-tokens"),
            "{error}"
        );
        config.max_batch_tokens = EngineConfig::MOST_BATCH_TOKENS;
        config.parallel = usize::MAX;
        let error = config.check_limits().unwrap_err().to_string();
        assert!(
            error.contains("parallel = ") && error.contains("--parallel"),
            "{error}"
        );
        // The largest allowed sizes still add up without overflow.
        config.parallel = EngineConfig::MOST_PARALLEL;
        assert!(config.check_limits().is_ok());
        assert_eq!(
            config.decode_tokens(),
            EngineConfig::MOST_BATCH_TOKENS + EngineConfig::MOST_PARALLEL
        );
    }

    #[test]
    fn a_gpu_computes_a_whole_decode_call_in_one_micro_batch_and_the_cpu_in_512s() {
        let mut config = EngineConfig::new("m");
        config.max_batch_tokens = 2048;
        let cpu = config.for_device(ComputedOn::Cpu).per_loop();
        assert_eq!(cpu.micro_batch_tokens(), 512);
        let gpu = config.for_device(ComputedOn::Gpu).per_loop();
        assert_eq!(gpu.micro_batch_tokens(), gpu.decode_tokens());
        assert_eq!(gpu.decode_tokens(), 2048 + EngineConfig::GPU_PARALLEL);
        // A size given is kept on either device, within the decode call.
        config.micro_batch_tokens = 1024;
        assert_eq!(
            config.for_device(ComputedOn::Gpu).micro_batch_tokens(),
            1024
        );
        config.micro_batch_tokens = 100_000;
        assert_eq!(
            config
                .for_device(ComputedOn::Cpu)
                .per_loop()
                .micro_batch_tokens(),
            2048 + 64
        );
    }

    #[test]
    fn a_known_amount_of_work_bounds_the_sequences_left_to_the_device() {
        let mut config = EngineConfig::new("m");
        config.work_bound = Some(3);
        assert_eq!(config.for_device(ComputedOn::Cpu).parallel, 3);
        // Each GPU loop keeps at least one.
        assert_eq!(config.for_device(ComputedOn::Gpu).parallel, 3);
        config.work_bound = Some(1);
        assert_eq!(
            config.for_device(ComputedOn::Gpu).parallel,
            EngineConfig::GPU_STEP_LOOPS
        );
        // More work than suits the device: the device's size.
        config.work_bound = Some(10_000);
        assert_eq!(
            config.for_device(ComputedOn::Cpu).parallel,
            EngineConfig::CPU_PARALLEL
        );
        // A size the user gave is theirs, whatever the work.
        config.parallel = 32;
        config.work_bound = Some(3);
        assert_eq!(config.for_device(ComputedOn::Cpu).parallel, 32);
    }

    #[test]
    fn a_gpu_holding_the_whole_model_decodes_with_one_thread_a_loop() {
        let mut config = EngineConfig::new("m");
        assert_eq!(config.for_device(ComputedOn::Gpu).per_loop().threads, 1);
        // Where the CPU computes layers, every core, adapting to the load.
        for computed_on in [ComputedOn::Cpu, ComputedOn::GpuAndCpu] {
            let sized = config.for_device(computed_on).per_loop();
            assert_eq!(sized.threads, 0);
            assert_eq!(sized.adaptive_threads(), Some(sized.effective_threads()));
        }
        // A count given is kept everywhere.
        config.threads = 6;
        for computed_on in [ComputedOn::Cpu, ComputedOn::GpuAndCpu, ComputedOn::Gpu] {
            assert_eq!(config.for_device(computed_on).per_loop().threads, 6);
        }
    }
}
