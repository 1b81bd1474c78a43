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
//!
//! A chart holds at most `max_states` sets and nodes together; a step that needs one more
//! fails with [`Full`] and changes nothing a state means. A state's content can be carried
//! to another chart ([`Chart::export`], [`Chart::import`]): its items and the nodes they
//! depend on, renumbered.

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
/// [`SELF`]; `used`: in an arm of a member set, the members before it (see
/// [`MemberSet`](super::cfg::MemberSet)), else 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Item {
    rule: u32,
    dot: u32,
    origin: u32,
    lex: StateId,
    used: u64,
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

/// A step needed a new set or node past the chart's `max_states`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full;

/// A set's content apart from any chart's ids ([`Chart::export`]): the nodes its items
/// depend on, dependencies first, with origins as indices into `nodes`; then its items
/// (origins likewise, or [`SELF`]).
#[derive(Debug)]
pub struct Portable {
    nodes: Vec<(Vec<Item>, u32)>,
    items: Vec<Item>,
    accepts: bool,
}

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
    /// Sets and nodes together stay below this.
    cap: usize,
}

impl Chart {
    /// A chart holding the start state; [`Full`] when `max_states` cannot hold even that.
    pub fn new(g: &Grammar) -> Result<Chart, Full> {
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
            // (Node ids stay below SELF.)
            cap: g.limits.max_states.min(SELF as usize - 1),
        };
        let root = c.node(Vec::new(), start_nt)?;
        debug_assert_eq!(root, ROOT_NODE);
        let seed = vec![item_at(g, g.start_rule, 0, ROOT_NODE)];
        c.start = c.close(g, seed)?;
        Ok(c)
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

    /// Sets and nodes: what `max_states` bounds.
    pub fn size(&self) -> usize {
        self.sets.len() + self.nodes.len()
    }

    /// [`Chart::step`]'s answer when it is cached (no change needed: a shared borrow).
    #[inline]
    pub fn cached_step(&self, s: u32, b: u8) -> Option<u32> {
        self.trans.get(&(s, b)).copied()
    }

    /// [`Chart::first_bytes`]' answer when it is cached.
    pub fn cached_first_bytes(&self, s: u32) -> Option<[u64; 4]> {
        self.first.get(&s).copied()
    }

    /// The state after byte `b` from live state `s` ([`DEAD_SET`] if no item can scan it).
    pub fn step(&mut self, g: &Grammar, s: u32, b: u8) -> Result<u32, Full> {
        if let Some(&t) = self.trans.get(&(s, b)) {
            return Ok(t);
        }
        let items = self.sets[s as usize].items.clone();
        let mut seed = Vec::new();
        for it in items.iter() {
            let rule = &g.rules[it.rule as usize];
            if let Some(&Sym::Lex(l)) = rule.rhs.get(it.dot as usize) {
                let q = g.lexemes[l as usize].next(it.lex, b);
                if q != DEAD {
                    let origin = if it.origin == SELF {
                        self.project(g, s, rule.lhs)?
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
            self.close(g, seed)?
        };
        if self.trans.len() >= MAX_TRANSITIONS {
            self.trans.clear();
        }
        self.trans.insert((s, b), t);
        Ok(t)
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
    pub fn run(&mut self, g: &Grammar, mut s: u32, bytes: &[u8]) -> Result<u32, Full> {
        for &b in bytes {
            if s == DEAD_SET {
                break;
            }
            s = self.step(g, s, b)?;
        }
        Ok(s)
    }

    /// Live set `s`'s content, for [`Chart::import`] into another chart of the same grammar.
    pub fn export(&self, s: u32) -> Portable {
        let set = &self.sets[s as usize];
        // An item's origin is older than the node holding the item (nodes are built from
        // items already interned), so ascending ids put dependencies first.
        let mut ids: Vec<u32> = Vec::new();
        let mut seen: FxHashSet<u32> = FxHashSet::default();
        let mut stack: Vec<u32> = (set.items.iter())
            .map(|it| it.origin)
            .filter(|&o| o != SELF)
            .collect();
        while let Some(n) = stack.pop() {
            if seen.insert(n) {
                ids.push(n);
                stack.extend(self.nodes[n as usize].items.iter().map(|it| it.origin));
            }
        }
        ids.sort_unstable();
        let local: FxHashMap<u32, u32> = (ids.iter().enumerate())
            .map(|(i, &n)| (n, i as u32))
            .collect();
        let renumber = |it: &Item| Item {
            origin: if it.origin == SELF {
                SELF
            } else {
                local[&it.origin]
            },
            ..*it
        };
        Portable {
            nodes: (ids.iter())
                .map(|&n| {
                    let node = &self.nodes[n as usize];
                    (node.items.iter().map(renumber).collect(), node.nt)
                })
                .collect(),
            items: set.items.iter().map(renumber).collect(),
            accepts: set.accepts,
        }
    }

    /// Intern an exported set here: the same state, under this chart's ids.
    pub fn import(&mut self, p: &Portable) -> Result<u32, Full> {
        let mut ids: Vec<u32> = Vec::with_capacity(p.nodes.len());
        let renumber = |it: &Item, ids: &[u32]| Item {
            origin: if it.origin == SELF {
                SELF
            } else {
                ids[it.origin as usize]
            },
            ..*it
        };
        for (items, nt) in &p.nodes {
            let items = items.iter().map(|it| renumber(it, &ids)).collect();
            ids.push(self.node(items, *nt)?);
        }
        let items = p.items.iter().map(|it| renumber(it, &ids)).collect();
        self.intern(items, p.accepts)
    }

    fn node(&mut self, mut items: Vec<Item>, nt: u32) -> Result<u32, Full> {
        items.sort_unstable();
        items.dedup();
        let items: Arc<[Item]> = Arc::from(items);
        let key = (items.clone(), nt);
        if let Some(&id) = self.node_index.get(&key) {
            return Ok(id);
        }
        if self.size() >= self.cap {
            return Err(Full);
        }
        let id = self.nodes.len() as u32;
        self.nodes.push(Node { items, nt });
        self.node_index.insert(key, id);
        Ok(id)
    }

    /// The node of set `s` for nonterminal `nt` (origin of the items predicted for `nt`).
    fn project(&mut self, g: &Grammar, s: u32, nt: u32) -> Result<u32, Full> {
        if let Some(&n) = self.projections.get(&(s, nt)) {
            return Ok(n);
        }
        let lo = &g.left_of[nt as usize];
        let items: Vec<Item> = (self.sets[s as usize].items.iter())
            .filter(|it| it.origin != SELF && waits_on(g, it).is_some_and(|c| lo.contains(&c)))
            .copied()
            .collect();
        let n = self.node(items, nt)?;
        self.projections.insert((s, nt), n);
        Ok(n)
    }

    /// The items advanced when node `n`'s nonterminal B completes: those of the node waiting
    /// on B, and those predicted in its set (from the node's items, through the grammar's
    /// left corners) with B after a nullable prefix, each with its own node.
    fn complete(&mut self, g: &Grammar, n: u32) -> Result<Arc<[Item]>, Full> {
        if let Some(done) = self.completions.get(&n) {
            return Ok(done.clone());
        }
        let node_items = self.nodes[n as usize].items.clone();
        let b = self.nodes[n as usize].nt;
        let lo = &g.left_of[b as usize];
        let mut out = Vec::new();
        let mut stack = Vec::new();
        for it in node_items.iter() {
            let c = waits_on(g, it).expect("node items wait on a nonterminal");
            if c == b {
                out.push(advance(g, it));
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
                                let origin = self.node(sub, c)?;
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
        Ok(out)
    }

    /// Predict and complete from `seed` (the items scanned into a new set), keep the items
    /// the future reads (before a lexeme: to scan; before a nonterminal and not predicted
    /// here: for projections) and intern the result.
    fn close(&mut self, g: &Grammar, seed: Vec<Item>) -> Result<u32, Full> {
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
                    // (Set members never derive it.)
                    if it.origin == SELF {
                        continue;
                    }
                    let Some(arm) = rule.arm else {
                        work.extend(self.complete(g, it.origin)?.iter().copied());
                        continue;
                    };
                    // A member of a set: the set may end here, or go on with a separator
                    // and a member still allowed (same origin: one derivation of the set).
                    let set = &g.sets[arm.set as usize];
                    let used = set.add(it.used, arm.member);
                    for &(r, m) in &set.cont {
                        if set.allows(used, m) {
                            work.push(Item {
                                used,
                                ..item_at(g, r, 0, it.origin)
                            });
                        }
                    }
                    if set.done(used) {
                        work.extend(self.complete(g, it.origin)?.iter().copied());
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
                        work.push(advance(g, &it));
                    }
                }
                Some(&Sym::Lex(l)) => {
                    kept.push(it);
                    if g.lexemes[l as usize].is_accepting(it.lex) {
                        work.push(advance(g, &it));
                    }
                }
            }
        }
        if kept.is_empty() && !accepts {
            return Ok(DEAD_SET);
        }
        self.intern(kept, accepts)
    }

    fn intern(&mut self, mut items: Vec<Item>, accepts: bool) -> Result<u32, Full> {
        items.sort_unstable();
        let items: Arc<[Item]> = Arc::from(items);
        let key = (items.clone(), accepts);
        if let Some(&id) = self.index.get(&key) {
            return Ok(id);
        }
        if self.size() >= self.cap {
            return Err(Full);
        }
        let id = self.sets.len() as u32;
        self.sets.push(Set { items, accepts });
        self.index.insert(key, id);
        Ok(id)
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
        used: 0,
    }
}

/// `it` with its dot moved over one symbol (its set members kept).
fn advance(g: &Grammar, it: &Item) -> Item {
    Item {
        used: it.used,
        ..item_at(g, it.rule, it.dot + 1, it.origin)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::constrain::grammar::{gbnf, GrammarLimits};
    use proptest::prelude::*;

    const JSON: &str = r#"
root   ::= ws value ws
value  ::= object | array | string | number | "true" | "null"
object ::= "{" ws ( member ( ws "," ws member )* ws )? "}"
member ::= string ws ":" ws value
array  ::= "[" ws ( value ( ws "," ws value )* ws )? "]"
string ::= "\"" [a-c]* "\""
number ::= "-"? [0-9]+
ws     ::= [ ]*
"#;

    /// Bytes a walk may scan: enough for every rule above.
    const BYTES: &[u8] = b"{}[],:\" abc-19tn";

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(crate::testing::cases(48)))]

        /// A state carried to another chart (a fresh one, or one that has parsed other
        /// texts) is the same state there: it accepts alike, and every continuation (any
        /// byte, then more) dies or accepts alike in both charts.
        #[test]
        fn imported_states_behave_as_their_originals(
            text in prop::collection::vec(prop::sample::select(BYTES), 0..40),
            other in prop::collection::vec(prop::sample::select(BYTES), 0..40),
            tails in prop::collection::vec(prop::collection::vec(prop::sample::select(BYTES), 1..6), 8),
        ) {
            let g = gbnf::parse(JSON, GrammarLimits::default()).unwrap();
            let mut a = Chart::new(&g).unwrap();
            let mut b = Chart::new(&g).unwrap();
            b.run(&g, b.start(), &other).unwrap();
            let mut s = a.start();
            for &c in &text {
                let t = b.import(&a.export(s)).unwrap();
                prop_assert_eq!(a.accepts(s), b.accepts(t));
                for tail in &tails {
                    let (x, y) = (a.run(&g, s, tail).unwrap(), b.run(&g, t, tail).unwrap());
                    prop_assert_eq!(x == DEAD_SET, y == DEAD_SET);
                    prop_assert_eq!(a.accepts(x), b.accepts(y));
                }
                // Carried back, it is the original again (same items, same nodes).
                prop_assert_eq!(a.import(&b.export(t)).unwrap(), s);
                s = a.step(&g, s, c).unwrap();
                if s == DEAD_SET {
                    break;
                }
            }
        }
    }

    #[test]
    fn a_full_chart_refuses_new_states_and_keeps_the_old() {
        let limits = GrammarLimits {
            max_states: 12,
            ..GrammarLimits::default()
        };
        let g = gbnf::parse(JSON, limits).unwrap();
        let mut c = Chart::new(&g).unwrap();
        let mut s = c.start();
        let mut path = vec![s];
        let err = b"[[[[[[[[[[[[[[[["
            .iter()
            .find_map(|&b| match c.step(&g, s, b) {
                Ok(t) => {
                    s = t;
                    path.push(t);
                    None
                }
                Err(e) => Some(e),
            });
        assert_eq!(err, Some(Full));
        assert!(c.size() <= 12);
        // The states it holds still step as before (cached, or to states it has).
        for w in path.windows(2) {
            assert_eq!(c.step(&g, w[0], b'['), Ok(w[1]));
        }
    }
}
