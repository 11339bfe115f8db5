//! The docs made from the table: the option tables of the README and
//! `docs/options.md`, and the key lists of `cpp_shim/README.md` and
//! `cpp_shim/include/equarx.h` (`tests/options.rs` checks that the files
//! hold what these make).

use std::fmt::Write as _;

use super::{OPTIONS, RewriteOptions};

/// An option's first cell: `` `--flag` PLACEHOLDER, `--alias` `` (a bare
/// `|` would end the table cell).
fn flag_cell(o: &super::OptionSpec) -> String {
    let aliases: String = o
        .aliases
        .iter()
        .map(|a| format!(", `--{}`", a.replace('_', "-")))
        .collect();
    format!(
        "`--{}` {}{aliases}",
        o.flag(),
        o.syntax.placeholder().replace('|', "\\|")
    )
}

/// The README's short table ("Options"): each option, its default, and its
/// help up to the first clause (`Elements per quantization block`).
pub fn summary_table() -> String {
    let mut out = String::from("| option | default | what |\n|---|---|---|\n");
    for o in OPTIONS {
        let cut = [": ", " (", "; ", ". "]
            .iter()
            .filter_map(|sep| o.help.find(sep))
            .min()
            .unwrap_or(o.help.len());
        let what = o.help[..cut].trim_end_matches('.');
        let _ = writeln!(out, "| {} | {} | {what} |", flag_cell(o), o.default_text());
    }
    out
}

/// `docs/options.md`'s table: each option, its default, and why (its
/// links relative to the repository's root).
pub fn markdown_table() -> String {
    let mut out = String::from("| option | default | why |\n|---|---|---|\n");
    for o in OPTIONS {
        let default = match (o.show)(&RewriteOptions::default()) {
            Some(v) if !v.is_empty() => v,
            _ => format!("({})", o.unset),
        };
        let _ = writeln!(out, "| {} | {default} | {} |", flag_cell(o), o.why);
    }
    out
}

/// One entry per option for a C comment: `name  syntax (default D):` and
/// the help wrapped below it, every line prefixed with `prefix` (` *   `).
pub fn key_list(prefix: &str) -> String {
    let mut out = String::new();
    for o in OPTIONS {
        let _ = writeln!(
            out,
            "{prefix}{}  {} (default: {}):",
            o.name,
            o.syntax.placeholder(),
            o.default_text()
        );
        let mut line = String::new();
        for word in o.help.split_whitespace() {
            if !line.is_empty() && prefix.len() + 4 + line.len() + 1 + word.len() > 78 {
                let _ = writeln!(out, "{prefix}    {line}");
                line.clear();
            }
            if !line.is_empty() {
                line.push(' ');
            }
            line.push_str(word);
        }
        let _ = writeln!(out, "{prefix}    {line}");
    }
    out
}

/// cpp_shim/README.md's list.
pub fn markdown_key_list() -> String {
    let mut out = String::new();
    for o in OPTIONS {
        let aliases: String = o.aliases.iter().map(|a| format!(", alias `{a}`")).collect();
        let _ = writeln!(
            out,
            "- `{}` ({}, default: {}{aliases}): {}",
            o.name,
            o.syntax.placeholder(),
            o.default_text(),
            o.help
        );
    }
    out
}
