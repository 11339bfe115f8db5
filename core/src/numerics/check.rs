//! The error model against inputs it was not fitted to: plans run
//! bit-exactly ([`super::simulate`]) on given inputs, a real model's
//! captured all-reduce inputs say, each measured error beside the model's
//! predictions from the prior and from the inputs' own statistics (what a
//! calibration profile would hold). `equarx simulate --inputs` prints it.

use super::error::{Data, predicted};
use super::profile::{Inputs, op_stats_where};
use super::simulate::{error, exact_sum, quantized_all_reduce, to_bf16};
use crate::plan::{Config, Plan, PlanError};

/// One plan on one all-reduce's inputs.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Checked {
    pub config: Config,
    /// Relative RMS error of the result (rounded to bf16) against the exact
    /// sum.
    pub measured: f64,
    /// What the pass predicts without a profile.
    pub prior: f64,
    /// What it predicts with these inputs' statistics.
    pub profile: f64,
}

/// Every plan of `configs` that plans for these inputs (`inputs[d]`: rank
/// d's payload), run and predicted; results are rounded to bf16, as the
/// all-reduces of a bf16 model return them. As in [`super::simulate::sweep`],
/// combinations that cannot be planned (two-level on a prime group, an odd
/// int4 block, a rotated block that is no power of two) are left out; any other planning error is returned.
pub fn check(inputs: &[Vec<f32>], configs: &[Config]) -> Result<Vec<Checked>, String> {
    let p = inputs.len();
    let n = inputs.first().map_or(0, Vec::len);
    // Only the statistics the plans read: a profile's every block size
    // and rotation would be measured for nothing.
    let stats = op_stats_where(inputs, Inputs::Summed, "these inputs", |b, r| {
        configs.iter().any(|c| c.block == b && c.rotation == r)
    })?;
    let exact = exact_sum(inputs);
    let mut out = Vec::with_capacity(configs.len());
    for config in configs {
        let plan = match Plan::new(p, n, config) {
            Ok(plan) => plan,
            Err(
                PlanError::BadGrid { .. }
                | PlanError::NoGrid(_)
                | PlanError::OddInt4Block(_)
                | PlanError::RotationBlock(_),
            ) => continue,
            Err(e) => return Err(e.to_string()),
        };
        let got = to_bf16(&quantized_all_reduce(inputs, &plan, true));
        out.push(Checked {
            config: config.clone(),
            measured: error(&got, &exact).rel_rms,
            prior: predicted(&plan, Data::Prior, 7),
            profile: predicted(&plan, Data::Measured(&stats), 7),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{Algorithm, QuantFormat, Rotation, test_config};

    /// Heavy-tailed inputs (an outlier channel, like real activations'):
    /// the profile's prediction tracks the measurement for every format and
    /// rotation, where a Gaussian model would not.
    #[test]
    fn the_profile_predicts_what_outlier_channels_do() {
        let mut rng = super::super::simulate::Rng::new(11);
        let inputs: Vec<Vec<f32>> = (0..4)
            .map(|_| {
                (0..1 << 15)
                    .map(|i| {
                        let v = rng.gaussian() as f32 * if i % 640 == 17 { 40.0 } else { 1.0 };
                        half::bf16::from_f32(v).to_f32()
                    })
                    .collect()
            })
            .collect();
        let mut configs = Vec::new();
        for algorithm in [Algorithm::Ring, Algorithm::TwoShot] {
            for rotation in [Rotation::None, Rotation::Hadamard] {
                for format in [QuantFormat::Int8, QuantFormat::Int4, QuantFormat::Fp8E4m3] {
                    configs.push(Config {
                        rotation,
                        format,
                        ..test_config(algorithm)
                    });
                }
            }
        }
        let rows = check(&inputs, &configs).unwrap();
        assert_eq!(rows.len(), configs.len());
        let table: Vec<String> = rows
            .iter()
            .map(|r| {
                format!(
                    "{:?} {:?} {:?}: measured {:.4} profile {:.4} prior {:.4}",
                    r.config.algorithm,
                    r.config.rotation,
                    r.config.format,
                    r.measured,
                    r.profile,
                    r.prior
                )
            })
            .collect();
        eprintln!("{}", table.join("\n"));
        for r in &rows {
            let ratio = r.profile / r.measured;
            assert!((0.75..=1.25).contains(&ratio), "{}", table.join("\n"));
        }
    }
}
