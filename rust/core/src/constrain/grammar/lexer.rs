//! Lexemes: regular languages of bytes. Most are compiled to the same trimmed byte DFA the
//! regex constraint uses (so "not dead" means "some continuation completes the lexeme").
//! A bounded repetition of one string character (`maxLength: 32767`) is instead *counted*:
//! the state is (unit DFA state, count), computed on the fly, so the automaton stays the size
//! of one character's and states far from the bounds share one mask (see
//! [`Lexeme::mask_key`]).

use std::sync::{Arc, Mutex};

use rustc_hash::FxHashMap;

use crate::constrain::regex::{escaped_literal, RegexLimits, StateId, TableDfa, DEAD};
use crate::constrain::GrammarError;

/// Compiled lexeme automata by (regex, limits), shared by every grammar of the process: a
/// server's JSON Schemas all scan the same strings, numbers and punctuation, whose
/// automata would otherwise be rebuilt (the larger part of compiling a schema) each time.
type DfaKey = (String, usize, usize);
static DFAS: Mutex<Option<FxHashMap<DfaKey, Arc<TableDfa>>>> = Mutex::new(None);

/// Automata kept at most (small ones only: see [`DFA_CACHE_MAX_STATES`]).
const DFA_CACHE_MAX: usize = 4096;
const DFA_CACHE_MAX_STATES: usize = 256;

/// `regex`'s automaton from the process cache, or compiled (and kept if small); true when
/// the cache holds it (it then lives as long as the process).
fn cached_dfa(regex: &str, limits: RegexLimits) -> Result<(Arc<TableDfa>, bool), GrammarError> {
    let key = (regex.to_owned(), limits.automaton_bytes, limits.table_bytes);
    // A panic while holding the lock cannot leave a half-inserted entry.
    let lock = || DFAS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(d) = lock().get_or_insert_with(FxHashMap::default).get(&key) {
        return Ok((d.clone(), true));
    }
    let dfa = Arc::new(TableDfa::compile(regex, limits)?);
    let mut kept = false;
    if dfa.num_states() <= DFA_CACHE_MAX_STATES {
        let mut cache = lock();
        let map = cache.get_or_insert_with(FxHashMap::default);
        if map.len() < DFA_CACHE_MAX {
            map.insert(key, dfa.clone());
            kept = true;
        }
    }
    Ok((dfa, kept))
}

#[derive(Debug)]
pub struct Lexeme {
    pub regex: String,
    kind: Kind,
    /// The automaton is the process cache's (shared by every grammar that spells the regex).
    cached: bool,
}

#[derive(Debug)]
enum Kind {
    Dfa(Arc<TableDfa>),
    Counted(Counted),
}

/// A JSON string of `min..=max` units (`max` None: unbounded) between double quotes, the
/// unit (one character) prefix-free and non-empty. States: 0 dead, 1 before the opening
/// quote, 2 after the closing one (the only accepting state), and `3 + count * k + unit
/// state` inside (k: the unit's state count); an unbounded count saturates at `min`, so
/// states stay finite.
#[derive(Debug)]
struct Counted {
    unit: TableDfa,
    /// Identifies the unit's language among the grammar's counted lexemes (masks of states
    /// far from the bounds depend only on it).
    unit_id: u32,
    min: u32,
    max: Option<u32>,
    k: u32,
}

const BEFORE: StateId = StateId::from_index(1);
const CLOSED: StateId = StateId::from_index(2);
const INSIDE: u32 = 3;

/// States far from a counted lexeme's bounds, keyed by unit state and count deficit.
const FAR: u64 = 1 << 62;

/// A counted lexeme's state inside the quotes whose count cannot reach the maximum within
/// the bytes a token holds: there it behaves as the unit's star, closing at a unit boundary
/// once `deficit` more units have been read.
#[derive(Debug, Clone, Copy)]
pub struct FarUnit<'a> {
    pub unit: &'a TableDfa,
    pub u: StateId,
    /// Units still needed before the closing quote (capped past the token length).
    pub deficit: u32,
}

impl Counted {
    /// (count, unit state) of a state inside the quotes.
    #[inline]
    fn split(&self, q: StateId) -> Option<(u32, StateId)> {
        let idx = (q.index() as u32).checked_sub(INSIDE)?;
        Some((idx / self.k, StateId::from_index((idx % self.k) as usize)))
    }

    #[inline]
    fn join(&self, n: u32, u: StateId) -> StateId {
        StateId::from_index((INSIDE + n * self.k) as usize + u.index())
    }

    #[inline]
    fn next(&self, q: StateId, b: u8) -> StateId {
        let Some((n, u)) = self.split(q) else {
            return if q == BEFORE && b == b'"' {
                self.join(0, self.unit.start())
            } else {
                DEAD
            };
        };
        let start = self.unit.start();
        if u == start && b == b'"' {
            return if n >= self.min { CLOSED } else { DEAD };
        }
        if self.max.is_some_and(|m| n >= m) {
            return DEAD; // every other byte starts or continues one unit too many
        }
        match self.unit.next(u, b) {
            DEAD => DEAD,
            t if self.unit.is_accepting(t) => {
                let n2 = if self.max.is_none() {
                    (n + 1).min(self.min)
                } else {
                    n + 1
                };
                self.join(n2, start)
            }
            t => self.join(n, t),
        }
    }
}

impl Lexeme {
    pub fn compile(regex: &str, limits: RegexLimits) -> Result<Self, GrammarError> {
        // Literals are built directly (cheaper than a lookup's key) and not kept.
        let (dfa, cached) = match escaped_literal(regex) {
            Some(_) => (Arc::new(TableDfa::compile(regex, limits)?), false),
            None => cached_dfa(regex, limits)?,
        };
        Ok(Lexeme {
            regex: regex.to_owned(),
            kind: Kind::Dfa(dfa),
            cached,
        })
    }

    /// A lexeme from a ready DFA (`name` shows in errors and [`Grammar::describe`]).
    ///
    /// [`Grammar::describe`]: super::Grammar::describe
    pub fn from_dfa(name: &str, dfa: TableDfa) -> Self {
        Lexeme {
            regex: name.to_owned(),
            kind: Kind::Dfa(Arc::new(dfa)),
            cached: false,
        }
    }

    /// A JSON string (between double quotes) of `min..=max` repetitions of `unit` (`max`
    /// None: no upper bound), counted in the state. The unit must be prefix-free (no match
    /// extends to another: a character), must not match the empty string, and must not start
    /// with a quote, so that a completed unit always starts the next one or the close.
    pub fn counted(
        name: &str,
        unit: TableDfa,
        unit_id: u32,
        min: u32,
        max: Option<u32>,
    ) -> Result<Self, GrammarError> {
        let start = unit.start();
        if start == DEAD || unit.is_accepting(start) || unit.next(start, b'"') != DEAD {
            return Err(GrammarError::Grammar(format!(
                "{name}: a counted unit must match a non-empty string not starting with a quote"
            )));
        }
        let open = unit
            .states()
            .filter(|&s| unit.is_accepting(s))
            .any(|s| (0..=255u8).any(|b| unit.next(s, b) != DEAD));
        if open {
            return Err(GrammarError::Grammar(format!(
                "{name}: a counted unit must be prefix-free"
            )));
        }
        if let Some(m) = max {
            if m < min {
                return Err(GrammarError::Grammar(format!(
                    "{name}: minimum {min} exceeds maximum {m}"
                )));
            }
        }
        let k = unit.num_states() as u32;
        let top = max.unwrap_or(min) as u64 + 1;
        // Premultiplied state ids are u32: 3 + (count + 1) * k rows of 256.
        if (INSIDE as u64 + top * k as u64) * 256 >= u32::MAX as u64 {
            return Err(GrammarError::TooLarge(format!(
                "{name}: a count up to {} is too large for a lexeme state",
                top - 1
            )));
        }
        Ok(Lexeme {
            regex: name.to_owned(),
            kind: Kind::Counted(Counted {
                unit,
                unit_id,
                min,
                max,
                k,
            }),
            cached: false,
        })
    }

    #[inline]
    pub fn next(&self, q: StateId, b: u8) -> StateId {
        match &self.kind {
            Kind::Dfa(d) => d.next(q, b),
            Kind::Counted(c) => c.next(q, b),
        }
    }

    #[inline]
    pub fn is_accepting(&self, q: StateId) -> bool {
        match &self.kind {
            Kind::Dfa(d) => d.is_accepting(q),
            Kind::Counted(_) => q == CLOSED,
        }
    }

    #[inline]
    pub fn start(&self) -> StateId {
        match &self.kind {
            Kind::Dfa(d) => d.start(),
            Kind::Counted(_) => BEFORE,
        }
    }

    /// The DFA of a plain (not counted) lexeme.
    pub fn table(&self) -> Option<&TableDfa> {
        match &self.kind {
            Kind::Dfa(d) => Some(d),
            Kind::Counted(_) => None,
        }
    }

    /// The automaton when the process-wide lexeme cache holds it (so facts about its states
    /// may be kept by its address for the life of the process).
    pub fn cached_table(&self) -> Option<&Arc<TableDfa>> {
        match &self.kind {
            Kind::Dfa(d) if self.cached => Some(d),
            _ => None,
        }
    }

    /// Automaton states held in memory (a counted lexeme's count is not materialised).
    pub fn num_states(&self) -> usize {
        match &self.kind {
            Kind::Dfa(d) => d.num_states(),
            Kind::Counted(c) => c.unit.num_states(),
        }
    }

    /// Matches no string at all (its start state is dead).
    pub fn is_empty(&self) -> bool {
        self.start() == DEAD
    }

    /// Matches the empty string.
    pub fn nullable(&self) -> bool {
        !self.is_empty() && self.is_accepting(self.start())
    }

    /// For a counted lexeme's state inside the quotes whose count cannot reach the maximum
    /// within `depth` bytes: its unit, unit state and deficit ([`FarUnit`]). Such states
    /// accept and die on strings of up to `depth` bytes alike whatever the count.
    pub fn far_unit(&self, q: StateId, depth: usize) -> Option<FarUnit<'_>> {
        let Kind::Counted(c) = &self.kind else {
            return None;
        };
        let (n, u) = c.split(q)?;
        let room = c.max.map_or(u64::MAX, |m| (m - n) as u64);
        (room >= depth as u64).then(|| FarUnit {
            unit: &c.unit,
            u,
            deficit: c.min.saturating_sub(n).min(depth as u32 + 1),
        })
    }

    /// For a counted lexeme's state inside the quotes at a unit boundary: the units it may
    /// still read, and its unit (whose star's string-body bytes then keep it alive).
    pub fn room_at_boundary(&self, q: StateId) -> Option<(u64, &TableDfa)> {
        let Kind::Counted(c) = &self.kind else {
            return None;
        };
        let (n, u) = c.split(q)?;
        (u == c.unit.start()).then(|| (c.max.map_or(u64::MAX, |m| (m - n) as u64), &c.unit))
    }

    /// A key shared by states of lexeme `l` that accept and die on the same strings of up
    /// to `depth` bytes, so one trie walk (whose tokens are at most `depth` bytes) serves
    /// them all: far from its bounds ([`far_unit`](Self::far_unit)), a counted lexeme's
    /// states share one key per (unit state, deficit), across every counted lexeme with the
    /// same unit.
    pub fn mask_key(&self, l: u32, q: StateId, depth: usize) -> (u32, u64) {
        if let (Some(f), Kind::Counted(c)) = (self.far_unit(q, depth), &self.kind) {
            return (
                u32::MAX - c.unit_id,
                FAR | (f.deficit as u64) << 32 | f.u.index() as u64,
            );
        }
        (l, u32::from(q) as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lexemes_share_cached_automata_but_not_literals() {
        let limits = RegexLimits::default();
        let a = Lexeme::compile("[a-c]+x?", limits).unwrap();
        let b = Lexeme::compile("[a-c]+x?", limits).unwrap();
        let (Kind::Dfa(da), Kind::Dfa(db)) = (&a.kind, &b.kind) else {
            panic!("plain lexemes")
        };
        assert!(Arc::ptr_eq(da, db));
        // Other limits are another key (a tighter table limit must still refuse).
        let tight = RegexLimits {
            table_bytes: 1024,
            ..limits
        };
        assert!(Lexeme::compile("[a-c]{5}", tight).is_err());
        let l1 = Lexeme::compile("\\x{61}\\x{62}", limits).unwrap();
        let l2 = Lexeme::compile("\\x{61}\\x{62}", limits).unwrap();
        let (Kind::Dfa(d1), Kind::Dfa(d2)) = (&l1.kind, &l2.kind) else {
            panic!("plain lexemes")
        };
        assert!(!Arc::ptr_eq(d1, d2));
        assert_eq!(l1.next(l1.start(), b'a'), l2.next(l2.start(), b'a'));
    }
}
