//! The time model: how long XLA's bf16 all-reduce and equarx's plan take on
//! a named topology. Every TPU and GPU figure here is a **model**, built
//! from public specifications and stated assumptions; no accelerator was
//! measured. (What was measured, on CPUs over shaped links, is in
//! BENCHMARKS.md.)
//!
//! The baseline is XLA's all-reduce in the payload's own type, the better
//! of a bidirectional ring (`2(P−1)·α + 2(P−1)/P·S / β` for `S` payload
//! bytes) and a two-shot exchange (fewer steps, the same bytes on a switch):
//! equarx is never credited with an algorithm change it did not make.
//! equarx's time is read off the [`Plan`], phase by phase, each phase's
//! bytes ([`Plan::phase_wire_bytes`]) over the links it uses:
//!
//! ```text
//! ring over Q ranks    (Q−1)·α + k·(ring_phase + (Q−1)·lanes·ring_hop) + bytes / β_ring
//! exchange over Q      switch: α + k·phase + bytes / β_egress
//!                      torus ring: the average message crosses Q/4 links,
//!                      (Q/2)·α + k·phase + bytes·Q²/(4(Q−1)) / β_ring
//! gather               switch: α + k·phase + bytes / β_egress;
//!                      torus: (P−1)·α + k·phase + bytes / β_ring
//! ```
//!
//! plus `k·op` once an op (the kernels outside its phases: the Mosaic
//! plans' dequantize), where `k` is one kernel's launch cost (a model assumption) and the
//! kernel counts ([`Kernels`]) are what XLA:TPU and XLA:GPU compiled of
//! equarx's rewrites, counted in their compiled modules: every kernel a
//! hop runs pays its launch, not one per hop.
//!
//! plus `C`, the quantize/dequantize work, bound by HBM bandwidth: every
//! hop reads the received codes (1 B), the device's own part (its input
//! type, f32 once rotated) and writes the next message (1 B) per element;
//! an exchange quantizes everything once and dequantizes what it receives;
//! the gather reads every code and writes the output type; a rotation is
//! one more pass over the input (its inverse rides on the gather's
//! dequantize, a dot whose scaling the backend fuses). With two chains
//! or more the work of one overlaps the transfer of another (`max` plus one
//! chain's fill); with one they add. A loop form pays `α_loop` per
//! iteration (a model assumption: TPU 1 µs, GPU 8 µs, a device-side
//! condition and its synchronisation).
//!
//! Link bandwidth: a TPU chip has `ports` ICI links, each carrying
//! `ici/ports/2` per direction; a ring uses one link each way round, a
//! bidirectional ring both directions of both. Without wraparound (a slice
//! smaller than the torus) the ring folds back over a line and its busiest
//! link carries two ring edges: half the bandwidth. NVSwitch GPUs give every
//! pattern (ring, all-to-all, all-gather) the GPU's full NVLink egress.

use crate::plan::{Collective, Form, Phase, Plan, Rotation, baseline_wire_bytes};

/// A named machine, with the public figures the model uses.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Topology {
    pub name: String,
    /// Bidirectional interconnect bandwidth per chip, GB/s.
    pub interconnect_gbps: f64,
    /// Interconnect ports (links) per chip; 0 for a switched fabric.
    pub ports: u32,
    /// HBM bandwidth per chip, GB/s.
    pub hbm_gbps: f64,
    /// Per-step latency of a collective hop (model assumption), µs.
    pub step_latency_us: f64,
    /// The launch cost of one kernel (model assumption), µs.
    pub kernel_latency_us: f64,
    /// How many kernels equarx's rewrite runs there, as its compiler made
    /// them.
    pub kernels: Kernels,
    /// Per-iteration cost of a `while` loop (model assumption), µs.
    pub loop_step_us: f64,
    /// The bytes a row of a message's codes occupies on the wire where the
    /// compiler pads each row of a tiled array to its tile's lanes: 128
    /// past XLA:TPU's tiling assignment, where a block's 64 int8 codes
    /// (`s8[.., 64]{..:T(8,128)(4,1)}`) fill a buffer of 128 bytes a
    /// block (BENCHMARKS.md, "The wire's tiles at XLA:TPU's hook"); 0
    /// where an array travels as its elements.
    pub wire_row_bytes: u32,
    /// Whether the ring closes over a wraparound link.
    pub wraparound: bool,
    /// The slice's shape when one was named (`v5e:2x4` → `[2, 4]`).
    pub slice: Vec<u32>,
    /// Where the figures come from.
    pub source: &'static str,
}

/// The kernels a rewrite runs, per part of its plan, counted in what the
/// backend's compiler made of equarx's rewrite of one 8 MiB bf16 psum
/// (`bench/compile/compilers.py --programs psum --option algorithm=ring`
/// and `=two-shot`, rotated, deviceless; BENCHMARKS.md, "Kernels per hop
/// in the time model"): a fusion is one kernel, so is an op left unfused.
/// A loop body's kernels run once per iteration.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Kernels {
    /// Per hop of one ring lane: the loop body's kernels, its condition
    /// included, over the lanes one iteration moves.
    pub ring_hop: f64,
    /// Once per ring phase, around the loop: the lanes cut and joined, the
    /// rotation, the loop's set-up.
    pub ring_phase: f64,
    /// Per exchange, scatter or gather phase: its quantize, the
    /// collective's relayouts and its dequantize(-accumulate); the
    /// rotation of a plan without a ring is counted here too.
    pub phase: f64,
    /// Once per op, outside its phases: none in the HLO emission, whose
    /// phases hold every kernel; the dequantize of equarx's Mosaic plans
    /// ([`MOSAIC_KERNELS`]).
    pub op: f64,
    /// Which compiler made the modules the counts come from.
    pub source: &'static str,
}

/// XLA:TPU (libtpu 0.0.42.1, v5e:2x2, the door before XLA, which carries
/// rotated plans; a message's codes and scales apart, the form equarx
/// emits for XLA:TPU): the ring's loop body is 14 kernels and its
/// condition 1, for 2 lanes; 25 kernels outside the loop, the gather
/// included; two-shot is 12 kernels in all (commit d7f596c).
const TPU_KERNELS: Kernels = Kernels {
    ring_hop: 7.5,
    ring_phase: 19.0,
    phase: 6.0,
    op: 0.0,
    source: "XLA:TPU (libtpu 0.0.42.1) compiled",
};

/// XLA:TPU at its pre-scheduler hook (libtpu 0.0.42.1, v5e:2x2), where
/// the module is tiled and fused: equarx's own loop fusions (elementwise
/// chains, an exchange's halves added, their reduces; a block's scale and
/// its wire bits one multi-output fusion) and the rotation's fused
/// product are a kernel each, every other op it emits is a kernel of its
/// own. The ring's loop body and condition are 18 kernels for 2 lanes; 18
/// outside the loop, the gather (a phase) included; two-shot is 14 in all
/// (before the exchange's sum, the scales' decode and the multi-output
/// scales joined fusions and the rotation's products took bf16 values
/// and s8 codes as they are: 22, 23 and 24; before the array all-to-all
/// and the shared scale chains: 30, 33 and 56). The pass charges these at
/// that stage (`QuantizeCollectives::new`).
pub const TPU_HOOK_KERNELS: Kernels = Kernels {
    ring_hop: 9.0,
    ring_phase: 11.0,
    phase: 7.0,
    op: 0.0,
    source: "XLA:TPU (libtpu 0.0.42.1) compiled at its hook",
};

/// [`Topology::wire_row_bytes`] past XLA:TPU's tiling assignment: a tile's
/// 128 lanes, the bytes of a row of s8 codes in `T(8,128)(4,1)` tiles.
pub const TILED_WIRE_ROW_BYTES: u32 = 128;

/// The kernels of the plans equarx writes as Mosaic kernels
/// (`kernels=mosaic`, XLA:TPU): one a phase, the quantize before its
/// collective (for two-shot's gather, the sum that requantizes what the
/// exchange brought), and one an op, the dequantize at the end: 3 for
/// two-shot's all-reduce, 2 for an all-gather, counted in what libtpu
/// 0.0.42.1 compiled through either door (BENCHMARKS.md, "equarx's own
/// Mosaic kernels"). The pass charges them to the plans the kernels take;
/// there is no ring among those.
pub const MOSAIC_KERNELS: Kernels = Kernels {
    ring_hop: 0.0,
    ring_phase: 0.0,
    phase: 1.0,
    op: 1.0,
    source: "equarx's own Mosaic kernels, as libtpu 0.0.42.1 compiled them",
};

/// The kernels of the plans equarx writes as Triton kernels
/// (`kernels=triton`, XLA:GPU): as [`MOSAIC_KERNELS`], one a phase and
/// the dequantize once an op, which is what XLA:GPU (jax-cuda12-plugin
/// 0.10.2, h100 × 4) compiled of them: each custom call one kernel, and
/// nothing else but the collectives and bitcasts (BENCHMARKS.md, "equarx's
/// own Triton kernels").
pub const TRITON_KERNELS: Kernels = Kernels {
    ring_hop: 0.0,
    ring_phase: 0.0,
    phase: 1.0,
    op: 1.0,
    source: "equarx's own Triton kernels, as XLA:GPU (jax-cuda12-plugin 0.10.2) compiled them",
};

/// XLA:GPU (jax-cuda12-plugin 0.10.2, h100 × 4 and × 8, the hook): the
/// ring's loop body is 6 kernels and its condition 1, for 2 lanes (a
/// quantize per lane, one add-and-absmax for both, the counter and the
/// two lanes' slice indices the loop carries); 12 outside the loop, the
/// gather included; two-shot is 9 in all (the plain psum is 1 kernel, not
/// counted).
const GPU_KERNELS: Kernels = Kernels {
    ring_hop: 3.5,
    ring_phase: 7.5,
    phase: 4.5,
    op: 0.0,
    source: "XLA:GPU (jax-cuda12-plugin 0.10.2) compiled",
};

/// The most chips a named slice may have: beyond any machine built, small
/// enough that products of its dimensions cannot overflow.
pub const MAX_SLICE_CHIPS: u64 = 1 << 20;

/// The topologies `--topology` knows: `v5e`, `v6e`, `v5p`, `h100`, `h200`,
/// optionally with a slice shape (`v5e:4x4`; a TPU slice wraps around only
/// when it spans a whole torus dimension).
pub const NAMES: &[&str] = &["v5e", "v6e", "v5p", "h100", "h200"];

impl Topology {
    pub fn parse(spec: &str) -> Result<Self, String> {
        let (name, shape) = match spec.split_once(':') {
            Some((n, s)) => (n, Some(s)),
            None => (spec, None),
        };
        let dims: Vec<u32> = match shape {
            Some(s) => s
                .split('x')
                .map(|d| {
                    d.parse::<u32>()
                        .map_err(|_| format!("slice shape {s:?} is not like 4x4"))
                })
                .collect::<Result<_, _>>()?,
            None => vec![],
        };
        if let Some(s) = shape {
            if dims.contains(&0) {
                return Err(format!("slice shape {s:?} has a dimension of 0"));
            }
            let chips = dims
                .iter()
                .try_fold(1u64, |n, &d| n.checked_mul(u64::from(d)));
            if chips.is_none_or(|n| n > MAX_SLICE_CHIPS) {
                return Err(format!(
                    "slice shape {s:?} has more than {MAX_SLICE_CHIPS} chips"
                ));
            }
        }
        // Full-torus dimension sizes: a slice dimension this long wraps.
        let (mut t, torus_dim) = match name {
            "v5e" => (tpu("v5e", 400.0, 4, 819.0, CLOUD_TPU_V5E), 16),
            "v6e" => (tpu("v6e", 800.0, 4, 1638.0, CLOUD_TPU_V6E), 16),
            "v5p" => (tpu("v5p", 1200.0, 6, 2765.0, CLOUD_TPU_V5P), 4),
            "h100" => (gpu("h100", 3350.0), 0),
            "h200" => (gpu("h200", 4800.0), 0),
            other => {
                return Err(format!(
                    "unknown topology {other:?} (known: {})",
                    NAMES.join(", ")
                ));
            }
        };
        t.slice = dims.clone();
        if t.ports > 0 {
            t.wraparound =
                dims.is_empty() || dims.iter().any(|&d| d >= torus_dim && d % torus_dim == 0);
            if !dims.is_empty() {
                t.name = spec.to_string();
            }
        }
        Ok(t)
    }

    /// A switched fabric (NVSwitch): every pattern gets the full egress.
    pub fn switched(&self) -> bool {
        self.ports == 0
    }

    /// Per-device ring bandwidth, GB/s.
    pub fn ring_gbps(&self, bidirectional: bool) -> f64 {
        if self.ports == 0 {
            return self.interconnect_gbps / 2.0;
        }
        let per_direction = self.interconnect_gbps / f64::from(self.ports) / 2.0;
        let b = if bidirectional {
            2.0 * per_direction
        } else {
            per_direction
        };
        if self.wraparound { b } else { b / 2.0 }
    }
}

const CLOUD_TPU_V5E: &str =
    "Cloud TPU v5e docs: 400 GB/s bidirectional ICI per chip, 4 ports, 819 GB/s HBM";
const CLOUD_TPU_V6E: &str =
    "Cloud TPU v6e docs: 800 GB/s bidirectional ICI per chip, 4 ports, 1638 GB/s HBM";
const CLOUD_TPU_V5P: &str =
    "Cloud TPU v5p docs: 1200 GB/s bidirectional ICI per chip, 3D torus (6 ports), 2765 GB/s HBM";

fn tpu(name: &str, ici: f64, ports: u32, hbm: f64, source: &'static str) -> Topology {
    Topology {
        name: name.into(),
        interconnect_gbps: ici,
        ports,
        hbm_gbps: hbm,
        step_latency_us: 2.0,
        kernel_latency_us: 1.0,
        kernels: TPU_KERNELS,
        loop_step_us: 1.0,
        wire_row_bytes: 0,
        wraparound: true,
        slice: vec![],
        source,
    }
}

fn gpu(name: &str, hbm: f64) -> Topology {
    Topology {
        name: name.into(),
        interconnect_gbps: 900.0,
        ports: 0,
        hbm_gbps: hbm,
        step_latency_us: 5.0,
        kernel_latency_us: 3.0,
        kernels: GPU_KERNELS,
        loop_step_us: 8.0,
        wire_row_bytes: 0,
        wraparound: true,
        slice: vec![],
        source: "NVIDIA Hopper datasheets: NVLink 4 900 GB/s bidirectional per GPU; HBM 3.35 TB/s (H100 SXM), 4.8 TB/s (H200)",
    }
}

/// Predicted times of one all-reduce, µs.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Prediction {
    /// XLA's own collective, its payload in its own type (bf16, f16 or
    /// f32): [`baseline_collective_us`].
    pub baseline_us: f64,
    pub equarx_us: f64,
    /// The equarx part spent on quantize/dequantize work, µs.
    pub compute_us: f64,
}

impl Prediction {
    pub fn speedup(&self) -> f64 {
        self.baseline_us / self.equarx_us
    }
}

/// The cost model's view of one rewrite, as the pass reports it: the
/// [`Prediction`] on the named topology.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct PredictedTime {
    pub topology: String,
    /// [`Prediction::baseline_us`].
    pub baseline_us: f64,
    pub equarx_us: f64,
    pub speedup: f64,
}

const BYTES_PER_US_PER_GBPS: f64 = 1e3; // 1 GB/s = 1e3 bytes/µs

/// The transfer time of an exchange (all-to-all) sending `bytes` per
/// device over `q` ranks, µs, kernel launches aside.
fn exchange_us(t: &Topology, q: f64, bytes: f64) -> f64 {
    let bw = t.ring_gbps(true) * BYTES_PER_US_PER_GBPS;
    if t.switched() {
        t.step_latency_us + bytes / bw
    } else {
        (q / 2.0) * t.step_latency_us + bytes * q * q / (4.0 * (q - 1.0)) / bw
    }
}

/// The transfer time of a gather sending `bytes` per device over `p`
/// ranks, µs.
fn gather_us(t: &Topology, p: f64, bytes: f64) -> f64 {
    let bw = t.ring_gbps(true) * BYTES_PER_US_PER_GBPS;
    let hops = if t.switched() { 1.0 } else { p - 1.0 };
    hops * t.step_latency_us + bytes / bw
}

/// XLA's all-reduce of `payload_bytes` over `p` ranks in the payload's own
/// type: the better of a bidirectional ring and a two-shot exchange.
pub fn baseline_us(t: &Topology, p: usize, payload_bytes: u64) -> f64 {
    baseline_collective_us(t, Collective::AllReduce, p, payload_bytes)
}

/// XLA's `collective` of an operand of `operand_bytes` over `p` ranks in
/// its own type: the better of the ring and the direct exchange where both
/// apply.
pub fn baseline_collective_us(
    t: &Topology,
    collective: Collective,
    p: usize,
    operand_bytes: u64,
) -> f64 {
    let bw = t.ring_gbps(true) * BYTES_PER_US_PER_GBPS;
    let pf = p as f64;
    let bytes = baseline_wire_bytes(collective, p, operand_bytes) as f64;
    let ring = |steps: f64, bytes: f64| steps * t.step_latency_us + bytes / bw;
    match collective {
        Collective::AllReduce => {
            let half = bytes / 2.0;
            ring(2.0 * (pf - 1.0), bytes).min(exchange_us(t, pf, half) + gather_us(t, pf, half))
        }
        Collective::ReduceScatter => ring(pf - 1.0, bytes).min(exchange_us(t, pf, bytes)),
        Collective::AllGather => gather_us(t, pf, bytes),
        Collective::AllToAll => exchange_us(t, pf, bytes),
    }
}

/// Predicts the collective of `payload_bytes` (the operand's bytes, of
/// elements of `elem_bytes` each on average) carried out by `plan`,
/// against XLA's in the operand's own type.
/// How many times a message's nominal bytes (codes and scales) travel
/// where the compiler pads each row of codes to [`Topology::wire_row_bytes`]
/// (the scales' rows are whole tiles already): 1 elsewhere.
fn wire_padding(t: &Topology, plan: &Plan) -> f64 {
    let codes = (plan.block() * plan.config.format.bits() / 8) as f64;
    let scale = plan.scale_type().bytes() as f64;
    let row = f64::from(t.wire_row_bytes);
    if row > codes {
        (row + scale) / (codes + scale)
    } else {
        1.0
    }
}

pub fn predict(t: &Topology, plan: &Plan, payload_bytes: u64, elem_bytes: f64) -> Prediction {
    let p = plan.group_size as f64;
    let alpha = t.step_latency_us;
    let launch = t.kernel_latency_us;
    let kernels = t.kernels;
    let lanes = plan.lanes.len().max(1) as f64;
    let ring_bw = t.ring_gbps(plan.config.bidirectional) * BYTES_PER_US_PER_GBPS;
    let loop_us = match plan.config.form {
        Form::Loop => t.loop_step_us,
        Form::Unrolled => 0.0,
    };
    let rotated = plan.config.rotation == Rotation::Hadamard;
    // What a hop reads as the device's own part: its input, or the f32
    // rotated input.
    let own_bytes = if rotated { 4.0 } else { elem_bytes };
    let scales = plan.scale_type().bytes() as f64 / plan.block() as f64;
    // Bytes of one code: 1, or 1/2 for int4.
    let cb = plan.config.format.bits() as f64 / 8.0;
    let c = plan.chunk as f64;
    let padding = wire_padding(t, plan);
    let (mut comm, mut hbm_bytes) = (launch * kernels.op, 0.0);
    for (k, phase) in plan.phases.iter().enumerate() {
        let bytes = plan.phase_wire_bytes(k) as f64 * padding;
        let rows = plan.rows_before(k) as f64;
        match phase {
            Phase::Ring { axis } => {
                let q = axis.size as f64;
                comm += (q - 1.0) * (alpha + loop_us)
                    + launch * (kernels.ring_phase + (q - 1.0) * lanes * kernels.ring_hop)
                    + bytes / ring_bw;
                hbm_bytes += (q - 1.0) * rows / q * c * (2.0 * cb + own_bytes + scales);
            }
            Phase::Exchange { axis } => {
                let q = axis.size as f64;
                comm += launch * kernels.phase + exchange_us(t, q, bytes);
                hbm_bytes +=
                    rows * c * (own_bytes + cb + scales) + rows * c * cb + rows / q * c * 4.0;
            }
            Phase::Gather => {
                comm += launch * kernels.phase + gather_us(t, p, bytes);
                hbm_bytes += c * (4.0 + cb) + p * c * (cb + elem_bytes);
            }
            Phase::Scatter => {
                comm += launch * kernels.phase + exchange_us(t, p, bytes);
                hbm_bytes += p * c * (own_bytes + cb + scales) + p * c * (cb + elem_bytes);
            }
        }
    }
    // A reduce-scatter writes its owned f32 chunk out in the output type
    // (the others write what their gather or scatter dequantizes).
    let writes_owned_chunk = match plan.collective {
        Collective::ReduceScatter => true,
        Collective::AllReduce | Collective::AllGather | Collective::AllToAll => false,
    };
    if writes_owned_chunk {
        hbm_bytes += c * (4.0 + elem_bytes);
    }
    // The forward rotation is one more pass (input in, f32 out); the
    // inverse is a dot on the gathered codes whose scaling the backend
    // fuses into the dot's output (TPU and GPU fuse a dot's elementwise
    // consumer), so it costs no pass of its own.
    if rotated {
        let payload = match plan.collective {
            Collective::AllGather => c,
            Collective::AllReduce | Collective::ReduceScatter | Collective::AllToAll => p * c,
        };
        hbm_bytes += payload * (elem_bytes + 4.0);
        // Unquantized at the end, a reduce-scatter's chunk is rotated back
        // by a dot of its own.
        if writes_owned_chunk {
            hbm_bytes += c * 8.0;
        }
    }
    let compute = hbm_bytes / (t.hbm_gbps * BYTES_PER_US_PER_GBPS);
    let steps = plan.collective_steps().max(1) as f64;
    let equarx_us = if lanes >= 2.0 {
        comm.max(compute) + compute / steps
    } else {
        comm + compute
    };
    Prediction {
        baseline_us: baseline_collective_us(t, plan.collective, plan.group_size, payload_bytes),
        equarx_us,
        compute_us: compute,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{Algorithm, Config};

    fn config(algorithm: Algorithm, bidirectional: bool) -> Config {
        Config {
            bidirectional,
            ..crate::plan::test_config(algorithm)
        }
    }

    fn plan(p: usize, elements: usize, bidirectional: bool) -> Plan {
        Plan::new(p, elements, &config(Algorithm::Ring, bidirectional)).unwrap()
    }

    #[test]
    fn large_payloads_approach_the_byte_ratio_and_small_ones_lose() {
        let t = Topology::parse("v5e").unwrap();
        let big = predict(&t, &plan(8, 256 << 20, true), 512 << 20, 2.0);
        assert!((1.7..1.95).contains(&big.speedup()), "{big:?}");
        let tiny = predict(&t, &plan(8, 1024, true), 2048, 2.0);
        assert!(tiny.speedup() < 1.0, "{tiny:?}");
    }

    #[test]
    fn a_one_way_ring_needs_twice_the_bytes_to_pay_on_a_torus() {
        let t = Topology::parse("v5e").unwrap();
        let one_way = predict(&t, &plan(8, 128 << 20, false), 256 << 20, 2.0);
        let both = predict(&t, &plan(8, 128 << 20, true), 256 << 20, 2.0);
        assert!(
            both.speedup() > one_way.speedup() * 1.5,
            "{both:?} {one_way:?}"
        );
    }

    #[test]
    fn two_shot_wins_on_a_switch_and_loses_on_a_torus() {
        for (topology, two_shot_wins) in [("h100", true), ("v5e", false)] {
            let t = Topology::parse(topology).unwrap();
            // Large enough that the kernels' launches are a small part.
            let n = 128 << 20;
            let ring = predict(&t, &plan(8, n, true), 2 * n as u64, 2.0);
            let two_shot = Plan::new(8, n, &config(Algorithm::TwoShot, true)).unwrap();
            let two_shot = predict(&t, &two_shot, 2 * n as u64, 2.0);
            assert_eq!(
                two_shot.equarx_us < ring.equarx_us,
                two_shot_wins,
                "{topology}: ring {ring:?}, two-shot {two_shot:?}"
            );
        }
    }

    #[test]
    fn codes_padded_to_their_tiles_rows_travel_as_the_padded_bytes() {
        let t = Topology::parse("v5e").unwrap();
        let padded = Topology {
            wire_row_bytes: TILED_WIRE_ROW_BYTES,
            ..t.clone()
        };
        for algorithm in [Algorithm::Ring, Algorithm::TwoShot] {
            let p = Plan::new(8, 8 << 20, &config(algorithm, true)).unwrap();
            // int8 in blocks of 64 with bf16 scales: 66 bytes a block, 130
            // padded.
            assert_eq!((p.block(), p.scale_type().bytes()), (64, 2));
            assert_eq!(wire_padding(&t, &p), 1.0);
            assert_eq!(wire_padding(&padded, &p), 130.0 / 66.0);
            let (plain, tiled) = (
                predict(&t, &p, 16 << 20, 2.0),
                predict(&padded, &p, 16 << 20, 2.0),
            );
            assert_eq!(plain.baseline_us, tiled.baseline_us);
            assert!(
                tiled.equarx_us > plain.equarx_us,
                "{algorithm:?}: padded {} us, not more than {} us",
                tiled.equarx_us,
                plain.equarx_us
            );
        }
    }

    #[test]
    fn every_kernel_a_plan_runs_pays_its_launch() {
        for topology in ["v5e", "h100"] {
            let t = Topology::parse(topology).unwrap();
            let free = Topology {
                kernel_latency_us: 0.0,
                ..t.clone()
            };
            for algorithm in [Algorithm::Ring, Algorithm::TwoShot] {
                let p = Plan::new(8, 1 << 20, &config(algorithm, true)).unwrap();
                let paid = predict(&t, &p, 2 << 20, 2.0).equarx_us
                    - predict(&free, &p, 2 << 20, 2.0).equarx_us;
                let k = t.kernels;
                let kernels: f64 = p
                    .phases
                    .iter()
                    .map(|phase| match phase {
                        Phase::Ring { axis } => {
                            k.ring_phase
                                + (axis.size as f64 - 1.0) * p.lanes.len() as f64 * k.ring_hop
                        }
                        _ => k.phase,
                    })
                    .sum::<f64>()
                    + k.op;
                let want = t.kernel_latency_us * kernels;
                assert!(
                    want > 10.0 && (paid - want).abs() < 1e-6 * want,
                    "{topology} {algorithm:?}: paid {paid} us, {kernels} kernels"
                );
            }
        }
    }

    #[test]
    fn slices_without_wraparound_halve_the_ring() {
        let full = Topology::parse("v5e:16x16").unwrap();
        let slice = Topology::parse("v5e:4x4").unwrap();
        assert!(full.wraparound && !slice.wraparound);
        assert_eq!(full.ring_gbps(true), 2.0 * slice.ring_gbps(true));
        assert!(Topology::parse("tpu9").is_err());
        assert!(Topology::parse("v5e:4y4").is_err());
    }
}
