//! The HLO text parser: reads what XLA's printer (and ours) writes back into
//! an `HloModuleProto`, the way XLA's own parser (`hlo_parser.cc`) would.
//!
//! One recursive-descent [`Parser`] over a small on-demand [`Lexer`]. A few
//! attribute values are not made of ordinary tokens (`dim_labels=b01f_01io->b01f`,
//! `padding=0_1x2_3`, `window={size=3x3}`, bare JSON dicts); the parser reads
//! those straight from the text ("raw" reads).
//!
//! ```text
//! module        ::= 'HloModule' name (',' header_attr)* stack_frames? computation+
//! header_attr   ::= 'is_scheduled=' bool | 'replica_count=' int | 'num_partitions=' int
//!                 | 'entry_computation_layout={' '(' shapes? ')' '->' shape '}'
//!                 | 'input_output_alias={' (index ':' '(' int ',' index (',' kind)? ')'),* '}'
//!                 | 'buffer_donor={' ('(' int ',' index ')'),* '}'
//!                 | 'frontend_attributes=' frontend_attrs | 'alias_passthrough_params=' bool
//!                 | 'allow_spmd_sharding_propagation_to_' ('parameters' | 'output') '=' bools
//! stack_frames  ::= 'FileNames' (int string)* 'FunctionNames' (int string)*
//!                   'FileLocations' (int '{' sub_attr* '}')* 'StackFrames' (int '{' sub_attr* '}')*
//! computation   ::= 'ENTRY'? name ('(' (name ':' shape),* ')' '->' shape)?
//!                   '{' instruction+ '}' (',' 'execution_thread=' string)?
//! instruction   ::= 'ROOT'? name '=' shape opcode operands (',' attribute)*
//! operands      ::= '(' (shape? name),* ')' | '(' int ')' (parameter) | '(' literal ')' (constant)
//! attribute     ::= attr_name '=' value        (the value's syntax depends on the name)
//! shape         ::= '(' shape,* ')' | type '[' (('<=' | '')  int | '?'),* ']' layout?
//! layout        ::= '{' int,* (':' ('D(' ... ')')? ('T' ('(' dims ')')+)? ('L(' int ')')?
//!                   ('#(' type ')')? ('*(' type ')')? ('E(' int ')')? ('S(' int ')')?
//!                   ('SC' ('(' int ':' int,* ')')+)? ('P(' shape ')')? ('M(' int ')')?)? '}'
//! literal       ::= scalar | '{' (literal | scalar),* '}' | '(' literal,* ')'   (nested by rank)
//! replica_groups ::= '{' ('{' int,* '}'),* '}' | '[' int ',' int ']<=[' int,* ']' ('T(' int,* ')')?
//!                  | 'mesh[' (axis '=' int),* ']' (',' 'device_ids=(' ids ')')? '{' axis_ref,* '}'
//! sharding      ::= '{' single '}' | '{' ('{' single '}'),* '}'
//! name          ::= '%'? [A-Za-z_][A-Za-z0-9_.-]*
//! ```
//! `/* ... */` and `// ...` are comments (XLA prints `/*index=5*/` between
//! operands).
//!
//! What the proto gets, like XLA: computation ids count 1, 2, ... in text
//! order and instruction ids are `computation_id << 32 | local_id` with
//! local ids 1, 2, ... in text order (XLA's scheme; jaxlib 0.10.2's parser
//! counts both from 0, we start at 1 so that no id is the proto default);
//! computations are listed callees first, otherwise in text order (which is
//! what XLA gives for any text it can parse); a scheduled module's sequences
//! are the text order; what XLA's parser fills in when the text leaves it
//! out is filled the same way (default layouts with
//! `tail_padding_alignment_in_elements=1`, precision configs, windows and
//! group counts, the comparison type, `largest=true`, the custom-call API
//! version, ...), checked field by field against XLA by `tests/text.rs`.
//! What XLA's parser reads but cannot carry in a bare `HloModuleProto` (the
//! `allow_spmd_*` and `alias_passthrough_params` config flags) is dropped;
//! `replica_count` and `num_partitions` go to [`ParsedText::counts`] (1 when
//! the header does not say, as in XLA).
//!
//! Not read (an error says so): XLA's async syntax sugar (`fusion-start`,
//! ...), nested (inline) computations and instructions, instructions without
//! a shape, named (mesh) shardings, `origin_recovery_table`, and constants of
//! element types without a host representation here (f8, f4, f6).
//!
//! Errors name the line and column (1-based, in characters). Nothing that
//! comes from the input is indexed or unwrapped without a check, and nesting
//! is bounded ([`MAX_DEPTH`]), so malformed input gives an error, never a
//! panic.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::{ParseError, ParsedText};
use crate::ir::DeviceCounts;
use crate::ir::shape::{self, type_from_name};
use crate::proto::hlo_buffer_donor_proto::BufferDonorEntryProto;
use crate::proto::hlo_input_output_alias_proto::AliasEntryProto;
use crate::proto::hlo_instruction_proto::{
    OptionalCrossProgramPrefetchIndex, ReplicaGroupList, SliceDimensions,
};
use crate::proto::hlo_schedule_proto::InstructionSequence;
use crate::proto::stack_frame_index_proto::{FileLocation, StackFrame};
use crate::proto::{
    AxisRefProto, CholeskyOptions, CollectiveDeviceListProto, ConvolutionDimensionNumbers,
    DotDimensionNumbers, FrontendAttributes, HloBufferDonorProto, HloComputationProto,
    HloInputOutputAliasProto, HloInstructionProto, HloModuleProto, HloScheduleProto,
    IotaReplicaGroupListProto, LayoutProto, LiteralProto, MeshAxesReplicaGroupListProto, MeshProto,
    OpMetadata, OpSharding, OriginalArrayProto, OriginalValueElementProto, OriginalValueProto,
    OutputOperandAliasing, PaddingConfig, ParameterReplication, PrecisionConfig, PrimitiveType,
    ProgramShapeProto, ReplicaGroup, ResultAccuracy, ShapeProto, SourceTarget, SplitConfigProto,
    StackFrameIndexProto, Statistic, StatisticsViz, TileProto, Window, WindowDimension,
    axis_ref_proto, mesh_proto, op_sharding, padding_config, result_accuracy,
};

/// Deepest nesting of tuple shapes, tuple literals and tuple shardings.
pub const MAX_DEPTH: usize = 64;

/// Parses a whole module.
pub fn parse_module(text: &str) -> Result<ParsedText, ParseError> {
    let mut p = Parser::new(text);
    p.module().map_err(|f| f.locate(text))
}

// ---------------------------------------------------------------------------
// Errors

/// An error at a byte offset; turned into line and column at the end.
#[derive(Debug)]
struct Failure {
    at: usize,
    message: String,
}

impl Failure {
    fn new(at: usize, message: impl Into<String>) -> Self {
        Failure {
            at,
            message: message.into(),
        }
    }

    fn locate(self, text: &str) -> ParseError {
        let (line, column) = line_column(text, self.at);
        ParseError {
            line,
            column,
            message: self.message,
        }
    }
}

/// 1-based line and column (in characters) of byte offset `at`.
fn line_column(text: &str, at: usize) -> (usize, usize) {
    let mut at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    let before = &text[..at];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |k| k + 1);
    let column = before[line_start..].chars().count() + 1;
    (line, column)
}

type Res<T> = Result<T, Failure>;

// ---------------------------------------------------------------------------
// Lexer

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    /// `[A-Za-z_][A-Za-z0-9_.-]*`: keywords, types, opcodes, attribute
    /// names, bare instruction names.
    Ident(String),
    /// `%name`.
    Name(String),
    /// An integer or decimal number as written (`-3`, `0.5`, `1e-05`),
    /// `-inf`, or a NaN (`nan(0x1)`, `-nan`).
    Number(String),
    /// A quoted string, unescaped (bytes: `\377` escapes need not be UTF-8).
    Str(Vec<u8>),
    Arrow,
    Leq,
    Dots,
    Sym(char),
    Eof,
}

impl Tok {
    fn describe(&self) -> String {
        match self {
            Tok::Ident(s) => format!("'{s}'"),
            Tok::Name(s) => format!("'%{s}'"),
            Tok::Number(s) => format!("'{s}'"),
            Tok::Str(s) => {
                let s = String::from_utf8_lossy(s);
                let short: String = s.chars().take(24).collect();
                if short.len() < s.len() {
                    format!("string \"{short}...\"")
                } else {
                    format!("string \"{short}\"")
                }
            }
            Tok::Arrow => "'->'".into(),
            Tok::Leq => "'<='".into(),
            Tok::Dots => "'...'".into(),
            Tok::Sym(c) => format!("'{c}'"),
            Tok::Eof => "end of input".into(),
        }
    }
}

#[derive(Clone, Debug)]
struct Token {
    tok: Tok,
    start: usize,
    end: usize,
}

#[derive(Clone)]
struct Lexer<'a> {
    text: &'a str,
    src: &'a [u8],
    pos: usize,
    peeked: Option<Token>,
}

fn is_ident_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_'
}

fn is_ident_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b'.' || c == b'-'
}

impl<'a> Lexer<'a> {
    fn new(text: &'a str) -> Self {
        let pos = if text.starts_with('\u{feff}') { 3 } else { 0 };
        Lexer {
            text,
            src: text.as_bytes(),
            pos,
            peeked: None,
        }
    }

    fn byte(&self, i: usize) -> Option<u8> {
        self.src.get(i).copied()
    }

    fn peek(&mut self) -> Res<&Token> {
        if self.peeked.is_none() {
            let t = self.lex_at(self.pos)?;
            self.peeked = Some(t);
        }
        match &self.peeked {
            Some(t) => Ok(t),
            None => Err(Failure::new(self.pos, "internal lexer error")),
        }
    }

    fn next(&mut self) -> Res<Token> {
        let t = match self.peeked.take() {
            Some(t) => t,
            None => self.lex_at(self.pos)?,
        };
        self.pos = t.end;
        Ok(t)
    }

    /// Skips whitespace and comments from `i`.
    fn skip_trivia(&self, mut i: usize) -> Res<usize> {
        loop {
            match self.byte(i) {
                Some(b' ' | b'\t' | b'\n' | b'\r') => i += 1,
                Some(b'/') if self.byte(i + 1) == Some(b'*') => {
                    let start = i;
                    i += 2;
                    loop {
                        match self.byte(i) {
                            None => return Err(Failure::new(start, "unterminated comment")),
                            Some(b'*') if self.byte(i + 1) == Some(b'/') => {
                                i += 2;
                                break;
                            }
                            Some(_) => i += 1,
                        }
                    }
                }
                Some(b'/') if self.byte(i + 1) == Some(b'/') => {
                    while !matches!(self.byte(i), None | Some(b'\n' | b'\r')) {
                        i += 1;
                    }
                }
                _ => return Ok(i),
            }
        }
    }

    fn lex_at(&self, i: usize) -> Res<Token> {
        let start = self.skip_trivia(i)?;
        let tok = |tok, end| Ok(Token { tok, start, end });
        let Some(c) = self.byte(start) else {
            return tok(Tok::Eof, start);
        };
        match c {
            b'%' => {
                if !self.byte(start + 1).is_some_and(is_ident_start) {
                    return Err(Failure::new(start, "expected a name after '%'"));
                }
                let end = self.ident_end(start + 1);
                tok(Tok::Name(self.slice(start + 1, end)), end)
            }
            b'"' | b'\'' => {
                let (bytes, end) = self.string(start)?;
                tok(Tok::Str(bytes), end)
            }
            b'-' if self.byte(start + 1) == Some(b'>') => tok(Tok::Arrow, start + 2),
            b'.' if self.byte(start + 1) == Some(b'.') && self.byte(start + 2) == Some(b'.') => {
                tok(Tok::Dots, start + 3)
            }
            b'0'..=b'9' | b'-' | b'.' => {
                let end = self.number_end(start)?;
                tok(Tok::Number(self.slice(start, end)), end)
            }
            b'<' if self.byte(start + 1) == Some(b'=') => tok(Tok::Leq, start + 2),
            c if is_ident_start(c) => {
                let end = self.ident_end(start);
                let word = self.slice(start, end);
                if word == "nan" {
                    if let Some(end) = self.nan_payload_end(end) {
                        return tok(Tok::Number(self.slice(start, end)), end);
                    }
                }
                tok(Tok::Ident(word), end)
            }
            b'=' | b',' | b':' | b'(' | b')' | b'[' | b']' | b'{' | b'}' | b'*' | b'#' | b'+'
            | b'~' | b'?' | b'@' | b'!' => tok(Tok::Sym(c as char), start + 1),
            _ => {
                let shown = self
                    .text
                    .get(start..)
                    .and_then(|s| s.chars().next())
                    .map_or_else(|| format!("byte 0x{c:02x}"), |ch| format!("{ch:?}"));
                Err(Failure::new(start, format!("unexpected character {shown}")))
            }
        }
    }

    fn slice(&self, a: usize, b: usize) -> String {
        String::from_utf8_lossy(self.src.get(a..b).unwrap_or_default()).into_owned()
    }

    fn ident_end(&self, mut i: usize) -> usize {
        while self.byte(i).is_some_and(is_ident_char) {
            i += 1;
        }
        i
    }

    /// `(0x1f)` after a `nan`: the end of the payload, if there is one.
    fn nan_payload_end(&self, i: usize) -> Option<usize> {
        if self.byte(i) != Some(b'(') || self.byte(i + 1) != Some(b'0') {
            return None;
        }
        if !matches!(self.byte(i + 2), Some(b'x' | b'X')) {
            return None;
        }
        let mut j = i + 3;
        while self.byte(j).is_some_and(|c| c.is_ascii_hexdigit()) {
            j += 1;
        }
        (j > i + 3 && self.byte(j) == Some(b')')).then_some(j + 1)
    }

    /// `-?(digits(.digits?)?|.digits)([eE][+-]?digits)?`, `-inf`, `-nan(0x..)?`.
    fn number_end(&self, start: usize) -> Res<usize> {
        let mut i = start;
        if self.byte(i) == Some(b'-') {
            i += 1;
            for word in ["inf", "nan"] {
                let end = i + word.len();
                if self.src.get(i..end) == Some(word.as_bytes())
                    && !self.byte(end).is_some_and(is_ident_char)
                {
                    return Ok(if word == "nan" {
                        self.nan_payload_end(end).unwrap_or(end)
                    } else {
                        end
                    });
                }
            }
        }
        let digits_from = |mut j: usize| {
            while self.byte(j).is_some_and(|c| c.is_ascii_digit()) {
                j += 1;
            }
            j
        };
        let int_end = digits_from(i);
        let mut digits = int_end > i;
        i = int_end;
        if self.byte(i) == Some(b'.') && self.byte(i + 1) != Some(b'.') {
            let frac_end = digits_from(i + 1);
            digits |= frac_end > i + 1;
            i = frac_end;
        }
        if !digits {
            return Err(Failure::new(start, "expected a number"));
        }
        if matches!(self.byte(i), Some(b'e' | b'E')) {
            let mut j = i + 1;
            if matches!(self.byte(j), Some(b'+' | b'-')) {
                j += 1;
            }
            let exp_end = digits_from(j);
            if exp_end > j {
                i = exp_end;
            }
        }
        Ok(i)
    }

    /// A quoted string starting at `start`; C escapes as absl::CUnescape.
    fn string(&self, start: usize) -> Res<(Vec<u8>, usize)> {
        let quote = self.byte(start).unwrap_or(b'"');
        let mut out = Vec::new();
        let mut i = start + 1;
        let unterminated = || Failure::new(start, "unterminated string");
        loop {
            let c = self.byte(i).ok_or_else(unterminated)?;
            if c == quote {
                return Ok((out, i + 1));
            }
            if c != b'\\' {
                out.push(c);
                i += 1;
                continue;
            }
            let e = self.byte(i + 1).ok_or_else(unterminated)?;
            let simple = match e {
                b'n' => Some(b'\n'),
                b't' => Some(b'\t'),
                b'r' => Some(b'\r'),
                b'a' => Some(7),
                b'b' => Some(8),
                b'f' => Some(12),
                b'v' => Some(11),
                b'\\' | b'\'' | b'"' | b'?' => Some(e),
                _ => None,
            };
            if let Some(b) = simple {
                out.push(b);
                i += 2;
                continue;
            }
            match e {
                b'0'..=b'7' => {
                    let mut v = 0u32;
                    let mut j = i + 1;
                    while j < i + 4 && matches!(self.byte(j), Some(b'0'..=b'7')) {
                        v = v * 8 + u32::from(self.byte(j).unwrap_or(b'0') - b'0');
                        j += 1;
                    }
                    let b = u8::try_from(v).map_err(|_| {
                        Failure::new(i, format!("octal escape \\{v:o} is larger than one byte"))
                    })?;
                    out.push(b);
                    i = j;
                }
                b'x' => {
                    let mut v = 0u32;
                    let mut j = i + 2;
                    while let Some(d) = self.byte(j).and_then(|c| (c as char).to_digit(16)) {
                        v = v.saturating_mul(16).saturating_add(d);
                        j += 1;
                    }
                    if j == i + 2 {
                        return Err(Failure::new(i, "\\x escape without hex digits"));
                    }
                    let b = u8::try_from(v)
                        .map_err(|_| Failure::new(i, "\\x escape is larger than one byte"))?;
                    out.push(b);
                    i = j;
                }
                b'u' | b'U' => {
                    let n = if e == b'u' { 4 } else { 8 };
                    let hex = self
                        .src
                        .get(i + 2..i + 2 + n)
                        .and_then(|h| std::str::from_utf8(h).ok())
                        .and_then(|h| u32::from_str_radix(h, 16).ok())
                        .and_then(char::from_u32)
                        .ok_or_else(|| Failure::new(i, "invalid \\u escape"))?;
                    let mut buf = [0u8; 4];
                    out.extend_from_slice(hex.encode_utf8(&mut buf).as_bytes());
                    i += 2 + n;
                }
                _ => {
                    return Err(Failure::new(
                        i,
                        format!("invalid escape sequence '\\{}'", e as char),
                    ));
                }
            }
        }
    }

    /// Starts a raw read: forgets a peeked token and skips trivia.
    fn raw_start(&mut self) -> Res<usize> {
        self.peeked = None;
        self.pos = self.skip_trivia(self.pos)?;
        Ok(self.pos)
    }

    /// Reads the longest run of bytes satisfying `f`.
    fn raw_word(&mut self, f: impl Fn(u8) -> bool) -> Res<(usize, String)> {
        let start = self.raw_start()?;
        let mut i = start;
        while self.byte(i).is_some_and(&f) {
            i += 1;
        }
        self.pos = i;
        Ok((start, self.slice(start, i)))
    }

    /// Reads a `{...}` dict with balanced braces outside of double-quoted
    /// strings (XLA's `LexJsonDict`), returning it verbatim.
    fn raw_json_dict(&mut self) -> Res<(usize, String)> {
        let start = self.raw_start()?;
        if self.byte(start) != Some(b'{') {
            return Err(Failure::new(start, "expected '{' to start a dict"));
        }
        let mut depth = 0usize;
        let mut i = start;
        loop {
            match self.byte(i) {
                None => return Err(Failure::new(start, "unterminated dict (unbalanced '{')")),
                Some(b'"') => {
                    i += 1;
                    loop {
                        match self.byte(i) {
                            None => {
                                return Err(Failure::new(start, "unterminated string in dict"));
                            }
                            Some(b'\\') => i += 2,
                            Some(b'"') => {
                                i += 1;
                                break;
                            }
                            Some(_) => i += 1,
                        }
                    }
                }
                Some(b'{') => {
                    depth += 1;
                    i += 1;
                }
                Some(b'}') => {
                    depth -= 1;
                    i += 1;
                    if depth == 0 {
                        break;
                    }
                }
                Some(_) => i += 1,
            }
        }
        self.pos = i;
        let text = self
            .text
            .get(start..i)
            .ok_or_else(|| Failure::new(start, "dict is not valid UTF-8"))?;
        Ok((start, text.to_string()))
    }
}

// ---------------------------------------------------------------------------
// Parser: tokens and small values

struct Parser<'a> {
    lex: Lexer<'a>,
    depth: usize,
}

/// An integer as the parser needs it: checked against the target range.
fn parse_i64(text: &str) -> Option<i64> {
    if text.contains(['.', 'e', 'E', 'n', 'i']) {
        return None;
    }
    text.parse().ok()
}

impl<'a> Parser<'a> {
    fn new(text: &'a str) -> Self {
        Parser {
            lex: Lexer::new(text),
            depth: 0,
        }
    }

    fn peek(&mut self) -> Res<&Tok> {
        Ok(&self.lex.peek()?.tok)
    }

    /// Start of the next token.
    fn here(&mut self) -> Res<usize> {
        Ok(self.lex.peek()?.start)
    }

    fn bump(&mut self) -> Res<Token> {
        self.lex.next()
    }

    /// The token after the next one.
    fn peek2(&mut self) -> Res<Tok> {
        let mut ahead = self.lex.clone();
        ahead.next()?;
        Ok(ahead.next()?.tok)
    }

    /// "expected {what}, found {next token}" at the next token.
    fn expected(&mut self, what: &str) -> Failure {
        match self.lex.peek() {
            Ok(t) => Failure::new(
                t.start,
                format!("expected {what}, found {}", t.tok.describe()),
            ),
            Err(e) => e,
        }
    }

    fn is_sym(&mut self, c: char) -> Res<bool> {
        Ok(*self.peek()? == Tok::Sym(c))
    }

    fn eat_sym(&mut self, c: char) -> Res<bool> {
        if self.is_sym(c)? {
            self.bump()?;
            return Ok(true);
        }
        Ok(false)
    }

    /// Expects `c`; `context` completes "expected 'c' {context}".
    fn expect_sym(&mut self, c: char, context: &str) -> Res<usize> {
        if self.is_sym(c)? {
            return Ok(self.bump()?.start);
        }
        let what = if context.is_empty() {
            format!("'{c}'")
        } else {
            format!("'{c}' {context}")
        };
        Err(self.expected(&what))
    }

    fn is_ident(&mut self, word: &str) -> Res<bool> {
        Ok(matches!(self.peek()?, Tok::Ident(w) if w == word))
    }

    fn eat_ident(&mut self, word: &str) -> Res<bool> {
        if self.is_ident(word)? {
            self.bump()?;
            return Ok(true);
        }
        Ok(false)
    }

    fn ident(&mut self, what: &str) -> Res<(String, usize)> {
        if let Tok::Ident(w) = self.peek()? {
            let w = w.clone();
            let t = self.bump()?;
            return Ok((w, t.start));
        }
        Err(self.expected(what))
    }

    /// An instruction or computation name: `%name` or a bare identifier.
    fn name(&mut self, what: &str) -> Res<(String, usize)> {
        match self.peek()? {
            Tok::Name(n) | Tok::Ident(n) => {
                let n = n.clone();
                let t = self.bump()?;
                Ok((n, t.start))
            }
            _ => Err(self.expected(what)),
        }
    }

    fn int(&mut self, what: &str) -> Res<i64> {
        if let Tok::Number(text) = self.peek()? {
            let text = text.clone();
            let at = self.here()?;
            let v = parse_i64(&text).ok_or_else(|| {
                if text.contains(['.', 'e', 'E', 'n', 'i']) {
                    Failure::new(at, format!("expected {what}, found '{text}'"))
                } else {
                    Failure::new(at, format!("integer {text} is out of range"))
                }
            })?;
            self.bump()?;
            return Ok(v);
        }
        Err(self.expected(what))
    }

    fn int32(&mut self, what: &str) -> Res<i32> {
        let at = self.here()?;
        let v = self.int(what)?;
        i32::try_from(v).map_err(|_| Failure::new(at, format!("{v} is out of range for {what}")))
    }

    /// A non-negative integer.
    fn count(&mut self, what: &str) -> Res<i64> {
        let at = self.here()?;
        let v = self.int(what)?;
        if v < 0 {
            return Err(Failure::new(
                at,
                format!("{what} must not be negative, found {v}"),
            ));
        }
        Ok(v)
    }

    fn float(&mut self, what: &str) -> Res<f64> {
        let at = self.here()?;
        let v = match self.peek()?.clone() {
            Tok::Number(text) => float_value(&text)
                .ok_or_else(|| Failure::new(at, format!("invalid number '{text}'")))?,
            Tok::Ident(w) if w == "inf" => f64::INFINITY,
            Tok::Ident(w) if w == "nan" => f64::NAN,
            _ => return Err(self.expected(what)),
        };
        self.bump()?;
        Ok(v)
    }

    fn bool(&mut self, what: &str) -> Res<bool> {
        if self.eat_ident("true")? {
            return Ok(true);
        }
        if self.eat_ident("false")? {
            return Ok(false);
        }
        Err(self.expected(&format!("true or false for {what}")))
    }

    fn bytes(&mut self, what: &str) -> Res<Vec<u8>> {
        if let Tok::Str(s) = self.peek()? {
            let s = s.clone();
            self.bump()?;
            return Ok(s);
        }
        Err(self.expected(what))
    }

    fn string(&mut self, what: &str) -> Res<String> {
        let at = self.here()?;
        let b = self.bytes(what)?;
        String::from_utf8(b).map_err(|_| Failure::new(at, format!("{what} is not valid UTF-8")))
    }

    /// `{1,2,3}` (or `{}`).
    fn int_list(&mut self, what: &str) -> Res<Vec<i64>> {
        self.list('{', '}', what, |p| p.int("an integer"))
    }

    /// `open item (',' item)* close`, possibly empty.
    fn list<T>(
        &mut self,
        open: char,
        close: char,
        what: &str,
        mut item: impl FnMut(&mut Self) -> Res<T>,
    ) -> Res<Vec<T>> {
        self.expect_sym(open, &format!("to start {what}"))?;
        let mut out = Vec::new();
        if self.eat_sym(close)? {
            return Ok(out);
        }
        loop {
            out.push(item(self)?);
            if self.eat_sym(',')? {
                continue;
            }
            self.expect_sym(close, &format!("to end {what}"))?;
            return Ok(out);
        }
    }

    /// `{{1,2},{3}}`.
    fn int_list_list(&mut self, what: &str) -> Res<Vec<Vec<i64>>> {
        self.list('{', '}', what, |p| p.int_list(what))
    }

    fn enter(&mut self) -> Res<()> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            let at = self.here()?;
            return Err(Failure::new(
                at,
                format!("nesting deeper than {MAX_DEPTH} levels"),
            ));
        }
        Ok(())
    }

    fn leave(&mut self) {
        self.depth = self.depth.saturating_sub(1);
    }
}

/// The value of a number token, `inf`/`-inf` and NaNs included.
fn float_value(text: &str) -> Option<f64> {
    match text {
        "inf" => return Some(f64::INFINITY),
        "-inf" => return Some(f64::NEG_INFINITY),
        _ => {}
    }
    if text.contains("nan") {
        return Some(if text.starts_with('-') {
            -f64::NAN
        } else {
            f64::NAN
        });
    }
    // An integer token is an int64 converted to double (so `-0` is +0),
    // as in XLA's lexer.
    if let Some(i) = parse_i64(text) {
        return Some(i as f64);
    }
    let v: f64 = text.parse().ok()?;
    v.is_finite().then_some(v)
}

// ---------------------------------------------------------------------------
// Module, stack frames, computations

/// What the module header says.
#[derive(Default)]
struct Header {
    name: String,
    is_scheduled: bool,
    /// `entry_computation_layout`: parameter shapes and the result shape.
    layout: Option<(Vec<ShapeProto>, ShapeProto)>,
    counts: DeviceCounts,
    input_output_alias: Option<HloInputOutputAliasProto>,
    buffer_donor: Option<HloBufferDonorProto>,
    frontend_attributes: Option<FrontendAttributes>,
}

/// A computation as read, before computation names are resolved.
struct CompText {
    name: String,
    name_at: usize,
    id: i64,
    is_entry: bool,
    entry_at: usize,
    instrs: Vec<HloInstructionProto>,
    /// Where each instruction's name is, for later errors.
    instr_at: Vec<usize>,
    /// Each instruction's called computations, by name, in proto order.
    calls: Vec<Vec<(String, usize)>>,
    by_name: HashMap<String, usize>,
    root: Option<usize>,
    execution_thread: String,
}

impl<'a> Parser<'a> {
    fn module(&mut self) -> Res<ParsedText> {
        if !self.eat_ident("HloModule")? {
            return Err(self.expected("'HloModule' at the start of the module"));
        }
        let (name, _) = self.name("the module name")?;
        let mut header = Header {
            name,
            ..Header::default()
        };
        let mut seen = HashSet::new();
        while self.eat_sym(',')? {
            self.header_attribute(&mut header, &mut seen)?;
        }
        let frames = self.stack_frames()?;
        let mut comps = Vec::new();
        while *self.peek()? != Tok::Eof {
            let id = i64::try_from(comps.len() + 1).unwrap_or(i64::MAX);
            comps.push(self.computation(id)?);
        }
        if comps.is_empty() {
            return Err(self.expected("a computation"));
        }
        assemble(header, comps, frames)
    }

    fn header_attribute(&mut self, h: &mut Header, seen: &mut HashSet<String>) -> Res<()> {
        let (key, at) = self.ident("a module attribute")?;
        self.expect_sym('=', &format!("after '{key}'"))?;
        if !seen.insert(key.clone()) {
            return Err(Failure::new(
                at,
                format!("duplicate module attribute '{key}'"),
            ));
        }
        match key.as_str() {
            "is_scheduled" => h.is_scheduled = self.bool(&key)?,
            "replica_count" => h.counts.replica_count = Some(self.count(&key)?),
            "num_partitions" => h.counts.num_partitions = Some(self.count(&key)?),
            "entry_computation_layout" => {
                self.expect_sym('{', "to start the entry computation layout")?;
                let params = self.list('(', ')', "the parameter shapes", |p| p.shape())?;
                if *self.peek()? != Tok::Arrow {
                    return Err(self.expected("'->' before the result shape"));
                }
                self.bump()?;
                let result = self.shape()?;
                self.expect_sym('}', "to end the entry computation layout")?;
                h.layout = Some((params, result));
            }
            "input_output_alias" => {
                let entries = self.list('{', '}', "input_output_alias", |p| {
                    let output_shape_index = p.int_list("an output shape index")?;
                    p.expect_sym(':', "after the output shape index")?;
                    p.expect_sym('(', "before the aliased parameter")?;
                    let parameter_number = p.count("a parameter number")?;
                    p.expect_sym(',', "after the parameter number")?;
                    let parameter_shape_index = p.int_list("a parameter shape index")?;
                    let mut kind = 1; // XLA's default: may-alias
                    if p.eat_sym(',')? {
                        let (k, at) = p.ident("may-alias or must-alias")?;
                        kind = match k.as_str() {
                            "may-alias" => 1,
                            "must-alias" => 2,
                            _ => {
                                return Err(Failure::new(
                                    at,
                                    format!("expected may-alias or must-alias, found '{k}'"),
                                ));
                            }
                        };
                    }
                    p.expect_sym(')', "after the aliased parameter")?;
                    Ok(AliasEntryProto {
                        output_shape_index,
                        parameter_number,
                        parameter_shape_index,
                        kind,
                    })
                })?;
                h.input_output_alias = Some(HloInputOutputAliasProto { entries });
            }
            "buffer_donor" => {
                let entries = self.list('{', '}', "buffer_donor", |p| {
                    p.expect_sym('(', "before a buffer donor")?;
                    let parameter_number = p.count("a parameter number")?;
                    p.expect_sym(',', "after the parameter number")?;
                    let parameter_shape_index = p.int_list("a parameter shape index")?;
                    p.expect_sym(')', "after the buffer donor")?;
                    Ok(BufferDonorEntryProto {
                        parameter_number,
                        parameter_shape_index,
                    })
                })?;
                h.buffer_donor = Some(HloBufferDonorProto { entries });
            }
            "frontend_attributes" => h.frontend_attributes = Some(self.frontend_attributes()?),
            // Module config, not part of an HloModuleProto (XLA's parser puts
            // them into the HloModuleConfig): read and dropped.
            "alias_passthrough_params" => {
                self.bool(&key)?;
            }
            "allow_spmd_sharding_propagation_to_parameters"
            | "allow_spmd_sharding_propagation_to_output" => {
                if self.is_sym('{')? {
                    self.list('{', '}', &key, |p| p.bool("a list entry"))?;
                } else {
                    self.bool(&key)?;
                }
            }
            "origin_recovery_table" => {
                return Err(Failure::new(
                    at,
                    "module attribute 'origin_recovery_table' is not supported",
                ));
            }
            _ => {
                return Err(Failure::new(
                    at,
                    format!("unknown module attribute '{key}'"),
                ));
            }
        }
        Ok(())
    }

    /// The `FileNames` ... `StackFrames` tables, if present.
    fn stack_frames(&mut self) -> Res<Option<StackFrameIndexProto>> {
        if !self.eat_ident("FileNames")? {
            return Ok(None);
        }
        let mut index = StackFrameIndexProto::default();
        while matches!(self.peek()?, Tok::Number(_)) {
            self.table_index(index.file_names.len())?;
            index.file_names.push(self.string("a file name")?);
        }
        if !self.eat_ident("FunctionNames")? {
            return Err(self.expected("'FunctionNames'"));
        }
        while matches!(self.peek()?, Tok::Number(_)) {
            self.table_index(index.function_names.len())?;
            index.function_names.push(self.string("a function name")?);
        }
        if !self.eat_ident("FileLocations")? {
            return Err(self.expected("'FileLocations'"));
        }
        while matches!(self.peek()?, Tok::Number(_)) {
            self.table_index(index.file_locations.len())?;
            let at = self.here()?;
            let mut l = FileLocation::default();
            let mut seen = HashSet::new();
            self.sub_attributes("a file location", |p, key, at| {
                let v = p.int32(key)?;
                match key {
                    "file_name_id" => l.file_name_id = v,
                    "function_name_id" => l.function_name_id = v,
                    "line" => l.line = v,
                    "end_line" => l.end_line = v,
                    "column" => l.column = v,
                    "end_column" => l.end_column = v,
                    _ => {
                        return Err(Failure::new(
                            at,
                            format!("unknown file location field '{key}'"),
                        ));
                    }
                }
                seen.insert(key.to_string());
                Ok(())
            })?;
            require(
                &seen,
                &[
                    "file_name_id",
                    "function_name_id",
                    "line",
                    "end_line",
                    "column",
                    "end_column",
                ],
                at,
            )?;
            index.file_locations.push(l);
        }
        if !self.eat_ident("StackFrames")? {
            return Err(self.expected("'StackFrames'"));
        }
        while matches!(self.peek()?, Tok::Number(_)) {
            self.table_index(index.stack_frames.len())?;
            let at = self.here()?;
            let mut f = StackFrame::default();
            let mut seen = HashSet::new();
            self.sub_attributes("a stack frame", |p, key, at| {
                let v = p.int32(key)?;
                match key {
                    "file_location_id" => f.file_location_id = v,
                    // XLA prints parent ids one up (0, "no parent", prints as 1).
                    "parent_frame_id" => f.parent_frame_id = v.saturating_sub(1),
                    _ => {
                        return Err(Failure::new(
                            at,
                            format!("unknown stack frame field '{key}'"),
                        ));
                    }
                }
                seen.insert(key.to_string());
                Ok(())
            })?;
            require(&seen, &["file_location_id", "parent_frame_id"], at)?;
            index.stack_frames.push(f);
        }
        Ok(Some(index))
    }

    /// The 1-based row number in front of each stack-frame table row.
    fn table_index(&mut self, rows_so_far: usize) -> Res<()> {
        let at = self.here()?;
        let n = self.int("a table row number")?;
        if usize::try_from(n).ok() != Some(rows_so_far + 1) {
            return Err(Failure::new(
                at,
                format!("expected row number {}, found {n}", rows_so_far + 1),
            ));
        }
        Ok(())
    }

    /// `{ key=value ... }` with optional commas between entries; `f` reads
    /// each value. Duplicate keys are errors.
    fn sub_attributes(
        &mut self,
        what: &str,
        mut f: impl FnMut(&mut Self, &str, usize) -> Res<()>,
    ) -> Res<()> {
        self.expect_sym('{', &format!("to start {what}"))?;
        let mut seen = HashSet::new();
        loop {
            self.eat_sym(',')?;
            if self.eat_sym('}')? {
                return Ok(());
            }
            let (key, at) = self.ident(&format!("a field of {what} or '}}'"))?;
            self.expect_sym('=', &format!("after '{key}'"))?;
            if !seen.insert(key.clone()) {
                return Err(Failure::new(
                    at,
                    format!("duplicate field '{key}' in {what}"),
                ));
            }
            f(self, &key, at)?;
        }
    }

    fn computation(&mut self, id: i64) -> Res<CompText> {
        let entry_at = self.here()?;
        let is_entry = self.eat_ident("ENTRY")?;
        let (name, name_at) = self.name("a computation name")?;
        let mut declared_result = None;
        if self.is_sym('(')? {
            self.list('(', ')', "the parameter list", |p| {
                p.name("a parameter name")?;
                p.expect_sym(':', "after the parameter name")?;
                p.shape()
            })?;
            if *self.peek()? != Tok::Arrow {
                return Err(self.expected("'->' after the parameter list"));
            }
            self.bump()?;
            let at = self.here()?;
            declared_result = Some((self.shape()?, at));
        }
        self.expect_sym('{', &format!("to start the body of computation '{name}'"))?;
        let mut comp = CompText {
            name,
            name_at,
            id,
            is_entry,
            entry_at,
            instrs: Vec::new(),
            instr_at: Vec::new(),
            calls: Vec::new(),
            by_name: HashMap::new(),
            root: None,
            execution_thread: String::new(),
        };
        if self.is_sym('}')? {
            return Err(self.expected("an instruction"));
        }
        while !self.eat_sym('}')? {
            if *self.peek()? == Tok::Eof {
                return Err(self.expected(&format!("'}}' to end computation '{}'", comp.name)));
            }
            self.instruction(&mut comp)?;
        }
        let mut seen = HashSet::new();
        while self.eat_sym(',')? {
            let (key, at) = self.ident("a computation attribute")?;
            self.expect_sym('=', &format!("after '{key}'"))?;
            if !seen.insert(key.clone()) {
                return Err(Failure::new(at, format!("duplicate attribute '{key}'")));
            }
            match key.as_str() {
                // XLA writes the main thread as "" in protos.
                "execution_thread" => {
                    let t = self.string("an execution thread")?;
                    comp.execution_thread = if t == "main" { String::new() } else { t };
                }
                _ => {
                    return Err(Failure::new(
                        at,
                        format!("unknown computation attribute '{key}'"),
                    ));
                }
            }
        }
        let root = comp.root.unwrap_or(comp.instrs.len().saturating_sub(1));
        comp.root = Some(root);
        if let (Some((declared, at)), Some(root)) = (declared_result, comp.instrs.get(root)) {
            let actual = root.shape.clone().unwrap_or_default();
            if !shape::compatible(&declared, &actual) {
                return Err(Failure::new(
                    at,
                    format!(
                        "computation '{}' declares result {}, but its root '{}' is {}",
                        comp.name,
                        shape::describe(&declared),
                        root.name,
                        shape::describe(&actual)
                    ),
                ));
            }
        }
        Ok(comp)
    }
}

fn require(seen: &HashSet<String>, keys: &[&str], at: usize) -> Res<()> {
    for k in keys {
        if !seen.contains(*k) {
            return Err(Failure::new(at, format!("missing field '{k}'")));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Instructions

/// An instruction being read.
struct Instr {
    proto: HloInstructionProto,
    operand_shapes: Vec<ShapeProto>,
    /// Attribute names seen so far.
    seen: HashSet<String>,
    /// Computation-valued attributes in text order: (attribute, names).
    calls: Vec<(String, Vec<(String, usize)>)>,
    operand_precision: Option<Vec<i32>>,
    algorithm: Option<i32>,
}

/// The real opcodes ending in `-start`/`-update`/`-done`. Any other
/// `X-start` (and so on) with `X` an opcode is XLA's async syntax sugar for
/// an `async-start` wrapping `X`.
const REAL_ASYNC_OPCODES: &[&str] = &[
    "all-gather-start",
    "all-gather-done",
    "all-reduce-start",
    "all-reduce-done",
    "collective-permute-start",
    "collective-permute-done",
    "copy-start",
    "copy-done",
    "async-start",
    "async-update",
    "async-done",
    "send-done",
    "recv-done",
];

impl<'a> Parser<'a> {
    fn instruction(&mut self, comp: &mut CompText) -> Res<()> {
        let root_at = self.here()?;
        let is_root = self.eat_ident("ROOT")?;
        let (name, name_at) = self.name("an instruction name")?;
        if comp.by_name.contains_key(&name) {
            return Err(Failure::new(
                name_at,
                format!(
                    "instruction '{name}' is already defined in computation '{}'",
                    comp.name
                ),
            ));
        }
        self.expect_sym('=', &format!("after instruction name '{name}'"))?;
        let typed = matches!(self.peek()?, Tok::Ident(_)) && self.peek2()? == Tok::Sym('[');
        if !typed && !self.can_be_shape()? {
            return Err(self.expected(&format!("the shape of '{name}'")));
        }
        let shape = self.shape()?;
        let (opcode, op_at) = self.ident("an opcode")?;
        for suffix in ["-start", "-update", "-done"] {
            if let Some(wrapped) = opcode.strip_suffix(suffix) {
                if !REAL_ASYNC_OPCODES.contains(&opcode.as_str()) && is_known_opcode(wrapped) {
                    return Err(Failure::new(
                        op_at,
                        format!(
                            "'{opcode}' is XLA's async syntax sugar, which is not supported; \
                             print the module with syntax_sugar_async_ops=false"
                        ),
                    ));
                }
            }
        }
        let local = i64::try_from(comp.instrs.len() + 1).unwrap_or(i64::MAX);
        let mut ins = Instr {
            proto: HloInstructionProto {
                name: name.clone(),
                opcode: opcode.clone(),
                shape: Some(shape),
                id: (comp.id << 32) | local,
                ..Default::default()
            },
            operand_shapes: Vec::new(),
            seen: HashSet::new(),
            calls: Vec::new(),
            operand_precision: None,
            algorithm: None,
        };
        match opcode.as_str() {
            "parameter" => {
                self.expect_sym('(', "before the parameter number")?;
                ins.proto.parameter_number = self.count("a parameter number")?;
                self.expect_sym(')', "after the parameter number")?;
            }
            "constant" => {
                self.expect_sym('(', "before the constant's value")?;
                let shape = ins.proto.shape.clone().unwrap_or_default();
                ins.proto.literal = Some(Box::new(self.literal(&shape)?));
                self.expect_sym(')', "after the constant's value")?;
            }
            _ => self.operands(&mut ins, comp)?,
        }
        while self.eat_sym(',')? {
            self.attribute(&mut ins, comp)?;
        }
        let calls = Self::finish_instruction(&mut ins);
        let idx = comp.instrs.len();
        if is_root {
            if comp.root.is_some() {
                return Err(Failure::new(
                    root_at,
                    format!("computation '{}' has more than one ROOT", comp.name),
                ));
            }
            comp.root = Some(idx);
        }
        comp.by_name.insert(name, idx);
        comp.instrs.push(ins.proto);
        comp.instr_at.push(name_at);
        comp.calls.push(calls);
        Ok(())
    }

    /// `(` (shape? name),* `)`: operands must already be defined.
    fn operands(&mut self, ins: &mut Instr, comp: &CompText) -> Res<()> {
        self.expect_sym('(', "after the opcode")?;
        if self.eat_sym(')')? {
            return Ok(());
        }
        loop {
            let declared = if self.can_be_shape()? {
                Some(self.shape()?)
            } else {
                None
            };
            let (name, at) = self.name("an operand name")?;
            let operand = comp
                .by_name
                .get(&name)
                .and_then(|&k| comp.instrs.get(k))
                .ok_or_else(|| {
                    Failure::new(
                        at,
                        format!(
                            "undefined instruction '{name}' (operands must be defined before use)"
                        ),
                    )
                })?;
            let actual = operand.shape.clone().unwrap_or_default();
            if let Some(declared) = declared {
                if !shape::compatible(&declared, &actual) {
                    return Err(Failure::new(
                        at,
                        format!(
                            "operand '{name}' is {}, not {} as written",
                            shape::describe(&actual),
                            shape::describe(&declared)
                        ),
                    ));
                }
            }
            ins.proto.operand_ids.push(operand.id);
            ins.operand_shapes.push(actual);
            if self.eat_sym(',')? {
                continue;
            }
            self.expect_sym(')', "after the operands")?;
            return Ok(());
        }
    }

    /// Whether the next tokens start a shape (`(` or `type[`).
    fn can_be_shape(&mut self) -> Res<bool> {
        match self.peek()?.clone() {
            Tok::Sym('(') => Ok(true),
            Tok::Ident(t) => Ok(
                type_from_name(&t).is_some_and(|ty| ty != PrimitiveType::Tuple)
                    && self.peek2()? == Tok::Sym('['),
            ),
            _ => Ok(false),
        }
    }

    /// Fills what XLA's parser fills when the text leaves it out, and orders
    /// the called computations the way XLA stores them.
    fn finish_instruction(ins: &mut Instr) -> Vec<(String, usize)> {
        let n = ins.operand_shapes.len();
        let p = &mut ins.proto;
        let seen = |k: &str| ins.seen.contains(k);
        let precision = |n: usize, ins_prec: &Option<Vec<i32>>, alg: Option<i32>| PrecisionConfig {
            operand_precision: ins_prec.clone().unwrap_or_else(|| vec![0; n]),
            algorithm: alg.unwrap_or(0),
        };
        match p.opcode.as_str() {
            "dot" => {
                p.dot_dimension_numbers.get_or_insert_with(Box::default);
                p.precision_config = Some(Box::new(precision(
                    n,
                    &ins.operand_precision,
                    ins.algorithm,
                )));
            }
            "ragged-dot" => {
                let r = p
                    .ragged_dot_dimension_numbers
                    .get_or_insert_with(Box::default);
                r.dot_dimension_numbers
                    .get_or_insert_with(DotDimensionNumbers::default);
                p.precision_config = Some(Box::new(precision(
                    2,
                    &ins.operand_precision,
                    ins.algorithm,
                )));
            }
            "scaled-dot" => {
                p.dot_dimension_numbers.get_or_insert_with(Box::default);
                p.precision_config = Some(Box::new(precision(
                    2,
                    &ins.operand_precision,
                    ins.algorithm,
                )));
            }
            "convolution" => {
                p.window.get_or_insert_with(Box::default);
                // XLA's convolutions always carry a (here empty) sparsity config.
                p.sparsity_config.get_or_insert_with(Box::default);
                if !seen("feature_group_count") {
                    p.feature_group_count = 1;
                }
                if !seen("batch_group_count") {
                    p.batch_group_count = 1;
                }
                p.precision_config = Some(Box::new(precision(
                    n,
                    &ins.operand_precision,
                    ins.algorithm,
                )));
            }
            "custom-call" => {
                if !seen("feature_group_count") {
                    p.feature_group_count = 1;
                }
                if !seen("batch_group_count") {
                    p.batch_group_count = 1;
                }
                if !seen("api_version") {
                    p.custom_call_api_version = 1; // API_VERSION_ORIGINAL
                }
                p.precision_config = Some(Box::new(precision(
                    n,
                    &ins.operand_precision,
                    ins.algorithm,
                )));
            }
            "reduce-window" | "select-and-scatter" => {
                p.window.get_or_insert_with(Box::default);
            }
            "compare" if !seen("type") => {
                let ty = ins.operand_shapes.first().map_or(0, |s| s.element_type);
                p.comparison_type = default_comparison_type(ty).to_string();
            }
            "topk" if !seen("largest") => p.largest = true,
            // XLA keeps the thread on the start only, and "main" as "".
            "async-start" if p.async_execution_thread == "main" => {
                p.async_execution_thread.clear();
            }
            // XLA derives these from their start op: the proto of an
            // async-update/-done carries neither thread nor computation.
            "async-update" | "async-done" => {
                p.async_execution_thread.clear();
                ins.calls.clear();
            }
            _ => {}
        }
        if p.sharding.is_some() {
            if let (Some(s), Some(sh)) = (p.sharding.take(), p.shape.as_ref()) {
                p.sharding = Some(Box::new(normalize_tuple_sharding(*s, sh)));
            }
        }
        let take = |calls: &mut Vec<(String, Vec<(String, usize)>)>, key: &str| {
            calls
                .iter()
                .position(|(k, _)| k == key)
                .map(|i| calls.remove(i).1)
                .unwrap_or_default()
        };
        let calls = &mut ins.calls;
        let mut ordered = match p.opcode.as_str() {
            "while" => {
                let mut v = take(calls, "body");
                v.extend(take(calls, "condition"));
                v
            }
            "select-and-scatter" => {
                let mut v = take(calls, "select");
                v.extend(take(calls, "scatter"));
                v
            }
            "conditional" => {
                let mut v = take(calls, "true_computation");
                v.extend(take(calls, "false_computation"));
                v
            }
            _ => Vec::new(),
        };
        for (_, names) in calls.drain(..) {
            ordered.extend(names);
        }
        ordered
    }
}

/// XLA's `Comparison::DefaultComparisonType`.
fn default_comparison_type(element_type: i32) -> &'static str {
    let name = shape::type_name(element_type).unwrap_or("");
    if shape::is_float(element_type) || name.starts_with('c') {
        "FLOAT"
    } else if name.starts_with('s') {
        "SIGNED"
    } else {
        "UNSIGNED"
    }
}

/// A single sharding on a tuple-shaped instruction applies to every leaf
/// (XLA's `NormalizeTupleSharding`).
fn normalize_tuple_sharding(s: OpSharding, sh: &ShapeProto) -> OpSharding {
    if !shape::is_tuple(sh) || s.r#type == op_sharding::Type::Tuple as i32 {
        return s;
    }
    fn leaves(s: &ShapeProto) -> usize {
        if shape::is_tuple(s) {
            s.tuple_shapes.iter().map(leaves).sum()
        } else {
            1
        }
    }
    OpSharding {
        r#type: op_sharding::Type::Tuple as i32,
        tuple_shardings: vec![s; leaves(sh)],
        ..Default::default()
    }
}

/// Every opcode XLA's `StringToHloOpcode` knows.
fn is_known_opcode(op: &str) -> bool {
    #[rustfmt::skip]
    const OPCODES: &[&str] = &[
        "abs", "acos", "acosh", "add", "add-dependency", "after-all", "all-gather",
        "all-gather-done", "all-gather-start", "all-reduce", "all-reduce-done", "all-reduce-start",
        "all-to-all", "and", "asin", "asinh", "async-done", "async-start", "async-update", "atan2",
        "atanh", "batch-norm-grad", "batch-norm-inference", "batch-norm-training", "bitcast",
        "bitcast-convert", "broadcast", "call", "cbrt", "ceil", "cholesky", "clamp",
        "collective-broadcast", "collective-permute", "collective-permute-done",
        "collective-permute-start", "count-leading-zeros", "compare", "complex", "concatenate",
        "conditional", "constant", "convert", "convolution", "copy", "copy-done", "copy-start",
        "cosine", "cosh", "custom-call", "divide", "domain", "dot", "dynamic-reshape",
        "dynamic-slice", "dynamic-update-slice", "erf", "exponential", "exponential-minus-one",
        "fft", "floor", "fusion", "gather", "get-dimension-size", "get-tuple-element", "imag",
        "infeed", "iota", "is-finite", "log", "log-plus-one", "logistic", "map", "maximum",
        "minimum", "multiply", "negate", "not", "opt-barrier", "optimization-barrier", "or",
        "outfeed", "pad", "parameter", "partition-id", "popcnt", "power", "ragged-all-to-all",
        "ragged-dot", "real", "recv", "recv-done", "reduce", "reduce-precision", "reduce-scatter",
        "reduce-window", "remainder", "replica-id", "reshape", "reverse", "rng",
        "rng-bit-generator", "rng-get-and-update-state", "round-nearest-afz", "round-nearest-even",
        "rsqrt", "scan", "scaled-dot", "scatter", "select", "select-and-scatter", "send",
        "send-done", "set-dimension-size", "shift-left", "shift-right-arithmetic",
        "shift-right-logical", "sign", "sine", "sinh", "slice", "sort", "sqrt",
        "stochastic-convert", "subtract", "tan", "tanh", "topk", "transpose", "triangular-solve",
        "tuple", "while", "xor",
    ];
    OPCODES.contains(&op)
}

// ---------------------------------------------------------------------------
// Instruction attributes

impl<'a> Parser<'a> {
    /// One `name=value` after the operands.
    fn attribute(&mut self, ins: &mut Instr, comp: &CompText) -> Res<()> {
        let (key, at) = self.ident("an attribute name")?;
        self.expect_sym('=', &format!("after attribute name '{key}'"))?;
        if !ins.seen.insert(key.clone()) {
            return Err(Failure::new(at, format!("duplicate attribute '{key}'")));
        }
        let op = ins.proto.opcode.clone();
        let p = &mut ins.proto;
        match key.as_str() {
            // Attributes of every instruction.
            "sharding" => p.sharding = Some(Box::new(self.sharding()?)),
            "frontend_attributes" => {
                p.frontend_attributes = Some(Box::new(self.frontend_attributes()?))
            }
            "metadata" => p.metadata = Some(self.metadata()?),
            "backend_config" => p.backend_config = self.string_or_dict("a backend config")?,
            "control-predecessors" => {
                p.control_predecessor_ids = self.list('{', '}', "control-predecessors", |q| {
                    let (name, at) = q.name("an instruction name")?;
                    comp.by_name
                        .get(&name)
                        .and_then(|&k| comp.instrs.get(k))
                        .map(|i| i.id)
                        .ok_or_else(|| {
                            Failure::new(
                                at,
                                format!("undefined instruction '{name}' in control-predecessors"),
                            )
                        })
                })?;
            }
            "statistics" => p.statistics_viz = Some(Box::new(self.statistics()?)),
            "origin" => p.original_value = Some(Box::new(self.original_value()?)),
            "result_accuracy" => p.result_accuracy = Some(Box::new(self.result_accuracy()?)),
            "parameter_replication" => {
                p.parameter_replication = Some(Box::new(ParameterReplication {
                    replicated_at_leaf_buffers: self.list('{', '}', &key, |q| q.bool("a leaf"))?,
                }));
            }
            // Called computations; ordered in `finish_instruction`.
            "to_apply" | "condition" | "body" | "select" | "scatter" | "true_computation"
            | "false_computation" => {
                let c = self.computation_ref()?;
                ins.calls.push((key, vec![c]));
            }
            "calls" => {
                let cs = if self.is_sym('{')? {
                    self.list('{', '}', "a computation list", |q| q.computation_ref())?
                } else {
                    vec![self.computation_ref()?]
                };
                ins.calls.push((key, cs));
            }
            "branch_computations" | "called_computations" => {
                let cs = self.list('{', '}', "a computation list", |q| q.computation_ref())?;
                ins.calls.push((key, cs));
            }
            // Dimensions and indices.
            "dimensions" => p.dimensions = self.int_list(&key)?,
            "iota_dimension" | "inferred_dimension" => p.dimensions = vec![self.int(&key)?],
            "index" => p.tuple_index = self.int(&key)?,
            "slice" => {
                p.slice_dimensions = self.list('{', '}', "slice ranges", |q| {
                    q.expect_sym('[', "to start a slice range")?;
                    let start = q.int("a slice start")?;
                    q.expect_sym(':', "after the slice start")?;
                    let limit = q.int("a slice limit")?;
                    let stride = if q.eat_sym(':')? {
                        q.int("a slice stride")?
                    } else {
                        1
                    };
                    q.expect_sym(']', "to end a slice range")?;
                    Ok(SliceDimensions {
                        start,
                        limit,
                        stride,
                    })
                })?;
            }
            "dynamic_slice_sizes" => p.dynamic_slice_sizes = self.int_list(&key)?,
            "slice_sizes" => {
                if op.starts_with("collective-permute") {
                    p.dynamic_slice_sizes = if self.is_sym('{')? && self.peek2()? == Tok::Sym('{') {
                        self.int_list_list(&key)?.into_iter().flatten().collect()
                    } else {
                        self.int_list(&key)?
                    };
                } else {
                    p.gather_slice_sizes = self.int_list(&key)?;
                }
            }
            "padding" => p.padding_config = Some(Box::new(self.padding_config()?)),
            "is_stable" => p.is_stable = self.bool(&key)?,
            "direction" => {
                let (d, at) = self.ident("a comparison direction")?;
                if !["EQ", "NE", "GE", "GT", "LE", "LT"].contains(&d.as_str()) {
                    return Err(Failure::new(
                        at,
                        format!("unknown comparison direction '{d}'"),
                    ));
                }
                p.comparison_direction = d;
            }
            "type" => {
                let (t, at) = self.ident("a comparison type")?;
                if !["FLOAT", "TOTALORDER", "SIGNED", "UNSIGNED"].contains(&t.as_str()) {
                    return Err(Failure::new(at, format!("unknown comparison type '{t}'")));
                }
                p.comparison_type = t;
            }
            "kind" => p.fusion_kind = self.ident("a fusion kind")?.0,
            // dot, ragged-dot, scaled-dot.
            "lhs_batch_dims"
            | "lhs_contracting_dims"
            | "rhs_batch_dims"
            | "rhs_contracting_dims" => {
                let v = self.int_list(&key)?;
                let d = if op == "ragged-dot" {
                    p.ragged_dot_dimension_numbers
                        .get_or_insert_with(Box::default)
                        .dot_dimension_numbers
                        .get_or_insert_with(DotDimensionNumbers::default)
                } else {
                    p.dot_dimension_numbers.get_or_insert_with(Box::default)
                };
                match key.as_str() {
                    "lhs_batch_dims" => d.lhs_batch_dimensions = v,
                    "lhs_contracting_dims" => d.lhs_contracting_dimensions = v,
                    "rhs_batch_dims" => d.rhs_batch_dimensions = v,
                    _ => d.rhs_contracting_dimensions = v,
                }
            }
            "lhs_ragged_dims" | "rhs_group_dims" => {
                let v = self.int_list(&key)?;
                let r = p
                    .ragged_dot_dimension_numbers
                    .get_or_insert_with(Box::default);
                if key == "lhs_ragged_dims" {
                    r.lhs_ragged_dimensions = v;
                } else {
                    r.rhs_group_dimensions = v;
                }
            }
            "operand_precision" => {
                ins.operand_precision = Some(self.list('{', '}', &key, |q| {
                    let (w, at) = q.ident("a precision")?;
                    match w.to_ascii_lowercase().as_str() {
                        "default" => Ok(0),
                        "high" => Ok(1),
                        "highest" => Ok(2),
                        "packed_nibble" => Ok(3),
                        _ => Err(Failure::new(at, format!("unknown precision '{w}'"))),
                    }
                })?);
            }
            "algorithm" => {
                let (w, at) = self.ident("an algorithm")?;
                if op == "rng-bit-generator" {
                    p.rng_algorithm = match w.as_str() {
                        "rng_default" => 0,
                        "rng_three_fry" => 1,
                        "rng_philox" => 2,
                        _ => return Err(Failure::new(at, format!("unknown rng algorithm '{w}'"))),
                    };
                } else {
                    let upper = w.to_ascii_uppercase();
                    let name = if upper.starts_with("ALG_") {
                        upper
                    } else {
                        format!("ALG_{upper}")
                    };
                    let alg = crate::proto::precision_config::Algorithm::from_str_name(&name)
                        .ok_or_else(|| Failure::new(at, format!("unknown dot algorithm '{w}'")))?;
                    ins.algorithm = Some(alg as i32);
                }
            }
            // convolution (and convolution-like custom calls).
            "window" => p.window = Some(Box::new(self.window()?)),
            "dim_labels" => p.convolution_dimension_numbers = Some(Box::new(self.dim_labels()?)),
            "feature_group_count" => p.feature_group_count = self.int(&key)?,
            "batch_group_count" => p.batch_group_count = self.int(&key)?,
            "conv_kind" => {
                let (w, at) = self.ident("a convolution kind")?;
                p.conv_kind = match w.as_str() {
                    "unset" => 0,
                    "fprop" => 1,
                    "dgrad" => 2,
                    "wgrad" => 3,
                    _ => return Err(Failure::new(at, format!("unknown convolution kind '{w}'"))),
                };
            }
            // gather and scatter.
            "offset_dims"
            | "collapsed_slice_dims"
            | "start_index_map"
            | "operand_batching_dims"
            | "start_indices_batching_dims" => {
                let v = self.int_list(&key)?;
                let g = p.gather_dimension_numbers.get_or_insert_with(Box::default);
                match key.as_str() {
                    "offset_dims" => g.offset_dims = v,
                    "collapsed_slice_dims" => g.collapsed_slice_dims = v,
                    "start_index_map" => g.start_index_map = v,
                    "operand_batching_dims" => g.operand_batching_dims = v,
                    _ => g.start_indices_batching_dims = v,
                }
            }
            "update_window_dims"
            | "inserted_window_dims"
            | "scatter_dims_to_operand_dims"
            | "input_batching_dims"
            | "scatter_indices_batching_dims" => {
                let v = self.int_list(&key)?;
                let s = p.scatter_dimension_numbers.get_or_insert_with(Box::default);
                match key.as_str() {
                    "update_window_dims" => s.update_window_dims = v,
                    "inserted_window_dims" => s.inserted_window_dims = v,
                    "scatter_dims_to_operand_dims" => s.scatter_dims_to_operand_dims = v,
                    "input_batching_dims" => s.input_batching_dims = v,
                    _ => s.scatter_indices_batching_dims = v,
                }
            }
            "index_vector_dim" => {
                let v = self.int(&key)?;
                if op == "scatter" {
                    p.scatter_dimension_numbers
                        .get_or_insert_with(Box::default)
                        .index_vector_dim = v;
                } else {
                    p.gather_dimension_numbers
                        .get_or_insert_with(Box::default)
                        .index_vector_dim = v;
                }
            }
            "indices_are_sorted" => p.indices_are_sorted = self.bool(&key)?,
            "unique_indices" => p.unique_indices = self.bool(&key)?,
            // Other op-specific attributes.
            "exponent_bits" => p.exponent_bits = self.int32(&key)?,
            "mantissa_bits" => p.mantissa_bits = self.int32(&key)?,
            "distribution" => {
                let (w, at) = self.ident("a distribution")?;
                p.distribution = match w.as_str() {
                    "rng_uniform" => 1,
                    "rng_normal" => 2,
                    _ => return Err(Failure::new(at, format!("unknown distribution '{w}'"))),
                };
            }
            "delta" => p.delta = self.int(&key)?,
            "k" => p.k = self.int(&key)?,
            "largest" => p.largest = self.bool(&key)?,
            "lower" if op == "cholesky" => {
                p.cholesky_options = Some(Box::new(CholeskyOptions {
                    lower: self.bool(&key)?,
                }));
            }
            "left_side" | "lower" | "unit_diagonal" | "transpose_a" => {
                let o = p.triangular_solve_options.get_or_insert_with(Box::default);
                match key.as_str() {
                    "left_side" => o.left_side = self.bool(&key)?,
                    "lower" => o.lower = self.bool(&key)?,
                    "unit_diagonal" => o.unit_diagonal = self.bool(&key)?,
                    _ => {
                        let (w, at) = self.ident("a transpose kind")?;
                        o.transpose_a =
                            crate::proto::triangular_solve_options::Transpose::from_str_name(&w)
                                .ok_or_else(|| {
                                    Failure::new(at, format!("unknown transpose kind '{w}'"))
                                })? as i32;
                    }
                }
            }
            "fft_type" => {
                let (w, at) = self.ident("an FFT type")?;
                p.fft_type = crate::proto::FftType::from_str_name(&w)
                    .ok_or_else(|| Failure::new(at, format!("unknown FFT type '{w}'")))?
                    as i32;
            }
            "fft_length" => p.fft_length = self.int_list(&key)?,
            "epsilon" => {
                let at = self.here()?;
                let v = self.float(&key)?;
                let f = v as f32;
                if v.is_finite() && !f.is_finite() {
                    return Err(Failure::new(at, "epsilon is out of range for f32"));
                }
                p.epsilon = f;
            }
            "feature_index" => p.feature_index = self.int(&key)?,
            "channel_id" => p.channel_id = self.int(&key)?,
            "is_host_transfer" => p.is_host_transfer = self.bool(&key)?,
            "infeed_config" => p.infeed_config = self.bytes(&key)?,
            "outfeed_config" => p.outfeed_config = self.bytes(&key)?,
            "outfeed_shape" => p.outfeed_shape = Some(Box::new(self.shape()?)),
            // custom-call.
            "custom_call_target" => p.custom_call_target = self.string(&key)?,
            "custom_call_has_side_effect" => p.custom_call_has_side_effect = self.bool(&key)?,
            "operand_layout_constraints" => {
                p.operand_shapes_with_layout = self.list('{', '}', &key, |q| q.shape())?;
                p.constrain_layout = true;
            }
            "literal" => p.literal = Some(Box::new(self.shaped_literal()?)),
            "output_to_operand_aliasing" => {
                p.output_operand_aliasing = self.list('{', '}', &key, |q| {
                    let output_shape_index = q.int_list("an output shape index")?;
                    q.expect_sym(':', "after the output shape index")?;
                    q.expect_sym('(', "before the aliased operand")?;
                    let operand_index = q.count("an operand index")?;
                    q.expect_sym(',', "after the operand index")?;
                    let operand_shape_index = q.int_list("an operand shape index")?;
                    q.expect_sym(')', "after the aliased operand")?;
                    Ok(OutputOperandAliasing {
                        output_shape_index,
                        operand_index,
                        operand_shape_index,
                    })
                })?;
            }
            "schedule" => {
                let (w, at) = self.ident("a custom-call schedule")?;
                p.custom_call_schedule = crate::proto::CustomCallSchedule::from_str_name(&w)
                    .ok_or_else(|| {
                        Failure::new(at, format!("unknown custom-call schedule '{w}'"))
                    })? as i32;
            }
            "api_version" => {
                let (w, at) = self.ident("a custom-call API version")?;
                let v = crate::proto::CustomCallApiVersion::from_str_name(&w)
                    .filter(|v| *v as i32 != 0)
                    .ok_or_else(|| {
                        Failure::new(at, format!("invalid custom-call API version '{w}'"))
                    })?;
                p.custom_call_api_version = v as i32;
            }
            "padding_type" => {
                let (w, at) = self.ident("a padding type")?;
                p.padding_type = crate::proto::PaddingType::from_str_name(&w)
                    .ok_or_else(|| Failure::new(at, format!("unknown padding type '{w}'")))?
                    as i32;
            }
            // Collectives.
            "replica_groups" => p.replica_group_list = Some(self.replica_groups()?),
            "constrain_layout" => p.constrain_layout = self.bool(&key)?,
            "use_global_device_ids" => p.use_global_device_ids = self.bool(&key)?,
            "source_target_pairs" => {
                let at = self.here()?;
                p.source_target_pairs = self
                    .int_list_list(&key)?
                    .into_iter()
                    .map(|pair| match pair[..] {
                        [source, target] => Ok(SourceTarget { source, target }),
                        _ => Err(Failure::new(
                            at,
                            "source_target_pairs must be pairs {source,target}",
                        )),
                    })
                    .collect::<Res<_>>()?;
            }
            // XLA reads `mode` and ignores it.
            "mode" => {
                self.ident("a collective op group mode")?;
            }
            "async_execution_thread" => p.async_execution_thread = self.string(&key)?,
            "cross_program_prefetch_index" => {
                p.optional_cross_program_prefetch_index = Some(
                    OptionalCrossProgramPrefetchIndex::CrossProgramPrefetchIndex(self.int32(&key)?),
                );
            }
            "is_composite" => p.is_composite = self.bool(&key)?,
            "num_carries" => p.num_carries = self.int(&key)?,
            "is_reverse" => p.is_reverse = self.bool(&key)?,
            "is_associative" => p.is_associative = if self.bool(&key)? { 1 } else { 2 },
            "domain" => {
                let mut entry = None;
                let mut exit = None;
                let mut kind = None;
                self.sub_attributes("a domain", |q, k, at| {
                    match k {
                        "kind" => kind = Some((q.string("a domain kind")?, at)),
                        "entry" => entry = Some(q.sharding()?),
                        "exit" => exit = Some(q.sharding()?),
                        _ => return Err(Failure::new(at, format!("unknown domain field '{k}'"))),
                    }
                    Ok(())
                })?;
                match kind {
                    Some((k, _)) if k == "sharding" => {}
                    Some((k, at)) => {
                        return Err(Failure::new(at, format!("unsupported domain kind '{k}'")));
                    }
                    None => return Err(Failure::new(at, "domain without a kind")),
                }
                if entry.is_none() || exit.is_none() {
                    return Err(Failure::new(at, "domain needs entry= and exit="));
                }
                // XLA's proto keeps the text's `exit=` (operand side) as the
                // entry sharding and `entry=` as the exit sharding.
                p.domain_entry_sharding = exit.map(Box::new);
                p.domain_exit_sharding = entry.map(Box::new);
            }
            _ => return Err(Failure::new(at, format!("unknown attribute '{key}'"))),
        }
        Ok(())
    }

    fn computation_ref(&mut self) -> Res<(String, usize)> {
        if self.is_sym('{')? {
            let at = self.here()?;
            return Err(Failure::new(
                at,
                "nested (inline) computations are not supported",
            ));
        }
        self.name("a computation name")
    }

    /// A quoted string, or a bare `{...}` dict kept verbatim.
    fn string_or_dict(&mut self, what: &str) -> Res<Vec<u8>> {
        if self.is_sym('{')? {
            return Ok(self.lex.raw_json_dict()?.1.into_bytes());
        }
        self.bytes(what)
    }
}

// ---------------------------------------------------------------------------
// Attribute values

impl<'a> Parser<'a> {
    /// `{key=value,...}` with string or bare-dict values.
    fn frontend_attributes(&mut self) -> Res<FrontendAttributes> {
        let mut map = BTreeMap::new();
        let entries = self.list('{', '}', "frontend attributes", |q| {
            let (key, at) = match q.peek()?.clone() {
                Tok::Ident(k) => (k, q.bump()?.start),
                Tok::Str(_) => {
                    let at = q.here()?;
                    (q.string("an attribute name")?, at)
                }
                _ => return Err(q.expected("a frontend attribute name")),
            };
            q.expect_sym('=', &format!("after '{key}'"))?;
            let value = if q.is_sym('{')? {
                q.lex.raw_json_dict()?.1
            } else {
                q.string("a frontend attribute value")?
            };
            Ok((key, at, value))
        })?;
        for (key, at, value) in entries {
            if map.insert(key.clone(), value).is_some() {
                return Err(Failure::new(
                    at,
                    format!("duplicate frontend attribute '{key}'"),
                ));
            }
        }
        Ok(FrontendAttributes { map })
    }

    fn metadata(&mut self) -> Res<OpMetadata> {
        let mut m = OpMetadata::default();
        self.sub_attributes("metadata", |q, key, at| {
            match key {
                "op_type" => m.op_type = q.string(key)?,
                "op_name" => m.op_name = q.string(key)?,
                "source_file" => m.source_file = q.string(key)?,
                "source_line" => m.source_line = q.int32(key)?,
                "source_end_line" => m.source_end_line = q.int32(key)?,
                "source_column" => m.source_column = q.int32(key)?,
                "source_end_column" => m.source_end_column = q.int32(key)?,
                "deduplicated_name" => m.deduplicated_name = q.string(key)?,
                "scheduling_name" => m.scheduling_name = q.string(key)?,
                "stack_frame_id" => m.stack_frame_id = q.int32(key)?,
                "preserve_layout" => m.preserve_layout = q.bool(key)?,
                "profile_type" => {
                    m.profile_type = q.list('{', '}', key, |q| {
                        let at = q.here()?;
                        let v = match q.peek()?.clone() {
                            Tok::Ident(w) => {
                                q.bump()?;
                                crate::proto::ProfileType::from_str_name(&w)
                                    .map(|t| t as i32)
                                    .ok_or_else(|| {
                                        Failure::new(at, format!("unknown profile type '{w}'"))
                                    })?
                            }
                            _ => q.int32("a profile type")?,
                        };
                        if crate::proto::ProfileType::try_from(v).is_err() {
                            return Err(Failure::new(at, format!("unknown profile type {v}")));
                        }
                        Ok(v)
                    })?;
                }
                _ => return Err(Failure::new(at, format!("unknown metadata field '{key}'"))),
            }
            Ok(())
        })?;
        Ok(m)
    }

    /// A single metadata or a `{ {...}, {...} }` list of them.
    fn metadata_list(&mut self) -> Res<Vec<OpMetadata>> {
        if self.is_sym('{')? && self.peek2()? == Tok::Sym('{') {
            return self.list('{', '}', "a metadata list", |q| q.metadata());
        }
        if self.is_sym('{')? && self.peek2()? == Tok::Sym('}') {
            self.bump()?;
            self.bump()?;
            return Ok(Vec::new());
        }
        Ok(vec![self.metadata()?])
    }

    /// `{visualizing_index=N, name=value, ...}`.
    fn statistics(&mut self) -> Res<StatisticsViz> {
        self.expect_sym('{', "to start statistics")?;
        let mut s = StatisticsViz::default();
        if self.eat_sym('}')? {
            return Ok(s);
        }
        self.ident("visualizing_index")?;
        self.expect_sym('=', "after visualizing_index")?;
        s.stat_index_to_visualize = self.int("a statistic index")?;
        while self.eat_sym(',')? {
            let (stat_name, _) = self.ident("a statistic name")?;
            self.expect_sym('=', "after the statistic name")?;
            let stat_val = self.float("a statistic value")?;
            s.statistics.push(Statistic {
                stat_name,
                stat_val,
            });
        }
        self.expect_sym('}', "to end statistics")?;
        Ok(s)
    }

    /// `{mode=highest}` or `{tolerance={atol=..,rtol=..,ulps=..}}`.
    fn result_accuracy(&mut self) -> Res<ResultAccuracy> {
        self.expect_sym('{', "to start result_accuracy")?;
        let (key, at) = self.ident("mode or tolerance")?;
        self.expect_sym('=', &format!("after '{key}'"))?;
        let specs = match key.as_str() {
            "mode" => {
                let (w, at) = self.ident("a result accuracy mode")?;
                let m = result_accuracy::Mode::from_str_name(&w.to_ascii_uppercase()).ok_or_else(
                    || Failure::new(at, format!("unknown result accuracy mode '{w}'")),
                )?;
                result_accuracy::Specs::Mode(m as i32)
            }
            "tolerance" => {
                let mut t = result_accuracy::Tolerance::default();
                self.list('{', '}', "a tolerance", |q| {
                    let (k, at) = q.ident("atol, rtol or ulps")?;
                    q.expect_sym('=', &format!("after '{k}'"))?;
                    match k.as_str() {
                        "atol" => t.atol = q.float(&k)?,
                        "rtol" => t.rtol = q.float(&k)?,
                        "ulps" => t.ulps = q.float(&k)? as i64,
                        _ => {
                            return Err(Failure::new(at, format!("unknown tolerance field '{k}'")));
                        }
                    }
                    Ok(())
                })?;
                result_accuracy::Specs::Tolerance(t)
            }
            _ => {
                return Err(Failure::new(
                    at,
                    format!("unknown result_accuracy field '{key}'"),
                ));
            }
        };
        self.expect_sym('}', "to end result_accuracy")?;
        Ok(ResultAccuracy { specs: Some(specs) })
    }

    /// `{[synthetic_call]}` or a tuple tree of `{"name" {index}}` arrays.
    fn original_value(&mut self) -> Res<OriginalValueProto> {
        self.expect_sym('{', "to start an original value")?;
        let mut v = OriginalValueProto::default();
        if self.eat_sym('[')? {
            if !self.eat_ident("synthetic_call")? {
                return Err(self.expected("'synthetic_call'"));
            }
            self.expect_sym(']', "after synthetic_call")?;
            self.expect_sym('}', "to end the original value")?;
            v.is_synthetic_call = true;
            return Ok(v);
        }
        let mut index: Vec<i64> = Vec::new();
        loop {
            let at = self.here()?;
            match self.peek()?.clone() {
                Tok::Sym('}') => {
                    self.bump()?;
                    return Ok(v);
                }
                Tok::Sym('(') => {
                    self.bump()?;
                    if index.len() >= MAX_DEPTH {
                        return Err(Failure::new(
                            at,
                            format!("nesting deeper than {MAX_DEPTH} levels"),
                        ));
                    }
                    index.push(0);
                }
                Tok::Sym(')') => {
                    self.bump()?;
                    if index.pop().is_none() {
                        return Err(Failure::new(at, "unbalanced ')' in original value"));
                    }
                }
                Tok::Sym(',') => {
                    self.bump()?;
                    match index.last_mut() {
                        Some(last) => *last += 1,
                        None => {
                            return Err(Failure::new(at, "',' outside a tuple in original value"));
                        }
                    }
                }
                Tok::Sym('{') => {
                    self.bump()?;
                    let mut array = None;
                    if matches!(self.peek()?, Tok::Str(_)) {
                        let instruction_name = self.string("an instruction name")?;
                        let shape_index = if self.is_sym('{')? {
                            self.int_list("a shape index")?
                        } else {
                            Vec::new()
                        };
                        array = Some(OriginalArrayProto {
                            instruction_name,
                            shape_index,
                        });
                    }
                    self.expect_sym('}', "to end an original array")?;
                    v.elements.push(OriginalValueElementProto {
                        shape_index: index.clone(),
                        original_array: array,
                    });
                }
                _ => return Err(self.expected("an original array, '(' or '}'")),
            }
        }
    }

    /// `0_1x2_3` or `0_1_2x...` (low_high[_interior] per dimension).
    fn padding_config(&mut self) -> Res<PaddingConfig> {
        let (at, text) = self
            .lex
            .raw_word(|c| c.is_ascii_digit() || matches!(c, b'x' | b'_' | b'-'))?;
        let mut dimensions = Vec::new();
        for dim in text.split('x') {
            let v: Option<Vec<i64>> = dim.split('_').map(|s| s.parse().ok()).collect();
            match v.as_deref() {
                Some(&[lo, hi]) => dimensions.push(padding_config::PaddingConfigDimension {
                    edge_padding_low: lo,
                    edge_padding_high: hi,
                    interior_padding: 0,
                }),
                Some(&[lo, hi, interior]) => {
                    dimensions.push(padding_config::PaddingConfigDimension {
                        edge_padding_low: lo,
                        edge_padding_high: hi,
                        interior_padding: interior,
                    })
                }
                _ => {
                    return Err(Failure::new(
                        at,
                        format!("expected padding like 0_1x2_3 or 0_1_1, found '{text}'"),
                    ));
                }
            }
        }
        Ok(PaddingConfig { dimensions })
    }

    /// `{size=3x3 stride=2x2 pad=0_1x0_1 lhs_dilate=.. rhs_dilate=.. rhs_reversal=..}`.
    fn window(&mut self) -> Res<Window> {
        let at = self.expect_sym('{', "to start a window")?;
        let mut fields: HashMap<String, (usize, String)> = HashMap::new();
        while !self.eat_sym('}')? {
            let (key, kat) = self.ident("a window field or '}'")?;
            self.expect_sym('=', &format!("after '{key}'"))?;
            if ![
                "size",
                "stride",
                "pad",
                "lhs_dilate",
                "rhs_dilate",
                "rhs_reversal",
            ]
            .contains(&key.as_str())
            {
                return Err(Failure::new(kat, format!("unknown window field '{key}'")));
            }
            let value = self
                .lex
                .raw_word(|c| c.is_ascii_digit() || matches!(c, b'x' | b'_' | b'-'))?;
            if fields.insert(key.clone(), value).is_some() {
                return Err(Failure::new(kat, format!("duplicate window field '{key}'")));
            }
        }
        let dxd = |key: &str| -> Res<Option<Vec<i64>>> {
            let Some((at, text)) = fields.get(key) else {
                return Ok(None);
            };
            text.split('x')
                .map(|s| s.parse::<i64>().ok())
                .collect::<Option<Vec<_>>>()
                .map(Some)
                .ok_or_else(|| Failure::new(*at, format!("expected {key}=NxM..., found '{text}'")))
        };
        let size = dxd("size")?.unwrap_or_default();
        let stride = dxd("stride")?;
        let lhs = dxd("lhs_dilate")?;
        let rhs = dxd("rhs_dilate")?;
        let rev = dxd("rhs_reversal")?;
        let pad = match fields.get("pad") {
            None => None,
            Some((pat, text)) => Some(
                text.split('x')
                    .map(|d| {
                        match d
                            .split('_')
                            .map(|s| s.parse::<i64>().ok())
                            .collect::<Option<Vec<_>>>()
                        {
                            Some(v) if v.len() == 2 => Some((v[0], v[1])),
                            _ => None,
                        }
                    })
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| {
                        Failure::new(*pat, format!("expected pad=L_HxL_H..., found '{text}'"))
                    })?,
            ),
        };
        let n = size.len();
        for (name, len) in [
            ("stride", stride.as_ref().map(Vec::len)),
            ("lhs_dilate", lhs.as_ref().map(Vec::len)),
            ("rhs_dilate", rhs.as_ref().map(Vec::len)),
            ("rhs_reversal", rev.as_ref().map(Vec::len)),
            ("pad", pad.as_ref().map(Vec::len)),
        ] {
            if len.is_some_and(|l| l != n) {
                return Err(Failure::new(
                    at,
                    format!("window {name}= does not have {n} entries like size="),
                ));
            }
        }
        let get = |v: &Option<Vec<i64>>, k: usize, d: i64| {
            v.as_ref().and_then(|v| v.get(k).copied()).unwrap_or(d)
        };
        let dimensions = (0..n)
            .map(|k| WindowDimension {
                size: size.get(k).copied().unwrap_or(0),
                stride: get(&stride, k, 1),
                padding_low: pad.as_ref().and_then(|p| p.get(k)).map_or(0, |p| p.0),
                padding_high: pad.as_ref().and_then(|p| p.get(k)).map_or(0, |p| p.1),
                window_dilation: get(&rhs, k, 1),
                base_dilation: get(&lhs, k, 1),
                window_reversal: get(&rev, k, 0) == 1,
            })
            .collect();
        Ok(Window { dimensions })
    }

    /// `b01f_01io->b01f`: XLA's `ParseConvolutionDimensionNumbers`.
    fn dim_labels(&mut self) -> Res<ConvolutionDimensionNumbers> {
        let (at, text) = self
            .lex
            .raw_word(|c| c.is_ascii_alphanumeric() || matches!(c, b'?' | b'_' | b'-' | b'>'))?;
        let bad = |m: &str| Failure::new(at, format!("bad dim_labels '{text}': {m}"));
        let (lhs, rest) = text
            .split_once('_')
            .ok_or_else(|| bad("expected lhs_rhs->out"))?;
        let (rhs, out) = rest
            .split_once("->")
            .ok_or_else(|| bad("expected lhs_rhs->out"))?;
        /// Positions of the two named dimensions and the spatial ones.
        fn labels(s: &str, a: char, b: char) -> Result<(i64, i64, Vec<i64>), String> {
            let mut first = 0;
            let mut second = 0;
            let spatial_count = s.chars().filter(|&c| c != a && c != b && c != '?').count();
            let mut spatial = vec![-1i64; spatial_count];
            let mut seen = HashSet::new();
            for (i, c) in s.chars().enumerate() {
                let i = i as i64;
                if c == '?' {
                    continue;
                }
                if !seen.insert(c) {
                    return Err(format!("'{c}' appears twice in '{s}'"));
                }
                if c == a {
                    first = i;
                } else if c == b {
                    second = i;
                } else {
                    let k = c
                        .to_digit(10)
                        .map(|d| d as usize)
                        .filter(|&d| d < spatial_count)
                        .ok_or_else(|| format!("unexpected '{c}' in '{s}'"))?;
                    if let Some(slot) = spatial.get_mut(k) {
                        *slot = i;
                    }
                }
            }
            Ok((first, second, spatial))
        }
        let (ib, if_, is) = labels(lhs, 'b', 'f').map_err(|m| bad(&m))?;
        let (ki, ko, ks) = labels(rhs, 'i', 'o').map_err(|m| bad(&m))?;
        let (ob, of, os) = labels(out, 'b', 'f').map_err(|m| bad(&m))?;
        if is.len() != ks.len() || is.len() != os.len() {
            return Err(bad(
                "input, kernel and output need the same number of spatial dimensions",
            ));
        }
        Ok(ConvolutionDimensionNumbers {
            input_batch_dimension: ib,
            input_feature_dimension: if_,
            input_spatial_dimensions: is,
            kernel_input_feature_dimension: ki,
            kernel_output_feature_dimension: ko,
            kernel_spatial_dimensions: ks,
            output_batch_dimension: ob,
            output_feature_dimension: of,
            output_spatial_dimensions: os,
        })
    }

    /// `[d0,d1,...]` optionally followed by `T(p0,p1,...)` (identity if absent).
    fn iota_array(&mut self, what: &str) -> Res<(Vec<i64>, Vec<i32>)> {
        let at = self.here()?;
        let dims = self.list('[', ']', what, |q| q.count("a dimension"))?;
        if dims.is_empty() {
            return Err(Failure::new(at, format!("{what} must not be empty")));
        }
        let perm: Vec<i32> = if self.is_ident("T")? && self.peek2()? == Tok::Sym('(') {
            self.bump()?;
            let pat = self.here()?;
            let perm = self.list('(', ')', "a transpose permutation", |q| {
                q.int32("a dimension")
            })?;
            let mut sorted = perm.clone();
            sorted.sort_unstable();
            if sorted
                .iter()
                .enumerate()
                .any(|(k, &d)| usize::try_from(d).ok() != Some(k))
                || perm.len() != dims.len()
            {
                return Err(Failure::new(
                    pat,
                    format!(
                        "T({perm:?}) is not a permutation of the {} dimensions",
                        dims.len()
                    ),
                ));
            }
            perm
        } else {
            (0..dims.len()).map(|k| k as i32).collect()
        };
        Ok((dims, perm))
    }

    fn replica_groups(&mut self) -> Res<ReplicaGroupList> {
        let at = self.here()?;
        match self.peek()?.clone() {
            Tok::Sym('{') => {
                let groups = self.int_list_list("replica groups")?;
                Ok(ReplicaGroupList::CollectiveDeviceList(
                    CollectiveDeviceListProto {
                        replica_groups: groups
                            .into_iter()
                            .map(|replica_ids| ReplicaGroup { replica_ids })
                            .collect(),
                        iota_replica_group_list: None,
                    },
                ))
            }
            Tok::Sym('[') => {
                let gs = self.list('[', ']', "the replica group shape", |q| q.count("a count"))?;
                let [groups, size] = gs[..] else {
                    return Err(Failure::new(at, "iota replica groups need [groups,size]"));
                };
                if *self.peek()? != Tok::Leq {
                    return Err(self.expected("'<=' in iota replica groups"));
                }
                self.bump()?;
                let (dims, perm) = self.iota_array("the iota dimensions")?;
                let total = product(&dims);
                if total.is_none() || total != groups.checked_mul(size) {
                    return Err(Failure::new(
                        at,
                        format!("iota replica groups [{groups},{size}] do not match <={dims:?}"),
                    ));
                }
                Ok(ReplicaGroupList::IotaCollectiveDeviceList(
                    IotaReplicaGroupListProto {
                        num_replica_groups: groups,
                        num_devices_per_group: size,
                        iota_reshape_dims: dims,
                        iota_transpose_perm: perm,
                    },
                ))
            }
            Tok::Ident(w) if w == "mesh" => self.mesh_axes(),
            _ => Err(self.expected("replica groups ('{...}', '[G,S]<=[...]' or 'mesh[...]')")),
        }
    }

    /// `mesh['a'=2,'b'=4], device_ids=(...) {'b', 'a':(1)2}`.
    fn mesh_axes(&mut self) -> Res<ReplicaGroupList> {
        self.bump()?; // mesh
        let axes = self.list('[', ']', "the mesh axes", |q| {
            let at = q.here()?;
            let name = q.axis_name()?;
            q.expect_sym('=', "after the axis name")?;
            let size = q.count("an axis size")?;
            Ok((name, size, at))
        })?;
        let mut mesh = MeshProto::default();
        let mut names = HashMap::new();
        for (k, (name, size, at)) in axes.into_iter().enumerate() {
            if names.insert(name.clone(), k as i64).is_some() {
                return Err(Failure::new(at, format!("duplicate mesh axis '{name}'")));
            }
            mesh.axes.push(mesh_proto::MeshAxis { name, size });
        }
        if self.is_sym(',')? && self.peek2()? == Tok::Ident("device_ids".into()) {
            self.bump()?;
            self.bump()?;
            self.expect_sym('=', "after device_ids")?;
            self.expect_sym('(', "to start the device ids")?;
            if self.is_sym('[')? {
                let (reshape_dims, perm) = self.iota_array("the device id dimensions")?;
                mesh.iota_transform = Some(mesh_proto::IotaTransform {
                    reshape_dims,
                    transpose_perm: perm.into_iter().map(i64::from).collect(),
                });
                self.expect_sym(')', "to end the device ids")?;
            } else {
                let at = self.here()?;
                let mut ids = Vec::new();
                if !self.is_sym(')')? {
                    loop {
                        ids.push(self.count("a device id")?);
                        if !self.eat_sym(',')? {
                            break;
                        }
                    }
                }
                self.expect_sym(')', "to end the device ids")?;
                let devices = product(&mesh.axes.iter().map(|a| a.size).collect::<Vec<_>>());
                if devices != i64::try_from(ids.len()).ok() {
                    return Err(Failure::new(
                        at,
                        format!(
                            "the mesh has {devices:?} devices, device_ids lists {}",
                            ids.len()
                        ),
                    ));
                }
                mesh.device_ids = ids;
            }
        }
        let refs = self.list('{', '}', "the reduced mesh axes", |q| {
            let at = q.here()?;
            let mesh_axis_index = match q.peek()?.clone() {
                Tok::Number(_) => q.count("an axis index")?,
                _ => {
                    let name = q.axis_name()?;
                    *names.get(&name).ok_or_else(|| {
                        Failure::new(at, format!("'{name}' is not an axis of the mesh"))
                    })?
                }
            };
            if usize::try_from(mesh_axis_index).map_or(true, |k| k >= names.len()) {
                return Err(Failure::new(
                    at,
                    format!("mesh axis index {mesh_axis_index} is out of range"),
                ));
            }
            let mut sub_axis_info = None;
            if q.eat_sym(':')? {
                q.expect_sym('(', "before the sub-axis pre-size")?;
                let pre_size = q.count("a sub-axis pre-size")?;
                q.expect_sym(')', "after the sub-axis pre-size")?;
                let size = q.count("a sub-axis size")?;
                sub_axis_info = Some(axis_ref_proto::SubAxis { pre_size, size });
            }
            Ok(AxisRefProto {
                mesh_axis_index,
                sub_axis_info,
            })
        })?;
        Ok(ReplicaGroupList::MeshAxesReplicaGroupList(
            MeshAxesReplicaGroupListProto {
                mesh: Some(mesh),
                axes: refs,
            },
        ))
    }

    /// A mesh axis name: `'a'`, `"a"` or `a`.
    fn axis_name(&mut self) -> Res<String> {
        match self.peek()?.clone() {
            Tok::Ident(n) => {
                self.bump()?;
                Ok(n)
            }
            Tok::Str(_) => self.string("an axis name"),
            _ => Err(self.expected("a mesh axis name")),
        }
    }

    /// `{replicated}`, `{maximal device=1}`, `{devices=[2,1]<=[2]}`, tuples
    /// `{{...}, {...}}`.
    fn sharding(&mut self) -> Res<OpSharding> {
        self.expect_sym('{', "to start a sharding")?;
        if !(self.is_sym('{')? || self.is_sym('}')?) {
            return self.single_sharding();
        }
        let mut tuple_shardings = Vec::new();
        if !self.eat_sym('}')? {
            loop {
                self.expect_sym('{', "to start a tuple element's sharding")?;
                tuple_shardings.push(self.single_sharding()?);
                if self.eat_sym(',')? {
                    continue;
                }
                self.expect_sym('}', "to end a tuple sharding")?;
                break;
            }
        }
        Ok(OpSharding {
            r#type: op_sharding::Type::Tuple as i32,
            tuple_shardings,
            ..Default::default()
        })
    }

    /// The inside of one `{...}` sharding (its `{` already read), through `}`.
    fn single_sharding(&mut self) -> Res<OpSharding> {
        use op_sharding::Type;
        let at = self.here()?;
        let mut kind: Option<Type> = None;
        let mut s = OpSharding::default();
        let mut devices: Vec<i64> = Vec::new();
        let mut last_tile_dim_replicate = false;
        loop {
            let t = self.peek()?.clone();
            let tat = self.here()?;
            let word = match t {
                Tok::Sym('}') => {
                    self.bump()?;
                    break;
                }
                Tok::Ident(w) => w,
                _ => return Err(self.expected("a sharding attribute or '}'")),
            };
            self.bump()?;
            let mut set_kind = |k: Type| -> Res<()> {
                if kind.replace(k).is_some_and(|old| old != k) {
                    return Err(Failure::new(tat, "sharding has more than one kind"));
                }
                Ok(())
            };
            match word.as_str() {
                "replicated" => set_kind(Type::Replicated)?,
                "manual" => set_kind(Type::Manual)?,
                "maximal" => set_kind(Type::Maximal)?,
                "unknown" => set_kind(Type::Unknown)?,
                "unreduced" => set_kind(Type::Unreduced)?,
                "last_tile_dim_replicate" => last_tile_dim_replicate = true,
                "shard_as" | "shard_like" => {
                    s.is_shard_group = true;
                    s.shard_group_id = self.int("a shard group id")?;
                    s.shard_group_type = i32::from(word == "shard_like");
                }
                "device" => {
                    self.expect_sym('=', "after device")?;
                    devices = vec![self.int("a device id")?];
                }
                "devices" => {
                    self.expect_sym('=', "after devices")?;
                    s.tile_assignment_dimensions =
                        self.list('[', ']', "the tile assignment shape", |q| {
                            q.count("a dimension")
                        })?;
                    if *self.peek()? == Tok::Leq {
                        self.bump()?;
                        let (dims, perm) = self.iota_array("the iota dimensions")?;
                        if product(&dims) != product(&s.tile_assignment_dimensions) {
                            return Err(Failure::new(
                                tat,
                                "iota devices do not fill the tile assignment",
                            ));
                        }
                        s.iota_reshape_dims = dims;
                        s.iota_transpose_perm = perm;
                    } else {
                        loop {
                            devices.push(self.int("a device id")?);
                            if !(self.is_sym(',')? && matches!(self.peek2()?, Tok::Number(_))) {
                                break;
                            }
                            self.bump()?;
                        }
                        if product(&s.tile_assignment_dimensions)
                            != i64::try_from(devices.len()).ok()
                        {
                            return Err(Failure::new(
                                tat,
                                format!(
                                    "tile assignment {:?} needs as many devices, found {}",
                                    s.tile_assignment_dimensions,
                                    devices.len()
                                ),
                            ));
                        }
                    }
                }
                "metadata" => {
                    self.expect_sym('=', "after metadata")?;
                    s.metadata = self.metadata_list()?;
                }
                "last_tile_dims" => {
                    self.expect_sym('=', "after last_tile_dims")?;
                    s.last_tile_dims = self.list('{', '}', "last_tile_dims", |q| {
                        let (w, at) = q.ident("a sharding type")?;
                        Ok(match w.as_str() {
                            "replicated" => Type::Replicated,
                            "manual" => Type::Manual,
                            "maximal" => Type::Maximal,
                            "unreduced" => Type::Unreduced,
                            _ => {
                                return Err(Failure::new(
                                    at,
                                    format!("unknown sharding type '{w}'"),
                                ));
                            }
                        } as i32)
                    })?;
                }
                "mesh" | "maximal_mesh" => {
                    return Err(Failure::new(
                        tat,
                        "named (mesh) shardings are not supported",
                    ));
                }
                _ => {
                    return Err(Failure::new(
                        tat,
                        format!("unknown sharding attribute '{word}'"),
                    ));
                }
            }
        }
        let tiled = !s.tile_assignment_dimensions.is_empty();
        match kind {
            Some(Type::Maximal) => {
                if devices.len() != 1 || tiled {
                    return Err(Failure::new(
                        at,
                        "maximal shardings need exactly one device=",
                    ));
                }
                s.r#type = Type::Maximal as i32;
                s.tile_assignment_devices = devices;
            }
            Some(k) => {
                if !devices.is_empty() || tiled {
                    return Err(Failure::new(
                        at,
                        format!(
                            "{} shardings have no devices",
                            k.as_str_name().to_ascii_lowercase()
                        ),
                    ));
                }
                s.r#type = k as i32;
            }
            None => {
                if !tiled {
                    return Err(Failure::new(at, "a tiled sharding needs devices=[...]"));
                }
                s.r#type = Type::Other as i32;
                s.tile_assignment_devices = devices;
                s.replicate_on_last_tile_dim = last_tile_dim_replicate;
            }
        }
        Ok(s)
    }
}

/// Product of non-negative sizes, `None` on overflow.
fn product(dims: &[i64]) -> Option<i64> {
    dims.iter().try_fold(1i64, |acc, &d| acc.checked_mul(d))
}

// ---------------------------------------------------------------------------
// Shapes and layouts

/// XLA's default layout for a rank: `{rank-1,...,1,0}`.
fn default_layout(rank: usize) -> LayoutProto {
    LayoutProto {
        minor_to_major: (0..rank as i64).rev().collect(),
        tail_padding_alignment_in_elements: 1,
        ..Default::default()
    }
}

impl<'a> Parser<'a> {
    fn shape(&mut self) -> Res<ShapeProto> {
        self.enter()?;
        let s = self.shape_inner();
        self.leave();
        s
    }

    fn shape_inner(&mut self) -> Res<ShapeProto> {
        if self.is_sym('(')? {
            let tuple_shapes = self.list('(', ')', "a tuple shape", |q| q.shape())?;
            return Ok(ShapeProto {
                element_type: PrimitiveType::Tuple as i32,
                tuple_shapes,
                ..Default::default()
            });
        }
        let (name, at) = self.ident("a shape")?;
        let ty = type_from_name(&name)
            .filter(|t| *t != PrimitiveType::Tuple)
            .ok_or_else(|| Failure::new(at, format!("unknown element type '{name}'")))?;
        let dims = self.list('[', ']', "the dimensions", |q| {
            if q.eat_sym('?')? {
                return Ok((i64::MIN, true));
            }
            let dynamic = *q.peek()? == Tok::Leq;
            if dynamic {
                q.bump()?;
            }
            Ok((q.count("a dimension size")?, dynamic))
        })?;
        let mut s = ShapeProto {
            element_type: ty as i32,
            dimensions: dims.iter().map(|d| d.0).collect(),
            is_dynamic_dimension: dims.iter().map(|d| d.1).collect(),
            ..Default::default()
        };
        let is_array = !matches!(ty, PrimitiveType::Token | PrimitiveType::OpaqueType);
        if self.is_sym('{')? && matches!(self.peek2()?, Tok::Number(_) | Tok::Sym(':')) {
            let lat = self.here()?;
            let layout = self.layout()?;
            if layout.minor_to_major.len() != dims.len() {
                return Err(Failure::new(
                    lat,
                    format!(
                        "layout lists {} dimensions, but the shape has {}",
                        layout.minor_to_major.len(),
                        dims.len()
                    ),
                ));
            }
            s.layout = Some(Box::new(layout));
        } else if is_array {
            s.layout = Some(Box::new(default_layout(dims.len())));
        }
        Ok(s)
    }

    /// `{1,0:T(8,128)(2,1)E(4)S(1)}` and the other `Layout::ToString` parts.
    fn layout(&mut self) -> Res<LayoutProto> {
        self.expect_sym('{', "to start a layout")?;
        let mut l = default_layout(0);
        while matches!(self.peek()?, Tok::Number(_)) {
            l.minor_to_major.push(self.count("a dimension number")?);
            if !self.eat_sym(',')? {
                break;
            }
        }
        if self.eat_sym(':')? {
            loop {
                let t = self.peek()?.clone();
                match t {
                    Tok::Ident(w) if w == "D" => {
                        self.bump()?;
                        l.dim_level_types = self.list('(', ')', "dim level types", |q| {
                            let (w, at) = q.ident("D, C, S or H")?;
                            let v = match w.as_str() {
                                "D" => 0,
                                "C" => 1,
                                "S" => 2,
                                "H" => 3,
                                _ => {
                                    return Err(Failure::new(
                                        at,
                                        format!("unknown dim level type '{w}'"),
                                    ));
                                }
                            };
                            // XLA reads and drops the unique/ordered markers.
                            while q.eat_sym('+')? || q.eat_sym('~')? {}
                            Ok(v)
                        })?;
                    }
                    Tok::Ident(w) if w == "T" => {
                        self.bump()?;
                        while self.is_sym('(')? {
                            let dimensions = self.list('(', ')', "a tile", |q| {
                                if q.eat_sym('*')? {
                                    return Ok(i64::MIN);
                                }
                                q.int("a tile dimension")
                            })?;
                            l.tiles.push(TileProto { dimensions });
                        }
                    }
                    Tok::Ident(w) if w == "L" => {
                        self.bump()?;
                        l.tail_padding_alignment_in_elements = self.paren_int("L")?;
                    }
                    Tok::Sym('#') | Tok::Sym('*') => {
                        self.bump()?;
                        self.expect_sym('(', "before a primitive type")?;
                        let (name, at) = self.ident("an unsigned integer type")?;
                        let ty = type_from_name(&name)
                            .filter(|t| {
                                shape::type_name(*t as i32).is_some_and(|n| n.starts_with('u'))
                            })
                            .ok_or_else(|| {
                                Failure::new(
                                    at,
                                    format!("expected an unsigned integer type, found '{name}'"),
                                )
                            })?;
                        self.expect_sym(')', "after the primitive type")?;
                        if t == Tok::Sym('#') {
                            l.index_primitive_type = ty as i32;
                        } else {
                            l.pointer_primitive_type = ty as i32;
                        }
                    }
                    Tok::Ident(w) if w == "E" => {
                        self.bump()?;
                        l.element_size_in_bits = self.paren_int("E")?;
                    }
                    Tok::Ident(w) if w == "S" => {
                        self.bump()?;
                        l.memory_space = self.paren_int("S")?;
                    }
                    Tok::Ident(w) if w == "SC" => {
                        self.bump()?;
                        while self.eat_sym('(')? {
                            let dimension = self.int("a split dimension")?;
                            self.expect_sym(':', "after the split dimension")?;
                            let mut split_indices = Vec::new();
                            loop {
                                split_indices.push(self.int("a split index")?);
                                if !self.eat_sym(',')? {
                                    break;
                                }
                            }
                            self.expect_sym(')', "after the split indices")?;
                            l.split_configs.push(SplitConfigProto {
                                dimension,
                                split_indices,
                            });
                        }
                    }
                    Tok::Ident(w) if w == "P" => {
                        self.bump()?;
                        self.expect_sym('(', "before the physical shape")?;
                        l.physical_shape = Some(Box::new(self.shape()?));
                        self.expect_sym(')', "after the physical shape")?;
                    }
                    Tok::Ident(w) if w == "M" => {
                        self.bump()?;
                        l.dynamic_shape_metadata_prefix_bytes = self.paren_int("M")?;
                    }
                    _ => break,
                }
            }
        }
        self.expect_sym('}', "to end the layout")?;
        Ok(l)
    }

    fn paren_int(&mut self, what: &str) -> Res<i64> {
        self.expect_sym('(', &format!("after {what}"))?;
        let v = self.int("an integer")?;
        self.expect_sym(')', &format!("to end {what}(...)"))?;
        Ok(v)
    }
}

// ---------------------------------------------------------------------------
// Literals

/// One element of a literal, in its final representation.
#[derive(Clone, Copy)]
enum Elem {
    Bool(bool),
    Int(i64),
    UInt(u64),
    /// f16 / bf16 bits.
    Half(u16),
    F32(f32),
    F64(f64),
    C64(f32, f32),
    C128(f64, f64),
}

/// The element kinds literals support.
#[derive(Clone, Copy, PartialEq)]
enum ElemKind {
    Pred,
    Signed(u32),
    Unsigned(u32),
    F16,
    Bf16,
    F32,
    F64,
    C64,
    C128,
}

fn elem_kind(ty: PrimitiveType) -> Option<ElemKind> {
    use PrimitiveType as P;
    Some(match ty {
        P::Pred => ElemKind::Pred,
        P::S1 | P::S2 | P::S4 | P::S8 | P::S16 | P::S32 | P::S64 => {
            ElemKind::Signed(shape::type_bits(ty as i32)?)
        }
        P::U1 | P::U2 | P::U4 | P::U8 | P::U16 | P::U32 | P::U64 => {
            ElemKind::Unsigned(shape::type_bits(ty as i32)?)
        }
        P::F16 => ElemKind::F16,
        P::Bf16 => ElemKind::Bf16,
        P::F32 => ElemKind::F32,
        P::F64 => ElemKind::F64,
        P::C64 => ElemKind::C64,
        P::C128 => ElemKind::C128,
        _ => return None,
    })
}

/// A float as XLA stores it: `value` converted, NaNs quiet with the sign
/// and payload of the text, out-of-range finite values rejected.
fn float_elem(text: &str, kind: ElemKind) -> Result<Elem, String> {
    // NaN: (exponent mask, payload mask, quiet bit, sign shift) per type.
    if text.contains("nan") {
        let negative = text.starts_with('-');
        let payload = match text.split_once("(0x") {
            Some((_, hex)) => Some(
                u64::from_str_radix(hex.trim_end_matches(')'), 16)
                    .map_err(|_| format!("bad NaN payload in '{text}'"))?,
            ),
            None => None,
        };
        let double_quiet = 1u64 << 51;
        let bits = |exp: u64, mask: u64, quiet: u64, sign: u32| -> Result<u64, String> {
            let p = match payload {
                None => quiet,
                Some(p) if p == double_quiet => quiet,
                Some(p) if p > 0 && p <= mask => p,
                Some(p) => return Err(format!("NaN payload 0x{p:x} does not fit")),
            };
            Ok((u64::from(negative) << sign) | exp | p)
        };
        return Ok(match kind {
            ElemKind::F16 => Elem::Half(bits(0x7c00, 0x3ff, 0x200, 15)? as u16),
            ElemKind::Bf16 => Elem::Half(bits(0x7f80, 0x7f, 0x40, 15)? as u16),
            ElemKind::F32 => Elem::F32(f32::from_bits(
                bits(0x7f80_0000, 0x7f_ffff, 0x40_0000, 31)? as u32,
            )),
            _ => Elem::F64(f64::from_bits(bits(
                0x7ff0_0000_0000_0000,
                (1 << 52) - 1,
                double_quiet,
                63,
            )?)),
        });
    }
    let v =
        float_value(text).ok_or_else(|| format!("'{text}' is not a number, or out of range"))?;
    let out_of_range = |ok: bool| {
        if v.is_finite() && !ok {
            Err(format!("{text} is out of range for the element type"))
        } else {
            Ok(())
        }
    };
    Ok(match kind {
        ElemKind::F16 => {
            let h = half::f16::from_f32(v as f32);
            out_of_range(h.is_finite())?;
            Elem::Half(h.to_bits())
        }
        ElemKind::Bf16 => {
            let h = half::bf16::from_f32(v as f32);
            out_of_range(h.is_finite())?;
            Elem::Half(h.to_bits())
        }
        ElemKind::F32 => {
            let f = v as f32;
            out_of_range(f.is_finite())?;
            Elem::F32(f)
        }
        _ => Elem::F64(v),
    })
}

impl<'a> Parser<'a> {
    /// A literal of `shape` (a constant's value).
    fn literal(&mut self, shape: &ShapeProto) -> Res<LiteralProto> {
        self.enter()?;
        let l = self.literal_inner(shape);
        self.leave();
        l
    }

    fn literal_inner(&mut self, sh: &ShapeProto) -> Res<LiteralProto> {
        let at = self.here()?;
        if shape::is_tuple(sh) {
            self.expect_sym('(', "to start a tuple literal")?;
            let mut tuple_literals = Vec::new();
            for (k, element) in sh.tuple_shapes.iter().enumerate() {
                if k > 0 {
                    self.expect_sym(',', "between tuple literal elements")?;
                }
                tuple_literals.push(self.literal(element)?);
            }
            self.expect_sym(')', "to end a tuple literal")?;
            return Ok(LiteralProto {
                shape: Some(sh.clone()),
                tuple_literals,
                ..Default::default()
            });
        }
        let ty = PrimitiveType::try_from(sh.element_type).unwrap_or(PrimitiveType::Invalid);
        let kind = elem_kind(ty).ok_or_else(|| {
            Failure::new(
                at,
                format!(
                    "constants of element type {} are not supported",
                    shape::type_name(sh.element_type).unwrap_or("?")
                ),
            )
        })?;
        let dims = &sh.dimensions;
        if dims.iter().any(|&d| d < 0) {
            return Err(Failure::new(at, "a constant needs static dimensions"));
        }
        let rank = dims.len();
        let mut values = Vec::new();
        if rank == 0 {
            values.push(self.literal_element(kind)?);
        } else {
            // Nested braces, one level per dimension, sizes checked as we go.
            let mut seen = vec![0i64; rank];
            let mut level = 0usize;
            loop {
                let t = self.peek()?.clone();
                let tat = self.here()?;
                match t {
                    Tok::Sym('{') => {
                        if level == rank {
                            return Err(Failure::new(
                                tat,
                                format!("too many '{{' for a rank-{rank} constant"),
                            ));
                        }
                        if level > 0 {
                            seen[level - 1] += 1;
                            if seen[level - 1] > dims[level - 1] {
                                return Err(Failure::new(
                                    tat,
                                    format!(
                                        "more than {} entries in dimension {}",
                                        dims[level - 1],
                                        level - 1
                                    ),
                                ));
                            }
                        }
                        level += 1;
                        self.bump()?;
                    }
                    Tok::Sym('}') => {
                        if level == 0 {
                            return Err(Failure::new(tat, "unbalanced '}' in a constant"));
                        }
                        level -= 1;
                        if seen[level] != dims[level] {
                            return Err(Failure::new(
                                tat,
                                format!(
                                    "expected {} entries in dimension {level}, found {}",
                                    dims[level], seen[level]
                                ),
                            ));
                        }
                        seen[level] = 0;
                        self.bump()?;
                        if level == 0 {
                            break;
                        }
                    }
                    Tok::Sym(',') => {
                        self.bump()?;
                    }
                    Tok::Dots => {
                        return Err(Failure::new(
                            tat,
                            "constant abbreviated as {...}; print the module with print_large_constants",
                        ));
                    }
                    Tok::Eof => return Err(self.expected("'}' to end the constant")),
                    _ => {
                        if level != rank {
                            return Err(Failure::new(
                                tat,
                                format!(
                                    "expected '{{': a rank-{rank} constant nests {rank} levels of braces"
                                ),
                            ));
                        }
                        seen[rank - 1] += 1;
                        if seen[rank - 1] > dims[rank - 1] {
                            return Err(Failure::new(
                                tat,
                                format!(
                                    "more than {} entries in dimension {}",
                                    dims[rank - 1],
                                    rank - 1
                                ),
                            ));
                        }
                        values.push(self.literal_element(kind)?);
                    }
                }
            }
        }
        let values =
            physical_order(values, dims, sh.layout.as_deref()).map_err(|m| Failure::new(at, m))?;
        Ok(literal_proto(sh.clone(), kind, &values))
    }

    fn literal_element(&mut self, kind: ElemKind) -> Res<Elem> {
        let at = self.here()?;
        let t = self.peek()?.clone();
        let err = |m: String| Failure::new(at, m);
        let e = match (kind, &t) {
            (ElemKind::Pred, Tok::Ident(w)) if w == "true" || w == "false" => {
                Elem::Bool(w == "true")
            }
            (ElemKind::Pred, Tok::Number(n)) => Elem::Bool(
                parse_i64(n).ok_or_else(|| {
                    err(format!("expected true, false or an integer, found '{n}'"))
                })? != 0,
            ),
            (ElemKind::Signed(bits), Tok::Number(n)) => {
                let v =
                    parse_i64(n).ok_or_else(|| err(format!("expected an integer, found '{n}'")))?;
                let max = (1i64 << (bits - 1)).wrapping_sub(1);
                let min = if bits == 64 {
                    i64::MIN
                } else {
                    -(1i64 << (bits - 1))
                };
                if bits < 64 && (v < min || v > max) {
                    return Err(err(format!("{v} is out of range for s{bits}")));
                }
                Elem::Int(v)
            }
            (ElemKind::Unsigned(bits), Tok::Number(n)) => {
                let v: u64 = n
                    .parse()
                    .map_err(|_| err(format!("expected an unsigned integer, found '{n}'")))?;
                if bits < 64 && v >= (1u64 << bits) {
                    return Err(err(format!("{v} is out of range for u{bits}")));
                }
                Elem::UInt(v)
            }
            (ElemKind::F16 | ElemKind::Bf16 | ElemKind::F32 | ElemKind::F64, Tok::Number(n)) => {
                float_elem(n, kind).map_err(err)?
            }
            (ElemKind::F16 | ElemKind::Bf16 | ElemKind::F32 | ElemKind::F64, Tok::Ident(w))
                if w == "inf" || w == "nan" =>
            {
                float_elem(w, kind).map_err(err)?
            }
            (ElemKind::C64 | ElemKind::C128, Tok::Sym('(')) => {
                self.bump()?;
                let part = |q: &mut Self| -> Res<f64> {
                    let at = q.here()?;
                    let text = match q.peek()?.clone() {
                        Tok::Number(n) => n,
                        Tok::Ident(w) if w == "inf" || w == "nan" => w,
                        _ => return Err(q.expected("a complex component")),
                    };
                    q.bump()?;
                    match float_elem(&text, ElemKind::F64) {
                        Ok(Elem::F64(v)) => Ok(v),
                        Ok(_) => Err(Failure::new(at, "bad complex component")),
                        Err(m) => Err(Failure::new(at, m)),
                    }
                };
                let re = part(self)?;
                self.expect_sym(',', "between the real and imaginary parts")?;
                let im = part(self)?;
                self.expect_sym(')', "after a complex value")?;
                let e = if kind == ElemKind::C64 {
                    if (re.is_finite() && !(re as f32).is_finite())
                        || (im.is_finite() && !(im as f32).is_finite())
                    {
                        return Err(err("complex value is out of range for c64".into()));
                    }
                    Elem::C64(re as f32, im as f32)
                } else {
                    Elem::C128(re, im)
                };
                return Ok(e);
            }
            _ => return Err(self.expected("a constant value")),
        };
        self.bump()?;
        Ok(e)
    }

    /// `shape value` (custom-call `literal=`), or a parenthesized tuple of them.
    fn shaped_literal(&mut self) -> Res<LiteralProto> {
        self.enter()?;
        let r = if self.is_sym('(')? && !self.can_be_shape_after_paren()? {
            self.list('(', ')', "a tuple literal", |q| q.shaped_literal())
                .map(|tuple_literals| LiteralProto {
                    shape: Some(ShapeProto {
                        element_type: PrimitiveType::Tuple as i32,
                        tuple_shapes: tuple_literals
                            .iter()
                            .filter_map(|l| l.shape.clone())
                            .collect(),
                        ..Default::default()
                    }),
                    tuple_literals,
                    ..Default::default()
                })
        } else {
            let sh = self.shape();
            sh.and_then(|sh| self.literal(&sh))
        };
        self.leave();
        r
    }

    /// Whether a `(` starts a tuple *shape* (then a tuple literal follows the
    /// whole shape) rather than a tuple of shaped literals.
    fn can_be_shape_after_paren(&mut self) -> Res<bool> {
        // `(f32[] 1, ...)` is a tuple of literals: after the first shape
        // comes a value, not ',' or ')'.
        let mut ahead = Parser {
            lex: self.lex.clone(),
            depth: self.depth,
        };
        if ahead.shape().is_err() {
            return Ok(false);
        }
        ahead.is_sym('(')
    }
}

/// Reorders row-major `values` into the physical order of `layout` (XLA's
/// literals store their data in layout order).
fn physical_order(
    values: Vec<Elem>,
    dims: &[i64],
    layout: Option<&LayoutProto>,
) -> Result<Vec<Elem>, String> {
    let rank = dims.len();
    let Some(l) = layout else { return Ok(values) };
    let m2m = &l.minor_to_major;
    let is_default = m2m
        .iter()
        .enumerate()
        .all(|(k, &d)| d == (rank as i64) - 1 - k as i64);
    if rank < 2 || is_default {
        return Ok(values);
    }
    let mut stride = vec![0usize; rank];
    let mut placed = vec![false; rank];
    let mut acc = 1usize;
    for &d in m2m {
        let d = usize::try_from(d)
            .ok()
            .filter(|&d| d < rank && !placed[d])
            .ok_or("the constant's layout is not a permutation of its dimensions")?;
        placed[d] = true;
        stride[d] = acc;
        acc = acc.saturating_mul(usize::try_from(dims[d]).unwrap_or(0));
    }
    let udims: Vec<usize> = dims
        .iter()
        .map(|&d| usize::try_from(d).unwrap_or(0))
        .collect();
    let mut out = values.clone();
    let mut index = vec![0usize; rank];
    for v in values {
        let pos: usize = index.iter().zip(&stride).map(|(i, s)| i * s).sum();
        if let Some(slot) = out.get_mut(pos) {
            *slot = v;
        }
        for d in (0..rank).rev() {
            index[d] += 1;
            if index[d] < udims[d] {
                break;
            }
            index[d] = 0;
        }
    }
    Ok(out)
}

fn literal_proto(sh: ShapeProto, kind: ElemKind, values: &[Elem]) -> LiteralProto {
    let ty = PrimitiveType::try_from(sh.element_type).unwrap_or(PrimitiveType::Invalid);
    let mut l = LiteralProto {
        shape: Some(sh),
        ..Default::default()
    };
    let ints = || {
        values
            .iter()
            .map(|e| if let Elem::Int(v) = e { *v } else { 0 })
    };
    let uints = || {
        values
            .iter()
            .map(|e| if let Elem::UInt(v) = e { *v } else { 0 })
    };
    let halves = || {
        values
            .iter()
            .flat_map(|e| if let Elem::Half(b) = e { *b } else { 0 }.to_le_bytes())
            .collect::<Vec<u8>>()
    };
    use PrimitiveType as P;
    match kind {
        ElemKind::Pred => {
            l.preds = values
                .iter()
                .map(|e| matches!(e, Elem::Bool(true)))
                .collect()
        }
        ElemKind::Signed(_) => match ty {
            P::S64 => l.s64s = ints().collect(),
            P::S32 => l.s32s = ints().map(|v| v as i32).collect(),
            P::S16 => l.s16s = ints().flat_map(|v| (v as i16).to_le_bytes()).collect(),
            P::S8 => l.s8s = ints().map(|v| v as u8).collect(),
            // Sub-byte values: one byte each, the low bits (two's complement).
            P::S4 => l.s4s = ints().map(|v| (v & 0xf) as u8).collect(),
            P::S2 => l.s2s = ints().map(|v| (v & 0x3) as u8).collect(),
            _ => l.s1s = ints().map(|v| (v & 0x1) as u8).collect(),
        },
        ElemKind::Unsigned(_) => match ty {
            P::U64 => l.u64s = uints().collect(),
            P::U32 => l.u32s = uints().map(|v| v as u32).collect(),
            P::U16 => l.u16s = uints().flat_map(|v| (v as u16).to_le_bytes()).collect(),
            P::U8 => l.u8s = uints().map(|v| v as u8).collect(),
            P::U4 => l.u4s = uints().map(|v| v as u8).collect(),
            P::U2 => l.u2s = uints().map(|v| v as u8).collect(),
            _ => l.u1s = uints().map(|v| v as u8).collect(),
        },
        ElemKind::F16 => l.f16s = halves(),
        ElemKind::Bf16 => l.bf16s = halves(),
        ElemKind::F32 => {
            l.f32s = values
                .iter()
                .map(|e| if let Elem::F32(v) = e { *v } else { 0.0 })
                .collect()
        }
        ElemKind::F64 => {
            l.f64s = values
                .iter()
                .map(|e| if let Elem::F64(v) = e { *v } else { 0.0 })
                .collect()
        }
        ElemKind::C64 => {
            l.c64s = values
                .iter()
                .flat_map(|e| {
                    if let Elem::C64(a, b) = e {
                        [*a, *b]
                    } else {
                        [0.0, 0.0]
                    }
                })
                .collect();
        }
        ElemKind::C128 => {
            l.c128s = values
                .iter()
                .flat_map(|e| {
                    if let Elem::C128(a, b) = e {
                        [*a, *b]
                    } else {
                        [0.0, 0.0]
                    }
                })
                .collect();
        }
    }
    l
}

// ---------------------------------------------------------------------------
// Assembling the module

/// Resolves computation names, orders computations callees first and fills
/// the module-level fields.
fn assemble(
    header: Header,
    mut comps: Vec<CompText>,
    frames: Option<StackFrameIndexProto>,
) -> Res<ParsedText> {
    let mut by_name: HashMap<String, usize> = HashMap::new();
    for (k, c) in comps.iter().enumerate() {
        if by_name.insert(c.name.clone(), k).is_some() {
            return Err(Failure::new(
                c.name_at,
                format!("computation '{}' is already defined", c.name),
            ));
        }
    }
    let mut entry = None;
    for (k, c) in comps.iter().enumerate() {
        if c.is_entry {
            if entry.is_some() {
                return Err(Failure::new(c.entry_at, "more than one ENTRY computation"));
            }
            entry = Some(k);
        }
    }
    let entry = entry.unwrap_or(comps.len() - 1);

    // Called computations: names → ids; per computation, per instruction,
    // the callees (for the ordering below).
    let ids: Vec<i64> = comps.iter().map(|c| c.id).collect();
    let mut callees: Vec<Vec<Vec<(usize, usize)>>> = Vec::with_capacity(comps.len());
    let mut fusion_callee = vec![false; comps.len()];
    for c in &mut comps {
        let mut per_instr = Vec::with_capacity(c.instrs.len());
        for (instr, calls) in c.instrs.iter_mut().zip(&c.calls) {
            let mut these = Vec::with_capacity(calls.len());
            for (name, at) in calls {
                let k = *by_name
                    .get(name)
                    .ok_or_else(|| Failure::new(*at, format!("undefined computation '{name}'")))?;
                instr.called_computation_ids.push(ids[k]);
                if instr.opcode == "fusion" {
                    fusion_callee[k] = true;
                }
                these.push((k, *at));
            }
            per_instr.push(these);
        }
        callees.push(per_instr);
    }
    check_acyclic(&comps, &callees)?;
    let order = post_order(&callees);

    let mut module = HloModuleProto {
        name: header.name,
        entry_computation_name: comps[entry].name.clone(),
        entry_computation_id: comps[entry].id,
        input_output_alias: header.input_output_alias,
        buffer_donor: header.buffer_donor,
        frontend_attributes: header.frontend_attributes,
        stack_frame_index: frames,
        ..Default::default()
    };
    let mut schedule = HloScheduleProto::default();
    let mut protos: Vec<Option<HloComputationProto>> = Vec::with_capacity(comps.len());
    for (k, c) in comps.into_iter().enumerate() {
        let root = c.root.and_then(|r| c.instrs.get(r)).ok_or_else(|| {
            Failure::new(
                c.name_at,
                format!("computation '{}' has no instructions", c.name),
            )
        })?;
        let root_id = root.id;
        let result = root.shape.clone();
        // Parameters: numbers 0..n-1, each once.
        let mut params: Vec<(i64, usize)> = c
            .instrs
            .iter()
            .enumerate()
            .filter(|(_, i)| i.opcode == "parameter")
            .map(|(j, i)| (i.parameter_number, j))
            .collect();
        params.sort();
        for (n, &(number, j)) in params.iter().enumerate() {
            if usize::try_from(number).ok() != Some(n) {
                let at = c.instr_at.get(j).copied().unwrap_or(c.name_at);
                return Err(Failure::new(
                    at,
                    format!(
                        "computation '{}' has {} parameters, numbered 0 to {} once each; found parameter({number})",
                        c.name,
                        params.len(),
                        params.len() - 1
                    ),
                ));
            }
        }
        let program_shape = ProgramShapeProto {
            parameters: params
                .iter()
                .map(|&(_, j)| c.instrs[j].shape.clone().unwrap_or_default())
                .collect(),
            result,
            parameter_names: params
                .iter()
                .map(|&(_, j)| c.instrs[j].name.clone())
                .collect(),
        };
        if k == entry {
            let (parameters, result) = match &header.layout {
                Some((p, r)) => (p.clone(), Some(r.clone())),
                None => (
                    program_shape.parameters.clone(),
                    program_shape.result.clone(),
                ),
            };
            module.host_program_shape = Some(ProgramShapeProto {
                parameter_names: (0..parameters.len()).map(|n| format!("p{n}")).collect(),
                parameters,
                result,
            });
        }
        if header.is_scheduled && !fusion_callee[k] {
            schedule.sequences.insert(
                c.id,
                InstructionSequence {
                    instruction_ids: c.instrs.iter().map(|i| i.id).collect(),
                },
            );
        }
        protos.push(Some(HloComputationProto {
            name: c.name,
            instructions: c.instrs,
            program_shape: Some(program_shape),
            id: c.id,
            root_id,
            is_fusion_computation: fusion_callee[k],
            execution_thread: c.execution_thread,
        }));
    }
    module.computations = order
        .into_iter()
        .filter_map(|k| protos.get_mut(k).and_then(Option::take))
        .collect();
    if header.is_scheduled {
        module.schedule = Some(schedule);
    }
    // XLA prints a count only when it is not 1, and reads a missing one as
    // 1: so does equarx.
    Ok(ParsedText {
        proto: module,
        counts: DeviceCounts {
            replica_count: Some(header.counts.replica_count.unwrap_or(1)),
            num_partitions: Some(header.counts.num_partitions.unwrap_or(1)),
        },
    })
}

/// A computation that (transitively) calls itself is an error.
fn check_acyclic(comps: &[CompText], callees: &[Vec<Vec<(usize, usize)>>]) -> Res<()> {
    // 0 = unvisited, 1 = on the stack, 2 = done.
    let mut state = vec![0u8; comps.len()];
    for start in 0..comps.len() {
        if state[start] != 0 {
            continue;
        }
        let edges = |k: usize| callees[k].iter().flatten().copied().collect::<Vec<_>>();
        let mut stack = vec![(start, edges(start), 0usize)];
        state[start] = 1;
        while let Some((k, out, next)) = stack.last_mut() {
            if let Some(&(callee, at)) = out.get(*next) {
                *next += 1;
                match state[callee] {
                    0 => {
                        state[callee] = 1;
                        let e = edges(callee);
                        stack.push((callee, e, 0));
                    }
                    1 => {
                        let message = if *k == callee {
                            format!("computation '{}' calls itself", comps[callee].name)
                        } else {
                            format!(
                                "computation '{}' calls '{}', which calls it back (recursion)",
                                comps[*k].name, comps[callee].name
                            )
                        };
                        return Err(Failure::new(at, message));
                    }
                    _ => {}
                }
            } else {
                state[*k] = 2;
                stack.pop();
            }
        }
    }
    Ok(())
}

/// Computations callees first, otherwise in text order: a depth-first post
/// order that visits the computations in text order and each one's callees
/// in call order. Text XLA can parse lists callees first already (it needs
/// a computation defined before its use), and then this is the text order,
/// which is also what XLA's parser gives.
fn post_order(callees: &[Vec<Vec<(usize, usize)>>]) -> Vec<usize> {
    let n = callees.len();
    let mut emitted = vec![false; n];
    let mut order = Vec::with_capacity(n);
    for start in 0..n {
        if emitted[start] {
            continue;
        }
        // (computation, its callees, next callee); cycles were rejected.
        let flat = |k: usize| callees[k].iter().flatten().map(|c| c.0).collect::<Vec<_>>();
        let mut stack = vec![(start, flat(start), 0usize)];
        let mut on_stack = vec![false; n];
        on_stack[start] = true;
        while let Some((k, out, next)) = stack.last_mut() {
            match out.get(*next).copied() {
                Some(c) => {
                    *next += 1;
                    if !emitted[c] && !on_stack[c] {
                        on_stack[c] = true;
                        let e = flat(c);
                        stack.push((c, e, 0));
                    }
                }
                None => {
                    let k = *k;
                    stack.pop();
                    emitted[k] = true;
                    order.push(k);
                }
            }
        }
    }
    order
}
