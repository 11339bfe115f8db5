//! The one definition of equarx's options. Every door reads options through
//! [`OPTIONS`]: the CLI's flags (`--block-size 32`), the JSON object of the
//! C ABI, the Python package and the PJRT callback (`{"block_size": 32}`),
//! and the name/value pairs of the C++ pass (`Set("block_size", 32)`). So
//! they take the same names and values, apply the same defaults and answer
//! with the same messages; the README's option table, the key lists of
//! `cpp_shim/README.md` and `cpp_shim/include/equarx.h`, and `--help` are
//! made from the same entries (`tests/options.rs` checks the files and
//! drives every option through every door).
//!
//! Names are the JSON keys; the CLI flag is the name with `-` for `_`, and
//! either spelling is accepted everywhere. A value is JSON, or text as the
//! command line and the C++ pairs give it (`"64"`, `"true"`, `"bf16,f32"`,
//! `"1MiB"`); both forms are read by the same function, so text and JSON
//! can never mean different things.
//!
//! # Adding an option
//!
//! 1. Add its field to [`crate::Options`] (the pass) or
//!    [`crate::RewriteOptions`] (around it), with its default there; checks
//!    that involve several fields go in their `validate`.
//! 2. Add one [`OptionSpec`] to [`OPTIONS`]: its name, value syntax, help
//!    line, the README's "why", a valid non-default `example` and a
//!    `refused` value with the start of its message, a `set` that reads a
//!    value into the options (with the readers below: [`whole`],
//!    [`number`], [`boolean`], [`byte_count`], [`text`], [`list`],
//!    [`choice`], [`nullable`]) and a `show` that writes the current value
//!    as text. The CLI flag must not be one a command already has
//!    (`rewrite --format` is taken: `help_shows_every_option_with_its_default`
//!    fails on a clash).
//! 3. Run `EQUARX_BLESS=1 cargo test --test options` to regenerate the
//!    README table and the C/C++ key lists, and review the diff.
//!
//! Nothing else: the CLI, C, C++, Python and PJRT doors pick it up, and
//! `tests/options.rs` and `tests/cpp_pipeline.rs` send the example and the
//! refused value through each of them.

use std::fmt::Write as _;

use serde_json::Value;

use crate::choice::Choice;
use crate::passes::quantized_all_reduce::parse_element_types;
use crate::plan::QuantFormat;
use crate::proto::PrimitiveType;
use crate::{AlgorithmOption, FuseMode, GatherForm, RewriteOptions, RotationOption, ScaleType};

/// How an option's value is written, for `--help` and the docs; also how
/// the command line reads it (a flag, a list that may repeat).
#[derive(Clone, Copy, Debug)]
pub enum Syntax {
    /// A whole number, shown as the given placeholder (`B`, `D`, `N`).
    Whole(&'static str),
    /// A number (may have a fraction), shown as the given placeholder.
    Number(&'static str),
    /// `true` or `false`; a bare flag on the command line means `true`.
    Bool,
    /// Bytes: a whole number, or with a suffix `KiB`, `MiB`, `GiB`.
    Bytes,
    /// One of the names an enum knows (`auto|on|off`).
    Choice(fn() -> Vec<String>),
    /// Free text, shown as the given placeholder.
    Text(&'static str),
    /// A list: a JSON array, or comma-separated text (the flag may repeat).
    List(&'static str),
}

impl Syntax {
    /// The value's placeholder: `B`, `true|false`, `auto|on|off`, `TYPE,...`.
    pub fn placeholder(&self) -> String {
        match self {
            Syntax::Whole(p) | Syntax::Number(p) | Syntax::Text(p) => (*p).to_string(),
            Syntax::Bool => "true|false".into(),
            Syntax::Bytes => "BYTES".into(),
            Syntax::Choice(names) => names().join("|"),
            Syntax::List(p) => format!("{p},..."),
        }
    }

    pub fn is_list(&self) -> bool {
        matches!(self, Syntax::List(_))
    }
}

/// One option.
pub struct OptionSpec {
    /// The JSON key and C++ name; the CLI flag is `--` + this with `-`.
    pub name: &'static str,
    /// Older names, accepted by every door.
    pub aliases: &'static [&'static str],
    pub syntax: Syntax,
    /// One line: `--help`, the C/C++ key lists.
    pub help: &'static str,
    /// Why the default is what it is (the README's table; markdown).
    pub why: &'static str,
    /// What the option means when it is not set and [`OptionSpec::show`]
    /// has nothing to show (`the cost model decides`).
    pub unset: &'static str,
    /// A valid value that is not the default (tests send it through every
    /// door).
    pub example: &'static str,
    /// A value the option refuses, and the start of the message after
    /// `option NAME: ` (`None`: every text is a valid value).
    pub refused: Option<(&'static str, &'static str)>,
    /// Reads a value into the options.
    pub set: fn(&mut RewriteOptions, &Value) -> Result<(), String>,
    /// The current value as text that `set` reads back; `None` when unset.
    pub show: fn(&RewriteOptions) -> Option<String>,
}

impl OptionSpec {
    /// The command-line flag, without the dashes: `block-size`.
    pub fn flag(&self) -> String {
        self.name.replace('_', "-")
    }

    /// The default: its value, or what being unset means (`none`, `the
    /// cost model decides`).
    pub fn default_text(&self) -> String {
        match (self.show)(&RewriteOptions::default()) {
            Some(v) if !v.is_empty() => v,
            _ => self.unset.to_string(),
        }
    }
}

/// Every option, in the order the docs list them.
pub static OPTIONS: &[OptionSpec] = &[
    OptionSpec {
        name: "block_size",
        aliases: &[],
        syntax: Syntax::Whole("B"),
        help: "Elements per quantization block (B): one scale per block.",
        why: "with bf16 scales, the same bytes as B = 128 with f32 scales and 21 % less error \
              on outlier-heavy activations ([BENCHMARKS.md](BENCHMARKS.md))",
        unset: "",
        example: "32",
        refused: Some(("many", "expected a whole number")),
        set: |o, v| {
            o.pass.block_size = size(whole(v)?)?;
            Ok(())
        },
        show: |o| Some(o.pass.block_size.to_string()),
    },
    OptionSpec {
        name: "scale_type",
        aliases: &[],
        syntax: Syntax::Choice(names::<ScaleType>),
        help: "Type of the per-block scales on the wire.",
        why: "codes are computed against the rounded scale",
        unset: "",
        example: "f32",
        refused: Some(("f64", "\"f64\" is not one of")),
        set: |o, v| {
            o.pass.scale_type = choice(v)?;
            Ok(())
        },
        show: |o| Some(name_of(o.pass.scale_type)),
    },
    OptionSpec {
        name: "pipeline_depth",
        aliases: &[],
        syntax: Syntax::Whole("D"),
        help: "Independent sub-chunk chains per ring direction (D).",
        why: "one chain per direction: a bidirectional ring then has two chains the scheduler \
              can overlap (one's transfer under the other's quantize), and each further lane \
              adds about 35 instructions to the loop body (XLA:CPU overlaps none, \
              [BENCHMARKS.md](BENCHMARKS.md))",
        unset: "",
        example: "2",
        refused: Some(("-2", "expected a whole number")),
        set: |o, v| {
            o.pass.pipeline_depth = size(whole(v)?)?;
            Ok(())
        },
        show: |o| Some(o.pass.pipeline_depth.to_string()),
    },
    OptionSpec {
        name: "bidirectional",
        aliases: &[],
        syntax: Syntax::Bool,
        help: "Send half of every chunk each way round the ring (false: one way, half the \
               messages, half the link use).",
        why: "half of every chunk goes each way; against an all-reduce that uses both \
              directions of its links, a one-way ring has half the bandwidth \
              (`--bidirectional false`)",
        unset: "",
        example: "false",
        refused: Some(("yes", "expected true or false")),
        set: |o, v| {
            o.pass.bidirectional = boolean(v)?;
            Ok(())
        },
        show: |o| Some(o.pass.bidirectional.to_string()),
    },
    OptionSpec {
        name: "min_payload_bytes",
        aliases: &["min_payload"],
        syntax: Syntax::Bytes,
        help: "Rewrite only all-reduces of at least this many bytes (in their own type) \
               instead of asking the cost model; 0 rewrites every eligible all-reduce.",
        why: "a size threshold instead of the model; `0` rewrites every eligible all-reduce",
        unset: "the cost model decides",
        example: "1MiB",
        refused: Some(("lots", "\"lots\" is not a byte count")),
        set: |o, v| {
            o.pass.min_payload_bytes = nullable(v, byte_count)?;
            Ok(())
        },
        show: |o| o.pass.min_payload_bytes.map(|b| b.to_string()),
    },
    OptionSpec {
        name: "topology",
        aliases: &[],
        syntax: Syntax::Text("TOPOLOGY"),
        help: "The machine the cost model predicts for: v5e, v6e, v5p, h100, h200, optionally \
               with a slice shape (v5e:4x4; a slice smaller than the torus has no \
               wraparound). The figures are a model.",
        why: "the machine the cost model predicts for: the pass rewrites an all-reduce only \
              where the model predicts a gain (on v5e, from about 1.6 MiB at P = 8); also \
              v6e, v5p, h100, h200, slices like `v5e:4x4`",
        unset: "",
        example: "h100",
        refused: Some(("v9x", "unknown topology")),
        set: |o, v| {
            o.pass.topology = crate::cost::Topology::parse(&text(v)?)?;
            Ok(())
        },
        show: |o| Some(o.pass.topology.name.clone()),
    },
    OptionSpec {
        name: "types",
        aliases: &[],
        syntax: Syntax::List("TYPE"),
        help: "Element types to quantize (bf16, f16, f32). XLA:CPU promotes bf16 all-reduces \
               to f32 before scheduling: use bf16,f32 there.",
        why: "XLA:CPU promotes bf16 all-reduces to f32 before scheduling: use `bf16,f32` there",
        unset: "",
        example: "bf16,f32",
        refused: Some(("s32", "element type \"s32\" is not one of")),
        set: |o, v| {
            o.pass.element_types = parse_element_types(&list(v)?)?;
            Ok(())
        },
        show: |o| {
            let names: Vec<&str> = o.pass.element_types.iter().map(|t| type_name(*t)).collect();
            Some(names.join(","))
        },
    },
    OptionSpec {
        name: "gather",
        aliases: &[],
        syntax: Syntax::Choice(names::<GatherForm>),
        help: "How the reduced chunks reach every rank: one all-gather per lane, or P-1 \
               collective-permute hops round the same ring.",
        why: "or `permute`: P−1 collective-permute hops round the same ring",
        unset: "",
        example: "permute",
        refused: Some(("broadcast", "\"broadcast\" is not one of")),
        set: |o, v| {
            o.pass.gather = choice(v)?;
            Ok(())
        },
        show: |o| Some(name_of(o.pass.gather)),
    },
    OptionSpec {
        name: "fuse",
        aliases: &[],
        syntax: Syntax::Choice(names::<FuseMode>),
        help: "Outline the emitted quantize / dequantize chains into loop fusions: auto does \
               when the module already holds fusions (XLA's fusion pass has run: a dump after \
               optimizations, the pre-scheduler hook).",
        why: "outline the quantize / dequantize-add chains into `kLoop` fusions when the \
              module is already fused (XLA's pre-scheduler hook: the JAX door; a dump after \
              optimizations); before fusion XLA fuses them itself. `on` / `off` force it. A \
              rewritten after-optimizations dump that you send through XLA's whole pipeline \
              again (e.g. via MLIR) wants `off`: XLA's layout assignment refuses modules that \
              already hold bitcasts",
        unset: "",
        example: "off",
        refused: Some(("maybe", "\"maybe\" is not one of")),
        set: |o, v| {
            o.pass.fuse = choice(v)?;
            Ok(())
        },
        show: |o| Some(name_of(o.pass.fuse)),
    },
    OptionSpec {
        name: "quant_format",
        aliases: &[],
        syntax: Syntax::Choice(names::<QuantFormat>),
        help: "What a code is: int8 (absmax/127), fp8-e4m3 or fp8-e5m2 (absmax/448 or /57344, \
               the float's own rounding), int4 (absmax/7, two codes per byte; opt-in).",
        why: "int8 errs least on Gaussian data at the same bytes; fp8 keeps a relative error \
              per value, whatever the block's outliers; int4 sends about 3.4x fewer bytes than \
              bf16 at a much larger error, for slow links (the CLI's `--format` names the \
              output container, hence `--quant-format`; `--format int4` is refused with a \
              pointer to it)",
        unset: "",
        example: "fp8-e4m3",
        refused: Some(("int3", "\"int3\" is not one of")),
        set: |o, v| {
            o.pass.quant_format = choice(v)?;
            Ok(())
        },
        show: |o| Some(name_of(o.pass.quant_format)),
    },
    OptionSpec {
        name: "algorithm",
        aliases: &[],
        syntax: Syntax::Choice(names::<AlgorithmOption>),
        help: "The reduce algorithm: ring (P-1 requantizing hops; a torus ring), two-shot \
               (quantize once, one all-to-all, the owner sums in f32; switched fabrics), \
               two-level (a ring per axis of a 2-D slice); auto lets the time model choose per op.",
        why: "per op, the time model picks among ring, two-shot and (when `--topology` names \
              a 2-D slice of the group's size) two-level; plans within 5 % of the fastest go \
              by predicted error. On v5e that is two-shot up to about 1 MiB and the ring \
              above; on an H100 node two-shot (an all-to-all costs no more link time on a \
              switch, and quantizes twice instead of P times)",
        unset: "",
        example: "two-shot",
        refused: Some(("tree", "\"tree\" is not one of")),
        set: |o, v| {
            o.pass.algorithm = choice(v)?;
            Ok(())
        },
        show: |o| Some(name_of(o.pass.algorithm)),
    },
    OptionSpec {
        name: "rotation",
        aliases: &[],
        syntax: Syntax::Choice(names::<RotationOption>),
        help: "Rotate every block by an orthonormal Hadamard transform before quantizing \
               (undone once at the end): an outlier's energy spreads over its block. auto: \
               wherever the time model says it costs at most 5 %.",
        why: "an outlier sets its block's step; rotated, the block's energy is spread evenly, \
              which cuts the error on outlier-heavy activations several times (P = 8, 100x \
              outliers on 0.1 % of the inputs: 3.6 % → 0.5 % in real XLA) and changes nothing \
              on Gaussian data. Needs a power-of-two block size",
        unset: "",
        example: "hadamard",
        refused: Some(("givens", "\"givens\" is not one of")),
        set: |o, v| {
            o.pass.rotation = choice(v)?;
            Ok(())
        },
        show: |o| Some(name_of(o.pass.rotation)),
    },
    OptionSpec {
        name: "unroll",
        aliases: &[],
        syntax: Syntax::Bool,
        help: "Write every ring step out instead of a while loop over the steps: the rewrite \
               then grows with P and the lanes, and XLA compiles it many times slower.",
        why: "the loop keeps a rewritten all-reduce under 200 instructions for any P: XLA:CPU \
              compiles a 16-layer prefill's ring rewrite in 1.8x the original's time and a \
              62-layer one in 2.1x; unrolled (571 instructions per P = 8 ring, one lane a way) \
              4.4x and 22x ([BENCHMARKS.md](BENCHMARKS.md)). Unroll when a scheduler should \
              interleave steps across the whole ring and compile time does not matter",
        unset: "",
        example: "true",
        refused: Some(("sometimes", "expected true or false")),
        set: |o, v| {
            o.pass.unroll = boolean(v)?;
            Ok(())
        },
        show: |o| Some(o.pass.unroll.to_string()),
    },
    OptionSpec {
        name: "max_error",
        aliases: &["max_error_pct"],
        syntax: Syntax::Number("PCT"),
        help: "An error budget: the fastest configuration whose predicted relative RMS error \
               (Gaussian data, percent) is at most this; an op with none is skipped with the \
               reason.",
        why: "unset, the time model alone chooses (with rotation wherever it is cheap). With a \
              budget, configurations the error model predicts above it are left out; the \
              prediction is for Gaussian data, and outlier-heavy data errs more without \
              rotation",
        unset: "none",
        example: "1.1",
        refused: Some(("-1", "the error budget must be a positive percentage")),
        set: |o, v| {
            let budget = nullable(v, number)?;
            if let Some(e) = budget.filter(|e| *e <= 0.0) {
                return Err(format!(
                    "the error budget must be a positive percentage, is {e}"
                ));
            }
            o.pass.max_error_pct = budget;
            Ok(())
        },
        show: |o| o.pass.max_error_pct.map(|e| e.to_string()),
    },
    OptionSpec {
        name: "replica_count",
        aliases: &[],
        syntax: Syntax::Whole("N"),
        help: "Replicas the module runs with; overrides what the module says.",
        why: "needed when the module does not say (a bare proto without `device_assignment`)",
        unset: "from the module",
        example: "1",
        refused: Some(("one", "expected an integer")),
        set: |o, v| {
            o.counts.replica_count = nullable(v, integer)?;
            Ok(())
        },
        show: |o| o.counts.replica_count.map(|n| n.to_string()),
    },
    OptionSpec {
        name: "num_partitions",
        aliases: &[],
        syntax: Syntax::Whole("N"),
        help: "Partitions the module runs with; overrides what the module says.",
        why: "needed when the module does not say (a bare proto without `device_assignment`)",
        unset: "from the module",
        example: "8",
        refused: Some(("eight", "expected an integer")),
        set: |o, v| {
            o.counts.num_partitions = nullable(v, integer)?;
            Ok(())
        },
        show: |o| o.counts.num_partitions.map(|n| n.to_string()),
    },
    OptionSpec {
        name: "disabled_passes",
        aliases: &["disable_pass"],
        syntax: Syntax::List("PASS"),
        help: "Passes to skip, by name (quantized-all-reduce); an unknown name is an error \
               when the pipeline runs.",
        why: "skip a pass, e.g. to compare with the module decoded, verified and encoded \
              but not rewritten",
        unset: "none",
        example: "quantized-all-reduce",
        refused: None,
        set: |o, v| {
            o.disabled_passes = list(v)?;
            Ok(())
        },
        show: |o| Some(o.disabled_passes.join(",")),
    },
];

/// The option called `name` (or one of its aliases; `-` and `_` alike).
pub fn find(name: &str) -> Option<&'static OptionSpec> {
    let name = name.trim().replace('-', "_");
    OPTIONS
        .iter()
        .find(|o| o.name == name || o.aliases.contains(&name.as_str()))
}

/// The message every door gives for a name that is not an option.
pub fn unknown_option(name: &str) -> String {
    let known: Vec<&str> = OPTIONS.iter().map(|o| o.name).collect();
    format!(
        "unknown option \"{}\" (the pass options are {})",
        name.trim().replace('-', "_"),
        known.join(", ")
    )
}

/// Options built up one value at a time, then checked as a whole.
#[derive(Default)]
pub struct Builder {
    options: RewriteOptions,
    given: Vec<&'static str>,
}

impl Builder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets option `name` to `value` (JSON, or text as a JSON string).
    pub fn set(&mut self, name: &str, value: &Value) -> Result<&mut Self, String> {
        let spec = find(name).ok_or_else(|| unknown_option(name))?;
        if self.given.contains(&spec.name) {
            return Err(format!("option {} is given twice", spec.name));
        }
        self.given.push(spec.name);
        (spec.set)(&mut self.options, value).map_err(|e| format!("option {}: {e}", spec.name))?;
        Ok(self)
    }

    /// Sets option `name` from text, as the command line and the C++ pass
    /// give it.
    pub fn set_text(&mut self, name: &str, value: &str) -> Result<&mut Self, String> {
        self.set(name, &Value::String(value.to_string()))
    }

    /// Whether option `name` was set.
    pub fn given(&self, name: &str) -> bool {
        self.given.contains(&name)
    }

    /// The options, checked as a whole.
    pub fn finish(self) -> Result<RewriteOptions, String> {
        self.options.validate()?;
        Ok(self.options)
    }
}

/// Options from name/value text pairs (the command line, the C++ pass).
pub fn from_pairs<'a>(
    pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Result<RewriteOptions, String> {
    let mut b = Builder::new();
    for (name, value) in pairs {
        b.set_text(name, value)?;
    }
    b.finish()
}

/// Options from a JSON object (the C ABI, Python, PJRT); empty text means
/// all defaults. A key given twice is an error, as is any unknown key.
pub fn from_json(json: &str) -> Result<RewriteOptions, String> {
    if json.trim().is_empty() {
        return Builder::new().finish();
    }
    let Entries(entries) = serde_json::from_str(json).map_err(|e| format!("options JSON: {e}"))?;
    let mut b = Builder::new();
    for (name, value) in &entries {
        b.set(name, value)?;
    }
    b.finish()
}

/// A JSON object's entries in order, duplicates kept (serde_json's map
/// would keep only the last of two equal keys, silently).
struct Entries(Vec<(String, Value)>);

impl<'de> serde::Deserialize<'de> for Entries {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Entries;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object of options")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut m: A,
            ) -> Result<Entries, A::Error> {
                let mut v = Vec::new();
                while let Some(entry) = m.next_entry::<String, Value>()? {
                    v.push(entry);
                }
                Ok(Entries(v))
            }
        }
        d.deserialize_map(Visit)
    }
}

// ---- Readers: JSON or text into a typed value, with one message each. ----

fn got(v: &Value) -> String {
    v.to_string()
}

/// A whole number: a JSON number, or text of one.
pub fn whole(v: &Value) -> Result<u64, String> {
    match v {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
    .ok_or_else(|| format!("expected a whole number, got {}", got(v)))
}

/// A signed integer (the device counts, which `validate` checks).
pub fn integer(v: &Value) -> Result<i64, String> {
    match v {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
    .ok_or_else(|| format!("expected an integer, got {}", got(v)))
}

/// A finite number: a JSON number, or text of one.
pub fn number(v: &Value) -> Result<f64, String> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
    .filter(|x: &f64| x.is_finite())
    .ok_or_else(|| format!("expected a number, got {}", got(v)))
}

fn size(n: u64) -> Result<usize, String> {
    usize::try_from(n).map_err(|_| format!("{n} is too large"))
}

pub fn boolean(v: &Value) -> Result<bool, String> {
    match v {
        Value::Bool(b) => Some(*b),
        Value::String(s) => match s.trim() {
            "true" => Some(true),
            "false" => Some(false),
            _ => None,
        },
        _ => None,
    }
    .ok_or_else(|| format!("expected true or false, got {}", got(v)))
}

/// Bytes: a number, or text like `65536`, `64KiB`, `1MiB`, `2GiB`.
pub fn byte_count(v: &Value) -> Result<u64, String> {
    match v {
        Value::Number(n) => n
            .as_u64()
            .ok_or_else(|| format!("expected a byte count, got {n}")),
        Value::String(s) => parse_bytes(s),
        _ => Err(format!("expected a byte count, got {}", got(v))),
    }
}

/// `null` is "not set"; anything else goes to `read`.
pub fn nullable<T>(v: &Value, read: fn(&Value) -> Result<T, String>) -> Result<Option<T>, String> {
    match v {
        Value::Null => Ok(None),
        v => read(v).map(Some),
    }
}

pub fn text(v: &Value) -> Result<String, String> {
    match v {
        Value::String(s) => Ok(s.trim().to_string()),
        _ => Err(format!("expected a string, got {}", got(v))),
    }
}

/// A list: a JSON array of strings, or comma-separated text (`""` is empty).
pub fn list(v: &Value) -> Result<Vec<String>, String> {
    match v {
        Value::String(s) if s.trim().is_empty() => Ok(Vec::new()),
        Value::String(s) => Ok(s.split(',').map(|p| p.trim().to_string()).collect()),
        Value::Array(items) => items
            .iter()
            .map(|i| match i {
                Value::String(s) => Ok(s.trim().to_string()),
                other => Err(format!("expected a list of strings, got {}", got(other))),
            })
            .collect(),
        _ => Err(format!("expected a list of strings, got {}", got(v))),
    }
}

/// One of an enum's names ([`Choice`]).
pub fn choice<T: Choice>(v: &Value) -> Result<T, String> {
    T::parse(&text(v)?)
}

fn names<T: Choice>() -> Vec<String> {
    T::names().into_iter().map(String::from).collect()
}

fn name_of<T: Choice>(t: T) -> String {
    t.name().to_string()
}

fn type_name(t: PrimitiveType) -> &'static str {
    match t {
        PrimitiveType::Bf16 => "bf16",
        PrimitiveType::F16 => "f16",
        PrimitiveType::F32 => "f32",
        _ => "?",
    }
}

/// `65536`, `64KiB`, `1MiB`, `2GiB` (also `B`), as bytes.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = [
        ("GiB", 1u64 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
        ("B", 1),
    ]
    .iter()
    .find_map(|(suffix, m)| s.strip_suffix(suffix).map(|n| (n.trim(), *m)))
    .unwrap_or((s, 1));
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a byte count like 65536 or 1MiB"))?;
    n.checked_mul(mult)
        .ok_or_else(|| format!("{s} is too large"))
}

// ---- The docs, made from the table. ----

/// The README's table ("Options (the pass)").
pub fn markdown_table() -> String {
    let mut out = String::from("| option | default | why |\n|---|---|---|\n");
    for o in OPTIONS {
        let aliases: String = o
            .aliases
            .iter()
            .map(|a| format!(", `--{}`", a.replace('_', "-")))
            .collect();
        let default = match (o.show)(&RewriteOptions::default()) {
            Some(v) if !v.is_empty() => v,
            _ => format!("({})", o.unset),
        };
        let _ = writeln!(
            out,
            "| `--{}` {}{aliases} | {default} | {} |",
            o.flag(),
            // A bare | would end the table cell.
            o.syntax.placeholder().replace('|', "\\|"),
            o.why
        );
    }
    out
}

/// One entry per option for a C comment: `name  syntax (default D):` and
/// the help wrapped below it, every line prefixed with `prefix` (` *   `).
pub fn key_list(prefix: &str) -> String {
    let mut out = String::new();
    for o in OPTIONS {
        let _ = writeln!(
            out,
            "{prefix}{}  {} (default: {}):",
            o.name,
            o.syntax.placeholder(),
            o.default_text()
        );
        let mut line = String::new();
        for word in o.help.split_whitespace() {
            if !line.is_empty() && prefix.len() + 4 + line.len() + 1 + word.len() > 78 {
                let _ = writeln!(out, "{prefix}    {line}");
                line.clear();
            }
            if !line.is_empty() {
                line.push(' ');
            }
            line.push_str(word);
        }
        let _ = writeln!(out, "{prefix}    {line}");
    }
    out
}

/// cpp_shim/README.md's list.
pub fn markdown_key_list() -> String {
    let mut out = String::new();
    for o in OPTIONS {
        let aliases: String = o.aliases.iter().map(|a| format!(", alias `{a}`")).collect();
        let _ = writeln!(
            out,
            "- `{}` ({}, default: {}{aliases}): {}",
            o.name,
            o.syntax.placeholder(),
            o.default_text(),
            o.help
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_default_shows_as_text_that_reads_back() {
        let defaults = RewriteOptions::default();
        for o in OPTIONS {
            let Some(text) = (o.show)(&defaults) else {
                assert!(!o.unset.is_empty(), "{}: unset without a meaning", o.name);
                continue;
            };
            let mut back = RewriteOptions::default();
            (o.set)(&mut back, &Value::String(text.clone())).unwrap();
            assert_eq!(back, defaults, "{}", o.name);
        }
    }

    #[test]
    fn every_example_is_valid_changes_something_and_shows_as_itself() {
        for o in OPTIONS {
            let set = from_pairs([(o.name, o.example)]).unwrap_or_else(|e| panic!("{e}"));
            assert_ne!(
                set,
                RewriteOptions::default(),
                "{}: the example is the default",
                o.name
            );
            let shown = (o.show)(&set).expect("a set option shows");
            assert_eq!(
                from_pairs([(o.name, shown.as_str())]),
                Ok(set),
                "{}",
                o.name
            );
        }
    }

    #[test]
    fn every_refused_value_says_which_option_and_why() {
        for o in OPTIONS {
            let Some((value, message)) = o.refused else {
                continue;
            };
            let e = from_pairs([(o.name, value)]).unwrap_err();
            assert!(
                e.starts_with(&format!("option {}: {message}", o.name)),
                "{}: {e}",
                o.name
            );
        }
    }

    #[test]
    fn text_and_json_mean_the_same() {
        let j = from_json(
            r#"{"block_size": 32, "pipeline_depth": "2", "bidirectional": false,
                "min_payload_bytes": 1048576, "topology": "h100", "types": ["bf16", "f32"],
                "scale_type": "f32", "gather": "permute", "fuse": "off",
                "quant_format": "fp8-e4m3",
                "algorithm": "two-shot", "rotation": "hadamard", "unroll": true, "max_error": 1.1,
                "replica_count": 1, "num_partitions": 8, "disabled_passes": ["quantized-all-reduce"]}"#,
        )
        .unwrap();
        let t = from_pairs(OPTIONS.iter().map(|o| (o.name, o.example))).unwrap();
        assert_eq!(j, t);
        assert_eq!(
            j.pass.element_types,
            vec![PrimitiveType::Bf16, PrimitiveType::F32]
        );
        assert_eq!(j.pass.fuse, FuseMode::Off);
        assert_eq!(j.counts.num_partitions, Some(8));
    }

    #[test]
    fn names_take_either_spelling_and_aliases_but_not_twice() {
        let o = from_pairs([("min-payload", "0"), ("block-size", "8")]).unwrap();
        assert_eq!(o.pass.min_payload_bytes, Some(0));
        assert_eq!(o.pass.block_size, 8);
        let e = from_json(r#"{"min_payload": 0, "min_payload_bytes": 1}"#).unwrap_err();
        assert_eq!(e, "option min_payload_bytes is given twice");
        let e = from_json(r#"{"block_size": 8, "block_size": 64}"#).unwrap_err();
        assert_eq!(e, "option block_size is given twice");
    }

    #[test]
    fn unknown_names_and_bad_json_are_errors() {
        let e = from_json(r#"{"blok_size": 1}"#).unwrap_err();
        assert_eq!(e, unknown_option("blok_size"));
        assert!(e.starts_with("unknown option \"blok_size\" (the pass options are block_size, "));
        assert_eq!(from_pairs([("blok-size", "1")]).unwrap_err(), e);
        assert!(
            from_json("[1]")
                .unwrap_err()
                .starts_with("options JSON: invalid type")
        );
        assert!(from_json("{").unwrap_err().starts_with("options JSON:"));
        let e = from_json(r#"{"block_size": null}"#).unwrap_err();
        assert_eq!(e, "option block_size: expected a whole number, got null");
        assert_eq!(
            from_json(r#"{"min_payload_bytes": null}"#)
                .unwrap()
                .pass
                .min_payload_bytes,
            None
        );
        let e = from_json(r#"{"types": ["bf16", 3]}"#).unwrap_err();
        assert_eq!(e, "option types: expected a list of strings, got 3");
        assert_eq!(
            from_json(&json!({}).to_string()).unwrap().pass,
            crate::Options::default()
        );
    }

    #[test]
    fn readers_take_json_and_text_alike() {
        assert_eq!(number(&json!(0.25)), Ok(0.25));
        assert_eq!(number(&json!(" 1e-3")), Ok(0.001));
        assert_eq!(
            number(&json!("NaN")).unwrap_err(),
            "expected a number, got \"NaN\""
        );
        assert_eq!(whole(&json!(7)), whole(&json!("7")));
        assert_eq!(integer(&json!(-3)), integer(&json!("-3")));
        assert_eq!(boolean(&json!(false)), boolean(&json!("false")));
        assert_eq!(list(&json!(["a", "b"])), list(&json!("a, b")));
        assert_eq!(list(&json!("")), Ok(vec![]));
        assert_eq!(byte_count(&json!(1024)), byte_count(&json!("1KiB")));
        assert_eq!(nullable(&Value::Null, whole), Ok(None));
    }

    #[test]
    fn byte_counts_take_suffixes() {
        assert_eq!(parse_bytes("1MiB"), Ok(1 << 20));
        assert_eq!(parse_bytes("64 KiB"), Ok(64 << 10));
        assert_eq!(parse_bytes("0"), Ok(0));
        assert!(parse_bytes("lots").is_err());
        assert!(
            parse_bytes("99999999999GiB")
                .unwrap_err()
                .contains("too large")
        );
    }
}
