//! A loaded GGUF model: vocabulary, tokenizer, chat template, KV footprint.

use std::path::Path;
use std::sync::Arc;

use cortex_engine::{
    ComputedOn, CpuKernels, Device, DeviceChoice, EngineError, GpuLayers, ModelPlacement,
};
use cortex_models::read_gguf;
use cortex_request::TokenId;

use crate::devices;
use crate::sys::{self, RawDevice, RawDeviceKind, RawModel, RawPlacement};

/// A loaded GGUF model (weights, memory-mapped, and vocabulary).
pub struct Model {
    /// Shared with the grammars made for it, which read its vocabulary.
    pub(crate) raw: Arc<RawModel>,
    /// The GPU its layers (and its KV cache) are on; none: the CPU.
    gpu: Option<RawDevice>,
    /// That GPU's free memory before the model was loaded, bytes: what this
    /// process's use of it is measured from.
    gpu_free_before: usize,
    /// The share of its layers on that GPU.
    gpu_share: f64,
    /// The instruction set of cortex's CPU kernels where they run its
    /// CPU layers; `None`: llama.cpp's kernels run them all.
    cortex_kernels: Option<&'static str>,
    /// Whether cortex's kernels multiply every one of its matrices.
    kernels_take_every_matrix: bool,
}

/// The device a model is on, readable from any thread.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Placement {
    gpu: Option<RawDevice>,
    gpu_free_before: usize,
    /// The share of the model's layers (and of its KV cache) on the GPU.
    gpu_share: f64,
    /// Bytes of the model's weights.
    weights: u64,
    /// The instruction set of cortex's CPU kernels when they multiply the
    /// model's layers on the CPU.
    cortex_kernels: Option<&'static str>,
    /// Whether a line's output depends on nothing beside it: the model
    /// wholly on the CPU, every matrix multiplied by cortex's kernels.
    same_output: bool,
}

impl ModelPlacement for Placement {
    fn device(&self) -> Device {
        match self.gpu {
            Some(gpu) => devices::device(gpu),
            None => devices::cpu_device(),
        }
    }

    fn cortex_kernels(&self) -> Option<&'static str> {
        self.cortex_kernels
    }

    fn same_output(&self) -> bool {
        self.same_output
    }

    /// What the device says was taken since before the model loaded, or —
    /// on a device whose free memory does not move (Mesa's software driver,
    /// some integrated GPUs) — what was placed there, whichever is more.
    fn gpu_memory_used(&self, kv_bytes: u64) -> Option<u64> {
        let gpu = self.gpu?;
        let measured = self.gpu_free_before.saturating_sub(gpu.memory().0) as u64;
        let placed = (self.gpu_share * (self.weights + kv_bytes) as f64) as u64;
        Some(measured.max(placed))
    }
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("n_vocab", &self.n_vocab())
            .finish_non_exhaustive()
    }
}

impl Model {
    /// Loads a GGUF file onto the CPU, checking it first so that a missing,
    /// foreign or truncated file is a clear error rather than a failure
    /// inside llama.cpp.
    pub fn load(path: &Path) -> Result<Self, EngineError> {
        Self::load_on(
            path,
            &DeviceChoice::Cpu,
            GpuLayers::All,
            CpuKernels::default(),
            None,
        )
    }

    /// Loads a GGUF file with `layers` of it on the device `device` chooses
    /// (the rest, and everything when that is the CPU, on the CPU, where
    /// `cpu_kernels` multiply them), its file mapped or read as `mmap` says
    /// (see `EngineConfig::mmap`).
    pub fn load_on(
        path: &Path,
        device: &DeviceChoice,
        layers_on_gpu: GpuLayers,
        cpu_kernels: CpuKernels,
        mmap: Option<bool>,
    ) -> Result<Self, EngineError> {
        let gguf = read_gguf(path)?;
        let kernels_take_every_matrix = gguf
            .matrices
            .iter()
            .all(|m| !m.stacked && sys::kernels::multiplies(m.ggml_type, m.rows, m.columns));
        let gpu = devices::resolve(device)?;
        let cortex_kernels = cpu_kernels.uses_cortex_kernels();
        let placement = match gpu {
            None => RawPlacement::cpu(cortex_kernels),
            Some(gpu) => RawPlacement {
                devices: vec![gpu],
                gpu_layers: match layers_on_gpu {
                    GpuLayers::All => -1,
                    GpuLayers::Count(n) => i32::try_from(n).unwrap_or(i32::MAX),
                },
                cortex_kernels,
            },
        };
        let gpu_free_before = gpu.map_or(0, |gpu| gpu.memory().0);
        let raw = RawModel::load(path, &placement, mmap).map_err(|detail| EngineError::Load {
            path: path.to_owned(),
            detail: match gpu {
                Some(gpu) => format!(
                    "{detail} (on {} with {} MiB free: lower --gpu-layers, or use --device cpu)",
                    gpu.name(),
                    gpu_free_before >> 20
                ),
                None => detail,
            },
        })?;
        let layers = raw.n_layer().max(1);
        let gpu_share = match (gpu, layers_on_gpu) {
            (None, _) => 0.0,
            (Some(_), GpuLayers::All) => 1.0,
            (Some(_), GpuLayers::Count(n)) => (n as usize).min(layers) as f64 / layers as f64,
        };
        Ok(Self {
            raw: Arc::new(raw),
            gpu,
            gpu_free_before,
            gpu_share,
            cortex_kernels: (cortex_kernels && gpu_share < 1.0)
                .then(|| devices::load_backends(None, CpuKernels::default()).cortex_kernels)
                .flatten(),
            kernels_take_every_matrix,
        })
    }

    /// The device that holds the model's layers and KV cache: a GPU, or the
    /// CPU.
    pub fn device(&self) -> Device {
        self.placement().device()
    }

    /// Bytes of the GPU's memory this process has taken since it started
    /// loading the model (weights, KV cache, compute buffers); `None` on the
    /// CPU.
    pub fn gpu_memory_used(&self) -> Option<u64> {
        self.placement().gpu_memory_used(0)
    }

    /// Whether the device that computes the logits takes their argmax
    /// itself (greedy sampling in the decode graph): a GPU whose backend has
    /// the operation, or cortex's CPU kernels, which take it right after
    /// the output projection. Then llama.cpp copies no logits out for a
    /// micro-batch of greedy rows: with Gemma's 262,144-token vocabulary
    /// that copy and the host's argmax were 8% of a 64-row CPU step.
    pub(crate) fn samples_on_device(&self) -> bool {
        match self.gpu {
            Some(gpu) => self.gpu_share >= 1.0 && gpu.supports_argmax(self.n_vocab()),
            None => self.cortex_kernels.is_some(),
        }
    }

    /// Whether cortex's attention kernel computes attention over a KV cache
    /// in host memory: the model wholly on the CPU with cortex's kernels.
    pub(crate) fn attention_on_cortex_kernels(&self) -> bool {
        self.gpu.is_none() && self.cortex_kernels.is_some()
    }

    /// What computes its layers, for sizing: a GPU with memory of its own,
    /// all of them or some beside the CPU, or else the CPU (an integrated
    /// GPU shares the CPU's memory, and one drawn in software computes at
    /// the CPU's speed).
    pub(crate) fn computed_on(&self) -> ComputedOn {
        let discrete = self
            .gpu
            .is_some_and(|gpu| gpu.kind() == RawDeviceKind::Gpu && !gpu.is_software());
        if !discrete {
            ComputedOn::Cpu
        } else if self.gpu_share >= 1.0 {
            ComputedOn::Gpu
        } else {
            ComputedOn::GpuAndCpu
        }
    }

    /// The GPU's free and total memory now, bytes; `None` on the CPU.
    pub(crate) fn gpu_memory(&self) -> Option<(usize, usize)> {
        self.gpu.map(RawDevice::memory)
    }

    /// Where the model is, for reading its device's memory from any thread.
    pub(crate) fn placement(&self) -> Placement {
        Placement {
            gpu: self.gpu,
            gpu_free_before: self.gpu_free_before,
            gpu_share: self.gpu_share,
            weights: self.size_bytes(),
            cortex_kernels: self.cortex_kernels,
            same_output: self.gpu.is_none()
                && self.cortex_kernels.is_some()
                && self.kernels_take_every_matrix,
        }
    }

    /// Bytes of the model's weights.
    pub fn size_bytes(&self) -> u64 {
        self.raw.size_bytes()
    }

    /// Tokens in the vocabulary.
    pub fn n_vocab(&self) -> usize {
        self.raw.n_vocab()
    }

    /// The context length the model was trained with.
    pub fn n_ctx_train(&self) -> usize {
        self.raw.n_ctx_train()
    }

    /// Tokenizes text as llama.cpp does (the GGUF vocabulary is the tokenizer
    /// of record); `add_bos` adds the model's start token if it uses one.
    pub fn tokenize(&self, text: &str, add_bos: bool, parse_special: bool) -> Vec<TokenId> {
        self.raw
            .tokenize(text, add_bos, parse_special)
            .into_iter()
            .map(|t| t as TokenId)
            .collect()
    }

    /// The bytes of a token (control tokens render as nothing).
    pub fn token_bytes(&self, token: TokenId) -> Vec<u8> {
        self.raw.token_bytes(token as i32)
    }

    /// The text of a token, a control token's too (`<|channel|>`).
    pub fn control_token_text(&self, token: TokenId) -> Vec<u8> {
        self.raw.control_token_text(token as i32)
    }

    /// The texts of the start and end tokens (empty where there is none).
    pub fn start_end_texts(&self) -> (String, String) {
        self.raw.bos_eos_text()
    }

    /// Whether the token ends generation.
    pub fn is_end_of_generation(&self, token: TokenId) -> bool {
        self.raw.is_end_of_generation(token as i32)
    }

    /// Bytes of KV (f16 keys and values over every layer) one token takes.
    pub fn kv_bytes_per_token(&self) -> usize {
        let m = &self.raw;
        let heads = m.n_head().max(1);
        let arch = m.meta("general.architecture").unwrap_or_default();
        let head_dim = |key: &str| {
            m.meta(&format!("{arch}.attention.{key}"))
                .and_then(|v| v.parse::<usize>().ok())
                .unwrap_or(m.n_embd() / heads)
        };
        m.n_layer() * m.n_head_kv().max(1) * (head_dim("key_length") + head_dim("value_length")) * 2
    }

    /// Size of the model's embedding vectors.
    pub fn n_embd(&self) -> usize {
        self.raw.n_embd()
    }

    /// How embeddings pool token vectors: the GGUF's own pooling type if it
    /// names one (embedding models do), else the mean (a decoder model's
    /// last hidden states averaged over the input, as llama-server's
    /// `--pooling mean`).
    pub(crate) fn embedding_pooling(&self) -> sys::Pooling {
        let arch = self.raw.meta("general.architecture").unwrap_or_default();
        match self.raw.meta(&format!("{arch}.pooling_type")) {
            Some(kind) if kind != "0" => sys::Pooling::Model,
            _ => sys::Pooling::Mean,
        }
    }
}
