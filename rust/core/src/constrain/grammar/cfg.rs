//! Context-free grammars over regex lexemes: the one representation every front end (GBNF, a
//! bare regex, later Lark and JSON Schema) builds through [`GrammarBuilder`], validated
//! (undefined rules, rules that derive no string) and bounded by [`GrammarLimits`].

use rustc_hash::{FxHashMap, FxHashSet};

use super::lexer::Lexeme;
use crate::constrain::{GrammarError, RegexLimits, TableDfa};

/// A right-hand-side symbol: a nonterminal or a lexeme (a regular language of bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Sym {
    Nt(u32),
    Lex(u32),
}

#[derive(Debug, Clone)]
pub struct Rule {
    pub lhs: u32,
    pub rhs: Vec<Sym>,
    /// Set when the rule is one arm of a [`MemberSet`]: completing it records the member.
    pub(super) arm: Option<Arm>,
}

/// The member a rule of a [`MemberSet`] derives; `cont`: the arm after a separator (its
/// items are only ever seeded by the completion of an earlier member, never predicted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Arm {
    pub set: u32,
    pub member: u32,
    pub cont: bool,
}

/// Most once-only members one set tracks (bits of an item's `used` word; the top byte
/// counts the members emitted).
pub const MAX_SET_MEMBERS: usize = 56;
/// Most members a set counts (`min`/`max`); past it the count saturates.
pub const MAX_SET_COUNT: u32 = 255;

/// Members in any order, each once-only member at most once, every required one present,
/// between `min` and `max` members in all, separated by a separator. Context-free only with
/// one nonterminal per subset (2^n); instead an Earley item carries the members used so far
/// in its `used` word (bits 0..56: once-only members; bits 56..64: the count), which
/// [`MemberSet::add`] updates when an arm completes.
#[derive(Debug, Clone)]
pub struct MemberSet {
    /// Bit i: member i is once-only (repeatable members have no bit).
    pub(super) once: u64,
    pub(super) required: u64,
    pub(super) min: u32,
    pub(super) max: Option<u32>,
    /// The continuation arms `(rule, member)`, filled by [`GrammarBuilder::build`].
    pub(super) cont: Vec<(u32, u32)>,
}

impl MemberSet {
    pub(super) fn count(used: u64) -> u32 {
        (used >> 56) as u32
    }

    /// `used` after member `m`.
    pub(super) fn add(&self, used: u64, m: u32) -> u64 {
        let bit = if m < 56 { (1u64 << m) & self.once } else { 0 };
        let count = (Self::count(used) + 1).min(MAX_SET_COUNT) as u64;
        (used & ((1 << 56) - 1)) | bit | (count << 56)
    }

    /// May the set end after `used`?
    pub(super) fn done(&self, used: u64) -> bool {
        used & self.required == self.required && Self::count(used) >= self.min
    }

    /// May member `m` follow `used`?
    pub(super) fn allows(&self, used: u64, m: u32) -> bool {
        let free = m >= 56 || (1u64 << m) & self.once & used == 0;
        free && self.max.is_none_or(|x| Self::count(used) < x)
    }
}

/// Bounds checked while a grammar is built and compiled; exceeding one raises
/// [`GrammarError::TooLarge`] naming the limit.
#[derive(Debug, Clone, Copy)]
pub struct GrammarLimits {
    /// Right-hand-side symbols over all rules (after desugaring repetitions).
    pub max_symbols: usize,
    /// DFA states over all lexemes.
    pub max_lexer_states: usize,
    /// Nesting depth of the front end's expressions (parentheses, schema nesting).
    pub max_depth: usize,
    /// Per-lexeme automaton limits.
    pub lexeme: RegexLimits,
    /// Memory cap of the per-parser-state mask cache (beyond it masks are recomputed).
    pub cache_bytes: usize,
    /// Parser states (interned Earley sets plus origin nodes) one compiled grammar may
    /// create; states stay valid for the grammar's life, so past this every later step
    /// raises [`GrammarError::TooLarge`] instead of growing memory without bound.
    pub max_states: usize,
}

impl Default for GrammarLimits {
    fn default() -> Self {
        GrammarLimits {
            max_symbols: 1 << 20,
            max_lexer_states: 1 << 16,
            max_depth: 256,
            lexeme: RegexLimits {
                automaton_bytes: 16 << 20,
                table_bytes: 16 << 20,
            },
            cache_bytes: crate::constrain::DEFAULT_CACHE_BYTES,
            max_states: 1 << 22,
        }
    }
}

/// A validated grammar: rules indexed by left-hand side, nullable nonterminals, compiled
/// lexemes, and the augmented start rule `<start> ::= root`.
#[derive(Debug)]
pub struct Grammar {
    pub(super) names: Vec<String>,
    pub(super) rules: Vec<Rule>,
    pub(super) by_lhs: Vec<Vec<u32>>,
    pub(super) nullable: Vec<bool>,
    /// Per nonterminal B: the nonterminals C with `C =>* β B ...`, β nullable (B included),
    /// i.e. those whose prediction leads to B's.
    pub(super) left_of: Vec<FxHashSet<u32>>,
    pub(super) lexemes: Vec<Lexeme>,
    pub(super) sets: Vec<MemberSet>,
    pub(super) start_rule: u32,
    pub(super) limits: GrammarLimits,
}

impl Grammar {
    pub fn num_rules(&self) -> usize {
        self.rules.len()
    }

    pub fn num_lexemes(&self) -> usize {
        self.lexemes.len()
    }

    pub fn limits(&self) -> &GrammarLimits {
        &self.limits
    }

    /// The grammar in a BNF-like text (rules as built, lexemes as regexes): for errors and
    /// debugging only.
    pub fn describe(&self) -> String {
        let mut s = String::new();
        for r in &self.rules {
            s.push_str(&self.names[r.lhs as usize]);
            s.push_str(" ::=");
            for sym in &r.rhs {
                match *sym {
                    Sym::Nt(n) => s.push_str(&format!(" {}", self.names[n as usize])),
                    Sym::Lex(l) => s.push_str(&format!(" /{}/", self.lexemes[l as usize].regex)),
                }
            }
            s.push('\n');
        }
        s
    }
}

/// Builds a [`Grammar`]: nonterminals by name (referenced before or after their rules),
/// lexemes by regex (deduplicated, compiled on first use so a front end can fall back when
/// one is too large), rules appended in order.
#[derive(Debug)]
pub struct GrammarBuilder {
    names: Vec<String>,
    by_name: FxHashMap<String, u32>,
    defined: Vec<bool>,
    rules: Vec<Rule>,
    lexemes: Vec<Lexeme>,
    lex_by_regex: FxHashMap<String, u32>,
    /// Units of counted lexemes, by regex (their ids key shared masks).
    units: FxHashMap<String, u32>,
    sets: Vec<MemberSet>,
    symbols: usize,
    lexer_states: usize,
    limits: GrammarLimits,
}

impl GrammarBuilder {
    pub fn new(limits: GrammarLimits) -> Self {
        GrammarBuilder {
            names: Vec::new(),
            by_name: FxHashMap::default(),
            defined: Vec::new(),
            rules: Vec::new(),
            lexemes: Vec::new(),
            lex_by_regex: FxHashMap::default(),
            units: FxHashMap::default(),
            sets: Vec::new(),
            symbols: 0,
            lexer_states: 0,
            limits,
        }
    }

    pub fn limits(&self) -> &GrammarLimits {
        &self.limits
    }

    /// The nonterminal named `name` (created on first mention).
    pub fn nonterminal(&mut self, name: &str) -> u32 {
        if let Some(&n) = self.by_name.get(name) {
            return n;
        }
        let n = self.names.len() as u32;
        self.names.push(name.to_owned());
        self.by_name.insert(name.to_owned(), n);
        self.defined.push(false);
        n
    }

    /// A new helper nonterminal (its name cannot clash with a user rule's).
    pub fn fresh(&mut self, hint: &str) -> u32 {
        let name = format!("{hint}#{}", self.names.len());
        self.nonterminal(&name)
    }

    /// The lexeme matching exactly `regex` (whole-match, UTF-8 byte semantics).
    pub fn lexeme(&mut self, regex: &str) -> Result<Sym, GrammarError> {
        if let Some(&l) = self.lex_by_regex.get(regex) {
            return Ok(Sym::Lex(l));
        }
        let lex = Lexeme::compile(regex, self.limits.lexeme)?;
        self.push_lexeme(lex)
    }

    /// A lexeme from a ready DFA, deduplicated by `key` (which must identify its language).
    pub fn lexeme_dfa(
        &mut self,
        key: &str,
        dfa: impl FnOnce() -> Result<TableDfa, GrammarError>,
    ) -> Result<Sym, GrammarError> {
        if let Some(&l) = self.lex_by_regex.get(key) {
            return Ok(Sym::Lex(l));
        }
        self.push_lexeme(Lexeme::from_dfa(key, dfa()?))
    }

    /// `min..=max` repetitions (`max` None: unbounded) of the prefix-free `unit` (one string
    /// character), counted in the lexeme's state rather than unrolled into a DFA whose size
    /// would grow with `max`.
    pub fn counted_lexeme(
        &mut self,
        unit: &str,
        min: u32,
        max: Option<u32>,
    ) -> Result<Sym, GrammarError> {
        let key = match max {
            Some(m) => format!("(?:{unit}){{{min},{m}}}"),
            None => format!("(?:{unit}){{{min},}}"),
        };
        if let Some(&l) = self.lex_by_regex.get(&key) {
            return Ok(Sym::Lex(l));
        }
        let n = self.units.len() as u32;
        let unit_id = *self.units.entry(unit.to_owned()).or_insert(n);
        let dfa = TableDfa::compile(unit, self.limits.lexeme)?;
        self.push_lexeme(Lexeme::counted(&key, dfa, unit_id, min, max)?)
    }

    fn push_lexeme(&mut self, lex: Lexeme) -> Result<Sym, GrammarError> {
        self.lexer_states += lex.num_states();
        if self.lexer_states > self.limits.max_lexer_states {
            return Err(GrammarError::TooLarge(format!(
                "the lexemes need more than {} DFA states (max_lexer_states)",
                self.limits.max_lexer_states
            )));
        }
        let l = self.lexemes.len() as u32;
        self.lex_by_regex.insert(lex.regex.clone(), l);
        self.lexemes.push(lex);
        Ok(Sym::Lex(l))
    }

    /// Add `lhs ::= rhs` (an empty `rhs` derives the empty string).
    pub fn rule(&mut self, lhs: u32, rhs: Vec<Sym>) -> Result<(), GrammarError> {
        self.symbols += rhs.len() + 1;
        if self.symbols > self.limits.max_symbols {
            return Err(GrammarError::TooLarge(format!(
                "the grammar has more than {} symbols (max_symbols)",
                self.limits.max_symbols
            )));
        }
        self.defined[lhs as usize] = true;
        self.rules.push(Rule {
            lhs,
            rhs,
            arm: None,
        });
        Ok(())
    }

    /// Define `lhs` as a member set (`MemberSet`) of `members` (each a symbol, `required`,
    /// `once`), `sep` between members, `min..=max` members in all. The grammar stays the size
    /// of its members (two arms each) whatever their number.
    pub fn member_set(
        &mut self,
        lhs: u32,
        members: &[(Sym, bool, bool)],
        sep: Sym,
        min: u32,
        max: Option<u32>,
    ) -> Result<(), GrammarError> {
        let (mut once, mut required) = (0u64, 0u64);
        let mut n_once = 0;
        let mut index = Vec::new();
        for &(_, req, o) in members {
            // Once-only members take bits 0..56 in order; repeatable ones count from 56 up.
            let m = if o { n_once } else { 56 + index.len() as u32 };
            if o {
                n_once += 1;
                if n_once as usize > MAX_SET_MEMBERS {
                    return Err(GrammarError::TooLarge(format!(
                        "a member set of more than {MAX_SET_MEMBERS} once-only members"
                    )));
                }
                once |= 1 << m;
                if req {
                    required |= 1 << m;
                }
            } else if req {
                return Err(GrammarError::Grammar(
                    "a repeatable member cannot be required".into(),
                ));
            }
            index.push(m);
        }
        if min > MAX_SET_COUNT || max.is_some_and(|m| m > MAX_SET_COUNT) {
            return Err(GrammarError::TooLarge(format!(
                "a member set counting past {MAX_SET_COUNT}"
            )));
        }
        let set = self.sets.len() as u32;
        self.sets.push(MemberSet {
            once,
            required,
            min,
            max,
            cont: Vec::new(),
        });
        let cont_nt = self.fresh("set-cont");
        // (With `max` 0 no member may come: only the empty set.)
        let members = if max == Some(0) { &[][..] } else { members };
        for (&(sym, _, _), &m) in members.iter().zip(&index) {
            for (nt, rhs, cont) in [(lhs, vec![sym], false), (cont_nt, vec![sep, sym], true)] {
                self.rule(nt, rhs)?;
                let last = self.rules.len() - 1;
                self.rules[last].arm = Some(Arm {
                    set,
                    member: m,
                    cont,
                });
            }
        }
        if required == 0 && min == 0 {
            self.rule(lhs, vec![])?;
        }
        // (The continuation nonterminal is never referenced: its arms are seeded directly.)
        self.defined[cont_nt as usize] = true;
        Ok(())
    }

    /// Validate and index the grammar, starting at `start`.
    pub fn build(mut self, start: u32) -> Result<Grammar, GrammarError> {
        let undefined: Vec<&str> = (0..self.names.len())
            .filter(|&n| !self.defined[n])
            .map(|n| self.names[n].as_str())
            .collect();
        if !undefined.is_empty() {
            return Err(GrammarError::Grammar(format!(
                "undefined rules: {}",
                undefined.join(", ")
            )));
        }
        let aug = self.nonterminal("<start>");
        self.rules.push(Rule {
            lhs: aug,
            rhs: vec![Sym::Nt(start)],
            arm: None,
        });
        let n = self.names.len();
        // Productive nonterminals (derive some string): a rule using an unproductive symbol
        // can never complete, and would break the parser's "alive = completable" invariant.
        let lex_ok: Vec<bool> = self.lexemes.iter().map(|l| !l.is_empty()).collect();
        let mut productive = vec![false; n];
        let sym_ok = |s: &Sym, p: &[bool]| match *s {
            Sym::Nt(a) => p[a as usize],
            Sym::Lex(l) => lex_ok[l as usize],
        };
        loop {
            let mut changed = false;
            for r in &self.rules {
                if !productive[r.lhs as usize] && r.rhs.iter().all(|s| sym_ok(s, &productive)) {
                    productive[r.lhs as usize] = true;
                    changed = true;
                }
            }
            if !changed {
                break;
            }
        }
        if !productive[start as usize] {
            return Err(GrammarError::Grammar(format!(
                "rule {:?} derives no finite string",
                self.names[start as usize]
            )));
        }
        self.rules
            .retain(|r| r.rhs.iter().all(|s| sym_ok(s, &productive)));
        let start_rule = self.rules.len() as u32 - 1;
        let mut nullable = vec![false; n];
        loop {
            let mut changed = false;
            for r in &self.rules {
                let all = r.rhs.iter().all(|s| match *s {
                    Sym::Nt(a) => nullable[a as usize],
                    Sym::Lex(l) => self.lexemes[l as usize].nullable(),
                });
                if !nullable[r.lhs as usize] && all {
                    nullable[r.lhs as usize] = true;
                    changed = true;
                }
            }
            if !changed {
                break;
            }
        }
        // Left-corner edges D -> C (C's rule starts with D after a nullable prefix), then for
        // each B everything that reaches it.
        let mut up: Vec<Vec<u32>> = vec![Vec::new(); n];
        for r in &self.rules {
            for s in &r.rhs {
                if let Sym::Nt(d) = *s {
                    up[d as usize].push(r.lhs);
                }
                let nullable_sym = match *s {
                    Sym::Nt(a) => nullable[a as usize],
                    Sym::Lex(l) => self.lexemes[l as usize].nullable(),
                };
                if !nullable_sym {
                    break;
                }
            }
        }
        let mut left_of: Vec<FxHashSet<u32>> = Vec::with_capacity(n);
        let mut total = 0usize;
        for b in 0..n as u32 {
            let mut seen = FxHashSet::default();
            let mut stack = vec![b];
            while let Some(c) = stack.pop() {
                if seen.insert(c) {
                    stack.extend(up[c as usize].iter().copied());
                }
            }
            total += seen.len();
            if total > self.limits.max_symbols.saturating_mul(16) {
                return Err(GrammarError::TooLarge(format!(
                    "the left-corner table exceeds {} entries (16 * max_symbols)",
                    self.limits.max_symbols.saturating_mul(16)
                )));
            }
            left_of.push(seen);
        }
        let mut by_lhs = vec![Vec::new(); n];
        for (i, r) in self.rules.iter().enumerate() {
            match r.arm {
                Some(a) if a.cont => self.sets[a.set as usize].cont.push((i as u32, a.member)),
                _ => by_lhs[r.lhs as usize].push(i as u32),
            }
        }
        Ok(Grammar {
            names: self.names,
            rules: self.rules,
            by_lhs,
            nullable,
            left_of,
            lexemes: self.lexemes,
            sets: self.sets,
            start_rule,
            limits: self.limits,
        })
    }
}
