//! Greedy rows sampled on the device with one argmax over the micro-batch's
//! logits. llama.cpp's own greedy sampler adds an argmax of one row per
//! sequence to the decode graph: with 256 sequences that is 256 kernels,
//! each a single block on the GPU, one after another. Every sequence of a
//! context gets this sampler instead: the first of them in a graph adds one
//! argmax over all the rows (one block per row, side by side), and each
//! takes its token from that result as a view, which computes nothing.

use std::cell::Cell;
use std::ffi::{c_char, c_void};
use std::ptr;

use llama_cpp_sys_2 as ffi;

/// What the samplers of one context share: the argmax of the graph being
/// built, and the logits it was taken of. Owned by the context, which frees
/// its samplers first.
pub(crate) struct RowsArgmax {
    /// The padded logits matrix of the graph being built and its argmax.
    built: Cell<Option<(*mut ffi::ggml_tensor, *mut ffi::ggml_tensor)>>,
}

impl RowsArgmax {
    pub(crate) fn new() -> Box<Self> {
        Box::new(Self {
            built: Cell::new(None),
        })
    }

    /// A sampler for one sequence, sharing `self` with the others: wrapped
    /// in a chain, as `llama_set_sampler` wants. Null if llama.cpp could not
    /// make one. `self` must outlive it.
    pub(crate) fn sampler(&self) -> *mut ffi::llama_sampler {
        // SAFETY: `INTERFACE` is static; the context pointer stays valid
        // while `self` lives, which its owner guarantees; the chain takes
        // ownership of the sampler added to it.
        unsafe {
            let chain = ffi::llama_sampler_chain_init(ffi::llama_sampler_chain_default_params());
            if chain.is_null() {
                return ptr::null_mut();
            }
            let rows = ffi::llama_sampler_init(
                ptr::from_ref(&INTERFACE).cast_mut(),
                ptr::from_ref(self).cast_mut().cast::<c_void>(),
            );
            if rows.is_null() {
                ffi::llama_sampler_free(chain);
                return ptr::null_mut();
            }
            ffi::llama_sampler_chain_add(chain, rows);
            chain
        }
    }
}

static INTERFACE: ffi::llama_sampler_i = ffi::llama_sampler_i {
    name: Some(name),
    accept: None,
    apply: Some(apply),
    reset: None,
    clone: None,
    // The shared state belongs to the context, not to the sampler.
    free: None,
    backend_init: Some(backend_init),
    backend_accept: None,
    backend_apply: Some(backend_apply),
    backend_set_input: None,
    backend_reset: Some(backend_reset),
    copy_state: None,
};

// SAFETY (for every callback below): llama.cpp calls them with a sampler
// made by `RowsArgmax::sampler`, whose context pointer is a live
// `RowsArgmax`, from the one thread that uses the context.

unsafe extern "C" fn name(_: *const ffi::llama_sampler) -> *const c_char {
    c"cortex-rows-argmax".as_ptr()
}

/// The host's greedy choice, for a row llama.cpp samples on the host.
unsafe extern "C" fn apply(
    _: *mut ffi::llama_sampler,
    candidates: *mut ffi::llama_token_data_array,
) {
    // SAFETY: llama.cpp passes a live array of `size` candidates.
    let candidates = unsafe { &mut *candidates };
    if candidates.data.is_null() || candidates.size == 0 {
        return;
    }
    // SAFETY: as above.
    let data = unsafe { std::slice::from_raw_parts(candidates.data, candidates.size) };
    let best = (1..data.len()).fold(0, |best, i| {
        if data[i].logit > data[best].logit {
            i
        } else {
            best
        }
    });
    candidates.selected = best as i64;
}

/// Whether the device can take argmaxes: asked of llama.cpp's greedy
/// sampler, which needs the same operation.
unsafe extern "C" fn backend_init(
    _: *mut ffi::llama_sampler,
    buft: ffi::ggml_backend_buffer_type_t,
    outputs_per_sequence: u32,
) -> bool {
    // SAFETY: a fresh greedy sampler, asked and freed here.
    unsafe {
        let greedy = ffi::llama_sampler_init_greedy();
        if greedy.is_null() {
            return false;
        }
        let supported = (*(*greedy).iface)
            .backend_init
            .is_some_and(|init| init(greedy, buft, outputs_per_sequence));
        ffi::llama_sampler_free(greedy);
        supported
    }
}

unsafe extern "C" fn backend_reset(smpl: *mut ffi::llama_sampler) {
    // SAFETY: see above.
    let shared = unsafe { &*(*smpl).ctx.cast::<RowsArgmax>() };
    shared.built.set(None);
}

unsafe extern "C" fn backend_apply(
    smpl: *mut ffi::llama_sampler,
    ctx: *mut ffi::ggml_context,
    _: *mut ffi::ggml_cgraph,
    data: *mut ffi::llama_sampler_data,
) {
    // SAFETY: see above; `data` and its logits are live tensors of the
    // graph being built in `ctx`.
    unsafe {
        let shared = &*(*smpl).ctx.cast::<RowsArgmax>();
        let data = &mut *data;
        let logits = data.logits;
        let matrix = (*logits).view_src;
        // A row of a logits matrix (the decode graph): its row of the
        // matrix's argmax. Anything else (llama.cpp's probe of what the
        // device supports): the argmax of the tensor itself.
        let is_row = !matrix.is_null()
            && ffi::ggml_n_dims(matrix) == 2
            && (*matrix).ne[0] == (*logits).ne[0]
            && (*matrix).nb[1] > 0;
        if !is_row {
            let flat = ffi::ggml_reshape_1d(ctx, logits, ffi::ggml_nelements(logits));
            data.sampled = ffi::ggml_argmax(ctx, flat);
            return;
        }
        let row = (*logits).view_offs / (*matrix).nb[1];
        // llama.cpp pads the logits with a row (for sequences without an
        // output in the batch, which read row 0): a copy of every row, which
        // a GPU makes in no time but the CPU makes at memory speed. Every
        // row read is one of the logits themselves, so the argmax reads them
        // where they are.
        let unpadded = (*matrix).src[0];
        let matrix = if (*matrix).op == ffi::GGML_OP_PAD
            && !unpadded.is_null()
            && (*unpadded).ne[0] == (*matrix).ne[0]
            && usize::try_from((*unpadded).ne[1]).is_ok_and(|rows| rows > row)
            && (*unpadded).ne[2] == 1
            && (*unpadded).ne[3] == 1
        {
            unpadded
        } else {
            matrix
        };
        let argmax = match shared.built.get() {
            Some((built_of, argmax)) if built_of == matrix => argmax,
            _ => {
                let argmax = ffi::ggml_argmax(ctx, matrix);
                ffi::ggml_set_name(argmax, c"greedy_argmax_rows".as_ptr());
                // Every sequence's token is a view of it, copied out after
                // the graph: its memory must not go to a later node.
                ffi::ggml_set_output(argmax);
                shared.built.set(Some((matrix, argmax)));
                argmax
            }
        };
        data.sampled = ffi::ggml_view_1d(ctx, argmax, 1, row * (*argmax).nb[0]);
        // The token is all that comes back: left set, llama.cpp would also
        // copy the row's logits out ("sampled logits", which cortex never
        // reads), and compute the padded matrix they are a view of.
        data.logits = ptr::null_mut();
    }
}
