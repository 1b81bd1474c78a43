//! A persistent, hash-consed Earley chart. A parser state is one interned Earley set, so a
//! state is a `u32`, the step `(set, byte) -> set` is cacheable, and fork/rollback are free
//! (nothing is ever mutated).
//!
//! What makes states recur (and their masks reusable) instead of growing with the text is
//! how items name their origin. An item's origin is not the whole set where its rule was
//! predicted, but a *node*: that set's projection on the item's left-hand side B, i.e. only
//! the items there that waited on a nonterminal whose prediction led to B (`left_of[B]`)
//! and their own nodes. That is all a completion of B ever reads: the items waiting on B
//! directly, plus those predicted in the set (reconstructed from the grammar, since they
//! follow from the projected items). So the items of the tenth element of a JSON array
//! point to the same nodes as those of the second, and the states after each element are
//! one and the same.
//!
//! Lexemes are scanned byte by byte inside the items (an item before a lexeme carries the
//! lexeme's DFA state): the parser is exact over the concatenated bytes, with no lexer
//! ambiguity and no lookahead.

use std::sync::Arc;

use rustc_hash::{FxHashMap, FxHashSet};

use super::cfg::{Grammar, Sym};
use crate::constrain::regex::{StateId, DEAD};

/// Origin of an item predicted in the set that holds it.
pub const SELF: u32 = u32::MAX;

/// Id of the dead (empty) set.
pub const DEAD_SET: u32 = 0;

/// The node of the start rule's item: nothing waits on the start symbol.
const ROOT_NODE: u32 = 0;

/// `rule`'s right-hand side with the dot before symbol `dot`; `lex` is the DFA state of the
/// lexeme after the dot (DEAD when the dot is not before a lexeme); `origin` a node id or
/// [`SELF`].
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

/// A set's projection on nonterminal `nt`: its non-predicted items waiting on a
/// nonterminal of `left_of[nt]`.
#[derive(Debug)]
struct Node {
    items: Arc<[Item]>,
    nt: u32,
}

/// Transition-cache entries kept before the cache is cleared (it is rebuilt on demand).
const MAX_TRANSITIONS: usize = 1 << 22;

#[derive(Debug)]
pub struct Chart {
    sets: Vec<Set>,
    index: FxHashMap<(Arc<[Item]>, bool), u32>,
    nodes: Vec<Node>,
    node_index: FxHashMap<(Arc<[Item]>, u32), u32>,
    /// Per node: the items advanced when its nonterminal completes.
    completions: FxHashMap<u32, Arc<[Item]>>,
    /// (set, nonterminal) -> node.
    projections: FxHashMap<(u32, u32), u32>,
    trans: FxHashMap<(u32, u8), u32>,
    /// Per state asked: the bytes some item can scan next ([`Chart::first_bytes`]).
    first: FxHashMap<u32, [u64; 4]>,
    start: u32,
    max_states: usize,
    /// A new state was needed past `max_states` (the step went to the dead state).
    overflowed: bool,
}

impl Chart {
    pub fn new(g: &Grammar) -> Chart {
        let dead = Set {
            items: Arc::from(Vec::new()),
            accepts: false,
        };
        let start_nt = g.rules[g.start_rule as usize].lhs;
        let mut c = Chart {
            sets: vec![dead],
            index: FxHashMap::default(),
            nodes: Vec::new(),
            node_index: FxHashMap::default(),
            completions: FxHashMap::default(),
            projections: FxHashMap::default(),
            trans: FxHashMap::default(),
            first: FxHashMap::default(),
            start: DEAD_SET,
            max_states: g.limits.max_states,
            overflowed: false,
        };
        let root = c.node(Vec::new(), start_nt);
        debug_assert_eq!(root, ROOT_NODE);
        let seed = vec![item_at(g, g.start_rule, 0, ROOT_NODE)];
        c.start = c.close(g, seed);
        c
    }

    pub fn start(&self) -> u32 {
        self.start
    }

    pub fn accepts(&self, s: u32) -> bool {
        self.sets[s as usize].accepts
    }

    /// Did a step need a state past `max_states`?
    pub fn overflowed(&self) -> bool {
        self.overflowed
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
        let items = self.sets[s as usize].items.clone();
        let mut seed = Vec::new();
        for it in items.iter() {
            let rule = &g.rules[it.rule as usize];
            if let Some(&Sym::Lex(l)) = rule.rhs.get(it.dot as usize) {
                let q = g.lexemes[l as usize].next(it.lex, b);
                if q != DEAD {
                    let origin = if it.origin == SELF {
                        self.project(g, s, rule.lhs)
                    } else {
                        it.origin
                    };
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

    /// The bytes some item of set `s` can scan (a byte outside them steps to the dead set).
    pub fn first_bytes(&mut self, g: &Grammar, s: u32) -> [u64; 4] {
        if let Some(&f) = self.first.get(&s) {
            return f;
        }
        let mut pairs = Vec::new();
        self.scanning(g, s, &mut pairs);
        pairs.sort_unstable();
        pairs.dedup();
        let mut f = [0u64; 4];
        for (l, q) in pairs {
            let lexeme = &g.lexemes[l as usize];
            for b in 0..=255u8 {
                if lexeme.next(q, b) != DEAD {
                    f[b as usize / 64] |= 1 << (b % 64);
                }
            }
        }
        self.first.insert(s, f);
        f
    }

    /// Push the (lexeme, DFA state) pairs that the items of set `s` scan next.
    pub fn scanning(&self, g: &Grammar, s: u32, out: &mut Vec<(u32, StateId)>) {
        for it in self.sets[s as usize].items.iter() {
            if let Some(&Sym::Lex(l)) = g.rules[it.rule as usize].rhs.get(it.dot as usize) {
                out.push((l, it.lex));
            }
        }
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

    fn node(&mut self, mut items: Vec<Item>, nt: u32) -> u32 {
        items.sort_unstable();
        items.dedup();
        let items: Arc<[Item]> = Arc::from(items);
        let key = (items.clone(), nt);
        if let Some(&id) = self.node_index.get(&key) {
            return id;
        }
        let id = self.nodes.len() as u32;
        assert!(id < SELF, "parser node ids exhausted");
        self.nodes.push(Node { items, nt });
        self.node_index.insert(key, id);
        id
    }

    /// The node of set `s` for nonterminal `nt` (origin of the items predicted for `nt`).
    fn project(&mut self, g: &Grammar, s: u32, nt: u32) -> u32 {
        if let Some(&n) = self.projections.get(&(s, nt)) {
            return n;
        }
        let lo = &g.left_of[nt as usize];
        let items: Vec<Item> = (self.sets[s as usize].items.iter())
            .filter(|it| it.origin != SELF && waits_on(g, it).is_some_and(|c| lo.contains(&c)))
            .copied()
            .collect();
        let n = self.node(items, nt);
        self.projections.insert((s, nt), n);
        n
    }

    /// The items advanced when node `n`'s nonterminal B completes: those of the node waiting
    /// on B, and those predicted in its set (from the node's items, through the grammar's
    /// left corners) with B after a nullable prefix, each with its own node.
    fn complete(&mut self, g: &Grammar, n: u32) -> Arc<[Item]> {
        if let Some(done) = self.completions.get(&n) {
            return done.clone();
        }
        let node_items = self.nodes[n as usize].items.clone();
        let b = self.nodes[n as usize].nt;
        let lo = &g.left_of[b as usize];
        let mut out = Vec::new();
        let mut stack = Vec::new();
        for it in node_items.iter() {
            let c = waits_on(g, it).expect("node items wait on a nonterminal");
            if c == b {
                out.push(item_at(g, it.rule, it.dot + 1, it.origin));
            }
            if lo.contains(&c) {
                stack.push(c);
            }
        }
        let mut predicted = FxHashSet::default();
        while let Some(c) = stack.pop() {
            if !predicted.insert(c) {
                continue;
            }
            for &r in &g.by_lhs[c as usize] {
                for (p, sym) in g.rules[r as usize].rhs.iter().enumerate() {
                    let nullable = match *sym {
                        Sym::Nt(d) => {
                            if lo.contains(&d) {
                                stack.push(d);
                            }
                            if d == b {
                                // Predicted in the node's set: its own node there is the
                                // projection on `c`, a part of this node's items.
                                let lc = &g.left_of[c as usize];
                                let sub: Vec<Item> = (node_items.iter())
                                    .filter(|it| waits_on(g, it).is_some_and(|x| lc.contains(&x)))
                                    .copied()
                                    .collect();
                                let origin = self.node(sub, c);
                                out.push(item_at(g, r, p as u32 + 1, origin));
                            }
                            g.nullable[d as usize]
                        }
                        Sym::Lex(l) => g.lexemes[l as usize].nullable(),
                    };
                    if !nullable {
                        break;
                    }
                }
            }
        }
        let out: Arc<[Item]> = Arc::from(out);
        self.completions.insert(n, out.clone());
        out
    }

    /// Predict and complete from `seed` (the items scanned into a new set), keep the items
    /// the future reads (before a lexeme: to scan; before a nonterminal and not predicted
    /// here: for projections) and intern the result.
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
                        work.extend(self.complete(g, it.origin).iter().copied());
                    }
                }
                Some(&Sym::Nt(a)) => {
                    if it.origin != SELF {
                        kept.push(it);
                    }
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
                    if g.lexemes[l as usize].is_accepting(it.lex) {
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
        if self.sets.len() + self.nodes.len() >= self.max_states.min(SELF as usize - 1) {
            self.overflowed = true;
            return DEAD_SET;
        }
        let id = self.sets.len() as u32;
        self.sets.push(Set { items, accepts });
        self.index.insert(key, id);
        id
    }
}

/// The nonterminal `it` waits on, if any.
fn waits_on(g: &Grammar, it: &Item) -> Option<u32> {
    match g.rules[it.rule as usize].rhs.get(it.dot as usize) {
        Some(&Sym::Nt(c)) => Some(c),
        _ => None,
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
