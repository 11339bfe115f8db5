//! The `equarx` command line as users meet it.

mod common;

use common::{doc_block, equarx, fixtures_dir, scratch};
use serde_json::Value;

fn run(args: &[&str]) -> (String, String) {
    let o = equarx().args(args).output().unwrap();
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout).to_string(),
        String::from_utf8_lossy(&o.stderr).to_string(),
    );
    assert!(o.status.success(), "equarx {args:?} failed: {err}");
    (out, err)
}

fn fixture(name: &str) -> String {
    fixtures_dir().join(name).display().to_string()
}

#[test]
fn analyze_lists_the_tp_block_all_reduces_as_flattened_ids_over_8() {
    let (out, _) = run(&["analyze", &fixture("tp_block_after_opt.pb")]);
    let rows: Vec<&str> = out.lines().filter(|l| l.contains(" all-reduce ")).collect();
    assert_eq!(rows.len(), 2, "{out}");
    for row in rows {
        let cols: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cols[3], "8", "group size: {row}");
        assert!(row.contains("flattened ids"), "{row}");
    }
    let (json, _) = run(&["analyze", "--json", &fixture("tp_block_after_opt.pb")]);
    let list: Vec<Value> = serde_json::from_str(&json).unwrap();
    assert!(
        list.iter()
            .all(|c| c["group_size"] == 8 && c["mode"] == "flattened ids")
    );
    assert!(
        list.iter().all(|c| c["payload_bytes"] == 2 * 16 * 256 * 4),
        "f32 payload after XLA:CPU promotion"
    );
}

#[test]
fn analyze_tells_group_encodings_apart() {
    let (json, _) = run(&["analyze", "--json", &fixture("tp_block_spmd.pb")]);
    let list: Vec<Value> = serde_json::from_str(&json).unwrap();
    assert!(list.iter().all(|c| c["encoding"] == "mesh-axes"), "{json}");
    let (json, _) = run(&["analyze", "--json", &fixture("psum_bf16_2x4_strided.pb")]);
    let list: Vec<Value> = serde_json::from_str(&json).unwrap();
    assert_eq!(list[0]["encoding"], "list");
    assert_eq!(list[0]["group_size"], 2);
    assert_eq!(list[0]["groups"], 4);
}

#[test]
fn rewrite_reports_every_all_reduce_in_a_table_and_as_json() {
    let dir = scratch("cli_report");
    let out = dir.join("tp.pb");
    let json = dir.join("report.json");
    let (table, _) = run(&[
        "rewrite",
        &fixture("tp_block_spmd.pb"),
        "-o",
        out.to_str().unwrap(),
        "--min-payload",
        "0",
        "--report",
        "--report-json",
        json.to_str().unwrap(),
    ]);
    assert!(table.contains("2 of 2 collectives rewritten"), "{table}");
    let report: Vec<Value> = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(report.len(), 2);
    for r in &report {
        assert_eq!(r["rewritten"], true);
        assert_eq!(r["group_size"], 8);
        assert_eq!(r["mode"], "flattened ids");
        assert_eq!(r["encoding"], "mesh-axes");
        let (before, after) = (
            r["wire_bytes_before"].as_u64().unwrap(),
            r["wire_bytes_after"].as_u64().unwrap(),
        );
        assert!(before as f64 / after as f64 > 1.9, "{r}");
        assert!(r["predicted_rel_rms"].as_f64().unwrap() > 0.0);
    }
    // Skips carry their reason.
    let (table, _) = run(&[
        "rewrite",
        &fixture("psum_f32_p8.pb"),
        "-o",
        out.to_str().unwrap(),
        "--report",
    ]);
    assert!(table.contains("f32 is not enabled"), "{table}");
}

#[test]
fn text_output_by_flag_or_extension() {
    let dir = scratch("cli_text");
    let by_ext = dir.join("m.txt");
    run(&[
        "rewrite",
        &fixture("psum_bf16_p8.pb"),
        "-o",
        by_ext.to_str().unwrap(),
        "--min-payload",
        "0",
    ]);
    let text = std::fs::read_to_string(&by_ext).unwrap();
    assert!(text.starts_with("HloModule "), "{text}");
    assert!(quantized(&text), "{text}");
    let (stdout, _) = run(&[
        "rewrite",
        &fixture("psum_bf16_p8.pb"),
        "-o",
        "-",
        "--format",
        "text",
        "--min-payload",
        "0",
    ]);
    assert_eq!(stdout, text);
    let gz = dir.join("m.pb.gz");
    run(&[
        "rewrite",
        &fixture("psum_bf16_p8.pb"),
        "-o",
        gz.to_str().unwrap(),
    ]);
    let bytes = std::fs::read(&gz).unwrap();
    assert_eq!(&bytes[..2], &[0x1f, 0x8b], "gzip");
    let (printed, _) = run(&["print", gz.to_str().unwrap()]);
    assert!(printed.contains("all-reduce("), "gzip input is read back");
}

#[test]
fn stdin_in_and_dumps_on_request() {
    let dir = scratch("cli_stdin");
    let input = std::fs::read(fixtures_dir().join("psum_bf16_p8.pb")).unwrap();
    let mut child = equarx()
        .args([
            "rewrite",
            "-",
            "-o",
            "-",
            "--min-payload",
            "0",
            "--dump-dir",
        ])
        .arg(dir.join("dumps"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(&input).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let decoded = equarx::io::decode(&out.stdout, None).unwrap();
    assert_eq!(decoded.format, equarx::io::Format::Module);
    let mut dumps: Vec<String> = std::fs::read_dir(dir.join("dumps"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    dumps.sort();
    assert_eq!(
        dumps,
        [
            "00.quantize-collectives.before.txt",
            "01.quantize-collectives.after.txt",
            "02.remove-dead-widenings.before.txt",
            "03.remove-dead-widenings.after.txt",
            "04.outline-fusions.before.txt",
            "05.outline-fusions.after.txt",
        ]
    );
}

#[test]
fn help_teaches_with_examples() {
    for args in [&["--help"][..], &["rewrite", "--help"]] {
        let (out, _) = run(args);
        assert!(out.contains("Examples:"), "{args:?}: {out}");
        assert!(out.contains("equarx rewrite"), "{out}");
    }
    let (out, _) = run(&["rewrite", "--help"]);
    for flag in [
        "--block-size",
        "--pipeline-depth",
        "--bidirectional",
        "--min-payload",
        "--types",
        "--report",
    ] {
        assert!(out.contains(flag), "rewrite --help lacks {flag}");
    }
}

#[test]
fn a_dump_directory_is_rewritten_module_by_module() {
    let dir = scratch("cli_dump_dir");
    let dump = dir.join("dump");
    std::fs::create_dir_all(&dump).unwrap();
    for f in std::fs::read_dir(fixtures_dir().join("dumps")).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, dump.join(f.file_name().unwrap())).unwrap();
    }
    std::fs::write(
        dump.join("module_0012.jit_tp_block.ir-no-opt.ll"),
        "; ModuleID = 'x'\n",
    )
    .unwrap();
    let out = dir.join("out");
    let (stdout, _) = run(&[
        "rewrite",
        dump.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--min-payload",
        "0",
    ]);
    assert!(
        stdout.contains("ir-no-opt.ll: skipped (not an HLO module)"),
        "{stdout}"
    );
    let spmd: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains("after_spmd-partitioning"))
        .collect();
    assert_eq!(spmd.len(), 2, "{stdout}");
    // The text dump's header says num_partitions=8 and, by omission, one
    // replica: both forms of the module are rewritten.
    assert!(
        spmd.iter()
            .all(|l| l.ends_with("2 of 2 collectives rewritten")),
        "{stdout}"
    );
    assert!(stdout.contains("6 modules written"), "{stdout}");
    let written = std::fs::read_to_string(
        out.join("module_0012.jit_tp_block.0007.spmd-partitioner.after_spmd-partitioning.before_control-dep-rewriter.txt"),
    )
    .unwrap();
    assert!(written.starts_with("HloModule") && quantized(&written));

    // A module that does not read is an error, named, after the others.
    std::fs::write(dump.join("broken.hlo.pb"), b"\x0a\xff\xff").unwrap();
    let o = equarx()
        .args([
            "rewrite",
            dump.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1));
    assert!(stdout.contains("broken.hlo.pb: error:"), "{stdout}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("broken.hlo.pb"));
    // Writing into the input directory is refused.
    let o = equarx()
        .args([
            "rewrite",
            dump.to_str().unwrap(),
            "-o",
            dump.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(!o.status.success());
}

/// `--plot` writes SVG charts: one per input distribution for `simulate`,
/// one line per named topology for `model`.
#[test]
fn plots_are_written_as_svg_charts() {
    let dir = scratch("cli_plots");
    let errors = dir.join("errors.svg");
    let (_, err) = run(&[
        "simulate",
        "--group-sizes",
        "2,4",
        "--elements",
        "2048",
        "--plot",
        errors.to_str().unwrap(),
    ]);
    let written: Vec<&str> = err
        .lines()
        .filter_map(|l| l.strip_prefix("wrote "))
        .collect();
    assert!(!written.is_empty(), "no chart written: {err}");
    for path in written {
        assert!(path.contains("errors-") && path.ends_with(".svg"), "{path}");
        let svg = std::fs::read_to_string(path).unwrap();
        assert!(svg.starts_with("<svg"), "{path}");
        for label in [
            "all-reduce error vs the exact sum",
            "bf16 ring",
            "per-tensor int8",
        ] {
            assert!(svg.contains(label), "{path}: no '{label}'");
        }
    }
    let speedup = dir.join("speedup.svg");
    run(&["model", "--plot", speedup.to_str().unwrap()]);
    let svg = std::fs::read_to_string(&speedup).unwrap();
    for label in ["predicted equarx speedup", "v5e", "h100"] {
        assert!(svg.contains(label), "speedup chart: no '{label}'");
    }
}

#[test]
fn model_at_xla_tpus_hook_charges_what_the_pass_charges_there() {
    // `--stage tiled` (XLA:TPU's hook): the hook's kernels and the codes in
    // their padded tile rows, the same prediction `rewrite --report` makes
    // of the op there.
    let speedup = |out: &str| -> f64 {
        let row = out
            .lines()
            .find(|l| l.trim_start().starts_with("16MiB"))
            .unwrap_or_else(|| panic!("no 16MiB row in:\n{out}"));
        row.split_whitespace()
            .find_map(|w| w.strip_suffix('x')?.parse().ok())
            .unwrap_or_else(|| panic!("no speedup in {row}"))
    };
    let args = ["model", "--topology", "v5e", "--sizes", "16MiB"];
    let (before, _) = run(&[&args[..], &["--stage", "pre-fusion"]].concat());
    let (hook, _) = run(&[&args[..], &["--stage", "tiled", "--platform", "tpu"]].concat());
    assert!(
        hook.contains("at its hook") && hook.contains("128-byte tile rows"),
        "{hook}"
    );
    assert!(!before.contains("tile rows"), "{before}");
    assert!(
        speedup(&hook) < speedup(&before),
        "the hook {} against {} before fusion",
        speedup(&hook),
        speedup(&before)
    );
    // The op the report would give at the hook: bf16[4096, 2048] over 8.
    let dir = common::scratch("model-tiled");
    let hlo = dir.join("ar.hlo");
    std::fs::write(
        &hlo,
        "HloModule m, replica_count=8\n\nadd {\n  a = bf16[] parameter(0)\n  b = bf16[] parameter(1)\n  \
         ROOT r = bf16[] add(a, b)\n}\n\nENTRY e {\n  p = bf16[4096,2048]{1,0:T(8,128)(2,1)} parameter(0)\n  \
         ROOT ar = bf16[4096,2048]{1,0:T(8,128)(2,1)} all-reduce(p), replica_groups={{0,1,2,3,4,5,6,7}}, to_apply=add\n}\n",
    )
    .unwrap();
    let out = dir.join("out.hlo");
    let (report, _) = run(&[
        "rewrite",
        hlo.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--stage",
        "tiled",
        "--platform",
        "tpu",
        "--topology",
        "v5e",
        "--report",
    ]);
    let said = format!("{:.2}x", speedup(&hook));
    assert!(
        report.contains(&format!("predicts no gain on v5e: {said}")),
        "the model said {said}; the report:\n{report}"
    );
}

/// Whether HLO text holds an s8 collective (whichever algorithm the pass
/// chose: ring permutes, a two-shot all-to-all, the gather).
fn quantized(text: &str) -> bool {
    text.lines().any(|l| {
        l.contains("= s8[")
            && ["collective-permute(", "all-to-all(", "all-gather("]
                .iter()
                .any(|op| l.contains(op))
    })
}

#[test]
fn a_reader_that_has_gone_ends_the_command_quietly() {
    use std::process::Stdio;
    // `equarx analyze ... | head -0`: the pipe is closed before the first
    // line, so every write fails with EPIPE.
    let mut child = equarx()
        .args(["analyze", &fixture("tp_block_spmd.pb")])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
    assert!(stderr.is_empty(), "{stderr}");
}

#[test]
fn a_code_format_given_to_format_points_to_quant_format() {
    let dir = scratch("cli_format_hint");
    let out = dir.join("out.pb");
    for (given, flag) in [
        ("int4", "--quant-format int4"),
        ("FP8-E4M3", "--quant-format fp8-e4m3"),
    ] {
        let o = equarx()
            .args(["rewrite", &fixture("psum_bf16_p8.pb"), "-o"])
            .arg(&out)
            .args(["--format", given])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{given}: {err}");
        assert!(
            err.contains(flag) && err.contains("output container (module, hlo-proto"),
            "{given}: {err}"
        );
        assert!(!out.exists(), "{given}: nothing is written");
    }
    // A value that is neither keeps clap's own message and its list.
    let o = equarx()
        .args(["rewrite", &fixture("psum_bf16_p8.pb"), "-o"])
        .arg(&out)
        .args(["--format", "int9"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("possible values: module") && !err.contains("--quant-format"),
        "{err}"
    );
}

/// `-o x.txt` and `-o x.txt.gz` hold the same text, the device counts the
/// options set included (the gzip path once printed the input's counts,
/// and printed the text twice): the input's own counts, and counts that
/// differ from the input's (1 x 8 there).
#[test]
fn text_and_gzipped_text_hold_the_same_module() {
    let dir = scratch("cli_txt_gz");
    for (replicas, partitions) in [("1", "8"), ("2", "4")] {
        let plain = dir.join(format!("out{replicas}x{partitions}.txt"));
        let gz = dir.join(format!("out{replicas}x{partitions}.txt.gz"));
        for out in [&plain, &gz] {
            run(&[
                "rewrite",
                &fixture("psum_bf16_p8.pb"),
                "-o",
                out.to_str().unwrap(),
                "--min-payload",
                "0",
                "--replica-count",
                replicas,
                "--num-partitions",
                partitions,
            ]);
        }
        let text = std::fs::read_to_string(&plain).unwrap();
        let mut inflated = String::new();
        use std::io::Read;
        flate2::read::GzDecoder::new(std::fs::File::open(&gz).unwrap())
            .read_to_string(&mut inflated)
            .unwrap();
        assert_eq!(text, inflated, "the .txt.gz text differs from the .txt");
        assert!(
            text.starts_with("HloModule") && text.matches("HloModule").count() == 1,
            "one module: {}",
            &text[..200.min(text.len())]
        );
        let header = text.lines().next().unwrap();
        assert!(
            header.contains(&format!("num_partitions={partitions}"))
                && (replicas == "1" || header.contains(&format!("replica_count={replicas}"))),
            "{replicas} x {partitions}: {header}"
        );
    }
}

/// A slice shape with a zero dimension, or more chips than any machine
/// (whose product once overflowed a u32), is refused, naming the option.
#[test]
fn topology_slices_of_zero_or_too_many_chips_are_refused() {
    for (spec, why) in [
        ("v5e:0x4", "has a dimension of 0"),
        ("v5e:4x0", "has a dimension of 0"),
        ("v5e:65536x65536", "has more than"),
        ("v5e:4294967295x4294967295", "has more than"),
    ] {
        let o = equarx()
            .args(["rewrite", &fixture("psum_bf16_p8.pb"), "-o", "/dev/null"])
            .args(["--topology", spec])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{spec} was accepted");
        assert!(
            err.contains("option topology:") && err.contains(why),
            "{spec}: {err}"
        );
    }
}

/// Writes an `.npz` of f32 arrays (name, shape, values).
fn write_npz(path: &std::path::Path, arrays: &[(&str, Vec<u64>, Vec<f32>)]) {
    use npyz::WriterBuilder;
    let file = std::fs::File::create(path).unwrap();
    let mut zip = zip::ZipWriter::new(file);
    for (name, shape, values) in arrays {
        zip.start_file(
            format!("{name}.npy"),
            zip::write::SimpleFileOptions::default(),
        )
        .unwrap();
        let mut w = npyz::WriteOptions::new()
            .default_dtype()
            .shape(shape)
            .writer(&mut zip)
            .begin_nd()
            .unwrap();
        w.extend(values.iter().copied()).unwrap();
        w.finish().unwrap();
    }
    zip.finish().unwrap();
}

const TWO_PSUMS: &str = r#"HloModule m, replica_count=1, num_partitions=4

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY main {
  x = f32[64,64] parameter(0)
  y = f32[64,64] all-reduce(x), channel_id=1, replica_groups={{0,1},{2,3}}, use_global_device_ids=true, to_apply=add, metadata={op_name="jit(f)/psum" source_file="model.py" source_line=7}
  ROOT z = f32[64,64] all-reduce(y), channel_id=2, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=add, metadata={op_name="jit(f)/psum" source_file="model.py" source_line=8}
}
"#;

#[test]
fn calibrate_turns_saved_inputs_into_a_profile_the_rewrite_uses() {
    let dir = scratch("cli_calibrate");
    let module = dir.join("m.hlo");
    std::fs::write(&module, TWO_PSUMS).unwrap();
    let m = module.display().to_string();
    let (list, _) = run(&["calibrate", &m, "--list"]);
    assert!(
        list.contains("model.py:7") && list.contains("4096"),
        "{list}"
    );

    // y's inputs: one outlier column 100x the rest (rotation spreads it);
    // z's: three runs of Gaussian inputs.
    let mut rng = common::Rng::new(9);
    let y: Vec<f32> = (0..4 * 4096)
        .map(|i| rng.gaussian() as f32 * if i % 64 == 5 { 100.0 } else { 1.0 })
        .collect();
    let z: Vec<f32> = (0..3 * 4 * 4096).map(|_| rng.gaussian() as f32).collect();
    let npz = dir.join("in.npz");
    write_npz(
        &npz,
        &[
            ("y", vec![4, 64, 64], y.clone()),
            ("z", vec![3, 4, 64, 64], z),
        ],
    );
    let profile = dir.join("p.json");
    let (out, _) = run(&[
        "calibrate",
        &m,
        "--inputs",
        &npz.display().to_string(),
        "-o",
        &profile.display().to_string(),
    ]);
    assert!(out.contains("2 collectives measured, 0 not"), "{out}");
    let p: Value = serde_json::from_str(&std::fs::read_to_string(&profile).unwrap()).unwrap();
    assert_eq!(p["ops"].as_array().map(Vec::len), Some(2), "{p}");

    // The rewrite with and without the profile: y's prediction follows its
    // outliers (unrotated, far above the prior; the choice rotates).
    let report = |extra: &[&str]| -> Vec<Value> {
        let json = dir.join("r.json");
        let mut args = vec![
            "rewrite",
            m.as_str(),
            "-o",
            "/dev/null",
            "--types",
            "f32",
            "--min-payload",
            "0",
        ];
        let j = json.display().to_string();
        args.extend(["--report-json", j.as_str()]);
        args.extend(extra);
        run(&args);
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap()
    };
    let plain = report(&[]);
    let p_path = profile.display().to_string();
    let steered = report(&["--profile", &p_path]);
    assert!(plain.iter().all(|r| r["basis"] == "prior"), "{plain:?}");
    assert!(
        steered.iter().all(|r| r["basis"] == "profile"),
        "{steered:?}"
    );
    let unrotated = report(&["--profile", &p_path, "--rotation", "none"]);
    let (with, without) = (
        unrotated[0]["predicted_rel_rms"].as_f64().unwrap(),
        plain[0]["predicted_rel_rms"].as_f64().unwrap(),
    );
    assert!(
        with > 2.0 * without,
        "the outliers show: {with} vs the prior's {without}"
    );

    // An array that names no collective, a wrong size and a non-npz are
    // refused with the reason, and no profile is written.
    let bad = |arrays: &[(&str, Vec<u64>, Vec<f32>)], want: &str| {
        write_npz(&npz, arrays);
        let out = dir.join("bad.json");
        let o = equarx()
            .args([
                "calibrate",
                &m,
                "--inputs",
                &npz.display().to_string(),
                "-o",
            ])
            .arg(&out)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(want), "{want}: {err}");
        assert!(!out.exists(), "nothing written on {want}");
    };
    bad(&[("w", vec![4, 4096], y.clone())], "name no collective");
    bad(
        &[("y", vec![4, 100], vec![0.0; 400])],
        "not a whole number of runs",
    );
    let o = equarx()
        .args(["calibrate", &m, "--inputs", &m, "-o", "/dev/null"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&o.stderr).contains("not an .npz"));
}

#[test]
fn simulate_on_saved_inputs_puts_each_plans_error_beside_both_predictions() {
    let dir = scratch("cli_simulate_inputs");
    // Four ranks' inputs with an outlier channel (what row-parallel matmul
    // partials look like), and an array that is not an all-reduce's.
    let mut rng = common::Rng::new(5);
    let x: Vec<f32> = (0..4 * 8192)
        .map(|i| {
            let v = rng.gaussian() as f32 * if i % 512 == 3 { 40.0 } else { 1.0 };
            half::bf16::from_f32(v).to_f32()
        })
        .collect();
    let npz = dir.join("in.npz");
    write_npz(
        &npz,
        &[("L00_x", vec![4, 16, 512], x), ("meta", vec![1], vec![0.0])],
    );
    let n = npz.display().to_string();
    let args = [
        "simulate",
        "--inputs",
        &n,
        "--arrays",
        "L*",
        "--formats",
        "int8,fp8-e4m3,int4",
        "--algorithms",
        "ring,two-shot",
        "--block-sizes",
        "32,64",
    ];
    let (out, _) = run(&args);
    // 2 algorithms x 2 rotations x 3 formats x 2 block sizes, all planned.
    assert!(
        out.contains("24 of 24 within ±25% from the profile"),
        "{out}"
    );
    // The prior is fitted to a real LLM's inputs, not these: it is counted,
    // not held to them (BENCHMARKS.md holds it to Gemma's).
    assert!(out.contains("; prior ≥ measured for "), "{out}");
    assert!(!out.contains("meta"), "--arrays leaves meta out: {out}");
    let mut json_args = args.to_vec();
    json_args.push("--json");
    let (json, _) = run(&json_args);
    let rows: Value = serde_json::from_str(&json).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 24);
    for r in rows {
        let c = &r["checked"];
        let (m, p) = (
            c["measured"].as_f64().unwrap(),
            c["profile"].as_f64().unwrap(),
        );
        assert!(m > 0.0 && (p / m - 1.0).abs() <= 0.25, "{r}");
    }

    // Every array must be an all-reduce's unless --arrays picks; a rank
    // count of one, or synthetic-data flags beside --inputs, are refused.
    let refused = |args: &[&str], want: &str| {
        let o = equarx().args(args).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(want), "{args:?}: {err}");
    };
    refused(&["simulate", "--inputs", &n], "meta");
    refused(
        &["simulate", "--inputs", &n, "--group-sizes", "4"],
        "--group-sizes",
    );
    refused(
        &["simulate", "--inputs", &n, "--arrays", "nothing"],
        "no array that --arrays names",
    );
    write_npz(&npz, &[("one", vec![1, 64], vec![1.0; 64])]);
    refused(
        &["simulate", "--inputs", &n],
        "an all-reduce needs at least 2",
    );
}

/// The README's CLI example, line by line as it stands, in a directory
/// where `module.pb` is the shipped tensor-parallel block.
#[test]
fn the_readme_cli_example_runs() {
    let block = doc_block("README.md", "tests/cli.rs::the_readme_cli_example_runs");
    let dir = scratch("readme_cli");
    std::fs::copy(
        fixtures_dir().join("tp_block_spmd.pb"),
        dir.join("module.pb"),
    )
    .unwrap();
    let mut ran = 0;
    for line in block.lines().filter(|l| !l.trim().is_empty()) {
        let words: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(words[0], "equarx", "{line}");
        let o = equarx()
            .args(&words[1..])
            .current_dir(&dir)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "`{line}` failed: {err}");
        ran += 1;
    }
    assert!(ran >= 4, "{block}");
    let report = std::fs::read_to_string(dir.join("module.equarx.txt")).unwrap();
    assert!(report.contains("collective-permute") || report.contains("all-to-all"));
}

#[test]
fn mosaic_kernels_where_they_fit_and_the_reason_where_not() {
    let dir = scratch("cli_mosaic");
    let input = dir.join("psum.hlo");
    std::fs::write(
        &input,
        "HloModule m, num_partitions=4\n\nadd {\n  a = bf16[] parameter(0)\n  \
         b = bf16[] parameter(1)\n  ROOT s = bf16[] add(a, b)\n}\n\nENTRY main {\n  \
         p = bf16[2,256,1024] parameter(0)\n  ROOT r = bf16[2,256,1024] all-reduce(p), \
         channel_id=1, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=add\n}\n",
    )
    .unwrap();
    let (out, json) = (dir.join("out.hlo"), dir.join("report.json"));
    let rewrite = |kernels: &str, extra: &[&str]| {
        let mut args = vec![
            "rewrite",
            input.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
            "--stage",
            "pre-fusion",
            "--kernels",
            kernels,
            "--report",
            "--report-json",
            json.to_str().unwrap(),
        ];
        args.extend(extra);
        let (table, _) = run(&args);
        let report: Vec<Value> = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
        let text = std::fs::read_to_string(&out).unwrap();
        (table, report[0].clone(), text)
    };
    // Two-shot for XLA:TPU: the three kernels, the plan says so.
    let forced = [
        "--platform",
        "tpu",
        "--algorithm",
        "two-shot",
        "--min-payload",
        "0",
    ];
    let (table, op, text) = rewrite("mosaic", &forced);
    assert_eq!(op["plan"]["config"]["kernels"], "mosaic", "{op}");
    assert!(table.contains("two-shot+hadamard/mosaic"), "{table}");
    assert_eq!(
        text.matches("custom_call_target=\"tpu_custom_call\"")
            .count(),
        3,
        "{text}"
    );
    assert!(
        text.contains("stable_mosaic") || text.contains("custom_call_config"),
        "{text}"
    );
    // The time model charges the kernels that will be emitted: 3 an op
    // make a rewrite of 2.5 MiB pay on v5e that the HLO form's 12 do not
    // (no --min-payload: the model decides).
    let resize = |from: &str, to: &str| {
        let text = std::fs::read_to_string(&input).unwrap();
        std::fs::write(&input, text.replace(from, to)).unwrap();
    };
    resize("bf16[2,256,1024]", "bf16[2048,640]");
    let (_, op, _) = rewrite("hlo", &["--platform", "tpu"]);
    assert_eq!(op["rewritten"], false, "{op}");
    assert!(
        op["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("no gain"),
        "{op}"
    );
    let (_, op, _) = rewrite("mosaic", &["--platform", "tpu"]);
    assert_eq!(op["plan"]["config"]["kernels"], "mosaic", "{op}");
    resize("bf16[2048,640]", "bf16[2,256,1024]");
    // A ring, or another compiler: HLO, and the report says why.
    for (extra, why) in [
        (
            [
                "--platform",
                "tpu",
                "--algorithm",
                "ring",
                "--min-payload",
                "0",
            ],
            "only a two-shot all-reduce",
        ),
        (
            [
                "--platform",
                "gpu",
                "--algorithm",
                "two-shot",
                "--min-payload",
                "0",
            ],
            "mosaic kernels are not gpu's (its own are triton)",
        ),
    ] {
        let (_, op, text) = rewrite("mosaic", &extra);
        assert!(op["plan"]["config"].get("kernels").is_none(), "{op}");
        let reason = op["reason"].as_str().unwrap_or_default();
        assert!(
            reason.contains("HLO kernels, not Mosaic") && reason.contains(why),
            "{op}"
        );
        assert!(!text.contains("tpu_custom_call"), "{extra:?}");
    }
    // A row wider than 4096 takes the kernels in groups of 512 columns;
    // one that does not split into them keeps HLO, and says why.
    resize("bf16[2,256,1024]", "bf16[512,8192]");
    let (_, op, text) = rewrite("mosaic", &forced);
    assert_eq!(op["plan"]["config"]["kernels"], "mosaic", "{op}");
    assert!(text.contains("tpu_custom_call"), "{text}");
    resize("bf16[512,8192]", "bf16[512,4224]");
    let (_, op, text) = rewrite("mosaic", &forced);
    assert!(op["plan"]["config"].get("kernels").is_none(), "{op}");
    assert!(
        op["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("4224, is neither a multiple of 128 up to 4096 nor of 512"),
        "{op}"
    );
    assert!(!text.contains("tpu_custom_call"), "{text}");
    // An all-gather has no algorithm: a forced ring, which keeps the
    // all-reduces from the kernels, leaves it its kernels.
    std::fs::write(
        &input,
        "HloModule m, num_partitions=4\n\nENTRY main {\n  \
         p = bf16[256,1024] parameter(0)\n  ROOT g = bf16[1024,1024] all-gather(p), \
         channel_id=1, replica_groups={{0,1,2,3}}, dimensions={0}, \
         use_global_device_ids=true\n}\n",
    )
    .unwrap();
    for algorithm in ["two-shot", "ring"] {
        let extra = [
            "--platform",
            "tpu",
            "--algorithm",
            algorithm,
            "--min-payload",
            "0",
        ];
        let (_, op, text) = rewrite("mosaic", &extra);
        assert_eq!(
            op["plan"]["config"]["kernels"], "mosaic",
            "{algorithm}: {op}"
        );
        assert!(text.contains("tpu_custom_call"), "{algorithm}: {text}");
    }
}
