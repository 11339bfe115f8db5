//! Shapes as XLA writes them: element types, dimensions and layouts.
//!
//! Every shape equarx creates carries a layout (XLA's default, major-to-minor
//! dimension order), because modules taken after layout assignment must stay
//! fully laid out.

use crate::proto::{LayoutProto, PrimitiveType, ShapeProto, TileProto};

/// Text spelling and bit width of each element type XLA knows.
const TYPES: &[(PrimitiveType, &str, u32)] = &[
    (PrimitiveType::Pred, "pred", 8),
    (PrimitiveType::S1, "s1", 1),
    (PrimitiveType::S2, "s2", 2),
    (PrimitiveType::S4, "s4", 4),
    (PrimitiveType::S8, "s8", 8),
    (PrimitiveType::S16, "s16", 16),
    (PrimitiveType::S32, "s32", 32),
    (PrimitiveType::S64, "s64", 64),
    (PrimitiveType::U1, "u1", 1),
    (PrimitiveType::U2, "u2", 2),
    (PrimitiveType::U4, "u4", 4),
    (PrimitiveType::U8, "u8", 8),
    (PrimitiveType::U16, "u16", 16),
    (PrimitiveType::U32, "u32", 32),
    (PrimitiveType::U64, "u64", 64),
    (PrimitiveType::F16, "f16", 16),
    (PrimitiveType::Bf16, "bf16", 16),
    (PrimitiveType::F32, "f32", 32),
    (PrimitiveType::F64, "f64", 64),
    (PrimitiveType::F8e5m2, "f8e5m2", 8),
    (PrimitiveType::F8e4m3, "f8e4m3", 8),
    (PrimitiveType::F8e4m3fn, "f8e4m3fn", 8),
    (PrimitiveType::F8e4m3b11fnuz, "f8e4m3b11fnuz", 8),
    (PrimitiveType::F8e3m4, "f8e3m4", 8),
    (PrimitiveType::F8e5m2fnuz, "f8e5m2fnuz", 8),
    (PrimitiveType::F8e4m3fnuz, "f8e4m3fnuz", 8),
    (PrimitiveType::F4e2m1fn, "f4e2m1fn", 4),
    (PrimitiveType::F8e8m0fnu, "f8e8m0fnu", 8),
    (PrimitiveType::C64, "c64", 64),
    (PrimitiveType::C128, "c128", 128),
    (PrimitiveType::Tuple, "tuple", 0),
    (PrimitiveType::OpaqueType, "opaque", 0),
    (PrimitiveType::Token, "token", 0),
];

/// The text spelling of an element type (`bf16`, `s8`, …), `None` if the
/// number is not a type this schema knows.
pub fn type_name(ty: i32) -> Option<&'static str> {
    TYPES.iter().find(|t| t.0 as i32 == ty).map(|t| t.1)
}

/// The element type spelled `name` in HLO text.
pub fn type_from_name(name: &str) -> Option<PrimitiveType> {
    TYPES.iter().find(|t| t.1 == name).map(|t| t.0)
}

/// Bits per element of an array element type (0 for tuple/token/opaque).
pub fn type_bits(ty: i32) -> Option<u32> {
    TYPES.iter().find(|t| t.0 as i32 == ty).map(|t| t.2)
}

pub fn is_float(ty: i32) -> bool {
    type_name(ty).is_some_and(|n| n.starts_with('f') || n.starts_with("bf"))
}

pub fn is_integer(ty: i32) -> bool {
    type_name(ty).is_some_and(|n| n.starts_with('s') || n.starts_with('u'))
}

/// An array shape with XLA's default layout (`{rank-1,...,0}`).
pub fn array(ty: PrimitiveType, dims: &[i64]) -> ShapeProto {
    ShapeProto {
        element_type: ty as i32,
        dimensions: dims.to_vec(),
        is_dynamic_dimension: vec![false; dims.len()],
        tuple_shapes: vec![],
        layout: Some(Box::new(default_layout(dims.len()))),
    }
}

pub fn scalar(ty: PrimitiveType) -> ShapeProto {
    array(ty, &[])
}

pub fn tuple(elements: Vec<ShapeProto>) -> ShapeProto {
    ShapeProto {
        element_type: PrimitiveType::Tuple as i32,
        tuple_shapes: elements,
        ..Default::default()
    }
}

pub fn default_layout(rank: usize) -> LayoutProto {
    LayoutProto {
        minor_to_major: (0..rank as i64).rev().collect(),
        ..Default::default()
    }
}

/// `s` laid out row-major and untiled (XLA's default layout; a backend
/// past its layout assignment tiles it as it tiles what the pass emits),
/// when its layout orders the dimensions otherwise (`{0,1:T(8,128)}`, a
/// TPU layout assignment's); `None` when it is row-major already.
pub fn row_major(s: &ShapeProto) -> Option<ShapeProto> {
    let layout = s.layout.as_ref()?;
    let rank = s.dimensions.len();
    if is_tuple(s) || layout.minor_to_major == default_layout(rank).minor_to_major {
        return None;
    }
    let mut out = s.clone();
    out.layout = Some(Box::new(default_layout(rank)));
    Some(out)
}

/// The tiles XLA:TPU's layout assignment gives a row-major array of
/// `ty` whose second-minor dimension is `rows`, read from compiled modules
/// and libtpu's refusals: `T(8,128)`, `T(4,128)`, `T(2,128)` or `T(1,128)`
/// where `rows` is 4, 2 or 1, but never fewer rows than a 32-bit word
/// packs (2 for 16-bit types, 4 for 8-bit ones), then `(32/bits, 1)` for
/// those (`s8[..]{1,0:T(8,128)(4,1)}`, `bf16[4,4,128]{2,1,0:T(4,128)(2,1)}`,
/// `bf16[1,1024]{1,0:T(2,128)(2,1)}`, `s8[2,64]{1,0:T(4,128)(4,1)}`).
pub fn tpu_tiles(ty: i32, rows: i64) -> Vec<TileProto> {
    let packed = match type_bits(ty) {
        Some(bits @ (8 | 16)) => 32 / i64::from(bits),
        _ => 1,
    };
    let sublanes = (rows.max(1).unsigned_abs().next_power_of_two().min(8) as i64).max(packed);
    let mut tiles = vec![TileProto {
        dimensions: vec![sublanes, 128],
    }];
    if packed > 1 {
        tiles.push(TileProto {
            dimensions: vec![packed, 1],
        });
    }
    tiles
}

/// `s` with every array of rank 2 or more laid out row-major with
/// [`tpu_tiles`] (what a Mosaic kernel's operands and results, and what
/// a loop fusion holds, must carry past XLA:TPU's layout assignment), and
/// a 32-bit vector of 1024 elements or more in tiles of 1024, as libtpu
/// lays out the block maxima of `[n, 64]` (`f32[1280]{0:T(1024)}`,
/// `f32[16384]{0:T(1024)}`, read from probes' compiled modules); other
/// arrays keep their layout. A shorter vector is not tiled: libtpu's
/// tiles for one depend on its length (`T(128)` to `T(512)`), and a
/// tiled `s32[1]` beside a scalar aborted its lowering
/// (`lowering_util.cc`, "Incompatible source and destination shapes").
pub fn tile_for_tpu(s: &mut ShapeProto) {
    if is_tuple(s) {
        s.tuple_shapes.iter_mut().for_each(tile_for_tpu);
    } else if is_array(s)
        && s.dimensions.len() == 1
        && matches!(type_bits(s.element_type), Some(16 | 32))
        && s.dimensions[0] >= 1024
    {
        let mut layout = default_layout(1);
        let tile = |dims: &[i64]| TileProto {
            dimensions: dims.to_vec(),
        };
        layout.tiles = match type_bits(s.element_type) {
            Some(16) => vec![tile(&[1024]), tile(&[128]), tile(&[2, 1])],
            _ => vec![tile(&[1024])],
        };
        s.layout = Some(Box::new(layout));
        s.is_dynamic_dimension = vec![false];
    } else if is_array(s) && s.dimensions.len() >= 2 {
        let rank = s.dimensions.len();
        let mut layout = default_layout(rank);
        layout.tiles = tpu_tiles(s.element_type, s.dimensions[rank - 2]);
        s.layout = Some(Box::new(layout));
        s.is_dynamic_dimension = vec![false; s.dimensions.len()];
    }
}

pub fn is_tuple(s: &ShapeProto) -> bool {
    s.element_type == PrimitiveType::Tuple as i32
}

pub fn is_array(s: &ShapeProto) -> bool {
    !is_tuple(s)
        && s.element_type != PrimitiveType::Token as i32
        && s.element_type != PrimitiveType::OpaqueType as i32
}

/// Number of elements of an array shape; `None` when it overflows `u64` or a
/// dimension is negative.
pub fn element_count(s: &ShapeProto) -> Option<u64> {
    s.dimensions.iter().try_fold(1u64, |acc, &d| {
        u64::try_from(d).ok().and_then(|d| acc.checked_mul(d))
    })
}

/// Bytes of an array shape's data (bits rounded up to whole bytes).
pub fn byte_size(s: &ShapeProto) -> Option<u64> {
    let bits = u64::from(type_bits(s.element_type)?);
    element_count(s)?.checked_mul(bits).map(|b| b.div_ceil(8))
}

/// Whether two array shapes are one: type, dimensions and layout (the
/// layouts' order and tiles; none reads as row-major untiled).
pub fn same_array(a: &ShapeProto, b: &ShapeProto) -> bool {
    let layout = |s: &ShapeProto| {
        s.layout.as_deref().map_or_else(
            || {
                (
                    default_layout(s.dimensions.len()).minor_to_major,
                    Vec::new(),
                )
            },
            |l| (l.minor_to_major.clone(), l.tiles.clone()),
        )
    };
    compatible(a, b) && layout(a) == layout(b)
}

/// Whether a reshape of `from` into `to` moves no byte under XLA:TPU's
/// tiles, so it can be a `bitcast`: both row-major with the same tiles
/// and memory space, the same minor dimension, and second-minor
/// dimensions that are whole tiles of rows on both sides (only whole
/// tile rows are regrouped among the major dimensions:
/// `f32[65536,64]{1,0:T(8,128)}` as `f32[4,128,128,64]{3,2,1,0:T(8,128)}`).
pub fn tiled_reshape_is_bitcast(from: &ShapeProto, to: &ShapeProto) -> bool {
    fn tiled_rows(s: &ShapeProto) -> Option<(usize, &LayoutProto)> {
        let rank = s.dimensions.len();
        let l = s.layout.as_deref()?;
        let rows = l.tiles.first()?.dimensions.first().copied()?;
        (is_array(s)
            && rank >= 2
            && l.minor_to_major == default_layout(rank).minor_to_major
            && l.tiles[0].dimensions.len() == 2
            && rows > 0
            && s.dimensions[rank - 2] % rows == 0)
            .then_some((rank, l))
    }
    let (Some((rf, lf)), Some((rt, lt))) = (tiled_rows(from), tiled_rows(to)) else {
        return false;
    };
    from.element_type == to.element_type
        && lf.tiles == lt.tiles
        && lf.memory_space == lt.memory_space
        && from.dimensions[rf - 1] == to.dimensions[rt - 1]
        && element_count(from) == element_count(to)
}

/// Same element type, dimensions and tuple structure; layouts ignored.
pub fn compatible(a: &ShapeProto, b: &ShapeProto) -> bool {
    a.element_type == b.element_type
        && a.dimensions == b.dimensions
        && a.tuple_shapes.len() == b.tuple_shapes.len()
        && a.tuple_shapes
            .iter()
            .zip(&b.tuple_shapes)
            .all(|(x, y)| compatible(x, y))
}

/// `bf16[8,128]`, without layout: for messages and reports.
pub fn describe(s: &ShapeProto) -> String {
    if is_tuple(s) {
        let parts: Vec<String> = s.tuple_shapes.iter().map(describe).collect();
        return format!("({})", parts.join(", "));
    }
    let dims: Vec<String> = s.dimensions.iter().map(i64::to_string).collect();
    format!(
        "{}[{}]",
        type_name(s.element_type).unwrap_or("?"),
        dims.join(",")
    )
}

/// A shape with the same element type and the given dimensions.
pub fn with_dims(s: &ShapeProto, dims: &[i64]) -> ShapeProto {
    let ty = PrimitiveType::try_from(s.element_type).unwrap_or(PrimitiveType::Invalid);
    array(ty, dims)
}

/// A shape with the same dimensions and another element type.
pub fn with_type(s: &ShapeProto, ty: PrimitiveType) -> ShapeProto {
    array(ty, &s.dimensions)
}

/// A layout's `minor_to_major` that does not name every dimension once.
#[derive(Debug)]
pub struct NotAPermutation;

/// Where each element of an array with `dims`, counted row-major, sits in
/// the storage order of `minor_to_major` (XLA stores literals in layout
/// order). `None` when the two orders agree (rank < 2 or the default
/// layout); `Err` when `minor_to_major` is not a permutation of the
/// dimensions.
pub fn physical_positions(
    dims: &[i64],
    minor_to_major: &[i64],
) -> Result<Option<Vec<usize>>, NotAPermutation> {
    let rank = dims.len();
    let is_default = minor_to_major
        .iter()
        .enumerate()
        .all(|(k, &d)| d == rank as i64 - 1 - k as i64);
    if rank < 2 || is_default {
        return Ok(None);
    }
    let udims: Vec<usize> = dims
        .iter()
        .map(|&d| usize::try_from(d).unwrap_or(0))
        .collect();
    let mut stride = vec![0usize; rank];
    let mut placed = vec![false; rank];
    let mut acc = 1usize;
    for &d in minor_to_major {
        let d = usize::try_from(d)
            .ok()
            .filter(|&d| d < rank && !placed[d])
            .ok_or(NotAPermutation)?;
        placed[d] = true;
        stride[d] = acc;
        acc = acc.saturating_mul(udims[d]);
    }
    let count = udims
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .unwrap_or(0);
    let mut positions = Vec::with_capacity(count);
    let mut index = vec![0usize; rank];
    for _ in 0..count {
        positions.push(index.iter().zip(&stride).map(|(i, s)| i * s).sum());
        for d in (0..rank).rev() {
            index[d] += 1;
            if index[d] < udims[d] {
                break;
            }
            index[d] = 0;
        }
    }
    Ok(Some(positions))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tiled_reshape_is_a_bitcast_only_where_whole_tile_rows_regroup() {
        let tiled = |ty, dims: &[i64]| {
            let mut s = array(ty, dims);
            tile_for_tpu(&mut s);
            s
        };
        let f = PrimitiveType::F32;
        let flat = tiled(f, &[65536, 64]);
        assert!(tiled_reshape_is_bitcast(
            &flat,
            &tiled(f, &[4, 128, 128, 64])
        ));
        assert!(tiled_reshape_is_bitcast(
            &tiled(f, &[1, 16384, 64]),
            &tiled(f, &[16384, 64])
        ));
        // The minor dimension changes: the rows are padded differently.
        assert!(!tiled_reshape_is_bitcast(&flat, &tiled(f, &[2048, 2048])));
        // Rows of 4 take tiles of 4 rows: another order in memory.
        assert!(!tiled_reshape_is_bitcast(&flat, &tiled(f, &[16384, 4, 64])));
        // Another element type or no tiles at all.
        assert!(!tiled_reshape_is_bitcast(
            &flat,
            &tiled(PrimitiveType::S32, &[4, 16384, 64])
        ));
        assert!(!tiled_reshape_is_bitcast(
            &array(f, &[65536, 64]),
            &array(f, &[4, 16384, 64])
        ));
    }

    #[test]
    fn physical_positions_follow_the_layout() {
        // Column-major 2x3: row-major element (r, c) is stored at c*2 + r.
        let p = physical_positions(&[2, 3], &[0, 1]).unwrap().unwrap();
        assert_eq!(p, vec![0, 2, 4, 1, 3, 5]);
        assert!(physical_positions(&[2, 3], &[1, 0]).unwrap().is_none());
        assert!(physical_positions(&[4], &[0]).unwrap().is_none());
        assert!(physical_positions(&[2, 3], &[0, 0]).is_err());
        assert!(physical_positions(&[2, 3], &[0, 2]).is_err());
    }
}
