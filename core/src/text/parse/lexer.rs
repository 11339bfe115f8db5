//! The lexer: tokens made on demand from the text, C escapes, and the
//! "raw" reads for values that are not made of ordinary tokens.

use super::{Failure, Res};

#[derive(Clone, Debug, PartialEq)]
pub(super) enum Tok {
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
    pub(super) fn describe(&self) -> String {
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
pub(super) struct Token {
    pub(super) tok: Tok,
    pub(super) start: usize,
    end: usize,
}

#[derive(Clone)]
pub(super) struct Lexer<'a> {
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
    pub(super) fn new(text: &'a str) -> Self {
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

    pub(super) fn peek(&mut self) -> Res<&Token> {
        if self.peeked.is_none() {
            let t = self.lex_at(self.pos)?;
            self.peeked = Some(t);
        }
        match &self.peeked {
            Some(t) => Ok(t),
            None => Err(Failure::new(self.pos, "internal lexer error")),
        }
    }

    pub(super) fn next(&mut self) -> Res<Token> {
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
    pub(super) fn raw_word(&mut self, f: impl Fn(u8) -> bool) -> Res<(usize, String)> {
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
    pub(super) fn raw_json_dict(&mut self) -> Res<(usize, String)> {
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
