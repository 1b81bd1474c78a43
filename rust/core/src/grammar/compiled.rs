//! A regex compiled against one vocabulary: the DFA, the shared trie, the mask cache.

use std::sync::Arc;

use std::sync::OnceLock;

use super::cache::MaskCache;
use super::class_trie::{byte_classes, ClassTrie};
use super::regex::{RegexLimits, TableDfa, DEAD};
use super::trie::TrieNode;
use super::vocab::Vocabulary;
use super::GrammarError;

/// Matcher state after EOS was accepted (no token may follow).
pub const TERMINATED: u32 = u32::MAX;

/// A byte-trie walk visiting more nodes than this triggers the class trie.
const CLASS_TRIE_AFTER: usize = 30_000;

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

    /// Fill `out` with the tokens viable from `state`: one walk of the merged class trie when
    /// this grammar has one, else of the byte trie (building the class trie once a byte walk
    /// turns out large).
    fn walk(&self, state: u32, out: &mut [u32]) {
        out.fill(0);
        if let Some(ct) = self.class_trie.get() {
            walk_nodes(
                &self.dfa,
                state,
                &ct.nodes,
                &ct.token_ids,
                ct.max_depth,
                Some(ct),
                out,
            );
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

    /// Precompute masks in state order (start state first) until `budget` has elapsed,
    /// in parallel: cheap grammars end up fully cached at compile time.
    pub fn precompute_within(&self, budget: std::time::Duration) {
        use rayon::prelude::*;
        let t0 = std::time::Instant::now();
        let words = self.vocab.words();
        (1..self.dfa.num_states()).into_par_iter().for_each_init(
            || vec![0u32; words],
            |buf, idx| {
                if t0.elapsed() < budget && self.cache.get(idx).is_none() {
                    self.fill_mask((idx * 256) as u32, buf);
                }
            },
        );
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
    let mut stack = vec![0u32; max_depth + 1];
    stack[0] = state;
    let n = nodes.len();
    let mut visited = 0;
    let mut i = 0;
    while i < n {
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
