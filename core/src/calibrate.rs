//! Calibration, the two halves around one exact run of a program: which
//! collectives a module holds and how their inputs are laid out
//! ([`sites`]), and the profile built from what that run measured
//! ([`build`]).
//!
//! The run itself belongs to a front door: `equarx.jax.calibrate` runs the
//! JAX program and records every collective's inputs as it goes; `equarx
//! calibrate` reads inputs saved to a `.npz` file. Both measure each input
//! with [`crate::numerics::profile::op_stats`] and hand the statistics here,
//! keyed by the sites' [`OpKey`]s, which the pass computes the same way.

use crate::ir::{DeviceCounts, Module};
use crate::numerics::error::{BlockStats, OpStats, Rounding};
use crate::numerics::profile::{Inputs, KeyMaker, OpKey, Profile, ProfiledOp, UnmeasuredOp};
use crate::passes::quantize_collectives::eligibility::rewritable;
use crate::passes::quantize_collectives::groups::{IdSpace, participants};

/// One collective of a module, as calibration sees it.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Site {
    /// What the pass will know it by.
    pub key: OpKey,
    /// Its name in this module (what a `.npz` of saved inputs names).
    pub instruction: String,
    /// The computation it is in, and whether that is the entry.
    pub computation: String,
    pub in_entry: bool,
    /// `all-reduce`, `reduce-scatter`, `all-gather` or `all-to-all`.
    pub collective: String,
    /// Whether it sums its inputs or moves them.
    pub inputs: Inputs,
    /// Elements per device of its payload (all operands).
    pub elements: u64,
    /// Its groups, ids in `space` (a device's rank is its place in its
    /// group), or why they cannot be known.
    pub groups: Result<Groups, String>,
}

/// The groups of a site.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Groups {
    pub space: IdSpace,
    /// Ids run over `0..ids`.
    pub ids: usize,
    pub groups: Vec<Vec<i64>>,
}

/// Every collective of `module` the pass would look at, in the order the
/// pass keys them.
pub fn sites(module: &Module, counts: &DeviceCounts) -> Vec<Site> {
    let mut keys = KeyMaker::default();
    let entry = module.entry_id();
    let mut out = Vec::new();
    for comp in module.computations() {
        for instr in comp.instructions() {
            let Some((collective, _)) = crate::ir::opcode::Opcode::of(instr).and_then(rewritable)
            else {
                continue;
            };
            let key = keys.key(module, comp, instr);
            let elements = instr
                .operand_ids
                .iter()
                .filter_map(|&o| comp.get(crate::ir::InstrId(o))?.shape.as_ref())
                .map(|s| crate::ir::shape::element_count(s).unwrap_or(0))
                .fold(0u64, u64::saturating_add);
            let groups = participants(instr, counts)
                .map(|p| Groups {
                    space: p.space,
                    ids: p.id_count,
                    groups: p.groups,
                })
                .map_err(|e| e.to_string());
            out.push(Site {
                key,
                instruction: instr.name.clone(),
                computation: comp.name().to_string(),
                in_entry: comp.id() == entry,
                collective: collective.opcode().to_string(),
                inputs: match collective {
                    crate::plan::Collective::AllReduce | crate::plan::Collective::ReduceScatter => {
                        Inputs::Summed
                    }
                    crate::plan::Collective::AllGather | crate::plan::Collective::AllToAll => {
                        Inputs::Moved
                    }
                },
                elements,
                groups,
            });
        }
    }
    out
}

/// What a front door measured of one site: the statistics of each group
/// at each time it ran (a loop body's op runs many times), and the
/// fraction of non-finite inputs.
#[derive(Clone, Debug, serde::Deserialize)]
pub struct Measured {
    pub key: OpKey,
    pub stats: Vec<OpStats>,
    #[serde(default)]
    pub nonfinite_fraction: f64,
}

/// What a front door hands [`build`].
#[derive(Clone, Debug, serde::Deserialize)]
pub struct Measurements {
    /// What was run on what (the program, the data).
    pub source: String,
    pub ops: Vec<Measured>,
    #[serde(default)]
    pub unmeasured: Vec<UnmeasuredOp>,
}

/// The profile of `m`: each op's statistics averaged over its groups and
/// runs (every run of an op moves as many elements, so the plain mean is
/// the mean over all of them).
pub fn build(m: Measurements) -> Result<Profile, String> {
    let mut ops = Vec::with_capacity(m.ops.len());
    for op in m.ops {
        let stats = mean(&op.stats)
            .map_err(|e| format!("{}: {e}", crate::numerics::profile::describe(&op.key)))?;
        ops.push(ProfiledOp {
            key: op.key,
            stats,
            nonfinite_fraction: op.nonfinite_fraction,
        });
    }
    Ok(Profile {
        version: 1,
        source: m.source,
        equarx: env!("CARGO_PKG_VERSION").to_string(),
        ops,
        unmeasured: m.unmeasured,
    })
}

/// The mean of statistics measured alike (same group size, block sizes and
/// rotations).
pub fn mean(all: &[OpStats]) -> Result<OpStats, String> {
    let first = all.first().ok_or("no statistics")?;
    let alike = |s: &OpStats| {
        s.group_size == first.group_size
            && s.blocks.len() == first.blocks.len()
            && s.blocks.iter().zip(&first.blocks).all(|(a, b)| {
                a.block == b.block
                    && a.rotation == b.rotation
                    && a.absmax_sq.len() == b.absmax_sq.len()
                    && a.mean_sq.len() == b.mean_sq.len()
                    && a.rounding.len() == b.rounding.len()
                    && a.rounding
                        .iter()
                        .zip(&b.rounding)
                        .all(|(x, y)| x.format == y.format && x.err_sq.len() == y.err_sq.len())
            })
    };
    if let Some(other) = all.iter().find(|s| !alike(s)) {
        return Err(format!(
            "statistics of different shapes (group of {} with {} block entries, and of {} with {}, or other formats measured)",
            first.group_size,
            first.blocks.len(),
            other.group_size,
            other.blocks.len()
        ));
    }
    let n = all.len() as f64;
    let avg = |f: &dyn Fn(&OpStats) -> &Vec<f64>| -> Vec<f64> {
        let mut v = vec![0.0; f(first).len()];
        for s in all {
            for (a, x) in v.iter_mut().zip(f(s)) {
                *a += x / n;
            }
        }
        v
    };
    let blocks = (0..first.blocks.len())
        .map(|i| BlockStats {
            block: first.blocks[i].block,
            rotation: first.blocks[i].rotation,
            absmax_sq: avg(&|s| &s.blocks[i].absmax_sq),
            mean_sq: avg(&|s| &s.blocks[i].mean_sq),
            rounding: (0..first.blocks[i].rounding.len())
                .map(|f| Rounding {
                    format: first.blocks[i].rounding[f].format,
                    err_sq: avg(&|s| &s.blocks[i].rounding[f].err_sq),
                })
                .collect(),
        })
        .collect();
    Ok(OpStats {
        source: first.source.clone(),
        group_size: first.group_size,
        blocks,
    })
}

/// The statistics of one site's inputs on one run: `per_id[i]` is the
/// payload of the device with id `i` in the site's id space. Each group is
/// measured in its rank order, and the groups averaged.
pub fn site_stats(site: &Site, per_id: &[Vec<f32>], source: &str) -> Result<OpStats, String> {
    let groups = site.groups.as_ref().map_err(Clone::clone)?;
    if per_id.len() != groups.ids {
        return Err(format!("{} inputs for {} ids", per_id.len(), groups.ids));
    }
    let mut all = Vec::with_capacity(groups.groups.len());
    for g in &groups.groups {
        let rows: Vec<Vec<f32>> = g.iter().map(|&id| per_id[id as usize].clone()).collect();
        all.push(crate::numerics::profile::op_stats(
            &rows,
            site.inputs,
            source,
        )?);
    }
    mean(&all)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn module(text: &str) -> (Module, DeviceCounts) {
        let parsed = crate::text::parse(text).expect("parses");
        (Module::from_proto(parsed.proto), parsed.counts)
    }

    const TWO_PSUMS: &str = r#"HloModule m, replica_count=1, num_partitions=4

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY main {
  x = f32[64,64] parameter(0)
  y = f32[64,64] all-reduce(x), channel_id=1, replica_groups={{0,1},{2,3}}, use_global_device_ids=true, to_apply=add, metadata={op_name="jit(f)/psum" source_file="model.py" source_line=7}
  ROOT z = f32[64,64] all-reduce(y), channel_id=2, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=add, metadata={op_name="jit(f)/psum" source_file="model.py" source_line=7}
}
"#;

    #[test]
    fn sites_carry_the_passs_keys_and_their_groups() {
        let (m, counts) = module(TWO_PSUMS);
        let s = sites(&m, &counts);
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].key.source_line, 7);
        assert_eq!(s[0].key.group_size, 2);
        assert_eq!(s[1].key.group_size, 4);
        assert_eq!(s[0].elements, 4096);
        let g = s[0].groups.as_ref().unwrap();
        assert_eq!(g.groups, vec![vec![0, 1], vec![2, 3]]);
        assert_eq!(g.ids, 4);
        assert!(s.iter().all(|s| s.in_entry && s.inputs == Inputs::Summed));
    }

    #[test]
    fn a_built_profile_is_what_the_pass_finds() {
        let (m, counts) = module(TWO_PSUMS);
        let s = sites(&m, &counts);
        let mut rng = crate::numerics::simulate::Rng::new(4);
        let per_id: Vec<Vec<f32>> = (0..4)
            .map(|_| (0..4096).map(|_| rng.gaussian() as f32).collect())
            .collect();
        let stats = site_stats(&s[0], &per_id, "test").unwrap();
        assert_eq!(stats.group_size, 2);
        let profile = build(Measurements {
            source: "test".into(),
            ops: vec![Measured {
                key: s[0].key.clone(),
                stats: vec![stats.clone(), stats],
                nonfinite_fraction: 0.0,
            }],
            unmeasured: vec![UnmeasuredOp {
                key: s[1].key.clone(),
                reason: "not run".into(),
            }],
        })
        .unwrap();
        assert!(profile.find(&s[0].key).is_ok());
        let why = profile.find(&s[1].key).unwrap_err().to_string();
        assert!(why.contains("not run"), "{why}");
    }

    #[test]
    fn statistics_of_different_shapes_do_not_average() {
        let mut rng = crate::numerics::simulate::Rng::new(5);
        let rows = |p: usize, rng: &mut crate::numerics::simulate::Rng| -> Vec<Vec<f32>> {
            (0..p)
                .map(|_| (0..512).map(|_| rng.gaussian() as f32).collect())
                .collect()
        };
        let a =
            crate::numerics::profile::op_stats(&rows(2, &mut rng), Inputs::Summed, "a").unwrap();
        let b =
            crate::numerics::profile::op_stats(&rows(4, &mut rng), Inputs::Summed, "b").unwrap();
        assert!(mean(&[a.clone(), b]).is_err());
        assert_eq!(mean(std::slice::from_ref(&a)).unwrap(), a);
        assert!(mean(&[]).is_err());
    }
}
