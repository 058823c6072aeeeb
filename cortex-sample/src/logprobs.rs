//! Log probabilities of tokens under a row of logits (a log-softmax), for
//! requests that report them.

use cortex_request::TokenId;

/// The log probability reported for a token that could not have been drawn
/// (OpenAI's value for "as good as impossible").
pub const IMPOSSIBLE: f32 = -9999.0;

/// The log probability of `chosen` and of the `top` most likely tokens
/// (most likely first, ties by lower id) under the softmax of `logits`.
/// Impossible tokens (-inf, e.g. masked by a grammar) are never among the
/// alternatives; an impossible `chosen` gets [`IMPOSSIBLE`] rather than -inf,
/// which JSON cannot carry.
///
/// ```
/// let (chosen, top) = cortex_sample::logprobs(&[0.0, 2.0_f32.ln(), f32::NEG_INFINITY], 0, 2);
/// assert!((chosen - (1.0_f32 / 3.0).ln()).abs() < 1e-6);
/// assert_eq!(top.iter().map(|(t, _)| *t).collect::<Vec<_>>(), [1, 0]);
/// ```
///
/// # Panics
/// If `logits` is empty or `chosen` is not in it.
pub fn logprobs(logits: &[f32], chosen: TokenId, top: usize) -> (f32, Vec<(TokenId, f32)>) {
    let finite = |l: f32| if l.is_finite() { l } else { IMPOSSIBLE };
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| f64::from(l - max).exp()).sum();
    let log_norm = f64::from(max) + sum.ln();
    let logprob = |l: f32| (f64::from(l) - log_norm) as f32;
    if top == 0 {
        return (finite(logprob(logits[chosen as usize])), Vec::new());
    }
    let mut best: Vec<TokenId> = (0..logits.len() as TokenId).collect();
    let k = top.min(best.len());
    let by_logit = |a: &TokenId, b: &TokenId| {
        logits[*b as usize]
            .total_cmp(&logits[*a as usize])
            .then(a.cmp(b))
    };
    if k > 0 && k < best.len() {
        best.select_nth_unstable_by(k - 1, by_logit);
    }
    best.truncate(k);
    best.sort_unstable_by(by_logit);
    let top = best
        .into_iter()
        .map(|t| (t, logprob(logits[t as usize])))
        .filter(|(_, l)| l.is_finite())
        .collect();
    (finite(logprob(logits[chosen as usize])), top)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_probabilities_normalise_and_rank() {
        let logits = [1.0_f32, 3.0, 2.0, 3.0, -1.0];
        let (chosen, top) = logprobs(&logits, 2, 3);
        let total: f64 = logits
            .iter()
            .map(|&l| f64::from(logprobs(&logits, 0, 0).0 - logits[0] + l).exp())
            .sum();
        assert!((total - 1.0).abs() < 1e-5, "{total}");
        assert_eq!(top.iter().map(|(t, _)| *t).collect::<Vec<_>>(), [1, 3, 2]);
        assert!((top[2].1 - chosen).abs() < 1e-7);
        assert!(top[0].1 > top[2].1);
        assert!(logprobs(&logits, 0, 0).1.is_empty());
        assert_eq!(logprobs(&logits, 0, 99).1.len(), 5);
        let masked = [f32::NEG_INFINITY, 0.0, f32::NEG_INFINITY];
        assert_eq!(logprobs(&masked, 1, 3), (0.0, vec![(1, 0.0)]));
        assert_eq!(logprobs(&masked, 0, 0).0, IMPOSSIBLE);
    }
}
