//! The table of options: one [`OptionSpec`] per option, which every door
//! reads (see the module's docs on adding one).

use serde_json::Value;

use super::readers::{
    auto_choice, auto_name, auto_names, boolean, byte_count, choice, integer, list, name_of, names,
    nullable, number, size, text, type_name, whole,
};
use super::{FuseMode, MAX_BLOCK_SIZE, MAX_PIPELINE_DEPTH, RewriteOptions, parse_element_types};
use crate::numerics::profile::ProfileFile;
use crate::passes::{Platform, Stage};
use crate::plan::{Algorithm, GatherForm, Kernels, QuantFormat, Rotation, ScaleType};

/// Why `--fuse on` is refused: it outlined fusions into modules XLA had not
/// fused yet, and XLA:GPU's layout assignment, which follows its
/// pre-scheduler hook, leaves such fusions without layouts and aborts.
const FUSE_ON_REMOVED: &str = "\"on\" is no longer a choice (auto, off): outlined into a \
    module before XLA's fusion, the fusions reach the compiler's layout assignment, and \
    XLA:GPU aborts on them. For a module past XLA's fusion that holds none, give --stage fused";

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
    /// One of the names an enum knows (`auto|off`).
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
    /// What the option's value may be, given the others (the message
    /// follows `option NAME: `); [`super::validate`] runs every check.
    pub check: fn(&RewriteOptions) -> Result<(), String>,
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

/// The check of an option that any value of its type suits.
fn any(_: &RewriteOptions) -> Result<(), String> {
    Ok(())
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
        check: |o| {
            let b = o.pass.block_size;
            if !(1..=MAX_BLOCK_SIZE).contains(&b) {
                return Err(format!(
                    "block size must be in 1..={MAX_BLOCK_SIZE}, is {b}"
                ));
            }
            // What a block size must be for the format and the rotation
            // asked for: the plan's own rule.
            let rotation = o.pass.rotation.unwrap_or(Rotation::None);
            crate::plan::check_block(b, o.pass.quant_format, rotation).map_err(|e| e.to_string())
        },
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
        check: any,
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
        check: |o| {
            let d = o.pass.pipeline_depth;
            if !(1..=MAX_PIPELINE_DEPTH).contains(&d) {
                return Err(format!(
                    "pipeline depth must be in 1..={MAX_PIPELINE_DEPTH}, is {d}"
                ));
            }
            Ok(())
        },
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
        check: any,
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
        check: any,
    },
    OptionSpec {
        name: "topology",
        aliases: &[],
        syntax: Syntax::Text("TOPOLOGY"),
        help: "The machine the cost model predicts for: v5e, v6e, v5p, h100, h200, optionally \
               with a slice shape (v5e:4x4; a slice smaller than the torus has no \
               wraparound). Unset: h100 where XLA:GPU compiles the rewrite (--platform gpu, \
               XLA:GPU's hook, enable() on a GPU), else v5e. The figures are a model.",
        why: "the machine the cost model predicts for: the pass rewrites an all-reduce only \
              where the model predicts a gain, launches of the kernels XLA compiles for it included \
              (on v5e from about 20 MiB at P = 8, on h100 from about 40 MiB); an XLA:GPU \
              compile is priced as an H100 node, any other as the paper's v5e; also \
              v6e, v5p, h200, slices like `v5e:4x4`",
        unset: "v5e; h100 where XLA:GPU compiles",
        example: "h100",
        refused: Some(("v9x", "unknown topology")),
        set: |o, v| {
            o.pass.topology = nullable(v, |v| crate::cost::Topology::parse(&text(v)?))?;
            Ok(())
        },
        show: |o| o.pass.topology.as_ref().map(|t| t.name.clone()),
        check: any,
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
        check: |o| match o
            .pass
            .element_types
            .iter()
            .find(|t| !crate::numerics::QUANTIZABLE.contains(t))
        {
            Some(t) => Err(format!("element type {t:?} cannot be quantized")),
            None => Ok(()),
        },
    },
    OptionSpec {
        name: "gather",
        aliases: &[],
        syntax: Syntax::Choice(names::<GatherForm>),
        help: "How the reduced chunks reach every rank: one all-gather, or P-1 \
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
        check: any,
    },
    OptionSpec {
        name: "fuse",
        aliases: &[],
        syntax: Syntax::Choice(names::<FuseMode>),
        help: "Outline the emitted quantize / dequantize chains into loop fusions: auto does \
               when the module is past XLA's fusion (--stage fused, or detected: a dump after \
               optimizations, XLA:CPU's pre-scheduler hook; --stage tiled, XLA:TPU's, with \
               only what libtpu's fusion emitter takes), never before; off never does.",
        why: "outline the quantize / dequantize-add chains into `kLoop` fusions when the \
              module is already fused (XLA:CPU's pre-scheduler hook: the JAX door; a dump after \
              optimizations; XLA:TPU's hook, where every emitted op would otherwise be a kernel \
              of its own: an 8 MiB psum 30 kernels instead of 93 and no temp memory instead \
              of 32 MiB); before fusion XLA fuses them itself, and a fusion that reaches \
              XLA:GPU's layout assignment aborts the compiler. A module past fusion that holds \
              none says so with `--stage fused`. A rewritten after-optimizations dump that you \
              send through XLA's whole pipeline again (e.g. via MLIR) wants `off`: XLA's layout \
              assignment refuses modules that already hold bitcasts",
        unset: "",
        example: "off",
        refused: Some(("maybe", "\"maybe\" is not one of")),
        set: |o, v| {
            if text(v)? == "on" {
                return Err(FUSE_ON_REMOVED.to_string());
            }
            o.pass.fuse = choice(v)?;
            Ok(())
        },
        show: |o| Some(name_of(o.pass.fuse)),
        check: any,
    },
    OptionSpec {
        name: "stage",
        aliases: &[],
        syntax: Syntax::Choice(auto_names::<Stage>),
        help: "Where in XLA's pipeline the module is: pre-fusion (after SPMD partitioning, \
               before fusion: a lowered module, XLA:GPU's pre-scheduler hook), fused (after \
               XLA's fusion: XLA:CPU's hook) or tiled (after a backend's tiling assignment: \
               XLA:TPU's hook, where equarx tiles what it emits, outlines only the fusions \
               libtpu's emitter takes and emits the rotation's product as libtpu's fused \
               convolution); auto: tiled \
               when a layout has tiles or a memory space, else fused when the module holds a \
               fusion. It sets the forms the rewrite emits (the all-to-all's, the loop's \
               copies, and whether --fuse auto outlines loop fusions); the report names it.",
        why: "a module that holds fusions is past XLA's fusion (XLA:CPU's pre-scheduler \
              hook): XLA will not fuse or decompose what the pass emits any more, so the pass \
              fuses it and writes the collectives in the forms XLA's runtime runs; past a \
              tiling assignment (XLA:TPU's hook) it emits plans whose products, constants, \
              layouts and all-to-alls that backend takes there. Give `pre-fusion` for a \
              module before XLA's pipeline (the door before XLA does): the rewrite then holds \
              no `copy`, which StableHLO cannot express, since XLA's copy insertion follows",
        unset: "",
        example: "fused",
        refused: Some(("late", "\"late\" is not one of")),
        set: |o, v| {
            o.pass.stage = auto_choice(v)?;
            Ok(())
        },
        show: |o| Some(auto_name(o.pass.stage)),
        check: any,
    },
    OptionSpec {
        name: "platform",
        aliases: &[],
        syntax: Syntax::Choice(auto_names::<Platform>),
        help: "The XLA backend that compiles the rewrite: cpu, gpu or tpu. The pass emits \
               the same arithmetic in the form that compiler takes best (a message as one \
               array for XLA:CPU and XLA:GPU; codes and scales apart for XLA:TPU, but where an \
               all-to-all takes one array per peer: past XLA's fusion; before XLA:TPU's \
               fusion the results leave through an opt-barrier, a boundary as the \
               collective's was); auto: tpu \
               past a tiling assignment (--stage tiled), cpu past fusion (--stage fused), \
               else the --topology's (v5e, v6e, v5p: tpu; h100, h200: gpu). The JAX door \
               before XLA passes the platform it lowered for.",
        why: "one array per message keeps XLA:CPU's collectives, and so its compile time, \
              down, and XLA:GPU's launches; XLA:TPU relayouts rows of B + 2 bytes around \
              every collective, so it gets the codes and the scales apart: one two-shot psum \
              compiles to 18 kernels instead of 27, and behind the barrier Gemma 3 270M's \
              program keeps its own fusions (1088 kernels instead of 1734) \
              ([BENCHMARKS.md](../BENCHMARKS.md))",
        unset: "",
        example: "gpu",
        refused: Some(("rocm", "\"rocm\" is not one of")),
        set: |o, v| {
            o.pass.platform = auto_choice(v)?;
            Ok(())
        },
        show: |o| Some(auto_name(o.pass.platform)),
        check: any,
    },
    OptionSpec {
        name: "kernels",
        aliases: &[],
        syntax: Syntax::Choice(auto_names::<Kernels>),
        help: "Who writes the kernels of a rewrite's compute steps: hlo (the pass emits HLO \
               ops and the compiler fuses them), mosaic (XLA:TPU, before XLA or at its hook) or \
               triton (XLA:GPU, before XLA or at its hook, which is before its fusion): the pass \
               writes two-shot's quantize, dequantize-sum-requantize and dequantize, its \
               reduce-scatter's quantize and dequantize-sum, and an all-gather's quantize and \
               dequantize, as one kernel each; int8, B = 64, bf16 scales. mosaic takes an \
               operand whose last dimension is a multiple of 128 up to 4096 or of 512 and \
               whose rows are a multiple of 128·P, P <= 8 (an all-gather: 128 rows a rank, any \
               P), scattered or gathered whole rows, at the hook laid out as libtpu lays it \
               out; triton an operand of a multiple of 1024·P elements, under 2^31, P <= 16 \
               (an all-gather: 1024 elements a rank, any P), scattered or gathered whole runs. \
               auto (the default): on XLA:TPU mosaic and on XLA:GPU triton where the kernels \
               take the op and the time model predicts them faster than the hlo plan, hlo \
               otherwise and on XLA:CPU. An op the kernels cannot take keeps hlo, and the \
               report says why; a forced ring or two-level keeps the all-reduces and \
               reduce-scatters in hlo, not the all-gathers, which have no algorithm.",
        why: "libtpu makes 7 (at its hook) to 14 kernels an op of the HLO form; as one \
              Mosaic kernel a step the same arithmetic is 3, and v5e:2x2 compiles an 8 MiB \
              psum in 2.6x the original's time instead of 15.2x, a TP MLP in 1.19x instead \
              of 1.42x, Gemma 3 270M in 1.18x instead of 1.89x, and at the hook in 1.11x \
              instead of 1.75x; an all-gather or a reduce-scatter is 2 kernels instead of 8 \
              or 10 (a lone one compiles in 2.8x or 1.0x the original's time instead of \
              15.9x or 12.3x); at the hook the HLO form's codes travel in padded 128-byte \
              tile rows, the kernels' do not. XLA:GPU makes 9 kernels of the HLO form's \
              two-shot and 3 of the Triton kernels ([BENCHMARKS.md](../BENCHMARKS.md)). No \
              TPU or GPU runs the kernels here: their text runs on the host against the HLO \
              emission, bit for bit; hlo keeps the emission XLA:CPU runs",
        unset: "",
        example: "mosaic",
        refused: Some(("cuda", "\"cuda\" is not one of")),
        set: |o, v| {
            o.pass.kernels = auto_choice(v)?;
            Ok(())
        },
        show: |o| Some(auto_name(o.pass.kernels)),
        check: any,
    },
    OptionSpec {
        name: "quant_format",
        aliases: &[],
        syntax: Syntax::Choice(names::<QuantFormat>),
        help: "What a code is: int8 (absmax/127), fp8-e4m3 or fp8-e5m2 (absmax/448 or /57344, \
               the float's own rounding), int4 (absmax/7, two codes per byte; opt-in).",
        why: "int8 errs least at the same bytes (rotated, on a real LLM: 0.4–1.0 % per op); \
              fp8 keeps a relative error per value and is best unrotated (0.8–3.6 % on the \
              same inputs: gemma-3-270m +0.9–1.3 % perplexity); int4 sends about 3.4x fewer \
              bytes than bf16 at a much larger error: `auto` declines it where the best plan \
              predicts more than 10 % per op, which no int4 plan meets on a real LLM's \
              activations (the best, two-shot + Hadamard at B = 16, costs gemma-3-270m \
              +14.7 % perplexity); give `--max-error` to take it (the CLI's `--format` names \
              the output container, hence `--quant-format`; `--format int4` is refused with a \
              pointer to it)",
        unset: "",
        example: "fp8-e4m3",
        refused: Some(("int3", "\"int3\" is not one of")),
        set: |o, v| {
            o.pass.quant_format = choice(v)?;
            Ok(())
        },
        show: |o| Some(name_of(o.pass.quant_format)),
        check: any,
    },
    OptionSpec {
        name: "algorithm",
        aliases: &[],
        syntax: Syntax::Choice(auto_names::<Algorithm>),
        help: "The reduce algorithm: ring (P-1 requantizing hops; a torus ring), two-shot \
               (quantize once, one all-to-all, the owner sums in f32; switched fabrics), \
               two-level (a ring per axis of a 2-D slice); auto lets the time model choose per op.",
        why: "per op, the time model picks among ring, two-shot and (when `--topology` names \
              a 2-D slice of the group's size) two-level; plans within 5 % of the fastest go \
              by predicted error. On v5e that is two-shot up to about 14 MiB and the ring \
              above; on an H100 node two-shot (an all-to-all costs no more link time on a \
              switch, and quantizes twice instead of P times)",
        unset: "",
        example: "two-shot",
        refused: Some(("tree", "\"tree\" is not one of")),
        set: |o, v| {
            o.pass.algorithm = auto_choice(v)?;
            Ok(())
        },
        show: |o| Some(auto_name(o.pass.algorithm)),
        check: any,
    },
    OptionSpec {
        name: "rotation",
        aliases: &[],
        syntax: Syntax::Choice(auto_names::<Rotation>),
        help: "Rotate every block by an orthonormal Hadamard transform before quantizing \
               (undone once at the end): an outlier's energy spreads over its block. auto: \
               plans with and without it are weighed, and the rotation stays where its \
               plan comes within 5 % of the fastest and predicts the lower error.",
        why: "an outlier sets its block's step; rotated, the block's energy is spread evenly, \
              which cuts the error on outlier-heavy activations several times (P = 8, 100x \
              outliers on 0.1 % of the inputs: 3.6 % → 0.5 % in real XLA) and changes nothing \
              on Gaussian data. Needs a power-of-two block size",
        unset: "",
        example: "hadamard",
        refused: Some(("givens", "\"givens\" is not one of")),
        set: |o, v| {
            o.pass.rotation = auto_choice(v)?;
            Ok(())
        },
        show: |o| Some(auto_name(o.pass.rotation)),
        check: any,
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
        check: any,
    },
    OptionSpec {
        name: "max_error",
        aliases: &["max_error_pct"],
        syntax: Syntax::Number("PCT"),
        help: "An error budget: the fastest configuration whose predicted relative RMS error \
               (percent per op, on the op's data as far as it is known: a profile, or the \
               prior) is at most this; an op with none is skipped with the reason.",
        why: "unset, the default budget of 1.5 % (about +0.25 % perplexity on a real LLM) \
              picks the plans; if none meets it, the most exact is taken unless it predicts \
              over 10 %, which would break a model (an int4 rewrite, say): then the op is \
              declined with the reason",
        unset: "none",
        example: "1.1",
        refused: Some(("-1", "the error budget must be a positive percentage")),
        set: |o, v| {
            o.pass.max_error_pct = nullable(v, number)?;
            Ok(())
        },
        show: |o| o.pass.max_error_pct.map(|e| e.to_string()),
        check: |o| match o.pass.max_error_pct {
            Some(e) if !(e.is_finite() && e > 0.0) => Err(format!(
                "the error budget must be a positive percentage, is {e}"
            )),
            _ => Ok(()),
        },
    },
    OptionSpec {
        name: "profile",
        aliases: &[],
        syntax: Syntax::Text("FILE"),
        help: "A calibration profile (equarx.jax.calibrate, or equarx calibrate on saved \
               inputs), as a file or its JSON: the error model predicts each op it holds \
               from that op's measured inputs, and the others from the prior; the report \
               says which.",
        why: "without one, every prediction uses the prior measured on a real LLM's \
              all-reduce inputs (outlier channels included); an op's own measurement is \
              sharper, and ops are matched by metadata, shape and order, never misapplied",
        unset: "none",
        example: r#"{"version": 1, "source": "an example", "equarx": "0.1.0", "ops": []}"#,
        refused: Some((
            "/nonexistent/profile.json",
            "cannot read /nonexistent/profile.json",
        )),
        set: |o, v| {
            o.pass.profile = nullable(v, text)?
                .map(|path| ProfileFile::read(&path))
                .transpose()?;
            Ok(())
        },
        show: |o| o.pass.profile.as_ref().map(|p| p.given.clone()),
        check: any,
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
        check: |o| match o.counts.replica_count {
            Some(n) if n < 1 => Err(format!("must be at least 1, is {n}")),
            _ => Ok(()),
        },
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
        check: |o| match o.counts.num_partitions {
            Some(n) if n < 1 => Err(format!("must be at least 1, is {n}")),
            _ => Ok(()),
        },
    },
    OptionSpec {
        name: "disabled_passes",
        aliases: &["disable_pass"],
        syntax: Syntax::List("PASS"),
        help: "Passes to skip, by name: quantize-collectives (also by its old name, \
               quantized-all-reduce), remove-dead-widenings, outline-fusions; an unknown name \
               is an error when the pipeline runs.",
        why: "skip a pass, e.g. to compare with the module decoded, verified and encoded \
              but not rewritten",
        unset: "none",
        example: "quantize-collectives",
        refused: None,
        set: |o, v| {
            o.disabled_passes = list(v)?;
            Ok(())
        },
        show: |o| Some(o.disabled_passes.join(",")),
        check: any,
    },
];
