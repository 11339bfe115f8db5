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
//!
//! The files follow the grammar: [`lexer`] makes the tokens, [`module`]
//! reads the header and the stack-frame table, [`computation`],
//! [`instruction`], [`shapes`] and [`literals`] what their names say,
//! [`attributes`] the instruction attributes and their values (one file per
//! attribute family), and [`assembly`] puts the proto together (names
//! resolved, computations ordered callees first). This file holds the entry
//! point, the errors and the token-level reads every part shares.

mod assembly;
mod attributes;
mod computation;
mod instruction;
mod lexer;
mod literals;
mod module;
mod shapes;

use std::collections::HashSet;

use super::{ParseError, ParsedText};
use lexer::{Lexer, Tok, Token};

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
