//! A subset of Lark's grammar format to a [`Grammar`] (start rule `start`).
//!
//! Supported: rules `name: a b | c` (lower case; `?name` and `!name` read as `name`; an
//! alias `-> x` is ignored), terminals `NAME: ...` (upper case, optional priority
//! `NAME.2`), continuation lines starting with `|`, `"literal"`, `"literal"i`, `/regex/`
//! with flags `i` and `s`, character ranges `"a".."z"`, grouping `( )`, optional `[ ]`,
//! postfix `?`, `*`, `+`, `~ n`, `~ n..m`, `//` comments, `%ignore` (terminals, literals or
//! regexes, allowed before any token and at the end) and `%import common.NAME` /
//! `%import common (A, B)` for Lark's common terminals. Anything else (templates,
//! `%declare`, `%override`, imports from other modules) raises [`GrammarError`] naming it.
//!
//! Lowering: a terminal is one regex (terminals it names are inlined; a cycle is an error),
//! so each terminal occurrence is one lexeme; rules go through the GBNF front end's lowering.
//! Lark's contextual lexer picks among terminals by priority and longest match; here text
//! is scanned inside the Earley items, so every tokenization the grammar allows is accepted
//! (the language of the rules over terminal strings, which is what a constraint needs).

use std::collections::HashMap;

use super::cfg::{Grammar, GrammarLimits};
use super::gbnf::{build, Expr};
use crate::constrain::GrammarError;

/// Lark's `common.lark` terminals (the usual ones), as regexes.
fn common(name: &str) -> Option<&'static str> {
    Some(match name {
        "DIGIT" => "[0-9]",
        "HEXDIGIT" => "[a-fA-F0-9]",
        "INT" => "[0-9]+",
        "SIGNED_INT" => "[+-]?[0-9]+",
        "DECIMAL" => r"[0-9]+\.[0-9]*|\.[0-9]+",
        "_EXP" => "[eE][+-]?[0-9]+",
        "FLOAT" => r"[0-9]+[eE][+-]?[0-9]+|(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?",
        "SIGNED_FLOAT" => {
            r"[+-]?(?:[0-9]+[eE][+-]?[0-9]+|(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)"
        }
        "NUMBER" => r"[0-9]+[eE][+-]?[0-9]+|(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[0-9]+",
        "SIGNED_NUMBER" => {
            r"[+-]?(?:[0-9]+[eE][+-]?[0-9]+|(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[0-9]+)"
        }
        "ESCAPED_STRING" => r#""(?:[^"\\]|\\(?s:.))*""#,
        "LCASE_LETTER" => "[a-z]",
        "UCASE_LETTER" => "[A-Z]",
        "LETTER" => "[a-zA-Z]",
        "WORD" => "[a-zA-Z]+",
        "CNAME" => "[_a-zA-Z][_a-zA-Z0-9]*",
        "WS_INLINE" => "[ \\t]+",
        "WS" => "[ \\t\\f\\r\\n]+",
        "CR" => "\\r",
        "LF" => "\\n",
        "NEWLINE" => "(?:\\r?\\n)+",
        "SH_COMMENT" => "#[^\\n]*",
        "CPP_COMMENT" => "//[^\\n]*",
        "C_COMMENT" => r"/\*(?:[^*]|\*+[^*/])*\*+/",
        "SQL_COMMENT" => "--[^\\n]*",
        _ => return None,
    })
}

/// Parse Lark `text` and build its grammar (start rule `start`).
pub fn parse(text: &str, limits: GrammarLimits) -> Result<Grammar, GrammarError> {
    let mut defs: Vec<(String, bool, String)> = Vec::new(); // (name, is_terminal, body)
    let mut ignore: Vec<String> = Vec::new();
    let mut imported: HashMap<String, String> = HashMap::new();
    for (lineno, raw) in text.lines().enumerate() {
        let line = strip_comment(raw);
        let t = line.trim();
        if t.is_empty() {
            continue;
        }
        let err = |m: String| GrammarError::Grammar(format!("line {}: {m}", lineno + 1));
        if let Some(stmt) = t.strip_prefix('%') {
            let (kw, rest) = stmt.split_once(char::is_whitespace).unwrap_or((stmt, ""));
            let rest = rest.trim();
            match kw {
                "ignore" => ignore.push(rest.to_owned()),
                "import" => {
                    for (name, alias) in import_names(rest).map_err(err)? {
                        let re = common(&name).ok_or_else(|| {
                            GrammarError::Unsupported(format!(
                                "%import of {name:?} (line {}): only Lark's common terminals",
                                lineno + 1
                            ))
                        })?;
                        imported.insert(alias, re.to_owned());
                    }
                }
                other => {
                    return Err(GrammarError::Unsupported(format!(
                        "%{other} (line {})",
                        lineno + 1
                    )))
                }
            }
            continue;
        }
        if let Some(alt) = t.strip_prefix('|') {
            let Some(last) = defs.last_mut() else {
                return Err(err("'|' before any rule".into()));
            };
            last.2.push_str(" | ");
            last.2.push_str(alt);
            continue;
        }
        let Some((head, body)) = t.split_once(':') else {
            return Err(err(format!("expected `name: ...`, found {t:?}")));
        };
        let head = head.trim().trim_start_matches(['?', '!']);
        // `NAME.2` (terminal priority): irrelevant without a lexer.
        let name = head.split('.').next().unwrap_or(head).trim();
        if name.is_empty() || !name.chars().all(|c| c == '_' || c.is_ascii_alphanumeric()) {
            if name.contains('{') {
                return Err(GrammarError::Unsupported(format!(
                    "template rule {name:?} (line {})",
                    lineno + 1
                )));
            }
            return Err(err(format!("bad rule name {name:?}")));
        }
        let terminal = name
            .trim_start_matches('_')
            .starts_with(|c: char| c.is_ascii_uppercase());
        defs.push((name.to_owned(), terminal, body.to_owned()));
    }
    let mut terms: HashMap<String, Expr> = HashMap::new();
    let mut rules: HashMap<String, Expr> = HashMap::new();
    let mut order = Vec::new();
    for (name, terminal, body) in &defs {
        let e = Parser::new(body, limits.max_depth).expansions_all()?;
        let table = if *terminal { &mut terms } else { &mut rules };
        if table.insert(name.clone(), e).is_some() || imported.contains_key(name) {
            return Err(GrammarError::Grammar(format!("{name:?} is defined twice")));
        }
        if !terminal {
            order.push(name.clone());
        }
    }
    // Terminals to regexes, in dependency order (a cycle is an error).
    let mut regexes: HashMap<String, String> = imported;
    let names: Vec<String> = terms.keys().cloned().collect();
    for n in &names {
        term_regex(n, &terms, &mut regexes, &mut Vec::new())?;
    }
    let ign = if ignore.is_empty() {
        None
    } else {
        let mut alts = Vec::new();
        for i in &ignore {
            let e = Parser::new(i, limits.max_depth).expansions_all()?;
            alts.push(terminal_expr_regex(
                &e,
                &terms,
                &mut regexes,
                &mut Vec::new(),
            )?);
        }
        Some(format!("(?:{})*", alts.join("|")))
    };
    let mut out = Vec::new();
    for name in &order {
        let e = rule_expr(&rules[name], &regexes, &rules, ign.as_deref())?;
        let e = match (&ign, name == "start") {
            (Some(i), true) => Expr::Seq(vec![e, Expr::Regex(i.clone())]),
            _ => e,
        };
        out.push((name.clone(), e));
    }
    build(&out, "start", limits)
}

fn strip_comment(line: &str) -> &str {
    // `//` outside a string or regex literal starts a comment.
    let b = line.as_bytes();
    let (mut i, mut quote) = (0, None::<u8>);
    while i < b.len() {
        match (quote, b[i]) {
            (Some(_), b'\\') => i += 1,
            (Some(q), c) if c == q => quote = None,
            (None, b'"') => quote = Some(b'"'),
            (None, b'/') if b.get(i + 1) == Some(&b'/') => return &line[..i],
            (None, b'/') => quote = Some(b'/'),
            _ => {}
        }
        i += 1;
    }
    line
}

/// `common.NAME`, `common.NAME -> ALIAS` or `common (A, B)` to (name, alias) pairs.
fn import_names(rest: &str) -> Result<Vec<(String, String)>, String> {
    let (module, names) = match rest.split_once('(') {
        Some((m, n)) => (
            m.trim(),
            n.trim_end_matches(')').split(',').collect::<Vec<_>>(),
        ),
        None => match rest.rsplit_once('.') {
            Some((m, n)) => (m.trim(), vec![n]),
            None => return Err(format!("bad %import {rest:?}")),
        },
    };
    if module != "common" {
        return Err(format!(
            "%import from {module:?}: only `common` is available"
        ));
    }
    Ok(names
        .iter()
        .map(|n| match n.split_once("->") {
            Some((a, b)) => (a.trim().to_owned(), b.trim().to_owned()),
            None => (n.trim().to_owned(), n.trim().to_owned()),
        })
        .filter(|(n, _)| !n.is_empty())
        .collect())
}

fn term_regex(
    name: &str,
    terms: &HashMap<String, Expr>,
    done: &mut HashMap<String, String>,
    stack: &mut Vec<String>,
) -> Result<String, GrammarError> {
    if let Some(r) = done.get(name) {
        return Ok(r.clone());
    }
    let Some(e) = terms.get(name) else {
        return Err(GrammarError::Grammar(format!(
            "undefined terminal {name:?}"
        )));
    };
    if stack.iter().any(|s| s == name) {
        return Err(GrammarError::Grammar(format!(
            "terminal {name:?} is recursive (terminals are regular)"
        )));
    }
    stack.push(name.to_owned());
    let r = terminal_expr_regex(e, terms, done, stack)?;
    stack.pop();
    done.insert(name.to_owned(), r.clone());
    Ok(r)
}

/// A terminal's body as one regex (names in it are terminals).
fn terminal_expr_regex(
    e: &Expr,
    terms: &HashMap<String, Expr>,
    done: &mut HashMap<String, String>,
    stack: &mut Vec<String>,
) -> Result<String, GrammarError> {
    Ok(match e {
        Expr::Ref(n) => {
            if !n
                .trim_start_matches('_')
                .starts_with(|c: char| c.is_ascii_uppercase())
            {
                return Err(GrammarError::Grammar(format!(
                    "a terminal refers to the rule {n:?}"
                )));
            }
            format!("(?:{})", term_regex(n, terms, done, stack)?)
        }
        Expr::Seq(xs) => {
            let mut s = String::new();
            for x in xs {
                s += &terminal_expr_regex(x, terms, done, stack)?;
            }
            format!("(?:{s})")
        }
        Expr::Alt(xs) => {
            let mut v = Vec::new();
            for x in xs {
                v.push(terminal_expr_regex(x, terms, done, stack)?);
            }
            format!("(?:{})", v.join("|"))
        }
        Expr::Repeat(x, m, n) => {
            let r = terminal_expr_regex(x, terms, done, stack)?;
            match n {
                None => format!("(?:{r}){{{m},}}"),
                Some(n) => format!("(?:{r}){{{m},{n}}}"),
            }
        }
        Expr::Regex(r) => format!("(?:{r})"),
        Expr::Lit(_) | Expr::Class { .. } | Expr::Any => {
            unreachable!("the Lark parser builds literals as regexes")
        }
    })
}

/// A rule body with terminals inlined as regexes, `ign` before every token.
fn rule_expr(
    e: &Expr,
    terms: &HashMap<String, String>,
    rules: &HashMap<String, Expr>,
    ign: Option<&str>,
) -> Result<Expr, GrammarError> {
    let token = |r: String| match ign {
        Some(i) => Expr::Regex(format!("{i}(?:{r})")),
        None => Expr::Regex(r),
    };
    Ok(match e {
        Expr::Ref(n) => match terms.get(n) {
            Some(r) => token(r.clone()),
            None if rules.contains_key(n) => Expr::Ref(n.clone()),
            None => return Err(GrammarError::Grammar(format!("undefined name {n:?}"))),
        },
        Expr::Regex(r) => token(r.clone()),
        Expr::Seq(xs) => Expr::Seq(
            xs.iter()
                .map(|x| rule_expr(x, terms, rules, ign))
                .collect::<Result<_, _>>()?,
        ),
        Expr::Alt(xs) => Expr::Alt(
            xs.iter()
                .map(|x| rule_expr(x, terms, rules, ign))
                .collect::<Result<_, _>>()?,
        ),
        Expr::Repeat(x, m, n) => Expr::Repeat(Box::new(rule_expr(x, terms, rules, ign)?), *m, *n),
        Expr::Lit(_) | Expr::Class { .. } | Expr::Any => {
            unreachable!("the Lark parser builds literals as regexes")
        }
    })
}

fn regex_escape(s: &str) -> String {
    s.chars()
        .map(|c| format!("\\x{{{:X}}}", c as u32))
        .collect()
}

struct Parser {
    chars: Vec<char>,
    pos: usize,
    depth: usize,
    max_depth: usize,
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
        let s: String = self.chars.iter().collect();
        GrammarError::Grammar(format!("{msg} at offset {} of {:?}", self.pos, s.trim()))
    }

    fn skip_ws(&mut self) {
        while self.chars.get(self.pos).is_some_and(|c| c.is_whitespace()) {
            self.pos += 1;
        }
    }

    fn peek(&mut self) -> Option<char> {
        self.skip_ws();
        self.chars.get(self.pos).copied()
    }

    fn eat(&mut self, s: &str) -> bool {
        self.skip_ws();
        let n = s.chars().count();
        if self.chars[self.pos..].iter().take(n).copied().eq(s.chars()) {
            self.pos += n;
            true
        } else {
            false
        }
    }

    fn expansions_all(mut self) -> Result<Expr, GrammarError> {
        let e = self.expansions()?;
        if self.peek().is_some() {
            return Err(self.err("unexpected text"));
        }
        Ok(e)
    }

    fn expansions(&mut self) -> Result<Expr, GrammarError> {
        self.depth += 1;
        if self.depth > self.max_depth {
            return Err(GrammarError::TooLarge(format!(
                "the grammar nests deeper than {} (max_depth)",
                self.max_depth
            )));
        }
        let mut alts = vec![self.sequence()?];
        while self.eat("|") {
            alts.push(self.sequence()?);
        }
        self.depth -= 1;
        Ok(if alts.len() == 1 {
            alts.pop().expect("one alternative")
        } else {
            Expr::Alt(alts)
        })
    }

    fn sequence(&mut self) -> Result<Expr, GrammarError> {
        let mut items = Vec::new();
        loop {
            match self.peek() {
                None | Some('|') | Some(')') | Some(']') => break,
                Some('-') if self.eat("->") => {
                    // An alias names the tree node: nothing to match.
                    self.skip_ws();
                    while self
                        .chars
                        .get(self.pos)
                        .is_some_and(|c| c.is_alphanumeric() || *c == '_')
                    {
                        self.pos += 1;
                    }
                    break;
                }
                _ => items.push(self.item()?),
            }
        }
        Ok(Expr::Seq(items))
    }

    fn item(&mut self) -> Result<Expr, GrammarError> {
        let atom = self.atom()?;
        let next = self.chars.get(self.pos).copied();
        Ok(match next {
            Some('?') => {
                self.pos += 1;
                Expr::Repeat(Box::new(atom), 0, Some(1))
            }
            Some('*') => {
                self.pos += 1;
                Expr::Repeat(Box::new(atom), 0, None)
            }
            Some('+') => {
                self.pos += 1;
                Expr::Repeat(Box::new(atom), 1, None)
            }
            _ if self.eat("~") => {
                let m = self.number()?;
                let n = if self.eat("..") { self.number()? } else { m };
                if n < m {
                    return Err(self.err(format!("empty range ~ {m}..{n}")));
                }
                Expr::Repeat(Box::new(atom), m, Some(n))
            }
            _ => atom,
        })
    }

    fn number(&mut self) -> Result<u32, GrammarError> {
        self.skip_ws();
        let start = self.pos;
        while self.chars.get(self.pos).is_some_and(char::is_ascii_digit) {
            self.pos += 1;
        }
        let s: String = self.chars[start..self.pos].iter().collect();
        s.parse().map_err(|_| self.err("expected a number"))
    }

    fn atom(&mut self) -> Result<Expr, GrammarError> {
        match self.peek() {
            Some('(') => {
                self.pos += 1;
                let e = self.expansions()?;
                if !self.eat(")") {
                    return Err(self.err("expected ')'"));
                }
                Ok(e)
            }
            Some('[') => {
                self.pos += 1;
                let e = self.expansions()?;
                if !self.eat("]") {
                    return Err(self.err("expected ']'"));
                }
                Ok(Expr::Repeat(Box::new(e), 0, Some(1)))
            }
            Some('"') => {
                let s = self.string()?;
                if self.eat("..") {
                    let hi = self.string()?;
                    let (mut a, mut b) = (s.chars(), hi.chars());
                    return match (a.next(), a.next(), b.next(), b.next()) {
                        (Some(lo), None, Some(hi), None) if lo <= hi => Ok(Expr::Regex(format!(
                            "[\\x{{{:X}}}-\\x{{{:X}}}]",
                            lo as u32, hi as u32
                        ))),
                        _ => Err(self.err("a range needs two single characters, low first")),
                    };
                }
                if self.chars.get(self.pos) == Some(&'i') {
                    self.pos += 1;
                    return Ok(Expr::Regex(format!("(?i:{})", regex_escape(&s))));
                }
                Ok(Expr::Regex(regex_escape(&s)))
            }
            Some('/') => {
                self.pos += 1;
                let mut r = String::new();
                loop {
                    match self.chars.get(self.pos) {
                        None => return Err(self.err("unterminated regex")),
                        Some('/') => break,
                        Some('\\') if self.chars.get(self.pos + 1) == Some(&'/') => {
                            r.push('/');
                            self.pos += 2;
                        }
                        Some('\\') => {
                            r.push('\\');
                            if let Some(&c) = self.chars.get(self.pos + 1) {
                                r.push(c);
                            }
                            self.pos += 2;
                        }
                        Some(&c) => {
                            r.push(c);
                            self.pos += 1;
                        }
                    }
                }
                self.pos += 1;
                let mut flags = String::new();
                while let Some(&c) = self.chars.get(self.pos).filter(|c| c.is_ascii_lowercase()) {
                    if c != 'i' && c != 's' {
                        return Err(GrammarError::Unsupported(format!("regex flag {c:?}")));
                    }
                    flags.push(c);
                    self.pos += 1;
                }
                Ok(Expr::Regex(if flags.is_empty() {
                    r
                } else {
                    format!("(?{flags}:{r})")
                }))
            }
            Some(c) if c == '_' || c.is_alphanumeric() => {
                let start = self.pos;
                while self
                    .chars
                    .get(self.pos)
                    .is_some_and(|c| *c == '_' || c.is_alphanumeric())
                {
                    self.pos += 1;
                }
                let name: String = self.chars[start..self.pos].iter().collect();
                if self.chars.get(self.pos) == Some(&'{') {
                    return Err(GrammarError::Unsupported(format!("template {name}{{...}}")));
                }
                Ok(Expr::Ref(name))
            }
            Some(c) => Err(self.err(format!("unexpected {c:?}"))),
            None => Err(self.err("unexpected end")),
        }
    }

    /// A `"..."` literal with Python-style escapes.
    fn string(&mut self) -> Result<String, GrammarError> {
        self.pos += 1;
        let mut s = String::new();
        loop {
            let Some(&c) = self.chars.get(self.pos) else {
                return Err(self.err("unterminated string"));
            };
            self.pos += 1;
            match c {
                '"' => return Ok(s),
                '\\' => {
                    let Some(&e) = self.chars.get(self.pos) else {
                        return Err(self.err("unterminated string"));
                    };
                    self.pos += 1;
                    s.push(match e {
                        'n' => '\n',
                        't' => '\t',
                        'r' => '\r',
                        'f' => '\x0c',
                        '0' => '\0',
                        'x' | 'u' | 'U' => {
                            let n = match e {
                                'x' => 2,
                                'u' => 4,
                                _ => 8,
                            };
                            let hex: String = self.chars.iter().skip(self.pos).take(n).collect();
                            self.pos += n;
                            u32::from_str_radix(&hex, 16)
                                .ok()
                                .and_then(char::from_u32)
                                .ok_or_else(|| self.err(format!("bad escape \\{e}{hex}")))?
                        }
                        other => other,
                    });
                }
                c => s.push(c),
            }
        }
    }
}
