//! The error model: how far the quantized collective lands from the exact
//! result, predicted from the plan and from what is known of the data.
//!
//! A plan quantizes partial sums on every value's way ([`Plan::partials`]:
//! `count` quantizations of partials of `k` device inputs each). An integer
//! code of block absmax `a` rounds with an error uniform in ±step/2,
//! `step = a/q`: a variance of `a²/(12·q²)` per element. A float code rounds
//! each value to its own mantissa: a variance proportional to the value's
//! square. Every error reaches the result once, so, with `S` the result's
//! mean square,
//!
//! ```text
//! integer codes:  rel² = Σ count · A(k) / (12 · q² · S)     A(k) = E[block absmax² of a partial of k inputs]
//! float codes:    rel² = Σ count · c_m · M(k) / S            M(k) = E[square of a partial of k inputs]
//! ```
//!
//! plus rounding the result to its own type, in quadrature. What is known
//! of the data ([`Data`]) gives `A(k)/S` and `M(k)/S`:
//!
//! - **measured** on an op's own inputs (a calibration profile,
//!   [`OpStats`]): exact, per block size and rotation, and better than
//!   both laws: the profile holds what one quantization of each partial
//!   actually errs, per format ([`BlockStats::rounding`]);
//! - **a crest factor** `κ² = E[absmax²]/E[x²]` of independent inputs
//!   (`A(k) = κ²·k·σ²`, `M(k) = k·σ²`, `S = P·σ²`): the textbook model,
//!   `rel = κ · sqrt(w / (12·q²))` with `w = Σ count·k / P` the plan's noise
//!   weight (ring: (P+1)/2, two-shot: 2, two-level P1×P2: (P1+P2)/2);
//! - **Gaussian** data: κ² of Gaussian blocks, which rotation leaves as
//!   they are;
//! - **the prior** ([`prior`]): measured on the all-reduce inputs of a
//!   real LLM, by block size and rotation: κ², and one quantization's
//!   relative error per format. This is what the pass predicts with when it
//!   knows nothing else.
//!
//! Real activations have outlier channels, and the laws above miss what
//! those do, three ways, which the measured rounding errors see:
//!
//! - **integer codes, rotation's gain**: one outlier sets its block's step,
//!   so outlier blocks' κ² is many times a Gaussian block's. Rotated, a
//!   block's energy is spread evenly and κ² falls near the Gaussian value.
//! - **int4's trouble, and its limit**: `q = 7` instead of 127, 18× the
//!   error of int8 on the same data. But an outlier block's step is then
//!   larger than most of its values, which round to 0: an error no larger
//!   than the value, well under `step²/12` (the law over-states unrotated
//!   int4 on such data about 2×).
//! - **float codes, rotation's harm**: a float code rounds each value to
//!   its own mantissa, except that the block's largest value lands on the
//!   format's largest code, exactly. Unrotated, outlier channels put most
//!   of the energy in those exact values; rotated, the energy is spread
//!   over values that all round. On gemma-3-270m's all-reduce inputs
//!   rotation raises one fp8-e4m3 quantization's error from 2.3 % to
//!   2.7 % at B = 64 (1.7 % to 2.2 % at B = 8): rotation costs float codes
//!   where it pays integer ones.

use crate::plan::{Plan, QuantFormat, Rotation};

/// What the model knows of the data a plan quantizes.
#[derive(Clone, Copy, Debug)]
pub enum Data<'a> {
    /// Independent inputs whose blocks (as quantized: rotated when the plan
    /// rotates) have crest factor κ² = E[absmax²]/E[x²] (e.g. measured on
    /// the data).
    Crest(f64),
    /// Independent Gaussian inputs.
    Gaussian,
    /// Nothing measured: the prior, fitted to real LLM all-reduce inputs.
    Prior,
    /// Measured on this op's inputs.
    Measured(&'a OpStats),
}

impl Data<'_> {
    /// What the prediction assumed, for the report.
    pub fn describe(&self) -> String {
        match self {
            Data::Crest(k) => format!("independent inputs, crest factor κ² = {k:.2}"),
            Data::Gaussian => "Gaussian inputs".into(),
            Data::Prior => format!("the prior ({})", prior().source),
            Data::Measured(s) => format!("measured on this op's inputs ({})", s.source),
        }
    }

    /// What a prediction for `plan` assumed, with the statistic it used.
    pub fn describe_for(&self, plan: &Plan) -> String {
        let (b, r) = (plan.block(), plan.config.rotation);
        let f = plan.config.format;
        let prior_stat = || match prior().rounding_sq(b, r, f) {
            Some(one) => format!(
                "one {f} quantization errs {:.2}% (relative RMS) at B = {b}, rotation {r}",
                one.sqrt() * 100.0
            ),
            None => format!(
                "block crest factor κ² = {:.2} at B = {b}, rotation {r}",
                prior().crest_sq(b, r)
            ),
        };
        match self {
            Data::Prior => format!("the prior: {} ({})", prior_stat(), prior().source),
            Data::Gaussian => format!(
                "Gaussian inputs: κ² = {:.2} at B = {b}",
                gaussian_crest_sq(b)
            ),
            Data::Measured(s) if measured_sq(plan, s).is_none() => format!(
                "the prior (the profile measured no B = {b}, rotation {r}): {}",
                prior_stat()
            ),
            Data::Measured(s) => {
                let x = s.blocks.iter().find(|x| x.block == b && x.rotation == r);
                let rel = |v: Option<&f64>| -> f64 {
                    match (v, x.and_then(|x| x.mean_sq.last())) {
                        (Some(v), Some(m)) if *m > 0.0 => v / m,
                        _ => f64::NAN,
                    }
                };
                let stat = match x.and_then(|x| x.rounding.iter().find(|q| q.format == f)) {
                    Some(q) => format!(
                        "one {f} quantization of the sum errs {:.2}% (relative RMS)",
                        rel(q.err_sq.last()).sqrt() * 100.0
                    ),
                    None => format!("κ² = {:.2}", rel(x.and_then(|x| x.absmax_sq.last()))),
                };
                format!(
                    "the profile: this op's inputs measured, {stat} at B = {b}, rotation {r}, \
                     and its partial sums' ({})",
                    s.source
                )
            }
            other => other.describe(),
        }
    }
}

/// Statistics of one collective's inputs, measured on a run of the program
/// (a calibration profile's entry), for the error model: per block size
/// and rotation, `A(k)/S` and `M(k)/S` for partial sums of k consecutive
/// ranks, k = 1..=P.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct OpStats {
    /// Where the numbers come from (the profile's model and date).
    pub source: String,
    /// The group the inputs came from.
    pub group_size: usize,
    pub blocks: Vec<BlockStats>,
}

impl OpStats {
    /// Whether these statistics cover `plan` (its block size and rotation,
    /// and its partials); if not, it is predicted with the prior.
    pub fn holds(&self, plan: &Plan) -> bool {
        measured_sq(plan, self).is_some()
    }
}

/// [`OpStats`] at one block size and rotation.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct BlockStats {
    pub block: usize,
    pub rotation: Rotation,
    /// `E[block absmax²] / S` of partial sums of k consecutive ranks, at
    /// index k−1 (k = P: the complete sum); S is the complete sum's mean
    /// square. For the collectives of rows (all-gather, all-to-all), k = 1
    /// and S is the input's mean square.
    pub absmax_sq: Vec<f64>,
    /// `E[square] / S` of the same partials.
    pub mean_sq: Vec<f64>,
    /// What one quantization of the same partials costs, measured: per
    /// format, `E[(x − Q(x))²] / S` at index k−1. Where it is given the
    /// model uses it rather than the absmax law, which over-states what
    /// a coarse code does to an outlier's block: a step larger than most
    /// of its values rounds them to 0, an error no larger than the value
    /// (int4 beside a 40× channel: 2.3× over). Profiles written before it
    /// was measured hold none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rounding: Vec<Rounding>,
}

/// One format's measured rounding error ([`BlockStats::rounding`]).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Rounding {
    pub format: QuantFormat,
    /// `E[(x − Q(x))²] / S` of partials of k ranks, at index k−1.
    pub err_sq: Vec<f64>,
}

/// The prior: κ² of real LLM all-reduce inputs, by block size, unrotated
/// and rotated.
#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
pub struct Prior {
    /// What was measured (`bench/model/prior.py` writes it).
    pub source: String,
    /// The command and the commit that measured it.
    pub command: String,
    pub commit: String,
    /// (block size, κ² unrotated, κ² Hadamard-rotated), block sizes rising.
    pub crest_sq: Vec<(usize, f64, f64)>,
    /// One quantization's relative error², `E[(x − Q(x))²] / E[x²]`, per
    /// format: measured on the same inputs, the largest over ops and
    /// partial sums. Where it is given it replaces the laws of
    /// [`one_quantization_sq`], which real activations break both ways: an
    /// integer step larger than most of a block's values rounds them to 0
    /// (an error no larger than the value), and a float code keeps the
    /// block's largest value exact, which unrotated outlier channels make
    /// most of the energy (rotation spreads it, and every value rounds).
    #[serde(default)]
    pub rounding: Vec<PriorRounding>,
}

/// [`Prior::rounding`] of one format.
#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
pub struct PriorRounding {
    pub format: QuantFormat,
    /// (block size, unrotated, Hadamard-rotated), block sizes rising.
    pub rel_sq: Vec<(usize, f64, f64)>,
}

/// The prior the pass predicts with when it knows nothing else:
/// `prior.json`, written by `bench/model/prior.py` from the all-reduce
/// inputs of a real LLM (gemma-3-270m, tensor-parallel; BENCHMARKS.md says
/// how it was measured). It holds the largest κ² over the model's ops and
/// over partial sums, so that the prediction is at or above what those
/// inputs err.
pub fn prior() -> &'static Prior {
    static PRIOR: std::sync::OnceLock<Prior> = std::sync::OnceLock::new();
    PRIOR.get_or_init(|| {
        let p: Prior = serde_json::from_str(include_str!("prior.json"))
            .unwrap_or_else(|e| unreachable!("prior.json is checked by a unit test: {e}"));
        p
    })
}

impl Prior {
    /// κ² at block size `block` and `rotation` (interpolated in log block
    /// size between the measured sizes; beyond them, the nearest's), never
    /// below a Gaussian block's.
    pub fn crest_sq(&self, block: usize, rotation: Rotation) -> f64 {
        interpolate(&self.crest_sq, block, rotation)
            .unwrap_or(0.0)
            .max(gaussian_crest_sq(block))
    }

    /// The relative error² of one quantization in `format`, measured
    /// (interpolated as [`Prior::crest_sq`]); `None` where the prior holds
    /// no measurement of the format, and the absmax law applies.
    pub fn rounding_sq(
        &self,
        block: usize,
        rotation: Rotation,
        format: QuantFormat,
    ) -> Option<f64> {
        let r = self.rounding.iter().find(|r| r.format == format)?;
        interpolate(&r.rel_sq, block, rotation)
    }
}

/// A (block size, unrotated, rotated) table at `block`: interpolated in log
/// block size between its sizes; beyond them, the nearest's.
fn interpolate(t: &[(usize, f64, f64)], block: usize, rotation: Rotation) -> Option<f64> {
    let pick = |r: &(usize, f64, f64)| match rotation {
        Rotation::None => r.1,
        Rotation::Hadamard => r.2,
    };
    let b = block.max(1) as f64;
    Some(match t.iter().position(|r| b <= r.0 as f64) {
        _ if t.is_empty() => return None,
        Some(0) => pick(&t[0]),
        Some(k) => {
            let (lo, hi) = (&t[k - 1], &t[k]);
            let f = (b.ln() - (lo.0 as f64).ln()) / ((hi.0 as f64).ln() - (lo.0 as f64).ln());
            pick(lo) + f * (pick(hi) - pick(lo))
        }
        None => pick(&t[t.len() - 1]),
    })
}

/// Relative RMS error of one quantization in `format` of values whose
/// blocks have crest factor κ², relative to those values: an integer
/// code's step follows the block's absmax (`q` its largest code); a float
/// code rounds every value to its own mantissa.
fn one_quantization_sq(format: QuantFormat, crest_sq: f64) -> f64 {
    match format.mantissa_bits() {
        Some(m) => output_rounding_rel_rms(m).powi(2),
        None => {
            let q = f64::from(format.qmax());
            crest_sq / (12.0 * q * q)
        }
    }
}

/// The predicted relative RMS error of `plan` on `data`, with the result
/// rounded to a type of `mantissa_bits` explicit mantissa bits.
pub fn predicted(plan: &Plan, data: Data, mantissa_bits: u32) -> f64 {
    let quant_sq = match data {
        Data::Measured(stats) => match measured_sq(plan, stats) {
            Some(v) => v,
            // No statistics at this block size and rotation: the prior.
            None => prior_sq(plan),
        },
        Data::Crest(k) => independent_sq(plan, k),
        Data::Gaussian => independent_sq(plan, gaussian_crest_sq(plan.block())),
        Data::Prior => prior_sq(plan),
    };
    let out = output_rounding_rel_rms(mantissa_bits);
    (quant_sq + out * out).sqrt()
}

/// rel² of `plan`'s quantizations on the prior: its measured rounding
/// error where it holds the format, else the absmax law on its κ².
fn prior_sq(plan: &Plan) -> f64 {
    let (b, r, f) = (plan.block(), plan.config.rotation, plan.config.format);
    match prior().rounding_sq(b, r, f) {
        Some(one) => one * plan.noise_weight(),
        None => independent_sq(plan, prior().crest_sq(b, r)),
    }
}

/// rel² of `plan`'s quantizations on independent inputs of crest κ².
fn independent_sq(plan: &Plan, crest_sq: f64) -> f64 {
    one_quantization_sq(plan.config.format, crest_sq) * plan.noise_weight()
}

/// rel² of `plan`'s quantizations from measured statistics, if they hold
/// the plan's block size and rotation and its partials.
fn measured_sq(plan: &Plan, stats: &OpStats) -> Option<f64> {
    let b = stats
        .blocks
        .iter()
        .find(|b| b.block == plan.block() && b.rotation == plan.config.rotation)?;
    let format = plan.config.format;
    let rounding = b.rounding.iter().find(|r| r.format == format);
    let mut sum = 0.0;
    for q in plan.partials() {
        let k = q.inputs.checked_sub(1)?;
        let v = match (rounding, format.mantissa_bits()) {
            (Some(r), _) => *r.err_sq.get(k)?,
            (None, Some(m)) => output_rounding_rel_rms(m).powi(2) * b.mean_sq.get(k)?,
            (None, None) => {
                let qmax = f64::from(format.qmax());
                b.absmax_sq.get(k)? / (12.0 * qmax * qmax)
            }
        };
        sum += q.count as f64 * v;
    }
    Some(sum)
}

/// The relative RMS error of `format` codes after quantizations of noise
/// weight `w` on independent inputs of crest κ² (the textbook model).
pub fn format_rel_rms(format: QuantFormat, w: f64, crest_sq: f64) -> f64 {
    (one_quantization_sq(format, crest_sq) * w).sqrt()
}

/// The paper's ring over `p` ranks, int8: `w = (P+1)/2`.
pub fn ring_rel_rms(p: usize, crest_sq: f64) -> f64 {
    format_rel_rms(QuantFormat::Int8, (p as f64 + 1.0) / 2.0, crest_sq)
}

/// κ² = E[max of `block` |N(0,1)|²]: the crest factor of Gaussian blocks
/// (computed once per block size).
pub fn gaussian_crest_sq(block: usize) -> f64 {
    use std::collections::BTreeMap;
    use std::sync::{Mutex, OnceLock};
    static MEMO: OnceLock<Mutex<BTreeMap<usize, f64>>> = OnceLock::new();
    let memo = MEMO.get_or_init(Default::default);
    if let Some(&k) = memo.lock().unwrap_or_else(|e| e.into_inner()).get(&block) {
        return k;
    }
    let k = gaussian_crest_sq_uncached(block);
    memo.lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(block, k);
    k
}

fn gaussian_crest_sq_uncached(block: usize) -> f64 {
    // E[M²] = ∫ 2m · P(M > m) dm with P(M ≤ m) = erf(m/√2)^B.
    let b = block.max(1) as i32;
    let h = 1e-3;
    (0..14_000)
        .map(|i| {
            let m = (f64::from(i) + 0.5) * h;
            2.0 * m * (1.0 - erf(m / std::f64::consts::SQRT_2).powi(b)) * h
        })
        .sum()
}

/// Relative RMS error of rounding to an element type with `mantissa_bits`
/// explicit mantissa bits (bf16: 7, f32: 23), for values whose mantissas
/// are log-uniform: `2^-m / sqrt(12 · E[mantissa²])`.
pub fn output_rounding_rel_rms(mantissa_bits: u32) -> f64 {
    let e_m2 = 1.5 / std::f64::consts::LN_2; // E[m²], m log-uniform in [1, 2)
    2f64.powi(-(mantissa_bits as i32)) / (12.0 * e_m2).sqrt()
}

/// The predicted relative RMS error of `plan` with what the pass knows by
/// default (the prior), the result rounded to a type of `mantissa_bits`.
pub fn predicted_rel_rms(plan: &Plan, mantissa_bits: u32) -> f64 {
    predicted(plan, Data::Prior, mantissa_bits)
}

/// The model's relative RMS error of `plan` for independent inputs whose
/// blocks have crest factor `crest_sq` (κ², e.g. measured on the data the
/// quantizer sees), with the result rounded to a type with `mantissa_bits`.
pub fn rel_rms_with_crest(plan: &Plan, crest_sq: f64, mantissa_bits: u32) -> f64 {
    predicted(plan, Data::Crest(crest_sq), mantissa_bits)
}

/// κ² measured on data: mean over blocks of absmax², over mean of v².
pub fn measured_crest_sq(v: &[f32], block: usize) -> f64 {
    let (mut sum_max_sq, mut sum_sq, mut blocks) = (0.0f64, 0.0f64, 0usize);
    for b in v.chunks(block.max(1)) {
        let m = b.iter().fold(0.0f64, |m, &x| m.max(f64::from(x).abs()));
        sum_max_sq += m * m;
        sum_sq += b.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>();
        blocks += 1;
    }
    if sum_sq == 0.0 {
        return 0.0;
    }
    (sum_max_sq / blocks as f64) / (sum_sq / v.len() as f64)
}

/// erf with absolute error below 1.2e-7 (Numerical Recipes' erfc Chebyshev
/// fit), enough for the crest integral.
fn erf(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -z * z - 1.265_512_23
        + t * (1.000_023_68
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98
                                + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let erfc = t * poly.exp();
    if x >= 0.0 { 1.0 - erfc } else { erfc - 1.0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{Algorithm, Config, test_config};

    #[test]
    fn gaussian_crest_matches_sampling() {
        // Monte-Carlo values (20000 blocks, numpy): 5.73, 8.15, 10.71.
        for (b, k) in [(32, 5.73), (128, 8.153), (512, 10.705)] {
            let got = gaussian_crest_sq(b);
            assert!((got - k).abs() / k < 0.02, "B={b}: {got} vs {k}");
        }
    }

    #[test]
    fn error_grows_with_group_and_block_size() {
        assert!(ring_rel_rms(8, 8.0) > ring_rel_rms(2, 8.0));
        assert!(
            format_rel_rms(QuantFormat::Int8, 2.0, gaussian_crest_sq(512))
                > format_rel_rms(QuantFormat::Int8, 2.0, gaussian_crest_sq(32))
        );
        // P = 8, B = 128: about 1.4 % for Gaussian data.
        let e = ring_rel_rms(8, gaussian_crest_sq(128));
        assert!((0.012..0.016).contains(&e), "{e}");
    }

    fn plan(algorithm: Algorithm, rotation: Rotation, format: QuantFormat) -> Plan {
        let c = Config {
            rotation,
            format,
            ..test_config(algorithm)
        };
        Plan::new(8, 1 << 16, &c).unwrap()
    }

    #[test]
    fn measured_statistics_of_independent_inputs_give_the_textbook_model() {
        // Independent inputs of crest κ²: A(k)/S = κ²·k/P, M(k)/S = k/P.
        let (p, kappa) = (8usize, 9.0);
        let stats = |rotation| BlockStats {
            block: 64,
            rotation,
            absmax_sq: (1..=p).map(|k| kappa * k as f64 / p as f64).collect(),
            mean_sq: (1..=p).map(|k| k as f64 / p as f64).collect(),
            rounding: Vec::new(),
        };
        let op = OpStats {
            source: "test".into(),
            group_size: p,
            blocks: vec![stats(Rotation::None), stats(Rotation::Hadamard)],
        };
        for a in [Algorithm::Ring, Algorithm::TwoShot, Algorithm::TwoLevel] {
            for f in [QuantFormat::Int8, QuantFormat::Int4, QuantFormat::Fp8E4m3] {
                let pl = plan(a, Rotation::None, f);
                let m = predicted(&pl, Data::Measured(&op), 23);
                let c = predicted(&pl, Data::Crest(kappa), 23);
                assert!((m / c - 1.0).abs() < 1e-12, "{a} {f}: {m} vs {c}");
            }
        }
    }

    #[test]
    fn the_prior_makes_rotation_pay_for_integer_codes_and_cost_float_codes() {
        let pred = |r, f| predicted(&plan(Algorithm::Ring, r, f), Data::Prior, 23);
        for f in [QuantFormat::Int8, QuantFormat::Int4] {
            let (plain, rotated) = (pred(Rotation::None, f), pred(Rotation::Hadamard, f));
            assert!(rotated < 0.6 * plain, "{f}: {rotated} vs {plain}");
        }
        // Real activations' block maxima hold most of their energy, and a
        // float code keeps each block's maximum exact: rotation spreads
        // the energy over values that all round.
        for f in [QuantFormat::Fp8E4m3, QuantFormat::Fp8E5m2] {
            let (plain, rotated) = (pred(Rotation::None, f), pred(Rotation::Hadamard, f));
            assert!(rotated > 1.1 * plain, "{f}: {rotated} vs {plain}");
        }
        // On Gaussian data rotation changes nothing.
        let g = |r| {
            predicted(
                &plan(Algorithm::TwoShot, r, QuantFormat::Int8),
                Data::Gaussian,
                23,
            )
        };
        assert_eq!(g(Rotation::None), g(Rotation::Hadamard));
    }

    #[test]
    fn the_prior_holds_every_formats_rounding_at_every_block_size() {
        use crate::choice::Choice;
        for &f in QuantFormat::ALL {
            let r = prior().rounding.iter().find(|r| r.format == f);
            let r = r.unwrap_or_else(|| panic!("prior.json measures no {f} rounding"));
            let blocks: Vec<usize> = r.rel_sq.iter().map(|x| x.0).collect();
            let crest: Vec<usize> = prior().crest_sq.iter().map(|x| x.0).collect();
            assert_eq!(blocks, crest, "{f}");
            assert!(r.rel_sq.iter().all(|x| x.1 > 0.0 && x.2 > 0.0), "{f}");
        }
    }

    #[test]
    fn the_prior_is_never_below_gaussian() {
        for b in [4, 8, 16, 32, 64, 100, 128, 256, 512, 1024] {
            for r in [Rotation::None, Rotation::Hadamard] {
                assert!(prior().crest_sq(b, r) >= gaussian_crest_sq(b), "B={b} {r}");
            }
        }
    }
}
