//! Time per graph operation (`cortex bench --profile-ops`): ggml's
//! scheduler calls an evaluation callback around every node and waits for
//! the device after each, so the time between the two calls is that node's
//! launch and execution. Every node computed alone: CUDA fuses nothing and
//! replays no graph, so the sum is more than an unprofiled step takes; it
//! says which operations a step spends its device time on.

use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::{CStr, c_void};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use llama_cpp_sys_2 as ffi;

/// One operation's share of the profiled decodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpTime {
    /// The operation (`MUL_MAT`, `FLASH_ATTN_EXT`, ...) and the tensor it
    /// makes, without its layer number (`ffn_up`, `greedy_argmax`); for a
    /// matrix product, its weights' type (`MUL_MAT ffn_out q6_K`: a model
    /// quantized with mixed types splits a layer kind by type); `(host)`
    /// when it ran on the CPU.
    pub name: String,
    /// Nodes computed.
    pub calls: u64,
    /// Their time in all.
    pub total: Duration,
    /// The multiply-adds a matrix product does (rows × columns × the
    /// shared length, over every call); 0 for other operations.
    pub multiply_adds: u64,
    /// Whether it ran on the CPU (its result in host memory), not on a GPU.
    pub host: bool,
}

/// What the profile holds per operation: calls, time, multiply-adds, and
/// whether it ran on the CPU.
type Measured = HashMap<String, (u64, Duration, u64, bool)>;

static PROFILING: AtomicBool = AtomicBool::new(false);
static TIMES: Mutex<Option<Measured>> = Mutex::new(None);

/// The measurements so far (a panic while holding them leaves them usable).
fn times() -> std::sync::MutexGuard<'static, Option<Measured>> {
    TIMES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

thread_local! {
    /// When the node being computed on this thread was asked about.
    static STARTED: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// Starts profiling the decodes of contexts made from now on, forgetting
/// anything measured before.
pub(crate) fn start() {
    *times() = Some(HashMap::new());
    PROFILING.store(true, Ordering::SeqCst);
}

/// Stops profiling; what was measured since [`start`], the costliest first.
pub(crate) fn finish() -> Vec<OpTime> {
    PROFILING.store(false, Ordering::SeqCst);
    let measured = times().take().unwrap_or_default();
    let mut ops: Vec<OpTime> = measured
        .into_iter()
        .map(|(name, (calls, total, multiply_adds, host))| OpTime {
            name,
            calls,
            total,
            multiply_adds,
            host,
        })
        .collect();
    ops.sort_by(|a, b| b.total.cmp(&a.total).then_with(|| a.name.cmp(&b.name)));
    ops
}

/// The evaluation callback a new context gets: the profiler's while
/// profiling, else none (ggml then computes each graph whole).
pub(crate) fn eval_callback() -> ffi::ggml_backend_sched_eval_callback {
    PROFILING
        .load(Ordering::SeqCst)
        .then_some(time_node as unsafe extern "C" fn(_, _, _) -> _)
}

unsafe extern "C" fn time_node(tensor: *mut ffi::ggml_tensor, ask: bool, _: *mut c_void) -> bool {
    if ask {
        STARTED.with(|s| s.set(Some(Instant::now())));
        return true;
    }
    let Some(started) = STARTED.with(Cell::take) else {
        return true;
    };
    let elapsed = started.elapsed();
    if tensor.is_null() {
        return true;
    }
    // SAFETY: ggml passes a live node of the graph it computes; its name is
    // a NUL-terminated array and `ggml_op_desc` returns a static string.
    let (op, name, host, multiply_adds, weights_type) = unsafe {
        let node = &*tensor;
        if is_layout_only(node.op) {
            return true;
        }
        let op = CStr::from_ptr(ffi::ggml_op_desc(tensor)).to_string_lossy();
        let name = CStr::from_ptr(node.name.as_ptr()).to_string_lossy();
        let host = !node.buffer.is_null() && ffi::ggml_backend_buffer_is_host(node.buffer);
        // A product's result is rows × columns (× batches), each the dot of
        // rows of the shared length: its first operand's first dimension.
        let (multiply_adds, weights_type) = match (node.op, node.src[0].as_ref()) {
            (ffi::GGML_OP_MUL_MAT, Some(weights)) => {
                let dims: i64 = node.ne.iter().product();
                let type_name =
                    CStr::from_ptr(ffi::ggml_type_name(weights.type_)).to_string_lossy();
                (
                    u64::try_from(dims.saturating_mul(weights.ne[0])).unwrap_or(0),
                    Some(type_name.into_owned()),
                )
            }
            _ => (0, None),
        };
        (
            op.into_owned(),
            name.into_owned(),
            host,
            multiply_adds,
            weights_type,
        )
    };
    let mut key = match without_layer(&name) {
        // ggml's name for a node nobody named.
        "node" | "" => op,
        name => format!("{op} {name}"),
    };
    if let Some(weights_type) = weights_type {
        key = format!("{key} {weights_type}");
    }
    if host {
        key.push_str(" (host)");
    }
    if let Some(times) = times().as_mut() {
        let entry = times.entry(key).or_default();
        entry.0 += 1;
        entry.1 += elapsed;
        entry.2 += multiply_adds;
        entry.3 = host;
    }
    true
}

/// Operations that only describe another tensor's layout: nothing runs.
fn is_layout_only(op: ffi::ggml_op) -> bool {
    matches!(
        op,
        ffi::GGML_OP_NONE
            | ffi::GGML_OP_VIEW
            | ffi::GGML_OP_RESHAPE
            | ffi::GGML_OP_PERMUTE
            | ffi::GGML_OP_TRANSPOSE
    )
}

/// A node's name without what ggml and llama.cpp append to it (the layer
/// in `ffn_up-12`, the sequence in `logits_seq_5_0`, ` (view)`, `node_42`),
/// so that the layers' nodes add up.
fn without_layer(name: &str) -> &str {
    let name = name.split(" (").next().unwrap_or(name);
    let base = name.trim_end_matches(|c: char| c.is_ascii_digit() || c == '-' || c == '_');
    if base.is_empty() { name } else { base }
}

#[cfg(test)]
mod tests {
    use super::without_layer;

    #[test]
    fn layer_numbers_are_dropped_from_node_names() {
        assert_eq!(without_layer("ffn_up-12"), "ffn_up");
        assert_eq!(without_layer("logits_seq_5_0"), "logits_seq");
        assert_eq!(without_layer("result_output"), "result_output");
        assert_eq!(without_layer("42"), "42");
        assert_eq!(without_layer("cache_k_l7 (view) (permuted)"), "cache_k_l");
        assert_eq!(without_layer("node_117"), "node");
    }
}
