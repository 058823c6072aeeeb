//! The FFI boundary: owners of llama.cpp's model, context, batch, grammar
//! sampler and backend modules, each `unsafe` call justified where it is
//! made. Nothing else in cortex calls llama.cpp.
//!
//! cortex binds `llama-cpp-sys-2` (llama.cpp through bindgen) itself rather
//! than a higher-level wrapper because it needs what those keep private: the
//! context handle, to change the thread count of a running context
//! (`llama_set_n_threads`, for machines shared with other work) and to give a
//! context a persistent threadpool when llama.cpp is built without OpenMP;
//! and ggml's backend registry, to load backend modules from directories of
//! its choosing.

#![allow(unsafe_code)]

use std::ffi::{CStr, c_char, c_void};
use std::sync::Once;

use llama_cpp_sys_2 as ffi;

mod context;
mod devices;
mod grammar;
pub(crate) mod kernels;
mod model;
pub(crate) mod profile;
mod rows_argmax;

pub(crate) use context::{ContextParams, Pooling, RawBatch, RawContext};
pub(crate) use devices::{
    RawDevice, RawDeviceKind, amx_tiles_usable, load_module, module_score, registered_backends,
};
pub(crate) use grammar::RawGrammar;
pub(crate) use model::{RawModel, RawPlacement, apply_chat_template, builtin_chat_templates};

/// Routes llama.cpp's and ggml's logs to `tracing`, once per process
/// (before anything that may log, loading backend modules included).
pub(crate) fn route_logs() {
    static ROUTED: Once = Once::new();
    ROUTED.call_once(|| {
        // SAFETY: `log_to_tracing` matches the callback type, ignores its user
        // data (null here) and lives for the whole program.
        unsafe { ffi::llama_log_set(Some(log_to_tracing), std::ptr::null_mut()) };
    });
}

/// Initialises llama.cpp once per process, its logs routed to `tracing`.
pub(crate) fn init() {
    static INIT: Once = Once::new();
    route_logs();
    INIT.call_once(|| {
        // SAFETY: backend initialisation runs once, before any model or
        // context is made.
        unsafe { ffi::llama_backend_init() };
    });
}

/// llama.cpp's own lines are debug lines (`-vv`): its warnings speak of its
/// internals (a sliding-window cache kept whole on purpose, a vocabulary
/// token's type corrected, a pooling type cortex sets), nothing a user acts
/// on; what does matter reaches the user as cortex's own error, in its
/// words. Its errors stay errors: they explain a failure cortex reports.
unsafe extern "C" fn log_to_tracing(
    level: ffi::ggml_log_level,
    text: *const c_char,
    _user_data: *mut c_void,
) {
    if text.is_null() {
        return;
    }
    // SAFETY: llama.cpp passes a NUL-terminated string valid for this call.
    let text = unsafe { CStr::from_ptr(text) }.to_string_lossy();
    let text = text.trim_end();
    if text.is_empty() {
        return;
    }
    match level {
        ffi::GGML_LOG_LEVEL_ERROR => tracing::error!(target: "llama.cpp", "{text}"),
        ffi::GGML_LOG_LEVEL_WARN | ffi::GGML_LOG_LEVEL_INFO => {
            tracing::debug!(target: "llama.cpp", "{text}");
        }
        _ => tracing::trace!(target: "llama.cpp", "{text}"),
    }
}
