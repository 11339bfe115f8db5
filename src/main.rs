//! The `equarx` command line: a thin shell over the library.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};

use equarx::io::{self, DeviceCounts, Format, Loaded};
use equarx::numerics::simulate::{self, Distribution};
use equarx::passes::{DumpStage, Pipeline};
use equarx::plan::Rotation;
use equarx::text::{PrintOptions, print_module_with};
use equarx::{OpReport, Options, RewriteOptions, ScaleType};

const EXAMPLES: &str = "\
Examples:
  # Rewrite the all-reduces of a JAX module and show what happened:
  equarx rewrite tests/fixtures/tp_block_spmd.pb -o /tmp/tp.eqx.pb --min-payload 0 --report

  # A sequence-parallel MLP (all-gather, reduce-scatter), the ring only,
  # within an error budget of 1 %:
  equarx rewrite tests/fixtures/sp_mlp/sp_mlp.pb -o /tmp/sp.eqx.pb --min-payload 0 \
      --algorithm ring --max-error 1 --report

  # Which plan would each op get on an H100 node, and how fast (a model)?
  equarx analyze --topology h100 tests/fixtures/tp_block_spmd.pb

  # The same, straight to readable HLO text on stdout:
  equarx rewrite tests/fixtures/psum_bf16_p8.pb -o - --format text --min-payload 0

  # A whole --xla_dump_to directory, one line per module:
  equarx rewrite /tmp/xla_dump -o /tmp/xla_dump.equarx --types bf16,f32

  # What collectives does a dump hold?
  equarx analyze module_0012.jit_f.cpu_after_optimizations.hlo.pb

  # Print a module as HLO text that XLA's parser reads back:
  equarx print tests/fixtures/psum_bf16_p8.pb";

/// EQuARX for XLA: rewrite bf16 all-reduces, reduce-scatters, all-gathers
/// and all-to-alls into block-quantized collectives of int8, fp8 or int4
/// codes that send half the bytes or fewer, choosing the algorithm (ring,
/// two-shot, two-level) and the rotation per op.
///
/// Inputs may be a bare HloModuleProto (JAX, the PJRT transform hook), an
/// HloProto (`--xla_dump_hlo_as_proto`) or an HloModuleProtoWithConfig,
/// optionally gzip-compressed; the format is detected. `-` reads stdin.
#[derive(Parser)]
#[command(name = "equarx", version, after_help = EXAMPLES)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Rewrite eligible collectives into their quantized form (the plan each
    /// op gets: `--report`).
    #[command(after_help = EXAMPLES)]
    Rewrite(RewriteArgs),
    /// Print a module as HLO text (constants in full, so XLA parses it back).
    Print(PrintArgs),
    /// List every collective: shape, type, group size, group mode, bytes.
    Analyze(AnalyzeArgs),
    /// Measure the quantized all-reduce's error against the exact sum on
    /// synthetic data, for every algorithm, rotation, block size and format
    /// asked for, bit-exact with the emitted HLO, next to the error model, a
    /// bf16 ring all-reduce and naive per-tensor int8.
    Simulate(SimulateArgs),
    /// Predicted bf16 and equarx all-reduce times over message sizes on a
    /// named topology (a model from public figures, not a measurement).
    Model(ModelArgs),
}

#[derive(Args)]
struct InputArgs {
    /// The module to read (`-` for stdin; for `rewrite`, also a dump
    /// directory, rewritten module by module into the `-o` directory).
    input: PathBuf,
    /// The input's container, if detection should not decide.
    #[arg(long, value_enum)]
    input_format: Option<Format>,
}

#[derive(Args)]
struct RewriteArgs {
    #[command(flatten)]
    input: InputArgs,
    /// Where to write the rewritten module (`-` for stdout). Written through
    /// a temporary file and a rename: never half-written.
    #[arg(short, long)]
    output: PathBuf,
    /// Output container; default: the input's (`.txt`/`.hlo` names mean
    /// text, a `.gz` suffix compresses). The code format on the wire is
    /// `--quant-format`.
    #[arg(long, value_enum)]
    format: Option<Format>,
    /// Print a table of every all-reduce: decision, reason, group, bytes on
    /// the wire before and after, predicted error.
    #[arg(long)]
    report: bool,
    /// Write the report as JSON to this file (`-` for stdout).
    #[arg(long, value_name = "FILE")]
    report_json: Option<PathBuf>,
    /// Write HLO text of the module before and after each pass here.
    #[arg(long, value_name = "DIR")]
    dump_dir: Option<PathBuf>,
    #[command(flatten)]
    pass: PassArgs,
}

/// The pass options: one flag per entry of `equarx::options::OPTIONS`
/// (names, help and defaults come from there); only the given ones are
/// kept, the rest keep the library's defaults.
struct PassArgs {
    given: Vec<(&'static str, String)>,
}

impl PassArgs {
    fn given(&self, name: &str) -> bool {
        self.given.iter().any(|(n, _)| *n == name)
    }
}

impl clap::FromArgMatches for PassArgs {
    fn from_arg_matches(m: &clap::ArgMatches) -> Result<Self, clap::Error> {
        Ok(PassArgs {
            given: equarx::options::given_in(m),
        })
    }
    fn update_from_arg_matches(&mut self, m: &clap::ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

impl clap::Args for PassArgs {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        cmd.args(equarx::options::clap_args())
    }
    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

#[derive(Args)]
struct PrintArgs {
    #[command(flatten)]
    input: InputArgs,
    /// Write here instead of stdout.
    #[arg(short, long)]
    output: Option<PathBuf>,
    /// Rename instructions `base.N` in print order (stable snapshots).
    #[arg(long)]
    canonical: bool,
}

#[derive(Args)]
struct AnalyzeArgs {
    #[command(flatten)]
    input: InputArgs,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// With --topology: predict each all-reduce's time, bf16 ring vs
    /// equarx, and its error, under these pass options.
    #[command(flatten)]
    pass: PassArgs,
}

#[derive(Args)]
struct ModelArgs {
    /// Group size P.
    #[arg(long, default_value_t = 8)]
    group_size: usize,
    /// Message sizes (bf16 payload), e.g. 64KiB,1MiB,16MiB.
    #[arg(long, value_delimiter = ',', value_parser = equarx::options::parse_bytes,
          default_value = "16KiB,64KiB,256KiB,1MiB,4MiB,16MiB,64MiB,256MiB")]
    sizes: Vec<u64>,
    /// Also write a chart of the predicted speedup over message size for
    /// every known topology (SVG).
    #[arg(long, value_name = "FILE")]
    plot: Option<PathBuf>,
    #[command(flatten)]
    pass: PassArgs,
}

#[derive(Args)]
struct SimulateArgs {
    /// Input distributions (per device, bf16).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "gaussian,heavy-tailed,llm-activations,outliers"
    )]
    distributions: Vec<Distribution>,
    /// Reduce algorithms (two-level: the most balanced grid of each P).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "ring,two-shot,two-level"
    )]
    algorithms: Vec<simulate::AlgorithmChoice>,
    /// Rotations: none, hadamard (power-of-two block sizes only).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "none,hadamard"
    )]
    rotations: Vec<Rotation>,
    /// Code formats: int8, fp8-e4m3, fp8-e5m2, int4.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "int8")]
    formats: Vec<equarx::plan::QuantFormat>,
    /// Group sizes P.
    #[arg(long, value_delimiter = ',', default_value = "2,4,8,16,64")]
    group_sizes: Vec<usize>,
    /// Block sizes B.
    #[arg(long, value_delimiter = ',', default_value = "32,64,128,512")]
    block_sizes: Vec<usize>,
    /// Pipeline depths D (lanes do not change the arithmetic; padding can).
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pipeline_depths: Vec<usize>,
    /// Ring directions to try: false (one way), true (bidirectional).
    #[arg(long, value_delimiter = ',', default_value = "true")]
    bidirectional: Vec<bool>,
    /// Elements per device.
    #[arg(long, default_value_t = 65_536)]
    elements: usize,
    /// Innermost dimension of the synthetic tensors (outlier channels).
    #[arg(long, default_value_t = 256)]
    channels: usize,
    #[arg(long, value_enum, default_value = "bf16")]
    scale_type: ScaleType,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Also write error-vs-P charts, one SVG per distribution
    /// (FILE-<distribution>.svg).
    #[arg(long, value_name = "FILE")]
    plot: Option<PathBuf>,
}

/// `println!` that hands a failed write back as an error (`?`) instead of
/// panicking: `equarx analyze ... | head` closes the pipe early, and a
/// closed pipe ends the command quietly (see `main`).
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*)?;
    }};
}

/// `print!` the same way.
macro_rules! say_raw {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        write!(std::io::stdout().lock(), $($arg)*)?;
    }};
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return refuse_arguments(e),
    };
    let result = match cli.command {
        Command::Rewrite(a) => rewrite(a),
        Command::Print(a) => print(a),
        Command::Analyze(a) => analyze(a),
        Command::Simulate(a) => simulate(a),
        Command::Model(a) => model(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // The reader went away (`| head`): nothing left to say to it.
        Err(e) if broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            let chain: Vec<String> = e.chain().map(ToString::to_string).collect();
            eprintln!("equarx: error: {}", chain.join(": "));
            ExitCode::FAILURE
        }
    }
}

/// Whether `e` is a write to a pipe whose reader has gone.
fn broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// Exits on a command line clap refuses. A flag that is no option of a
/// command with pass options gets the message every door gives for an
/// unknown option (`equarx::options::unknown_option`), plus clap's guess.
/// `--format int4`: the code format given where the output container
/// goes. Says which flag takes it instead of only listing containers.
fn container_for_code_format(e: &clap::Error) -> Option<String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let (Some(ContextValue::String(arg)), Some(ContextValue::String(value))) = (
        e.get(ContextKind::InvalidArg),
        e.get(ContextKind::InvalidValue),
    ) else {
        return None;
    };
    let quant = <equarx::plan::QuantFormat as clap::ValueEnum>::from_str(value, true).ok()?;
    let name = |v: Option<clap::builder::PossibleValue>| v.map(|v| v.get_name().to_string());
    (e.kind() == ErrorKind::InvalidValue && arg.starts_with("--format")).then(|| {
        let containers: Vec<String> = <Format as clap::ValueEnum>::value_variants()
            .iter()
            .filter_map(|f| name(clap::ValueEnum::to_possible_value(f)))
            .collect();
        format!(
            "--format picks the output container ({}); '{value}' is a code format: use \
             --quant-format {}",
            containers.join(", "),
            name(clap::ValueEnum::to_possible_value(&quant)).unwrap_or_else(|| value.clone())
        )
    })
}

fn refuse_arguments(e: clap::Error) -> ExitCode {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let with_pass_options = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .is_some_and(|c| ["rewrite", "analyze", "model"].contains(&c.as_str()));
    if let Some(message) = container_for_code_format(&e) {
        eprintln!("equarx: error: {message}");
        return ExitCode::from(2);
    }
    let flag = match e.get(ContextKind::InvalidArg) {
        Some(ContextValue::String(s)) if e.kind() == ErrorKind::UnknownArgument => s.clone(),
        _ => e.exit(),
    };
    let Some(name) = flag.strip_prefix("--").filter(|_| with_pass_options) else {
        e.exit()
    };
    let name = name.split('=').next().unwrap_or(name);
    let mut message = equarx::options::unknown_option(name);
    if let Some(ContextValue::String(s)) = e.get(ContextKind::SuggestedArg) {
        message.push_str(&format!("; did you mean {s}?"));
    }
    eprintln!("equarx: error: {message}");
    ExitCode::from(2)
}

fn load(input: &InputArgs) -> Result<Loaded> {
    let name = input.input.display().to_string();
    let bytes = io::read_path(&input.input).with_context(|| format!("cannot read {name}"))?;
    io::decode(&bytes, input.input_format).with_context(|| name)
}

fn pass_options(a: &PassArgs) -> Result<RewriteOptions> {
    equarx::options::from_pairs(a.given.iter().map(|(n, v)| (*n, v.as_str())))
        .map_err(anyhow::Error::msg)
}

fn rewrite(a: RewriteArgs) -> Result<()> {
    let options = pass_options(&a.pass)?;
    if a.input.input.is_dir() {
        return rewrite_dir(&a, &options);
    }
    let result = rewrite_file(
        &a,
        &a.input.input,
        &a.output,
        &options,
        a.dump_dir.as_deref(),
    )?;
    let to_stdout = a.output == Path::new("-");
    if a.report {
        let table = report_table(&result.report);
        if to_stdout {
            eprint!("{table}")
        } else {
            say_raw!("{table}")
        }
    }
    if let Some(path) = &a.report_json {
        let json = serde_json::to_string_pretty(&result.report)? + "\n";
        io::write_atomic(path, json.as_bytes())
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

/// Rewrites one module file into `output`.
fn rewrite_file(
    a: &RewriteArgs,
    input: &Path,
    output: &Path,
    options: &RewriteOptions,
    dump_dir: Option<&Path>,
) -> Result<equarx::Rewritten> {
    let loaded = load(&InputArgs {
        input: input.to_path_buf(),
        input_format: a.input.input_format,
    })?;
    let name = input.display().to_string();
    let mut pipeline = Pipeline::new();
    if let Some(dir) = dump_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let dir = dir.to_path_buf();
        let counts = loaded.counts;
        let mut n = 0usize;
        pipeline.dump_with(Box::new(move |pass, stage, module| {
            let stage = match stage {
                DumpStage::Before => "before",
                DumpStage::After => "after",
            };
            let text = equarx::text::print_module(&module.to_proto(), &counts)
                .map_err(|e| e.to_string())?;
            let path = dir.join(format!("{n:02}.{pass}.{stage}.txt"));
            n += 1;
            io::write_atomic(&path, text.as_bytes()).map_err(|e| format!("{}: {e}", path.display()))
        }));
    }
    let counts = loaded.counts;
    let result = equarx::rewrite_with(loaded.module.clone(), counts, options, &mut pipeline)
        .with_context(|| name)?;
    let (ext_format, gzip) = io::format_from_extension(output);
    let format = a.format.or(ext_format);
    let out_counts = DeviceCounts {
        replica_count: options.counts.replica_count.or(counts.replica_count),
        num_partitions: options.counts.num_partitions.or(counts.num_partitions),
    };
    let bytes = encode(&loaded, &result.module, format, gzip, out_counts)?;
    io::write_atomic(output, &bytes)
        .with_context(|| format!("cannot write {}", output.display()))?;
    Ok(result)
}

/// `equarx rewrite DUMP_DIR -o OUT_DIR`: every module of a dump directory,
/// one line each. Files that are not HLO modules (buffer assignments,
/// LLVM IR, object files, ...) are listed as skipped; a module that fails
/// to read or rewrite is an error, reported at the end.
fn rewrite_dir(a: &RewriteArgs, options: &RewriteOptions) -> Result<()> {
    let (input, output) = (&a.input.input, &a.output);
    if output == Path::new("-") {
        bail!("a directory rewrites into a directory: give -o OUT_DIR");
    }
    if output.exists() && !output.is_dir() {
        bail!(
            "{} is a file; a directory rewrites into a directory",
            output.display()
        );
    }
    if output.canonicalize().ok() == input.canonicalize().ok() {
        bail!("-o must not be the input directory (its modules would be overwritten)");
    }
    std::fs::create_dir_all(output)
        .with_context(|| format!("cannot create {}", output.display()))?;
    let mut files: Vec<PathBuf> = std::fs::read_dir(input)
        .with_context(|| format!("cannot read {}", input.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    let (mut rewritten, mut skipped, mut failed) = (0usize, 0usize, Vec::new());
    let mut reports = serde_json::Map::new();
    for file in &files {
        let name = file
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default();
        let bytes =
            io::read_path(file).with_context(|| format!("cannot read {}", file.display()))?;
        if let Err(e) = io::decode(&bytes, a.input.input_format) {
            let module_like = name.ends_with(".pb")
                || name.ends_with(".pb.gz")
                || bytes.starts_with(b"HloModule");
            if module_like {
                say!("{name}: error: {e}");
                failed.push(name);
            } else {
                say!("{name}: skipped (not an HLO module)");
                skipped += 1;
            }
            continue;
        }
        match rewrite_file(a, file, &output.join(&name), options, None) {
            Ok(r) => {
                let done = r.report.iter().filter(|o| o.rewritten).count();
                say!("{name}: {done} of {} collectives rewritten", r.report.len());
                if a.report {
                    say_raw!("{}", report_table(&r.report));
                }
                reports.insert(name, serde_json::to_value(&r.report)?);
                rewritten += 1;
            }
            Err(e) => {
                let chain: Vec<String> = e.chain().map(ToString::to_string).collect();
                say!("{name}: error: {}", chain.join(": "));
                failed.push(name);
            }
        }
    }
    say!(
        "{rewritten} modules written to {}, {skipped} files skipped, {} failed",
        output.display(),
        failed.len()
    );
    if let Some(path) = &a.report_json {
        let json = serde_json::to_string_pretty(&reports)? + "\n";
        io::write_atomic(path, json.as_bytes())
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if !failed.is_empty() {
        bail!(
            "{} of {} modules failed: {}",
            failed.len(),
            rewritten + failed.len(),
            failed.join(", ")
        );
    }
    Ok(())
}

fn encode(
    loaded: &Loaded,
    module: &equarx::proto::HloModuleProto,
    format: Option<Format>,
    gzip: bool,
    counts: DeviceCounts,
) -> Result<Vec<u8>> {
    if format == Some(Format::Text) {
        let text = equarx::text::print_module(module, &counts)?;
        return Ok(if gzip {
            loaded.encode(module, Some(Format::Text), true)?
        } else {
            text.into_bytes()
        });
    }
    Ok(loaded.encode(module, format, gzip || (format.is_none() && loaded.gzip))?)
}

fn report_table(report: &[OpReport]) -> String {
    let mut out = format!(
        "{:<28} {:<15} {:<22} {:>4} {:<14} {:<22} {:<9} {:>12} {:>12} {:>6} {:>8} {:>8}  reason\n",
        "collective",
        "op",
        "shape",
        "P",
        "mode",
        "plan",
        "decision",
        "wire before",
        "wire after",
        "ratio",
        "rel.err",
        "model"
    );
    for r in report {
        let opt = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
        out.push_str(&format!(
            "{:<28} {:<15} {:<22} {:>4} {:<14} {:<22} {:<9} {:>12} {:>12} {:>6} {:>8} {:>8}  {}\n",
            r.name,
            r.opcode,
            r.shape,
            r.group_size.map_or("-".into(), |p| p.to_string()),
            r.mode,
            r.plan.as_ref().map_or("-".into(), plan_cell),
            if r.rewritten { "rewritten" } else { "skipped" },
            opt(r.wire_bytes_before),
            opt(r.wire_bytes_after),
            r.wire_ratio().map_or("-".into(), |x| format!("{x:.3}")),
            r.predicted_rel_rms
                .map_or("-".into(), |e| format!("{:.2}%", e * 100.0)),
            r.predicted_time
                .as_ref()
                .map_or("-".into(), |t| format!("{:.2}x", t.speedup)),
            r.reason.as_deref().unwrap_or(""),
        ));
    }
    let rewritten = report.iter().filter(|r| r.rewritten).count();
    out.push_str(&format!(
        "{rewritten} of {} collectives rewritten (model: the time model's speedup on --topology, a \
         model, not a measurement)\n",
        report.len()
    ));
    out
}

/// `ring+hadamard/loop`: a plan's algorithm, rotation and form (when it
/// repeats steps).
fn plan_cell(p: &equarx::passes::quantized_all_reduce::PlanSummary) -> String {
    let rotation = match p.rotation {
        Rotation::Hadamard => "+hadamard",
        Rotation::None => "",
    };
    let form = match p.form {
        Some(equarx::plan::Form::Loop) => "/loop",
        Some(equarx::plan::Form::Unrolled) => "/unrolled",
        None => "",
    };
    format!("{}{rotation}{form}", p.algorithm)
}

fn print(a: PrintArgs) -> Result<()> {
    let loaded = load(&a.input)?;
    // Text of a malformed module would not read back; say what is wrong.
    let module = equarx::ir::Module::from_proto(loaded.module.clone());
    equarx::verify::verify(&module).with_context(|| a.input.input.display().to_string())?;
    let text = print_module_with(
        &loaded.module,
        &loaded.counts,
        PrintOptions {
            canonical_names: a.canonical,
        },
    )
    .with_context(|| a.input.input.display().to_string())?;
    match &a.output {
        Some(path) => io::write_atomic(path, text.as_bytes())
            .with_context(|| format!("cannot write {}", path.display())),
        None => {
            say_raw!("{text}");
            Ok(())
        }
    }
}

fn analyze(a: AnalyzeArgs) -> Result<()> {
    if a.pass.given("topology") {
        return analyze_predicted(&a);
    }
    let loaded = load(&a.input)?;
    let module = equarx::ir::Module::from_proto(loaded.module);
    equarx::verify::verify(&module).with_context(|| a.input.input.display().to_string())?;
    let list = equarx::analyze::collectives(&module);
    if a.json {
        say!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(());
    }
    say!(
        "{:<28} {:<20} {:<26} {:>5} {:>6} {:<16} {:<10} {:>10}",
        "name",
        "opcode",
        "shape",
        "group",
        "groups",
        "mode",
        "encoding",
        "bytes"
    );
    for c in &list {
        say!(
            "{:<28} {:<20} {:<26} {:>5} {:>6} {:<16} {:<10} {:>10}",
            c.name,
            c.opcode,
            c.shape,
            c.group_size.map_or("-".into(), |g| g.to_string()),
            c.groups.map_or("-".into(), |g| g.to_string()),
            c.mode,
            c.encoding.as_deref().unwrap_or("-"),
            c.payload_bytes
        );
    }
    say!("{} collectives", list.len());
    Ok(())
}

fn simulate(a: SimulateArgs) -> Result<()> {
    if a.elements == 0 || a.group_sizes.iter().any(|&p| p < 2) {
        bail!("--elements must be positive and every group size at least 2");
    }
    let rows = simulate::sweep(&simulate::Sweep {
        distributions: a.distributions,
        group_sizes: a.group_sizes,
        block_sizes: a.block_sizes,
        algorithms: a.algorithms,
        rotations: a.rotations,
        formats: a.formats,
        depths: a.pipeline_depths,
        bidirectional: a.bidirectional,
        elements: a.elements,
        channels: a.channels,
        scale_type: a.scale_type,
        seed: a.seed,
    })
    .map_err(anyhow::Error::msg)?;
    if let Some(path) = &a.plot {
        plot_errors(&rows, path)?;
    }
    if a.json {
        say!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    say!(
        "relative RMS error (max error / RMS) against the exact sum, {} bf16 elements per device\n",
        a.elements
    );
    say!(
        "{:<16} {:>3} {:>4} {:<16} {:<8} {:<8} {:>2} {:>5} {:>18} {:>9} {:>18} {:>18} {:>6}",
        "distribution",
        "P",
        "B",
        "algorithm",
        "rotation",
        "format",
        "D",
        "bidi",
        "equarx",
        "model",
        "bf16 ring",
        "per-tensor int8",
        "wire"
    );
    let cell = |e: simulate::ErrorStats| format!("{:.3}% ({:.3})", e.rel_rms * 100.0, e.max_rel);
    for r in &rows {
        say!(
            "{:<16} {:>3} {:>4} {:<16} {:<8} {:<8} {:>2} {:>5} {:>18} {:>8.3}% {:>18} {:>18} {:>5.2}x",
            format!("{:?}", r.distribution),
            r.group_size,
            r.block_size,
            r.algorithm,
            format!("{:?}", r.rotation).to_lowercase(),
            clap::ValueEnum::to_possible_value(&r.format)
                .map_or_else(String::new, |v| v.get_name().to_string()),
            r.pipeline_depth,
            r.bidirectional,
            cell(r.equarx),
            r.predicted_rel_rms * 100.0,
            cell(r.bf16_ring),
            cell(r.per_tensor_int8),
            r.wire_ratio
        );
    }
    Ok(())
}

/// `analyze --topology`: what the pass would do to each all-reduce, with
/// the cost model's times and the predicted error.
fn analyze_predicted(a: &AnalyzeArgs) -> Result<()> {
    let options = pass_options(&a.pass)?;
    let loaded = load(&a.input)?;
    let name = a.input.input.display().to_string();
    let r = equarx::rewrite(loaded.module, loaded.counts, &options).with_context(|| name)?;
    if a.json {
        say!("{}", serde_json::to_string_pretty(&r.report)?);
        return Ok(());
    }
    say!(
        "model (not a measurement): {} ({})",
        options.pass.topology.name,
        options.pass.topology.source
    );
    say!(
        "{:<28} {:<15} {:<22} {:>3} {:>10} {:<22} {:>10} {:>10} {:>8} {:>8}  decision",
        "collective",
        "op",
        "shape",
        "P",
        "bytes",
        "plan",
        "bf16 us",
        "equarx us",
        "speedup",
        "rel.err"
    );
    for op in &r.report {
        let t = op.predicted_time.as_ref();
        let us = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.1}"));
        say!(
            "{:<28} {:<15} {:<22} {:>3} {:>10} {:<22} {:>10} {:>10} {:>8} {:>8}  {}",
            op.name,
            op.opcode,
            op.shape,
            op.group_size.map_or("-".into(), |p| p.to_string()),
            op.payload_bytes,
            op.plan.as_ref().map_or("-".into(), plan_cell),
            us(t.map(|t| t.bf16_us)),
            us(t.map(|t| t.equarx_us)),
            t.map_or("-".into(), |t| format!("{:.2}x", t.speedup)),
            op.predicted_rel_rms
                .map_or("-".into(), |e| format!("{:.2}%", e * 100.0)),
            if op.rewritten {
                "rewrite".to_string()
            } else {
                format!("skip: {}", op.reason.as_deref().unwrap_or(""))
            }
        );
    }
    Ok(())
}

fn model(a: ModelArgs) -> Result<()> {
    let o = pass_options(&a.pass)?.pass;
    let t = o.topology.clone();
    if let Some(path) = &a.plot {
        plot_speedups(&a, &o, path)?;
    }
    if a.group_size < 2 {
        bail!("--group-size must be at least 2");
    }
    say!(
        "model (not a measurement): {}, P = {}, {}",
        t.name,
        a.group_size,
        t.source
    );
    say!(
        "ring bandwidth per device: bf16 {:.0} GB/s, equarx {:.0} GB/s{}; step latency {} us",
        t.ring_gbps(true),
        t.ring_gbps(o.bidirectional),
        if t.wraparound {
            ""
        } else {
            " (no wraparound: halved)"
        },
        t.step_latency_us
    );
    say!(
        "{:>10} {:>12} {:>12} {:>12} {:>8} {:>8}  plan",
        "bf16 size",
        "bf16 us",
        "equarx us",
        "compute us",
        "speedup",
        "rel.err"
    );
    for &bytes in &a.sizes {
        let (plan, p) =
            equarx::passes::quantized_all_reduce::model_bf16(a.group_size, bytes, &o, &t)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
        say!(
            "{:>10} {:>12.1} {:>12.1} {:>12.1} {:>7.2}x {:>7.2}%  {}{}",
            human_bytes(bytes),
            p.bf16_us,
            p.equarx_us,
            p.compute_us,
            p.speedup(),
            100.0 * equarx::numerics::error::predicted_rel_rms(&plan, 7),
            plan.config.algorithm,
            match plan.config.rotation {
                Rotation::Hadamard => " + hadamard",
                Rotation::None => "",
            }
        );
    }
    Ok(())
}

/// One SVG per distribution: `errors.svg` → `errors-gaussian.svg`, ...
fn plot_errors(rows: &[simulate::SweepRow], path: &Path) -> Result<()> {
    let stem = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("errors");
    for (dname, svg) in equarx::charts::error_charts(rows).map_err(anyhow::Error::msg)? {
        write_svg(&path.with_file_name(format!("{stem}-{dname}.svg")), &svg)?;
    }
    Ok(())
}

fn plot_speedups(a: &ModelArgs, options: &Options, path: &Path) -> Result<()> {
    let svg = equarx::charts::speedup_chart(&a.sizes, a.group_size, options)
        .map_err(anyhow::Error::msg)?;
    write_svg(path, &svg)
}

/// Writes a chart into `path` (atomically).
fn write_svg(path: &Path, svg: &str) -> Result<()> {
    io::write_atomic(path, svg.as_bytes())
        .with_context(|| format!("cannot write {}", path.display()))?;
    eprintln!("wrote {}", path.display());
    Ok(())
}

fn human_bytes(b: u64) -> String {
    match b {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{}GiB", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{}MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{}KiB", b >> 10),
        b => format!("{b}B"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_defaults_are_the_library_defaults() {
        let cli = Cli::try_parse_from(["equarx", "rewrite", "in.pb", "-o", "out.pb"]).unwrap();
        let Command::Rewrite(a) = cli.command else {
            panic!("not rewrite")
        };
        assert_eq!(pass_options(&a.pass).unwrap().pass, Options::default());
    }
}
