//! `equarx simulate`'s sweep: every combination of distribution, group
//! size and configuration, run through the reference and the baselines.

use super::baselines::{bf16_ring, exact_sum, per_tensor_int8};
use super::inputs::Distribution;
use super::measure::{ErrorStats, error, to_bf16};
use super::reference::quantized_all_reduce;
use crate::numerics::{QuantFormat, ScaleType, rotate_block};
use crate::plan::{Algorithm, Config, Grid, Plan, Rotation};

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
    use crate::plan::{PlanError, ring_wire_bytes};
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
                                    ..Config::default()
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

    #[test]
    fn balanced_grids() {
        assert_eq!(Grid::balanced(8), Some(Grid { outer: 2, inner: 4 }));
        assert_eq!(Grid::balanced(16), Some(Grid { outer: 4, inner: 4 }));
        assert_eq!(Grid::balanced(7), None);
        assert_eq!(Grid::balanced(2), None);
    }
}
