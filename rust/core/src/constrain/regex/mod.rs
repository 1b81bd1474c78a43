//! Regular expressions as a [`Constraint`]: a regex compiled against one vocabulary into a
//! byte DFA, with the vocabulary's token trie, a per-state mask cache and the lazily built
//! helpers that keep large walks rare (a merged class trie, bounded state equivalence).

mod cache;
mod class_trie;
mod dfa;
mod equiv;
mod trie_walk;

use std::sync::{Arc, OnceLock};

pub use cache::MaskCache;
pub(crate) use dfa::escaped_literal;
pub use dfa::{RegexLimits, StateId, TableDfa, DEAD};

use class_trie::{byte_classes, ClassTrie};
use equiv::StateLevels;
use trie_walk::{diff_walk, first_byte_nodes, walk_nodes, TrieView};

use super::{Constraint, GrammarError, Vocabulary};

/// Matcher state after EOS was accepted (no token may follow).
pub const TERMINATED: StateId = StateId::TERMINATED;

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

impl Constraint for CompiledRegex {
    type State = StateId;
    const DEAD: StateId = StateId::DEAD;
    const TERMINATED: StateId = StateId::TERMINATED;

    fn vocab(&self) -> &Arc<Vocabulary> {
        &self.vocab
    }

    fn start(&self) -> StateId {
        self.dfa.start()
    }

    #[inline]
    fn step_bytes(&self, state: StateId, bytes: &[u8]) -> Result<StateId, GrammarError> {
        Ok(self.dfa.run(state, bytes))
    }

    #[inline]
    fn accepts_end(&self, state: StateId) -> bool {
        self.dfa.is_accepting(state)
    }

    fn fill_live_mask(&self, state: StateId, out: &mut [u32]) -> Result<(), GrammarError> {
        // (A DFA has no limit to run past once compiled.)
        self.fill_live(state, out);
        Ok(())
    }
}

impl CompiledRegex {
    /// [`Constraint::fill_live_mask`], which cannot fail here.
    fn fill_live(&self, state: StateId, out: &mut [u32]) {
        let idx = state.index();
        if let Some(m) = self.cache.get(idx) {
            out.copy_from_slice(m);
            return;
        }
        self.walk(state, out);
        if self.dfa.is_accepting(state) {
            super::set_eos(&self.vocab, out);
        }
        self.cache.offer(idx, out);
        if let Some(lv) = self.levels.get() {
            if self.cache.get(idx).is_some() {
                lv.note_cached(idx);
            }
        }
    }
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

    pub fn dfa(&self) -> &TableDfa {
        &self.dfa
    }

    pub fn pattern(&self) -> &str {
        &self.pattern
    }

    pub fn cache(&self) -> &MaskCache {
        &self.cache
    }

    /// Is `state`'s mask ready without a walk (cached, terminated or dead)?
    pub fn is_cheap(&self, state: StateId) -> bool {
        state == TERMINATED || state == DEAD || self.cache.get(state.index()).is_some()
    }

    fn classes(&self) -> &([u8; 256], usize) {
        self.classes.get_or_init(|| byte_classes(&self.dfa))
    }

    /// The merged class trie when this grammar has one, else the byte trie.
    fn trie_view(&self) -> TrieView<'_> {
        match self.class_trie.get() {
            Some(ct) => TrieView::classes(ct),
            None => TrieView::bytes(self.vocab.trie()),
        }
    }

    /// Fill `out` with the tokens viable from `state`: from a cached state's mask when one
    /// agrees with `state` on enough lookahead (descending only where they differ), else one
    /// walk of the merged class trie when this grammar has one, else of the byte trie
    /// (building the class trie and the state levels once a byte walk turns out large).
    fn walk(&self, state: StateId, out: &mut [u32]) {
        if let Some(lv) = self.levels.get() {
            let idx = state.index();
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
                        let pair = [state, StateId::from_index(t)];
                        diff_walk(&self.dfa, lv, pair, &self.trie_view(), out);
                    }
                    return;
                }
            }
        }
        out.fill(0);
        let view = self.trie_view();
        let visited = walk_nodes(&self.dfa, state, &view, out);
        if visited > LEVELS_AFTER {
            self.init_levels();
        }
        // Merging pays off when few classes remain; with many (literal-heavy grammars) the
        // merged trie stays large and its build would cost more than it saves.
        if view.heavy.is_none() && visited > CLASS_TRIE_AFTER && self.classes().1 <= MAX_CLASSES {
            self.use_class_trie();
        }
    }

    /// Build the state levels now (normally built after the first large walk).
    pub fn init_levels(&self) {
        self.levels.get_or_init(|| {
            let classes = self.classes();
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
        let classes = self.classes();
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
                self.fill_live(StateId::from_index(idx), &mut buf);
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
                    self.fill_live(StateId::from_index(idx), &mut buf);
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
        let est: Vec<usize> = (self.dfa.states().enumerate())
            .map(|(idx, s)| {
                (0..=255u8)
                    .filter(|&b| idx > 0 && self.dfa.next(s, b) != DEAD)
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
}
