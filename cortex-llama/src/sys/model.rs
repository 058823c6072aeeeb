//! A loaded model and its vocabulary, and llama.cpp's built-in chat
//! templates.

use std::ffi::{CStr, CString, c_char};
use std::path::Path;
use std::ptr::NonNull;

use llama_cpp_sys_2 as ffi;

use super::devices::RawDevice;
use super::init;

/// Where a model's weights go.
#[derive(Debug, Clone)]
pub(crate) struct RawPlacement {
    /// The devices layers may be offloaded to; none: the CPU alone.
    pub(crate) devices: Vec<RawDevice>,
    /// Layers to offload to them (negative: all).
    pub(crate) gpu_layers: i32,
    /// Whether the weights that stay on the CPU go to cortex's kernels
    /// (those of the formats they have) or all to llama.cpp's CPU backend.
    pub(crate) cortex_kernels: bool,
}

impl RawPlacement {
    /// Everything on the CPU.
    pub(crate) fn cpu(cortex_kernels: bool) -> Self {
        Self {
            devices: Vec::new(),
            gpu_layers: 0,
            cortex_kernels,
        }
    }
}

/// A loaded model and its vocabulary.
pub(crate) struct RawModel {
    pub(super) ptr: NonNull<ffi::llama_model>,
    pub(super) vocab: NonNull<ffi::llama_vocab>,
    /// Every layer on the CPU (no GPU given, or none of its layers).
    pub(super) on_cpu: bool,
}

// SAFETY: a llama_model is immutable once loaded; llama.cpp reads it from
// any thread (contexts on several threads share one model).
unsafe impl Send for RawModel {}
// SAFETY: as above: every method here only reads the model.
unsafe impl Sync for RawModel {}

impl RawModel {
    /// Loads a GGUF file, its layers placed as `placement` says: mapped into
    /// memory or read (`mmap`; `None`: llama.cpp's choice).
    pub(crate) fn load(
        path: &Path,
        placement: &RawPlacement,
        mmap: Option<bool>,
    ) -> Result<Self, String> {
        init();
        let c_path = CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| "the path contains a NUL byte".to_owned())?;
        // llama.cpp reads a null-terminated list; an empty one keeps every
        // layer (and every operation) on the CPU.
        let mut devices: Vec<ffi::ggml_backend_dev_t> =
            placement.devices.iter().map(|d| d.as_ptr()).collect();
        devices.push(std::ptr::null_mut());
        // SAFETY: plain data defaults from llama.cpp.
        let mut params = unsafe { ffi::llama_model_default_params() };
        params.devices = devices.as_mut_ptr();
        params.n_gpu_layers = placement.gpu_layers;
        params.load_mode = match mmap {
            None => ffi::LLAMA_LOAD_MODE_AUTO,
            Some(true) => ffi::LLAMA_LOAD_MODE_MMAP,
            Some(false) => ffi::LLAMA_LOAD_MODE_NONE,
        };
        // llama.cpp asks the kernels, on this thread, whether they take each
        // weight it places.
        super::kernels::place_weights(placement.cortex_kernels);
        // SAFETY: `c_path` is a valid C string and `devices` a null-terminated
        // list of live devices, both alive for the call (llama.cpp copies the
        // list); it returns null on failure (and logs why).
        let ptr = unsafe { ffi::llama_model_load_from_file(c_path.as_ptr(), params) };
        let ptr = NonNull::new(ptr).ok_or("llama.cpp refused the file (see its log)")?;
        // SAFETY: `ptr` is a live model; its vocabulary lives as long as it.
        let vocab = unsafe { ffi::llama_model_get_vocab(ptr.as_ptr()) };
        let vocab = NonNull::new(vocab.cast_mut()).ok_or("the model has no vocabulary")?;
        Ok(Self {
            ptr,
            vocab,
            on_cpu: placement.devices.is_empty() || placement.gpu_layers == 0,
        })
    }

    fn model(&self) -> *const ffi::llama_model {
        self.ptr.as_ptr()
    }

    /// Bytes of the model's weights.
    pub(crate) fn size_bytes(&self) -> u64 {
        // SAFETY: reads a live model.
        unsafe { ffi::llama_model_size(self.model()) }
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

    /// The bytes a token stands for, a control token's text included.
    pub(crate) fn control_token_text(&self, token: i32) -> Vec<u8> {
        self.piece(token, true)
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
