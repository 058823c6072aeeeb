//! llama.cpp's grammar sampler for one sequence.

use std::ffi::CString;
use std::ptr::NonNull;
use std::sync::Arc;

use llama_cpp_sys_2 as ffi;

use super::RawModel;

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
