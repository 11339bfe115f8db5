//! The Python report printer (`equarx.format_report`, which
//! `equarx.jax.print_report` uses) gives the CLI's `--report` table: for
//! the same report JSON, the same header and rows, byte for byte, over
//! rewritten ops of every plan form and skipped ops with their reasons.

mod common;

use std::process::Command;

#[test]
fn the_python_report_table_is_the_clis() {
    let dir = common::scratch("report_table");
    let cases: &[(&str, &[&str])] = &[
        (
            "tp_block_spmd.pb",
            &["--types", "bf16,f32", "--min-payload", "0"],
        ),
        (
            "tp_block_spmd.pb",
            &["--min-payload", "0", "--algorithm", "ring"],
        ),
        (
            "psum_bf16_p8.pb",
            &[
                "--min-payload",
                "0",
                "--algorithm",
                "ring",
                "--unroll",
                "true",
            ],
        ),
        (
            "psum_bf16_2x4.pb",
            &["--min-payload", "0", "--rotation", "none"],
        ),
        ("psum_tuple_p8.pb", &[]),
        ("tp_block_spmd.pb", &[]),
        ("tp_block_after_opt.pb", &["--types", "bf16,f32"]),
    ];
    let mut cli_tables = Vec::new();
    let mut reports = Vec::new();
    for (k, (fixture, args)) in cases.iter().enumerate() {
        let json = dir.join(format!("report{k}.json"));
        let out = common::equarx()
            .arg("rewrite")
            .arg(common::fixtures_dir().join(fixture))
            .args(["-o", dir.join(format!("out{k}.pb")).to_str().unwrap()])
            .arg("--report")
            .arg("--report-json")
            .arg(&json)
            .args(*args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{fixture} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        cli_tables.push(String::from_utf8(out.stdout).unwrap());
        reports.push(json);
    }
    let tables_json = dir.join("tables.json");
    let out = Command::new(common::python())
        .arg(common::repo().join("tests/report_table.py"))
        .arg(&tables_json)
        .args(&reports)
        .env("PYTHONPATH", common::repo().join("python"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "tests/report_table.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tables: Vec<String> =
        serde_json::from_slice(&std::fs::read(&tables_json).unwrap()).unwrap();
    let mut seen = std::collections::BTreeSet::new();
    for ((cli, python), (fixture, args)) in cli_tables.iter().zip(&tables).zip(cases) {
        let (cli_rows, cli_footer) = cli.trim_end().rsplit_once('\n').unwrap();
        let (py_rows, py_footer) = python.trim_end().rsplit_once('\n').unwrap();
        assert_eq!(py_rows, cli_rows, "{fixture} {args:?}");
        // The closing line names options as the door that printed it does.
        let counts = |footer: &str| footer.split(" (").next().unwrap().to_string();
        assert_eq!(counts(py_footer), counts(cli_footer), "{fixture} {args:?}");
        for line in cli_rows.lines().skip(1) {
            for word in ["rewritten", "skipped", "/loop", "/unrolled", "+hadamard"] {
                if line.contains(word) {
                    seen.insert(word);
                }
            }
        }
    }
    assert_eq!(
        seen.len(),
        5,
        "the cases cover rewritten and skipped ops, both forms and rotation: {seen:?}"
    );
}
