//! The numerics contract of the quantized all-reduce, written once.
//!
//! Every hop of the ring and the final all-gather quantize with
//! [`quantize_block`]; the emitted HLO (`passes/quantized_all_reduce/emit.rs`)
//! performs exactly these operations, and this Rust version is the
//! reference the tests and the simulator hold it to.
//!
//! - **Blocks.** Symmetric absmax per block of `B` consecutive elements.
//! - **Scale.** `scale = absmax · fl(1/127)`: a multiplication by the f32
//!   reciprocal, not a division, because XLA rewrites division by a constant
//!   into that multiplication on some backends; writing it explicitly makes
//!   every backend compute the same bits. The f32 scale then keeps only its
//!   top 17 significant bits (the low 7 mantissa bits are cleared, rounding
//!   toward zero): a 7-bit code times a 17-bit scale is exact in f32, so a
//!   hop's `code·scale + partial` is one rounding whether or not a backend
//!   fuses it into a multiply-add. The scale shrinks by at most 2⁻¹⁷ of
//!   itself, which only lets `|v/scale|` reach 127.002 before the clamp.
//! - **Codes.** `q = clamp(round_nearest_even(v · r), -127, 127)` as s8,
//!   with one reciprocal `r = fl(1/scale)` per block (XLA turns a division
//!   by a broadcast scalar into exactly that, and only sometimes, so the
//!   emitted HLO spells it out). An all-zero block has `scale = 0`, `r = 0`
//!   and `q = 0`.
//! - **Dequantize.** `q · scale` in f32. Sums are accumulated in f32, never in
//!   the narrow type.
//! - **Non-finite input.** A NaN or Inf makes its block's absmax, hence its
//!   scale, non-finite; `q · scale` is then NaN or Inf for the whole block,
//!   and stays so through every later hop. Never a finite wrong value.
//! - **Bit-identical participants.** The owner of a chunk does not keep its
//!   f32 sum: it quantizes it once and every participant, the owner
//!   included, dequantizes the same int8 codes and scales with the same
//!   operation.

pub mod error;
pub mod simulate;

/// How the scales travel: f32, or rounded to bf16 (the codes are then
/// computed against the rounded scale, so codes and scale agree).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum ScaleType {
    F32,
    Bf16,
}

impl ScaleType {
    pub fn bytes(self) -> usize {
        match self {
            ScaleType::F32 => 4,
            ScaleType::Bf16 => 2,
        }
    }
}

/// Largest code magnitude: codes lie in `[-127, 127]` (symmetric, no -128).
pub const QMAX: f32 = 127.0;

/// `fl(1/127)`, the f32 constant the scale is computed with.
pub const INV_QMAX: f32 = 1.0 / 127.0;

/// Keeps an f32's sign, exponent and top 16 mantissa bits (17 significant
/// bits with the implicit one).
pub const SCALE_MASK: u32 = 0xFFFF_FF80;

/// The scale of a block: `absmax · fl(1/127)`, rounded to the scale type;
/// NaN if the block holds one.
pub fn block_scale(v: &[f32], scale_type: ScaleType) -> f32 {
    // f32::max ignores NaN; XLA's maximum propagates it, and so do we.
    let absmax = v.iter().fold(0.0f32, |m, &x| {
        if m.is_nan() || x.is_nan() {
            f32::NAN
        } else {
            m.max(x.abs())
        }
    });
    let scale = absmax * INV_QMAX;
    match scale_type {
        ScaleType::F32 => f32::from_bits(scale.to_bits() & SCALE_MASK),
        ScaleType::Bf16 => half::bf16::from_f32(scale).to_f32(),
    }
}

/// Quantizes one block: codes and the block's scale.
pub fn quantize_block(v: &[f32], scale_type: ScaleType) -> (Vec<i8>, f32) {
    let scale = block_scale(v, scale_type);
    let recip = if scale == 0.0 { 0.0 } else { 1.0 / scale };
    let codes = v.iter().map(|&x| code(x, recip)).collect();
    (codes, scale)
}

/// One element's code, given the block's reciprocal scale `recip`.
pub fn code(x: f32, recip: f32) -> i8 {
    let q = (x * recip).round_ties_even().clamp(-QMAX, QMAX);
    // XLA converts NaN to 0 (the dequantized block is NaN through the scale).
    if q.is_nan() { 0 } else { q as i8 }
}

/// Dequantizes codes with their block's scale.
pub fn dequantize(codes: &[i8], scale: f32) -> impl Iterator<Item = f32> + '_ {
    codes.iter().map(move |&q| f32::from(q) * scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_symmetric_and_round_to_even() {
        // absmax 127 → scale ≈ 1; 2.5 → 2, 3.5 → 4 (ties to even).
        let (q, s) = quantize_block(&[127.0, -127.0, 2.5, 3.5, 0.0], ScaleType::F32);
        assert!((s - 1.0).abs() < 1e-6);
        assert_eq!(q[0], 127);
        assert_eq!(q[1], -127);
        assert_eq!(&q[2..], &[2, 4, 0]);
    }

    #[test]
    fn zero_block_has_zero_scale_and_codes() {
        let (q, s) = quantize_block(&[0.0; 8], ScaleType::F32);
        assert_eq!(s, 0.0);
        assert!(q.iter().all(|&c| c == 0));
    }

    #[test]
    fn non_finite_blocks_dequantize_non_finite() {
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let (q, s) = quantize_block(&[1.0, bad, -2.0], ScaleType::F32);
            assert!(dequantize(&q, s).all(|x| !x.is_finite()), "{bad}");
        }
    }

    #[test]
    fn code_times_scale_is_exact() {
        for absmax in [1.0f32, 3.7, 1e-20, 6.5e4, 123.456] {
            let s = block_scale(&[absmax], ScaleType::F32);
            for q in -127i32..=127 {
                let p = q as f32 * s;
                assert_eq!(f64::from(p), f64::from(q) * f64::from(s), "q={q} s={s}");
            }
        }
    }

    #[test]
    fn error_is_within_half_a_step() {
        let v: Vec<f32> = (0..128).map(|i| ((i * 37) % 101) as f32 - 50.0).collect();
        let (q, s) = quantize_block(&v, ScaleType::F32);
        for (x, y) in v.iter().zip(dequantize(&q, s)) {
            assert!((x - y).abs() <= s * 0.5 + 1e-6);
        }
    }
}
