//! A bit-exact reference of the emitted all-reduce, and the baselines it is
//! judged against. `equarx simulate` prints their errors; a test holds the
//! reference to what XLA computes when it runs the rewritten module.
//!
//! The reference runs the [`Plan`]'s phases on numbers, op for op as the
//! emitter writes them: the same chunks, lanes and blocks, the same hop
//! order (the chunk that rank `j` ends up owning starts at rank `j + dir`
//! of its axis and picks up one contribution per hop, the owner's last), the
//! exchange's sum of halves ([`pairwise_sum`]), the same quantize and dequantize
//! ([`super::quantize_block`]), the same rotation ([`super::rotate_block`],
//! [`super::dequantize_rotated`]), f32 accumulation. Whether a backend
//! contracts a dequantize-multiply and add into one fused multiply-add is
//! its choice (XLA:CPU does for some hops and not for others); scales of at
//! most 17 significant bits make both give the same bits, and `fma` lets the
//! tests show it.

use super::{
    Quant, QuantFormat, ScaleType, dequantize, dequantize_rotated, quantize_block, rotate_block,
};
use crate::plan::{Algorithm, Axis, Collective, Config, Grid, Phase, Plan, Rotation};

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

crate::choice_enum! {
    /// Synthetic per-device inputs.
    pub enum Distribution {
        /// Standard normal.
        Gaussian = "gaussian",
        /// Student's t with 3 degrees of freedom: occasional large values
        /// anywhere.
        HeavyTailed = "heavy-tailed",
        /// LLM activations: Gaussian with a few channels (1 in 64 of the
        /// last dimension, the same on every device) 100× larger.
        LlmActivations = "llm-activations",
        /// Gaussian with 0.1 % of the values, drawn at random on each
        /// device, 100× larger.
        Outliers = "outliers",
    }
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
                            Distribution::Outliers => {
                                let x = rng.gaussian();
                                if rng.uniform() < 1e-3 { 100.0 * x } else { x }
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

/// What every rank holds after the quantized all-reduce of `plan` over
/// `inputs` (one payload per rank, all of the same length), before
/// rounding to the output type.
pub fn quantized_all_reduce(inputs: &[Vec<f32>], plan: &Plan, fma: bool) -> Vec<f32> {
    run(inputs, plan, fma).swap_remove(0)
}

/// What each rank holds after `plan`'s collective over `inputs` (one
/// operand per rank, flattened), before rounding to the output type:
/// all-reduce, every rank the sum; reduce-scatter, rank t the sum of row t;
/// all-gather, every rank all operands in rank order; all-to-all, rank t
/// every rank's row t in rank order.
pub fn run(inputs: &[Vec<f32>], plan: &Plan, fma: bool) -> Vec<Vec<f32>> {
    let (p, c, b, st) = (plan.group_size, plan.chunk, plan.block(), plan.quant());
    let rotated = plan.config.rotation == Rotation::Hadamard;
    let turn = |v: Vec<f32>| -> Vec<f32> {
        if rotated {
            v.chunks(b).flat_map(rotate_block).collect()
        } else {
            v
        }
    };
    // The rows of an operand, each padded to c (the all-reduce pads its
    // flat payload to P·c, which is the same rows).
    let rows_of = |x: &[f32]| -> Vec<Vec<f32>> {
        match plan.row {
            None => {
                let mut v = x.to_vec();
                v.resize(plan.padded(), 0.0);
                v.chunks(c).map(|r| r.to_vec()).collect()
            }
            Some(m) => x
                .chunks(m)
                .map(|r| {
                    let mut r = r.to_vec();
                    r.resize(c, 0.0);
                    r
                })
                .collect(),
        }
    };
    // held[r][t]: rank r's value of chunk t (None where it has none).
    let mut held: Vec<Vec<Option<Vec<f32>>>> = inputs
        .iter()
        .enumerate()
        .map(|(r, x)| match plan.collective {
            Collective::AllGather => (0..p)
                .map(|t| (t == r).then(|| turn(rows_of(x).swap_remove(0))))
                .collect(),
            _ => rows_of(x).into_iter().map(|row| Some(turn(row))).collect(),
        })
        .collect();
    let dequantized = |row: &[f32]| -> Vec<f32> {
        row.chunks(b)
            .flat_map(|block| {
                let (q, s) = quantize_block(block, st);
                if rotated {
                    dequantize_rotated(&q, s)
                } else {
                    dequantize(&q, s).collect()
                }
            })
            .collect()
    };
    let m = plan.row.unwrap_or(c);
    let mut out: Vec<Vec<f32>> = vec![Vec::new(); p];
    for phase in &plan.phases {
        match *phase {
            Phase::Ring { axis } => ring_phase(&mut held, axis, plan, fma),
            Phase::Exchange { axis } => exchange_phase(&mut held, axis, b, st),
            Phase::Gather => {
                let all: Vec<f32> = (0..p)
                    .flat_map(|t| {
                        let row = dequantized(held[t][t].as_ref().expect("rank t owns chunk t"));
                        row[..m].to_vec()
                    })
                    .collect();
                out = vec![all; p];
            }
            Phase::Scatter => {
                for (r, o) in out.iter_mut().enumerate() {
                    *o = (0..p)
                        .flat_map(|k| {
                            let row = dequantized(held[k][r].as_ref().expect("held"));
                            row[..m].to_vec()
                        })
                        .collect();
                }
            }
        }
    }
    match plan.collective {
        Collective::AllReduce => {
            let n = inputs.first().map_or(0, Vec::len);
            out.iter_mut().for_each(|o| o.truncate(n));
        }
        Collective::ReduceScatter => {
            // The owned sum, unquantized, rotated back.
            for (r, o) in out.iter_mut().enumerate() {
                let sum = held[r][r].clone().expect("rank r owns chunk r");
                *o = turn(sum);
                o.truncate(m);
            }
        }
        Collective::AllGather | Collective::AllToAll => {}
    }
    out
}

/// The coordinate of rank (or chunk) `r` on `axis`, and the rank that
/// differs from `r` only in having coordinate `a` there.
fn coordinate(r: usize, axis: Axis) -> usize {
    (r / axis.stride) % axis.size
}

fn with_coordinate(r: usize, axis: Axis, a: usize) -> usize {
    r - coordinate(r, axis) * axis.stride + a * axis.stride
}

/// A reduce phase over `axis`: every rank keeps the chunks whose coordinate
/// on `axis` is its own, each replaced by `reduce(r, t, before)` (rank `r`,
/// chunk `t`, every rank's chunks before the phase), and drops the rest.
fn reduce_phase(
    held: &mut [Vec<Option<Vec<f32>>>],
    axis: Axis,
    mut reduce: impl FnMut(usize, usize, &[Vec<Option<Vec<f32>>>]) -> Vec<f32>,
) {
    let before: Vec<Vec<Option<Vec<f32>>>> = held.to_vec();
    for (r, chunks) in held.iter_mut().enumerate() {
        for (t, slot) in chunks.iter_mut().enumerate() {
            if slot.is_none() {
                continue;
            }
            *slot = (coordinate(t, axis) == coordinate(r, axis)).then(|| reduce(r, t, &before));
        }
    }
}

/// The ring: chunk t's owner on this axis is r; its chain per lane starts
/// at coordinate a + dir and ends at a, requantizing at every hop.
fn ring_phase(held: &mut [Vec<Option<Vec<f32>>>], axis: Axis, plan: &Plan, fma: bool) {
    let (q, b, st) = (axis.size as i64, plan.block(), plan.quant());
    reduce_phase(held, axis, |r, t, before| {
        let a = coordinate(r, axis) as i64;
        let mut sum = vec![0.0f32; plan.chunk];
        for lane in &plan.lanes {
            let member =
                |h: i64| with_coordinate(r, axis, (a + lane.dir * h).rem_euclid(q) as usize);
            let range = lane.offset..lane.offset + lane.len;
            let part_of = |rank: usize| &before[rank][t].as_ref().expect("held")[range.clone()];
            let mut part = part_of(member(1)).to_vec();
            for h in 2..=q {
                part = hop(&part, part_of(member(h)), b, st, fma);
            }
            sum[range].copy_from_slice(&part);
        }
        sum
    });
}

/// The exchange: every member's copy quantized once, and the owner's sum
/// of their dequantized values as the emitter adds them ([`pairwise_sum`]).
/// The products of codes and scales are rounded first: a fused
/// multiply-add would not change them where they are exact (bf16 scales).
fn exchange_phase(held: &mut [Vec<Option<Vec<f32>>>], axis: Axis, b: usize, st: Quant) {
    reduce_phase(held, axis, |r, t, before| {
        let rows: Vec<Vec<f32>> = (0..axis.size)
            .map(|k| {
                let from = before[with_coordinate(r, axis, k)][t]
                    .as_ref()
                    .expect("held");
                from.chunks(b)
                    .flat_map(|blk| {
                        let (q, s) = quantize_block(blk, st);
                        q.into_iter().map(move |c| c * s)
                    })
                    .collect()
            })
            .collect();
        pairwise_sum(rows)
    });
}

/// The sum of rows in the emitter's order: the first half plus the second,
/// row by row, an odd row carried to the next round, until one is left.
/// A `reduce`'s order would be the backend's (XLA:CPU hands large ones to
/// YNNPACK, which reassociates); these adds fix it on every backend.
pub fn pairwise_sum(mut rows: Vec<Vec<f32>>) -> Vec<f32> {
    while rows.len() > 1 {
        let h = rows.len() / 2;
        let carry = (rows.len() % 2 == 1).then(|| rows.pop().expect("odd"));
        let right = rows.split_off(h);
        for (l, r) in rows.iter_mut().zip(&right) {
            for (a, &b) in l.iter_mut().zip(r) {
                *a += b;
            }
        }
        rows.extend(carry);
    }
    rows.pop().unwrap_or_default()
}

/// One hop: quantize `part`, dequantize it at the receiver, add `own`.
fn hop(part: &[f32], own: &[f32], block: usize, st: Quant, fma: bool) -> Vec<f32> {
    let mut next = Vec::with_capacity(part.len());
    for (blk, mine) in part.chunks(block).zip(own.chunks(block)) {
        let (q, s) = quantize_block(blk, st);
        next.extend(q.iter().zip(mine).map(
            |(&c, &o)| {
                if fma { c.mul_add(s, o) } else { c * s + o }
            },
        ));
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

/// One row of `equarx simulate`: one configuration against the baselines.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct SweepRow {
    pub distribution: Distribution,
    pub group_size: usize,
    pub block_size: usize,
    pub algorithm: String,
    pub rotation: Rotation,
    pub format: QuantFormat,
    pub pipeline_depth: usize,
    pub bidirectional: bool,
    /// equarx, measured (output rounded to bf16).
    pub equarx: ErrorStats,
    /// equarx, the error model with κ² measured on these inputs (rotated
    /// when the configuration rotates).
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
    /// Two-level runs on the most balanced grid of each P.
    pub algorithms: Vec<Algorithm>,
    pub rotations: Vec<Rotation>,
    pub formats: Vec<QuantFormat>,
    pub depths: Vec<usize>,
    pub bidirectional: Vec<bool>,
    /// Elements per device (bf16 payload).
    pub elements: usize,
    /// Length of the innermost dimension (channels).
    pub channels: usize,
    pub scale_type: ScaleType,
    pub seed: u64,
}

/// κ² of the data the quantizer sees: the inputs and their sum, rotated
/// when the configuration rotates; the largest of them.
pub fn crest_seen(inputs: &[Vec<f32>], exact: &[f32], block: usize, rotation: Rotation) -> f64 {
    use crate::numerics::error::measured_crest_sq;
    let seen = |x: &[f32]| -> f64 {
        if rotation == Rotation::Hadamard {
            let mut v = x.to_vec();
            v.resize(x.len().next_multiple_of(block), 0.0);
            let r: Vec<f32> = v.chunks(block).flat_map(rotate_block).collect();
            measured_crest_sq(&r, block)
        } else {
            measured_crest_sq(x, block)
        }
    };
    inputs.iter().map(|x| seen(x)).fold(seen(exact), f64::max)
}

/// Runs every combination; inputs are bf16 (the all-reduce's type) and
/// every result is rounded to bf16 as the all-reduce returns it.
/// Combinations that cannot be planned (a two-level grid of a prime
/// group, a rotation of a block that is no power of two) are left out.
pub fn sweep(s: &Sweep) -> Result<Vec<SweepRow>, String> {
    use crate::numerics::error::rel_rms_with_crest;
    use crate::plan::{Form, GatherForm, PlanError, ring_wire_bytes};
    let mut rows = Vec::new();
    for &dist in &s.distributions {
        for &p in &s.group_sizes {
            let inputs = dist.generate(p, s.elements, s.channels, true, s.seed ^ p as u64);
            let exact = exact_sum(&inputs);
            let exact_f32: Vec<f32> = exact.iter().map(|&x| x as f32).collect();
            let bf16_ring = error(&bf16_ring(&inputs), &exact);
            let naive = error(&to_bf16(&per_tensor_int8(&inputs)), &exact);
            for &b in &s.block_sizes {
                for &rotation in &s.rotations {
                    if rotation == Rotation::Hadamard && !b.is_power_of_two() {
                        continue;
                    }
                    let crest = crest_seen(&inputs, &exact_f32, b, rotation);
                    // Two-level runs on the most balanced grid of each P
                    // (none for a prime P: left out).
                    let balanced = Grid::balanced(p);
                    let resolved = s.algorithms.iter().filter_map(|&a| {
                        let grid = a.grid(p, balanced).ok()?;
                        Some((a, grid))
                    });
                    for ((algorithm, grid), format) in
                        resolved.flat_map(|a| s.formats.iter().map(move |&f| (a, f)))
                    {
                        for &d in &s.depths {
                            for &bi in &s.bidirectional {
                                let config = Config {
                                    algorithm,
                                    grid,
                                    rotation,
                                    block: b,
                                    scale_type: s.scale_type,
                                    format,
                                    pipeline_depth: d,
                                    bidirectional: bi,
                                    gather: GatherForm::AllGather,
                                    form: Form::Loop,
                                };
                                let plan = match Plan::new(p, s.elements, &config) {
                                    Ok(plan) => plan,
                                    Err(PlanError::BadGrid { .. } | PlanError::OddInt4Block(_)) => {
                                        continue;
                                    }
                                    Err(e) => return Err(e.to_string()),
                                };
                                let got = to_bf16(&quantized_all_reduce(&inputs, &plan, true));
                                let payload = 2 * s.elements as u64;
                                rows.push(SweepRow {
                                    distribution: dist,
                                    group_size: p,
                                    block_size: b,
                                    algorithm: config.algorithm_label(),
                                    rotation,
                                    format,
                                    pipeline_depth: d,
                                    bidirectional: bi,
                                    equarx: error(&got, &exact),
                                    predicted_rel_rms: rel_rms_with_crest(&plan, crest, 7),
                                    bf16_ring,
                                    per_tensor_int8: naive,
                                    wire_ratio: ring_wire_bytes(p, payload) as f64
                                        / plan.wire_bytes() as f64,
                                });
                            }
                        }
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

    fn plan(p: usize, n: usize, algorithm: Algorithm, rotation: Rotation, block: usize) -> Plan {
        let config = Config {
            rotation,
            block,
            ..crate::plan::test_config(algorithm)
        };
        Plan::new(p, n, &config).unwrap()
    }

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
        let plan = plan(4, 256, Algorithm::Ring, Rotation::None, 32);
        let got = quantized_all_reduce(&inputs, &plan, false);
        let exact = exact_sum(&inputs);
        // Partial sums stay on the grid only while one block's values share
        // the scale; the error stays within the model, and is tiny here.
        assert!(error(&got, &exact).rel_rms < 0.02);
    }

    #[test]
    fn every_algorithm_matches_the_model_on_gaussian_data() {
        use crate::numerics::error::{format_rel_rms, gaussian_crest_sq};
        let inputs = Distribution::Gaussian.generate(8, 16384, 256, true, 1);
        let exact = exact_sum(&inputs);
        for algorithm in [Algorithm::Ring, Algorithm::TwoShot, Algorithm::TwoLevel] {
            for rotation in [Rotation::None, Rotation::Hadamard] {
                let plan = plan(8, 16384, algorithm, rotation, 64);
                let got = quantized_all_reduce(&inputs, &plan, true);
                let e = error(&got, &exact).rel_rms;
                let model = format_rel_rms(
                    QuantFormat::Int8,
                    plan.noise_weight(),
                    gaussian_crest_sq(64),
                );
                assert!(
                    (0.8 * model..1.1 * model).contains(&e),
                    "{algorithm} {rotation:?}: {e} vs {model}"
                );
            }
        }
    }

    #[test]
    fn fused_multiply_adds_change_no_bit() {
        let inputs = Distribution::HeavyTailed.generate(8, 4096, 256, true, 3);
        for algorithm in [Algorithm::Ring, Algorithm::TwoShot] {
            let plan = plan(8, 4096, algorithm, Rotation::Hadamard, 64);
            let a = quantized_all_reduce(&inputs, &plan, true);
            let b = quantized_all_reduce(&inputs, &plan, false);
            assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
        }
    }

    #[test]
    fn rotation_tames_outliers_and_fewer_requantizations_help() {
        let inputs = Distribution::LlmActivations.generate(8, 8192, 256, true, 2);
        let exact = exact_sum(&inputs);
        let err = |a, r| {
            let got = quantized_all_reduce(&inputs, &plan(8, 8192, a, r, 64), true);
            error(&got, &exact).rel_rms
        };
        let ring = err(Algorithm::Ring, Rotation::None);
        let ring_h = err(Algorithm::Ring, Rotation::Hadamard);
        let two_shot_h = err(Algorithm::TwoShot, Rotation::Hadamard);
        assert!(ring_h < ring / 3.0, "ring {ring}, rotated {ring_h}");
        assert!(two_shot_h < ring_h, "two-shot {two_shot_h}, ring {ring_h}");
        let naive = error(&per_tensor_int8(&inputs), &exact).rel_rms;
        let bf16 = error(&bf16_ring(&inputs), &exact).rel_rms;
        assert!(
            bf16 < ring && ring < naive,
            "bf16 {bf16}, equarx {ring}, per-tensor {naive}"
        );
    }

    #[test]
    fn balanced_grids() {
        assert_eq!(Grid::balanced(8), Some(Grid { outer: 2, inner: 4 }));
        assert_eq!(Grid::balanced(16), Some(Grid { outer: 4, inner: 4 }));
        assert_eq!(Grid::balanced(7), None);
        assert_eq!(Grid::balanced(2), None);
    }
}
