//! Allowed-token masks of parser states, in the two parts the Earley items give:
//! - **context-independent**: the tokens that one scanning item's lexeme consumes whole (its
//!   DFA stays alive through every byte). They are allowed whatever the rest of the parse
//!   is, and depend only on (lexeme, DFA state), so one DFA walk of the token trie per pair,
//!   cached here, serves every parser state that scans that lexeme from there (every string
//!   value of a JSON document shares one walk).
//! - **context-dependent**: the tokens in which the lexeme can end and the parse go on. The
//!   same DFA walk records where that can happen: subtrees where the lexeme dies below a
//!   node where it accepted (a token with a closing quote inside, whitespace then a word).
//!   They are few (a few hundred trie nodes even for a 131k vocabulary), and only they are
//!   run through the parser, from the state after the accepted prefix.
//!
//! Items whose lexeme accepts before any byte need no third part: the parser's closure has
//! already completed them, so what follows them is scanned by other items of the same set.
//! A state's mask (the union) is cached per state; both caches share one memory cap.
//!
//! Fills of one grammar run in parallel: the lexeme walks (the long part: whole-trie DFA
//! walks) read no chart and hold no lock while they run; the parser part reads the chart
//! under a shared lock and takes it exclusively only to intern a transition it lacks.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};

use rustc_hash::{FxHashMap, FxHashSet};

use super::cfg::Grammar;
use super::earley::{Chart, Full, DEAD_SET};
use super::lexer::Lexeme;
use super::walk_cache::{majority_successor, SharedWalks};
use crate::constrain::regex::{StateId, TableDfa, DEAD};
use crate::constrain::vocab::{utf8, Allowed, SubtreeSummary, TokenTrie};

/// Subtrees below trie node `parent` (whose bytes, `prefix`, a lexeme accepted on the way)
/// in which that lexeme dies: the parse may go on there after the lexeme ended.
#[derive(Debug)]
struct Group {
    parent: u32,
    prefix: Box<[u8]>,
    roots: Vec<u32>,
}

/// A token set: a list while small (most lexeme states allow a handful of tokens: a
/// property name, a keyword), a bitmap once large.
#[derive(Debug)]
enum Tokens {
    List(Vec<u32>),
    Bits(Box<[u32]>),
}

/// A walk copies first-level subtrees from another state's walk when at least this many
/// bytes lead to one state that loops on them.
const REUSE_MIN_BYTES: usize = 32;

/// Token sets larger than this are bitmaps.
const LIST_MAX: usize = 512;

impl Tokens {
    fn or_into(&self, out: &mut [u32]) {
        match self {
            Tokens::Bits(b) => {
                for (o, &w) in out.iter_mut().zip(b.iter()) {
                    *o |= w;
                }
            }
            Tokens::List(l) => set_bits(out, l),
        }
    }

    fn bytes(&self) -> usize {
        match self {
            Tokens::Bits(b) => std::mem::size_of_val(&b[..]),
            Tokens::List(l) => 4 * l.len(),
        }
    }
}

/// What one (lexeme, DFA state) contributes to every parser state scanning it.
#[derive(Debug)]
pub struct LexMask {
    /// Tokens the lexeme consumes whole from this state.
    alive: Tokens,
    /// Where the lexeme can end inside a token, in trie preorder of their roots.
    groups: Vec<Group>,
}

impl LexMask {
    pub fn bytes(&self) -> usize {
        self.alive.bytes()
            + (self.groups.iter())
                .map(|g| g.prefix.len() + 4 * g.roots.len() + std::mem::size_of::<Group>())
                .sum::<usize>()
    }

    /// Copy this walk's places where the lexeme ends inside the subtree of trie nodes
    /// `[i, end)` into a walk under way that reached node `i` in the state this walk did (its
    /// tokens there are taken from this walk's set when the walk ends).
    fn copy_groups(&self, (i, end): (usize, usize), groups: &mut Vec<Group>) {
        let g0 = (self.groups).partition_point(|g| (g.roots[0] as usize) < i);
        let inside = self.groups[g0..]
            .iter()
            .take_while(|g| (g.roots[0] as usize) < end);
        groups.extend(inside.map(|g| Group {
            parent: g.parent,
            prefix: g.prefix.clone(),
            roots: g.roots.clone(),
        }));
    }
}

/// A finished walk from another state `from` of the same DFA: a node that both walks reach
/// in the same state (and alike in having accepted on the way) has the same subtree, so
/// the walk under way copies it (a property-name state reaches the string body a byte in).
pub struct Reuse<'a> {
    pub from: StateId,
    pub walk: &'a LexMask,
}

/// One DFA walk of the trie from `q`: the tokens alive throughout, and the subtrees where
/// the DFA dies after having accepted at a proper prefix (at depth >= 1: acceptance before
/// any byte is the closure's business).
///
/// `body` caches, per state of a plain lexeme's DFA, whether it reads string-body text
/// ([`body_loops`]); kept across walks of the lexeme (the states recur).
pub fn lex_walk(
    lexeme: &Lexeme,
    q: StateId,
    trie: &TokenTrie,
    words: usize,
    body: &mut BodyCache,
    reuse: Option<&Reuse<'_>>,
) -> LexMask {
    let sum = &trie.summary;
    if let Some(f) = lexeme.far_unit(q, trie.max_depth) {
        // The unit's star with a deficit counter, on a small dense state space: 0 dead,
        // 1 closed, 2 + deficit * k + unit state.
        let (unit, k) = (f.unit, f.unit.num_states());
        let start = unit.start();
        let closed = StateId::from_index(1);
        let enc = move |d: usize, u: StateId| StateId::from_index(2 + d * k + u.index());
        let dec = move |s: StateId| {
            (
                (s.index() - 2) / k,
                StateId::from_index((s.index() - 2) % k),
            )
        };
        let next = move |s: StateId, b: u8| {
            if s == closed {
                return DEAD;
            }
            let (d, u) = dec(s);
            if u == start && b == b'"' {
                return if d == 0 { closed } else { DEAD };
            }
            match unit.next(u, b) {
                DEAD => DEAD,
                t if unit.is_accepting(t) => enc(d.saturating_sub(1), start),
                t => enc(d, t),
            }
        };
        // At a unit boundary every unit keeps it alive (the deficit only gates the close):
        // settle by the unit star's body bytes.
        let loops = body.unit_loops(&|s, b| unit_star(unit, s, b), start);
        return walk_with(
            &next,
            |s| s == closed,
            |p, i, kids| {
                p != closed
                    && dec(p).1 == start
                    && (loops.as_ref()).is_some_and(|l| sum.fits(i, trie.nodes[i].byte, kids, l))
            },
            enc(f.deficit as usize, f.u),
            trie,
            words,
            None,
        );
    }
    if let Some(dfa) = lexeme.table() {
        // SAFETY: the walk only steps from `q` (a state of this DFA) and from states the
        // DFA returned, never from TERMINATED.
        let next = |s: StateId, b: u8| unsafe { dfa.next_unchecked(s, b) };
        return walk_with(
            &next,
            |s| dfa.is_accepting(s),
            |p, i, kids| body.settles(&next, p, i, trie.nodes[i].byte, kids, sum),
            q,
            trie,
            words,
            reuse,
        );
    }
    // A counted lexeme near its maximum: a subtree settles whole at a unit boundary when
    // its tokens are string-body text too short to reach the maximum.
    let loops = lexeme
        .room_at_boundary(q)
        .and_then(|(_, unit)| body.unit_loops(&|s, b| unit_star(unit, s, b), unit.start()));
    walk_with(
        &|s, b| lexeme.next(s, b),
        |s| lexeme.is_accepting(s),
        |p, i, kids| {
            loops.is_some_and(|l| {
                lexeme.room_at_boundary(p).is_some_and(|(room, _)| {
                    let len = trie.below[i] as u64 + !kids as u64;
                    room >= len && sum.fits(i, trie.nodes[i].byte, kids, &l)
                })
            })
        },
        q,
        trie,
        words,
        None,
    )
}

/// The star of a counted lexeme's unit: a completed unit starts the next one.
#[inline]
fn unit_star(unit: &TableDfa, s: StateId, b: u8) -> StateId {
    match unit.next(s, b) {
        t if t != DEAD && unit.is_accepting(t) => unit.start(),
        t => t,
    }
}

/// Per DFA state checked so far (by dense index, of `states`): [`body_loops`]' answer.
/// Sparse: a walk meets few of a large automaton's states, and a table per lexeme sized
/// by its states is memory every new grammar would zero and fault in.
#[derive(Debug, Default, Clone)]
pub struct BodyCache {
    checked: FxHashMap<u32, Option<Allowed>>,
    states: usize,
}

/// [`BodyCache`]'s slot for a counted lexeme's unit star.
const UNIT_SLOT: u32 = u32::MAX;

impl BodyCache {
    pub fn new(states: usize) -> Self {
        BodyCache {
            checked: FxHashMap::default(),
            states,
        }
    }

    /// Keep `other`'s answers too (two walks of one lexeme that ran at once).
    fn merge(&mut self, other: BodyCache) {
        if self.checked.len() < other.checked.len() {
            let mine = std::mem::replace(self, other);
            self.checked.extend(mine.checked);
        } else {
            self.checked.extend(other.checked);
        }
    }

    /// A counted lexeme's unit star at its start (kept in the first slot).
    fn unit_loops(
        &mut self,
        star: &impl Fn(StateId, u8) -> StateId,
        start: StateId,
    ) -> Option<Allowed> {
        *(self.checked)
            .entry(UNIT_SLOT)
            .or_insert_with(|| body_loops(star, start))
    }

    /// Is the subtree of node `i` (`kids`: below node `i`) alive throughout from state `p`
    /// (the state before it)?
    #[inline]
    fn settles(
        &mut self,
        next: &impl Fn(StateId, u8) -> StateId,
        p: StateId,
        i: usize,
        byte: u8,
        kids: bool,
        sum: &SubtreeSummary,
    ) -> bool {
        if p.index() >= self.states {
            return false;
        }
        let loops = (self.checked)
            .entry(p.index() as u32)
            .or_insert_with(|| body_loops(next, p));
        loops.as_ref().is_some_and(|l| sum.fits(i, byte, kids, l))
    }
}

/// If `q` reads text like a string body: the ASCII bytes that loop on `q`, and the UTF-8
/// lead bytes all of whose characters lead back to `q` (every prefix of one staying alive).
/// A subtree of valid UTF-8 made of those is then alive throughout from `q`.
fn body_loops(next: &impl Fn(StateId, u8) -> StateId, q: StateId) -> Option<Allowed> {
    let mut ascii = [0u64; 2];
    for b in 0..128u8 {
        if next(q, b) == q {
            ascii[b as usize / 64] |= 1 << (b % 64);
        }
    }
    if ascii == [0, 0] {
        return None; // not a body: settle nothing (and spare the check below)
    }
    let mut lead = 0u64;
    let mut seen: FxHashSet<(u8, StateId)> = FxHashSet::default();
    'leads: for b0 in 0xC2..=0xF4u8 {
        let Some(u1) = utf8::next(utf8::BOUNDARY, b0) else {
            continue;
        };
        let s1 = next(q, b0);
        if s1 == DEAD {
            continue;
        }
        seen.clear();
        let mut stack = vec![(u1, s1)];
        while let Some((u, s)) = stack.pop() {
            for b in 0x80..=0xBFu8 {
                let Some(u2) = utf8::next(u, b) else {
                    continue;
                };
                let s2 = next(s, b);
                if s2 == DEAD || (u2 == utf8::BOUNDARY && s2 != q) {
                    continue 'leads;
                }
                if u2 != utf8::BOUNDARY && seen.insert((u2, s2)) {
                    if seen.len() > 16 {
                        continue 'leads; // not a plain decoder under this lead byte
                    }
                    stack.push((u2, s2));
                }
            }
        }
        lead |= 1 << (b0 - 0xC0);
    }
    Some(Allowed { ascii, lead })
}

/// [`lex_walk`] over a transition function (monomorphised: this loop may visit every
/// live trie node). `settle(p, i, kids)`: is node `i`'s subtree (`kids`: what lies below
/// node `i`) alive throughout from state `p`, the state before it? Then its tokens are
/// set without a visit: checked for the top-level nodes before their byte and for every
/// other subtree right after its first byte.
#[inline(always)]
fn walk_with(
    next: &impl Fn(StateId, u8) -> StateId,
    accepting: impl Fn(StateId) -> bool,
    mut settle: impl FnMut(StateId, usize, bool) -> bool,
    q: StateId,
    trie: &TokenTrie,
    words: usize,
    reuse: Option<&Reuse<'_>>,
) -> LexMask {
    let mut groups: Vec<Group> = Vec::new();
    let depth = trie.max_depth + 1;
    // Per depth: DFA state, "accepted at some depth >= 1 on the path", byte, node index.
    let mut st = vec![(DEAD, false); depth];
    let mut path = vec![0u8; depth];
    let mut at = vec![0u32; depth];
    st[0] = (q, false);
    let mut rst = vec![(DEAD, false); if reuse.is_some() { depth } else { 0 }];
    if let Some(r) = reuse {
        rst[0] = (r.from, false);
    }
    // Token ranges whose verdict is the other walk's.
    let mut copied = Ranges::default();
    let nodes = &trie.nodes[..];
    let ts = &trie.tok_start[..];
    let n = nodes.len();
    // Every token is in one of these: its node visited alive, a settled subtree (live), or
    // a subtree where the DFA died (dead). Ranges of `token_ids`, in preorder.
    let mut live = Ranges::default();
    let mut dead = Ranges::default();
    let mut i = 0;
    while i < n {
        let node = nodes[i];
        let d = node.depth as usize;
        let (prev, acc) = st[d - 1];
        let end = node.end as usize;
        let s = next(prev, node.byte);
        // (A top-level subtree whose first byte dies cannot settle: stepping first spares
        // the settle check, a hash look-up, on the ~250 dead top-level bytes of a literal.)
        if d == 1 && s != DEAD && end > i + 1 && settle(prev, i, false) {
            live.push(ts[i], ts[end]);
            i = end;
            continue;
        }
        if s == DEAD {
            if acc {
                let parent = at[d - 1];
                match groups.last_mut() {
                    Some(g) if g.parent == parent => g.roots.push(i as u32),
                    _ => groups.push(Group {
                        parent,
                        prefix: path[..d - 1].into(),
                        roots: vec![i as u32],
                    }),
                }
            }
            dead.push(ts[i], ts[end]);
            i = end;
            continue;
        }
        let acc_s = acc || accepting(s);
        if let Some(r) = reuse {
            // The other walk's state here (dead once its path left this one's).
            let (rp, racc) = rst[d - 1];
            let rs = if rp == DEAD {
                DEAD
            } else {
                next(rp, node.byte)
            };
            if rs == s && racc == acc_s {
                r.walk.copy_groups((i, end), &mut groups);
                copied.push(ts[i], ts[end]);
                i = end;
                continue;
            }
            rst[d] = (rs, rs != DEAD && (racc || accepting(rs)));
        }
        if end > i + 1 && settle(s, i, true) {
            live.push(ts[i], ts[end]);
            i = end;
            continue;
        }
        st[d] = (s, acc_s);
        path[d - 1] = node.byte;
        at[d] = i as u32;
        live.push(ts[i], ts[i + 1]);
        i += 1;
    }
    let alive = match reuse {
        Some(r) => patched(r.walk, &copied, &live, trie, words),
        None => tokens_of(&live, &dead, trie, words),
    };
    LexMask { alive, groups }
}

/// Sorted, merged half-open ranges.
#[derive(Default)]
struct Ranges {
    spans: Vec<(u32, u32)>,
    count: usize,
}

impl Ranges {
    #[inline]
    fn push(&mut self, a: u32, b: u32) {
        if a == b {
            return;
        }
        self.count += (b - a) as usize;
        match self.spans.last_mut() {
            Some(last) if last.1 == a => last.1 = b,
            _ => self.spans.push((a, b)),
        }
    }
}

/// The tokens of a walk that took the ranges `copied` from walk `from` and found `live`
/// alive elsewhere: `from`'s set with the other ranges' tokens replaced (the cost follows
/// the ranges walked here, not the whole set).
fn patched(
    from: &LexMask,
    copied: &Ranges,
    live: &Ranges,
    trie: &TokenTrie,
    words: usize,
) -> Tokens {
    let ids = &trie.token_ids;
    let mut bits = vec![0u32; words];
    from.alive.or_into(&mut bits);
    let mut at = 0u32;
    let end = ids.len() as u32;
    for (a, b) in (copied.spans.iter().copied()).chain([(end, end)]) {
        for &t in &ids[at as usize..a as usize] {
            bits[t as usize / 32] &= !(1 << (t % 32));
        }
        at = b;
    }
    for &(a, b) in &live.spans {
        set_bits(&mut bits, &ids[a as usize..b as usize]);
    }
    Tokens::Bits(bits.into())
}

/// The live tokens as a list or a bitmap, built from whichever side is smaller: the live
/// ranges' bits set, or the trie's full bitmap with the dead ranges' bits cleared.
fn tokens_of(live: &Ranges, dead: &Ranges, trie: &TokenTrie, words: usize) -> Tokens {
    let ids = &trie.token_ids;
    if live.count <= LIST_MAX {
        let list = (live.spans.iter())
            .flat_map(|&(a, b)| ids[a as usize..b as usize].iter().copied())
            .collect();
        return Tokens::List(list);
    }
    if live.count <= dead.count {
        let mut bits = vec![0u32; words];
        for &(a, b) in &live.spans {
            set_bits(&mut bits, &ids[a as usize..b as usize]);
        }
        return Tokens::Bits(bits.into());
    }
    let mut bits: Box<[u32]> = trie.summary.all.clone();
    for &(a, b) in &dead.spans {
        for &t in &ids[a as usize..b as usize] {
            bits[t as usize / 32] &= !(1 << (t % 32));
        }
    }
    Tokens::Bits(bits)
}

/// A parser state's cached mask. Kept as its parts (the scanning lexemes' walks, shared with
/// the lexeme cache, and the few tokens the parser added) when at most one part is a bitmap:
/// writing it out then costs about a copy, and keeping it costs no bitmap (a fresh bitmap
/// per new state was ~40% of a first mask's time, in allocation and first-touch page
/// faults). Otherwise the union.
#[derive(Debug)]
pub enum StateMask {
    Parts {
        lex: Box<[Arc<LexMask>]>,
        extra: Box<[u32]>,
    },
    Union(Box<[u32]>),
}

impl StateMask {
    pub fn write(&self, out: &mut [u32]) {
        match self {
            StateMask::Union(b) => out.copy_from_slice(b),
            StateMask::Parts { lex, extra } => {
                // The bitmap part (at most one) is copied, the lists set on top.
                let bitmap = lex.iter().find_map(|m| match &m.alive {
                    Tokens::Bits(b) => Some(b),
                    Tokens::List(_) => None,
                });
                match bitmap {
                    Some(b) => out.copy_from_slice(b),
                    None => out.fill(0),
                }
                for m in lex.iter() {
                    if let Tokens::List(l) = &m.alive {
                        set_bits(out, l);
                    }
                }
                set_bits(out, extra);
            }
        }
    }

    /// Memory of its own (the walks are counted where they are cached).
    fn bytes(&self) -> usize {
        std::mem::size_of::<Self>()
            + match self {
                StateMask::Union(b) => std::mem::size_of_val(&b[..]),
                StateMask::Parts { lex, extra } => 8 * lex.len() + 4 * extra.len(),
            }
    }
}

#[inline]
fn set_bits(out: &mut [u32], tokens: &[u32]) {
    for &t in tokens {
        out[t as usize / 32] |= 1 << (t % 32);
    }
}

/// The memory cap that a grammar's mask caches share (its lexeme walks and the state masks
/// of every chart generation alive): beyond it, masks are recomputed on every request.
#[derive(Debug)]
pub struct CacheBudget {
    used: AtomicUsize,
    cap: usize,
}

impl CacheBudget {
    pub fn new(cap: usize) -> Self {
        CacheBudget {
            used: AtomicUsize::new(0),
            cap,
        }
    }

    /// Reserve `n` bytes if the cap allows.
    fn take(&self, n: usize) -> bool {
        (self.used)
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| {
                u.checked_add(n).filter(|&t| t <= self.cap)
            })
            .is_ok()
    }

    fn give_back(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::Relaxed);
    }

    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }
}

/// Cached masks of one chart's parser states (ids are the chart's): their memory returns
/// to the budget when the chart goes.
#[derive(Debug)]
pub struct StateMasks {
    masks: Mutex<FxHashMap<u32, Arc<StateMask>>>,
    bytes: AtomicUsize,
    budget: Arc<CacheBudget>,
}

impl StateMasks {
    pub fn new(budget: Arc<CacheBudget>) -> Self {
        StateMasks {
            masks: Mutex::default(),
            bytes: AtomicUsize::new(0),
            budget,
        }
    }

    fn lock(&self) -> MutexGuard<'_, FxHashMap<u32, Arc<StateMask>>> {
        // Entries go in whole: a poisoned lock still holds only complete masks.
        self.masks.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn contains(&self, state: u32) -> bool {
        self.lock().contains_key(&state)
    }

    /// `state`'s cached mask (written out by the caller, after the lock is gone).
    pub fn get(&self, state: u32) -> Option<Arc<StateMask>> {
        self.lock().get(&state).cloned()
    }

    /// Keep `mask` if the cap allows.
    pub fn offer(&self, state: u32, mask: StateMask) {
        let size = mask.bytes();
        let mut masks = self.lock();
        if !masks.contains_key(&state) && self.budget.take(size) {
            masks.insert(state, Arc::new(mask));
            self.bytes.fetch_add(size, Ordering::Relaxed);
        }
    }
}

impl Drop for StateMasks {
    fn drop(&mut self) {
        self.budget.give_back(*self.bytes.get_mut());
    }
}

/// The walks of (lexeme, DFA state) pairs: one grammar's, whatever chart its states are in
/// (they read no parser state), under the grammar's cache budget.
#[derive(Debug)]
pub struct LexWalks {
    inner: Mutex<LexInner>,
    budget: Arc<CacheBudget>,
}

/// A walk, once some thread has run it: the threads that need it meanwhile wait for that
/// one instead of running it again (a batch's requests start in the same states).
type Slot = Arc<OnceLock<Arc<LexMask>>>;

#[derive(Debug, Default)]
struct LexInner {
    /// By [`Lexeme::mask_key`].
    lex: FxHashMap<(u32, u64), Slot>,
    /// Per plain lexeme: its DFA states' [`body_loops`].
    bodies: FxHashMap<u32, BodyCache>,
}

impl LexWalks {
    pub fn new(budget: Arc<CacheBudget>) -> Self {
        LexWalks {
            inner: Mutex::default(),
            budget,
        }
    }

    fn lock(&self) -> MutexGuard<'_, LexInner> {
        // Entries go in whole: a poisoned lock still holds only complete walks.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The walk of lexeme `l` from DFA state `q`: from this grammar's cache, else from the
    /// vocabulary's (`shared`, plain lexemes), else walked. No lock is held while a walk
    /// runs; a walk past the cache budget is dropped once its waiters have it.
    fn lex_mask(
        &self,
        g: &Grammar,
        trie: &TokenTrie,
        shared: &SharedWalks,
        words: usize,
        (l, q): (u32, StateId),
    ) -> Arc<LexMask> {
        let key = g.lexemes[l as usize].mask_key(l, q, trie.max_depth);
        let slot: Slot = self.lock().lex.entry(key).or_default().clone();
        if let Some(m) = slot.get() {
            return m.clone();
        }
        let mut ran = false;
        let m = (slot.get_or_init(|| {
            ran = true;
            self.walk(g, trie, shared, words, (l, q))
        }))
        .clone();
        if ran && !self.budget.take(m.bytes()) {
            let mut inner = self.lock();
            if inner.lex.get(&key).is_some_and(|s| Arc::ptr_eq(s, &slot)) {
                inner.lex.remove(&key);
            }
        }
        m
    }

    /// [`LexWalks::lex_mask`]'s walk when this grammar has none: the vocabulary's, else one
    /// run here, copying first-level subtrees from the walk of the state most bytes lead to
    /// when that state loops on them (a property-name state, one byte into a string: most
    /// bytes lead to the string body).
    fn walk(
        &self,
        g: &Grammar,
        trie: &TokenTrie,
        shared: &SharedWalks,
        words: usize,
        (l, q): (u32, StateId),
    ) -> Arc<LexMask> {
        let lexeme = &g.lexemes[l as usize];
        let canon = shared.key_of(lexeme, q);
        if let Some(m) = canon.and_then(|c| shared.get(c)) {
            return m;
        }
        let via = (lexeme.table())
            .and_then(|dfa| majority_successor(dfa, q).map(|r| (dfa, r)))
            .filter(|&(dfa, (r, n))| {
                r != q
                    && n >= REUSE_MIN_BYTES
                    && majority_successor(dfa, r).is_some_and(|(r2, _)| r2 == r)
            })
            // (The state it copies from loops: it copies from none, so no cycle of waits.)
            .map(|(_, (r, _))| (r, self.lex_mask(g, trie, shared, words, (l, r))));
        let reuse = (via.as_ref()).map(|(from, walk)| Reuse { from: *from, walk });
        let states = lexeme.table().map_or(0, |d| d.num_states());
        let mut body =
            (self.lock().bodies.get(&l).cloned()).unwrap_or_else(|| BodyCache::new(states));
        let m = Arc::new(lex_walk(lexeme, q, trie, words, &mut body, reuse.as_ref()));
        self.lock().bodies.entry(l).or_default().merge(body);
        if let Some(c) = canon {
            shared.offer(c, m.clone());
        }
        m
    }
}

/// A chart read under its shared lock, and under its exclusive one from the first thing the
/// shared borrow does not hold (a transition or first-byte set not cached) until the view
/// is dropped: a view lasts one group of subtrees, so a cold group takes the exclusive lock
/// once, and a cached one never.
struct ChartView<'a> {
    lock: &'a RwLock<Chart>,
    read: Option<RwLockReadGuard<'a, Chart>>,
    write: Option<RwLockWriteGuard<'a, Chart>>,
}

impl<'a> ChartView<'a> {
    fn new(lock: &'a RwLock<Chart>) -> Self {
        ChartView {
            lock,
            read: None,
            write: None,
        }
    }

    fn chart(&mut self) -> &Chart {
        if let Some(w) = &self.write {
            return w;
        }
        let lock = self.lock;
        self.read.get_or_insert_with(|| read_chart(lock))
    }

    fn chart_mut(&mut self) -> &mut Chart {
        if self.write.is_none() {
            self.read = None;
        }
        let lock = self.lock;
        self.write.get_or_insert_with(|| write_chart(lock))
    }

    #[inline]
    fn step(&mut self, g: &Grammar, s: u32, b: u8) -> Result<u32, Full> {
        match self.chart().cached_step(s, b) {
            Some(t) => Ok(t),
            None => self.chart_mut().step(g, s, b),
        }
    }

    fn run(&mut self, g: &Grammar, mut s: u32, bytes: &[u8]) -> Result<u32, Full> {
        for &b in bytes {
            if s == DEAD_SET {
                break;
            }
            s = self.step(g, s, b)?;
        }
        Ok(s)
    }

    fn first_bytes(&mut self, g: &Grammar, s: u32) -> [u64; 4] {
        match self.chart().cached_first_bytes(s) {
            Some(f) => f,
            None => self.chart_mut().first_bytes(g, s),
        }
    }
}

/// Locks of a chart: a panic while one is held leaves only caches half-filled, never a
/// wrong entry (sets are pushed and indexed together), so a poisoned lock is still usable.
pub fn read_chart(lock: &RwLock<Chart>) -> RwLockReadGuard<'_, Chart> {
    lock.read().unwrap_or_else(|e| e.into_inner())
}

pub fn write_chart(lock: &RwLock<Chart>) -> RwLockWriteGuard<'_, Chart> {
    lock.write().unwrap_or_else(|e| e.into_inner())
}

/// Set in `out` (zeroed first) the bits of the text tokens the parser accepts from `state`
/// and return them to be kept; [`Full`] when the parser part needs a state past the
/// chart's cap (then `out` is not the mask).
pub fn fill(
    chart: &RwLock<Chart>,
    walks: &LexWalks,
    g: &Grammar,
    trie: &TokenTrie,
    shared: &SharedWalks,
    state: u32,
    out: &mut [u32],
) -> Result<StateMask, Full> {
    out.fill(0);
    let mut pairs = Vec::new();
    read_chart(chart).scanning(g, state, &mut pairs);
    pairs.sort_unstable();
    pairs.dedup();
    let mut lex: Vec<Arc<LexMask>> = (pairs.iter())
        .map(|&pair| walks.lex_mask(g, trie, shared, out.len(), pair))
        .collect();
    // States far from a counted lexeme's bounds share one walk.
    lex.sort_unstable_by_key(Arc::as_ptr);
    lex.dedup_by_key(|m| Arc::as_ptr(m));
    let mut groups: Vec<&Group> = Vec::new();
    for m in &lex {
        m.alive.or_into(out);
        groups.extend(m.groups.iter());
    }
    // Subtrees under one parent share the parser state after its prefix.
    groups.sort_by_key(|gr| gr.parent);
    let mut roots: Vec<u32> = Vec::new();
    let mut extra: Vec<u32> = Vec::new();
    let mut stack = vec![DEAD_SET; trie.max_depth + 1];
    let mut k = 0;
    while k < groups.len() {
        let parent = groups[k].parent;
        let prefix = &groups[k].prefix;
        roots.clear();
        while k < groups.len() && groups[k].parent == parent {
            roots.extend_from_slice(&groups[k].roots);
            k += 1;
        }
        // One view per group: its locks are released between groups, so another thread's
        // step that needs the chart exclusively waits for one group at most.
        let mut view = ChartView::new(chart);
        let p = view.run(g, state, prefix)?;
        if p == DEAD_SET {
            continue;
        }
        roots.sort_unstable();
        roots.dedup();
        // Most roots start with a byte nothing in `p` can scan (whitespace ended before a
        // word): test the byte before stepping, which would intern a dead transition each.
        let first = view.first_bytes(g, p);
        for &r in &roots {
            let b = trie.nodes[r as usize].byte;
            if first[b as usize / 64] >> (b % 64) & 1 == 1 {
                walk_subtree(&mut view, g, trie, p, r as usize, &mut stack, &mut extra)?;
            }
        }
    }
    set_bits(out, &extra);
    let bitmaps = (lex.iter())
        .filter(|m| matches!(m.alive, Tokens::Bits(_)))
        .count();
    Ok(if bitmaps <= 1 && extra.len() <= LIST_MAX {
        StateMask::Parts {
            lex: lex.into(),
            extra: extra.into(),
        }
    } else {
        StateMask::Union(out.into())
    })
}

/// Push to `out` the tokens in the subtree of trie node `root` that the parser accepts,
/// `state` being its state before the root's byte: one pruned preorder walk (a subtree is
/// skipped as soon as the parser dies; each node costs one cached transition). `stack`:
/// scratch of `max_depth + 1` parser states, reused across calls.
fn walk_subtree(
    chart: &mut ChartView<'_>,
    g: &Grammar,
    trie: &TokenTrie,
    state: u32,
    root: usize,
    stack: &mut [u32],
    out: &mut Vec<u32>,
) -> Result<(), Full> {
    let nodes = &trie.nodes;
    let base = nodes[root].depth as usize - 1;
    stack[base] = state;
    let stop = nodes[root].end as usize;
    let mut i = root;
    while i < stop {
        let node = nodes[i];
        let d = node.depth as usize;
        let s = chart.step(g, stack[d - 1], node.byte)?;
        if s == DEAD_SET {
            i = node.end as usize;
            continue;
        }
        stack[d] = s;
        out.extend_from_slice(
            &trie.token_ids[trie.tok_start[i] as usize..trie.tok_start[i + 1] as usize],
        );
        i += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::constrain::regex::RegexLimits;
    use crate::constrain::Vocabulary;
    use proptest::prelude::*;

    fn token_set(m: &LexMask, words: usize) -> Vec<u32> {
        let mut bits = vec![0u32; words];
        m.alive.or_into(&mut bits);
        (0..words as u32 * 32)
            .filter(|&t| bits[t as usize / 32] >> (t % 32) & 1 == 1)
            .collect()
    }

    fn group_set(m: &LexMask) -> Vec<(u32, Vec<u8>, u32)> {
        let mut out: Vec<_> = (m.groups.iter())
            .flat_map(|g| g.roots.iter().map(|&r| (g.parent, g.prefix.to_vec(), r)))
            .collect();
        out.sort();
        out
    }

    /// Lexemes with text-like states (string bodies, names excluded from a string).
    const LEXEMES: &[&str] = &[
        r#""(?:[^"\\\x00-\x1F]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*""#,
        r#""(?:[^"\\]|\\.)*"|"ab"x"#,
        r#""[ab]*(?:c|"")?"#,
        r#"(?:[^"]|"a)*"#,
        // The same state reached with and without having accepted on the way.
        r#""a(?:bc)?|xabc"#,
    ];

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        /// A walk copying subtrees from another state's walk (any state of the DFA) equals
        /// the walk done in full: same tokens, same places where the lexeme can end.
        #[test]
        fn reuse_equals_full_walk(
            tokens in prop::collection::vec(
                prop::collection::vec(prop::sample::select(vec![
                    b'a', b'b', b'c', b'"', b'\\', b'x', b'u', b'0', b'd', b'e', b'f', b'g',
                    b'h', b' ', 0xC3, 0xA9,
                ]), 1..7),
                900..2000),
            which in 0..LEXEMES.len(),
        ) {
            let toks: Vec<Option<Vec<u8>>> = tokens.into_iter().map(Some).collect();
            let n = toks.len();
            let v = Vocabulary::new(toks, &[n as i64], Some(n + 1)).unwrap();
            let (trie, words) = (v.trie(), v.words());
            let lexeme = Lexeme::compile(LEXEMES[which], RegexLimits::default()).unwrap();
            let dfa = lexeme.table().unwrap();
            let states: Vec<StateId> = dfa.states().filter(|&s| s != DEAD).collect();
            let mut body = BodyCache::new(dfa.num_states());
            let full: Vec<LexMask> = (states.iter())
                .map(|&q| lex_walk(&lexeme, q, trie, words, &mut body, None))
                .collect();
            for (k, &q) in states.iter().enumerate() {
                for (j, &r) in states.iter().enumerate() {
                    let reuse = Reuse { from: r, walk: &full[j] };
                    let m = lex_walk(&lexeme, q, trie, words, &mut body, Some(&reuse));
                    prop_assert_eq!(token_set(&m, words), token_set(&full[k], words));
                    prop_assert_eq!(group_set(&m), group_set(&full[k]));
                }
            }
        }
    }
}
