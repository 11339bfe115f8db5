//! A bit-exact reference of the emitted ring, and the baselines it is
//! judged against. `equarx simulate` prints their errors; a test holds the
//! reference to what XLA computes when it runs the rewritten module.
//!
//! The reference follows the emitted HLO op for op: the same chunks, lanes
//! and blocks ([`RingPlan`]), the same hop order (the chunk that rank `j`
//! ends up owning starts at rank `j + dir` and picks up one contribution per
//! hop, the owner's last), the same quantize and dequantize
//! ([`super::quantize_block`]), f32 accumulation with one add per hop.
//! Whether a backend contracts a hop's dequantize-multiply and add into one
//! fused multiply-add is its choice (XLA:CPU does for some hops and not for
//! others); the scale's 17-bit significand makes both give the same bits,
//! and `fma` lets the tests show it.

use super::{ScaleType, dequantize, quantize_block};
use crate::passes::quantized_all_reduce::plan::RingPlan;

/// A small deterministic generator (splitmix64): seeded, reproducible
/// inputs without extra crates.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1).
    pub fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    pub fn gaussian(&mut self) -> f64 {
        let (u, v) = (self.uniform(), self.uniform());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }
}

/// Synthetic per-device inputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Distribution {
    /// Standard normal.
    Gaussian,
    /// Student's t with 3 degrees of freedom: occasional large values
    /// anywhere.
    HeavyTailed,
    /// LLM activations: Gaussian with a few channels (1 in 64 of the last
    /// dimension, the same on every device) 100× larger.
    LlmActivations,
}

impl Distribution {
    /// `devices` inputs of `n` values (rows of `channels`), rounded to bf16
    /// when `bf16` (the all-reduce's operand type).
    pub fn generate(
        self,
        devices: usize,
        n: usize,
        channels: usize,
        bf16: bool,
        seed: u64,
    ) -> Vec<Vec<f32>> {
        let mut rng = Rng::new(seed);
        (0..devices)
            .map(|_| {
                (0..n)
                    .map(|i| {
                        let x = match self {
                            Distribution::Gaussian => rng.gaussian(),
                            Distribution::HeavyTailed => {
                                // t_3 = Z / sqrt(χ²_3 / 3)
                                let z = rng.gaussian();
                                let chi: f64 = (0..3).map(|_| rng.gaussian().powi(2)).sum();
                                z / (chi / 3.0).sqrt()
                            }
                            Distribution::LlmActivations => {
                                let x = rng.gaussian();
                                if (i % channels.max(1)) % 64 == 5 {
                                    100.0 * x
                                } else {
                                    x
                                }
                            }
                        };
                        let x = x as f32;
                        if bf16 {
                            half::bf16::from_f32(x).to_f32()
                        } else {
                            x
                        }
                    })
                    .collect()
            })
            .collect()
    }
}

/// What every rank holds after the quantized ring over `inputs` (one
/// payload per rank, all of the same length), before rounding to the
/// output type.
pub fn quantized_ring(inputs: &[Vec<f32>], plan: &RingPlan, fma: bool) -> Vec<f32> {
    let p = plan.group_size;
    let n = inputs.first().map_or(0, Vec::len);
    let padded: Vec<Vec<f32>> = inputs
        .iter()
        .map(|x| {
            let mut v = x.clone();
            v.resize(plan.padded(), 0.0);
            v
        })
        .collect();
    let mut out = vec![0.0f32; plan.padded()];
    let (b, st) = (plan.block, plan.scale_type);
    for owner in 0..p {
        for lane in &plan.lanes {
            let start = owner * plan.chunk + lane.offset;
            let range = start..start + lane.len;
            let rank =
                |h: usize| (owner as i64 + lane.dir * h as i64).rem_euclid(p as i64) as usize;
            let mut part = padded[rank(1)][range.clone()].to_vec();
            for h in 2..=p {
                let own = &padded[rank(h)][range.clone()];
                part = hop(&part, own, b, st, fma);
            }
            for (block, dst) in part.chunks(b).zip(out[range].chunks_mut(b)) {
                let (q, s) = quantize_block(block, st);
                dst.iter_mut()
                    .zip(dequantize(&q, s))
                    .for_each(|(d, v)| *d = v);
            }
        }
    }
    out.truncate(n);
    out
}

/// One hop: quantize `part`, dequantize it at the receiver, add `own`.
fn hop(part: &[f32], own: &[f32], block: usize, st: ScaleType, fma: bool) -> Vec<f32> {
    let mut next = Vec::with_capacity(part.len());
    for (blk, mine) in part.chunks(block).zip(own.chunks(block)) {
        let (q, s) = quantize_block(blk, st);
        next.extend(q.iter().zip(mine).map(|(&c, &o)| {
            if fma {
                f32::from(c).mul_add(s, o)
            } else {
                f32::from(c) * s + o
            }
        }));
    }
    next
}

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
        let (q, s) = quantize_block(x, ScaleType::F32);
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

/// Relative RMS error and the largest error relative to the exact sum's RMS.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct ErrorStats {
    pub rel_rms: f64,
    pub max_rel: f64,
}

pub fn error(got: &[f32], exact: &[f64]) -> ErrorStats {
    let (mut num, mut den, mut max) = (0.0f64, 0.0f64, 0.0f64);
    for (&g, &e) in got.iter().zip(exact) {
        let d = f64::from(g) - e;
        num += d * d;
        den += e * e;
        max = max.max(d.abs());
    }
    let rms = (den / exact.len().max(1) as f64).sqrt();
    ErrorStats {
        rel_rms: (num / den).sqrt(),
        max_rel: max / rms,
    }
}

/// Rounds f32 results to bf16 (the all-reduce's output type).
pub fn to_bf16(v: &[f32]) -> Vec<f32> {
    v.iter()
        .map(|&x| half::bf16::from_f32(x).to_f32())
        .collect()
}

/// One row of `equarx simulate`: the three algorithms on one configuration.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct SweepRow {
    pub distribution: Distribution,
    pub group_size: usize,
    pub block_size: usize,
    pub pipeline_depth: usize,
    pub bidirectional: bool,
    /// equarx, measured (output rounded to bf16).
    pub equarx: ErrorStats,
    /// equarx, the error model with κ² measured on these inputs.
    pub predicted_rel_rms: f64,
    pub bf16_ring: ErrorStats,
    pub per_tensor_int8: ErrorStats,
    /// bf16-ring / equarx bytes on the wire.
    pub wire_ratio: f64,
}

/// What to sweep.
#[derive(Clone, Debug)]
pub struct Sweep {
    pub distributions: Vec<Distribution>,
    pub group_sizes: Vec<usize>,
    pub block_sizes: Vec<usize>,
    pub depths: Vec<usize>,
    pub bidirectional: Vec<bool>,
    /// Elements per device (bf16 payload).
    pub elements: usize,
    /// Length of the innermost dimension (channels).
    pub channels: usize,
    pub scale_type: ScaleType,
    pub seed: u64,
}

/// Runs every combination; inputs are bf16 (the all-reduce's type) and
/// every result is rounded to bf16 as the all-reduce returns it.
pub fn sweep(s: &Sweep) -> Result<Vec<SweepRow>, String> {
    use crate::numerics::error::{measured_crest_sq, output_rounding_rel_rms, ring_rel_rms};
    let mut rows = Vec::new();
    for &dist in &s.distributions {
        for &p in &s.group_sizes {
            let inputs = dist.generate(p, s.elements, s.channels, true, s.seed ^ p as u64);
            let exact = exact_sum(&inputs);
            let exact_f32: Vec<f32> = exact.iter().map(|&x| x as f32).collect();
            let bf16_ring = error(&bf16_ring(&inputs), &exact);
            let naive = error(&to_bf16(&per_tensor_int8(&inputs)), &exact);
            for &b in &s.block_sizes {
                let crest = inputs
                    .iter()
                    .map(|x| measured_crest_sq(x, b))
                    .fold(measured_crest_sq(&exact_f32, b), f64::max);
                let ring = ring_rel_rms(p, crest);
                let out = output_rounding_rel_rms(7);
                for &d in &s.depths {
                    for &bi in &s.bidirectional {
                        let options = crate::Options {
                            block_size: b,
                            pipeline_depth: d,
                            bidirectional: bi,
                            scale_type: s.scale_type,
                            ..crate::Options::default()
                        };
                        options.validate()?;
                        let plan =
                            RingPlan::new(p, s.elements, &options).map_err(|e| e.to_string())?;
                        let got = to_bf16(&quantized_ring(&inputs, &plan, true));
                        let payload = 2 * s.elements as u64;
                        rows.push(SweepRow {
                            distribution: dist,
                            group_size: p,
                            block_size: b,
                            pipeline_depth: d,
                            bidirectional: bi,
                            equarx: error(&got, &exact),
                            predicted_rel_rms: (ring * ring + out * out).sqrt(),
                            bf16_ring,
                            per_tensor_int8: naive,
                            wire_ratio: crate::passes::quantized_all_reduce::plan::ring_wire_bytes(
                                p, payload,
                            ) as f64
                                / plan.wire_bytes() as f64,
                        });
                    }
                }
            }
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Options;

    #[test]
    fn without_quantization_error_the_ring_is_the_sum() {
        // Values exactly representable with one code per block: 0 or ±absmax.
        let inputs: Vec<Vec<f32>> = (0..4)
            .map(|d| {
                (0..256)
                    .map(|i| if (i + d) % 3 == 0 { 127.0 } else { 0.0 })
                    .collect()
            })
            .collect();
        let plan = RingPlan::new(
            4,
            256,
            &Options {
                block_size: 32,
                ..Options::default()
            },
        )
        .unwrap();
        let got = quantized_ring(&inputs, &plan, false);
        let exact = exact_sum(&inputs);
        // Partial sums stay on the grid only while one block's values share
        // the scale; the error stays within the model, and is tiny here.
        assert!(error(&got, &exact).rel_rms < 0.02);
    }

    #[test]
    fn gaussian_error_matches_the_model() {
        let inputs = Distribution::Gaussian.generate(8, 8192, 256, true, 1);
        let plan = RingPlan::new(8, 8192, &Options::default()).unwrap();
        let got = quantized_ring(&inputs, &plan, true);
        let e = error(&got, &exact_sum(&inputs)).rel_rms;
        let model =
            crate::numerics::error::ring_rel_rms(8, crate::numerics::error::gaussian_crest_sq(128));
        assert!((0.7 * model..1.1 * model).contains(&e), "{e} vs {model}");
    }

    #[test]
    fn bf16_ring_is_more_exact_than_per_tensor_int8_on_outliers() {
        let inputs = Distribution::LlmActivations.generate(8, 4096, 256, true, 2);
        let exact = exact_sum(&inputs);
        let ring = error(&bf16_ring(&inputs), &exact).rel_rms;
        let naive = error(&per_tensor_int8(&inputs), &exact).rel_rms;
        let plan = RingPlan::new(8, 4096, &Options::default()).unwrap();
        let ours = error(&quantized_ring(&inputs, &plan, true), &exact).rel_rms;
        assert!(
            ring < ours && ours < naive,
            "bf16 {ring}, equarx {ours}, per-tensor {naive}"
        );
    }
}
