// Shared by two test binaries (filetests, compilers) that each read part of it.
#![allow(dead_code)]

//! The header of a case file: the `//` lines above its module, in the
//! grammar of `tests/cases/README.md`. Parsing is strict: an unknown key, a
//! key given twice, a value that does not read, or a missing key the check
//! needs is an error naming the file and line, never a looser test.

use serde_json::{Map, Value};

use crate::common::inputs::Data;

/// What a test's rewrite is checked against.
#[derive(Clone, Debug, PartialEq)]
pub enum Check {
    /// `psum GROUPS`: output k on device d is the sum of parameter k over
    /// d's group.
    Psum(Vec<Vec<usize>>),
    /// `reduce-scatter GROUPS`, `all-gather GROUPS`, `all-to-all GROUPS`:
    /// the module's one collective of that kind over GROUPS.
    Collective(Collective, Vec<Vec<usize>>),
    /// `program reference=self|modules/NAME.hlo bound=chained(L,P)`: the
    /// rewrite's outputs against the reference module's on the same inputs.
    Program {
        reference: Reference,
        bound: Chained,
    },
    /// `parse`: XLA's parser reads the rewrite's text back; nothing runs.
    Parse,
    /// No `check:` (every test of the file must come out unchanged).
    Unchanged,
}

pub use equarx::plan::Collective;

#[derive(Clone, Debug, PartialEq)]
pub enum Reference {
    /// The module itself, unrewritten.
    Original,
    /// Another module, relative to `tests/cases/`.
    File(String),
}

/// `chained(L,P)`: L all-reduces in a row over groups of P, each within
/// the ring's error model for matmul partials (`common::chained_bound`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Chained {
    pub chain: f64,
    pub group: usize,
}

/// What one test expects of the pass.
#[derive(Clone, Debug, PartialEq)]
pub enum Expect {
    /// Every collective rewritten, with these plans (one per op in report
    /// order, or one for all), as `equarx rewrite --report` writes them.
    Plan(String),
    /// The module comes out unchanged, the first op's reason containing
    /// this text.
    Unchanged(String),
}

/// One test of a file: the base (`variant: None`) or a variant.
#[derive(Clone, Debug)]
pub struct TestSpec {
    pub variant: Option<String>,
    /// The options JSON: the base's, with the variant's keys replacing
    /// the base's.
    pub options: Map<String, Value>,
    pub expect: Expect,
}

#[derive(Clone, Debug)]
pub struct Header {
    pub check: Check,
    /// (replicas, partitions).
    pub devices: (usize, usize),
    pub data: Vec<Data>,
    /// `goal: DATA MAX`: the measured error on DATA at most MAX.
    pub goal: Option<(Data, f64)>,
    /// XLA passes to disable when compiling (on top of the partitioner's).
    pub disable: Option<String>,
    /// Whether the original runs here as the baseline (psum).
    pub baseline: bool,
    /// `door: cli`: the command line rewrites the file's text.
    pub cli: bool,
    /// Which of the real TPU and GPU compilers compile the case
    /// (`tests/compilers.rs`), and why not where one does not.
    pub compilers: Compilers,
    /// The base test first, then the variants in file order.
    pub tests: Vec<TestSpec>,
}

/// `compilers: tpu no: WHY`, `gpu no: WHY` or `none: WHY`: the compilers
/// a case is not compiled in, each with its reason (unset: both compile it).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Compilers {
    pub tpu_not: Option<String>,
    pub gpu_not: Option<String>,
}

fn compilers_of(value: &str) -> Result<Compilers, String> {
    let said = |why: &str| {
        let why = why.trim();
        if why.is_empty() {
            Err(
                "`compilers:` needs the reason: `tpu no: WHY`, `gpu no: WHY` or `none: WHY`"
                    .to_string(),
            )
        } else {
            Ok(Some(why.to_string()))
        }
    };
    if let Some(why) = value.strip_prefix("tpu no:") {
        Ok(Compilers {
            tpu_not: said(why)?,
            gpu_not: None,
        })
    } else if let Some(why) = value.strip_prefix("gpu no:") {
        Ok(Compilers {
            tpu_not: None,
            gpu_not: said(why)?,
        })
    } else if let Some(why) = value.strip_prefix("none:") {
        let why = said(why)?;
        Ok(Compilers {
            tpu_not: why.clone(),
            gpu_not: why,
        })
    } else {
        Err("compilers is `tpu no: WHY`, `gpu no: WHY` or `none: WHY`".into())
    }
}

const KEYS: &[&str] = &[
    "check",
    "devices",
    "data",
    "options",
    "goal",
    "disable",
    "baseline",
    "door",
    "plan",
    "variant",
    "compilers",
];

/// The header lines of `text` (the leading `//` lines) and the line the
/// module starts on.
pub fn split(text: &str) -> (Vec<&str>, usize) {
    let lines: Vec<&str> = text.lines().take_while(|l| l.starts_with("//")).collect();
    let n = lines.len();
    (lines, n)
}

/// A directive line's key, variant name and value; `None` for prose.
fn directive(line: &str) -> Option<(&str, Option<&str>, &str)> {
    let rest = line.strip_prefix("// ")?;
    let (head, value) = rest
        .split_once(": ")
        .or_else(|| rest.strip_suffix(':').map(|h| (h, "")))?;
    let mut words = head.split(' ');
    let key = words.next()?;
    let name = words.next();
    let lower = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_lowercase());
    let ident = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    };
    if words.next().is_some() || !lower(key) || !name.is_none_or(ident) {
        return None;
    }
    Some((key, name, value.trim()))
}

pub fn parse(text: &str) -> Result<Header, String> {
    let (lines, _) = split(text);
    let mut seen: Vec<&str> = Vec::new();
    let mut check = None;
    let mut devices = None;
    let mut data = None;
    let mut options = Map::new();
    let mut goal = None;
    let mut disable = None;
    let mut baseline = true;
    let mut cli = false;
    let mut compilers = Compilers::default();
    let mut base: Option<Expect> = None;
    let mut variants: Vec<(String, Map<String, Value>, Expect)> = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let at = |e: String| format!("line {}: {e}", i + 1);
        let Some((key, name, value)) = directive(line) else {
            continue;
        };
        if !KEYS.contains(&key) {
            return Err(at(format!(
                "unknown key {key:?} (the keys are {}; prose must not read `word:`)",
                KEYS.join(", ")
            )));
        }
        if key == "variant" {
            let name =
                name.ok_or_else(|| at("a variant needs a name: `variant NAME: ...`".into()))?;
            if variants.iter().any(|v| v.0 == name) {
                return Err(at(format!("variant {name} is given twice")));
            }
            let (json, expect) = value
                .split_once(" -> ")
                .ok_or_else(|| at("a variant reads `variant NAME: {OPTIONS} -> PLAN`".into()))?;
            let o = object(json).map_err(at)?;
            variants.push((name.to_string(), o, expect_of(expect).map_err(at)?));
            continue;
        }
        if name.is_some() {
            return Err(at(format!("{key} takes no name")));
        }
        if seen.contains(&key) {
            return Err(at(format!("{key} is given twice")));
        }
        seen.push(key);
        match key {
            "check" => check = Some(check_of(value).map_err(at)?),
            "devices" => devices = Some(devices_of(value).map_err(at)?),
            "data" => {
                data = Some(
                    value
                        .split_whitespace()
                        .map(Data::from_name)
                        .collect::<Result<Vec<_>, _>>()
                        .map_err(at)?,
                )
            }
            "options" => options = object(value).map_err(at)?,
            "goal" => goal = Some(goal_of(value).map_err(at)?),
            "disable" => disable = Some(value.to_string()),
            "baseline" => {
                baseline = match value.split_once(':').map_or(value, |x| x.0) {
                    "yes" => true,
                    "no" if value.len() > 4 => false,
                    _ => return Err(at("baseline is `yes` or `no: WHY`".into())),
                }
            }
            "door" => {
                cli = match value {
                    "cli" => true,
                    "library" => false,
                    _ => return Err(at("door is `library` or `cli`".into())),
                }
            }
            "plan" => base = Some(expect_of(value).map_err(at)?),
            "compilers" => compilers = compilers_of(value).map_err(at)?,
            _ => unreachable!(),
        }
    }
    let base = base.ok_or("no `plan:` (the base test's expected plan)")?;
    let devices = devices.ok_or("no `devices: replicas=R partitions=P`")?;
    let mut tests = vec![TestSpec {
        variant: None,
        options: options.clone(),
        expect: base,
    }];
    for (name, o, expect) in variants {
        let mut merged = options.clone();
        merged.extend(o);
        tests.push(TestSpec {
            variant: Some(name),
            options: merged,
            expect,
        });
    }
    let positive = tests.iter().any(|t| matches!(t.expect, Expect::Plan(_)));
    let check = match check {
        Some(c) => c,
        None if !positive => Check::Unchanged,
        None => return Err("no `check:` (a test expects a rewrite)".into()),
    };
    let runs = matches!(
        check,
        Check::Psum(_) | Check::Collective(..) | Check::Program { .. }
    );
    let data = match (data, runs) {
        (Some(d), true) if !d.is_empty() => d,
        (None, false) => Vec::new(),
        (_, true) => return Err("a check that runs needs `data:`".into()),
        (Some(_), false) => return Err("`data:` without a check that runs".into()),
    };
    if let Some((d, _)) = goal {
        if !data.contains(&d) {
            return Err(format!("the goal's data {} is not in `data:`", d.name()));
        }
    }
    if let Check::Collective(..) = check {
        if goal.is_some() {
            return Err("a goal is for psum and program checks".into());
        }
        if data.contains(&Data::HeavyTailed) {
            return Err("collective checks draw gaussian, outliers and poisoned data".into());
        }
    }
    if cli && !matches!(check, Check::Program { .. }) {
        return Err("`door: cli` needs a program check".into());
    }
    if !baseline && !matches!(check, Check::Psum(_)) {
        return Err(
            "`baseline: no` is for psum checks (programs always run their reference)".into(),
        );
    }
    Ok(Header {
        check,
        devices,
        data,
        goal,
        disable,
        baseline,
        cli,
        compilers,
        tests,
    })
}

fn object(json: &str) -> Result<Map<String, Value>, String> {
    match serde_json::from_str(json) {
        Ok(Value::Object(o)) => Ok(o),
        Ok(_) => Err(format!("options must be a JSON object: {json}")),
        Err(e) => Err(format!("options JSON {json}: {e}")),
    }
}

fn expect_of(s: &str) -> Result<Expect, String> {
    match s.strip_prefix("unchanged: ") {
        Some(reason) if !reason.trim().is_empty() => Ok(Expect::Unchanged(reason.trim().into())),
        Some(_) => Err("`unchanged: REASON` needs the reason".into()),
        None if s.is_empty() => Err("no plan".into()),
        None => Ok(Expect::Plan(s.to_string())),
    }
}

/// `{{0,1},{2,3}}`.
fn groups_of(s: &str) -> Result<Vec<Vec<usize>>, String> {
    let bad = || format!("groups {s:?} do not read as {{{{0,1,...}},...}}");
    let inner = s
        .strip_prefix("{{")
        .and_then(|x| x.strip_suffix("}}"))
        .ok_or_else(bad)?;
    inner
        .split("},{")
        .map(|g| {
            g.split(',')
                .map(|d| d.trim().parse::<usize>().map_err(|_| bad()))
                .collect()
        })
        .collect()
}

fn check_of(s: &str) -> Result<Check, String> {
    let (kind, rest) = s.split_once(' ').unwrap_or((s, ""));
    let rest = rest.trim();
    Ok(match kind {
        "psum" => Check::Psum(groups_of(rest)?),
        "reduce-scatter" => Check::Collective(Collective::ReduceScatter, groups_of(rest)?),
        "all-gather" => Check::Collective(Collective::AllGather, groups_of(rest)?),
        "all-to-all" => Check::Collective(Collective::AllToAll, groups_of(rest)?),
        "parse" if rest.is_empty() => Check::Parse,
        "program" => {
            let mut reference = None;
            let mut bound = None;
            for word in rest.split_whitespace() {
                match word.split_once('=') {
                    Some(("reference", "self")) => reference = Some(Reference::Original),
                    Some(("reference", f)) => reference = Some(Reference::File(f.into())),
                    Some(("bound", b)) => bound = Some(chained_of(b)?),
                    _ => return Err(format!("program takes reference= and bound=, not {word:?}")),
                }
            }
            Check::Program {
                reference: reference.ok_or("program needs reference=self|modules/NAME.hlo")?,
                bound: bound.ok_or("program needs bound=chained(L,P)")?,
            }
        }
        _ => {
            return Err(format!(
                "unknown check {s:?} (psum, reduce-scatter, all-gather, all-to-all, program, parse)"
            ));
        }
    })
}

fn chained_of(s: &str) -> Result<Chained, String> {
    let bad = || format!("bound {s:?} is not chained(L,P)");
    let (l, p) = s
        .strip_prefix("chained(")
        .and_then(|x| x.strip_suffix(')'))
        .and_then(|x| x.split_once(','))
        .ok_or_else(bad)?;
    Ok(Chained {
        chain: l.trim().parse().map_err(|_| bad())?,
        group: p.trim().parse().map_err(|_| bad())?,
    })
}

fn devices_of(s: &str) -> Result<(usize, usize), String> {
    let bad = || format!("devices {s:?} is not `replicas=R partitions=P`");
    let mut r = None;
    let mut p = None;
    for word in s.split_whitespace() {
        match word.split_once('=') {
            Some(("replicas", n)) => r = n.parse().ok(),
            Some(("partitions", n)) => p = n.parse().ok(),
            _ => return Err(bad()),
        }
    }
    match (r, p) {
        (Some(r), Some(p)) if r >= 1 && p >= 1 => Ok((r, p)),
        _ => Err(bad()),
    }
}

fn goal_of(s: &str) -> Result<(Data, f64), String> {
    let (d, g) = s
        .split_once(' ')
        .ok_or_else(|| format!("goal {s:?} is not `DATA MAX`"))?;
    let g: f64 = g
        .trim()
        .parse()
        .map_err(|_| format!("goal {g:?} is not a number"))?;
    Ok((Data::from_name(d)?, g))
}
