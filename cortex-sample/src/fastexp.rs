//! `exp` in plain f32 arithmetic.
//!
//! Softmax over a 49k vocabulary is the hot loop of sampling. The platform
//! `expf` is a library call the compiler cannot vectorise and whose last bit may
//! differ between C libraries; this version is branch-free (it vectorises) and
//! uses only IEEE add/mul, so it gives the same bits everywhere.

/// `e^x` with a relative error below 2e-7 for `x` in `[-87, 88]`; `x` is clamped to that range.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split in a part exact in f32 and a remainder (Cody–Waite).
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let x = x.clamp(-87.0, 88.0);
    // Round to nearest with the 1.5·2^23 trick: plain adds, so it vectorises
    // even where the target has no rounding instruction.
    const ROUNDER: f32 = 12_582_912.0;
    let n = (x * LOG2E + ROUNDER) - ROUNDER;
    let r = x - n * LN2_HI - n * LN2_LO;
    // Minimax polynomial for e^r on [-ln2/2, ln2/2] (Cephes expf).
    let mut p = 1.987_569_1e-4_f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 5e-1;
    let er = p * r * r + r + 1.0;
    // 2^n by building the exponent bits; n is in [-126, 127] after the clamp.
    // Adding 2^23 + 127 leaves the biased exponent n + 127 in the low mantissa
    // bits: a bit-cast, where an `as` cast would saturate and not vectorise.
    let biased = (n + 8_388_735.0).to_bits() & 0xFF;
    let scale = f32::from_bits(biased << 23);
    er * scale
}

#[cfg(test)]
mod tests {
    #[test]
    fn matches_std_exp() {
        let mut x = -87.0f32;
        while x <= 88.0 {
            let want = x.exp();
            let got = super::exp(x);
            let rel = ((got - want) / want).abs();
            assert!(rel < 2e-7, "exp({x}) = {got}, want {want}, rel {rel}");
            x += 0.013;
        }
        assert_eq!(super::exp(0.0), 1.0);
        assert_eq!(super::exp(f32::NEG_INFINITY), super::exp(-87.0));
    }
}
