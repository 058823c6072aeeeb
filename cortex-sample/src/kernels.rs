//! Whole-vocabulary passes, written so the compiler vectorises them: fixed
//! lanes of independent accumulators, no branches, only IEEE add/mul/min/max.
//! Each pass visits the logits in a fixed order, so results are bit-identical
//! on every machine.

use crate::fastexp;

const LANES: usize = 16;

/// Turns a logit into an unnormalised probability `e^((l - max) / T)`;
/// NaN and -∞ logits weigh 0.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Scale {
    pub(crate) max: f32,
    pub(crate) inv_temp: f32,
}

impl Scale {
    #[inline(always)]
    pub(crate) fn weight(self, logit: f32) -> f32 {
        let w = fastexp::exp((logit - self.max) * self.inv_temp);
        // NaN and -∞ fail this comparison.
        if logit >= f32::MIN { w } else { 0.0 }
    }
}

/// The largest logit, NaN ignored (-∞ when there is none).
pub(crate) fn max_logit(logits: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = logits.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (lane, &l) in lanes.iter_mut().zip(chunk) {
            // `>` is false for NaN: one compare-and-select, no NaN fix-up.
            *lane = if l > *lane { l } else { *lane };
        }
    }
    tail.iter()
        .chain(&lanes)
        .fold(f32::NEG_INFINITY, |m, &l| if l > m { l } else { m })
}

/// Index of the largest logit, lowest index on ties, NaN ignored; with
/// nothing above -∞, the first -∞ token, else (all NaN) token 0. Two passes:
/// the maximum (one compare-and-select a lane), then the first position that
/// holds it, which stops there and rereads a row the first pass left in
/// cache. One pass carrying indices in its lanes ran at a third of the speed
/// of memory on a row of Gemma's 262,144 logits.
pub(crate) fn argmax(logits: &[f32]) -> usize {
    let best = max_logit(logits);
    first_position_of(logits, best).unwrap_or(0)
}

/// The first index holding exactly `value` (never one holding NaN).
fn first_position_of(logits: &[f32], value: f32) -> Option<usize> {
    const STRIDE: usize = LANES * 4;
    let chunks = logits.chunks_exact(STRIDE);
    let tail_start = logits.len() - chunks.remainder().len();
    for (chunk_index, chunk) in chunks.enumerate() {
        // A fold without early exit vectorises; only a hit looks closer.
        if chunk.iter().fold(false, |hit, &l| hit | (l == value)) {
            let offset = chunk.iter().position(|&l| l == value)?;
            return Some(chunk_index * STRIDE + offset);
        }
    }
    logits[tail_start..]
        .iter()
        .position(|&l| l == value)
        .map(|offset| tail_start + offset)
}

/// How many logits are at or above `floor` (no exponentials needed).
pub(crate) fn count_above(logits: &[f32], floor: f32) -> usize {
    let mut lanes = [0u32; LANES];
    let mut count = 0;
    for block in logits.chunks(LANES * 4096) {
        let chunks = block.chunks_exact(LANES);
        count += chunks.remainder().iter().filter(|&&l| l >= floor).count();
        for chunk in chunks {
            for (lane, &l) in lanes.iter_mut().zip(chunk) {
                *lane += u32::from(l >= floor);
            }
        }
    }
    count + lanes.iter().map(|&c| c as usize).sum::<usize>()
}

/// Weight of the logits at or above `floor`, and of the whole vocabulary.
pub(crate) struct Mass {
    pub(crate) above: f64,
    pub(crate) total: f64,
}

pub(crate) fn mass_above(logits: &[f32], floor: f32, scale: Scale) -> Mass {
    let mut mass = [0f32; LANES];
    let mut total = [0f32; LANES];
    let mut result = Mass {
        above: 0.0,
        total: 0.0,
    };
    // Blocks keep the f32 lane sums short (accurate); blocks add up in f64.
    for block in logits.chunks(LANES * 64) {
        let chunks = block.chunks_exact(LANES);
        let tail = chunks.remainder();
        for chunk in chunks {
            for i in 0..LANES {
                let l = chunk[i];
                let w = scale.weight(l);
                mass[i] += if l >= floor { w } else { 0.0 };
                total[i] += w;
            }
        }
        for &l in tail {
            let w = scale.weight(l);
            if l >= floor {
                result.above += f64::from(w);
            }
            result.total += f64::from(w);
        }
        for i in 0..LANES {
            result.above += f64::from(mass[i]);
            result.total += f64::from(total[i]);
        }
        mass = [0.0; LANES];
        total = [0.0; LANES];
    }
    result
}

/// Weight of each block of [`BLOCK`] logits, into `sums`; returns the total.
pub(crate) const BLOCK: usize = LANES * 16;

pub(crate) fn block_weights(logits: &[f32], scale: Scale, sums: &mut Vec<f64>) -> f64 {
    sums.clear();
    for block in logits.chunks(BLOCK) {
        let mut lanes = [0f32; LANES];
        let chunks = block.chunks_exact(LANES);
        let tail = chunks.remainder();
        for chunk in chunks {
            for (lane, &l) in lanes.iter_mut().zip(chunk) {
                *lane += scale.weight(l);
            }
        }
        let sum = tail
            .iter()
            .map(|&l| f64::from(scale.weight(l)))
            .sum::<f64>()
            + lanes.iter().map(|&w| f64::from(w)).sum::<f64>();
        sums.push(sum);
    }
    sums.iter().sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SampleRng;

    fn naive_argmax(logits: &[f32]) -> usize {
        let mut best = 0;
        for (i, &l) in logits.iter().enumerate() {
            if l > logits[best] || logits[best].is_nan() && !l.is_nan() {
                best = i;
            }
        }
        best
    }

    #[test]
    fn lane_kernels_agree_with_plain_loops() {
        let mut rng = SampleRng::new(3);
        for len in [1, 5, 16, 17, 100, 1000, 4099] {
            for _ in 0..20 {
                // Few distinct values, so ties across lanes are common.
                let logits: Vec<f32> = (0..len).map(|_| (rng.next_u64() % 7) as f32).collect();
                assert_eq!(argmax(&logits), naive_argmax(&logits), "{logits:?}");
                let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                assert_eq!(max_logit(&logits), max);
                let floor = 3.0;
                assert_eq!(
                    count_above(&logits, floor),
                    logits.iter().filter(|&&l| l >= floor).count()
                );
                let scale = Scale { max, inv_temp: 1.0 };
                let mass = mass_above(&logits, floor, scale);
                let want: f64 = logits
                    .iter()
                    .filter(|&&l| l >= floor)
                    .map(|&l| f64::from(scale.weight(l)))
                    .sum();
                // Lanes add in f32 within a block: agreement to f32 precision.
                assert!(
                    (mass.above - want).abs() < 1e-6 * want.max(1.0),
                    "{} vs {want}",
                    mass.above
                );
            }
        }
        let mut with_nan = vec![1.0f32; 40];
        with_nan[0] = f32::NAN;
        with_nan[33] = 2.0;
        assert_eq!(argmax(&with_nan), 33);
        assert_eq!(argmax(&[f32::NEG_INFINITY; 20]), 0);
        let mut nan_then_infinite = vec![f32::NAN; 70];
        nan_then_infinite[66] = f32::NEG_INFINITY;
        assert_eq!(argmax(&nan_then_infinite), 66);
        assert_eq!(argmax(&[f32::NAN; 70]), 0);
    }
}
