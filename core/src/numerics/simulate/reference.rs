//! A bit-exact reference of the emitted collectives. A test holds it to
//! what XLA computes when it runs the rewritten module.
//!
//! The reference runs the [`Plan`]'s phases on numbers, op for op as the
//! emitter writes them: the same chunks, lanes and blocks, the same hop
//! order (the chunk that rank `j` ends up owning starts at rank `j + dir`
//! of its axis and picks up one contribution per hop, the owner's last), the
//! exchange's sum of halves ([`pairwise_sum`]), the same quantize and dequantize
//! ([`crate::numerics::quantize_block`]), the same rotation ([`crate::numerics::rotate_block`],
//! [`crate::numerics::dequantize_rotated`]), f32 accumulation. Whether a backend
//! contracts a dequantize-multiply and add into one fused multiply-add is
//! its choice (XLA:CPU does for some hops and not for others); scales of at
//! most 17 significant bits make both give the same bits, and `fma` lets the
//! tests show it.

use crate::numerics::{Quant, dequantize, dequantize_rotated, quantize_block, rotate_block};
use crate::plan::{Axis, Collective, Phase, Plan, Rotation};

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
            Collective::AllReduce | Collective::ReduceScatter | Collective::AllToAll => {
                rows_of(x).into_iter().map(|row| Some(turn(row))).collect()
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::numerics::QuantFormat;
    use crate::numerics::simulate::baselines::{bf16_ring, exact_sum, per_tensor_int8};
    use crate::numerics::simulate::inputs::Distribution;
    use crate::numerics::simulate::measure::error;
    use crate::plan::{Algorithm, Config};

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
}
