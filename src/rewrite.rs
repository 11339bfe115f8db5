//! `equarx rewrite`: a module (or a whole dump directory) through the pass
//! pipeline, written back in its container, with the report on request.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::Args;

use equarx::RewriteOptions;
use equarx::io::{self, Format};
use equarx::passes::{DumpStage, Pipeline};

use crate::args::{InputArgs, PassArgs, choice};
use crate::internal::InternalError;
use crate::{say, say_raw, tables};

#[derive(Args)]
pub struct RewriteArgs {
    #[command(flatten)]
    input: InputArgs,
    /// Where to write the rewritten module (`-` for stdout). Written through
    /// a temporary file and a rename: never half-written.
    #[arg(short, long)]
    output: PathBuf,
    /// Output container; default: the input's (`.txt`/`.hlo` names mean
    /// text, a `.gz` suffix compresses). The code format on the wire is
    /// `--quant-format`.
    #[arg(long, value_parser = choice::<Format>())]
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
    pub pass: PassArgs,
}

pub fn run(a: RewriteArgs) -> Result<()> {
    let options = a.pass.options()?;
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
        let table = tables::report(&result.report, result.stage, result.platform);
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
    let loaded = InputArgs {
        input: input.to_path_buf(),
        input_format: a.input.input_format,
    }
    .load()?;
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
    let result = crate::internal::contain(|| {
        crate::internal::test_trigger();
        Ok(equarx::rewrite_with(
            loaded.module.clone(),
            counts,
            options,
            &mut pipeline,
        )?)
    })
    .with_context(|| name)?;
    let (ext_format, gzip) = io::format_from_extension(output);
    let format = a.format.or(ext_format);
    let gzip = gzip || (format.is_none() && loaded.gzip);
    let bytes = loaded.encode(&result.module, format, gzip, &result.counts)?;
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
    // The modules that hit a bug in equarx rather than an error of theirs.
    let mut bugs: Vec<String> = Vec::new();
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
                    say_raw!("{}", tables::report(&r.report, r.stage, r.platform));
                }
                reports.insert(name, serde_json::to_value(&r.report)?);
                rewritten += 1;
            }
            Err(e) => {
                let chain: Vec<String> = e.chain().map(ToString::to_string).collect();
                say!("{name}: error: {}", chain.join(": "));
                if e.is::<InternalError>() {
                    bugs.push(name.clone());
                }
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
        let summary = format!(
            "{} of {} modules failed: {}",
            failed.len(),
            rewritten + failed.len(),
            failed.join(", ")
        );
        if !bugs.is_empty() {
            let bug = InternalError(format!("in {}", bugs.join(", ")));
            return Err(anyhow::Error::new(bug).context(summary));
        }
        bail!(summary);
    }
    Ok(())
}
