//! A persistent, hash-consed Earley chart. Each parser state is one Earley set whose items
//! name their origin set by id (or [`SELF`], the set itself, for items predicted there), so
//! a set plus the sets it points to is the whole parse of a prefix: equal sets behave
//! identically from then on, and interning them makes a state a `u32`, the step
//! `(set, byte) -> set` cacheable, and fork/rollback free (nothing is ever mutated).
//!
//! Lexemes are scanned byte by byte inside the items (an item before a lexeme carries the
//! lexeme's DFA state), so the parser is exact over the concatenated bytes: no lexer
//! ambiguity, no lookahead. Repetitions are desugared left-recursively by the front ends,
//! which keeps origins fixed across repetitions so states recur (and their masks are reused)
//! instead of growing with the text.

use std::sync::Arc;

use rustc_hash::{FxHashMap, FxHashSet};

use super::cfg::{Grammar, Sym};
use crate::constrain::regex::{StateId, DEAD};

/// Origin of an item predicted in the set that holds it.
pub const SELF: u32 = u32::MAX;

/// Id of the dead (empty) set.
pub const DEAD_SET: u32 = 0;

/// `rule`'s right-hand side with the dot before symbol `dot`; `lex` is the DFA state of the
/// lexeme after the dot (DEAD when the dot is not before a lexeme).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Item {
    rule: u32,
    dot: u32,
    origin: u32,
    lex: StateId,
}

#[derive(Debug)]
struct Set {
    items: Arc<[Item]>,
    accepts: bool,
}

/// Transition-cache entries kept before the cache is cleared (it is rebuilt on demand).
const MAX_TRANSITIONS: usize = 1 << 22;

#[derive(Debug)]
pub struct Chart {
    sets: Vec<Set>,
    index: FxHashMap<(Arc<[Item]>, bool), u32>,
    trans: FxHashMap<(u32, u8), u32>,
    start: u32,
}

impl Chart {
    pub fn new(g: &Grammar) -> Chart {
        let dead = Set {
            items: Arc::from(Vec::new()),
            accepts: false,
        };
        let mut c = Chart {
            sets: vec![dead],
            index: FxHashMap::default(),
            trans: FxHashMap::default(),
            start: DEAD_SET,
        };
        let seed = vec![item_at(g, g.start_rule, 0, SELF)];
        c.start = c.close(g, seed);
        c
    }

    pub fn start(&self) -> u32 {
        self.start
    }

    pub fn accepts(&self, s: u32) -> bool {
        self.sets[s as usize].accepts
    }

    /// Interned parser states, the dead one included.
    pub fn num_states(&self) -> usize {
        self.sets.len()
    }

    /// The state after byte `b` from live state `s` ([`DEAD_SET`] if no item can scan it).
    pub fn step(&mut self, g: &Grammar, s: u32, b: u8) -> u32 {
        if let Some(&t) = self.trans.get(&(s, b)) {
            return t;
        }
        let mut seed = Vec::new();
        for it in self.sets[s as usize].items.iter() {
            if let Some(&Sym::Lex(l)) = g.rules[it.rule as usize].rhs.get(it.dot as usize) {
                let q = g.lexemes[l as usize].dfa.next(it.lex, b);
                if q != DEAD {
                    let origin = if it.origin == SELF { s } else { it.origin };
                    seed.push(Item {
                        origin,
                        lex: q,
                        ..*it
                    });
                }
            }
        }
        let t = if seed.is_empty() {
            DEAD_SET
        } else {
            self.close(g, seed)
        };
        if self.trans.len() >= MAX_TRANSITIONS {
            self.trans.clear();
        }
        self.trans.insert((s, b), t);
        t
    }

    /// Run `bytes` from `s`.
    pub fn run(&mut self, g: &Grammar, mut s: u32, bytes: &[u8]) -> u32 {
        for &b in bytes {
            if s == DEAD_SET {
                break;
            }
            s = self.step(g, s, b);
        }
        s
    }

    /// Predict and complete from `seed` (the items scanned into a new set), keep the items
    /// the future needs (those before a symbol) and intern the result.
    fn close(&mut self, g: &Grammar, seed: Vec<Item>) -> u32 {
        let mut work = seed;
        let mut seen: FxHashSet<Item> = FxHashSet::default();
        let mut predicted: FxHashSet<u32> = FxHashSet::default();
        let mut kept = Vec::new();
        let mut accepts = false;
        while let Some(it) = work.pop() {
            if !seen.insert(it) {
                continue;
            }
            let rule = &g.rules[it.rule as usize];
            match rule.rhs.get(it.dot as usize) {
                None => {
                    if it.rule == g.start_rule {
                        accepts = true;
                    }
                    // An item completed at its own origin derived the empty string: the
                    // nullable advance below (Aycock-Horspool) already moved its waiters.
                    if it.origin != SELF {
                        let a = Sym::Nt(rule.lhs);
                        for w in self.sets[it.origin as usize].items.iter() {
                            if g.rules[w.rule as usize].rhs.get(w.dot as usize) == Some(&a) {
                                let origin = if w.origin == SELF {
                                    it.origin
                                } else {
                                    w.origin
                                };
                                work.push(item_at(g, w.rule, w.dot + 1, origin));
                            }
                        }
                    }
                }
                Some(&Sym::Nt(a)) => {
                    kept.push(it);
                    if predicted.insert(a) {
                        for &r in &g.by_lhs[a as usize] {
                            work.push(item_at(g, r, 0, SELF));
                        }
                    }
                    if g.nullable[a as usize] {
                        work.push(item_at(g, it.rule, it.dot + 1, it.origin));
                    }
                }
                Some(&Sym::Lex(l)) => {
                    kept.push(it);
                    if g.lexemes[l as usize].dfa.is_accepting(it.lex) {
                        work.push(item_at(g, it.rule, it.dot + 1, it.origin));
                    }
                }
            }
        }
        if kept.is_empty() && !accepts {
            return DEAD_SET;
        }
        kept.sort_unstable();
        let items: Arc<[Item]> = Arc::from(kept);
        let key = (items.clone(), accepts);
        if let Some(&id) = self.index.get(&key) {
            return id;
        }
        let id = self.sets.len() as u32;
        assert!(id < SELF, "parser state ids exhausted");
        self.sets.push(Set { items, accepts });
        self.index.insert(key, id);
        id
    }
}

/// The item `rule` with the dot at `dot`, its lexeme (if any) at the DFA's start.
fn item_at(g: &Grammar, rule: u32, dot: u32, origin: u32) -> Item {
    let lex = match g.rules[rule as usize].rhs.get(dot as usize) {
        Some(&Sym::Lex(l)) => g.lexemes[l as usize].start(),
        _ => DEAD,
    };
    Item {
        rule,
        dot,
        origin,
        lex,
    }
}
