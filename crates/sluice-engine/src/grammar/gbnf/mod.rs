//! GBNF (llama.cpp's grammar format) converted to llguidance's Lark dialect.
//!
//! vLLM-style clients may write `structured_outputs.grammar` / `guided_grammar` in GBNF as
//! well as in Lark, but llguidance only reads Lark. Rather than teaching the engine a second grammar
//! runtime, requests written in GBNF are rewritten here into the same language in Lark and then
//! compiled by llguidance like any other grammar.
//!
//! The conversion is a real parse (not a line-by-line text rewrite) so that every error can say
//! what is wrong and where, and so that hostile input is bounded: nesting is limited to
//! [`MAX_NESTING`] levels and repetition counts to [`MAX_REPEAT`].
//!
//! One difference in semantics remains and is inherent to llguidance: it lexes string literals
//! and character classes as lexemes, greedily, while llama.cpp matches code point by code
//! point. Grammars whose adjacent literals overlap in ambiguous ways (rare in practice) may
//! therefore accept slightly less under llguidance.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

use thiserror::Error;

/// The deepest nesting of groups and stacked repetition operators accepted. Real grammars
/// stay in single digits; the bound keeps the recursive-descent parser's stack use small no
/// matter what a client sends.
pub const MAX_NESTING: usize = 64;

/// The largest bound accepted in `{m}`, `{m,}` or `{m,n}`. llguidance expands repetitions into
/// O(log n) rules, but an unbounded count would still let a request blow up compile time.
pub const MAX_REPEAT: u32 = 10_000;

/// llguidance's Lark parser refuses groups nested about 30 deep; groups deeper than this are
/// moved into auxiliary rules so that any grammar we accept also compiles there.
const HOIST_DEPTH: usize = 16;

/// Why a GBNF grammar could not be converted. Positions are 1-based and count characters.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum GbnfError {
    /// Malformed text: unterminated string or class, unbalanced parentheses, bad escape, ...
    #[error("GBNF syntax error at line {line}, column {column}: {message}")]
    Syntax {
        line: usize,
        column: usize,
        message: String,
    },
    /// A rule is used but never defined.
    #[error("GBNF rule `{rule}` used at line {line}, column {column} is not defined")]
    UndefinedRule {
        rule: String,
        line: usize,
        column: usize,
    },
    /// The same rule name has two definitions.
    #[error(
        "GBNF rule `{rule}` is defined twice (second definition at line {line}, column {column})"
    )]
    DuplicateRule {
        rule: String,
        line: usize,
        column: usize,
    },
    /// No rule named `root`, where GBNF grammars start.
    #[error("GBNF grammar has no `root` rule (the rule generation starts from)")]
    MissingRoot,
    /// Groups or repetition operators nested deeper than [`MAX_NESTING`].
    #[error(
        "GBNF grammar nested too deeply at line {line}, column {column} (limit {limit} levels)"
    )]
    TooDeep {
        line: usize,
        column: usize,
        limit: usize,
    },
    /// A `{m,n}` bound above [`MAX_REPEAT`].
    #[error("GBNF repetition bound at line {line}, column {column} is too large (limit {limit})")]
    RepeatTooLarge {
        line: usize,
        column: usize,
        limit: u32,
    },
}

/// True when `text` looks like GBNF (a rule defined with `::=`) rather than Lark (`:`).
///
/// A line counts when, after leading blanks, it starts with a rule name followed by `::=`.
/// Lark has no `::=` token, so one such line is enough to decide.
pub fn is_gbnf(text: &str) -> bool {
    text.lines().any(|line| {
        let line = line.trim_start();
        let name_len = line
            .char_indices()
            .find(|&(_, c)| !is_name_char(c))
            .map_or(line.len(), |(i, _)| i);
        name_len > 0 && line[name_len..].trim_start().starts_with("::=")
    })
}

/// The same language in llguidance's Lark dialect; `root` becomes `start`.
pub fn gbnf_to_lark(text: &str) -> Result<String, GbnfError> {
    let rules = Parser::new(text).parse_grammar()?;
    let root = rules
        .iter()
        .position(|r| r.name == "root")
        .ok_or(GbnfError::MissingRoot)?;
    check_references(&rules)?;
    Ok(Emitter::new(&rules, root).emit_grammar(&rules, root))
}

/// Rule names in llama.cpp are letters, digits and `-`; `_` is accepted too, as grammars
/// converted from other dialects often carry it.
fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-' || c == '_'
}

/// One parsed GBNF expression.
#[derive(Debug, Clone, PartialEq)]
enum Expr {
    /// `a | b | ...` with at least two alternatives.
    Alt(Vec<Expr>),
    /// `a b ...`; empty for an empty alternative (matches the empty string).
    Seq(Vec<Expr>),
    /// A string literal, possibly empty.
    Lit(String),
    /// `[...]` / `[^...]` as inclusive code point ranges.
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
    /// `.`: any single code point, newline included (as in llama.cpp).
    Any,
    /// A reference to another rule, with where it appears for error messages.
    Ref {
        name: String,
        line: usize,
        column: usize,
    },
    /// `x*`, `x+`, `x?`, `x{m}`, `x{m,}`, `x{m,n}`; `max == None` means unbounded.
    Repeat {
        inner: Box<Expr>,
        min: u32,
        max: Option<u32>,
    },
}

impl Expr {
    fn is_empty(&self) -> bool {
        match self {
            Expr::Seq(items) => items.is_empty(),
            Expr::Lit(s) => s.is_empty(),
            _ => false,
        }
    }
}

struct RuleDef {
    name: String,
    body: Expr,
}

/// A recursive-descent parser over the code points of the grammar, tracking line and column
/// for error messages. Recursion depth is bounded by [`MAX_NESTING`].
struct Parser {
    chars: Vec<char>,
    pos: usize,
    line: usize,
    column: usize,
}

/// A saved position, to look ahead and come back.
#[derive(Clone, Copy)]
struct Mark {
    pos: usize,
    line: usize,
    column: usize,
}

impl Parser {
    fn new(text: &str) -> Self {
        Parser {
            chars: text.chars().collect(),
            pos: 0,
            line: 1,
            column: 1,
        }
    }

    fn mark(&self) -> Mark {
        Mark {
            pos: self.pos,
            line: self.line,
            column: self.column,
        }
    }

    fn reset(&mut self, m: Mark) {
        self.pos = m.pos;
        self.line = m.line;
        self.column = m.column;
    }

    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn peek_at(&self, offset: usize) -> Option<char> {
        self.chars.get(self.pos + offset).copied()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += 1;
        if c == '\n' {
            self.line += 1;
            self.column = 1;
        } else {
            self.column += 1;
        }
        Some(c)
    }

    fn syntax(&self, at: Mark, message: impl Into<String>) -> GbnfError {
        GbnfError::Syntax {
            line: at.line,
            column: at.column,
            message: message.into(),
        }
    }

    /// Skips blanks and `#` comments; newlines too when `newlines` is set. Rules may span
    /// lines, so almost everywhere newlines are just whitespace; only between a rule name and
    /// its `::=` are they not, which keeps rule starts unambiguous.
    fn skip_ws(&mut self, newlines: bool) {
        while let Some(c) = self.peek() {
            match c {
                ' ' | '\t' | '\r' => {
                    self.bump();
                }
                '\n' if newlines => {
                    self.bump();
                }
                '#' => {
                    while self.peek().is_some_and(|c| c != '\n') {
                        self.bump();
                    }
                }
                _ => break,
            }
        }
    }

    fn parse_name(&mut self) -> String {
        let mut name = String::new();
        while let Some(c) = self.peek().filter(|&c| is_name_char(c)) {
            name.push(c);
            self.bump();
        }
        name
    }

    /// True when the input here is `name ::=`, the start of the next rule. This is what ends
    /// a rule body that spans several lines.
    fn at_rule_start(&mut self) -> bool {
        let m = self.mark();
        let found = !self.parse_name().is_empty() && {
            self.skip_ws(false);
            self.peek() == Some(':') && self.peek_at(1) == Some(':') && self.peek_at(2) == Some('=')
        };
        self.reset(m);
        found
    }

    fn parse_grammar(&mut self) -> Result<Vec<RuleDef>, GbnfError> {
        let mut rules: Vec<RuleDef> = Vec::new();
        let mut seen = HashSet::new();
        loop {
            self.skip_ws(true);
            let at = self.mark();
            match self.peek() {
                None => break,
                Some(')') => return Err(self.syntax(at, "unbalanced `)` without a matching `(`")),
                Some(c) if !is_name_char(c) => {
                    return Err(self.syntax(at, format!("expected a rule name, found `{c}`")))
                }
                Some(_) => {}
            }
            let name = self.parse_name();
            self.skip_ws(false);
            if !(self.bump() == Some(':') && self.bump() == Some(':') && self.bump() == Some('=')) {
                return Err(self.syntax(
                    at,
                    format!("expected `::=` after rule name `{name}` (or an unexpected rule body)"),
                ));
            }
            if !seen.insert(name.clone()) {
                return Err(GbnfError::DuplicateRule {
                    rule: name,
                    line: at.line,
                    column: at.column,
                });
            }
            let (body, _) = self.parse_alternation(0)?;
            rules.push(RuleDef { name, body });
        }
        Ok(rules)
    }

    /// `seq ( '|' seq )*`.
    ///
    /// Like the other `parse_*` functions it returns the expression with its nesting height
    /// (groups plus repetition operators on the deepest path), which must stay within
    /// [`MAX_NESTING`]; `depth` is the number of enclosing groups, checked as soon as a `(` is
    /// seen so that a flood of `(` fails before it recurses.
    fn parse_alternation(&mut self, depth: usize) -> Result<(Expr, usize), GbnfError> {
        let (first, mut height) = self.parse_sequence(depth)?;
        let mut alts = vec![first];
        loop {
            self.skip_ws(true);
            if self.peek() != Some('|') {
                break;
            }
            self.bump();
            let (alt, h) = self.parse_sequence(depth)?;
            height = height.max(h);
            alts.push(alt);
        }
        let expr = if alts.len() == 1 {
            alts.pop().unwrap_or(Expr::Seq(Vec::new()))
        } else {
            Expr::Alt(alts)
        };
        Ok((expr, height))
    }

    /// Items up to `|`, `)`, the end of input or the start of the next rule.
    fn parse_sequence(&mut self, depth: usize) -> Result<(Expr, usize), GbnfError> {
        let mut items = Vec::new();
        let mut height = 0;
        loop {
            self.skip_ws(true);
            match self.peek() {
                None | Some('|') | Some(')') => break,
                Some(_) if self.at_rule_start() => break,
                Some(_) => {
                    let (item, h) = self.parse_postfix(depth)?;
                    height = height.max(h);
                    items.push(item);
                }
            }
        }
        let expr = if items.len() == 1 {
            items.pop().unwrap_or(Expr::Seq(Vec::new()))
        } else {
            Expr::Seq(items)
        };
        Ok((expr, height))
    }

    /// A primary followed by any number of `*`, `+`, `?`, `{...}`. Each operator wraps the
    /// previous expression, so each counts as one level of nesting.
    fn parse_postfix(&mut self, depth: usize) -> Result<(Expr, usize), GbnfError> {
        let (mut expr, mut height) = self.parse_primary(depth)?;
        loop {
            self.skip_ws(false);
            let at = self.mark();
            let (min, max) = match self.peek() {
                Some('*') => (0, None),
                Some('+') => (1, None),
                Some('?') => (0, Some(1)),
                Some('{') => {
                    self.bump();
                    self.parse_bounds(at)?
                }
                _ => break,
            };
            if self.pos == at.pos {
                // A one-character operator, not yet consumed.
                self.bump();
            }
            height += 1;
            if height > MAX_NESTING {
                return Err(GbnfError::TooDeep {
                    line: at.line,
                    column: at.column,
                    limit: MAX_NESTING,
                });
            }
            expr = repeat(expr, min, max);
        }
        Ok((expr, height))
    }

    /// The inside of `{m}`, `{m,}`, `{m,n}` (and `{,n}`, which llama.cpp also reads), after
    /// the `{` and through the `}`.
    fn parse_bounds(&mut self, open: Mark) -> Result<(u32, Option<u32>), GbnfError> {
        self.skip_ws(false);
        let min = self.parse_count(open)?;
        self.skip_ws(false);
        let max =
            if self.peek() == Some(',') {
                self.bump();
                self.skip_ws(false);
                if self.peek() == Some('}') {
                    None
                } else {
                    Some(self.parse_count(open)?.ok_or_else(|| {
                        self.syntax(open, "expected a number after `,` in `{m,n}`")
                    })?)
                }
            } else {
                Some(min.ok_or_else(|| self.syntax(open, "expected a number in `{m}`"))?)
            };
        self.skip_ws(false);
        if self.bump() != Some('}') {
            return Err(self.syntax(open, "unterminated repetition `{...`: expected `}`"));
        }
        let min = min.unwrap_or(0);
        if let Some(max) = max {
            if max < min {
                return Err(self.syntax(
                    open,
                    format!("repetition `{{{min},{max}}}` has its maximum below its minimum"),
                ));
            }
        }
        Ok((min, max))
    }

    /// A decimal count, or `None` when there are no digits here.
    fn parse_count(&mut self, open: Mark) -> Result<Option<u32>, GbnfError> {
        let mut value: Option<u32> = None;
        while let Some(d) = self.peek().and_then(|c| c.to_digit(10)) {
            self.bump();
            let v = value
                .unwrap_or(0)
                .saturating_mul(10)
                .saturating_add(d)
                .min(MAX_REPEAT + 1);
            value = Some(v);
        }
        match value {
            Some(v) if v > MAX_REPEAT => Err(GbnfError::RepeatTooLarge {
                line: open.line,
                column: open.column,
                limit: MAX_REPEAT,
            }),
            v => Ok(v),
        }
    }

    fn parse_primary(&mut self, depth: usize) -> Result<(Expr, usize), GbnfError> {
        let at = self.mark();
        let too_deep = GbnfError::TooDeep {
            line: at.line,
            column: at.column,
            limit: MAX_NESTING,
        };
        let expr = match self.peek() {
            Some('"') => {
                self.bump();
                self.parse_string(at)
            }
            Some('[') => {
                self.bump();
                self.parse_class(at)
            }
            Some('.') => {
                self.bump();
                Ok(Expr::Any)
            }
            Some('(') => {
                if depth + 1 > MAX_NESTING {
                    return Err(too_deep);
                }
                self.bump();
                let (inner, height) = self.parse_alternation(depth + 1)?;
                self.skip_ws(true);
                if self.bump() != Some(')') {
                    return Err(self.syntax(at, "unbalanced `(`: no matching `)`"));
                }
                if height + 1 > MAX_NESTING {
                    return Err(too_deep);
                }
                return Ok((inner, height + 1));
            }
            Some(c) if is_name_char(c) => {
                let name = self.parse_name();
                Ok(Expr::Ref {
                    name,
                    line: at.line,
                    column: at.column,
                })
            }
            Some(c @ ('*' | '+' | '?' | '{')) => Err(self.syntax(
                at,
                format!("repetition operator `{c}` with nothing before it to repeat"),
            )),
            Some(c) => Err(self.syntax(at, format!("unexpected character `{c}`"))),
            None => Err(self.syntax(at, "unexpected end of grammar")),
        }?;
        Ok((expr, 0))
    }

    /// The rest of a `"..."` literal after the opening quote.
    fn parse_string(&mut self, open: Mark) -> Result<Expr, GbnfError> {
        let mut s = String::new();
        loop {
            let at = self.mark();
            match self.bump() {
                None => return Err(self.syntax(open, "unterminated string literal")),
                Some('"') => return Ok(Expr::Lit(s)),
                Some('\\') => s.push(self.parse_escape(at)?),
                Some(c) => s.push(c),
            }
        }
    }

    /// The rest of a `[...]` class after the `[`.
    fn parse_class(&mut self, open: Mark) -> Result<Expr, GbnfError> {
        let negated = self.peek() == Some('^');
        if negated {
            self.bump();
        }
        let mut ranges = Vec::new();
        loop {
            let lo = match self.class_char(open)? {
                None => break,
                Some(c) => c,
            };
            // `-` makes a range unless it is the last character before `]`.
            if self.peek() == Some('-') && !matches!(self.peek_at(1), Some(']') | None) {
                let dash = self.mark();
                self.bump();
                let hi = self
                    .class_char(open)?
                    .ok_or_else(|| self.syntax(dash, "unterminated range in character class"))?;
                if hi < lo {
                    return Err(self.syntax(
                        dash,
                        format!(
                            "bad character class range `{}-{}`: end before start",
                            lo.escape_debug(),
                            hi.escape_debug()
                        ),
                    ));
                }
                ranges.push((lo, hi));
            } else {
                ranges.push((lo, lo));
            }
        }
        if ranges.is_empty() && !negated {
            return Err(self.syntax(open, "empty character class `[]` can never match"));
        }
        Ok(Expr::Class { negated, ranges })
    }

    /// One character of a class, or `None` at the closing `]`.
    fn class_char(&mut self, open: Mark) -> Result<Option<char>, GbnfError> {
        let at = self.mark();
        match self.bump() {
            None => Err(self.syntax(open, "unterminated character class: expected `]`")),
            Some(']') => Ok(None),
            Some('\\') => self.parse_escape(at).map(Some),
            Some(c) => Ok(Some(c)),
        }
    }

    /// The escape after a `\` (at `at`), in a string or a class.
    fn parse_escape(&mut self, at: Mark) -> Result<char, GbnfError> {
        let digits = match self.bump() {
            None => return Err(self.syntax(at, "`\\` at end of grammar")),
            Some('n') => return Ok('\n'),
            Some('t') => return Ok('\t'),
            Some('r') => return Ok('\r'),
            Some('x') => 2,
            Some('u') => 4,
            Some('U') => 8,
            // `\\`, `\"`, `\[`, `\]`, `\-`, `\^` and any other punctuation stand for themselves.
            Some(c) if c.is_ascii_punctuation() || c == ' ' => return Ok(c),
            Some(c) => return Err(self.syntax(at, format!("unknown escape `\\{c}`"))),
        };
        let mut value: u32 = 0;
        for _ in 0..digits {
            let d = self
                .peek()
                .and_then(|c| c.to_digit(16))
                .ok_or_else(|| self.syntax(at, format!("escape needs {digits} hex digits")))?;
            self.bump();
            // At most 8 hex digits, so this fits in a u32; saturate anyway to stay panic-free.
            value = value.saturating_mul(16).saturating_add(d);
        }
        char::from_u32(value).ok_or_else(|| {
            self.syntax(
                at,
                format!("escape U+{value:X} is not a valid Unicode scalar value"),
            )
        })
    }
}

/// `inner` repeated `min..=max` times, with the trivial cases folded away so that the output
/// stays readable and Lark never sees `{0}` (which it rejects).
fn repeat(inner: Expr, min: u32, max: Option<u32>) -> Expr {
    match (min, max) {
        (_, Some(0)) => Expr::Seq(Vec::new()),
        (1, Some(1)) => inner,
        _ if inner.is_empty() => Expr::Seq(Vec::new()),
        _ => Expr::Repeat {
            inner: Box::new(inner),
            min,
            max,
        },
    }
}

/// Every reference must name a defined rule. Bounded recursion: the parser keeps groups plus
/// operators within [`MAX_NESTING`], so the AST is at most a few times that deep.
fn check_references(rules: &[RuleDef]) -> Result<(), GbnfError> {
    fn walk(e: &Expr, defined: &HashSet<&str>) -> Result<(), GbnfError> {
        match e {
            Expr::Alt(items) | Expr::Seq(items) => {
                items.iter().try_for_each(|item| walk(item, defined))
            }
            Expr::Repeat { inner, .. } => walk(inner, defined),
            Expr::Ref { name, line, column } if !defined.contains(name.as_str()) => {
                Err(GbnfError::UndefinedRule {
                    rule: name.clone(),
                    line: *line,
                    column: *column,
                })
            }
            Expr::Ref { .. } | Expr::Lit(_) | Expr::Class { .. } | Expr::Any => Ok(()),
        }
    }
    let defined: HashSet<&str> = rules.iter().map(|r| r.name.as_str()).collect();
    rules.iter().try_for_each(|r| walk(&r.body, &defined))
}

/// Where an expression is written, which decides whether it needs parentheses.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ctx {
    /// A whole rule body or group contents: alternatives allowed as is.
    Body,
    /// One item of a sequence: alternatives need parentheses.
    SeqItem,
    /// The operand of a repetition operator: anything but an atom needs parentheses.
    Operand,
}

struct Emitter {
    /// GBNF rule name to Lark rule name.
    names: HashMap<String, String>,
    used: HashSet<String>,
    /// Auxiliary rules for hoisted deep groups, as (name, body).
    aux: Vec<(String, String)>,
}

impl Emitter {
    /// Assigns Lark names: `root` is `start`; others are lowercased with `-` as `_`, prefixed
    /// when they would not start with a letter, and suffixed on collision (GBNF names are case
    /// sensitive, Lark rule names must be lowercase).
    fn new(rules: &[RuleDef], root: usize) -> Self {
        let mut e = Emitter {
            names: HashMap::new(),
            used: HashSet::new(),
            aux: Vec::new(),
        };
        e.used.insert("start".to_string());
        if let Some(r) = rules.get(root) {
            e.names.insert(r.name.clone(), "start".to_string());
        }
        for r in rules {
            if r.name == "root" {
                continue;
            }
            let mut base: String = r
                .name
                .chars()
                .map(|c| {
                    if c == '-' {
                        '_'
                    } else {
                        c.to_ascii_lowercase()
                    }
                })
                .collect();
            if !base.starts_with(|c: char| c.is_ascii_lowercase()) {
                base.insert_str(0, "r_");
            }
            let name = e.fresh(&base);
            e.names.insert(r.name.clone(), name);
        }
        e
    }

    /// `base`, or `base_2`, `base_3`, ... whichever is not taken yet; marks it taken.
    fn fresh(&mut self, base: &str) -> String {
        let mut name = base.to_string();
        let mut n = 2u64;
        while self.used.contains(&name) {
            name = format!("{base}_{n}");
            n += 1;
        }
        self.used.insert(name.clone());
        name
    }

    fn emit_grammar(mut self, rules: &[RuleDef], root: usize) -> String {
        let mut out = String::new();
        // `start` first, then the rest in their original order, for readable output.
        let order = rules
            .get(root)
            .into_iter()
            .chain(rules.iter().filter(|r| r.name != "root"));
        for r in order {
            let mut body = String::new();
            self.emit(&r.body, Ctx::Body, 0, &mut body);
            let name = self.names.get(&r.name).cloned().unwrap_or_default();
            let _ = writeln!(out, "{name}: {body}");
        }
        for (name, body) in &self.aux {
            let _ = writeln!(out, "{name}: {body}");
        }
        out
    }

    /// Writes `e` in `ctx` at Lark group depth `depth`.
    fn emit(&mut self, e: &Expr, ctx: Ctx, depth: usize, out: &mut String) {
        let needs_parens = match e {
            Expr::Alt(_) => ctx != Ctx::Body,
            Expr::Seq(items) => items.len() > 1 && ctx == Ctx::Operand,
            Expr::Repeat { .. } => ctx == Ctx::Operand,
            Expr::Lit(_) | Expr::Class { .. } | Expr::Any | Expr::Ref { .. } => false,
        };
        if needs_parens {
            if depth + 1 >= HOIST_DEPTH {
                // Too deep for llguidance's Lark parser: give the group a rule of its own.
                let name = self.fresh("gbnf_aux");
                let mut body = String::new();
                self.emit(e, Ctx::Body, 0, &mut body);
                self.aux.push((name.clone(), body));
                out.push_str(&name);
            } else {
                out.push('(');
                self.emit_bare(e, depth + 1, out);
                out.push(')');
            }
        } else {
            self.emit_bare(e, depth, out);
        }
    }

    /// Writes `e` assuming the context needs no parentheses around it.
    fn emit_bare(&mut self, e: &Expr, depth: usize, out: &mut String) {
        match e {
            Expr::Alt(alts) => {
                for (i, alt) in alts.iter().enumerate() {
                    if i > 0 {
                        out.push_str(" | ");
                    }
                    self.emit(alt, Ctx::Body, depth, out);
                }
            }
            Expr::Seq(items) if items.is_empty() => out.push_str("\"\""),
            Expr::Seq(items) => {
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(' ');
                    }
                    self.emit(item, Ctx::SeqItem, depth, out);
                }
            }
            Expr::Lit(s) => push_lark_string(out, s),
            Expr::Class { negated, ranges } => push_class_regex(out, *negated, ranges),
            Expr::Any => out.push_str("/(?s:.)/"),
            Expr::Ref { name, .. } => {
                // References were checked before emitting; an unknown name cannot occur here.
                out.push_str(self.names.get(name).map_or("start", String::as_str));
            }
            Expr::Repeat { inner, min, max } => {
                self.emit(inner, Ctx::Operand, depth, out);
                let _ = match (min, max) {
                    (0, None) => write!(out, "*"),
                    (1, None) => write!(out, "+"),
                    (0, Some(1)) => write!(out, "?"),
                    (m, None) => write!(out, "{{{m},}}"),
                    (m, Some(n)) if m == n => write!(out, "{{{m}}}"),
                    (m, Some(n)) => write!(out, "{{{m},{n}}}"),
                };
            }
        }
    }
}

/// A Lark string literal: llguidance reads these as JSON strings, so serde_json's escaping is
/// exactly what it takes.
fn push_lark_string(out: &mut String, s: &str) {
    out.push_str(&serde_json::Value::from(s).to_string());
}

/// A character class as a Lark `/[...]/` regex (Rust `regex` syntax). Letters, digits and a
/// few inert characters are written as is; everything else as `\x{...}`, which can never be
/// mistaken for class syntax (`]`, `-`, `^`, `&&`, `[`), an escape, or the `/` that ends the
/// Lark token.
fn push_class_regex(out: &mut String, negated: bool, ranges: &[(char, char)]) {
    if ranges.is_empty() {
        // Only `[^]` gets here (plain `[]` is rejected): any code point.
        out.push_str("/(?s:.)/");
        return;
    }
    out.push_str(if negated { "/[^" } else { "/[" });
    for &(lo, hi) in ranges {
        push_class_char(out, lo);
        if hi != lo {
            out.push('-');
            push_class_char(out, hi);
        }
    }
    out.push_str("]/");
}

fn push_class_char(out: &mut String, c: char) {
    if c.is_ascii_alphanumeric() || matches!(c, ' ' | '_' | ',' | ':' | ';' | '=' | '"' | '\'') {
        out.push(c);
    } else {
        let _ = write!(out, "\\x{{{:x}}}", c as u32);
    }
}

#[cfg(test)]
mod tests;
