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
//! 1. Add its field to [`Options`] (the pass) or [`RewriteOptions`]
//!    (around it), with its default in their `Default` (the one place the
//!    defaults are written; the plan's knobs take theirs from
//!    [`Config::default`], and [`Options::config`] maps them back).
//! 2. Add one [`OptionSpec`] to [`OPTIONS`] (`schema.rs`): its name, value
//!    syntax, help line, the README's "why", a valid non-default `example`
//!    and a `refused` value with the start of its message, a `set` that
//!    reads a value into the options (with the readers of `readers.rs`:
//!    [`whole`], [`number`], [`boolean`], [`byte_count`], [`text`],
//!    [`list`], [`choice`], [`auto_choice`], [`nullable`]), a `check` that
//!    says what the value may be (the one place it is checked: [`validate`]
//!    runs every option's check, whichever door the options came through)
//!    and a `show` that writes the current value as text. The CLI flag must not be one a command already has
//!    (`rewrite --format` is taken: `help_shows_every_option_with_its_default`
//!    fails on a clash).
//! 3. Run `EQUARX_BLESS=1 cargo test --test options` to regenerate the
//!    README table and the C/C++ key lists, and review the diff.
//!
//! Nothing else: the CLI, C, C++, Python and PJRT doors pick it up, and
//! `tests/options.rs` and `tests/cpp_pipeline.rs` send the example and the
//! refused value through each of them.
//!
//! Adding a format, an algorithm or a collective kind: `docs/extending.md`.

mod docs;
mod readers;
mod schema;

pub use docs::{key_list, markdown_key_list, markdown_table, summary_table};
pub use readers::{
    auto_choice, boolean, byte_count, choice, integer, list, nullable, number, parse_bytes, text,
    whole,
};
pub use schema::{OPTIONS, OptionSpec, Syntax};

use serde_json::Value;

use crate::cost::Topology;
use crate::ir::DeviceCounts;
use crate::numerics::profile::ProfileFile;
use crate::passes::{Platform, Stage};
use crate::plan::{
    Algorithm, Config, Form, GatherForm, Grid, Kernels, QuantFormat, Rotation, ScaleType, Wire,
};
use crate::proto::PrimitiveType;

crate::choice_enum! {
    /// Whether the emitted ops are outlined into loop fusions.
    pub enum FuseMode {
        /// When the module is past XLA's fusion (the pipeline's stage is
        /// `fused`, as at XLA:CPU's pre-scheduler hook, or `tiled`, as at
        /// XLA:TPU's, where a fusion holds only what libtpu's fusion
        /// emitter takes); not before, where a fusion would reach the
        /// compiler's layout assignment (XLA:GPU aborts on one there). A
        /// module past fusion that holds none says so with `--stage fused`.
        Auto = "auto",
        /// Never: leave fusion to the compiler.
        Off = "off",
    }
}

/// The pass's options.
///
/// Defaults, from measurements (BENCHMARKS.md): B = 64 with bf16 scales
/// sends the same bytes as B = 128 with f32 scales (1.94x fewer than a bf16
/// ring) and errs less on outlier-heavy activations (a large block lets one
/// outlier flatten its neighbours). Rotation is on wherever it is cheap: it
/// cuts the error on such activations several times and changes nothing on
/// Gaussian data. The ring is bidirectional: on a torus, and against an XLA
/// all-reduce that uses both directions of its links, a one-way ring has
/// half the bandwidth (`equarx model`). One lane per direction and the loop
/// form keep a rewritten all-reduce under 200 instructions for any P.
/// Which collectives are worth it, and with which algorithm, is the cost
/// model's call ([`crate::cost`]: TPU v5e, or an H100 node for XLA:GPU,
/// unless told otherwise); a minimum payload replaces the model when
/// given, an error budget restricts it.
#[derive(Clone, Debug, PartialEq)]
pub struct Options {
    /// Elements per quantization block (B).
    pub block_size: usize,
    /// Independent sub-chunk chains per ring direction (D).
    pub pipeline_depth: usize,
    /// Send half of every chunk each way round the ring.
    pub bidirectional: bool,
    /// Collectives with a smaller payload (bytes, in their own type) stay;
    /// `None`: the cost model decides, on [`Options::topology`].
    pub min_payload_bytes: Option<u64>,
    /// The machine the cost model predicts for; `None`: the platform's
    /// ([`Options::topology_for`]).
    pub topology: Option<Topology>,
    /// Element types that are quantized.
    pub element_types: Vec<PrimitiveType>,
    pub scale_type: ScaleType,
    /// What a code is: int8 (the default), fp8 e4m3 / e5m2, or int4.
    pub quant_format: QuantFormat,
    pub gather: GatherForm,
    /// Outline the quantize / dequantize chains into loop fusions.
    pub fuse: FuseMode,
    /// The reduce algorithm; `None`: the pass picks per op.
    pub algorithm: Option<Algorithm>,
    /// Whether blocks are rotated; `None`: per op, wherever it is cheap.
    pub rotation: Option<Rotation>,
    /// Write every ring step out instead of a `while` loop over them.
    pub unroll: bool,
    /// The largest predicted relative RMS error (percent per op) a rewrite
    /// may have: the fastest configuration within it is taken, and an op
    /// with none is skipped. `None`: the default budget, which gives way to
    /// the most exact plan when none meets it (see `choose`).
    pub max_error_pct: Option<f64>,
    /// Where in XLA's pipeline the module is; `None`: detected (a module
    /// that holds fusions is past XLA's fusion).
    pub stage: Option<Stage>,
    /// The XLA backend that compiles the rewrite; `None`: from the stage,
    /// else from the topology ([`Platform::resolve`]).
    pub platform: Option<Platform>,
    /// A calibration profile: what each op's inputs measured; the error
    /// model predicts with it for the ops it holds, with the prior for the
    /// others.
    pub profile: Option<ProfileFile>,
    /// Who writes the compute steps' kernels ([`Kernels`]); `None`: auto,
    /// equarx's own kernels (Mosaic on XLA:TPU, Triton on XLA:GPU) where
    /// they take the plan and the operand and are predicted faster, HLO
    /// everywhere else. Where they are asked for or picked and cannot take
    /// an op, the pass emits HLO and the report says why.
    pub kernels: Option<Kernels>,
}

impl Default for Options {
    fn default() -> Self {
        // The plan's knobs take the plan's defaults.
        let plan = Config::default();
        Options {
            block_size: plan.block,
            pipeline_depth: plan.pipeline_depth,
            bidirectional: plan.bidirectional,
            min_payload_bytes: None,
            topology: None,
            element_types: vec![PrimitiveType::Bf16],
            scale_type: plan.scale_type,
            quant_format: plan.format,
            gather: plan.gather,
            fuse: FuseMode::Auto,
            algorithm: None,
            rotation: None,
            unroll: match plan.form {
                Form::Loop => false,
                Form::Unrolled => true,
            },
            max_error_pct: None,
            stage: None,
            platform: None,
            profile: None,
            kernels: None,
        }
    }
}

impl Options {
    /// The configuration these options give `algorithm` over `grid` with
    /// `rotation`: the one mapping from the options to a plan's knobs.
    pub fn config(&self, algorithm: Algorithm, grid: Option<Grid>, rotation: Rotation) -> Config {
        Config {
            algorithm,
            grid,
            rotation,
            block: self.block_size,
            scale_type: self.scale_type,
            format: self.quant_format,
            pipeline_depth: self.pipeline_depth,
            bidirectional: self.bidirectional,
            gather: self.gather,
            form: if self.unroll {
                Form::Unrolled
            } else {
                Form::Loop
            },
            // The pass sets the chosen plan's for its platform and stage
            // (`Platform::wire`): the bytes, and so every prediction, are
            // the same either way.
            wire: Wire::Packed,
            // Likewise (`Platform::kernels`): the same arithmetic.
            kernels: Kernels::Hlo,
        }
    }

    /// The machine the cost model predicts for when `platform` compiles
    /// the rewrite: the one given, else [`DEFAULT_GPU_TOPOLOGY`] on XLA:GPU
    /// and [`DEFAULT_TOPOLOGY`] on the others (XLA:CPU has no figures of
    /// its own).
    pub fn topology_for(&self, platform: Platform) -> Topology {
        self.topology.clone().unwrap_or_else(|| {
            let name = match platform {
                Platform::Gpu => DEFAULT_GPU_TOPOLOGY,
                Platform::Tpu | Platform::Cpu => DEFAULT_TOPOLOGY,
            };
            Topology::parse(name).unwrap_or_else(|e| unreachable!("{e}"))
        })
    }

    /// [`Options::topology_for`] the `platform` option, where no stage says
    /// which compiler it is (`auto`: the TPU's): what `equarx model` and
    /// `analyze` print, and what [`crate::passes::quantize_collectives`]'s
    /// planner charges when called without the pass's charges.
    pub fn stated_topology(&self) -> Topology {
        self.topology_for(self.platform.unwrap_or(Platform::Tpu))
    }
}

/// The topology the cost model assumes unless told: the paper's TPU, and
/// an H100 node where XLA:GPU compiles the rewrite.
pub const DEFAULT_TOPOLOGY: &str = "v5e";
pub const DEFAULT_GPU_TOPOLOGY: &str = "h100";

/// Largest accepted block size and pipeline depth: far beyond any useful
/// value, small enough that size arithmetic cannot overflow.
pub const MAX_BLOCK_SIZE: usize = 1 << 20;
pub const MAX_PIPELINE_DEPTH: usize = 256;

/// Everything [`crate::rewrite`] needs besides the module.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RewriteOptions {
    pub pass: Options,
    /// Replica / partition counts; a set value overrides what the module says.
    pub counts: DeviceCounts,
    /// Pass names to skip.
    pub disabled_passes: Vec<String>,
    /// Set by the native PJRT door (not an option): the module comes from a
    /// compiler's pre-scheduler hook, so where `platform` is auto its stage
    /// names the compiler ([`crate::Platform::at_hook`]).
    pub at_hook: bool,
}

/// Checks `options` as a whole: every option's own check, in table order;
/// the first failure names its option. Every door's options pass here
/// ([`Builder::finish`], [`crate::rewrite`]).
pub fn validate(options: &RewriteOptions) -> Result<(), String> {
    for o in OPTIONS {
        (o.check)(options).map_err(|e| format!("option {}: {e}", o.name))?;
    }
    Ok(())
}

/// The element types that can be quantized, by their HLO names.
pub fn parse_element_types<S: AsRef<str>>(names: &[S]) -> Result<Vec<PrimitiveType>, String> {
    let known = || {
        crate::numerics::QUANTIZABLE
            .iter()
            .filter_map(|&t| crate::ir::shape::type_name(t as i32))
            .collect::<Vec<_>>()
            .join(", ")
    };
    names
        .iter()
        .map(|n| {
            let n = n.as_ref().trim();
            crate::ir::shape::type_from_name(n)
                .filter(|t| crate::numerics::QUANTIZABLE.contains(t))
                .ok_or_else(|| format!("element type {n:?} is not one of {}", known()))
        })
        .collect()
}

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
        validate(&self.options)?;
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
                "stage": "fused", "platform": "gpu", "kernels": "mosaic",
                "profile": "{\"version\": 1, \"source\": \"an example\", \"equarx\": \"0.1.0\", \"ops\": []}",
                "replica_count": 1, "num_partitions": 8, "disabled_passes": ["quantize-collectives"]}"#,
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
    fn fuse_on_is_refused_with_the_stage_that_replaces_it() {
        let e = from_pairs([("fuse", "on")]).unwrap_err();
        assert!(
            e.contains("XLA:GPU aborts") && e.contains("--stage fused"),
            "{e}"
        );
        let o = from_pairs([("fuse", "off")]).unwrap();
        assert_eq!(o.pass.fuse, FuseMode::Off);
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
