//! HLO text in XLA's syntax: the printer and the parser.
//!
//! The printer writes what XLA's own parser reads back: constants in full
//! (XLA abbreviates large ones as `{...}`, which re-parses to garbage without
//! an error), all three replica-group encodings, the stack-frame table that
//! metadata points into, and a scheduled module's instructions in schedule
//! order. The parser (`parse/`, grammar in `parse/mod.rs`) reads what XLA's
//! printer and ours write into the `HloModuleProto` XLA's parser would make.
//!
//! One exception, on purpose: the stack-frame table. Both sides print it as
//! stored, every row in order (strings C-escaped as XLA escapes them), and
//! equarx's parser keeps it so. XLA's parser instead rebuilds it from the
//! instructions in text order, dropping rows no instruction reaches, function
//! names included, and renumbering the rest; it does that to its own dump
//! text as well (`tests/stack_frames.rs`, `tests/fixtures/frames`).

mod parse;
mod print;

pub use parse::MAX_DEPTH;
pub(crate) use print::print_shape;
pub use print::{PrintError, PrintOptions, print_module, print_module_with};

use crate::ir::DeviceCounts;
use crate::proto::HloModuleProto;

/// A module read from HLO text, with the device counts its header names.
#[derive(Clone, Debug)]
pub struct ParsedText {
    pub proto: HloModuleProto,
    pub counts: DeviceCounts,
}

/// Why HLO text did not parse, and where.
#[derive(Debug, thiserror::Error)]
#[error("line {line}, column {column}: {message}")]
pub struct ParseError {
    /// 1-based.
    pub line: usize,
    /// 1-based, in characters.
    pub column: usize,
    pub message: String,
}

/// Parses HLO text in XLA's syntax into the module XLA's parser would make,
/// with the replica/partition counts its header names. Malformed text gives
/// a [`ParseError`], never a panic.
pub fn parse(text: &str) -> Result<ParsedText, ParseError> {
    parse::parse_module(text)
}
