//! The sampling pipeline: penalties, bias, temperature, truncation, draw.

use std::cmp::Ordering;

use cortex_request::{SamplingParams, TokenId};

use crate::SampleRng;
use crate::kernels::{self, Scale};

/// A token and its (adjusted) logit.
#[derive(Debug, Clone, Copy)]
struct Candidate {
    logit: f32,
    id: TokenId,
}

/// Most likely first; equal logits by lower id, so every order is total and
/// the result never depends on how a sort happened to be implemented.
fn by_likelihood(a: &Candidate, b: &Candidate) -> Ordering {
    b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id))
}

/// Logits further than this many temperature-scaled nats below the maximum
/// (weight < e^-12 ≈ 6e-6 of the top token's) are left out of the first try at
/// collecting candidates; the try is widened whenever it proves too narrow.
const FIRST_WINDOW: f32 = 12.0;

/// The per-request sampler: parameters, seeded RNG and reusable scratch space.
///
/// # Order of operations
///
/// 1. `logit_bias` is added;
/// 2. penalties over the last `penalty_last_n` tokens of the history:
///    repetition (positive logits divided by it, negative ones multiplied), then
///    `presence_penalty` once and `frequency_penalty` per occurrence subtracted;
/// 3. temperature 0 (or `top_k` = 1) returns the argmax, lowest id on ties;
/// 4. otherwise logits are divided by the temperature and filtered in turn by
///    top-k, top-p (over the renormalised top-k survivors) and min-p (relative to
///    the most likely token), always keeping at least one token;
/// 5. one token is drawn from the renormalised survivors with this request's RNG.
///
/// NaN and -∞ logits are impossible tokens. Steps 1–2 modify `logits` in place.
///
/// Filtering never sorts the vocabulary: one vectorised pass finds how many
/// tokens and how much probability lie above a logit threshold, and only the
/// tokens above it, enough to contain every survivor, are sorted.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: SampleRng,
    candidates: Vec<Candidate>,
    window: Vec<TokenId>,
    block_sums: Vec<f64>,
    /// The logits as given, kept while a constrained draw may need them again.
    unconstrained: Vec<f32>,
}

/// Which tokens may come next, e.g. under a grammar: a constraint the
/// sampler consults (see [`Sampler::sample_constrained`]).
pub trait TokenFilter: Send {
    /// Whether `token` may come next.
    fn allows(&mut self, token: TokenId) -> bool;
    /// Sets the logit of every token that may not come next to -inf.
    fn mask(&mut self, logits: &mut [f32]);
}

/// The filter settings [`Sampler::select`] reads, copied out so the
/// candidate buffer can be borrowed mutably meanwhile.
#[derive(Debug, Clone, Copy)]
struct Filters {
    temperature: f32,
    top_k: i32,
    top_p: f32,
    min_p: f32,
}

impl Filters {
    fn of(params: &SamplingParams) -> Self {
        Self {
            temperature: params.temperature,
            top_k: params.top_k,
            top_p: params.top_p,
            min_p: params.min_p,
        }
    }
}

/// What [`Sampler::select`] left to draw from.
enum Selection {
    /// A single possible token.
    Only(TokenId),
    /// Every token, weighted by the scale.
    Whole(Scale),
    /// The sorted survivors in `candidates`.
    Candidates(Scale),
}

impl Sampler {
    /// A sampler for `params`, seeded with `params.seed` or else `fallback_seed`
    /// (engines pass something stable such as the request id).
    pub fn new(params: SamplingParams, fallback_seed: u64) -> Self {
        let seed = params.seed.unwrap_or(fallback_seed);
        Self {
            params,
            rng: SampleRng::new(seed),
            candidates: Vec::new(),
            window: Vec::new(),
            block_sums: Vec::new(),
            unconstrained: Vec::new(),
        }
    }

    /// The parameters this sampler applies.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Chooses the next token from `logits` (one entry per vocabulary token),
    /// given the tokens seen so far (`history`, oldest first).
    ///
    /// # Panics
    /// If `logits` is empty.
    pub fn sample(&mut self, logits: &mut [f32], history: &[TokenId]) -> TokenId {
        self.adjust(logits, history);
        if self.params.is_greedy() {
            return argmax(logits);
        }
        match self.select(logits) {
            Selection::Only(token) => token,
            Selection::Whole(scale) => self.draw_from_vocabulary(logits, scale),
            Selection::Candidates(scale) => self.draw_from_candidates(scale),
        }
    }

    /// Chooses the next token among those `filter` allows.
    ///
    /// With `mask_first`, the filter masks the whole vocabulary before the
    /// draw (so `logits` end up masked, for log probabilities after the
    /// constraint). Otherwise the draw is made unconstrained first and kept
    /// if the filter allows it, and only a rejected draw pays for a mask of
    /// the whole vocabulary and a second draw (llama.cpp's order too). Both
    /// give the argmax of the allowed tokens when greedy; either way the same
    /// inputs give the same token.
    pub fn sample_constrained(
        &mut self,
        logits: &mut [f32],
        history: &[TokenId],
        filter: &mut dyn TokenFilter,
        mask_first: bool,
    ) -> TokenId {
        if mask_first {
            filter.mask(logits);
            return self.sample(logits, history);
        }
        let mut unconstrained = std::mem::take(&mut self.unconstrained);
        unconstrained.clear();
        unconstrained.extend_from_slice(logits);
        let token = self.sample(logits, history);
        if !filter.allows(token) {
            logits.copy_from_slice(&unconstrained);
            filter.mask(logits);
            self.unconstrained = unconstrained;
            return self.sample(logits, history);
        }
        self.unconstrained = unconstrained;
        token
    }

    /// The distribution a draw would be made from after steps 1–4, as
    /// `(token, probability)` pairs, most likely first (ties by lower id).
    ///
    /// Modifies `logits` like [`Sampler::sample`] and consumes no randomness.
    pub fn distribution(&mut self, logits: &mut [f32], history: &[TokenId]) -> Vec<(TokenId, f64)> {
        self.adjust(logits, history);
        if self.params.is_greedy() {
            return vec![(argmax(logits), 1.0)];
        }
        let scale = match self.select(logits) {
            Selection::Only(token) => return vec![(token, 1.0)],
            Selection::Candidates(scale) => scale,
            Selection::Whole(scale) => {
                self.collect_above(logits, f32::MIN);
                scale
            }
        };
        let total: f64 = self
            .candidates
            .iter()
            .map(|c| f64::from(scale.weight(c.logit)))
            .sum();
        self.candidates
            .iter()
            .map(|c| (c.id, f64::from(scale.weight(c.logit)) / total))
            .filter(|&(_, p)| p > 0.0)
            .collect()
    }

    /// Steps 1 and 2: bias and penalties, in place.
    fn adjust(&mut self, logits: &mut [f32], history: &[TokenId]) {
        assert!(!logits.is_empty(), "cannot sample from an empty vocabulary");
        for (&token, &bias) in &self.params.logit_bias {
            if let Some(logit) = logits.get_mut(token as usize) {
                *logit += bias;
            }
        }
        let p = &self.params;
        if !p.has_penalties() || history.is_empty() {
            return;
        }
        let last_n = match p.penalty_last_n as usize {
            0 => history.len(),
            n => n.min(history.len()),
        };
        // Sorting a copy of the window groups equal tokens: counts without a map.
        self.window.clear();
        self.window
            .extend_from_slice(&history[history.len() - last_n..]);
        self.window.sort_unstable();
        for run in self.window.chunk_by(|a, b| a == b) {
            let Some(logit) = logits.get_mut(run[0] as usize) else {
                continue;
            };
            if p.repetition_penalty != 1.0 {
                if *logit > 0.0 {
                    *logit /= p.repetition_penalty;
                } else {
                    *logit *= p.repetition_penalty;
                }
            }
            *logit -= p.presence_penalty + p.frequency_penalty * run.len() as f32;
        }
    }

    /// Step 4: temperature, top-k, top-p, min-p. Leaves the sorted survivors in
    /// `candidates` unless no filter is active.
    fn select(&mut self, logits: &[f32]) -> Selection {
        let p = Filters::of(&self.params);
        let max = kernels::max_logit(logits);
        if max == f32::NEG_INFINITY {
            return Selection::Only(argmax(logits));
        }
        let scale = Scale {
            max,
            inv_temp: 1.0 / p.temperature,
        };
        let vocab = logits.len();
        let top_k = match p.top_k {
            k if k <= 0 => vocab,
            k => (k as usize).min(vocab),
        };
        let top_p = f64::from(p.top_p);
        if top_k == vocab && top_p >= 1.0 && p.min_p <= 0.0 {
            return Selection::Whole(scale);
        }

        // Every survivor lies at or above min-p's floor: p_i >= min_p·p_max.
        let min_p_floor = if p.min_p > 0.0 {
            max + p.min_p.ln() * p.temperature
        } else {
            f32::MIN
        };
        // Find a floor whose tokens contain every survivor: top-k's k tokens, or
        // (without top-k) top-p's mass. Widen it until that holds.
        let mut window = FIRST_WINDOW * p.temperature;
        let (floor, whole_mass) = loop {
            let floor = (max - window).max(min_p_floor);
            let (enough, total) = if top_k < vocab {
                (kernels::count_above(logits, floor) >= top_k, 0.0)
            } else if top_p < 1.0 {
                let mass = kernels::mass_above(logits, floor, scale);
                (mass.above >= top_p * mass.total, mass.total)
            } else {
                (false, 0.0) // only min-p: its floor is the answer
            };
            if enough || floor == min_p_floor {
                break (floor, total);
            }
            window *= 4.0;
        };
        self.collect_above(logits, floor);

        let mut kept = self.candidates.len().min(top_k);
        if top_p < 1.0 {
            let weight = |c: &Candidate| f64::from(scale.weight(c.logit));
            // After top-k, top-p renormalises over top-k's survivors.
            let mass = if top_k < vocab {
                self.candidates[..kept].iter().map(weight).sum()
            } else {
                whole_mass
            };
            let target = top_p * mass;
            let mut cumulative = 0.0;
            if let Some(cut) = self.candidates[..kept].iter().position(|c| {
                cumulative += weight(c);
                cumulative >= target
            }) {
                kept = cut + 1;
            }
        }
        if p.min_p > 0.0 {
            kept = self.candidates[..kept]
                .iter()
                .take_while(|c| c.logit >= min_p_floor)
                .count();
        }
        self.candidates.truncate(kept.max(1));
        Selection::Candidates(scale)
    }

    /// Fills `candidates` with the tokens whose logit is at least `floor`, sorted.
    fn collect_above(&mut self, logits: &[f32], floor: f32) {
        self.candidates.clear();
        self.candidates
            .extend(
                logits
                    .iter()
                    .enumerate()
                    .filter(|&(_, &l)| l >= floor)
                    .map(|(id, &logit)| Candidate {
                        logit,
                        id: id as TokenId,
                    }),
            );
        self.candidates.sort_unstable_by(by_likelihood);
    }

    fn draw_from_candidates(&mut self, scale: Scale) -> TokenId {
        let total: f64 = self
            .candidates
            .iter()
            .map(|c| f64::from(scale.weight(c.logit)))
            .sum();
        let target = self.rng.next_f64() * total;
        let mut cumulative = 0.0;
        for c in &self.candidates {
            cumulative += f64::from(scale.weight(c.logit));
            if cumulative > target {
                return c.id;
            }
        }
        self.candidates[0].id
    }

    /// Plain temperature sampling over the whole vocabulary, in id order: block
    /// sums locate the block holding the draw, then that block is walked.
    fn draw_from_vocabulary(&mut self, logits: &[f32], scale: Scale) -> TokenId {
        let total = kernels::block_weights(logits, scale, &mut self.block_sums);
        let mut target = self.rng.next_f64() * total;
        let mut last_possible = None;
        for (index, &sum) in self.block_sums.iter().enumerate() {
            if sum <= 0.0 {
                continue;
            }
            let start = index * kernels::BLOCK;
            let block = &logits[start..(start + kernels::BLOCK).min(logits.len())];
            if target >= sum {
                target -= sum;
                last_possible = Some((start, block));
                continue;
            }
            if let Some(id) = walk(block, scale, target) {
                return (start + id) as TokenId;
            }
            last_possible = Some((start, block));
            break;
        }
        // Rounding left the target unreached: the last possible token takes it.
        last_possible
            .and_then(|(start, block)| {
                block
                    .iter()
                    .rposition(|&l| scale.weight(l) > 0.0)
                    .map(|i| start + i)
            })
            .unwrap_or(0) as TokenId
    }
}

/// First index in `block` where the running weight exceeds `target`.
fn walk(block: &[f32], scale: Scale, target: f64) -> Option<usize> {
    let mut cumulative = 0.0;
    block.iter().position(|&l| {
        cumulative += f64::from(scale.weight(l));
        cumulative > target
    })
}

/// Index of the largest logit, lowest index on ties, NaN ignored.
pub fn argmax(logits: &[f32]) -> TokenId {
    kernels::argmax(logits) as TokenId
}
