//! Seeded inputs for real-XLA runs: per device, per entry parameter, f32
//! values rounded to the parameter's type. The case files name the data
//! kind (`tests/cases/README.md`); the huge-input test draws heavy-tailed
//! data the same way.

use equarx::ir::shape;
use equarx::proto::{HloInstructionProto, HloModuleProto, OpSharding};

use super::Rng;

/// What a run's inputs look like.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub enum Data {
    Gaussian,
    /// LLM-activation-like: every 64th channel of the last dimension is
    /// 100× larger, on every device.
    HeavyTailed,
    /// Gaussian with 0.1 % of the values, at random on each device, 100×
    /// larger.
    Outliers,
    /// Gaussian with non-finite values planted: for all-reduces and
    /// programs a NaN on device 1 and an Inf on device 5 ([`POISON`]), for
    /// the other collectives a NaN on device 3 ([`COLLECTIVE_POISON`]).
    Poisoned,
}

impl Data {
    pub const ALL: [Data; 4] = [
        Data::Gaussian,
        Data::HeavyTailed,
        Data::Outliers,
        Data::Poisoned,
    ];

    /// The name case headers use.
    pub fn name(self) -> &'static str {
        match self {
            Data::Gaussian => "gaussian",
            Data::HeavyTailed => "heavy-tailed",
            Data::Outliers => "outliers",
            Data::Poisoned => "poisoned",
        }
    }

    pub fn from_name(s: &str) -> Result<Data, String> {
        Data::ALL
            .into_iter()
            .find(|d| d.name() == s)
            .ok_or_else(|| {
                format!("unknown data {s:?} (gaussian, heavy-tailed, outliers, poisoned)")
            })
    }
}

/// (device, element of parameter 0, value) planted in all-reduce and
/// program inputs.
pub const POISON: [(usize, usize, f32); 2] = [(1, 300, f32::NAN), (5, 700, f32::INFINITY)];

/// (device, element of operand 0) that holds a NaN in the other
/// collectives' inputs.
pub const COLLECTIVE_POISON: (usize, usize) = (3, 100);

/// Inputs per device per parameter, rounded to the parameter's type.
/// Devices that hold the same shard of a parameter (by its sharding) get the
/// same values, as they would in the program JAX compiled.
pub fn inputs(
    params: &[(String, Vec<i64>)],
    shardings: &[Option<OpSharding>],
    devices: usize,
    data: Data,
    seed: u64,
) -> Vec<Vec<Vec<f32>>> {
    (0..devices)
        .map(|d| {
            params
                .iter()
                .enumerate()
                .map(|(k, (ty, dims))| {
                    let key = shard_key(shardings[k].as_ref(), d);
                    let mut rng = Rng::new(seed ^ hash(&(k, &key)));
                    let n: i64 = dims.iter().product();
                    let last = *dims.last().unwrap_or(&1);
                    let mut v: Vec<f32> = (0..n)
                        .map(|i| {
                            let x = rng.gaussian() as f32;
                            let outlier = match data {
                                Data::HeavyTailed => (i % last) % 64 == 5,
                                Data::Outliers => rng.uniform() < 1e-3,
                                _ => false,
                            };
                            if outlier { 100.0 * x } else { x }
                        })
                        .collect();
                    if data == Data::Poisoned && k == 0 {
                        for &(pd, at, bad) in &POISON {
                            if pd == d && at < v.len() {
                                v[at] = bad;
                            }
                        }
                    }
                    if ty == "bf16" {
                        v.iter_mut()
                            .for_each(|x| *x = half::bf16::from_f32(*x).to_f32());
                    }
                    v
                })
                .collect()
        })
        .collect()
}

/// Inputs for a reduce-scatter, all-gather or all-to-all: `operands` bf16
/// operands of `dims` per device, drawn from one stream in device order.
pub fn collective_inputs(
    operands: usize,
    dims: &[i64],
    devices: usize,
    data: Data,
    seed: u64,
) -> Vec<Vec<Vec<f32>>> {
    let mut rng = Rng::new(seed);
    let n: i64 = dims.iter().product();
    let mut values: Vec<Vec<Vec<f32>>> = (0..devices)
        .map(|_| {
            (0..operands)
                .map(|_| {
                    (0..n)
                        .map(|_| {
                            let x = rng.gaussian() as f32;
                            let x = if data == Data::Outliers && rng.uniform() < 1e-3 {
                                100.0 * x
                            } else {
                                x
                            };
                            half::bf16::from_f32(x).to_f32()
                        })
                        .collect()
                })
                .collect()
        })
        .collect();
    if data == Data::Poisoned {
        let (d, at) = COLLECTIVE_POISON;
        values[d][0][at] = f32::NAN;
    }
    values
}

fn hash<T: std::hash::Hash>(t: &T) -> u64 {
    use std::hash::Hasher;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    t.hash(&mut h);
    h.finish()
}

/// Which shard of a parameter device `d` holds: devices with the same key
/// hold the same data (replicated parameters: every device).
pub fn shard_key(sharding: Option<&OpSharding>, d: usize) -> Vec<i64> {
    use equarx::proto::op_sharding::Type;
    let Some(s) = sharding else {
        return vec![d as i64];
    };
    match Type::try_from(s.r#type) {
        Ok(Type::Replicated) => vec![],
        Ok(Type::Other) => {
            let dims = &s.tile_assignment_dimensions;
            let devices = if s.iota_reshape_dims.is_empty() {
                s.tile_assignment_devices.clone()
            } else {
                let perm: Vec<i64> = s
                    .iota_transpose_perm
                    .iter()
                    .map(|&p| i64::from(p))
                    .collect();
                equarx::ir::groups::transposed_iota(&s.iota_reshape_dims, &perm).unwrap()
            };
            let pos = devices
                .iter()
                .position(|&x| x == d as i64)
                .expect("device in tile assignment");
            let mut coords = vec![0i64; dims.len()];
            let mut rest = pos as i64;
            for k in (0..dims.len()).rev() {
                coords[k] = rest % dims[k];
                rest /= dims[k];
            }
            let replicated_dims =
                usize::from(s.replicate_on_last_tile_dim) + s.last_tile_dims.len();
            coords.truncate(dims.len() - replicated_dims);
            coords
        }
        _ => vec![d as i64],
    }
}

/// The entry computation's parameters, in parameter order.
pub fn entry_parameters(m: &HloModuleProto) -> Vec<&HloInstructionProto> {
    let entry = m
        .computations
        .iter()
        .find(|c| c.id == m.entry_computation_id)
        .unwrap();
    let mut params: Vec<&HloInstructionProto> = entry
        .instructions
        .iter()
        .filter(|i| i.opcode == "parameter")
        .collect();
    params.sort_by_key(|p| p.parameter_number);
    params
}

/// Parameter shapes and element types of the entry computation.
pub fn parameters(m: &HloModuleProto) -> Vec<(String, Vec<i64>)> {
    entry_parameters(m)
        .iter()
        .map(|p| {
            let s = p.shape.as_ref().unwrap();
            (
                shape::type_name(s.element_type).unwrap().to_string(),
                s.dimensions.clone(),
            )
        })
        .collect()
}

/// The entry parameters' shardings.
pub fn shardings(m: &HloModuleProto) -> Vec<Option<OpSharding>> {
    entry_parameters(m)
        .iter()
        .map(|p| p.sharding.as_deref().cloned())
        .collect()
}
