//! How far a result lies from the exact sum, and the rounding to the
//! output type every result goes through before it is measured.

/// Relative RMS error and the largest error relative to the exact sum's RMS.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct ErrorStats {
    pub rel_rms: f64,
    pub max_rel: f64,
}

pub fn error(got: &[f32], exact: &[f64]) -> ErrorStats {
    let (mut num, mut den, mut max) = (0.0f64, 0.0f64, 0.0f64);
    for (&g, &e) in got.iter().zip(exact) {
        let d = f64::from(g) - e;
        num += d * d;
        den += e * e;
        max = max.max(d.abs());
    }
    let rms = (den / exact.len().max(1) as f64).sqrt();
    ErrorStats {
        rel_rms: (num / den).sqrt(),
        max_rel: max / rms,
    }
}

/// Rounds f32 results to bf16 (the all-reduce's output type).
pub fn to_bf16(v: &[f32]) -> Vec<f32> {
    v.iter()
        .map(|&x| half::bf16::from_f32(x).to_f32())
        .collect()
}
