//! llama.cpp's backends as runtime modules, and the devices they offer.
//!
//! llama.cpp is built with `GGML_BACKEND_DL`: the CPU backend is a set of
//! shared libraries, one per instruction-set level (`libggml-cpu-haswell.so`,
//! `libggml-cpu-zen4.so`, ...), and each GPU backend is one more
//! (`libggml-vulkan.so`, `libggml-cuda.so`). The build puts the libraries
//! and the CPU modules beside every program it makes. [`load_backends`]
//! looks for modules, once per process, in the directory the configuration
//! names (`backends_dir`), then in the running program's own directory. For
//! each backend the first directory that has it wins, and of its variants
//! the one that scores best on this machine (ggml's `ggml_backend_score`)
//! is loaded. The current directory is never searched (ggml's own loader
//! does; a module is code, and should come from where cortex was installed).
//!
//! [`devices`] lists what the loaded backends offer, with their memory;
//! [`DeviceChoice`] and [`GpuLayers`] say where a model runs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use cortex_engine::{CpuKernels, Device, DeviceChoice, DeviceKind, EngineError};

use crate::sys::{self, RawDevice, RawDeviceKind};

/// The backend modules found and loaded, and where they were looked for.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Backends {
    /// The directories searched, in order.
    pub searched: Vec<PathBuf>,
    /// The modules loaded, one per backend.
    pub loaded: Vec<LoadedModule>,
    /// Modules found but not loaded, and why (a weaker variant, not for
    /// this machine, a backend already loaded from an earlier directory).
    pub skipped: Vec<(PathBuf, String)>,
    /// Every backend ggml has: the modules loaded, and those built into the
    /// program (a build without modules has the CPU's built in).
    pub registered: Vec<String>,
    /// The instruction set cortex's CPU kernels run with here (`AVX-512
    /// VNNI`, `AVX-VNNI`, `AVX2`); `None` on a CPU they do not run on.
    pub cortex_kernels: Option<&'static str>,
}

/// A backend module that was loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LoadedModule {
    /// The backend's name as ggml gives it (`CPU`, `Vulkan`, `CUDA`, ...).
    pub backend: String,
    /// The file.
    pub path: PathBuf,
    /// Its score on this machine, for a module with variants.
    pub score: Option<i32>,
}

static BACKENDS: OnceLock<Backends> = OnceLock::new();

/// Finds and loads the backend modules and registers cortex's CPU kernels
/// (with AVX2 at most for `CpuKernels::CortexAvx2`, AVX-VNNI for
/// `CortexAvxVnni`), once per process (see
/// the module documentation for where); later calls return what the first
/// loaded, whatever directory and kernels they name.
pub fn load_backends(configured: Option<&Path>, cpu_kernels: CpuKernels) -> &'static Backends {
    BACKENDS.get_or_init(|| {
        sys::route_logs();
        let searched = search_dirs(configured);
        let mut backends = discover(&searched);
        sys::init();
        let ceiling = kernels_ceiling(cpu_kernels);
        backends.cortex_kernels =
            sys::kernels::register(ceiling).map(sys::kernels::KernelIsa::name);
        backends.registered = sys::registered_backends();
        backends
    })
}

/// The best instruction set `cpu_kernels` lets cortex's kernels use, where
/// it sets one.
pub(crate) fn kernels_ceiling(cpu_kernels: CpuKernels) -> Option<sys::kernels::KernelIsa> {
    match cpu_kernels {
        CpuKernels::CortexAvx2 => Some(sys::kernels::KernelIsa::Avx2),
        CpuKernels::CortexAvxVnni => Some(sys::kernels::KernelIsa::AvxVnni),
        CpuKernels::Cortex | CpuKernels::Llama => None,
    }
}

/// The directories to look in, in order, without repeats.
fn search_dirs(configured: Option<&Path>) -> Vec<PathBuf> {
    let beside_program = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.canonicalize().ok())
        .and_then(|exe| exe.parent().map(Path::to_owned));
    let mut dirs: Vec<PathBuf> = Vec::new();
    for dir in [configured.map(Path::to_owned), beside_program]
        .into_iter()
        .flatten()
    {
        if !dirs.contains(&dir) {
            dirs.push(dir);
        }
    }
    dirs
}

/// `libggml-NAME.so` or `libggml-NAME-VARIANT.so`: the backend's name.
fn backend_of(file: &Path) -> Option<String> {
    let name = file.file_name()?.to_str()?;
    let stem = name
        .strip_prefix(std::env::consts::DLL_PREFIX)?
        .strip_suffix(std::env::consts::DLL_SUFFIX)?
        .strip_prefix("ggml-")?;
    let backend = stem.split('-').next()?;
    // ggml-base is ggml itself, not a backend.
    (backend != "base" && !backend.is_empty()).then(|| backend.to_owned())
}

fn discover(searched: &[PathBuf]) -> Backends {
    // Backend → its modules in the first directory that has any.
    let mut found: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    let mut skipped = Vec::new();
    for dir in searched {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        let mut here: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
        for path in entries.flatten().map(|e| e.path()) {
            if let Some(backend) = backend_of(&path) {
                here.entry(backend).or_default().push(path);
            }
        }
        for (backend, mut paths) in here {
            match found.entry(backend) {
                std::collections::btree_map::Entry::Occupied(earlier) => {
                    let why = format!("{} was found in an earlier directory", earlier.key());
                    skipped.extend(paths.into_iter().map(|path| (path, why.clone())));
                }
                std::collections::btree_map::Entry::Vacant(slot) => {
                    paths.sort();
                    slot.insert(paths);
                }
            }
        }
    }
    let mut loaded = Vec::new();
    // GPU backends first, the CPU last, as ggml registers them: llama.cpp
    // puts layers on devices in registration order.
    let (cpu, others): (Vec<_>, Vec<_>) = found.into_iter().partition(|(b, _)| b == "cpu");
    for (_, paths) in others.into_iter().chain(cpu) {
        load_best(paths, &mut loaded, &mut skipped);
    }
    Backends {
        searched: searched.to_vec(),
        loaded,
        skipped,
        registered: Vec::new(),
        cortex_kernels: None,
    }
}

/// Whether the module is a CPU variant built with AMX kernels (ggml's
/// `sapphirerapids`): its score reads only CPUID, which may offer AMX where
/// the system does not allow it.
fn uses_amx(path: &Path) -> bool {
    path.file_name()
        .and_then(|name| name.to_str())
        .is_some_and(|name| name.starts_with("libggml-cpu-sapphirerapids"))
}

/// Loads the best of one backend's modules for this machine.
fn load_best(
    paths: Vec<PathBuf>,
    loaded: &mut Vec<LoadedModule>,
    skipped: &mut Vec<(PathBuf, String)>,
) {
    let mut scored: Vec<(PathBuf, Option<i32>)> = Vec::new();
    for path in paths {
        if uses_amx(&path) && !sys::amx_tiles_usable() {
            skipped.push((
                path,
                "its kernels use AMX, which this system does not let processes use (the kernel does not save AMX tile data)".into(),
            ));
            continue;
        }
        match sys::module_score(&path) {
            Ok(Some(0)) => skipped.push((path, "not for this machine's CPU".into())),
            Ok(score) => scored.push((path, score)),
            Err(why) => skipped.push((path, format!("cannot be opened: {why}"))),
        }
    }
    // Highest score first; a module without a score is a backend's only build.
    scored.sort_by_key(|(_, score)| std::cmp::Reverse(score.unwrap_or(1)));
    let mut candidates = scored.into_iter();
    for (path, score) in candidates.by_ref() {
        match sys::load_module(&path) {
            Ok(backend) => {
                loaded.push(LoadedModule {
                    backend,
                    path,
                    score,
                });
                break;
            }
            Err(why) => skipped.push((path, why)),
        }
    }
    for (path, _) in candidates {
        skipped.push((path, "a better variant was loaded".into()));
    }
}

/// The devices of the loaded backends (loading them first if nothing has),
/// with their memory now.
pub fn devices() -> Vec<Device> {
    load_backends(None, CpuKernels::default());
    RawDevice::all().into_iter().map(device).collect()
}

pub(crate) fn device(raw: RawDevice) -> Device {
    let (free, total) = raw.memory();
    Device {
        name: raw.name(),
        description: raw.description(),
        kind: match raw.kind() {
            RawDeviceKind::Cpu => DeviceKind::Cpu,
            RawDeviceKind::Gpu => DeviceKind::Gpu,
            RawDeviceKind::IntegratedGpu => DeviceKind::IntegratedGpu,
            RawDeviceKind::Accelerator => DeviceKind::Accelerator,
            RawDeviceKind::Other => DeviceKind::Other,
        },
        backend: raw.backend(),
        memory_free: free as u64,
        memory_total: total as u64,
    }
}

/// The CPU as a device (ggml's, or this machine's memory when no backend
/// lists one).
pub(crate) fn cpu_device() -> Device {
    load_backends(None, CpuKernels::default());
    RawDevice::all()
        .into_iter()
        .map(device)
        .find(|d| d.kind == DeviceKind::Cpu)
        .unwrap_or_else(Device::host)
}

/// The GPU `choice` names, or `None` for the CPU (auto without a GPU).
pub(crate) fn resolve(choice: &DeviceChoice) -> Result<Option<RawDevice>, EngineError> {
    load_backends(None, CpuKernels::default());
    let all = RawDevice::all();
    let gpu = |raw: &RawDevice| device(*raw).kind.is_gpu();
    match choice {
        DeviceChoice::Cpu => Ok(None),
        DeviceChoice::Auto => Ok(all.iter().copied().find(gpu)),
        DeviceChoice::Named(name) => {
            let Some(raw) = all
                .iter()
                .copied()
                .find(|raw| raw.name().eq_ignore_ascii_case(name))
            else {
                let names: Vec<String> = all.iter().map(|raw| raw.name()).collect();
                return Err(EngineError::Model(format!(
                    "no device {name:?}: this machine has {} (cortex devices lists them; a GPU needs its backend module beside cortex or in backends_dir)",
                    names.join(", ")
                )));
            };
            match device(raw).kind {
                DeviceKind::Cpu => Ok(None),
                kind if kind.is_gpu() => Ok(Some(raw)),
                kind => Err(EngineError::Model(format!(
                    "device {name:?} is an {kind}, not one a model runs on"
                ))),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_files_name_their_backend() {
        let name = |file: &str| backend_of(Path::new(file));
        assert_eq!(name("/x/libggml-cpu-haswell.so").as_deref(), Some("cpu"));
        assert_eq!(
            name("libggml-cpu-android_armv8.2_1.so").as_deref(),
            Some("cpu")
        );
        assert_eq!(name("libggml-vulkan.so").as_deref(), Some("vulkan"));
        assert_eq!(name("libggml-base.so"), None);
        assert_eq!(name("libggml.so"), None);
        assert_eq!(name("libllama.so"), None);
        assert_eq!(name("libggml-cuda.so.1"), None);
    }
}
