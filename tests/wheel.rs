//! The wheel, as a user gets it: `scripts/wheel` builds and tags it, it
//! installs offline into a fresh venv that cannot see this checkout (made in
//! a temporary directory, no PYTHONPATH, no EQUARX_LIB, no CARGO_TARGET_DIR),
//! and from there a tensor-parallel block runs through
//! `equarx.jax.enable()` on 8 CPU devices (`tests/wheel.py`), the README's
//! snippet runs, and `equarx --version` answers.
//!
//! Everything pip needs comes from a wheelhouse under target/ (jax and the
//! rest of python/requirements.txt, the build requirements of
//! pyproject.toml, the tools of python/wheel-tools.txt), filled once with
//! `pip download`; after that the test is offline. The wheel is built in
//! this test build's cargo profile and target directory, so it reuses what
//! the suite compiled (`scripts/wheel` alone builds the release wheel).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

use serde_json::Value;

/// `target/` of this build, and the cargo profile it was built with.
fn target_and_profile() -> (PathBuf, String) {
    let exe = std::env::current_exe().expect("current_exe");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps");
    let name = profile_dir.file_name().unwrap().to_string_lossy();
    let profile = if name == "debug" {
        "dev".into()
    } else {
        name.into_owned()
    };
    (profile_dir.parent().unwrap().to_path_buf(), profile)
}

fn run(cmd: &mut Command, what: &str, hint: &str) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run {cmd:?}: {e}\n{hint}"));
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = stderr.lines().collect();
        panic!(
            "{what} failed ({}):\n$ {cmd:?}\n--- stdout\n{}\n--- stderr (last lines)\n{}\n{hint}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            lines[lines.len().saturating_sub(40)..].join("\n")
        );
    }
    out
}

/// `requires = [...]` of pyproject.toml's `[build-system]`.
fn build_requirements() -> Vec<String> {
    let pyproject = std::fs::read_to_string(common::repo().join("pyproject.toml")).unwrap();
    let line = pyproject
        .lines()
        .find(|l| l.starts_with("requires = ["))
        .expect("pyproject.toml has [build-system] requires = [...] on one line");
    let inner = line.split_once('[').unwrap().1.rsplit_once(']').unwrap().0;
    inner
        .split(',')
        .map(|r| r.trim().trim_matches('"').to_string())
        .filter(|r| !r.is_empty())
        .collect()
}

/// `target/wheelhouse`, filled once (a stamp holds what it was filled for).
fn wheelhouse(target: &Path) -> PathBuf {
    let dir = target.join("wheelhouse");
    let repo = common::repo();
    let reqs = [
        repo.join("python/requirements.txt"),
        repo.join("python/wheel-tools.txt"),
    ];
    let build = build_requirements();
    let mut want = build.join("\n");
    for r in &reqs {
        want.push('\n');
        want.push_str(&std::fs::read_to_string(r).unwrap());
    }
    let stamp = dir.join(".equarx-wheelhouse");
    if std::fs::read_to_string(&stamp).ok().as_deref() == Some(want.as_str()) {
        return dir;
    }
    let started = Instant::now();
    let mut cmd = Command::new(common::python());
    cmd.args([
        "-m",
        "pip",
        "download",
        "--disable-pip-version-check",
        "--no-input",
        "-q",
    ])
    .args(["--only-binary", ":all:", "--dest"])
    .arg(&dir);
    for r in &reqs {
        cmd.arg("-r").arg(r);
    }
    cmd.args(&build);
    run(
        &mut cmd,
        "filling target/wheelhouse",
        "The wheel test downloads its wheels once (jax 0.10.2 and the rest of \
         python/requirements.txt, pyproject.toml's build requirements, python/wheel-tools.txt; \
         ~150 MB) with pip: PyPI, or the index pip is set up for, must be reachable. Or fill \
         target/wheelhouse yourself with `pip download --only-binary :all: -d target/wheelhouse \
         -r python/requirements.txt -r python/wheel-tools.txt <pyproject's build requires>` \
         on a machine that can, with Python 3.11.",
    );
    std::fs::write(&stamp, want).unwrap();
    println!("wheelhouse filled in {:.1?}", started.elapsed());
    dir
}

/// `version = "..."` of core/Cargo.toml's `[package]`: the one version.
fn core_version() -> String {
    let manifest = std::fs::read_to_string(common::repo().join("core/Cargo.toml")).unwrap();
    manifest
        .lines()
        .find_map(|l| l.strip_prefix("version = \""))
        .and_then(|v| v.strip_suffix('"'))
        .expect("core/Cargo.toml has version = \"...\"")
        .to_string()
}

/// The README's JAX snippet, after checking that its install block is what
/// this test does (`scripts/wheel`, then `pip install` of the wheel).
fn readme_snippet() -> String {
    let mut blocks = common::doc_blocks(
        "README.md",
        "tests/wheel.rs::the_wheel_installs_offline_and_rewrites_a_tensor_parallel_block_from_a_fresh_venv",
    );
    assert_eq!(
        blocks.len(),
        2,
        "the README marks its install block and its snippet"
    );
    let snippet = blocks.pop().unwrap();
    let install = blocks.pop().unwrap();
    let commands: Vec<Vec<&str>> = install
        .lines()
        .map(|l| l.split('#').next().unwrap().split_whitespace().collect())
        .filter(|w: &Vec<&str>| !w.is_empty())
        .collect();
    assert_eq!(
        commands,
        [
            vec!["scripts/wheel"],
            vec!["pip", "install", "target/wheels/equarx-*.whl"]
        ],
        "this test runs scripts/wheel and pip-installs the wheel it made: {install}"
    );
    assert!(snippet.contains("import"), "{snippet}");
    snippet
}

/// A command in the fresh venv's world: the checkout out of reach.
fn isolated(program: &Path, cwd: &Path) -> Command {
    let mut cmd = Command::new(program);
    cmd.current_dir(cwd)
        .env_remove("PYTHONPATH")
        .env_remove("PYTHONHOME")
        .env_remove("EQUARX_LIB")
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("VIRTUAL_ENV")
        .env("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
        .env("JAX_PLATFORMS", "cpu");
    cmd
}

#[test]
fn the_wheel_installs_offline_and_rewrites_a_tensor_parallel_block_from_a_fresh_venv() {
    let started = Instant::now();
    // What the README shows, before anything is built: its install block
    // is what steps 1 and 2 do (into a scratch dir and a fresh venv), and
    // step 5 runs its snippet.
    let snippet = readme_snippet();
    let repo = common::repo();
    let (target, profile) = target_and_profile();
    let wheelhouse = wheelhouse(&target);
    let version = core_version();

    // 1. Build and tag the wheel, offline, reusing this build's target/.
    let dist = common::scratch("wheel");
    let t = Instant::now();
    let out = run(
        Command::new(repo.join("scripts/wheel"))
            .arg(&dist)
            .env("EQUARX_PYTHON", common::python())
            .env("PIP_NO_INDEX", "1")
            .env("PIP_FIND_LINKS", &wheelhouse)
            .env("CARGO_TARGET_DIR", &target)
            .env("SETUPTOOLS_RUST_CARGO_PROFILE", &profile),
        "scripts/wheel",
        "scripts/wheel builds the wheel with pip, setuptools-rust and cargo; its error says what \
         is missing",
    );
    let build_time = t.elapsed();
    let wheel = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
    let name = wheel.file_name().unwrap().to_string_lossy().into_owned();
    let prefix = format!("equarx-{version}-py3-none-");
    let platform = name
        .strip_prefix(&prefix)
        .and_then(|n| n.strip_suffix(".whl"))
        .unwrap_or_else(|| panic!("{name}: want {prefix}<platform>.whl"));
    assert!(
        platform.starts_with("manylinux_") || platform.starts_with("linux_"),
        "{name}"
    );
    // The last `auditwheel show` is of the tagged wheel: it agrees with the
    // tag (auditwheel wraps its lines).
    let log = String::from_utf8_lossy(&out.stderr);
    let log = log.split_whitespace().collect::<Vec<_>>().join(" ");
    let verdict = format!("{name} is consistent with the following platform tag: \"{platform}\"");
    assert!(log.contains(&verdict), "auditwheel: {log}");

    // 2. A fresh venv, outside the checkout, the wheel and jax from the
    // wheelhouse only.
    let tmp = std::env::temp_dir().join(format!("equarx-wheel-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let work = tmp.join("work");
    std::fs::create_dir_all(&work).unwrap();
    let venv = tmp.join("venv");
    let t = Instant::now();
    run(
        isolated(&common::python(), &work)
            .arg("-m")
            .arg("venv")
            .arg(&venv),
        "python -m venv",
        "the venv module must work (Debian: apt-get install python3-venv)",
    );
    let py = venv.join("bin/python");
    run(
        isolated(&py, &work)
            .args([
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "--no-input",
                "-q",
            ])
            .args(["--no-index", "--find-links"])
            .arg(&wheelhouse)
            .arg(&wheel)
            .arg("-r")
            .arg(repo.join("python/requirements.txt")),
        "pip install (offline) of the wheel and jax into a fresh venv",
        "everything must be in target/wheelhouse: remove its .equarx-wheelhouse stamp to refill it",
    );
    let install_time = t.elapsed();

    // 3. The CLI from the venv.
    let out = run(
        isolated(&venv.join("bin/equarx"), &work).arg("--version"),
        "equarx --version from the venv",
        "the wheel installs the CLI into the venv's bin/",
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("equarx {version}")
    );

    // 4. The JAX door from the venv.
    std::fs::copy(repo.join("tests/wheel.py"), work.join("wheel.py")).unwrap();
    let t = Instant::now();
    let out = isolated(&py, &work).arg("wheel.py").output().unwrap();
    let door_time = t.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("WHEEL_RESULT "))
        .unwrap_or_else(|| {
            let lines: Vec<&str> = stderr.lines().collect();
            panic!(
                "tests/wheel.py gave no result ({}):\n{stdout}\n--- stderr (last lines)\n{}",
                out.status,
                lines[lines.len().saturating_sub(30)..].join("\n")
            )
        });
    let r: Value = serde_json::from_str(line).unwrap();
    let venv_real = venv.canonicalize().unwrap();
    let inside_venv = |key: &str| {
        let p = r[key].as_str().unwrap_or_else(|| panic!("no {key} in {r}"));
        assert!(
            Path::new(p).starts_with(&venv_real) || Path::new(p).starts_with(&venv),
            "{key} {p} is not inside the venv {}",
            venv.display()
        );
        p.to_string()
    };
    inside_venv("package");
    let library = inside_venv("library");
    assert!(
        library.ends_with("site-packages/equarx/libequarx.so"),
        "{library}"
    );
    assert_eq!(
        r["library_before_load"].as_str(),
        Some(library.as_str()),
        "the bundled library comes first: {r}"
    );
    assert_eq!(r["version"], version.as_str(), "{r}");
    assert_eq!(
        r["platforms"],
        serde_json::json!(["cpu"]),
        "enable() targets the default backend: {r}"
    );
    assert_eq!(r["all_reduces"], 2, "{r}");
    assert_eq!(
        r["rewritten_all_reduces"], 2,
        "both all-reduces rewritten: {r}"
    );
    assert!(r["s8_collectives"].as_u64() >= Some(2), "{r}");
    assert_eq!(r["shards"], 8, "{r}");
    assert_eq!(r["devices_bit_identical"], true, "{r}");
    assert_eq!(r["finite"], true, "{r}");
    let rel = r["rel_rms"].as_f64().unwrap();
    let bound = common::chained_bound(2.0, 8);
    assert!(rel > 0.0 && rel < bound, "error {rel}, bound {bound}: {r}");
    assert_eq!(r["enabled_after_block"], Value::Null, "{r}");
    let table = r["report_table"].as_str().unwrap();
    assert!(table.starts_with("collective "), "{table}");
    assert!(table.contains("2 of 2 collectives rewritten"), "{table}");
    // EQUARX_LIB wins when set; a wrong one is an error, not a fallback.
    assert_eq!(r["override"]["returncode"], 0, "{r}");
    assert_eq!(
        r["override"]["stdout"],
        serde_json::json!([version, r["override_copy"]]),
        "{r}"
    );
    assert_ne!(r["override_missing"]["returncode"], 0, "{r}");
    assert!(
        r["override_missing"]["stderr"]
            .to_string()
            .contains("is not a file"),
        "{r}"
    );

    // 5. The README's snippet, as a user pastes it.
    std::fs::write(work.join("snippet.py"), &snippet).unwrap();
    let t = Instant::now();
    let out = run(
        isolated(&py, &work).arg("snippet.py"),
        "the README's snippet",
        "README.md's snippet must run as it stands",
    );
    let snippet_time = t.elapsed();
    let snippet_out = String::from_utf8_lossy(&out.stdout);
    assert!(
        snippet_out.contains("1 of 1 collectives rewritten"),
        "{snippet_out}"
    );

    println!("{}", r["report_table"].as_str().unwrap());
    println!("snippet:\n{snippet_out}");
    println!(
        "wheel {name}: built in {build_time:.1?} (profile {profile}), venv + offline install \
         {install_time:.1?}, tests/wheel.py {door_time:.1?}, snippet {snippet_time:.1?}, test \
         {:.1?}",
        started.elapsed()
    );
    std::fs::remove_dir_all(&tmp).unwrap();
}
