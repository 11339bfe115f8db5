//! Calibration: statistics of what each collective quantizes, measured on
//! one exact run of the program, and a profile file that carries them to
//! the pass.
//!
//! [`op_stats`] measures one collective's inputs (every device's payload,
//! flattened as the pass flattens it) for the error model
//! ([`super::error::OpStats`]): per block size and rotation, the mean block
//! absmax² and the mean square of partial sums of k consecutive ranks,
//! k = 1..=P, over the complete sum's mean square. A [`Profile`] holds them
//! per op with what identifies the op across compiles: its metadata
//! (`op_name`, source file and line), its operand shape and type, its group
//! size, and its place among the module's ops of the same identity (XLA
//! renames instructions between compiles; the program's order of its ops
//! stays).
//!
//! [`Profile::find`] matches an op of a module to at most one entry, and says
//! why when it cannot: no entry, or one for another group size. The pass
//! then predicts with the prior and the report says so; a profile is never
//! applied to an op it was not measured on.

use super::error::{BlockStats, OpStats, Rounding};
use super::{block_scale, code};
use crate::choice::Choice;
use crate::plan::{Quant, QuantFormat, Rotation, ScaleType};

/// Block sizes a profile measures (the error model interpolates nothing
/// from a profile: a plan at another block size predicts with the prior).
pub const PROFILE_BLOCKS: &[usize] = &[8, 16, 32, 64, 128, 256, 512];

/// What the statistics are of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Inputs {
    /// The collective sums its inputs (all-reduce, reduce-scatter).
    Summed,
    /// It moves them (all-gather, all-to-all): only each input matters.
    Moved,
}

/// The statistics of one collective's inputs: `inputs[d]` is device d's
/// payload (all of equal length), in rank order.
pub fn op_stats(inputs: &[Vec<f32>], kind: Inputs, source: &str) -> Result<OpStats, String> {
    op_stats_where(inputs, kind, source, |_, _| true)
}

/// [`op_stats`] at only the block sizes and rotations `wanted` names (of
/// [`PROFILE_BLOCKS`]): what a check of given plans needs, not all a
/// profile holds.
pub fn op_stats_where(
    inputs: &[Vec<f32>],
    kind: Inputs,
    source: &str,
    wanted: impl Fn(usize, Rotation) -> bool,
) -> Result<OpStats, String> {
    let p = inputs.len();
    let n = inputs.first().map_or(0, Vec::len);
    if p == 0 || n == 0 {
        return Err("no inputs to measure".into());
    }
    if inputs.iter().any(|x| x.len() != n) {
        return Err("the devices' inputs differ in length".into());
    }
    let mut blocks = Vec::new();
    for &b in PROFILE_BLOCKS.iter().filter(|&&b| b <= n) {
        for rotation in [Rotation::None, Rotation::Hadamard] {
            if wanted(b, rotation) {
                blocks.push(block_stats(inputs, kind, b, rotation));
            }
        }
    }
    Ok(OpStats {
        source: source.to_string(),
        group_size: p,
        blocks,
    })
}

/// [`BlockStats`] at block size `b` and `rotation`: partial sums over every
/// window of k consecutive ranks (mod P), averaged over the windows.
fn block_stats(inputs: &[Vec<f32>], kind: Inputs, b: usize, rotation: Rotation) -> BlockStats {
    let p = inputs.len();
    let ks = match kind {
        Inputs::Summed => p,
        Inputs::Moved => 1,
    };
    let whole = inputs[0].len() / b * b;
    let mut sums = vec![Moments::default(); ks];
    let mut partial = vec![0.0f64; whole];
    for start in 0..p {
        partial.iter_mut().for_each(|v| *v = 0.0);
        for (k, sum) in sums.iter_mut().enumerate() {
            let x = &inputs[(start + k) % p];
            for (v, &y) in partial.iter_mut().zip(&x[..whole]) {
                *v += f64::from(y);
            }
            sum.add(&moments(&partial, b, rotation), 1.0 / p as f64);
        }
    }
    // Relative to the result's mean square: the complete sum's, or (moved
    // rows) the inputs'.
    let s = sums[ks - 1].mean_sq;
    let scale = if s > 0.0 && s.is_finite() {
        1.0 / s
    } else {
        0.0
    };
    BlockStats {
        block: b,
        rotation,
        absmax_sq: sums.iter().map(|m| m.absmax_sq * scale).collect(),
        mean_sq: sums.iter().map(|m| m.mean_sq * scale).collect(),
        rounding: QuantFormat::ALL
            .iter()
            .enumerate()
            .map(|(f, &format)| Rounding {
                format,
                err_sq: sums.iter().map(|m| m.err_sq[f] * scale).collect(),
            })
            .collect(),
    }
}

/// One partial's statistics: the mean over blocks of absmax², the mean
/// square, and per format ([`QuantFormat::ALL`]'s order) the mean square
/// of one quantization's error.
#[derive(Clone, Default)]
struct Moments {
    absmax_sq: f64,
    mean_sq: f64,
    err_sq: [f64; QuantFormat::ALL.len()],
}

impl Moments {
    fn add(&mut self, m: &Moments, weight: f64) {
        self.absmax_sq += weight * m.absmax_sq;
        self.mean_sq += weight * m.mean_sq;
        for (a, b) in self.err_sq.iter_mut().zip(&m.err_sq) {
            *a += weight * b;
        }
    }
}

/// [`Moments`] of `v` in blocks of `b`, each block rotated first when
/// `rotation` says so (the orthonormal Hadamard transform, by its fast
/// form: the same values as the pass's up to rounding, which statistics do
/// not see). Non-finite values are left out of the absmax and the mean
/// square, and blocks that hold one out of the rounding error (their
/// dequantized values are NaN, an error no statistic describes). Codes
/// are taken as the pass takes them, with f32 scales.
fn moments(v: &[f64], b: usize, rotation: Rotation) -> Moments {
    let rotate = rotation == Rotation::Hadamard && b.is_power_of_two();
    let norm = 1.0 / (b as f64).sqrt();
    let (mut amax, mut sq, mut blocks, mut count) = (0.0f64, 0.0f64, 0usize, 0usize);
    let mut err = [0.0f64; QuantFormat::ALL.len()];
    let mut err_count = 0usize;
    let mut buf = vec![0.0f64; b];
    let mut narrow = vec![0.0f32; b];
    for block in v.chunks_exact(b) {
        buf.copy_from_slice(block);
        if rotate {
            walsh_hadamard(&mut buf);
            buf.iter_mut().for_each(|x| *x *= norm);
        }
        let mut m = 0.0f64;
        let mut finite = true;
        for &x in &buf {
            if x.is_finite() {
                m = m.max(x.abs());
                sq += x * x;
                count += 1;
            } else {
                finite = false;
            }
        }
        amax += m * m;
        blocks += 1;
        if finite {
            for (n, &x) in narrow.iter_mut().zip(&buf) {
                *n = x as f32;
            }
            for (e, &format) in err.iter_mut().zip(QuantFormat::ALL) {
                let quant = Quant {
                    format,
                    scale: ScaleType::F32,
                };
                let scale = block_scale(&narrow, quant);
                let recip = 1.0 / scale;
                for &x in &narrow {
                    let d = f64::from(x) - f64::from(code(x, recip, format) * scale);
                    *e += d * d;
                }
            }
            err_count += b;
        }
    }
    if blocks == 0 || count == 0 {
        return Moments::default();
    }
    let per = |e: f64| {
        if err_count == 0 {
            0.0
        } else {
            e / err_count as f64
        }
    };
    Moments {
        absmax_sq: amax / blocks as f64,
        mean_sq: sq / count as f64,
        err_sq: err.map(per),
    }
}

/// The unnormalized Walsh–Hadamard transform of `x` (length a power of
/// two) in place: Sylvester order, the matrix of [`super::hadamard_sign`].
fn walsh_hadamard(x: &mut [f64]) {
    let mut h = 1;
    while h < x.len() {
        for i in (0..x.len()).step_by(2 * h) {
            for j in i..i + h {
                let (a, b) = (x[j], x[j + h]);
                x[j] = a + b;
                x[j + h] = a - b;
            }
        }
        h *= 2;
    }
}

/// The fraction of non-finite values among `inputs`.
pub fn nonfinite_fraction(inputs: &[Vec<f32>]) -> f64 {
    let total: usize = inputs.iter().map(Vec::len).sum();
    let bad = inputs.iter().flatten().filter(|x| !x.is_finite()).count();
    if total == 0 {
        0.0
    } else {
        bad as f64 / total as f64
    }
}

/// What identifies an op across compiles of one program.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct OpKey {
    /// The op's `metadata.op_name` (as the framework named it).
    pub op_name: String,
    #[serde(default)]
    pub source_file: String,
    #[serde(default)]
    pub source_line: i32,
    /// The payload: operand shapes as `equarx analyze` writes them
    /// (`bf16[4,512,640]`), in operand order.
    pub operands: Vec<String>,
    pub group_size: usize,
    /// Its place among the ops of the same identity, in program order.
    pub occurrence: usize,
}

/// Makes the [`OpKey`]s of a module's collectives, in program order (the
/// pass and calibration both ask it, so their keys agree).
#[derive(Default)]
pub struct KeyMaker {
    seen: rustc_hash::FxHashMap<OpKey, usize>,
}

impl KeyMaker {
    /// The key of `instr`, a collective of `comp`: its metadata (the source
    /// location resolved through the module's stack frames when the
    /// metadata only names a frame, as JAX writes it), operand shapes,
    /// group size and its place among the ops of the same identity before
    /// it.
    pub fn key(
        &mut self,
        module: &crate::ir::Module,
        comp: &crate::ir::Computation,
        instr: &crate::proto::HloInstructionProto,
    ) -> OpKey {
        let operands = instr
            .operand_ids
            .iter()
            .map(|&o| {
                comp.get(crate::ir::InstrId(o))
                    .and_then(|o| o.shape.as_ref())
                    .map_or_else(|| "?".to_string(), crate::ir::shape::describe)
            })
            .collect();
        let meta = instr.metadata.clone().unwrap_or_default();
        let (source_file, source_line) = if meta.source_file.is_empty() {
            source_of_frame(module, meta.stack_frame_id).unwrap_or_default()
        } else {
            (meta.source_file, meta.source_line)
        };
        let group_size = crate::ir::groups::ReplicaGroups::of(instr)
            .ok()
            .and_then(|g| g.uniform_size())
            .unwrap_or(0);
        let mut key = OpKey {
            op_name: meta.op_name,
            source_file,
            source_line,
            operands,
            group_size,
            occurrence: 0,
        };
        let n = self.seen.entry(key.clone()).or_insert(0);
        key.occurrence = *n;
        *n += 1;
        key
    }
}

/// The file and line of stack frame `id` (1-based, 0 = none) of the
/// module's stack-frame index: the innermost frame, where the op was made.
fn source_of_frame(module: &crate::ir::Module, id: i32) -> Option<(String, i32)> {
    let index = module.header().stack_frame_index.as_ref()?;
    let at = |i: i32| usize::try_from(i).ok()?.checked_sub(1);
    let frame = index.stack_frames.get(at(id)?)?;
    let loc = index.file_locations.get(at(frame.file_location_id)?)?;
    let file = index.file_names.get(at(loc.file_name_id)?)?;
    Some((file.clone(), loc.line))
}

/// One profiled op.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ProfiledOp {
    pub key: OpKey,
    pub stats: OpStats,
    pub nonfinite_fraction: f64,
}

/// A calibration profile: statistics of every collective of one program.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Profile {
    /// The file format (1).
    pub version: u32,
    /// What was measured: the program, the data, the date.
    pub source: String,
    /// The equarx that wrote it.
    pub equarx: String,
    pub ops: Vec<ProfiledOp>,
    /// The program's collectives calibration could not measure, and why
    /// (the pass then predicts them with the prior, and says so).
    #[serde(default)]
    pub unmeasured: Vec<UnmeasuredOp>,
}

/// A collective of the program that has no statistics in the profile.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct UnmeasuredOp {
    pub key: OpKey,
    pub reason: String,
}

/// A profile as the option holds it: how it was given (a file's path, or
/// the profile's JSON itself: what the option shows) and what it holds.
#[derive(Clone, Debug, PartialEq)]
pub struct ProfileFile {
    pub given: String,
    pub profile: std::sync::Arc<Profile>,
}

impl ProfileFile {
    /// Reads and checks the profile `given`: a JSON object (it starts with
    /// `{`), or the path of a file that holds one.
    pub fn read(given: &str) -> Result<ProfileFile, String> {
        let profile = if given.trim_start().starts_with('{') {
            Profile::from_json(given)?
        } else {
            let text =
                std::fs::read_to_string(given).map_err(|e| format!("cannot read {given}: {e}"))?;
            Profile::from_json(&text).map_err(|e| format!("{given}: {e}"))?
        };
        Ok(ProfileFile {
            given: given.to_string(),
            profile: std::sync::Arc::new(profile),
        })
    }
}

/// Why a profile holds nothing for an op.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unmatched {
    #[error("the profile has no op {0}")]
    NoEntry(String),
    #[error("calibration did not measure {name}: {reason}")]
    NotMeasured { name: String, reason: String },
    #[error(
        "the profile's op {name} was measured over {measured} ranks, this one runs over {here}"
    )]
    GroupSize {
        name: String,
        measured: usize,
        here: usize,
    },
}

impl Profile {
    /// Reads a profile file's JSON, checking its version.
    pub fn from_json(text: &str) -> Result<Profile, String> {
        let p: Profile = serde_json::from_str(text).map_err(|e| format!("not a profile: {e}"))?;
        if p.version != 1 {
            return Err(format!(
                "profile version {} (this equarx reads version 1)",
                p.version
            ));
        }
        Ok(p)
    }

    /// The entry measured on the op `key` names.
    pub fn find(&self, key: &OpKey) -> Result<&ProfiledOp, Unmatched> {
        if let Some(found) = self.ops.iter().find(|o| o.key == *key) {
            return Ok(found);
        }
        if let Some(u) = self.unmeasured.iter().find(|o| o.key == *key) {
            return Err(Unmatched::NotMeasured {
                name: describe(key),
                reason: u.reason.clone(),
            });
        }
        // The same op measured over another group: say so.
        let elsewhere = self.ops.iter().find(|o| {
            OpKey {
                group_size: key.group_size,
                ..o.key.clone()
            } == *key
        });
        Err(match elsewhere {
            Some(o) => Unmatched::GroupSize {
                name: describe(key),
                measured: o.key.group_size,
                here: key.group_size,
            },
            None => Unmatched::NoEntry(describe(key)),
        })
    }
}

/// `op_name (file:line) operands #occurrence`, for messages.
pub fn describe(key: &OpKey) -> String {
    let at = if key.source_file.is_empty() {
        String::new()
    } else {
        format!(" ({}:{})", key.source_file, key.source_line)
    };
    format!(
        "\"{}\"{at} of {} #{}",
        key.op_name,
        key.operands.join(", "),
        key.occurrence
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gaussian(devices: usize, n: usize, seed: u64) -> Vec<Vec<f32>> {
        let mut rng = super::super::simulate::Rng::new(seed);
        (0..devices)
            .map(|_| (0..n).map(|_| rng.gaussian() as f32).collect())
            .collect()
    }

    #[test]
    fn independent_gaussian_inputs_measure_as_the_textbook_model() {
        let p = 4;
        let s = op_stats(&gaussian(p, 1 << 16, 1), Inputs::Summed, "test").unwrap();
        let b64 = s
            .blocks
            .iter()
            .find(|b| b.block == 64 && b.rotation == Rotation::None)
            .unwrap();
        let kappa = super::super::error::gaussian_crest_sq(64);
        for k in 1..=p {
            let want_m = k as f64 / p as f64;
            assert!((b64.mean_sq[k - 1] / want_m - 1.0).abs() < 0.03, "M({k})");
            let want_a = kappa * want_m;
            assert!(
                (b64.absmax_sq[k - 1] / want_a - 1.0).abs() < 0.05,
                "A({k}) {} vs {want_a}",
                b64.absmax_sq[k - 1]
            );
        }
        // Rotation leaves Gaussian blocks Gaussian, and keeps the energy.
        let rot = s
            .blocks
            .iter()
            .find(|b| b.block == 64 && b.rotation == Rotation::Hadamard)
            .unwrap();
        assert!((rot.mean_sq[p - 1] - 1.0).abs() < 1e-9);
        assert!((rot.absmax_sq[p - 1] / b64.absmax_sq[p - 1] - 1.0).abs() < 0.05);
    }

    #[test]
    fn an_outlier_channel_is_what_rotation_removes() {
        let mut x = gaussian(2, 1 << 14, 2);
        for d in &mut x {
            for (i, v) in d.iter_mut().enumerate() {
                if i % 64 == 5 {
                    *v *= 100.0;
                }
            }
        }
        let s = op_stats(&x, Inputs::Summed, "test").unwrap();
        let at = |r| {
            s.blocks
                .iter()
                .find(|b| b.block == 64 && b.rotation == r)
                .unwrap()
                .absmax_sq[1]
        };
        assert!(at(Rotation::None) > 20.0 * at(Rotation::Hadamard));
    }

    #[test]
    fn the_fast_transform_is_the_passs_rotation() {
        let x: Vec<f32> = (0..64).map(|i| ((i * 37) % 11) as f32 - 5.0).collect();
        let want = super::super::rotate_block(&x);
        let mut got: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
        walsh_hadamard(&mut got);
        for (g, w) in got.iter().zip(&want) {
            assert!((g / 8.0 - f64::from(*w)).abs() < 1e-5);
        }
    }

    #[test]
    fn ops_match_by_identity_and_say_why_not() {
        let key = OpKey {
            op_name: "jit(f)/psum".into(),
            source_file: "model.py".into(),
            source_line: 12,
            operands: vec!["bf16[4,640]".into()],
            group_size: 4,
            occurrence: 1,
        };
        let profile = Profile {
            version: 1,
            source: "test".into(),
            equarx: "0".into(),
            ops: vec![ProfiledOp {
                key: key.clone(),
                stats: op_stats(&gaussian(4, 1024, 3), Inputs::Summed, "t").unwrap(),
                nonfinite_fraction: 0.0,
            }],
            unmeasured: vec![],
        };
        assert!(profile.find(&key).is_ok());
        let other = OpKey {
            occurrence: 2,
            ..key.clone()
        };
        assert!(matches!(profile.find(&other), Err(Unmatched::NoEntry(_))));
        let wider = OpKey {
            group_size: 8,
            ..key.clone()
        };
        assert!(matches!(
            profile.find(&wider),
            Err(Unmatched::GroupSize { measured: 4, .. })
        ));
        let text = serde_json::to_string(&profile).unwrap();
        assert_eq!(Profile::from_json(&text).unwrap(), profile);
        assert!(Profile::from_json("{}").is_err());
    }
}
