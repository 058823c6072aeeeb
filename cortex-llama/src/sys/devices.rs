//! ggml's backend registry: backend modules (shared libraries: the CPU
//! backend's variants, GPU backends) scored and loaded by path, and the
//! devices the loaded backends offer, with their memory.

use std::ffi::{CStr, CString, c_char};
use std::path::Path;
use std::ptr::NonNull;
use std::sync::OnceLock;

use llama_cpp_sys_2 as ffi;

/// How well the module at `path` suits this machine: its
/// `ggml_backend_score` (0: it cannot run here), or `None` for a module
/// without one (a backend built once, such as a GPU backend). An error when
/// it cannot be opened at all.
pub(crate) fn module_score(path: &Path) -> Result<Option<i32>, String> {
    // SAFETY: opening a ggml backend module runs only its static
    // initialisers, as ggml's own loader does when it scores variants; the
    // score function takes nothing and only reads the CPU's features; the
    // library is closed when `library` drops, after the call.
    unsafe {
        let library = libloading::Library::new(path).map_err(|e| e.to_string())?;
        let score = library.get::<unsafe extern "C" fn() -> i32>(b"ggml_backend_score\0");
        Ok(score.ok().map(|score| score()))
    }
}

/// Whether this process may use AMX tiles: the CPU has them and the
/// kernel saves their data across context switches (Linux's
/// `ARCH_GET_XCOMP_SUPP` lists XTILEDATA). Some virtual machines report
/// AMX in CPUID without it, and an AMX kernel there dies of SIGILL as
/// soon as its thread is switched out.
pub(crate) fn amx_tiles_usable() -> bool {
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    {
        const SYS_ARCH_PRCTL: i64 = 158;
        const ARCH_GET_XCOMP_SUPP: i64 = 0x1022;
        const XFEATURE_XTILEDATA: u64 = 1 << 18;
        let mut supported: u64 = 0;
        let result: i64;
        // SAFETY: arch_prctl(ARCH_GET_XCOMP_SUPP, &mask) writes one u64 to
        // the pointer and changes nothing else; the syscall clobbers rcx and
        // r11 only.
        unsafe {
            std::arch::asm!(
                "syscall",
                inlateout("rax") SYS_ARCH_PRCTL => result,
                in("rdi") ARCH_GET_XCOMP_SUPP,
                in("rsi") &raw mut supported,
                lateout("rcx") _,
                lateout("r11") _,
                options(nostack),
            );
        }
        result == 0 && supported & XFEATURE_XTILEDATA != 0
    }
    #[cfg(not(all(target_os = "linux", target_arch = "x86_64")))]
    {
        false
    }
}

/// Registers the backend module at `path` with ggml; returns the backend's
/// name (`CPU`, `Vulkan`, `CUDA`, ...).
pub(crate) fn load_module(path: &Path) -> Result<String, String> {
    let c_path = CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| "the path contains a NUL byte".to_owned())?;
    // SAFETY: a C string for the call; ggml returns null when the module
    // cannot be opened, cannot run on this machine or was built for another
    // ggml (and logs why).
    let reg = unsafe { ffi::ggml_backend_load(c_path.as_ptr()) };
    if reg.is_null() {
        return Err(
            "ggml did not load it (not for this machine or this build of llama.cpp; see its log)"
                .into(),
        );
    }
    // SAFETY: a registered backend lives as long as the process; its name is
    // a static string.
    let name = text(unsafe { ffi::ggml_backend_reg_name(reg) });
    if name == "CPU" {
        remember_threadpool_pause(path);
    }
    Ok(name)
}

/// `ggml_threadpool_pause(pool)`: its idle workers sleep until the next
/// graph on the pool starts them again.
pub(crate) type PauseThreadpool = unsafe extern "C" fn(*mut ffi::ggml_threadpool);

static THREADPOOL_PAUSE: OnceLock<PauseThreadpool> = OnceLock::new();

/// The loaded CPU module's `ggml_threadpool_pause`, which the module does
/// not hand out by name as it does `ggml_threadpool_new`.
pub(crate) fn threadpool_pause() -> Option<PauseThreadpool> {
    THREADPOOL_PAUSE.get().copied()
}

fn remember_threadpool_pause(path: &Path) {
    // SAFETY: ggml holds the module open already, so opening it again only
    // counts a reference; the symbol is ggml-cpu.h's function of exactly
    // this signature; the library is never closed (forgotten below), so
    // the pointer stays valid for the process.
    unsafe {
        let Ok(library) = libloading::Library::new(path) else {
            return;
        };
        if let Ok(pause) = library.get::<PauseThreadpool>(b"ggml_threadpool_pause\0") {
            let _ = THREADPOOL_PAUSE.set(*pause);
        }
        std::mem::forget(library);
    }
}

/// The names of the backends registered so far.
pub(crate) fn registered_backends() -> Vec<String> {
    // SAFETY: reads ggml's registry; each index below the count is a live
    // backend with a static name.
    unsafe {
        (0..ffi::ggml_backend_reg_count())
            .map(|i| text(ffi::ggml_backend_reg_name(ffi::ggml_backend_reg_get(i))))
            .collect()
    }
}

fn text(ptr: *const c_char) -> String {
    if ptr.is_null() {
        return String::new();
    }
    // SAFETY: ggml's names and descriptions are NUL-terminated strings that
    // live as long as their backend or device (the whole process).
    unsafe { CStr::from_ptr(ptr) }
        .to_string_lossy()
        .into_owned()
}

/// What kind of device ggml says it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RawDeviceKind {
    Cpu,
    Gpu,
    IntegratedGpu,
    Accelerator,
    Other,
}

/// A device of a loaded backend.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RawDevice(NonNull<ffi::ggml_backend_device>);

// SAFETY: devices are registered for the whole life of the process, and
// what is asked of them here (names, kind, memory) are reads that ggml's
// backends answer from any thread.
unsafe impl Send for RawDevice {}
// SAFETY: as above.
unsafe impl Sync for RawDevice {}

impl RawDevice {
    /// Every device of the loaded backends, in ggml's order.
    pub(crate) fn all() -> Vec<Self> {
        // SAFETY: reads ggml's registry; each index below the count is a
        // live device.
        unsafe {
            (0..ffi::ggml_backend_dev_count())
                .filter_map(|i| NonNull::new(ffi::ggml_backend_dev_get(i)).map(Self))
                .collect()
        }
    }

    pub(crate) fn as_ptr(self) -> ffi::ggml_backend_dev_t {
        self.0.as_ptr()
    }

    pub(crate) fn name(self) -> String {
        // SAFETY: a live device.
        text(unsafe { ffi::ggml_backend_dev_name(self.as_ptr()) })
    }

    pub(crate) fn description(self) -> String {
        // SAFETY: a live device.
        text(unsafe { ffi::ggml_backend_dev_description(self.as_ptr()) })
    }

    /// The name of the backend it belongs to.
    pub(crate) fn backend(self) -> String {
        // SAFETY: a live device belongs to a live backend.
        text(unsafe {
            ffi::ggml_backend_reg_name(ffi::ggml_backend_dev_backend_reg(self.as_ptr()))
        })
    }

    pub(crate) fn kind(self) -> RawDeviceKind {
        // SAFETY: a live device.
        match unsafe { ffi::ggml_backend_dev_type(self.as_ptr()) } {
            ffi::GGML_BACKEND_DEVICE_TYPE_CPU => RawDeviceKind::Cpu,
            ffi::GGML_BACKEND_DEVICE_TYPE_GPU => RawDeviceKind::Gpu,
            ffi::GGML_BACKEND_DEVICE_TYPE_IGPU => RawDeviceKind::IntegratedGpu,
            ffi::GGML_BACKEND_DEVICE_TYPE_ACCEL => RawDeviceKind::Accelerator,
            _ => RawDeviceKind::Other,
        }
    }

    /// Whether the device computes the argmax of a row of `n` floats (what
    /// sampling greedily on the device needs): asked of the backend with
    /// the operation itself, as llama.cpp asks before it places one.
    pub(crate) fn supports_argmax(self, n: usize) -> bool {
        let Ok(n) = i64::try_from(n) else {
            return false;
        };
        let params = ffi::ggml_init_params {
            mem_size: 4096,
            mem_buffer: std::ptr::null_mut(),
            no_alloc: true,
        };
        // SAFETY: a small metadata-only context (no_alloc: no tensor data),
        // freed before returning; the device is live and only inspects the
        // operation's type and shape.
        unsafe {
            let ctx = ffi::ggml_init(params);
            if ctx.is_null() {
                return false;
            }
            let row = ffi::ggml_new_tensor_1d(ctx, ffi::GGML_TYPE_F32, n);
            let op = ffi::ggml_argmax(ctx, row);
            let supported = !op.is_null() && ffi::ggml_backend_dev_supports_op(self.as_ptr(), op);
            ffi::ggml_free(ctx);
            supported
        }
    }

    /// Whether it is a GPU drawn in software on the CPU (Mesa's lavapipe
    /// and llvmpipe, SwiftShader): a device for testing the GPU code path,
    /// with the CPU's speed.
    pub(crate) fn is_software(self) -> bool {
        let description = self.description().to_lowercase();
        ["llvmpipe", "lavapipe", "swiftshader"]
            .iter()
            .any(|name| description.contains(name))
    }

    /// Free and total memory, in bytes, as the backend reads them now.
    pub(crate) fn memory(self) -> (usize, usize) {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: a live device and two writable sizes.
        unsafe { ffi::ggml_backend_dev_memory(self.as_ptr(), &raw mut free, &raw mut total) };
        (free, total)
    }
}
