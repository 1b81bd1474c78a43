//! GBNF (the grammar format llama.cpp documents) to a [`Grammar`].
//!
//! Syntax: rules `name ::= alternatives`, start rule `root`; `|` alternation, `( )`
//! grouping, postfix `*`, `+`, `?`, `{m}`, `{m,}`, `{m,n}`; string literals `"..."`, character
//! classes `[...]` / `[^...]` with ranges, `.` (any character); escapes `\n \r \t \\ \" \[ \]`
//! `\xHH \uHHHH \UHHHHHHHH`; `#` comments. Characters are Unicode code points matched as
//! UTF-8 bytes. Newlines are plain whitespace here: a rule ends where the next `name ::=`
//! starts, which accepts every grammar llama.cpp accepts.
//!
//! Lowering: every sub-expression free of rule references becomes one regex lexeme (so
//! `[0-9]+ "." [0-9]*` is one DFA, not a chain of parser items); the rest become rules,
//! repetitions left-recursive (`r ::= r x | ε`, cheap for Earley and keeping parser states
//! recurrent). A lexeme whose DFA would be too large falls back to rules.

use super::cfg::{Grammar, GrammarBuilder, GrammarLimits, Sym};
use crate::constrain::GrammarError;

#[derive(Debug, Clone)]
pub(super) enum Expr {
    Alt(Vec<Expr>),
    Seq(Vec<Expr>),
    Lit(Vec<char>),
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
    Any,
    Ref(String),
    Repeat(Box<Expr>, u32, Option<u32>),
    /// A regex (the Lark front end's `/.../` and terminals).
    Regex(String),
}

/// Parse GBNF `text` and build its grammar (start rule `root`).
pub fn parse(text: &str, limits: GrammarLimits) -> Result<Grammar, GrammarError> {
    let rules = Parser::new(text, limits.max_depth).grammar()?;
    build(&rules, "root", limits)
}

/// The grammar of named rules (`start` the start rule), each name defined once.
pub(super) fn build(
    rules: &[(String, Expr)],
    start: &str,
    limits: GrammarLimits,
) -> Result<Grammar, GrammarError> {
    let mut b = GrammarBuilder::new(limits);
    let mut seen = std::collections::HashSet::new();
    for (name, _) in rules {
        if !seen.insert(name.as_str()) {
            return Err(GrammarError::Grammar(format!(
                "rule {name:?} is defined twice"
            )));
        }
        b.nonterminal(name);
    }
    for (name, body) in rules {
        let lhs = b.nonterminal(name);
        lower_rule(&mut b, lhs, body)?;
    }
    if !rules.iter().any(|(n, _)| n == start) {
        return Err(GrammarError::Grammar(format!("no rule named {start:?}")));
    }
    let root = b.nonterminal(start);
    b.build(root)
}

// ---------------------------------------------------------------------------------------
// Text -> expressions

struct Parser {
    chars: Vec<char>,
    pos: usize,
    depth: usize,
    max_depth: usize,
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-' || c == '_'
}

impl Parser {
    fn new(text: &str, max_depth: usize) -> Self {
        Parser {
            chars: text.chars().collect(),
            pos: 0,
            depth: 0,
            max_depth,
        }
    }

    fn err(&self, msg: impl std::fmt::Display) -> GrammarError {
        let before: String = self.chars[..self.pos.min(self.chars.len())]
            .iter()
            .collect();
        let line = before.matches('\n').count() + 1;
        let col = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
        GrammarError::Grammar(format!("GBNF line {line}, column {col}: {msg}"))
    }

    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn skip_ws(&mut self) {
        while let Some(c) = self.peek() {
            if c.is_whitespace() {
                self.pos += 1;
            } else if c == '#' {
                while let Some(c) = self.peek() {
                    if c == '\n' {
                        break;
                    }
                    self.pos += 1;
                }
            } else {
                break;
            }
        }
    }

    fn name(&mut self) -> Option<String> {
        let start = self.pos;
        while self.peek().is_some_and(is_name_char) {
            self.pos += 1;
        }
        (self.pos > start).then(|| self.chars[start..self.pos].iter().collect())
    }

    /// Is a rule head (`name ::=`) at the current position?
    fn at_rule_head(&mut self) -> bool {
        let save = self.pos;
        let head = self.name().is_some() && {
            self.skip_ws();
            self.eat("::=")
        };
        self.pos = save;
        head
    }

    fn eat(&mut self, s: &str) -> bool {
        let n = s.chars().count();
        if self.chars.len() >= self.pos + n
            && self.chars[self.pos..self.pos + n]
                .iter()
                .copied()
                .eq(s.chars())
        {
            self.pos += n;
            true
        } else {
            false
        }
    }

    fn grammar(mut self) -> Result<Vec<(String, Expr)>, GrammarError> {
        let mut rules = Vec::new();
        self.skip_ws();
        while self.peek().is_some() {
            let name = self
                .name()
                .ok_or_else(|| self.err("expected a rule name"))?;
            self.skip_ws();
            if !self.eat("::=") {
                return Err(self.err(format!("expected '::=' after {name:?}")));
            }
            self.skip_ws();
            let body = self.alternatives()?;
            rules.push((name, body));
            self.skip_ws();
        }
        if rules.is_empty() {
            return Err(self.err("the grammar has no rules"));
        }
        Ok(rules)
    }

    fn alternatives(&mut self) -> Result<Expr, GrammarError> {
        let mut alts = vec![self.sequence()?];
        while self.peek() == Some('|') {
            self.pos += 1;
            self.skip_ws();
            alts.push(self.sequence()?);
        }
        Ok(if alts.len() == 1 {
            alts.pop().expect("one")
        } else {
            Expr::Alt(alts)
        })
    }

    fn sequence(&mut self) -> Result<Expr, GrammarError> {
        let mut items = Vec::new();
        loop {
            self.skip_ws();
            match self.peek() {
                None | Some('|') | Some(')') => break,
                _ if self.at_rule_head() => break,
                _ => {}
            }
            let mut e = self.primary()?;
            loop {
                e = match self.peek() {
                    Some('*') => Expr::Repeat(Box::new(e), 0, None),
                    Some('+') => Expr::Repeat(Box::new(e), 1, None),
                    Some('?') => Expr::Repeat(Box::new(e), 0, Some(1)),
                    Some('{') => {
                        self.pos += 1;
                        let (m, n) = self.braces()?;
                        e = Expr::Repeat(Box::new(e), m, n);
                        continue;
                    }
                    _ => break,
                };
                self.pos += 1;
            }
            items.push(e);
        }
        Ok(if items.len() == 1 {
            items.pop().expect("one")
        } else {
            Expr::Seq(items)
        })
    }

    fn number(&mut self) -> Result<u32, GrammarError> {
        let start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
        }
        let s: String = self.chars[start..self.pos].iter().collect();
        s.parse()
            .map_err(|_| self.err("expected a repetition count"))
    }

    /// `{m}`, `{m,}`, `{m,n}` after the `{`.
    fn braces(&mut self) -> Result<(u32, Option<u32>), GrammarError> {
        self.skip_ws();
        let m = self.number()?;
        self.skip_ws();
        let n = if self.eat(",") {
            self.skip_ws();
            if self.peek() == Some('}') {
                None
            } else {
                Some(self.number()?)
            }
        } else {
            Some(m)
        };
        self.skip_ws();
        if !self.eat("}") {
            return Err(self.err("expected '}'"));
        }
        if n.is_some_and(|n| n < m) {
            return Err(self.err(format!(
                "repetition {{{m},{}}} has max < min",
                n.unwrap_or(0)
            )));
        }
        Ok((m, n))
    }

    fn primary(&mut self) -> Result<Expr, GrammarError> {
        match self.peek() {
            Some('"') => {
                self.pos += 1;
                let mut s = Vec::new();
                loop {
                    match self.peek() {
                        None => return Err(self.err("unterminated string literal")),
                        Some('"') => {
                            self.pos += 1;
                            break;
                        }
                        _ => s.push(self.char_()?),
                    }
                }
                Ok(Expr::Lit(s))
            }
            Some('[') => {
                self.pos += 1;
                let negated = self.eat("^");
                let mut ranges = Vec::new();
                loop {
                    match self.peek() {
                        None => return Err(self.err("unterminated character class")),
                        Some(']') => {
                            self.pos += 1;
                            break;
                        }
                        _ => {
                            let lo = self.char_()?;
                            let hi = if self.peek() == Some('-')
                                && self.chars.get(self.pos + 1).is_some_and(|&c| c != ']')
                            {
                                self.pos += 1;
                                self.char_()?
                            } else {
                                lo
                            };
                            if hi < lo {
                                return Err(self.err(format!("bad range {lo:?}-{hi:?}")));
                            }
                            ranges.push((lo, hi));
                        }
                    }
                }
                Ok(Expr::Class { negated, ranges })
            }
            Some('.') => {
                self.pos += 1;
                Ok(Expr::Any)
            }
            Some('(') => {
                self.pos += 1;
                self.depth += 1;
                if self.depth > self.max_depth {
                    return Err(GrammarError::TooLarge(format!(
                        "GBNF nests parentheses deeper than {} (max_depth)",
                        self.max_depth
                    )));
                }
                self.skip_ws();
                let e = self.alternatives()?;
                self.skip_ws();
                if !self.eat(")") {
                    return Err(self.err("expected ')'"));
                }
                self.depth -= 1;
                Ok(e)
            }
            Some(c) if is_name_char(c) => Ok(Expr::Ref(self.name().expect("a name char"))),
            Some(c) => Err(self.err(format!("unexpected {c:?}"))),
            None => Err(self.err("unexpected end of grammar")),
        }
    }

    /// One (possibly escaped) character of a literal or class.
    fn char_(&mut self) -> Result<char, GrammarError> {
        let c = self.peek().ok_or_else(|| self.err("unexpected end"))?;
        self.pos += 1;
        if c != '\\' {
            return Ok(c);
        }
        let e = self.peek().ok_or_else(|| self.err("unfinished escape"))?;
        self.pos += 1;
        let hex = |p: &mut Self, n: usize| -> Result<char, GrammarError> {
            let s: String = p
                .chars
                .get(p.pos..p.pos + n)
                .unwrap_or(&[])
                .iter()
                .collect();
            let v = (s.len() == n)
                .then(|| u32::from_str_radix(&s, 16).ok())
                .flatten()
                .ok_or_else(|| p.err(format!("expected {n} hex digits")))?;
            p.pos += n;
            char::from_u32(v).ok_or_else(|| p.err(format!("U+{v:X} is not a character")))
        };
        match e {
            'n' => Ok('\n'),
            'r' => Ok('\r'),
            't' => Ok('\t'),
            '\\' | '"' | '[' | ']' | '-' | '^' => Ok(e),
            'x' => hex(self, 2),
            'u' => hex(self, 4),
            'U' => hex(self, 8),
            _ => {
                self.pos -= 1;
                Err(self.err(format!("unknown escape '\\{e}'")))
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Expressions -> rules and lexemes

fn esc(c: char) -> String {
    format!("\\x{{{:X}}}", c as u32)
}

/// The expression as a regex when it references no rule.
fn to_regex(e: &Expr) -> Option<String> {
    Some(match e {
        Expr::Lit(s) => s.iter().map(|&c| esc(c)).collect(),
        Expr::Class { negated, ranges } => {
            if ranges.is_empty() {
                // `[]` matches nothing, `[^]` any character.
                return Some(if *negated {
                    "(?s:.)".into()
                } else {
                    "[^\\x{0}-\\x{10FFFF}]".into()
                });
            }
            let body: String = ranges
                .iter()
                .map(|&(lo, hi)| format!("{}-{}", esc(lo), esc(hi)))
                .collect();
            format!("[{}{body}]", if *negated { "^" } else { "" })
        }
        Expr::Any => "(?s:.)".into(),
        Expr::Regex(r) => format!("(?:{r})"),
        Expr::Ref(_) => return None,
        Expr::Seq(xs) => {
            let parts: Option<Vec<String>> = xs.iter().map(to_regex).collect();
            parts?.iter().map(|p| format!("(?:{p})")).collect()
        }
        Expr::Alt(xs) => {
            let parts: Option<Vec<String>> = xs.iter().map(to_regex).collect();
            format!("(?:{})", parts?.join("|"))
        }
        Expr::Repeat(x, m, n) => {
            let r = to_regex(x)?;
            match n {
                None => format!("(?:{r}){{{m},}}"),
                Some(n) => format!("(?:{r}){{{m},{n}}}"),
            }
        }
    })
}

/// One lexeme for `e` if it references no rule and its DFA fits; `None` to lower it to rules.
fn try_lexeme(b: &mut GrammarBuilder, e: &Expr) -> Result<Option<Sym>, GrammarError> {
    let Some(r) = to_regex(e) else {
        return Ok(None);
    };
    match b.lexeme(&r) {
        Ok(s) => Ok(Some(s)),
        // Composite expressions can retry as rules; a single literal or class cannot.
        Err(GrammarError::TooLarge(_))
            if matches!(e, Expr::Seq(_) | Expr::Alt(_) | Expr::Repeat(..)) =>
        {
            Ok(None)
        }
        Err(err) => Err(err),
    }
}

fn lower_rule(b: &mut GrammarBuilder, lhs: u32, body: &Expr) -> Result<(), GrammarError> {
    if let Some(s) = try_lexeme(b, body)? {
        return b.rule(lhs, vec![s]);
    }
    match body {
        Expr::Alt(alts) => {
            for a in alts {
                let rhs = lower_seq(b, a)?;
                b.rule(lhs, rhs)?;
            }
            Ok(())
        }
        _ => {
            let rhs = lower_seq(b, body)?;
            b.rule(lhs, rhs)
        }
    }
}

/// `e` as a sequence of symbols (runs of rule-free elements merged into one lexeme).
fn lower_seq(b: &mut GrammarBuilder, e: &Expr) -> Result<Vec<Sym>, GrammarError> {
    let Expr::Seq(xs) = e else {
        return Ok(vec![lower_one(b, e)?]);
    };
    let mut out = Vec::new();
    let mut i = 0;
    while i < xs.len() {
        let run = xs[i..].iter().take_while(|x| to_regex(x).is_some()).count();
        if run > 1 {
            if let Some(s) = try_lexeme(b, &Expr::Seq(xs[i..i + run].to_vec()))? {
                out.push(s);
                i += run;
                continue;
            }
        }
        if !matches!(&xs[i], Expr::Lit(s) if s.is_empty()) {
            out.push(lower_one(b, &xs[i])?);
        }
        i += 1;
    }
    Ok(out)
}

/// `e` as one symbol.
fn lower_one(b: &mut GrammarBuilder, e: &Expr) -> Result<Sym, GrammarError> {
    if let Some(s) = try_lexeme(b, e)? {
        return Ok(s);
    }
    match e {
        Expr::Ref(name) => Ok(Sym::Nt(b.nonterminal(name))),
        Expr::Repeat(x, m, n) => {
            let x = lower_one(b, x)?;
            lower_repeat(b, x, *m, *n)
        }
        _ => {
            let h = b.fresh("group");
            lower_rule(b, h, e)?;
            Ok(Sym::Nt(h))
        }
    }
}

/// `x{m,n}` (`n = None`: unbounded) as one nonterminal.
fn lower_repeat(
    b: &mut GrammarBuilder,
    x: Sym,
    m: u32,
    n: Option<u32>,
) -> Result<Sym, GrammarError> {
    let max = b.limits().max_symbols;
    if n.unwrap_or(m) as usize > max {
        return Err(GrammarError::TooLarge(format!(
            "a repetition of {} copies exceeds {max} symbols (max_symbols)",
            n.unwrap_or(m)
        )));
    }
    let r = b.fresh("repeat");
    let mut prefix = vec![x; m as usize];
    match n {
        None => {
            // star ::= star x | ε   (left recursion: Earley's cheap case)
            let star = b.fresh("star");
            b.rule(star, vec![Sym::Nt(star), x])?;
            b.rule(star, vec![])?;
            prefix.push(Sym::Nt(star));
        }
        Some(n) if n > m => {
            // opt_k ::= x opt_{k-1} | ε, nested n - m deep.
            let mut tail: Option<Sym> = None;
            for _ in m..n {
                let o = b.fresh("opt");
                let mut rhs = vec![x];
                rhs.extend(tail);
                b.rule(o, rhs)?;
                b.rule(o, vec![])?;
                tail = Some(Sym::Nt(o));
            }
            prefix.extend(tail);
        }
        Some(_) => {}
    }
    b.rule(r, prefix)?;
    Ok(Sym::Nt(r))
}
