//! Where a model runs, as settings and as reports: the device choice, the
//! layers on a GPU, which CPU kernels, and the devices a backend offers.
//! Plain values: the binding (`cortex-llama`) reads them from llama.cpp
//! and acts on them; the engine, the worker and the server only carry them.

use std::fmt;
use std::str::FromStr;

/// A device that a loaded backend offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    /// ggml's name for it (`CPU`, `Vulkan0`, `CUDA0`, ...): what
    /// `--device` takes (in any case).
    pub name: String,
    /// What it is (`NVIDIA H100 80GB HBM3`, `llvmpipe (LLVM 15.0.6, 256 bits)`, ...).
    pub description: String,
    /// CPU, GPU, ...
    pub kind: DeviceKind,
    /// The llama.cpp module it belongs to (`CPU`, `Vulkan`, `CUDA`).
    pub backend: String,
    /// Free memory now, bytes.
    pub memory_free: u64,
    /// All its memory, bytes.
    pub memory_total: u64,
}

/// What kind of device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    /// The CPU, with the machine's memory.
    Cpu,
    /// A GPU with memory of its own.
    Gpu,
    /// A GPU that uses the machine's memory.
    IntegratedGpu,
    /// An accelerator used beside the CPU (BLAS, AMX).
    Accelerator,
    /// Something else.
    Other,
}

impl DeviceKind {
    /// Whether a model's layers can be offloaded to it.
    pub fn is_gpu(self) -> bool {
        matches!(self, DeviceKind::Gpu | DeviceKind::IntegratedGpu)
    }
}

impl fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Gpu => "gpu",
            DeviceKind::IntegratedGpu => "integrated gpu",
            DeviceKind::Accelerator => "accelerator",
            DeviceKind::Other => "other",
        })
    }
}

/// Which device runs the model.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum DeviceChoice {
    /// The first GPU if there is one, else the CPU.
    #[default]
    Auto,
    /// The CPU alone (no layer and no operation on a GPU).
    Cpu,
    /// A device by name (`vulkan0`, `CUDA1`; any case).
    Named(String),
}

impl FromStr for DeviceChoice {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.trim() {
            "" => Err("a device: auto, cpu or a device's name (cortex devices lists them)".into()),
            t if t.eq_ignore_ascii_case("auto") => Ok(DeviceChoice::Auto),
            t if t.eq_ignore_ascii_case("cpu") => Ok(DeviceChoice::Cpu),
            t => Ok(DeviceChoice::Named(t.to_owned())),
        }
    }
}

impl fmt::Display for DeviceChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceChoice::Auto => f.write_str("auto"),
            DeviceChoice::Cpu => f.write_str("cpu"),
            DeviceChoice::Named(name) => f.write_str(name),
        }
    }
}

/// Which code multiplies the weights of a model's layers that are on the
/// CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CpuKernels {
    /// cortex's kernels for the weight formats they have (Q4_0, Q4_1, Q4_K,
    /// Q5_0, Q5_1, Q5_K, Q6_K and Q8_0, on an x86-64 CPU with AVX2 or
    /// AVX-512 VNNI), llama.cpp's for the rest.
    /// On the default model they multiply several times faster than
    /// llama.cpp's own, with the same results to float rounding.
    #[default]
    Cortex,
    /// cortex's kernels with AVX2 only, on a CPU that has AVX-512 too: what
    /// an AVX2-only machine runs, for measuring it here. The first model a
    /// process loads decides the kernels' instruction set for the process.
    CortexAvx2,
    /// cortex's kernels with AVX-VNNI at most (256-bit `vpdpbusd`, no
    /// AVX-512): what an Alder Lake or Sierra Forest CPU runs, for measuring
    /// it on a CPU that has AVX-512 too (AVX2 where the CPU lacks AVX-VNNI).
    CortexAvxVnni,
    /// llama.cpp's CPU backend for every weight.
    Llama,
}

impl CpuKernels {
    /// Whether cortex's kernels multiply the weights they have.
    pub fn uses_cortex_kernels(self) -> bool {
        self != CpuKernels::Llama
    }
}

impl FromStr for CpuKernels {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.trim() {
            t if t.eq_ignore_ascii_case("cortex") => Ok(CpuKernels::Cortex),
            t if t.eq_ignore_ascii_case("cortex-avx2") => Ok(CpuKernels::CortexAvx2),
            t if t.eq_ignore_ascii_case("cortex-avx-vnni") => Ok(CpuKernels::CortexAvxVnni),
            t if t.eq_ignore_ascii_case("llama") => Ok(CpuKernels::Llama),
            t => Err(format!(
                "{t:?}: expected cortex, cortex-avx2, cortex-avx-vnni or llama"
            )),
        }
    }
}

impl fmt::Display for CpuKernels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CpuKernels::Cortex => "cortex",
            CpuKernels::CortexAvx2 => "cortex-avx2",
            CpuKernels::CortexAvxVnni => "cortex-avx-vnni",
            CpuKernels::Llama => "llama",
        })
    }
}

/// How many of a model's layers go to the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GpuLayers {
    /// Every layer (and the KV cache with them).
    #[default]
    All,
    /// The first N; the rest run on the CPU.
    Count(u32),
}

impl FromStr for GpuLayers {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text = text.trim();
        if text.eq_ignore_ascii_case("all") {
            return Ok(GpuLayers::All);
        }
        text.parse()
            .map(GpuLayers::Count)
            .map_err(|_| format!("{text:?}: expected all or a number of layers"))
    }
}

impl fmt::Display for GpuLayers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuLayers::All => f.write_str("all"),
            GpuLayers::Count(n) => write!(f, "{n}"),
        }
    }
}

/// Where a running engine's model is, readable from any thread: what the
/// binding that loaded it reports to [`crate::Engine::device`] and
/// [`crate::Engine::gpu_memory_used`].
pub trait ModelPlacement: Send + Sync {
    /// The device that holds the model's layers and KV cache, with its
    /// memory now.
    fn device(&self) -> Device;
    /// The instruction set cortex's own CPU kernels run with for this model
    /// (`AVX-512 VNNI`, `AVX-VNNI`, `AVX2`); `None` when the binding's library does all
    /// its work.
    fn cortex_kernels(&self) -> Option<&'static str>;
    /// Whether a line's output depends only on the line, its settings and
    /// its seed, not on what runs beside it (see the book's "Same input,
    /// same output"): cortex's CPU kernels multiply every matrix.
    fn same_output(&self) -> bool;
    /// Bytes of the GPU's memory the model takes with `kv_bytes` of KV
    /// cache; `None` on the CPU.
    fn gpu_memory_used(&self, kv_bytes: u64) -> Option<u64>;
}

impl Device {
    /// This machine's CPU, with its memory from `/proc/meminfo`: where an
    /// engine runs when its executor reports no placement (a fake executor).
    pub fn host() -> Self {
        let bytes = |key| crate::system::meminfo(key).unwrap_or(0) as u64;
        Self {
            name: "CPU".into(),
            description: String::new(),
            kind: DeviceKind::Cpu,
            backend: "CPU".into(),
            memory_free: bytes("MemAvailable"),
            memory_total: bytes("MemTotal"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices_parse_as_users_write_them() {
        assert_eq!("AUTO".parse(), Ok(DeviceChoice::Auto));
        assert_eq!("cpu".parse(), Ok(DeviceChoice::Cpu));
        assert_eq!("vulkan0".parse(), Ok(DeviceChoice::Named("vulkan0".into())));
        assert!("".parse::<DeviceChoice>().is_err());
        assert_eq!("all".parse(), Ok(GpuLayers::All));
        assert_eq!("12".parse(), Ok(GpuLayers::Count(12)));
        assert!("-3".parse::<GpuLayers>().is_err());
        assert_eq!(GpuLayers::Count(7).to_string(), "7");
        assert_eq!("Llama".parse(), Ok(CpuKernels::Llama));
        assert_eq!(" cortex".parse(), Ok(CpuKernels::Cortex));
        assert!("ggml".parse::<CpuKernels>().is_err());
        assert_eq!(CpuKernels::Llama.to_string(), "llama");
    }
}
