//! The `equarx` command line: a thin shell over the library. Each command
//! is a module of its own ([`rewrite`], [`print`], [`analyze`],
//! [`simulate`], [`model`], [`calibrate`]); [`args`] holds what they share and [`tables`]
//! how they print.

mod analyze;
mod args;
mod calibrate;
mod charts;
mod internal;
mod model;
mod npz;
mod plot;
mod print;
mod rewrite;
mod simulate;
mod tables;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use equarx::choice::Choice;
use equarx::io::Format;

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
pub(crate) use {say, say_raw};

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

  # Calibrate on saved inputs, then choose with the op's own statistics:
  equarx calibrate module.pb --inputs inputs.npz -o module.profile.json
  equarx rewrite module.pb -o module.eqx.pb --profile module.profile.json --report

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
///
/// Exit status: 0 done; 1 an error in the input, the options or the
/// environment (the message says which; no output file is left half
/// written); 2 a command line it refuses; 70 an internal error, a bug in
/// equarx (please report it with the command line and the input).
#[derive(Parser)]
// The version is the library's (core/Cargo.toml), the one the wheel, the C
// ABI and the Python door report.
#[command(name = "equarx", version = equarx::ffi::VERSION.trim_end_matches('\0'), after_help = EXAMPLES)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Rewrite eligible collectives into their quantized form (the plan each
    /// op gets: `--report`).
    #[command(after_help = EXAMPLES)]
    Rewrite(rewrite::RewriteArgs),
    /// Print a module as HLO text (constants in full, so XLA parses it back).
    Print(print::PrintArgs),
    /// List every collective: shape, type, group size, group mode, bytes.
    Analyze(analyze::AnalyzeArgs),
    /// Measure the quantized all-reduce's error against the exact sum on
    /// synthetic data, for every algorithm, rotation, block size and format
    /// asked for, bit-exact with the emitted HLO, next to the error model, a
    /// bf16 ring all-reduce and naive per-tensor int8.
    Simulate(simulate::SimulateArgs),
    /// Predicted bf16 and equarx all-reduce times over message sizes on a
    /// named topology (a model from public figures, not a measurement);
    /// `--stage tiled` charges what the pass charges at XLA:TPU's hook.
    Model(model::ModelArgs),
    /// A calibration profile from collectives' saved inputs (.npz), for
    /// `--profile`: the choice and the predicted error then use each op's
    /// measured statistics instead of the prior.
    Calibrate(calibrate::CalibrateArgs),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return refuse_arguments(e),
    };
    internal::install_hook();
    let result = internal::contain(|| match cli.command {
        Command::Rewrite(a) => rewrite::run(a),
        Command::Print(a) => print::run(a),
        Command::Analyze(a) => analyze::run(a),
        Command::Simulate(a) => simulate::run(a),
        Command::Model(a) => model::run(a),
        Command::Calibrate(a) => calibrate::run(a),
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // The reader went away (`| head`): nothing left to say to it.
        Err(e) if broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            let chain: Vec<String> = e.chain().map(ToString::to_string).collect();
            eprintln!("equarx: error: {}", chain.join(": "));
            if e.is::<internal::InternalError>() {
                ExitCode::from(internal::EXIT_STATUS)
            } else {
                ExitCode::FAILURE
            }
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
    let quant = equarx::plan::QuantFormat::ALL
        .iter()
        .find(|q| q.name().eq_ignore_ascii_case(value))?;
    (e.kind() == ErrorKind::InvalidValue && arg.starts_with("--format")).then(|| {
        format!(
            "--format picks the output container ({}); '{value}' is a code format: use \
             --quant-format {quant}",
            Format::names().join(", "),
        )
    })
}

/// Exits on a command line clap refuses. A flag that is no option of a
/// command with pass options gets the message every door gives for an
/// unknown option (`equarx::options::unknown_option`), plus clap's guess.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_defaults_are_the_library_defaults() {
        let cli = Cli::try_parse_from(["equarx", "rewrite", "in.pb", "-o", "out.pb"]).unwrap();
        let Command::Rewrite(a) = cli.command else {
            panic!("not rewrite")
        };
        assert_eq!(a.pass.options().unwrap().pass, equarx::Options::default());
    }
}
