//! What the quantized collective is judged against: the same ring carried
//! in bf16, naive int8 with one scale per tensor, and the exact sum.

use crate::numerics::{Quant, QuantFormat, ScaleType, dequantize, quantize_block};

/// Baseline: a ring all-reduce carried in bf16, every hop's partial sum
/// rounded to bf16 (f32 add, then round).
pub fn bf16_ring(inputs: &[Vec<f32>]) -> Vec<f32> {
    let p = inputs.len();
    let n = inputs.first().map_or(0, Vec::len);
    let r = |x: f32| half::bf16::from_f32(x).to_f32();
    (0..n)
        .map(|i| {
            // The element's chunk owner does not change the rounding
            // sequence's shape: P−1 rounded adds in ring order.
            let owner = i * p / n.max(1);
            let mut acc = r(inputs[(owner + 1) % p][i]);
            for h in 2..=p {
                acc = r(acc + r(inputs[(owner + h) % p][i]));
            }
            acc
        })
        .collect()
}

/// Baseline: naive int8 with one scale per device tensor, dequantized and
/// summed in f32.
pub fn per_tensor_int8(inputs: &[Vec<f32>]) -> Vec<f32> {
    let n = inputs.first().map_or(0, Vec::len);
    let mut sum = vec![0.0f32; n];
    for x in inputs {
        let (q, s) = quantize_block(
            x,
            Quant {
                format: QuantFormat::Int8,
                scale: ScaleType::F32,
            },
        );
        sum.iter_mut()
            .zip(dequantize(&q, s))
            .for_each(|(a, v)| *a += v);
    }
    sum
}

/// The exact sum, accumulated in f64.
pub fn exact_sum(inputs: &[Vec<f32>]) -> Vec<f64> {
    let n = inputs.first().map_or(0, Vec::len);
    (0..n)
        .map(|i| inputs.iter().map(|x| f64::from(x[i])).sum())
        .collect()
}
