//! The choice of a plan per op: every configuration the options allow is
//! planned ([`crate::plan`]), timed by the cost model ([`crate::cost`]) and
//! given its predicted error ([`crate::numerics::error`]); the rules below
//! pick one, or say why none pays.
//!
//! 1. **Candidates**: every algorithm `--algorithm` allows (ring and
//!    two-shot, plus two-level when `--topology` names a 2-D slice of the
//!    group's size), each with and without rotation (`--rotation auto`,
//!    power-of-two blocks).
//! 2. **Predictions**: each is timed by the cost model and given its
//!    predicted error on the op's data as far as it is known
//!    ([`crate::numerics::error::Data`]: measured, from a calibration
//!    profile, or the prior fitted to real LLM activations).
//! 3. **Budget**: with `--max-error`, plans predicted above it go, and an
//!    op with none left is a skip. Without it, the default budget
//!    ([`DEFAULT_BUDGET_PCT`]) picks the plans within it; when none is, the
//!    most exact plan is taken, unless even that would break a model
//!    ([`MODEL_LIMIT_PCT`]) and the pass chose it (`--algorithm` or
//!    `--rotation` auto): then the op is a skip that says so.
//! 4. **Choice**: among the plans within 5 % of the fastest, the lowest
//!    predicted error wins (then the faster).
//! 5. **Worth it**: a plan that sends no fewer bytes, or (with the cost
//!    model deciding) that the model predicts slower, is a skip.

use super::eligibility::Candidate;
use super::skip::SkipReason;
use crate::cost::{PredictedTime, Prediction, Topology, predict};
use crate::numerics::error::{Data, predicted};
use crate::options::Options;
use crate::plan::{
    Algorithm, Collective, Config, Grid, Plan, PlanError, Rotation, baseline_wire_bytes,
};

/// The plan an op gets, with the time model's view of it.
pub struct Choice {
    pub plan: Plan,
    pub time: PredictedTime,
}

/// What a collective moves, as far as the choice cares.
#[derive(Clone, Copy, Debug)]
pub struct Payload {
    pub collective: Collective,
    pub elements: usize,
    /// Elements per row, for the collectives of rows ([`Plan::rows`]).
    pub row: Option<usize>,
    /// Bytes in the operands' own types.
    pub bytes: u64,
    /// Explicit mantissa bits of the narrowest operand type (bf16: 7).
    pub mantissa_bits: u32,
}

impl Payload {
    /// What candidate `c` moves.
    pub fn of(c: &Candidate) -> Payload {
        let elements: usize = c
            .quantized()
            .map(|o| crate::ir::shape::element_count(&o.shape).unwrap_or(u64::MAX) as usize)
            .fold(0usize, usize::saturating_add);
        let p = c.participants.group_size();
        // Rows: a reduce-scatter's or all-to-all's operand is P of them, an
        // all-gather's operand one.
        let row = match c.collective {
            Collective::AllReduce => None,
            Collective::AllGather => Some(elements),
            Collective::ReduceScatter | Collective::AllToAll => Some(elements / p.max(1)),
        };
        Payload {
            collective: c.collective,
            elements,
            row,
            bytes: c.payload_bytes,
            mantissa_bits: c.mantissa_bits(),
        }
    }

    /// Bytes per element in the operands' own types (the average over a
    /// tuple of several types).
    fn element_bytes(&self) -> f64 {
        self.bytes as f64 / self.elements.max(1) as f64
    }
}

/// How close to the fastest plan another must come for the choice to go
/// by predicted error instead.
const CHEAP: f64 = 1.05;

/// The error budget the choice keeps without `--max-error` (percent,
/// relative RMS per op): on gemma-3-270m (36 all-reduces) the perplexity
/// change grows about as 0.1 · error², so this keeps it near +0.25 %
/// (BENCHMARKS.md, "The error model on real inputs").
pub const DEFAULT_BUDGET_PCT: f64 = 1.5;

/// The predicted error (percent per op) above which the choice declines a
/// rewrite rather than take its most exact plan: about +10 % perplexity on
/// gemma-3-270m by the same rule.
pub const MODEL_LIMIT_PCT: f64 = 10.0;

/// Picks the plan for candidate `c` on what is known of its data, or
/// says why none pays.
pub fn choose(c: &Candidate, data: Data, options: &Options) -> Result<Choice, SkipReason> {
    choose_plan(
        c.participants.group_size(),
        &Payload::of(c),
        c.forced,
        data,
        options,
    )
}

/// The two-level grid `--topology` names for a group of `p`: its 2-D slice
/// shape, when that has `p` devices.
fn topology_grid(p: usize, topology: &Topology) -> Option<Grid> {
    match topology.slice.as_slice() {
        &[outer, inner] if outer >= 2 && inner >= 2 => {
            let (outer, inner) = (outer as usize, inner as usize);
            (outer.checked_mul(inner) == Some(p)).then_some(Grid { outer, inner })
        }
        _ => None,
    }
}

/// The configurations `options` allow for a group of `p`: every allowed
/// algorithm, each without and (where allowed) with rotation.
fn configurations(p: usize, options: &Options, topology: &Topology) -> Vec<Config> {
    let grid = topology_grid(p, topology);
    let algorithms: Vec<Algorithm> = match options.algorithm {
        Some(algorithm) => vec![algorithm],
        // Two-level only where the machine is a 2-D slice of the group.
        None => [Algorithm::Ring, Algorithm::TwoShot]
            .into_iter()
            .chain(grid.map(|_| Algorithm::TwoLevel))
            .collect(),
    };
    // An asked-for two-level over a group with no grid leaves nothing.
    let algorithms: Vec<(Algorithm, Option<Grid>)> = algorithms
        .into_iter()
        .filter_map(|a| Some((a, a.grid(p, grid).ok()?)))
        .collect();
    // Rotation evens out a block's magnitudes: it helps an integer code,
    // whose step follows the block's largest value, and hurts a float
    // code, which would otherwise hold that largest value exactly.
    let rotations: &[Rotation] = match options.rotation {
        Some(Rotation::None) => &[Rotation::None],
        Some(Rotation::Hadamard) => &[Rotation::Hadamard],
        None if options.block_size.is_power_of_two()
            && options.quant_format.mantissa_bits().is_none() =>
        {
            &[Rotation::None, Rotation::Hadamard]
        }
        None => &[Rotation::None],
    };
    let mut out = Vec::new();
    for &(algorithm, grid) in &algorithms {
        for &rotation in rotations {
            out.push(options.config(algorithm, grid, rotation));
        }
    }
    out
}

/// One planned configuration with the models' predictions.
struct Scored {
    plan: Plan,
    time: Prediction,
    /// Predicted relative RMS error, percent.
    error_pct: f64,
}

/// [`choose`] for a payload over groups of `p`; `forced` waives the
/// requirement that the rewrite pay. The steps of the module doc, in order.
pub fn choose_plan(
    p: usize,
    payload: &Payload,
    forced: bool,
    data: Data,
    options: &Options,
) -> Result<Choice, SkipReason> {
    // [`super::charges`] sets it for every op the pass prices.
    let topology = options.stated_topology();
    let configs = candidates(p, payload.collective, options, &topology)?;
    let scored = predictions(p, payload, data, &topology, configs)?;
    let within = within_budget(scored, options)?;
    worth_it(
        p,
        payload,
        forced,
        options,
        &topology,
        fastest_most_exact(within),
    )
}

/// Step 1: the configurations to plan for `collective` over groups of `p`.
fn candidates(
    p: usize,
    collective: Collective,
    options: &Options,
    topology: &Topology,
) -> Result<Vec<Config>, SkipReason> {
    let mut configs = configurations(p, options, topology);
    // The gather and the exchange of rows have no reduce algorithm to pick.
    // Kept: their one schedule is the plan's collective, and `Ring` here is
    // only the value one `Config` type for every kind must hold (their
    // labels, `gather`/`exchange`, never read it).
    match collective {
        Collective::AllReduce | Collective::ReduceScatter => {}
        Collective::AllGather | Collective::AllToAll => {
            if let Some(first) = configs.first().map(|c| c.algorithm) {
                configs.retain(|c| c.algorithm == first);
            }
            for c in &mut configs {
                c.algorithm = Algorithm::Ring;
                c.grid = None;
            }
        }
    }
    if configs.is_empty() {
        // Only an asked-for two-level can leave nothing to plan: a group
        // whose size has no grid.
        return Err(SkipReason::Plan(PlanError::NoGrid(p)));
    }
    Ok(configs)
}

/// Step 2: every configuration planned, timed and given its predicted
/// error; the first planning error when none could be planned.
fn predictions(
    p: usize,
    payload: &Payload,
    data: Data,
    topology: &Topology,
    configs: Vec<Config>,
) -> Result<Vec<Scored>, SkipReason> {
    let mut scored = Vec::new();
    let mut first_error = None;
    for config in configs {
        let planned = match payload.row {
            None => Plan::new(p, payload.elements, &config),
            Some(row) => Plan::rows(payload.collective, p, row, &config),
        };
        match planned {
            Ok(plan) => scored.push(Scored {
                time: predict(topology, &plan, payload.bytes, payload.element_bytes()),
                error_pct: 100.0 * predicted(&plan, data, payload.mantissa_bits),
                plan,
            }),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    if scored.is_empty() {
        // Every configuration was planned and refused (there was at least
        // one, [`candidates`] checks), so there is a first reason: say it.
        let Some(e) = first_error else {
            unreachable!("no configuration planned, yet none was refused")
        };
        return Err(SkipReason::Plan(e));
    }
    Ok(scored)
}

/// Step 3: the plans the error budget keeps (at least one), or why none.
fn within_budget(mut scored: Vec<Scored>, options: &Options) -> Result<Vec<Scored>, SkipReason> {
    let most_exact = |scored: &[Scored]| {
        scored
            .iter()
            .min_by(|a, b| a.error_pct.total_cmp(&b.error_pct))
            .map(|s| (describe_config(&s.plan.config), s.error_pct))
            .unwrap_or_default()
    };
    match options.max_error_pct {
        Some(budget) => {
            let (best, predicted) = most_exact(&scored);
            scored.retain(|s| s.error_pct <= budget);
            if scored.is_empty() {
                return Err(SkipReason::OverBudget {
                    budget,
                    best,
                    predicted,
                });
            }
        }
        None if scored.iter().any(|s| s.error_pct <= DEFAULT_BUDGET_PCT) => {
            scored.retain(|s| s.error_pct <= DEFAULT_BUDGET_PCT);
        }
        None => {
            let (best, predicted) = most_exact(&scored);
            // The limit guards the pass's own choices; a plan the options
            // fix entirely (algorithm and rotation) is the user's.
            let chosen_here = options.algorithm.is_none() || options.rotation.is_none();
            if chosen_here && predicted > MODEL_LIMIT_PCT {
                return Err(SkipReason::BreaksModel {
                    limit: MODEL_LIMIT_PCT,
                    best,
                    predicted,
                });
            }
            scored.retain(|s| s.error_pct <= predicted);
        }
    }
    Ok(scored)
}

/// Step 4: the fastest plan (by total order: a NaN prediction sorts last),
/// then among those within [`CHEAP`] of it, itself included, the most
/// exact. `scored` holds at least one plan.
fn fastest_most_exact(scored: Vec<Scored>) -> Scored {
    let fastest = scored
        .iter()
        .map(|s| s.time.equarx_us)
        .min_by(f64::total_cmp)
        .unwrap_or(f64::INFINITY);
    let (near, rest): (Vec<Scored>, Vec<Scored>) = scored
        .into_iter()
        .partition(|s| s.time.equarx_us <= CHEAP * fastest);
    // `scored` held a plan, so `near` or `rest` does.
    let pool = if near.is_empty() { rest } else { near };
    let Some(chosen) = pool.into_iter().min_by(|a, b| {
        a.error_pct
            .total_cmp(&b.error_pct)
            .then(a.time.equarx_us.total_cmp(&b.time.equarx_us))
    }) else {
        unreachable!("a non-empty set of plans has a most exact one")
    };
    chosen
}

/// Step 5: the chosen plan, if it sends fewer bytes and (with the cost
/// model deciding) the model predicts it faster; `forced` waives both.
fn worth_it(
    p: usize,
    payload: &Payload,
    forced: bool,
    options: &Options,
    topology: &Topology,
    chosen: Scored,
) -> Result<Choice, SkipReason> {
    let (plan, prediction) = (chosen.plan, chosen.time);
    let before = baseline_wire_bytes(payload.collective, p, payload.bytes);
    if plan.wire_bytes() >= before && !forced {
        return Err(SkipReason::NoGain {
            collective: payload.collective.opcode(),
            plan: plan.algorithm_name(),
            before,
            after: plan.wire_bytes(),
        });
    }
    let time = PredictedTime {
        topology: topology.name.clone(),
        baseline_us: prediction.baseline_us,
        equarx_us: prediction.equarx_us,
        speedup: prediction.speedup(),
    };
    if options.min_payload_bytes.is_none() && !forced && time.speedup < 1.0 {
        return Err(SkipReason::NotFaster {
            time,
            collective: payload.collective.opcode(),
            plan: plan.algorithm_name(),
            padded: topology.wire_row_bytes > 0,
        });
    }
    Ok(Choice { plan, time })
}

/// `ring + hadamard`, for messages.
fn describe_config(c: &Config) -> String {
    match c.rotation {
        Rotation::None => c.algorithm_label(),
        Rotation::Hadamard => format!("{} + hadamard", c.algorithm_label()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tuple of several types costs its exact bytes: bf16[3] and f32[1]
    /// are 10 bytes over 4 elements, 2.5 each. An integer average (2)
    /// would undercount the f32 operand in the cost model's memory terms,
    /// which multiply it by element counts.
    #[test]
    fn a_mixed_type_tuple_averages_its_bytes_exactly() {
        let p = Payload {
            collective: Collective::AllReduce,
            elements: 4,
            row: None,
            bytes: 3 * 2 + 4,
            mantissa_bits: 7,
        };
        assert_eq!(p.element_bytes(), 2.5);
        assert_eq!(p.element_bytes() * p.elements as f64, p.bytes as f64);
    }
}
