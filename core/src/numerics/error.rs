//! The error model: how far the quantized all-reduce lands from the exact
//! sum, predicted from the plan (and, for tests, from the data).
//!
//! Each quantization adds an error uniform in ±step/2 with
//! `step = absmax/127`, i.e. a variance of `absmax²/(12·127²)`. Write
//! `κ² = E[absmax²]/E[v²]` for a block's crest factor. A quantized value
//! that holds `k` independent device contributions of variance σ² has
//! variance `kσ²`, so it adds `κ²kσ²/(12·127²)` of error variance; the
//! complete sum has variance `Pσ²`. The plan says how many contributions
//! every quantization on a value's way held ([`Plan::noise_weight`]:
//! `w = Σk/P`), so
//!
//! ```text
//! relative RMS error = κ · sqrt(w / (12 · 127²))
//! ring: w = (P+1)/2    two-shot: w = 2    two-level P1×P2: w = (P1+P2)/2
//! ```
//!
//! Correlated contributions (the same values on every device) give a
//! smaller figure, so this one is the conservative choice. For Gaussian
//! data κ² depends only on the block size ([`gaussian_crest_sq`]), and a
//! rotation leaves Gaussian blocks Gaussian. Real activations with outlier
//! channels have larger κ (one outlier sets its block's step); rotated,
//! such a block's energy is spread evenly and its κ falls to the Gaussian
//! value or below. Rounding the result to the output type adds its own
//! error in quadrature ([`output_rounding_rel_rms`]).

use crate::plan::Plan;

/// Relative RMS error of quantizations with noise weight `w` in `format`:
/// an integer format's step follows the block's absmax (κ² matters, `q` its
/// largest code); a float format rounds every value to its own mantissa,
/// a relative error whatever the block's crest (values far below the block's
/// absmax lose more as subnormals; not modelled).
pub fn format_rel_rms(format: crate::plan::QuantFormat, w: f64, crest_sq: f64) -> f64 {
    match format.mantissa_bits() {
        Some(m) => output_rounding_rel_rms(m) * w.sqrt(),
        None => {
            let q = f64::from(format.qmax());
            (crest_sq * w / (12.0 * q * q)).sqrt()
        }
    }
}

/// The paper's ring over `p` ranks: `w = (P+1)/2`.
pub fn ring_rel_rms(p: usize, crest_sq: f64) -> f64 {
    format_rel_rms(
        crate::plan::QuantFormat::Int8,
        (p as f64 + 1.0) / 2.0,
        crest_sq,
    )
}

/// κ² = E[max of `block` |N(0,1)|²]: the crest factor of Gaussian blocks
/// (computed once per block size).
pub fn gaussian_crest_sq(block: usize) -> f64 {
    use std::collections::BTreeMap;
    use std::sync::{Mutex, OnceLock};
    static MEMO: OnceLock<Mutex<BTreeMap<usize, f64>>> = OnceLock::new();
    let memo = MEMO.get_or_init(Default::default);
    if let Some(&k) = memo.lock().unwrap_or_else(|e| e.into_inner()).get(&block) {
        return k;
    }
    let k = gaussian_crest_sq_uncached(block);
    memo.lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(block, k);
    k
}

fn gaussian_crest_sq_uncached(block: usize) -> f64 {
    // E[M²] = ∫ 2m · P(M > m) dm with P(M ≤ m) = erf(m/√2)^B.
    let b = block.max(1) as i32;
    let h = 1e-3;
    (0..14_000)
        .map(|i| {
            let m = (f64::from(i) + 0.5) * h;
            2.0 * m * (1.0 - erf(m / std::f64::consts::SQRT_2).powi(b)) * h
        })
        .sum()
}

/// Relative RMS error of rounding to an element type with `mantissa_bits`
/// explicit mantissa bits (bf16: 7, f32: 23), for values whose mantissas
/// are log-uniform: `2^-m / sqrt(12 · E[mantissa²])`.
pub fn output_rounding_rel_rms(mantissa_bits: u32) -> f64 {
    let e_m2 = 1.5 / std::f64::consts::LN_2; // E[m²], m log-uniform in [1, 2)
    2f64.powi(-(mantissa_bits as i32)) / (12.0 * e_m2).sqrt()
}

/// The predicted relative RMS error of `plan` on Gaussian data, including
/// rounding the result to a type with `mantissa_bits`.
pub fn predicted_rel_rms(plan: &Plan, mantissa_bits: u32) -> f64 {
    rel_rms_with_crest(plan, gaussian_crest_sq(plan.block()), mantissa_bits)
}

/// The model's relative RMS error of `plan` for blocks of crest factor
/// `crest_sq` (κ², e.g. measured on the data the quantizer sees), with the
/// result rounded to a type with `mantissa_bits`: the two in quadrature.
pub fn rel_rms_with_crest(plan: &Plan, crest_sq: f64, mantissa_bits: u32) -> f64 {
    let quant = format_rel_rms(plan.config.format, plan.noise_weight(), crest_sq);
    let out = output_rounding_rel_rms(mantissa_bits);
    (quant * quant + out * out).sqrt()
}

/// κ² measured on data: mean over blocks of absmax², over mean of v².
pub fn measured_crest_sq(v: &[f32], block: usize) -> f64 {
    let (mut sum_max_sq, mut sum_sq, mut blocks) = (0.0f64, 0.0f64, 0usize);
    for b in v.chunks(block.max(1)) {
        let m = b.iter().fold(0.0f64, |m, &x| m.max(f64::from(x).abs()));
        sum_max_sq += m * m;
        sum_sq += b.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>();
        blocks += 1;
    }
    if sum_sq == 0.0 {
        return 0.0;
    }
    (sum_max_sq / blocks as f64) / (sum_sq / v.len() as f64)
}

/// erf with absolute error below 1.2e-7 (Numerical Recipes' erfc Chebyshev
/// fit), enough for the crest integral.
fn erf(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -z * z - 1.265_512_23
        + t * (1.000_023_68
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98
                                + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let erfc = t * poly.exp();
    if x >= 0.0 { 1.0 - erfc } else { erfc - 1.0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::QuantFormat;

    #[test]
    fn gaussian_crest_matches_sampling() {
        // Monte-Carlo values (20000 blocks, numpy): 5.73, 8.15, 10.71.
        for (b, k) in [(32, 5.73), (128, 8.153), (512, 10.705)] {
            let got = gaussian_crest_sq(b);
            assert!((got - k).abs() / k < 0.02, "B={b}: {got} vs {k}");
        }
    }

    #[test]
    fn error_grows_with_group_and_block_size() {
        assert!(ring_rel_rms(8, 8.0) > ring_rel_rms(2, 8.0));
        assert!(
            format_rel_rms(QuantFormat::Int8, 2.0, gaussian_crest_sq(512))
                > format_rel_rms(QuantFormat::Int8, 2.0, gaussian_crest_sq(32))
        );
        // P = 8, B = 128: about 1.4 % for Gaussian data.
        let e = ring_rel_rms(8, gaussian_crest_sq(128));
        assert!((0.012..0.016).contains(&e), "{e}");
    }
}
