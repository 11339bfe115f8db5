//! `equarx print`: a module as HLO text that XLA's parser reads back.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

use equarx::io;
use equarx::text::{PrintOptions, print_module_with};

use crate::args::InputArgs;
use crate::say_raw;

#[derive(Args)]
pub struct PrintArgs {
    #[command(flatten)]
    input: InputArgs,
    /// Write here instead of stdout.
    #[arg(short, long)]
    output: Option<PathBuf>,
    /// Rename instructions `base.N` in print order (stable snapshots).
    #[arg(long)]
    canonical: bool,
}

pub fn run(a: PrintArgs) -> Result<()> {
    let loaded = a.input.load()?;
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
