//! The numerics contract of the quantized all-reduce, written once.
//!
//! Every hop of the ring and the final all-gather quantize with
//! [`quantize_block`]; the emitted HLO (`passes/quantize_collectives/emit/`)
//! performs exactly these operations, and this Rust version is the
//! reference the tests and the simulator hold it to.
//!
//! - **Blocks.** Symmetric absmax per block of `B` consecutive elements.
//! - **Scale.** `scale = absmax · fl(1/127)`: a multiplication by the f32
//!   reciprocal, not a division, because XLA rewrites division by a constant
//!   into that multiplication on some backends; writing it explicitly makes
//!   every backend compute the same bits. The scale is then rounded (to
//!   nearest, ties to even; HLO `reduce-precision`) to the bits that travel:
//!   bf16's 8 significant bits, or 17 for f32 scales. A 7-bit code times a
//!   scale of at most 17 significant bits is exact in f32, so a hop's
//!   `code·scale + partial` is one rounding whether or not a backend fuses
//!   it into a multiply-add. Rounding down can make `|v/scale|` reach 127.5
//!   before the clamp.
//!   The absmax is taken as at least [`absmax_floor`] (`2^⌈log2 qmax⌉ ·
//!   2⁻¹²⁶`; the initial value of the max reduction), so the scale is never
//!   below the smallest normal f32, `2⁻¹²⁶`: a block of tiny values keeps
//!   its codes on backends that flush subnormals to zero (XLA:CPU does),
//!   instead of coming out as zeros.
//! - **Codes.** `q = clamp(round_nearest_even(v · r), -127, 127)` as s8,
//!   with one reciprocal `r = fl(1/scale)` per block (XLA turns a division
//!   by a broadcast scalar into exactly that, and only sometimes, so the
//!   emitted HLO spells it out). An all-zero block has a scale just above
//!   `2⁻¹²⁶` and `q = 0`.
//! - **Dequantize.** `q · scale` in f32. Sums are accumulated in f32, never in
//!   the narrow type.
//! - **Rotation.** With `--rotation hadamard` every block is multiplied by
//!   the orthonormal Hadamard matrix `H_B/√B` once, before the first
//!   quantization, and by it again (it is its own inverse) after the last
//!   dequantization. Forward, each output is a sum of ±inputs over the
//!   block taken in index order (XLA:CPU's dot order), times `fl(1/√B)`.
//!   Back, the integer codes are rotated first and scaled after,
//!   `(H·q)·(scale·fl(1/√B))`: the integer sums are exact in f32 in any
//!   order, so every backend and the simulator agree. For B a power of
//!   four, `1/√B` is a power of two and the matrix holds it
//!   ([`norm_folds`]): each term is `x·(±1/√B)`, exact, so the forward sum
//!   is the same sum scaled (it only overflows later), and back, the
//!   scale multiplies `H·q/√B` (exact) once. One multiply fewer per
//!   element each way.
//! - **Non-finite input.** A NaN or Inf counts as an infinite magnitude, so
//!   its block's absmax and scale are Inf. Backends' vectorized float max
//!   reductions may drop a NaN (XLA:CPU's do from 64 rows on), so the HLO
//!   takes the absmax with one integer max instead: over the bits of `|x|`
//!   (the sign bit cleared), which order as the magnitudes do and put every
//!   NaN above +Inf, capped at +Inf's bits. The reciprocal is then 0, every
//!   code 0, and `0 · Inf` makes the whole block NaN, through every later
//!   hop. Never a finite wrong value. Rotation spreads a NaN or Inf over
//!   its whole block first.
//! - **Bit-identical participants.** The owner of a chunk does not keep its
//!   f32 sum: it quantizes it once and every participant, the owner
//!   included, dequantizes the same int8 codes and scales with the same
//!   operation.

pub mod check;
pub mod error;
pub mod profile;
pub mod simulate;

pub use crate::plan::{Quant, QuantFormat, ScaleType};

use crate::proto::PrimitiveType;

/// The element types equarx quantizes: the floating-point types whose
/// values f32 holds exactly. The one list: the options, eligibility and
/// the error model read it.
pub const QUANTIZABLE: &[PrimitiveType] =
    &[PrimitiveType::Bf16, PrimitiveType::F16, PrimitiveType::F32];

/// Explicit mantissa bits of a quantizable type (bf16: 7): the precision
/// a result is rounded to in its own type, which the error model adds.
pub fn mantissa_bits(ty: i32) -> u32 {
    match PrimitiveType::try_from(ty) {
        Ok(PrimitiveType::Bf16) => 7,
        Ok(PrimitiveType::F16) => 10,
        _ => 23,
    }
}

/// `fl(1/qmax)`, the f32 constant a format's scale is computed with.
pub fn inv_qmax(format: QuantFormat) -> f32 {
    1.0 / format.qmax()
}

/// Significant bits the scale keeps, by scale type (without the implicit
/// one: HLO `reduce-precision`'s `mantissa_bits`).
pub fn scale_mantissa_bits(scale_type: ScaleType) -> u32 {
    match scale_type {
        ScaleType::F32 => 16,
        ScaleType::Bf16 => 7,
    }
}

/// HLO `reduce-precision(x)` with f32's exponent and `mantissa_bits`:
/// rounds to nearest, ties to even; NaN stays NaN.
pub fn reduce_precision(x: f32, mantissa_bits: u32) -> f32 {
    if x.is_nan() || mantissa_bits >= 23 {
        return x;
    }
    let drop = 23 - mantissa_bits;
    let bits = x.to_bits();
    let lsb = (bits >> drop) & 1;
    let rounded = bits.wrapping_add((1 << (drop - 1)) - 1 + lsb) & !((1u32 << drop) - 1);
    f32::from_bits(rounded)
}

/// The least absmax a scale is computed from: the power of two at or above
/// `qmax`, times 2⁻¹²⁶. Its scale is at least 2⁻¹²⁶ (`2^⌈log2 qmax⌉/qmax`
/// is at least 1.0079 for every format, more than `fl(1/qmax)`'s rounding
/// takes away, and rounding to the scale type cannot pass below the normal
/// 2⁻¹²⁶): a block of tiny values keeps its codes on backends that flush
/// subnormals, and an all-zero block has a finite reciprocal. As the
/// initial value of the absmax reduction the floor costs no instruction.
pub fn absmax_floor(format: QuantFormat) -> f32 {
    let up = format.qmax().log2().ceil() as i32;
    2f32.powi(up - 126)
}

/// The scale of a block: `max(absmax, floor) · fl(1/qmax)`, rounded to the
/// scale type; infinite if the block holds a NaN or an Inf.
pub fn block_scale(v: &[f32], quant: Quant) -> f32 {
    let absmax = v.iter().fold(absmax_floor(quant.format), |m, &x| {
        m.max(if x.is_finite() {
            x.abs()
        } else {
            f32::INFINITY
        })
    });
    let raw = absmax * inv_qmax(quant.format);
    reduce_precision(raw, scale_mantissa_bits(quant.scale))
}

/// Quantizes one block: the codes' values (small integers, or the values
/// of 8-bit floats) and the block's scale.
pub fn quantize_block(v: &[f32], quant: Quant) -> (Vec<f32>, f32) {
    let scale = block_scale(v, quant);
    let recip = 1.0 / scale;
    let codes = v.iter().map(|&x| code(x, recip, quant.format)).collect();
    (codes, scale)
}

/// One element's code value, given the block's reciprocal scale.
/// Integers: round to nearest even, clamp; XLA converts NaN to 0 (the
/// dequantized block is NaN through the scale). fp8: clamp, then the
/// format's own rounding (to nearest even) as XLA's convert does.
pub fn code(x: f32, recip: f32, format: QuantFormat) -> f32 {
    let q = format.qmax();
    let v = x * recip;
    match format {
        QuantFormat::Int8 | QuantFormat::Int4 => {
            let c = v.round_ties_even().clamp(-q, q);
            // An integer has no -0: a small negative value's code is +0.
            if c.is_nan() { 0.0 } else { c + 0.0 }
        }
        QuantFormat::Fp8E4m3 => float8::F8E4M3::from_f32(v.clamp(-q, q)).to_f32(),
        QuantFormat::Fp8E5m2 => float8::F8E5M2::from_f32(v.clamp(-q, q)).to_f32(),
    }
}

/// Dequantizes codes with their block's scale.
pub fn dequantize(codes: &[f32], scale: f32) -> impl Iterator<Item = f32> + '_ {
    codes.iter().map(move |&q| q * scale)
}

/// `fl(1/√B)`, the factor that makes `H_B` orthonormal (exact for B a
/// power of four).
pub fn hadamard_norm(block: usize) -> f32 {
    (1.0 / (block as f64).sqrt()) as f32
}

/// Whether the rotation's matrix holds its norm: for B a power of four
/// `fl(1/√B)` is an exact power of two, so `±1/√B` entries scale every
/// term exactly and no separate multiply is needed.
pub fn norm_folds(block: usize) -> bool {
    block.is_power_of_two() && block.trailing_zeros() % 2 == 0
}

/// Entry `(k, j)` of the Sylvester Hadamard matrix: ±1, by the parity of
/// the bits `k` and `j` share.
pub fn hadamard_sign(k: usize, j: usize) -> f32 {
    if (k & j).count_ones() % 2 == 0 {
        1.0
    } else {
        -1.0
    }
}

/// Rotates one block forward: `y_j = (Σ_k x_k · H_kj) · fl(1/√B)`, the ±x
/// terms summed in index order (what XLA:CPU's dot does; the emitted HLO is
/// that dot, then one multiply), or `Σ_k x_k · (H_kj/√B)` where the matrix
/// holds the norm ([`norm_folds`]).
pub fn rotate_block(x: &[f32]) -> Vec<f32> {
    let n = hadamard_norm(x.len());
    let (entry, after) = if norm_folds(x.len()) {
        (n, 1.0)
    } else {
        (1.0, n)
    };
    (0..x.len())
        .map(|j| {
            let sum = x.iter().enumerate().fold(0.0f32, |acc, (k, &v)| {
                acc + v * (hadamard_sign(k, j) * entry)
            });
            sum * after
        })
        .collect()
}

/// Dequantizes a rotated block and rotates it back:
/// `(H·q)_j · (scale·fl(1/√B))`, the ±codes summed in index order (for
/// integer codes the sum is exact in any order), or `(H·q/√B)_j · scale`
/// where the matrix holds the norm.
pub fn dequantize_rotated(codes: &[f32], scale: f32) -> Vec<f32> {
    let n = hadamard_norm(codes.len());
    let (entry, s) = if norm_folds(codes.len()) {
        (n, scale)
    } else {
        (1.0, scale * n)
    };
    (0..codes.len())
        .map(|j| {
            let h = codes.iter().enumerate().fold(0.0f32, |acc, (k, &q)| {
                acc + q * (hadamard_sign(k, j) * entry)
            });
            h * s
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const INT8_F32: Quant = Quant {
        format: QuantFormat::Int8,
        scale: ScaleType::F32,
    };
    const INT8_BF16: Quant = Quant {
        format: QuantFormat::Int8,
        scale: ScaleType::Bf16,
    };

    #[test]
    fn every_format_keeps_the_absmax_and_its_range() {
        let v = [3.0f32, -1.5, 0.01, 0.0];
        for format in [
            QuantFormat::Int8,
            QuantFormat::Fp8E4m3,
            QuantFormat::Fp8E5m2,
            QuantFormat::Int4,
        ] {
            let quant = Quant {
                format,
                scale: ScaleType::F32,
            };
            let (q, s) = quantize_block(&v, quant);
            assert!(q.iter().all(|c| c.abs() <= format.qmax()), "{format:?}");
            let back: Vec<f32> = dequantize(&q, s).collect();
            assert!((back[0] - 3.0).abs() < 3.0 * 0.07, "{format:?}: {back:?}");
        }
        // fp8 keeps relative precision where int4 loses small values.
        let e4m3 = Quant {
            format: QuantFormat::Fp8E4m3,
            scale: ScaleType::F32,
        };
        let (q, s) = quantize_block(&v, e4m3);
        assert!((q[2] * s - 0.01).abs() < 0.01 * 0.07);
        let int4 = Quant {
            format: QuantFormat::Int4,
            scale: ScaleType::F32,
        };
        assert_eq!(quantize_block(&v, int4).0[2], 0.0);
    }

    #[test]
    fn codes_are_symmetric_and_round_to_even() {
        // absmax 127 → scale ≈ 1; 2.5 → 2, 3.5 → 4 (ties to even).
        let (q, s) = quantize_block(&[127.0, -127.0, 2.5, 3.5, 0.0], INT8_F32);
        assert!((s - 1.0).abs() < 1e-6);
        assert_eq!(q[0], 127.0);
        assert_eq!(q[1], -127.0);
        assert_eq!(&q[2..], &[2.0, 4.0, 0.0]);
    }

    #[test]
    fn zero_block_has_the_floor_scale_and_zero_codes() {
        for format in [
            QuantFormat::Int8,
            QuantFormat::Fp8E4m3,
            QuantFormat::Fp8E5m2,
            QuantFormat::Int4,
        ] {
            for scale in [ScaleType::F32, ScaleType::Bf16] {
                let (_, s) = quantize_block(&[0.0; 8], Quant { format, scale });
                assert!(
                    s.is_normal() && s < 1.2 * f32::MIN_POSITIVE,
                    "{format:?} {scale:?}: {s:e}"
                );
            }
        }
        let (q, s) = quantize_block(&[0.0; 8], INT8_F32);
        assert!(s.is_normal());
        assert!(q.iter().all(|&c| c == 0.0));
        assert!(dequantize(&q, s).all(|v| v == 0.0));
    }

    #[test]
    fn tiny_blocks_keep_their_codes() {
        // absmax 1e-37 would give a subnormal scale, flushed to zero by
        // backends that flush subnormals.
        let v = [1e-37f32, -5e-38, 0.0, 2e-38];
        let (q, s) = quantize_block(&v, INT8_BF16);
        assert!(s.is_normal());
        let back: Vec<f32> = dequantize(&q, s).collect();
        for (a, b) in v.iter().zip(&back) {
            assert!((a - b).abs() <= s, "{a} {b}");
            assert!(*b == 0.0 || b.is_normal());
        }
    }

    #[test]
    fn non_finite_blocks_dequantize_non_finite() {
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let (q, s) = quantize_block(&[1.0, bad, -2.0], INT8_F32);
            assert!(dequantize(&q, s).all(|x| !x.is_finite()), "{bad}");
        }
    }

    #[test]
    fn reduce_precision_rounds_to_nearest_even() {
        // 1 + 2^-8 is a tie between 1 and 1 + 2^-7 in bf16: even is 1.
        assert_eq!(reduce_precision(1.0 + 1.0 / 256.0, 7), 1.0);
        assert_eq!(reduce_precision(1.0 + 3.0 / 256.0, 7), 1.0 + 4.0 / 256.0);
        for x in [0.3f32, 1e-20, 6.5e4, -123.456] {
            assert_eq!(reduce_precision(x, 7), half::bf16::from_f32(x).to_f32());
        }
        assert!(reduce_precision(f32::NAN, 7).is_nan());
        assert_eq!(reduce_precision(f32::INFINITY, 16), f32::INFINITY);
    }

    #[test]
    fn rotation_is_orthonormal_and_its_own_inverse() {
        let x: Vec<f32> = (0..64).map(|i| ((i * 37) % 11) as f32 - 5.0).collect();
        let y = rotate_block(&x);
        let norm = |v: &[f32]| v.iter().map(|a| a * a).sum::<f32>();
        assert!((norm(&x) - norm(&y)).abs() < 1e-3);
        let back = rotate_block(&y);
        for (a, b) in x.iter().zip(&back) {
            assert!((a - b).abs() < 1e-5, "{a} {b}");
        }
        // One outlier spreads evenly over the block.
        let mut spike = vec![0.0f32; 64];
        spike[5] = 800.0;
        assert!(rotate_block(&spike).iter().all(|v| v.abs() == 100.0));
    }

    #[test]
    fn rotation_spreads_non_finite_values_over_the_block() {
        for bad in [f32::NAN, f32::INFINITY] {
            let mut x = vec![1.0f32; 64];
            x[3] = bad;
            assert!(rotate_block(&x).iter().all(|v| !v.is_finite()), "{bad}");
        }
        let (q, s) = quantize_block(&[f32::NAN; 64], INT8_BF16);
        assert!(dequantize_rotated(&q, s).iter().all(|v| v.is_nan()));
    }

    #[test]
    fn code_times_scale_is_exact() {
        for absmax in [1.0f32, 3.7, 1e-20, 6.5e4, 123.456] {
            let s = block_scale(&[absmax], INT8_F32);
            for q in -127i32..=127 {
                let p = q as f32 * s;
                assert_eq!(f64::from(p), f64::from(q) * f64::from(s), "q={q} s={s}");
            }
        }
    }

    #[test]
    fn error_is_within_half_a_step() {
        let v: Vec<f32> = (0..128).map(|i| ((i * 37) % 101) as f32 - 50.0).collect();
        let (q, s) = quantize_block(&v, INT8_F32);
        for (x, y) in v.iter().zip(dequantize(&q, s)) {
            assert!((x - y).abs() <= s * 0.5 + 1e-6);
        }
    }
}
