//! The docs made from the table: the README's option table and the key
//! lists of `cpp_shim/README.md` and `cpp_shim/include/equarx.h`
//! (`tests/options.rs` checks that the files hold what these make).

use std::fmt::Write as _;

use super::{OPTIONS, RewriteOptions};

/// The README's table ("Options (the pass)").
pub fn markdown_table() -> String {
    let mut out = String::from("| option | default | why |\n|---|---|---|\n");
    for o in OPTIONS {
        let aliases: String = o
            .aliases
            .iter()
            .map(|a| format!(", `--{}`", a.replace('_', "-")))
            .collect();
        let default = match (o.show)(&RewriteOptions::default()) {
            Some(v) if !v.is_empty() => v,
            _ => format!("({})", o.unset),
        };
        let _ = writeln!(
            out,
            "| `--{}` {}{aliases} | {default} | {} |",
            o.flag(),
            // A bare | would end the table cell.
            o.syntax.placeholder().replace('|', "\\|"),
            o.why
        );
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
