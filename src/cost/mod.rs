//! The time model: how long a bf16 ring all-reduce and equarx's quantized
//! ring take on a named topology. Every TPU and GPU figure here is a
//! **model**, built from public specifications and stated assumptions; no
//! accelerator was measured. (What was measured, on CPUs over shaped links,
//! is in BENCHMARKS.md.)
//!
//! Both algorithms run `2·(P−1)` ring steps (reduce-scatter, then
//! all-gather); a step costs a fixed latency `α` plus its bytes over the
//! link bandwidth available to the ring:
//!
//! ```text
//! T_bf16   = 2(P−1) · (α + (S/P) / β_bf16)
//! T_equarx = 2(P−1) · (α + α_kernel + m / β_eqx)  ⊕  C
//! ```
//!
//! with `S` the payload in bytes, `m` equarx's per-step message (codes and
//! scales, from the same [`RingPlan`] the pass emits) and `C` the
//! quantize/dequantize work: every hop reads the received codes (1 B), the
//! device's own contribution (its input type) and writes the next message
//! (1 B) per element, and the all-gather reads every code and writes the
//! output type — kernels fused the way XLA fuses elementwise chains, bound
//! by HBM bandwidth. With D ≥ 2 lanes the work of one lane overlaps the
//! transfer of another (`⊕` = max plus one lane's fill); with D = 1 they
//! add.
//!
//! Ring bandwidth `β`: a TPU chip has `ports` ICI links, each carrying
//! `ici/ports/2` per direction; a ring uses one link each way round, a
//! bidirectional ring both directions of both (XLA's own all-reduce is
//! modelled bidirectional). Without wraparound (a slice smaller than the
//! torus) the ring folds back over a line and its busiest link carries two
//! ring edges: half the bandwidth. NVSwitch GPUs give every ring the GPU's
//! full NVLink egress either way.

use crate::numerics::ScaleType;
use crate::passes::quantized_all_reduce::plan::{RingPlan, ring_wire_bytes};

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
    /// Per-step launch cost of equarx's quantize/dequantize kernels, µs.
    pub kernel_latency_us: f64,
    /// Whether the ring closes over a wraparound link.
    pub wraparound: bool,
    /// Where the figures come from.
    pub source: &'static str,
}

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
        if t.ports > 0 {
            t.wraparound =
                dims.is_empty() || dims.iter().any(|&d| d >= torus_dim && d % torus_dim == 0);
            if !dims.is_empty() {
                t.name = spec.to_string();
            }
        }
        Ok(t)
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
        wraparound: true,
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
        wraparound: true,
        source: "NVIDIA Hopper datasheets: NVLink 4 900 GB/s bidirectional per GPU; HBM 3.35 TB/s (H100 SXM), 4.8 TB/s (H200)",
    }
}

/// Predicted times of one all-reduce, µs.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Prediction {
    pub bf16_us: f64,
    pub equarx_us: f64,
    /// The equarx part spent on quantize/dequantize work, µs.
    pub compute_us: f64,
}

impl Prediction {
    pub fn speedup(&self) -> f64 {
        self.bf16_us / self.equarx_us
    }
}

/// Predicts one all-reduce of `payload_bytes` (elements of `elem_bytes`)
/// over groups of `plan.group_size`, the baseline in the payload's own type.
pub fn predict(
    t: &Topology,
    plan: &RingPlan,
    payload_bytes: u64,
    elem_bytes: u64,
    bidirectional: bool,
) -> Prediction {
    let p = plan.group_size as f64;
    let steps = 2.0 * (p - 1.0);
    let gbps_to_bytes_per_us = 1e3; // 1 GB/s = 1e3 bytes/µs
    let alpha = t.step_latency_us;
    // The baseline: XLA's bidirectional ring in the payload's type.
    let base_bw = t.ring_gbps(true) * gbps_to_bytes_per_us;
    let bf16_us = steps * alpha + ring_wire_bytes(plan.group_size, payload_bytes) as f64 / base_bw;

    let eq_bw = t.ring_gbps(bidirectional) * gbps_to_bytes_per_us;
    let comm = steps * (alpha + t.kernel_latency_us) + plan.wire_bytes() as f64 / eq_bw;
    // HBM bytes per element: a hop reads codes and own input, writes codes;
    // the gather reads codes and writes the output type.
    let elements = plan.padded() as f64;
    let chunk = elements / p;
    let hop_bytes = (p - 1.0) * chunk * (1.0 + elem_bytes as f64 + 1.0 + scale_share(plan));
    let gather_bytes = elements * (1.0 + elem_bytes as f64);
    let compute = (hop_bytes + gather_bytes) / (t.hbm_gbps * gbps_to_bytes_per_us);
    let lanes = plan.lanes.len().max(1) as f64;
    let equarx_us = if lanes >= 2.0 {
        comm.max(compute) + compute / steps / lanes
    } else {
        comm + compute
    };
    Prediction {
        bf16_us,
        equarx_us,
        compute_us: compute,
    }
}

fn scale_share(plan: &RingPlan) -> f64 {
    let per_scale = match plan.scale_type {
        ScaleType::F32 => 4.0,
        ScaleType::Bf16 => 2.0,
    };
    per_scale / plan.block as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Options;

    fn plan(p: usize, elements: usize, bidirectional: bool) -> RingPlan {
        RingPlan::new(
            p,
            elements,
            &Options {
                bidirectional,
                ..Options::default()
            },
        )
        .unwrap()
    }

    #[test]
    fn large_payloads_approach_the_byte_ratio_and_small_ones_lose() {
        let t = Topology::parse("v5e").unwrap();
        let big = predict(&t, &plan(8, 32 << 20, true), 64 << 20, 2, true);
        assert!((1.7..1.95).contains(&big.speedup()), "{big:?}");
        let tiny = predict(&t, &plan(8, 1024, true), 2048, 2, true);
        assert!(tiny.speedup() < 1.0, "{tiny:?}");
    }

    #[test]
    fn a_one_way_ring_needs_twice_the_bytes_to_pay_on_a_torus() {
        let t = Topology::parse("v5e").unwrap();
        let one_way = predict(&t, &plan(8, 8 << 20, false), 16 << 20, 2, false);
        let both = predict(&t, &plan(8, 8 << 20, true), 16 << 20, 2, true);
        assert!(
            both.speedup() > one_way.speedup() * 1.5,
            "{both:?} {one_way:?}"
        );
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
