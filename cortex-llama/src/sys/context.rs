//! A context over a model (its KV memory, threads, logits and
//! embeddings) and the batches it decodes.

use std::ffi::c_void;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::OnceLock;

use llama_cpp_sys_2 as ffi;

use super::RawModel;
use super::rows_argmax::RowsArgmax;

/// What a context is made with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ContextParams {
    /// KV cells in all.
    pub(crate) cells: usize,
    /// Sequences (streams, when not unified).
    pub(crate) sequences: usize,
    /// Tokens per decode call at most.
    pub(crate) batch: usize,
    /// Tokens per micro-batch (llama.cpp's `n_ubatch`), at most `batch`.
    pub(crate) micro_batch: usize,
    /// CPU threads.
    pub(crate) threads: usize,
    /// One KV stream for all sequences (true) or one per sequence.
    pub(crate) unified: bool,
    /// An embedding context (pooled vectors per sequence instead of logits),
    /// and how tokens are pooled.
    pub(crate) embeddings: Option<Pooling>,
}

/// How an embedding context pools a sequence's token vectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pooling {
    /// As the GGUF says (`<arch>.pooling_type`).
    Model,
    /// The mean over the sequence's tokens (for decoder models, which name none).
    Mean,
}

/// A llama.cpp context over a borrowed model.
pub(crate) struct RawContext<'m> {
    ptr: NonNull<ffi::llama_context>,
    threadpool: Option<(NonNull<ffi::ggml_threadpool>, ThreadpoolFns)>,
    /// The greedy sampler llama.cpp runs inside the decode graph for each
    /// sequence that has one (see [`RawContext::set_device_greedy`]); the
    /// context only borrows them, so they are freed after it.
    device_samplers: Vec<Option<NonNull<ffi::llama_sampler>>>,
    /// What those samplers share (one argmax over all rows per graph); it
    /// outlives them, dropped after `Drop` freed them.
    rows_argmax: Box<RowsArgmax>,
    n_vocab: usize,
    threads: usize,
    /// For each stream, the stream whose copy of its first cells it holds
    /// (-1: none) and how many cells (see [`RawContext::share_prefixes`]);
    /// empty when nothing is shared.
    prefix_sources: Vec<i32>,
    prefix_cells: Vec<i32>,
    _model: PhantomData<&'m RawModel>,
}

// SAFETY: a context may move between threads; it is used from one at a time
// (`&mut self` for everything that computes), and it is not `Sync`.
unsafe impl Send for RawContext<'_> {}

impl<'m> RawContext<'m> {
    pub(crate) fn new(model: &'m RawModel, params: &ContextParams) -> Result<Self, String> {
        let cells = u32::try_from(params.cells).map_err(|_| "KV size too large")?;
        let batch = u32::try_from(params.batch.max(1)).map_err(|_| "batch too large")?;
        let threads = i32::try_from(params.threads.max(1)).unwrap_or(1);
        // SAFETY: plain data defaults from llama.cpp.
        let mut cparams = unsafe { ffi::llama_context_default_params() };
        cparams.n_ctx = cells;
        cparams.n_batch = batch;
        cparams.n_ubatch =
            u32::try_from(params.micro_batch.clamp(1, params.batch.max(1))).unwrap_or(batch);
        cparams.n_seq_max = u32::try_from(params.sequences.max(1)).unwrap_or(1);
        cparams.n_threads = threads;
        cparams.n_threads_batch = threads;
        cparams.kv_unified = params.unified;
        cparams.cb_eval = super::profile::eval_callback();
        // On the CPU, flash attention always runs (llama.cpp's CPU backend
        // has it, and cortex's kernels take it where they can). llama.cpp's
        // automatic choice would turn it off as soon as cortex's kernels
        // take it, since they are another device than the layers': and the
        // unfused path is several times slower there.
        if model.on_cpu {
            cparams.flash_attn_type = ffi::LLAMA_FLASH_ATTN_TYPE_ENABLED;
        }
        if let Some(pooling) = params.embeddings {
            cparams.embeddings = true;
            cparams.pooling_type = match pooling {
                Pooling::Model => ffi::LLAMA_POOLING_TYPE_UNSPECIFIED,
                Pooling::Mean => ffi::LLAMA_POOLING_TYPE_MEAN,
            };
        }
        // SAFETY: the model is alive for 'm, which outlives the context; null
        // means failure (logged by llama.cpp).
        let ptr = unsafe { ffi::llama_init_from_model(model.ptr.as_ptr(), cparams) };
        let ptr =
            NonNull::new(ptr).ok_or("llama.cpp could not create the context (see its log)")?;
        let mut context = Self {
            ptr,
            threadpool: None,
            device_samplers: vec![None; params.sequences.max(1)],
            rows_argmax: RowsArgmax::new(),
            n_vocab: model.n_vocab(),
            threads: params.threads.max(1),
            prefix_sources: Vec::new(),
            prefix_cells: Vec::new(),
            _model: PhantomData,
        };
        if !cfg!(feature = "openmp") {
            context.attach_threadpool();
        }
        Ok(context)
    }

    /// Without OpenMP, ggml would start and join its threads on every graph;
    /// a persistent pool keeps them (idle ones poll briefly, then sleep).
    fn attach_threadpool(&mut self) {
        let Some(fns) = threadpool_fns() else {
            return;
        };
        let threads = i32::try_from(self.threads).unwrap_or(1);
        // SAFETY: plain data defaults for `threads` threads.
        let mut tpp = unsafe { ffi::ggml_threadpool_params_default(threads) };
        // SAFETY: `tpp` is a valid parameter block; null means failure.
        let pool = unsafe { (fns.new)(&raw mut tpp) };
        if let Some(pool) = NonNull::new(pool) {
            // SAFETY: the pool outlives the context's use of it: `Drop`
            // frees the context before the pool.
            unsafe {
                ffi::llama_attach_threadpool(self.ptr.as_ptr(), pool.as_ptr(), pool.as_ptr());
            };
            self.threadpool = Some((pool, fns));
        }
    }

    /// Threads the next decodes use (at most the count it was made with).
    pub(crate) fn set_threads(&mut self, threads: usize) {
        let threads = i32::try_from(threads.clamp(1, self.threads)).unwrap_or(1);
        // SAFETY: a live context; takes effect at the next decode.
        unsafe { ffi::llama_set_n_threads(self.ptr.as_ptr(), threads, threads) }
    }

    /// Decodes a batch: 0 on success, 1 when no KV slot was found, other
    /// values for errors (llama.cpp's codes).
    pub(crate) fn decode(&mut self, batch: &RawBatch) -> i32 {
        // cortex's kernels run on this context's threads too, and read the
        // prefixes its streams share once.
        super::kernels::set_threadpool(
            self.threadpool
                .map_or(std::ptr::null_mut(), |(pool, _)| pool.as_ptr()),
        );
        super::kernels::set_prefix_shares(&self.prefix_sources, &self.prefix_cells);
        // SAFETY: the batch's arrays hold `n_tokens` initialised entries and
        // stay alive for the call; the context is live and used by one thread.
        let result = unsafe { ffi::llama_decode(self.ptr.as_ptr(), batch.raw) };
        super::kernels::set_prefix_shares(&[], &[]);
        if let Some((
            pool,
            ThreadpoolFns {
                pause: Some(pause), ..
            },
        )) = self.threadpool
        {
            // Idle workers poll between the graph's splits (ggml's default,
            // which the many splits of a step need), and would go on
            // spinning for millions of rounds after it, on the cores the
            // host's sampling needs; paused, they sleep until the next
            // graph starts them again.
            // SAFETY: a live pool, no graph running on it.
            unsafe { pause(pool.as_ptr()) };
        }
        result
    }

    /// The streams whose first cells are copies of another stream's, as
    /// (stream, source, cells), for the decodes from now on: cortex's
    /// attention reads the source's cells once for all of them. Streams
    /// outside the context's are ignored.
    pub(crate) fn share_prefixes(
        &mut self,
        streams: usize,
        shares: impl ExactSizeIterator<Item = (i32, i32, usize)>,
    ) {
        self.prefix_sources.clear();
        self.prefix_cells.clear();
        if shares.len() == 0 {
            return;
        }
        self.prefix_sources.resize(streams, -1);
        self.prefix_cells.resize(streams, 0);
        for (stream, source, cells) in shares {
            let in_range = |s: i32| usize::try_from(s).is_ok_and(|s| s < streams);
            if in_range(stream) && in_range(source) {
                self.prefix_sources[stream as usize] = source;
                self.prefix_cells[stream as usize] = i32::try_from(cells).unwrap_or(i32::MAX);
            }
        }
    }

    /// Whether the next decodes take the argmax of sequence `seq`'s logits on
    /// the device that computes them (llama.cpp's backend sampling: the
    /// reduction runs in the decode graph, one argmax over all the greedy
    /// rows of a micro-batch (see `RowsArgmax`), and one token per row comes back
    /// instead of the vocabulary's logits), or give its logits whole. Returns
    /// whether the device now samples for `seq`: false when `on` is, or when
    /// the device cannot. A change costs llama.cpp a new reservation of its
    /// compute buffers at the next decode, so callers change it rarely.
    pub(crate) fn set_device_greedy(&mut self, seq: i32, on: bool) -> bool {
        let Some(slot) = usize::try_from(seq)
            .ok()
            .filter(|&s| s < self.device_samplers.len())
        else {
            return false;
        };
        if self.device_samplers[slot].is_some() == on {
            return on;
        }
        if !on {
            // SAFETY: a live context and a sequence id below n_seq_max;
            // detaching (null) always succeeds.
            unsafe { ffi::llama_set_sampler(self.ptr.as_ptr(), seq, std::ptr::null_mut()) };
            if let Some(old) = self.device_samplers[slot].take() {
                // SAFETY: the chain was made here and the context no longer
                // refers to it.
                unsafe { ffi::llama_sampler_free(old.as_ptr()) };
            }
            return false;
        }
        let chain = self.rows_argmax.sampler();
        if chain.is_null() {
            return false;
        }
        // SAFETY: a live context, a sequence id below n_seq_max and a live
        // chain, which outlives the context's use of it (freed on detach or
        // after the context).
        let offloaded = unsafe { ffi::llama_set_sampler(self.ptr.as_ptr(), seq, chain) };
        if offloaded {
            self.device_samplers[slot] = NonNull::new(chain);
        } else {
            // SAFETY: llama.cpp kept no reference to a chain it refused.
            unsafe { ffi::llama_sampler_free(chain) };
        }
        offloaded
    }

    /// The token the device sampled for the `index`-th token of the last
    /// batch, when that token's sequence is sampled there.
    pub(crate) fn device_sampled(&mut self, index: usize) -> Option<i32> {
        let index = i32::try_from(index).ok()?;
        // SAFETY: a live context; llama.cpp checks the index and returns
        // LLAMA_TOKEN_NULL (-1) for a row it did not sample.
        let token = unsafe { ffi::llama_get_sampled_token_ith(self.ptr.as_ptr(), index) };
        (token >= 0).then_some(token)
    }

    /// Waits until the device has finished the last decode and its outputs
    /// are back on the host (llama.cpp's decode returns once the work is
    /// queued on a GPU).
    pub(crate) fn synchronize(&mut self) {
        // SAFETY: a live context used by one thread.
        unsafe { ffi::llama_synchronize(self.ptr.as_ptr()) }
    }

    /// Micro-batches this context computed with the graph of the one before
    /// (llama.cpp rebuilds the graph unless the shape repeats).
    pub(crate) fn graphs_reused(&self) -> u64 {
        // SAFETY: a live context; the call only reads its counters.
        let data = unsafe { ffi::llama_perf_context(self.ptr.as_ptr()) };
        u64::try_from(data.n_reused).unwrap_or(0)
    }

    /// Logits of the `index`-th token of the last batch, which asked for them.
    pub(crate) fn logits(&self, index: usize) -> Option<&[f32]> {
        let index = i32::try_from(index).ok()?;
        // SAFETY: llama.cpp checks `index` against the last batch's outputs
        // and returns null when it has no logits there.
        let ptr = unsafe { ffi::llama_get_logits_ith(self.ptr.as_ptr(), index) };
        // SAFETY: a non-null row holds `n_vocab` floats, valid until the next
        // decode, which needs `&mut self` and so ends this borrow first.
        NonNull::new(ptr).map(|p| unsafe { std::slice::from_raw_parts(p.as_ptr(), self.n_vocab) })
    }

    /// The pooled embedding of sequence `seq` after the last decode of an
    /// embedding context (`n_embd` floats), if it had that sequence.
    pub(crate) fn sequence_embedding(&mut self, seq: i32, n_embd: usize) -> Option<&[f32]> {
        // SAFETY: a live context; llama.cpp returns null for a sequence the
        // last batch did not have or a context without pooling.
        let ptr = unsafe { ffi::llama_get_embeddings_seq(self.ptr.as_ptr(), seq) };
        // SAFETY: a non-null result holds `n_embd` floats, valid until the
        // next decode, which needs `&mut self` and so ends this borrow first.
        NonNull::new(ptr).map(|p| unsafe { std::slice::from_raw_parts(p.as_ptr(), n_embd) })
    }

    /// Empties the KV cache (every sequence, and its data).
    pub(crate) fn clear_memory(&mut self) {
        // SAFETY: a live context's memory.
        unsafe { ffi::llama_memory_clear(self.memory(), true) }
    }

    fn memory(&self) -> ffi::llama_memory_t {
        // SAFETY: a live context always has its memory.
        unsafe { ffi::llama_get_memory(self.ptr.as_ptr()) }
    }

    /// Copies everything `src` holds over `dst` (across non-unified streams,
    /// llama.cpp copies whole streams, at the next decode).
    pub(crate) fn copy_sequence(&mut self, src: i32, dst: i32) {
        // SAFETY: ids below n_seq_max (the engine hands out no others); both
        // ends open (-1) is what a cross-stream copy requires.
        unsafe { ffi::llama_memory_seq_cp(self.memory(), src, dst, -1, -1) }
    }

    /// Drops `seq`'s cells from position `from` on.
    pub(crate) fn truncate_sequence(&mut self, seq: i32, from: usize) {
        let from = i32::try_from(from).unwrap_or(i32::MAX);
        // SAFETY: an id below n_seq_max; -1 means "to the end".
        unsafe { ffi::llama_memory_seq_rm(self.memory(), seq, from, -1) };
    }
}

impl Drop for RawContext<'_> {
    fn drop(&mut self) {
        // SAFETY: the context is live and freed once, before the threadpool
        // and the samplers it may use.
        unsafe { ffi::llama_free(self.ptr.as_ptr()) };
        for sampler in self.device_samplers.drain(..).flatten() {
            // SAFETY: made by `set_device_greedy`; the context that used it is gone.
            unsafe { ffi::llama_sampler_free(sampler.as_ptr()) };
        }
        if let Some((pool, fns)) = self.threadpool.take() {
            // SAFETY: no context uses the pool any more.
            unsafe { (fns.free)(pool.as_ptr()) };
        }
    }
}

/// A batch of tokens, each for one sequence.
pub(crate) struct RawBatch {
    raw: ffi::llama_batch,
    capacity: usize,
}

// SAFETY: the batch owns its arrays; nothing else points into them.
unsafe impl Send for RawBatch {}

impl RawBatch {
    pub(crate) fn new(capacity: usize) -> Self {
        let n = i32::try_from(capacity.max(1)).unwrap_or(i32::MAX);
        // SAFETY: allocates arrays for `n` tokens with one sequence id each.
        let raw = unsafe { ffi::llama_batch_init(n, 0, 1) };
        Self {
            raw,
            capacity: n as usize,
        }
    }

    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    pub(crate) fn clear(&mut self) {
        self.raw.n_tokens = 0;
    }

    /// Appends a token; false when the batch is full.
    pub(crate) fn push(&mut self, token: i32, pos: usize, seq: i32, logits: bool) -> bool {
        let i = self.raw.n_tokens as usize;
        if i >= self.capacity {
            return false;
        }
        // SAFETY: `i < capacity`, the length every array was allocated with;
        // each `seq_id[i]` points at room for one id (n_seq_max = 1).
        unsafe {
            *self.raw.token.add(i) = token;
            *self.raw.pos.add(i) = i32::try_from(pos).unwrap_or(i32::MAX);
            *self.raw.n_seq_id.add(i) = 1;
            *(*self.raw.seq_id.add(i)) = seq;
            *self.raw.logits.add(i) = i8::from(logits);
        }
        self.raw.n_tokens += 1;
        true
    }
}

impl Drop for RawBatch {
    fn drop(&mut self) {
        // SAFETY: allocated by `llama_batch_init`, freed once.
        unsafe { ffi::llama_batch_free(self.raw) }
    }
}

/// ggml's threadpool functions. They live in the CPU backend, a module
/// loaded at run time, so they are looked up through its registry entry
/// (as llama.cpp's own tools do) rather than linked.
#[derive(Clone, Copy)]
struct ThreadpoolFns {
    new: NewThreadpool,
    free: FreeThreadpool,
    pause: Option<super::devices::PauseThreadpool>,
}

type NewThreadpool =
    unsafe extern "C" fn(*mut ffi::ggml_threadpool_params) -> *mut ffi::ggml_threadpool;
type FreeThreadpool = unsafe extern "C" fn(*mut ffi::ggml_threadpool);

/// The CPU backend's threadpool functions, if it is loaded and has them.
fn threadpool_fns() -> Option<ThreadpoolFns> {
    static FNS: OnceLock<Option<ThreadpoolFns>> = OnceLock::new();
    *FNS.get_or_init(|| {
        // SAFETY: reads ggml's registry; a registered backend and the
        // functions it hands out live as long as the process.
        let lookup = |name: &std::ffi::CStr| unsafe {
            let reg = ffi::ggml_backend_reg_by_name(c"CPU".as_ptr());
            if reg.is_null() {
                return None;
            }
            NonNull::new(ffi::ggml_backend_reg_get_proc_address(reg, name.as_ptr()))
        };
        let (new, free) = (
            lookup(c"ggml_threadpool_new")?,
            lookup(c"ggml_threadpool_free")?,
        );
        // SAFETY: the CPU backend exports these names with exactly these
        // signatures (ggml-cpu.h, which the bindings are generated from).
        unsafe {
            Some(ThreadpoolFns {
                new: std::mem::transmute::<*mut c_void, NewThreadpool>(new.as_ptr()),
                free: std::mem::transmute::<*mut c_void, FreeThreadpool>(free.as_ptr()),
                pause: super::devices::threadpool_pause(),
            })
        }
    })
}
