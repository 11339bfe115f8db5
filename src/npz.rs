//! Arrays saved by numpy (`.npz`), read as f32: collectives' inputs for
//! `equarx calibrate` and `equarx simulate --inputs`.

use anyhow::{Context, Result, bail};

/// An array's shape and its values as f32.
pub type Array = (Vec<u64>, Vec<f32>);

/// The arrays of an `.npz` file, by name (without `.npy`).
pub fn read(path: &std::path::Path) -> Result<std::collections::HashMap<String, Array>> {
    read_some(path, |_| true)
}

/// The arrays of an `.npz` file whose names `wanted` accepts.
pub fn read_some(
    path: &std::path::Path,
    wanted: impl Fn(&str) -> bool,
) -> Result<std::collections::HashMap<String, Array>> {
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut zip = zip::ZipArchive::new(std::io::BufReader::new(file))
        .with_context(|| format!("{}: not an .npz (zip) file", path.display()))?;
    let mut out = std::collections::HashMap::new();
    for i in 0..zip.len() {
        let entry = zip.by_index(i)?;
        let name = entry.name().to_string();
        let Some(stem) = name.strip_suffix(".npy") else {
            continue;
        };
        if !wanted(stem) {
            continue;
        }
        let what = || format!("{}: {name}", path.display());
        let npy = npyz::NpyFile::new(std::io::BufReader::new(entry)).with_context(what)?;
        let shape = npy.shape().to_vec();
        let values = to_f32(npy).with_context(what)?;
        out.insert(stem.to_string(), (shape, values));
    }
    Ok(out)
}

/// An array's values as f32, from any float type numpy saves.
fn to_f32<R: std::io::Read>(npy: npyz::NpyFile<R>) -> Result<Vec<f32>> {
    use npyz::{DType, TypeChar};
    let DType::Plain(t) = npy.dtype() else {
        bail!("not a plain array (a structured dtype)");
    };
    Ok(match (t.type_char(), t.num_bytes()) {
        (TypeChar::Float, Some(4)) => npy.into_vec::<f32>()?,
        (TypeChar::Float, Some(8)) => npy
            .into_vec::<f64>()?
            .into_iter()
            .map(|v| v as f32)
            .collect(),
        (TypeChar::Float, Some(2)) => npy.into_vec::<u16>().map(|v| {
            v.into_iter()
                .map(|b| half::f16::from_bits(b).to_f32())
                .collect()
        })?,
        _ => bail!("dtype {t} is not a float type (save bf16 as f32, which holds it exactly)"),
    })
}
