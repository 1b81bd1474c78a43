//! A regex compiled against one vocabulary: the DFA, the shared trie, the mask cache.

use std::sync::Arc;

use std::sync::OnceLock;

use super::cache::MaskCache;
use super::class_trie::{byte_classes, ClassTrie};
use super::equiv::StateLevels;
use super::regex::{RegexLimits, TableDfa, DEAD};
use super::trie::TrieNode;
use super::vocab::Vocabulary;
use super::GrammarError;

/// Matcher state after EOS was accepted (no token may follow).
pub const TERMINATED: u32 = u32::MAX;

/// A byte-trie walk visiting more nodes than this triggers the class trie.
const CLASS_TRIE_AFTER: usize = 30_000;

/// A full walk visiting more nodes than this builds the state levels (later walks then
/// start from a similar state's cached mask).
const LEVELS_AFTER: usize = 4_000;

/// Lookahead covered by the state levels (deeper subtrees are compared state by state:
/// only long tokens have them, and each level costs a pass over the DFA).
const MAX_LEVELS: usize = 24;

/// Precompute visits one state per class at this level first (states agreeing on 4 bytes
/// of lookahead mostly share their masks).
const CLUSTER_LEVEL: usize = 4;

/// The class trie is used only when the DFA splits bytes into at most this many classes.
const MAX_CLASSES: usize = 16;

/// Default memory cap of the per-state mask cache.
pub const DEFAULT_CACHE_BYTES: usize = 256 << 20;

#[derive(Debug)]
pub struct CompiledRegex {
    vocab: Arc<Vocabulary>,
    dfa: TableDfa,
    cache: MaskCache,
    class_trie: OnceLock<ClassTrie>,
    classes: OnceLock<([u8; 256], usize)>,
    levels: OnceLock<StateLevels>,
    pattern: String,
}

impl CompiledRegex {
    pub fn new(
        vocab: Arc<Vocabulary>,
        pattern: &str,
        limits: RegexLimits,
        cache_bytes: usize,
    ) -> Result<Self, GrammarError> {
        let dfa = TableDfa::compile(pattern, limits)?;
        let cache = MaskCache::new(dfa.num_states(), cache_bytes);
        Ok(CompiledRegex {
            vocab,
            dfa,
            cache,
            class_trie: OnceLock::new(),
            classes: OnceLock::new(),
            levels: OnceLock::new(),
            pattern: pattern.to_owned(),
        })
    }

    pub fn vocab(&self) -> &Arc<Vocabulary> {
        &self.vocab
    }

    pub fn dfa(&self) -> &TableDfa {
        &self.dfa
    }

    pub fn pattern(&self) -> &str {
        &self.pattern
    }

    pub fn cache(&self) -> &MaskCache {
        &self.cache
    }

    pub fn start(&self) -> u32 {
        self.dfa.start()
    }

    /// State after `token` from `state` (DEAD if the grammar rejects it). `token` must be
    /// in range (checked by the caller).
    #[inline]
    pub fn step(&self, state: u32, token: usize) -> u32 {
        if state == TERMINATED {
            // A finished sequence may keep emitting EOS (padding in a batch), nothing else.
            return if self.vocab.is_eos(token) {
                TERMINATED
            } else {
                DEAD
            };
        }
        if state == DEAD {
            return DEAD;
        }
        if self.vocab.is_eos(token) {
            return if self.dfa.is_accepting(state) {
                TERMINATED
            } else {
                DEAD
            };
        }
        if !self.vocab.has_bytes(token) {
            return DEAD;
        }
        self.dfa.run(state, self.vocab.token_bytes(token))
    }

    /// May generation stop here (EOS allowed)?
    pub fn is_accepting(&self, state: u32) -> bool {
        state != TERMINATED && state != DEAD && self.dfa.is_accepting(state)
    }

    /// Write the allowed-token bitmap of `state` into `out[..words]` (words past the
    /// vocabulary's are zeroed). After termination only EOS is allowed.
    pub fn fill_mask(&self, state: u32, out: &mut [u32]) {
        let words = self.vocab.words();
        debug_assert!(out.len() >= words);
        out[words..].fill(0);
        let out = &mut out[..words];
        if state == TERMINATED {
            out.fill(0);
            self.set_eos(out);
            return;
        }
        if state == DEAD {
            out.fill(0);
            return;
        }
        let idx = TableDfa::index(state);
        if let Some(m) = self.cache.get(idx) {
            out.copy_from_slice(m);
            return;
        }
        self.walk(state, out);
        if self.dfa.is_accepting(state) {
            self.set_eos(out);
        }
        self.cache.offer(idx, out);
        if let Some(lv) = self.levels.get() {
            if self.cache.get(idx).is_some() {
                lv.note_cached(idx);
            }
        }
    }

    /// Is `state`'s mask ready without a walk (cached, terminated or dead)?
    pub fn is_cheap(&self, state: u32) -> bool {
        state == TERMINATED || state == DEAD || self.cache.get(TableDfa::index(state)).is_some()
    }

    fn set_eos(&self, out: &mut [u32]) {
        for &e in self.vocab.eos_ids() {
            out[e as usize / 32] |= 1 << (e % 32);
        }
    }

    /// Fill `out` with the tokens viable from `state`: from a cached state's mask when one
    /// agrees with `state` on enough lookahead (descending only where they differ), else one
    /// walk of the merged class trie when this grammar has one, else of the byte trie
    /// (building the class trie and the state levels once a byte walk turns out large).
    fn walk(&self, state: u32, out: &mut [u32]) {
        if let Some(lv) = self.levels.get() {
            let idx = TableDfa::index(state);
            let found = lv.best_ref(idx).or_else(|| {
                lv.first_byte_ref(&self.dfa, idx, LEVELS_AFTER, |t| {
                    self.cache.get(t).is_some()
                })
                .map(|t| (t, 0))
            });
            if let Some((t, level)) = found {
                if let Some(m) = self.cache.get(t) {
                    out.copy_from_slice(m);
                    for &e in self.vocab.eos_ids() {
                        out[e as usize / 32] &= !(1 << (e % 32));
                    }
                    let depth = self.vocab.trie().max_depth;
                    if !(level == lv.top() && lv.covers(depth)) {
                        let r = (t * 256) as u32;
                        match self.class_trie.get() {
                            Some(ct) => diff_walk(
                                &self.dfa,
                                lv,
                                [state, r],
                                (&ct.nodes, &ct.token_ids, &ct.below, ct.max_depth),
                                Some(ct),
                                out,
                            ),
                            None => {
                                let tr = self.vocab.trie();
                                diff_walk(
                                    &self.dfa,
                                    lv,
                                    [state, r],
                                    (&tr.nodes, &tr.token_ids, &tr.below, tr.max_depth),
                                    None,
                                    out,
                                )
                            }
                        }
                    }
                    return;
                }
            }
        }
        out.fill(0);
        if let Some(ct) = self.class_trie.get() {
            let visited = walk_nodes(
                &self.dfa,
                state,
                &ct.nodes,
                &ct.token_ids,
                ct.max_depth,
                Some(ct),
                out,
            );
            if visited > LEVELS_AFTER {
                self.init_levels();
            }
            return;
        }
        let trie = self.vocab.trie();
        let visited = walk_nodes(
            &self.dfa,
            state,
            &trie.nodes,
            &trie.token_ids,
            trie.max_depth,
            None,
            out,
        );
        if visited > LEVELS_AFTER {
            self.init_levels();
        }
        if visited > CLASS_TRIE_AFTER {
            // Merging pays off when few classes remain; with many (literal-heavy grammars)
            // the merged trie stays large and its build would cost more than it saves.
            let classes = self.classes.get_or_init(|| byte_classes(&self.dfa));
            if classes.1 <= MAX_CLASSES {
                self.class_trie
                    .get_or_init(|| ClassTrie::build(trie, &classes.0, self.vocab.words()));
            }
        }
    }

    /// Build the state levels now (normally built after the first large walk).
    pub fn init_levels(&self) {
        self.levels.get_or_init(|| {
            let classes = self.classes.get_or_init(|| byte_classes(&self.dfa));
            let mut reps: Vec<u8> = (0..=255u8)
                .filter(|&b| classes.0[b as usize] == b)
                .collect();
            reps.dedup();
            let under = first_byte_nodes(self.vocab.trie());
            let mut weight = vec![0usize; reps.len()];
            for (&r, &u) in classes.0.iter().zip(&under) {
                weight[reps.binary_search(&r).expect("a class byte")] += u;
            }
            let depth = self.vocab.trie().max_depth.min(MAX_LEVELS);
            let lv = StateLevels::build(&self.dfa, &reps, weight, depth);
            for idx in 1..self.dfa.num_states() {
                if self.cache.get(idx).is_some() {
                    lv.note_cached(idx);
                }
            }
            lv
        });
    }

    /// Build the merged class trie now (normally built after the first large walk).
    pub fn use_class_trie(&self) {
        let classes = self.classes.get_or_init(|| byte_classes(&self.dfa));
        self.class_trie
            .get_or_init(|| ClassTrie::build(self.vocab.trie(), &classes.0, self.vocab.words()));
    }

    pub fn has_class_trie(&self) -> bool {
        self.class_trie.get().is_some()
    }

    /// Compute and cache every live state's mask now (fast first masks, slower compile).
    pub fn precompute(&self) {
        let words = self.vocab.words();
        let mut buf = vec![0u32; words];
        for idx in 1..self.dfa.num_states() {
            if self.cache.get(idx).is_none() {
                self.fill_mask((idx * 256) as u32, &mut buf);
            }
        }
    }

    /// Precompute masks until `budget` has elapsed, on every rayon thread: cheap grammars
    /// end up fully cached at compile time; for the others the budget goes to the widest
    /// states first, one per group of similar states (the rest then start from its mask).
    pub fn precompute_within(&self, budget: std::time::Duration) {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let t0 = std::time::Instant::now();
        let order = self.precompute_order();
        let next = AtomicUsize::new(0);
        let words = self.vocab.words();
        rayon::broadcast(|_| {
            let mut buf = vec![0u32; words];
            while t0.elapsed() < budget {
                let k = next.fetch_add(1, Ordering::Relaxed);
                let Some(&idx) = order.get(k) else { break };
                if self.cache.get(idx).is_none() {
                    self.fill_mask((idx * 256) as u32, &mut buf);
                }
            }
        });
    }

    /// States in precompute order: index order (start first) when every walk is small,
    /// else one state per level-`CLUSTER_LEVEL` class, widest first (by the trie nodes
    /// under its live first bytes), then the rest in index order.
    fn precompute_order(&self) -> Vec<usize> {
        let n = self.dfa.num_states();
        let under = first_byte_nodes(self.vocab.trie());
        let est: Vec<usize> = (0..n)
            .map(|idx| {
                (0..=255u8)
                    .filter(|&b| idx > 0 && self.dfa.next((idx * 256) as u32, b) != DEAD)
                    .map(|b| under[b as usize])
                    .sum()
            })
            .collect();
        if est.iter().all(|&e| e <= LEVELS_AFTER) {
            return (1..n).collect();
        }
        self.init_levels();
        let lv = self.levels.get().expect("just built");
        // Greedy, widest first: a wide state heads a group unless an earlier head is similar
        // (same class at `CLUSTER_LEVEL`, or few differing first bytes); heads go first.
        let mut wide: Vec<usize> = (1..n).filter(|&i| est[i] > LEVELS_AFTER).collect();
        wide.sort_by_key(|&idx| std::cmp::Reverse(est[idx]));
        let mut first: Vec<usize> = Vec::new();
        let mut is_head = vec![false; n];
        for idx in wide {
            let similar = first.iter().any(|&h| {
                lv.class(CLUSTER_LEVEL, h) == lv.class(CLUSTER_LEVEL, idx) || {
                    let (own, diff) = lv.first_byte_costs(&self.dfa, idx, h);
                    diff * 4 < own
                }
            });
            if !similar {
                is_head[idx] = true;
                first.push(idx);
            }
        }
        let rest = (1..n).filter(|&i| !is_head[i]);
        first.extend(rest);
        first
    }

    /// Slow reference: every token's bytes run through the DFA one by one (for tests).
    pub fn brute_force_mask(&self, state: u32, out: &mut [u32]) {
        out.fill(0);
        if state == TERMINATED {
            self.set_eos(out);
            return;
        }
        for t in 0..self.vocab.vocab_size() {
            if self.step(state, t) != DEAD {
                out[t / 32] |= 1 << (t % 32);
            }
        }
    }
}

/// Trie nodes under each first byte.
fn first_byte_nodes(trie: &super::trie::TokenTrie) -> [usize; 256] {
    let mut under = [0usize; 256];
    let mut i = 0;
    while i < trie.nodes.len() {
        let node = trie.nodes[i];
        under[node.byte as usize] = node.end as usize - i;
        i = node.end as usize;
    }
    under
}

/// One preorder walk, skipping a subtree as soon as the DFA dies; returns nodes visited.
fn walk_nodes(
    dfa: &TableDfa,
    state: u32,
    nodes: &[TrieNode],
    ids: &[u32],
    max_depth: usize,
    heavy: Option<&ClassTrie>,
    out: &mut [u32],
) -> usize {
    walk_range(
        dfa,
        state,
        nodes,
        ids,
        0,
        nodes.len(),
        max_depth,
        heavy,
        out,
    )
}

/// [`walk_nodes`] over the subtree `nodes[start..stop]` (a whole subtree, or the whole
/// trie), `state` being the DFA state before its root's byte.
#[allow(clippy::too_many_arguments)]
fn walk_range(
    dfa: &TableDfa,
    state: u32,
    nodes: &[TrieNode],
    ids: &[u32],
    start: usize,
    stop: usize,
    max_depth: usize,
    heavy: Option<&ClassTrie>,
    out: &mut [u32],
) -> usize {
    let mut stack = vec![0u32; max_depth + 1];
    let n = nodes.len();
    debug_assert!(start < stop || start == n);
    let base = if start < n {
        nodes[start].depth as usize - 1
    } else {
        0
    };
    stack[base] = state;
    let mut visited = 0;
    let mut i = start;
    while i < stop {
        visited += 1;
        // SAFETY: i < n; trie depths are in 1..=max_depth (the stack's length - 1), and
        // `stack` only holds states returned by this DFA, so every index is in bounds.
        let node = unsafe { *nodes.get_unchecked(i) };
        let d = node.depth as usize;
        let s = unsafe { dfa.next_unchecked(*stack.get_unchecked(d - 1), node.byte) };
        if s == DEAD {
            i = node.end as usize;
            continue;
        }
        unsafe { *stack.get_unchecked_mut(d) = s };
        match heavy.map(|ct| ct.heavy[i]) {
            Some(h) if h != u32::MAX => {
                let bm = &heavy.expect("checked").bitmaps[h as usize];
                for (o, &w) in out.iter_mut().zip(bm.iter()) {
                    *o |= w;
                }
            }
            _ => {
                let end = if i + 1 < n {
                    nodes[i + 1].tok_start
                } else {
                    ids.len() as u32
                };
                for &t in &ids[node.tok_start as usize..end as usize] {
                    out[t as usize / 32] |= 1 << (t % 32);
                }
            }
        }
        i += 1;
    }
    visited
}

/// Turn `out`, the mask of state `pair[1]`, into the mask of `pair[0]`: one preorder walk
/// that skips every subtree on which the two states agree (same class at the subtree's
/// remaining depth), clears subtrees only the reference allows and walks from scratch those
/// only `pair[0]` allows.
fn diff_walk(
    dfa: &TableDfa,
    lv: &StateLevels,
    pair: [u32; 2],
    (nodes, ids, below, max_depth): (&[TrieNode], &[u32], &[u16], usize),
    heavy: Option<&ClassTrie>,
    out: &mut [u32],
) {
    let mut sa = vec![0u32; max_depth + 1];
    let mut sb = vec![0u32; max_depth + 1];
    sa[0] = pair[0];
    sb[0] = pair[1];
    let n = nodes.len();
    let tok_at = |j: usize| {
        if j < n {
            nodes[j].tok_start as usize
        } else {
            ids.len()
        }
    };
    let mut i = 0;
    while i < n {
        let node = nodes[i];
        let d = node.depth as usize;
        let a = dfa.next(sa[d - 1], node.byte);
        let b = dfa.next(sb[d - 1], node.byte);
        let end = node.end as usize;
        if lv.same(below[i] as usize, a, b) {
            i = end;
            continue;
        }
        if a == DEAD {
            for &t in &ids[node.tok_start as usize..tok_at(end)] {
                out[t as usize / 32] &= !(1 << (t % 32));
            }
            i = end;
            continue;
        }
        if b == DEAD {
            walk_range(dfa, sa[d - 1], nodes, ids, i, end, max_depth, heavy, out);
            i = end;
            continue;
        }
        // Both alive: the tokens ending here are already set.
        sa[d] = a;
        sb[d] = b;
        i += 1;
    }
}
