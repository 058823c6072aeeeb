//! The FFI boundary: owners of llama.cpp's model, context, batch and
//! threadpool, each `unsafe` call justified where it is made. Nothing else in
//! cortex calls llama.cpp.
//!
//! cortex binds `llama-cpp-sys-2` (llama.cpp through bindgen) itself rather
//! than a higher-level wrapper because it needs what those keep private: the
//! context handle, to change the thread count of a running context
//! (`llama_set_n_threads`, for machines shared with other work) and to give a
//! context a persistent threadpool when llama.cpp is built without OpenMP.

#![allow(unsafe_code)]

use std::ffi::{CStr, CString, c_char, c_void};
use std::marker::PhantomData;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::{Arc, Once};

use llama_cpp_sys_2 as ffi;

/// Initialises llama.cpp once per process and routes its logs to `tracing`.
pub(crate) fn init() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        // SAFETY: `log_to_tracing` matches the callback type, ignores its user
        // data (null here) and lives for the whole program; backend
        // initialisation runs once, before any other llama.cpp call.
        unsafe {
            ffi::llama_log_set(Some(log_to_tracing), std::ptr::null_mut());
            ffi::llama_backend_init();
        }
    });
}

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
        ffi::GGML_LOG_LEVEL_WARN => tracing::warn!(target: "llama.cpp", "{text}"),
        ffi::GGML_LOG_LEVEL_INFO => tracing::debug!(target: "llama.cpp", "{text}"),
        _ => tracing::trace!(target: "llama.cpp", "{text}"),
    }
}

/// A loaded model and its vocabulary.
pub(crate) struct RawModel {
    ptr: NonNull<ffi::llama_model>,
    vocab: NonNull<ffi::llama_vocab>,
}

// SAFETY: a llama_model is immutable once loaded; llama.cpp reads it from
// any thread (contexts on several threads share one model).
unsafe impl Send for RawModel {}
// SAFETY: as above: every method here only reads the model.
unsafe impl Sync for RawModel {}

impl RawModel {
    /// Loads a GGUF file onto the CPU (memory-mapped).
    pub(crate) fn load(path: &Path) -> Result<Self, String> {
        init();
        let c_path = CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| "the path contains a NUL byte".to_owned())?;
        // SAFETY: plain data defaults from llama.cpp.
        let params = unsafe { ffi::llama_model_default_params() };
        // SAFETY: `c_path` is a valid C string for the call; llama.cpp returns
        // null on failure (and logs why).
        let ptr = unsafe { ffi::llama_model_load_from_file(c_path.as_ptr(), params) };
        let ptr = NonNull::new(ptr).ok_or("llama.cpp refused the file (see its log)")?;
        // SAFETY: `ptr` is a live model; its vocabulary lives as long as it.
        let vocab = unsafe { ffi::llama_model_get_vocab(ptr.as_ptr()) };
        let vocab = NonNull::new(vocab.cast_mut()).ok_or("the model has no vocabulary")?;
        Ok(Self { ptr, vocab })
    }

    fn model(&self) -> *const ffi::llama_model {
        self.ptr.as_ptr()
    }

    pub(crate) fn n_vocab(&self) -> usize {
        // SAFETY: the vocabulary lives as long as `self`.
        unsafe { ffi::llama_vocab_n_tokens(self.vocab.as_ptr()) }.max(0) as usize
    }

    pub(crate) fn n_ctx_train(&self) -> usize {
        // SAFETY: reads a live model.
        unsafe { ffi::llama_model_n_ctx_train(self.model()) }.max(0) as usize
    }

    pub(crate) fn n_layer(&self) -> usize {
        // SAFETY: reads a live model.
        unsafe { ffi::llama_model_n_layer(self.model()) }.max(0) as usize
    }

    pub(crate) fn n_head(&self) -> usize {
        // SAFETY: reads a live model.
        unsafe { ffi::llama_model_n_head(self.model()) }.max(0) as usize
    }

    pub(crate) fn n_head_kv(&self) -> usize {
        // SAFETY: reads a live model.
        unsafe { ffi::llama_model_n_head_kv(self.model()) }.max(0) as usize
    }

    pub(crate) fn n_embd(&self) -> usize {
        // SAFETY: reads a live model.
        unsafe { ffi::llama_model_n_embd(self.model()) }.max(0) as usize
    }

    /// A GGUF metadata value as text.
    pub(crate) fn meta(&self, key: &str) -> Option<String> {
        let key = CString::new(key).ok()?;
        let mut buf = vec![0u8; 256];
        loop {
            // SAFETY: `key` is a C string and `buf` is writable for its
            // length; llama.cpp returns the full length (or -1 if absent).
            let n = unsafe {
                ffi::llama_model_meta_val_str(
                    self.model(),
                    key.as_ptr(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                )
            };
            let n = usize::try_from(n).ok()?;
            if n < buf.len() {
                buf.truncate(n);
                return String::from_utf8(buf).ok();
            }
            buf.resize(n + 1, 0);
        }
    }

    /// The model's own chat template, if it has one.
    pub(crate) fn chat_template(&self) -> Option<String> {
        // SAFETY: a null name asks for the default template; the returned
        // string (or null) is owned by the model and outlives this call.
        let template = unsafe { ffi::llama_model_chat_template(self.model(), std::ptr::null()) };
        if template.is_null() {
            return None;
        }
        // SAFETY: non-null, NUL-terminated, owned by the live model.
        Some(
            unsafe { CStr::from_ptr(template) }
                .to_string_lossy()
                .into_owned(),
        )
    }

    pub(crate) fn tokenize(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<i32> {
        let Ok(len) = i32::try_from(text.len()) else {
            return Vec::new();
        };
        let mut tokens = vec![0i32; text.len() / 2 + 8];
        loop {
            // SAFETY: `text` is valid for `len` bytes (no NUL needed: the
            // length is given) and `tokens` is writable for its length.
            let n = unsafe {
                ffi::llama_tokenize(
                    self.vocab.as_ptr(),
                    text.as_ptr().cast(),
                    len,
                    tokens.as_mut_ptr(),
                    i32::try_from(tokens.len()).unwrap_or(i32::MAX),
                    add_special,
                    parse_special,
                )
            };
            if n >= 0 {
                tokens.truncate(n as usize);
                return tokens;
            }
            // Too small: llama.cpp said how many it needs.
            tokens.resize(n.unsigned_abs() as usize, 0);
        }
    }

    /// The bytes a token stands for (control tokens render as nothing).
    pub(crate) fn token_bytes(&self, token: i32) -> Vec<u8> {
        self.piece(token, false)
    }

    /// A token's bytes; control tokens as their text when `special`.
    fn piece(&self, token: i32, special: bool) -> Vec<u8> {
        let mut buf = vec![0u8; 32];
        loop {
            // SAFETY: `buf` is writable for its length; llama.cpp returns the
            // bytes written, or minus the length it needs.
            let n = unsafe {
                ffi::llama_token_to_piece(
                    self.vocab.as_ptr(),
                    token,
                    buf.as_mut_ptr().cast(),
                    i32::try_from(buf.len()).unwrap_or(i32::MAX),
                    0,
                    special,
                )
            };
            if n >= 0 {
                buf.truncate(n as usize);
                return buf;
            }
            buf.resize(n.unsigned_abs() as usize, 0);
        }
    }

    /// The texts of the start and end tokens, as templates print them
    /// (empty where the vocabulary has none).
    pub(crate) fn bos_eos_text(&self) -> (String, String) {
        // SAFETY: reads the live vocabulary.
        let (bos, eos) = unsafe {
            (
                ffi::llama_vocab_bos(self.vocab.as_ptr()),
                ffi::llama_vocab_eos(self.vocab.as_ptr()),
            )
        };
        let text = |token: i32| {
            if token < 0 {
                return String::new();
            }
            String::from_utf8_lossy(&self.piece(token, true)).into_owned()
        };
        (text(bos), text(eos))
    }

    /// Whether tokenizing with special tokens adds a start token.
    pub(crate) fn adds_bos(&self) -> bool {
        // SAFETY: reads the live vocabulary.
        unsafe { ffi::llama_vocab_get_add_bos(self.vocab.as_ptr()) }
    }

    pub(crate) fn is_end_of_generation(&self, token: i32) -> bool {
        // SAFETY: reads the live vocabulary; out-of-range ids are handled by llama.cpp.
        unsafe { ffi::llama_vocab_is_eog(self.vocab.as_ptr(), token) }
    }
}

impl Drop for RawModel {
    fn drop(&mut self) {
        // SAFETY: the model was loaded by llama.cpp and every context that
        // borrowed it (`RawContext<'m>`) is gone.
        unsafe { ffi::llama_model_free(self.ptr.as_ptr()) }
    }
}

/// Renders `messages` (role, content) with a chat template known to
/// llama.cpp's built-in matcher (chatml, llama3, gemma, ...).
pub(crate) fn apply_chat_template(
    template: &str,
    messages: &[(&str, &str)],
    add_assistant: bool,
) -> Result<String, String> {
    let template = CString::new(template).map_err(|_| "the template contains NUL")?;
    let owned: Vec<(CString, CString)> = messages
        .iter()
        .map(|(role, content)| Ok((CString::new(*role)?, CString::new(*content)?)))
        .collect::<Result<_, std::ffi::NulError>>()
        .map_err(|_| "a message contains a NUL character")?;
    let chat: Vec<ffi::llama_chat_message> = owned
        .iter()
        .map(|(role, content)| ffi::llama_chat_message {
            role: role.as_ptr(),
            content: content.as_ptr(),
        })
        .collect();
    let total: usize = messages.iter().map(|(r, c)| r.len() + c.len()).sum();
    let mut buf = vec![0u8; 2 * total + 256];
    loop {
        // SAFETY: `chat` points into `owned`, alive for the call; `buf` is
        // writable for its length. The result is the full length needed.
        let n = unsafe {
            ffi::llama_chat_apply_template(
                template.as_ptr(),
                chat.as_ptr(),
                chat.len(),
                add_assistant,
                buf.as_mut_ptr().cast(),
                i32::try_from(buf.len()).unwrap_or(i32::MAX),
            )
        };
        let n = usize::try_from(n).map_err(|_| "llama.cpp does not know this chat template")?;
        if n <= buf.len() {
            buf.truncate(n);
            return String::from_utf8(buf).map_err(|_| "the rendered chat is not UTF-8".into());
        }
        buf.resize(n, 0);
    }
}

/// The names of the chat templates llama.cpp renders itself (chatml,
/// llama3, gemma, ...).
pub(crate) fn builtin_chat_templates() -> Vec<String> {
    // SAFETY: with a null output and length 0 llama.cpp only counts.
    let count = unsafe { ffi::llama_chat_builtin_templates(std::ptr::null_mut(), 0) };
    let mut names: Vec<*const c_char> = vec![std::ptr::null(); usize::try_from(count).unwrap_or(0)];
    // SAFETY: `names` has room for `count` pointers, which llama.cpp fills
    // with static strings.
    unsafe { ffi::llama_chat_builtin_templates(names.as_mut_ptr(), names.len()) };
    names
        .into_iter()
        .filter(|p| !p.is_null())
        // SAFETY: each is a NUL-terminated static string of llama.cpp.
        .map(|p| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
        .collect()
}

/// What a context is made with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ContextParams {
    /// KV cells in all.
    pub(crate) cells: usize,
    /// Sequences (streams, when not unified).
    pub(crate) sequences: usize,
    /// Tokens per decode call at most.
    pub(crate) batch: usize,
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
    threadpool: Option<NonNull<ffi::ggml_threadpool>>,
    n_vocab: usize,
    threads: usize,
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
        // Larger micro-batches only grow llama.cpp's compute buffers.
        cparams.n_ubatch = batch.min(512);
        cparams.n_seq_max = u32::try_from(params.sequences.max(1)).unwrap_or(1);
        cparams.n_threads = threads;
        cparams.n_threads_batch = threads;
        cparams.kv_unified = params.unified;
        if let Some(pooling) = params.embeddings {
            cparams.embeddings = true;
            cparams.pooling_type = match pooling {
                Pooling::Model => ffi::LLAMA_POOLING_TYPE_UNSPECIFIED,
                Pooling::Mean => ffi::LLAMA_POOLING_TYPE_MEAN,
            };
            // Pooling needs each sequence whole in one micro-batch.
            cparams.n_ubatch = batch;
        }
        // SAFETY: the model is alive for 'm, which outlives the context; null
        // means failure (logged by llama.cpp).
        let ptr = unsafe { ffi::llama_init_from_model(model.ptr.as_ptr(), cparams) };
        let ptr =
            NonNull::new(ptr).ok_or("llama.cpp could not create the context (see its log)")?;
        let mut context = Self {
            ptr,
            threadpool: None,
            n_vocab: model.n_vocab(),
            threads: params.threads.max(1),
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
        let threads = i32::try_from(self.threads).unwrap_or(1);
        // SAFETY: plain data defaults for `threads` threads.
        let mut tpp = unsafe { ffi::ggml_threadpool_params_default(threads) };
        // SAFETY: `tpp` is a valid parameter block; null means failure.
        let pool = unsafe { ffi::ggml_threadpool_new(&raw mut tpp) };
        if let Some(pool) = NonNull::new(pool) {
            // SAFETY: the pool outlives the context's use of it: `Drop`
            // frees the context before the pool.
            unsafe {
                ffi::llama_attach_threadpool(self.ptr.as_ptr(), pool.as_ptr(), pool.as_ptr());
            };
            self.threadpool = Some(pool);
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
        // SAFETY: the batch's arrays hold `n_tokens` initialised entries and
        // stay alive for the call; the context is live and used by one thread.
        unsafe { ffi::llama_decode(self.ptr.as_ptr(), batch.raw) }
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
        // it may use.
        unsafe { ffi::llama_free(self.ptr.as_ptr()) };
        if let Some(pool) = self.threadpool.take() {
            // SAFETY: no context uses the pool any more.
            unsafe { ffi::ggml_threadpool_free(pool.as_ptr()) };
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

/// llama.cpp's grammar sampler for one sequence: which tokens may come next
/// under a GBNF grammar, advanced token by token. It holds its model, whose
/// vocabulary the grammar reads.
pub(crate) struct RawGrammar {
    sampler: NonNull<ffi::llama_sampler>,
    _model: Arc<RawModel>,
    /// The whole vocabulary as llama.cpp's candidate array, reused by masks.
    candidates: Vec<ffi::llama_token_data>,
}

// SAFETY: the sampler is owned by this value alone and used through `&mut`
// only (one thread at a time); besides its own state it reads only the
// model's vocabulary, which is immutable and kept alive by `_model`.
unsafe impl Send for RawGrammar {}

impl RawGrammar {
    /// Parses `gbnf` (start rule `root`) for `model`'s vocabulary.
    pub(crate) fn new(model: &Arc<RawModel>, gbnf: &str) -> Result<Self, String> {
        let text = CString::new(gbnf).map_err(|_| "the grammar contains a NUL byte".to_owned())?;
        // SAFETY: both strings are valid C strings for the call and the
        // vocabulary is live; llama.cpp copies what it keeps and returns null
        // when the grammar does not parse (logging why).
        let ptr = unsafe {
            ffi::llama_sampler_init_grammar(model.vocab.as_ptr(), text.as_ptr(), c"root".as_ptr())
        };
        let sampler = NonNull::new(ptr)
            .ok_or_else(|| "llama.cpp could not parse the grammar (see its log)".to_owned())?;
        Ok(Self {
            sampler,
            _model: Arc::clone(model),
            candidates: Vec::new(),
        })
    }

    /// Sets the logit of each candidate the grammar rejects to -inf.
    fn apply(&mut self, data: &mut [ffi::llama_token_data]) {
        let mut array = ffi::llama_token_data_array {
            data: data.as_mut_ptr(),
            size: data.len(),
            selected: -1,
            sorted: false,
        };
        // SAFETY: `array` describes `data`, valid and writable for the call;
        // the grammar sampler only rewrites logits in place.
        unsafe { ffi::llama_sampler_apply(self.sampler.as_ptr(), &mut array) }
    }

    /// Whether `token` may come next.
    pub(crate) fn allows(&mut self, token: i32) -> bool {
        let mut one = [ffi::llama_token_data {
            id: token,
            logit: 0.0,
            p: 0.0,
        }];
        self.apply(&mut one);
        one[0].logit != f32::NEG_INFINITY
    }

    /// Sets the logits of every token that may not come next to -inf.
    pub(crate) fn mask(&mut self, logits: &mut [f32]) {
        let mut candidates = std::mem::take(&mut self.candidates);
        candidates.clear();
        candidates.extend(
            logits
                .iter()
                .enumerate()
                .map(|(id, &logit)| ffi::llama_token_data {
                    id: id as i32,
                    logit,
                    p: 0.0,
                }),
        );
        self.apply(&mut candidates);
        for (logit, candidate) in logits.iter_mut().zip(&candidates) {
            *logit = candidate.logit;
        }
        self.candidates = candidates;
    }

    /// Advances the grammar past `token`. A token the grammar rejects is
    /// ignored: llama.cpp would abort the process on it.
    pub(crate) fn accept(&mut self, token: i32) {
        if self.allows(token) {
            // SAFETY: a live sampler, and a token it allows.
            unsafe { ffi::llama_sampler_accept(self.sampler.as_ptr(), token) }
        }
    }
}

impl Drop for RawGrammar {
    fn drop(&mut self) {
        // SAFETY: made by `llama_sampler_init_grammar`, freed once.
        unsafe { ffi::llama_sampler_free(self.sampler.as_ptr()) }
    }
}
