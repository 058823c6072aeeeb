//! Logits → token id, for any engine.
//!
//! A [`Sampler`] holds one request's [`SamplingParams`] and its own seeded
//! [`SampleRng`]: greedy, temperature, top-k, top-p, min-p, repetition /
//! presence / frequency penalties over the request's recent tokens, and logit
//! bias. The same seed, logits and history give the same token on any machine:
//! the generator and the `exp` used by softmax are written out in this crate in
//! plain IEEE arithmetic. [`Sampler`]'s docs give the order the filters run in.
//! [`sample_batch`] samples many rows in parallel (rayon).
//!
//! The crate does no I/O and knows nothing of llama.cpp or SQLite.
//!
//! # Example
//!
//! ```
//! use cortex_request::SamplingParams;
//! use cortex_sample::{BatchRow, Sampler, sample_batch};
//!
//! // Greedy: the argmax.
//! let mut greedy = Sampler::new(SamplingParams::greedy(), 0);
//! assert_eq!(greedy.sample(&mut [0.1, 2.0, 0.3], &[]), 1);
//!
//! // top-k 2 never picks the third-best token; a seed makes it repeatable.
//! let params = SamplingParams { temperature: 0.8, top_k: 2, seed: Some(7), ..SamplingParams::default() };
//! let draw = |params: &SamplingParams| {
//!     let mut sampler = Sampler::new(params.clone(), 0);
//!     (0..20).map(|_| sampler.sample(&mut [1.0, 0.9, 0.8], &[])).collect::<Vec<_>>()
//! };
//! let tokens = draw(&params);
//! assert!(tokens.iter().all(|&t| t < 2));
//! assert_eq!(tokens, draw(&params));
//!
//! // A batch of rows, sampled in parallel.
//! let mut a = Sampler::new(SamplingParams::greedy(), 0);
//! let mut b = Sampler::new(SamplingParams::greedy(), 1);
//! let (mut la, mut lb) = (vec![0.0, 5.0], vec![3.0, 1.0]);
//! let mut rows = [
//!     BatchRow { sampler: &mut a, logits: &mut la, history: &[], constraint: None },
//!     BatchRow { sampler: &mut b, logits: &mut lb, history: &[], constraint: None },
//! ];
//! assert_eq!(sample_batch(&mut rows), vec![1, 0]);
//! ```
//!
//! # Design notes
//!
//! `Sampler` holds one request's parameters, its own RNG (xoshiro256** written
//! out in the crate, so a seed means the same stream everywhere) and scratch
//! buffers. Order: logit bias → penalties over the last `penalty_last_n` tokens →
//! greedy shortcut → temperature → top-k → top-p → min-p → draw. Whole-vocabulary
//! passes are written as fixed-lane, branch-free loops so they vectorise, with an
//! `exp` in plain IEEE arithmetic (bit-identical everywhere); filtering finds a
//! logit floor that contains every survivor and sorts only the tokens above it.
//! `sample_batch` samples rows in parallel with rayon. A row may carry a
//! `Constraint` (a `TokenFilter`, e.g. llama.cpp's grammar sampler): the draw is
//! made unconstrained and kept if the filter allows it, else the whole
//! vocabulary is masked and the draw made again (llama.cpp's order; greedy gives
//! the best allowed token either way); rows that report log probabilities mask
//! first, so those are after the constraint.

#![forbid(unsafe_code)]

mod fastexp;
mod kernels;
mod logprobs;
mod rng;
mod sampler;

use cortex_request::TokenId;
use rayon::prelude::*;

pub use cortex_request::SamplingParams;
pub use logprobs::{IMPOSSIBLE, logprobs};
pub use rng::SampleRng;
pub use sampler::{Sampler, TokenFilter, argmax};

/// One row of a batch: a request's sampler, its logits and its token history.
#[derive(Debug)]
pub struct BatchRow<'a> {
    /// The request's sampler (its RNG advances).
    pub sampler: &'a mut Sampler,
    /// Logits over the vocabulary; bias and penalties are applied in place.
    pub logits: &'a mut [f32],
    /// Tokens seen so far, oldest first (for penalties).
    pub history: &'a [TokenId],
    /// What the next token must satisfy, if anything.
    pub constraint: Option<Constraint<'a>>,
}

/// A row's constraint: its filter, and whether to mask before the draw (see
/// [`Sampler::sample_constrained`]).
pub struct Constraint<'a> {
    /// Which tokens may come next.
    pub filter: &'a mut dyn TokenFilter,
    /// Mask the whole vocabulary before drawing rather than only after a
    /// rejected draw.
    pub mask_first: bool,
}

impl std::fmt::Debug for Constraint<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint")
            .field("mask_first", &self.mask_first)
            .finish_non_exhaustive()
    }
}

impl BatchRow<'_> {
    fn sample(&mut self) -> TokenId {
        match &mut self.constraint {
            Some(c) => {
                self.sampler
                    .sample_constrained(self.logits, self.history, c.filter, c.mask_first)
            }
            None => self.sampler.sample(self.logits, self.history),
        }
    }
}

/// The argmax of each row of logits (lowest id on ties, NaN ignored), in
/// parallel on rayon's pool: greedy rows with nothing to adjust, read where
/// the executor left them (a wide batch's logits are tens of megabytes, more
/// than one core reads in a step's time).
pub fn argmax_rows(rows: &[&[f32]]) -> Vec<TokenId> {
    if rows.len() < 4 {
        return rows.iter().map(|row| argmax(row)).collect();
    }
    rows.par_iter().map(|row| argmax(row)).collect()
}

/// Samples every row, in parallel on rayon's pool; results are in row order and
/// identical to sampling the rows one by one.
pub fn sample_batch(rows: &mut [BatchRow<'_>]) -> Vec<TokenId> {
    if rows.len() == 1 {
        return vec![rows[0].sample()];
    }
    rows.par_iter_mut().map(BatchRow::sample).collect()
}
