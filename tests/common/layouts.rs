//! The layout of a collective's operands and results in the tests: how a
//! rank's operand is cut into the rows the simulator takes, and what each
//! rank's exact result is. The case files (`tests/filetests`) and the
//! property tests (`tests/collective_properties.rs`) share it.

use equarx::numerics::simulate;
use equarx::plan::{Collective, Plan};

/// One collective's kind and its operand's shape and dimension (`None`: a
/// tuple all-to-all, or an all-reduce).
#[derive(Clone, Debug)]
pub struct Layout {
    pub collective: Collective,
    pub dims: Vec<i64>,
    pub dim: Option<i64>,
}

/// Row-major `v` of `dims` cut along `d` into `p` equal pieces.
pub fn split(v: &[f32], dims: &[i64], d: usize, p: usize) -> Vec<Vec<f32>> {
    let before: usize = dims[..d].iter().product::<i64>() as usize;
    let size = dims[d] as usize;
    let after: usize = dims[d + 1..].iter().product::<i64>() as usize;
    let piece = size / p;
    (0..p)
        .map(|k| {
            (0..before)
                .flat_map(|a| {
                    let start = a * size * after + k * piece * after;
                    v[start..start + piece * after].iter().copied()
                })
                .collect()
        })
        .collect()
}

/// Pieces of `dims` each, laid side by side along `d`.
pub fn concat(pieces: &[Vec<f32>], dims: &[i64], d: usize) -> Vec<f32> {
    let before: usize = dims[..d].iter().product::<i64>() as usize;
    let run: usize = dims[d..].iter().product::<i64>() as usize;
    (0..before)
        .flat_map(|a| {
            pieces
                .iter()
                .flat_map(move |p| p[a * run..(a + 1) * run].iter().copied())
        })
        .collect()
}

/// The exact result on each rank of a group, given the group's inputs
/// (per rank, per operand), in f64, flattened (tuple results in order).
pub fn exact(c: &Layout, inputs: &[Vec<Vec<f32>>]) -> Vec<Vec<f64>> {
    let p = inputs.len();
    let to64 = |v: Vec<f32>| v.into_iter().map(f64::from).collect::<Vec<f64>>();
    match (c.collective, c.dim) {
        (Collective::AllReduce, _) => {
            let mut sum = vec![0.0f64; inputs[0][0].len()];
            for x in inputs {
                for (s, v) in sum.iter_mut().zip(&x[0]) {
                    *s += f64::from(*v);
                }
            }
            vec![sum; p]
        }
        (Collective::ReduceScatter, Some(d)) => (0..p)
            .map(|r| {
                let mut sum = vec![0.0f64; inputs[0][0].len() / p];
                for x in inputs {
                    for (s, v) in sum.iter_mut().zip(&split(&x[0], &c.dims, d as usize, p)[r]) {
                        *s += f64::from(*v);
                    }
                }
                sum
            })
            .collect(),
        (Collective::AllGather, Some(d)) => {
            let pieces: Vec<Vec<f32>> = inputs.iter().map(|x| x[0].clone()).collect();
            vec![to64(concat(&pieces, &c.dims, d as usize)); p]
        }
        (Collective::AllToAll, Some(d)) => {
            let mut piece_dims = c.dims.clone();
            piece_dims[d as usize] /= p as i64;
            (0..p)
                .map(|r| {
                    let pieces: Vec<Vec<f32>> = inputs
                        .iter()
                        .map(|x| split(&x[0], &c.dims, d as usize, p)[r].clone())
                        .collect();
                    to64(concat(&pieces, &piece_dims, d as usize))
                })
                .collect()
        }
        // Tuple: rank r's result k is rank k's operand r.
        (Collective::AllToAll, None) => (0..p)
            .map(|r| to64(inputs.iter().flat_map(|x| x[r].clone()).collect()))
            .collect(),
        (Collective::ReduceScatter | Collective::AllGather, None) => {
            unreachable!("a reduce-scatter or an all-gather has a dimension")
        }
    }
}

/// The simulator's answer per rank, laid out like the result (bf16).
pub fn simulated(c: &Layout, plan: &Plan, inputs: &[Vec<Vec<f32>>]) -> Vec<Vec<f32>> {
    let p = inputs.len();
    let rows: Vec<Vec<f32>> = inputs
        .iter()
        .map(|x| match (c.collective, c.dim) {
            (Collective::AllReduce | Collective::AllGather, _) => x[0].clone(),
            (_, Some(d)) => split(&x[0], &c.dims, d as usize, p).concat(),
            (_, None) => x.concat(),
        })
        .collect();
    let got = simulate::run(&rows, plan, true);
    got.into_iter()
        .map(|v| {
            let v = simulate::to_bf16(&v);
            match (c.collective, c.dim) {
                (Collective::AllReduce | Collective::ReduceScatter, _) | (_, None) => v,
                (Collective::AllGather, Some(d)) => {
                    let pieces: Vec<Vec<f32>> =
                        v.chunks(v.len() / p).map(<[f32]>::to_vec).collect();
                    concat(&pieces, &c.dims, d as usize)
                }
                (_, Some(d)) => {
                    let mut piece_dims = c.dims.clone();
                    piece_dims[d as usize] /= p as i64;
                    let pieces: Vec<Vec<f32>> =
                        v.chunks(v.len() / p).map(<[f32]>::to_vec).collect();
                    concat(&pieces, &piece_dims, d as usize)
                }
            }
        })
        .collect()
}
