//! The structure-aware fuzz target's generator and checks (`structured`).
//!
//! The byte-level targets (`harness.rs`) mostly exercise the decoders: a
//! mutated proto rarely holds a collective the pass would rewrite. Here the
//! input bytes drive an [`arbitrary::Unstructured`] that *builds* a valid
//! module as HLO text, read by equarx's own parser: every collective kind
//! (all-reduce, reduce-scatter, all-gather, all-to-all; array and tuple;
//! async `-start`/`-done` pairs), every group mode (cross-replica,
//! cross-partition, flattened ids) and encoding (lists, iota, mesh axes,
//! empty), hosted in the entry, a `while` body, a conditional branch or a
//! called computation, in a module with or without a fusion; plus an
//! options vector (algorithm, rotation, format, block size, scale type,
//! gather form, unroll, fuse, topology, error budget, ...) given as text
//! through [`equarx::options::from_pairs`], as the CLI and C++ give them.
//!
//! Asserted on every input: no panic; a module that parses and verifies
//! (the pipeline verifies its input) either rewrites into a module the
//! verifier accepts, or is refused with a clean options error. A pass error or a malformed output on a verified
//! input is a finding (each is an equarx bug by its own message).
//!
//! [`Coverage`] counts what was generated and what was rewritten, per
//! collective kind and per option value; the fuzz target writes it on exit
//! (`$EQUARX_FUZZ_COVERAGE`, and stderr) so a campaign's record can show it.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

use arbitrary::{Result, Unstructured};

/// The four collectives the pass rewrites.
const KINDS: &[&str] = &["all-reduce", "reduce-scatter", "all-gather", "all-to-all"];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    AllReduce,
    ReduceScatter,
    AllGather,
    AllToAll,
}

impl Kind {
    fn name(self) -> &'static str {
        KINDS[self as usize]
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// No channel id: replica ids.
    CrossReplica,
    /// Channel id on an all-to-all (which has no `use_global_device_ids`):
    /// partition ids.
    CrossPartition,
    /// Channel id, `use_global_device_ids` false, on the ops that have it:
    /// replica ids, each group spanning every partition of its replicas.
    CrossReplicaAndPartition,
    /// Channel id and `use_global_device_ids=true`: flattened ids.
    Flattened,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Host {
    Entry,
    While,
    Conditional,
    Call,
}

/// One generated module, as text, with what it holds (for the counts).
pub struct Generated {
    pub text: String,
    /// Per collective site: its name prefix and the features it has.
    sites: Vec<(String, Vec<String>)>,
    /// `name=value` of every option given.
    pub options: Vec<(&'static str, String)>,
    features: Vec<String>,
}

const FLOAT_TYPES: &[&str] = &["bf16", "bf16", "bf16", "f32", "f16"];

fn shape(ty: &str, dims: &[i64]) -> String {
    let d: Vec<String> = dims.iter().map(|d| d.to_string()).collect();
    format!("{ty}[{}]", d.join(","))
}

/// The module under construction: extra computations (emitted before the
/// entry) and the entry's own lines.
struct Builder {
    computations: Vec<String>,
    reducers: Vec<String>,
    channel: i64,
}

impl Builder {
    fn reducer(&mut self, ty: &str, op: &str) -> String {
        let name = format!("{op}.{ty}");
        if !self.reducers.contains(&name) {
            self.reducers.push(name.clone());
            self.computations.push(format!(
                "%{name} (a: {ty}[], b: {ty}[]) -> {ty}[] {{\n  %{name}.a = {ty}[] parameter(0)\n  \
                 %{name}.b = {ty}[] parameter(1)\n  ROOT %{name}.r = {ty}[] {op}(%{name}.a, %{name}.b)\n}}\n"
            ));
        }
        name
    }
}

/// The device layout and group attributes of one collective.
struct Groups {
    /// `channel_id=.., replica_groups=.., use_global_device_ids=..` text
    /// (without the channel id, which each op gets fresh).
    attrs: String,
    channel: bool,
    size: i64,
    features: Vec<String>,
}

/// True about once in `n` (and false when the input has run out, so
/// that a short input makes the plain case).
fn rare(u: &mut Unstructured, n: u32) -> Result<bool> {
    Ok(u.int_in_range(0..=n - 1)? == n - 1)
}

fn divisors(n: i64) -> Vec<i64> {
    (1..=n).filter(|d| n % d == 0).collect()
}

fn groups(u: &mut Unstructured, replicas: i64, partitions: i64, kind: Kind) -> Result<Groups> {
    // What a channel id without global ids means depends on the op (as in
    // XLA): all-to-all has no use_global_device_ids and is cross-partition;
    // the others are cross-replica-and-partition.
    let channel_mode = if kind == Kind::AllToAll {
        Mode::CrossPartition
    } else {
        Mode::CrossReplicaAndPartition
    };
    let mut mode = *u.choose(&[Mode::Flattened, channel_mode, Mode::CrossReplica])?;
    if kind == Kind::AllToAll && mode == Mode::Flattened {
        mode = Mode::CrossPartition;
    }
    let space = match mode {
        Mode::CrossReplica | Mode::CrossReplicaAndPartition => replicas,
        Mode::CrossPartition => partitions,
        Mode::Flattened => replicas * partitions,
    };
    let ds = divisors(space);
    // Mostly groups of two or more (the rewritable ones).
    let size = if ds.len() > 1 && !rare(u, 8)? {
        *u.choose(&ds[1..])?
    } else {
        *u.choose(&ds)?
    };
    let count = space / size;
    let encoding = u.int_in_range(0..=4)?;
    // Flattened ids name their groups: XLA's verifier (and equarx's)
    // refuses an empty list there. Iota instead.
    let encoding = if mode == Mode::Flattened && encoding == 0 {
        1
    } else {
        encoding
    };
    let (list, enc) = match encoding {
        0 => ("{}".to_string(), "empty"),
        1 => (format!("[{count},{size}]<=[{space}]"), "iota"),
        2 => (
            format!("[{count},{size}]<=[{size},{count}]T(1,0)"),
            "iota-transposed",
        ),
        3 => {
            if u.arbitrary()? {
                (format!("mesh['a'={count},'b'={size}] {{'b'}}"), "mesh")
            } else {
                (format!("mesh['a'={size},'b'={count}] {{'a'}}"), "mesh")
            }
        }
        _ => {
            // An explicit list: a shuffle of the ids cut into groups.
            let mut ids: Vec<i64> = (0..space).collect();
            for i in (1..ids.len()).rev() {
                let j = u.int_in_range(0..=i)?;
                ids.swap(i, j);
            }
            let gs: Vec<String> = ids
                .chunks(size as usize)
                .map(|g| {
                    let g: Vec<String> = g.iter().map(|i| i.to_string()).collect();
                    format!("{{{}}}", g.join(","))
                })
                .collect();
            (format!("{{{}}}", gs.join(",")), "list")
        }
    };
    let list = if encoding == 0 { "{}".into() } else { list };
    let size = if encoding == 0 { space } else { size };
    let mut attrs = format!("replica_groups={list}");
    if mode == Mode::Flattened {
        attrs.push_str(", use_global_device_ids=true");
    }
    // The participants of one group: a cross-replica-and-partition group
    // holds its replicas' every partition.
    let size = if mode == Mode::CrossReplicaAndPartition {
        size * partitions
    } else {
        size
    };
    Ok(Groups {
        attrs,
        channel: mode != Mode::CrossReplica,
        size,
        features: vec![format!("mode={mode:?}"), format!("groups={enc}")],
    })
}

/// Emits one collective site into `lines`, reading `x` (of `ty[dims]`);
/// returns the name and shape of its (array) result.
#[allow(clippy::too_many_arguments)]
fn site(
    u: &mut Unstructured,
    b: &mut Builder,
    lines: &mut Vec<String>,
    k: usize,
    x: &str,
    ty: &str,
    dims: &[i64],
    kind: Kind,
    g: &Groups,
    features: &mut Vec<String>,
) -> Result<(String, String)> {
    let ch = |b: &mut Builder| {
        if g.channel {
            b.channel += 1;
            format!("channel_id={}, ", b.channel)
        } else {
            String::new()
        }
    };
    let s = shape(ty, dims);
    let name = format!("c{k}");
    let p = g.size;
    let reduce_op = if rare(u, 16)? { "maximum" } else { "add" };
    let asynchronous = rare(u, 4)?;
    match kind {
        Kind::AllReduce => {
            let red = b.reducer(ty, reduce_op);
            if reduce_op != "add" {
                features.push("reducer=maximum".into());
            }
            let tuple = rare(u, 4)?;
            if tuple {
                features.push("tuple".into());
                let n = u.int_in_range(2..=3)?;
                let mut ops = vec![format!("%{x}")];
                let mut shapes = vec![s.clone()];
                for j in 1..n {
                    let other = *u.choose(&["bf16", "f32", "s32", ty, ty])?;
                    let od: Vec<i64> = if u.arbitrary()? {
                        dims.to_vec()
                    } else {
                        vec![u.int_in_range(1..=64)?]
                    };
                    let os = shape(other, &od);
                    lines.push(format!(
                        "  %{name}.in{j} = {os} broadcast(%{name}.z{j}), dimensions={{}}"
                    ));
                    lines.insert(
                        lines.len() - 1,
                        format!("  %{name}.z{j} = {other}[] constant(1)"),
                    );
                    ops.push(format!("%{name}.in{j}"));
                    shapes.push(os);
                }
                let ts = format!("({})", shapes.join(", "));
                let c = ch(b);
                let (op, done) = if asynchronous {
                    features.push("async".into());
                    ("all-reduce-start", true)
                } else {
                    ("all-reduce", false)
                };
                let head = if done {
                    format!("{name}.start")
                } else {
                    name.clone()
                };
                lines.push(format!(
                    "  %{head} = {ts} {op}({}), {c}{}, to_apply=%{red}",
                    ops.join(", "),
                    g.attrs
                ));
                let t = if done {
                    lines.push(format!("  %{name} = {ts} all-reduce-done(%{head})"));
                    name.clone()
                } else {
                    head
                };
                lines.push(format!(
                    "  %{name}.out = {s} get-tuple-element(%{t}), index=0"
                ));
                return Ok((format!("{name}.out"), s));
            }
            let c = ch(b);
            if asynchronous {
                features.push("async".into());
                lines.push(format!(
                    "  %{name}.start = {s} all-reduce-start(%{x}), {c}{}, to_apply=%{red}",
                    g.attrs
                ));
                lines.push(format!("  %{name} = {s} all-reduce-done(%{name}.start)"));
            } else {
                lines.push(format!(
                    "  %{name} = {s} all-reduce(%{x}), {c}{}, to_apply=%{red}",
                    g.attrs
                ));
            }
            Ok((name, s))
        }
        Kind::ReduceScatter => {
            let red = b.reducer(ty, reduce_op);
            if reduce_op != "add" {
                features.push("reducer=maximum".into());
            }
            let d = u.int_in_range(0..=dims.len() - 1)?;
            let mut od = dims.to_vec();
            od[d] /= p;
            let os = shape(ty, &od);
            let c = ch(b);
            lines.push(format!(
                "  %{name} = {os} reduce-scatter(%{x}), {c}{}, dimensions={{{d}}}, to_apply=%{red}",
                g.attrs
            ));
            Ok((name, os))
        }
        Kind::AllGather => {
            let d = u.int_in_range(0..=dims.len() - 1)?;
            let mut od = dims.to_vec();
            od[d] *= p;
            let os = shape(ty, &od);
            let c = ch(b);
            if asynchronous {
                features.push("async".into());
                lines.push(format!(
                    "  %{name}.start = ({s}, {os}) all-gather-start(%{x}), {c}{}, dimensions={{{d}}}",
                    g.attrs
                ));
                lines.push(format!("  %{name} = {os} all-gather-done(%{name}.start)"));
            } else {
                lines.push(format!(
                    "  %{name} = {os} all-gather(%{x}), {c}{}, dimensions={{{d}}}",
                    g.attrs
                ));
            }
            Ok((name, os))
        }
        Kind::AllToAll => {
            let c = ch(b);
            if rare(u, 4)? {
                // The tuple form: one operand per rank, no dimension.
                features.push("tuple".into());
                let n = if !rare(u, 8)? {
                    p
                } else {
                    u.int_in_range(1..=4)?
                };
                let ops: Vec<String> = (0..n).map(|_| format!("%{x}")).collect();
                let shapes: Vec<String> = (0..n).map(|_| s.clone()).collect();
                lines.push(format!(
                    "  %{name} = ({}) all-to-all({}), {c}{}",
                    shapes.join(", "),
                    ops.join(", "),
                    g.attrs
                ));
                lines.push(format!(
                    "  %{name}.out = {s} get-tuple-element(%{name}), index=0"
                ));
                return Ok((format!("{name}.out"), s));
            }
            let d = u.int_in_range(0..=dims.len() - 1)?;
            lines.push(format!(
                "  %{name} = {s} all-to-all(%{x}), {c}{}, dimensions={{{d}}}",
                g.attrs
            ));
            Ok((name, s))
        }
    }
}

/// Builds one module from `u`.
pub fn generate(u: &mut Unstructured) -> Result<Generated> {
    // The options first: the module takes what the input has left, and
    // a short input still gets a full options vector.
    let options = options(u)?;
    let replicas = *u.choose(&[1i64, 2, 1, 4, 2, 8, 3])?;
    let partitions = *u.choose(&[8i64, 4, 2, 1, 8, 6, 16, 4])?;
    let partitions = if replicas * partitions > 16 {
        16 / replicas
    } else {
        partitions
    };
    let mut features = vec![
        format!("replicas={replicas}"),
        format!("partitions={partitions}"),
    ];
    let mut b = Builder {
        computations: vec![],
        reducers: vec![],
        channel: 0,
    };
    let fused = rare(u, 5)?;
    let n_sites = *u.choose(&[1usize, 1, 2, 3])?;
    let mut entry_params = vec![];
    let mut entry = vec![];
    let mut results = vec![];
    let mut sites = vec![];
    for k in 0..n_sites {
        let kind = *u.choose(&[
            Kind::AllReduce,
            Kind::ReduceScatter,
            Kind::AllGather,
            Kind::AllToAll,
        ])?;
        let ty = if rare(u, 16)? {
            "s32"
        } else {
            *u.choose(FLOAT_TYPES)?
        };
        let g = groups(u, replicas, partitions, kind)?;
        let rank = if kind == Kind::AllReduce {
            *u.choose(&[2usize, 1, 3, 0])?
        } else {
            *u.choose(&[2usize, 1, 3])?
        };
        let mut dims: Vec<i64> = (0..rank)
            .map(|_| u.int_in_range(1..=12))
            .collect::<Result<_>>()?;
        if kind != Kind::AllReduce && !dims.is_empty() {
            // Some dimension a multiple of the group (the splitting ones
            // need the one they split to be; the others do not care).
            let d = u.int_in_range(0..=dims.len() - 1)?;
            dims[d] = g.size * u.int_in_range(1..=4)?;
            if rare(u, 2)? {
                for x in dims.iter_mut() {
                    *x = g.size * ((*x + g.size - 1) / g.size);
                }
            }
        }
        // Mostly payloads that pay for their padding (the emitted program
        // does not grow with the payload, only its shapes do).
        if let Some(last) = dims.last_mut() {
            *last *= *u.choose(&[64i64, 16, 1, 256])?;
        }
        if kind == Kind::AllReduce && rare(u, 4)? {
            // A larger payload, so the cost model says yes on some topology.
            dims = vec![u.int_in_range(1..=8)? * 256, 16 * u.int_in_range(1..=8)?];
        }
        let host = *u.choose(&[
            Host::Entry,
            Host::Entry,
            Host::While,
            Host::Conditional,
            Host::Call,
        ])?;
        let mut fs = g.features.clone();
        fs.push(format!("kind={}", kind.name()));
        fs.push(format!("host={host:?}"));
        fs.push(format!("type={ty}"));
        fs.push(format!("rank={}", dims.len()));
        let s = shape(ty, &dims);
        entry_params.push(s.clone());
        let param = format!("p{k}");
        entry.push(format!("  %{param} = {s} parameter({k})"));
        let mut input = param.clone();
        if fused && k == 0 {
            b.computations.push(format!(
                "%fused{k} (f: {s}) -> {s} {{\n  %f{k} = {s} parameter(0)\n  ROOT %fn{k} = {s} negate(%f{k})\n}}\n"
            ));
            entry.push(format!(
                "  %fusion{k} = {s} fusion(%{param}), kind=kLoop, calls=%fused{k}"
            ));
            input = format!("fusion{k}");
        }
        let out = match host {
            Host::Entry => site(
                u, &mut b, &mut entry, k, &input, ty, &dims, kind, &g, &mut fs,
            )?,
            Host::Call => {
                let mut lines = vec![format!("  %x{k} = {s} parameter(0)")];
                let (r, os) = site(
                    u,
                    &mut b,
                    &mut lines,
                    k,
                    &format!("x{k}"),
                    ty,
                    &dims,
                    kind,
                    &g,
                    &mut fs,
                )?;
                b.computations.push(format!(
                    "%called{k} (x{k}: {s}) -> {os} {{\n{}\n  ROOT %ret{k} = {os} copy(%{r})\n}}\n",
                    lines.join("\n")
                ));
                entry.push(format!(
                    "  %call{k} = {os} call(%{input}), to_apply=%called{k}"
                ));
                (format!("call{k}"), os)
            }
            Host::Conditional => {
                let mut lines = vec![format!("  %x{k} = {s} parameter(0)")];
                let (r, os) = site(
                    u,
                    &mut b,
                    &mut lines,
                    k,
                    &format!("x{k}"),
                    ty,
                    &dims,
                    kind,
                    &g,
                    &mut fs,
                )?;
                b.computations.push(format!(
                    "%branch{k}.t (x{k}: {s}) -> {os} {{\n{}\n  ROOT %ret{k} = {os} copy(%{r})\n}}\n",
                    lines.join("\n")
                ));
                b.computations.push(format!(
                    "%branch{k}.f (y{k}: {s}) -> {os} {{\n  %y{k} = {s} parameter(0)\n  \
                     %zero.f{k} = {ty}[] constant(0)\n  ROOT %ret.f{k} = {os} broadcast(%zero.f{k}), dimensions={{}}\n}}\n"
                ));
                entry.push(format!("  %pred{k} = pred[] constant(true)"));
                entry.push(format!(
                    "  %cond{k} = {os} conditional(%pred{k}, %{input}, %{input}), \
                     true_computation=%branch{k}.t, false_computation=%branch{k}.f"
                ));
                (format!("cond{k}"), os)
            }
            Host::While => {
                // Carry (i, x, y): the body runs the collective on x into y.
                let mut lines = vec![];
                let mut inner = vec![];
                let (r, os) = site(
                    u,
                    &mut b,
                    &mut inner,
                    k,
                    &format!("x{k}"),
                    ty,
                    &dims,
                    kind,
                    &g,
                    &mut fs,
                )?;
                let carry = format!("(s32[], {s}, {os})");
                lines.push(format!("  %t{k} = {carry} parameter(0)"));
                lines.push(format!("  %i{k} = s32[] get-tuple-element(%t{k}), index=0"));
                lines.push(format!("  %x{k} = {s} get-tuple-element(%t{k}), index=1"));
                lines.extend(inner);
                lines.push(format!("  %one{k} = s32[] constant(1)"));
                lines.push(format!("  %next{k} = s32[] add(%i{k}, %one{k})"));
                b.computations.push(format!(
                    "%body{k} (t{k}: {carry}) -> {carry} {{\n{}\n  ROOT %ret{k} = {carry} tuple(%next{k}, %x{k}, %{r})\n}}\n",
                    lines.join("\n")
                ));
                let trips = u.int_in_range(1..=4)?;
                b.computations.push(format!(
                    "%whilecond{k} (cc{k}: {carry}) -> pred[] {{\n  %cc{k} = {carry} parameter(0)\n  \
                     %ci{k} = s32[] get-tuple-element(%cc{k}), index=0\n  %n{k} = s32[] constant({trips})\n  \
                     ROOT %lt{k} = pred[] compare(%ci{k}, %n{k}), direction=LT\n}}\n"
                ));
                entry.push(format!("  %zero{k} = s32[] constant(0)"));
                entry.push(format!("  %z{k} = {ty}[] constant(0)"));
                entry.push(format!("  %y{k} = {os} broadcast(%z{k}), dimensions={{}}"));
                entry.push(format!(
                    "  %init{k} = {carry} tuple(%zero{k}, %{input}, %y{k})"
                ));
                entry.push(format!(
                    "  %loop{k} = {carry} while(%init{k}), condition=%whilecond{k}, body=%body{k}"
                ));
                entry.push(format!(
                    "  %res{k} = {os} get-tuple-element(%loop{k}), index=2"
                ));
                (format!("res{k}"), os)
            }
        };
        results.push(out);
        sites.push((format!("c{k}"), fs));
    }
    if fused {
        features.push("fused-module".into());
    }
    let (root_shapes, root_names): (Vec<String>, Vec<String>) = results
        .iter()
        .map(|(n, s)| (s.clone(), format!("%{n}")))
        .unzip();
    let params: Vec<String> = entry_params
        .iter()
        .enumerate()
        .map(|(k, s)| format!("p{k}: {s}"))
        .collect();
    let root = format!("({})", root_shapes.join(", "));
    let mut text =
        format!("HloModule structured, replica_count={replicas}, num_partitions={partitions}\n\n");
    for c in &b.computations {
        text.push_str(c);
        text.push('\n');
    }
    let _ = writeln!(text, "ENTRY %main ({}) -> {root} {{", params.join(", "));
    for l in &entry {
        text.push_str(l);
        text.push('\n');
    }
    let _ = writeln!(
        text,
        "  ROOT %out = {root} tuple({})\n}}",
        root_names.join(", ")
    );
    Ok(Generated {
        text,
        sites,
        options,
        features,
    })
}

/// A random options vector, as text pairs.
fn options(u: &mut Unstructured) -> Result<Vec<(&'static str, String)>> {
    let mut o: Vec<(&'static str, String)> = vec![];
    let pick = |u: &mut Unstructured,
                name: &'static str,
                values: &[&str],
                o: &mut Vec<(&'static str, String)>|
     -> Result<()> {
        let v = *u.choose(values)?;
        if !v.is_empty() {
            o.push((name, v.to_string()));
        }
        Ok(())
    };
    // "" leaves the option at its default.
    pick(
        u,
        "algorithm",
        &["", "ring", "two-shot", "two-level"],
        &mut o,
    )?;
    pick(u, "rotation", &["", "none", "hadamard"], &mut o)?;
    pick(
        u,
        "quant_format",
        &["", "int8", "fp8-e4m3", "fp8-e5m2", "int4"],
        &mut o,
    )?;
    pick(
        u,
        "block_size",
        &[
            "", "1", "2", "3", "8", "16", "32", "64", "100", "128", "256",
        ],
        &mut o,
    )?;
    pick(u, "scale_type", &["", "bf16", "f32"], &mut o)?;
    pick(u, "gather", &["", "all-gather", "permute"], &mut o)?;
    pick(u, "unroll", &["", "true", "false"], &mut o)?;
    pick(u, "fuse", &["", "auto", "off"], &mut o)?;
    pick(
        u,
        "topology",
        &[
            "",
            "v5e",
            "v6e",
            "v5p",
            "h100",
            "h200",
            "v5e:2x4",
            "v5e:4x4",
            "v6e:16x16",
            "v5p:2x2x2",
        ],
        &mut o,
    )?;
    pick(
        u,
        "max_error",
        &["", "", "0.01", "0.5", "1.1", "3", "50"],
        &mut o,
    )?;
    pick(u, "pipeline_depth", &["", "1", "2", "3", "4"], &mut o)?;
    pick(u, "bidirectional", &["", "true", "false"], &mut o)?;
    pick(u, "min_payload_bytes", &["0", "", "0", "0", "1KiB"], &mut o)?;
    pick(u, "types", &["", "bf16,f32", "bf16,f16,f32", "f32"], &mut o)?;
    pick(u, "stage", &["", "", "", "fused"], &mut o)?;
    Ok(o)
}

/// Inputs generated, rewritten and refused, per feature and option value.
#[derive(Default)]
pub struct Coverage {
    pub inputs: u64,
    /// The generated module did not parse or verify (a generator bug if
    /// not ~0; not a finding).
    pub invalid_input: u64,
    pub options_refused: u64,
    pub changed: u64,
    /// key → (sites or inputs seen, of them rewritten).
    pub counts: BTreeMap<String, (u64, u64)>,
}

pub static COVERAGE: Mutex<Option<Coverage>> = Mutex::new(None);

fn count(c: &mut Coverage, key: String, rewritten: bool) {
    let e = c.counts.entry(key).or_default();
    e.0 += 1;
    e.1 += u64::from(rewritten);
}

impl Coverage {
    /// The counts as text: one `key seen rewritten` line each.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "inputs {}\ninvalid_input {}\noptions_refused {}\nchanged {}\n# key seen rewritten\n",
            self.inputs, self.invalid_input, self.options_refused, self.changed
        );
        for (k, (seen, rewritten)) in &self.counts {
            let _ = writeln!(s, "{k} {seen} {rewritten}");
        }
        s
    }
}

/// Writes the counts to `$EQUARX_FUZZ_COVERAGE` (if set).
pub fn write_coverage() {
    let Ok(path) = std::env::var("EQUARX_FUZZ_COVERAGE") else {
        return;
    };
    if let Ok(guard) = COVERAGE.lock() {
        if let Some(c) = guard.as_ref() {
            let _ = std::fs::write(path, c.summary());
        }
    }
}

/// The `structured` target: generate, rewrite, check, count.
pub fn structured(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok(g) = generate(&mut u) else {
        return;
    };
    check(&g);
}

/// Runs one generated case; panics on a finding.
pub fn check(g: &Generated) {
    let mut guard = COVERAGE.lock().unwrap_or_else(|e| e.into_inner());
    let c = guard.get_or_insert_with(Coverage::default);
    c.inputs += 1;
    let parsed = match equarx::text::parse(&g.text) {
        Ok(p) => p,
        Err(e) => {
            c.invalid_input += 1;
            debug_invalid(&e.to_string(), g);
            return;
        }
    };
    let options = match equarx::options::from_pairs(g.options.iter().map(|(n, v)| (*n, v.as_str())))
    {
        Ok(o) => o,
        Err(e) => {
            assert!(
                e.starts_with("option "),
                "an options error that names no option: {e}"
            );
            c.options_refused += 1;
            return;
        }
    };
    let r = match equarx::rewrite(parsed.proto, parsed.counts, &options) {
        Ok(r) => r,
        Err(equarx::Error::Options(e)) => {
            assert!(!e.is_empty());
            c.options_refused += 1;
            return;
        }
        // The pipeline verifies its input first: a generator bug, not a
        // finding.
        Err(equarx::Error::Pipeline(equarx::passes::PipelineError::InvalidInput(e))) => {
            c.invalid_input += 1;
            debug_invalid(&e.to_string(), g);
            return;
        }
        Err(e) => panic!(
            "a verified module and valid options failed: {e}\noptions {:?}\n{}",
            g.options, g.text
        ),
    };
    // The pipeline verified the module after every pass (a module it
    // broke is `PipelineError::BrokeModule`, a finding above); what it
    // returns is that module.
    c.changed += u64::from(r.changed);
    for (prefix, fs) in &g.sites {
        let ops: Vec<_> = r
            .report
            .iter()
            .filter(|o| o.op.name == *prefix || o.op.name == format!("{prefix}.start"))
            .collect();
        let rewritten = ops.iter().any(|o| o.rewritten);
        if let Some(why) = ops.iter().find_map(|o| o.reason.as_deref()) {
            // The reason's kind: its words before any figure or detail.
            let kind: String = why
                .split(|ch: char| ch.is_ascii_digit() || ":(,".contains(ch))
                .next()
                .unwrap_or("")
                .trim()
                .chars()
                .take(48)
                .collect();
            count(c, format!("skip={kind}"), false);
        }
        for f in fs {
            count(c, f.clone(), rewritten);
        }
        if let Some(plan) = ops.iter().find_map(|o| o.plan.as_ref()) {
            let kind = fs
                .iter()
                .find(|f| f.starts_with("kind="))
                .map_or("?", |f| &f[5..]);
            count(c, format!("plan.{kind}.algorithm={}", plan.algorithm), true);
            count(c, format!("plan.rotation={:?}", plan.rotation), true);
            count(c, format!("plan.form={:?}", plan.form), true);
        }
    }
    for f in &g.features {
        count(c, f.clone(), r.changed);
    }
    for name in [
        "algorithm",
        "rotation",
        "quant_format",
        "block_size",
        "scale_type",
        "gather",
        "unroll",
        "fuse",
        "topology",
        "max_error",
        "pipeline_depth",
        "bidirectional",
        "min_payload_bytes",
        "types",
        "stage",
    ] {
        let v = g
            .options
            .iter()
            .find(|(n, _)| *n == name)
            .map_or("default", |(_, v)| v.as_str());
        count(c, format!("option.{name}={v}"), r.changed);
    }
    if r.module
        .computations
        .iter()
        .any(|k| k.name.starts_with("equarx_fused"))
    {
        count(c, "output=fused".into(), true);
    }
    drop(guard);
    if c_inputs() % 16384 == 0 {
        write_coverage();
    }
}

fn c_inputs() -> u64 {
    COVERAGE
        .lock()
        .ok()
        .and_then(|g| g.as_ref().map(|c| c.inputs))
        .unwrap_or(0)
}

/// With `EQUARX_FUZZ_DEBUG` set, says why a generated module is invalid
/// (a generator bug to fix).
fn debug_invalid(error: &str, g: &Generated) {
    if std::env::var_os("EQUARX_FUZZ_DEBUG").is_some() {
        eprintln!("invalid generated module: {error}\n{}", g.text);
    }
}
