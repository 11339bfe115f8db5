//! Synthetic per-device inputs: the distributions `equarx simulate` sweeps
//! and the tests draw from.

use super::rng::Rng;

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
