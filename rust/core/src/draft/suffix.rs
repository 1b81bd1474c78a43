//! A suffix index over token sequences that proposes draft trees of continuations with
//! their empirical frequencies (prompt lookup and SuffixDecoding-style drafting, no model).
//!
//! # Structure
//!
//! For every context length `m` in `1..=max_match`, a hash map from each `m`-gram seen to
//! its occurrences (sequence, end position), in the order they entered the index. This is
//! simpler than a suffix tree and does what a drafter needs:
//!
//! - appending a token to a sequence adds `max_match` occurrences (one per `m`), so a request
//!   can extend its own sequence as it generates at O(`max_match`) map updates per token;
//! - an earlier output (a corpus sequence) is added the same way and removed by dropping its
//!   occurrences from the lists of its own `m`-grams (no rebuild);
//! - a proposal looks up the longest suffix of the context that occurred with at least one
//!   token after it, and reads the continuations straight from the stored sequences.
//!
//! Memory is O(total tokens x `max_match`) occurrences; a suffix tree would be O(total
//! tokens) but harder to update in place when a corpus sequence leaves.
//!
//! # Proposals
//!
//! The continuations (up to `max_depth` tokens after each occurrence) form a trie whose node
//! counts are how many occurrences continue with that path. A node's path probability is the
//! product of the conditional frequencies `child_count / parent_count` from the root, which
//! telescopes to `count / root_count`. The tree holds the `budget` trie prefixes of highest
//! path probability, chosen best-first with a heap in which a child enters only once its
//! parent is chosen (so the tree is prefix-closed) and emitted in pop order. Ties go to the
//! prefix that appeared first: trie nodes are numbered as they are created, walking the
//! occurrences in index order and each continuation from its first token, and the lower
//! number wins. Counts are integers, so the order is exact; a parent's count is at least its
//! child's and its number lower, so the selection equals sorting every trie prefix by
//! (count descending, number ascending) and keeping the first `budget`.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rustc_hash::FxHashMap;

use super::DraftError;
use crate::tree::build::check_token;
use crate::tree::{check_tree_size, BuiltTree, DraftTree, TreeError};

/// The id of a corpus sequence (an earlier output) in a [`SuffixIndex`].
pub type CorpusId = u64;

/// The request's own sequence (the prompt and what it generated so far).
const LIVE: u64 = 0;

/// One occurrence of an `m`-gram: it ends just before `tokens[end]` of sequence `seq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Occurrence {
    seq: u64,
    end: usize,
}

/// A suffix index over the request's own tokens and a corpus of earlier outputs.
#[derive(Debug, Clone)]
pub struct SuffixIndex {
    max_match: usize,
    /// Sequence id -> its tokens; [`LIVE`] is the request's own sequence.
    seqs: FxHashMap<u64, Vec<i64>>,
    next_id: u64,
    /// Every `m`-gram (`1 <= m <= max_match`) -> its occurrences, oldest first.
    grams: FxHashMap<Box<[i64]>, Vec<Occurrence>>,
}

/// A node of the continuation trie built for one proposal.
struct TrieNode {
    token: i64,
    depth: i32,
    count: u64,
    children: Vec<usize>,
}

impl SuffixIndex {
    /// An empty index matching context suffixes of up to `max_match` tokens.
    pub fn new(max_match: usize) -> Result<Self, DraftError> {
        if max_match == 0 {
            return Err(DraftError::MaxMatch(max_match));
        }
        let mut seqs = FxHashMap::default();
        seqs.insert(LIVE, Vec::new());
        Ok(SuffixIndex {
            max_match,
            seqs,
            next_id: LIVE + 1,
            grams: FxHashMap::default(),
        })
    }

    pub fn max_match(&self) -> usize {
        self.max_match
    }

    /// Tokens of the request's own sequence so far.
    pub fn len(&self) -> usize {
        self.seqs[&LIVE].len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of corpus sequences held.
    pub fn num_corpus(&self) -> usize {
        self.seqs.len() - 1
    }

    /// Append tokens to the request's own sequence (the prompt, then each step's accepted
    /// tokens). All are checked before any is added.
    pub fn extend(&mut self, tokens: &[i64]) -> Result<(), DraftError> {
        check_tokens(tokens, "extend")?;
        let live = self
            .seqs
            .get_mut(&LIVE)
            .expect("the live sequence is always present");
        let from = live.len();
        live.extend_from_slice(tokens);
        self.index_tail(LIVE, from);
        Ok(())
    }

    /// Add an earlier output to the corpus; returns its id for [`SuffixIndex::remove_corpus`].
    pub fn add_corpus(&mut self, tokens: &[i64]) -> Result<CorpusId, DraftError> {
        check_tokens(tokens, "add_corpus")?;
        let id = self.next_id;
        self.next_id += 1;
        self.seqs.insert(id, tokens.to_vec());
        self.index_tail(id, 0);
        Ok(id)
    }

    /// Drop a corpus sequence and its occurrences.
    pub fn remove_corpus(&mut self, id: CorpusId) -> Result<(), DraftError> {
        if id == LIVE {
            return Err(DraftError::UnknownCorpus(id));
        }
        let tokens = self.seqs.remove(&id).ok_or(DraftError::UnknownCorpus(id))?;
        for end in 1..=tokens.len() {
            for m in 1..=self.max_match.min(end) {
                let key = &tokens[end - m..end];
                if let Some(list) = self.grams.get_mut(key) {
                    list.retain(|o| o.seq != id);
                    if list.is_empty() {
                        self.grams.remove(key);
                    }
                }
            }
        }
        Ok(())
    }

    /// Index the `m`-grams of sequence `seq` that end after position `from`.
    fn index_tail(&mut self, seq: u64, from: usize) {
        let tokens = &self.seqs[&seq];
        for end in from + 1..=tokens.len() {
            for m in 1..=self.max_match.min(end) {
                let key = &tokens[end - m..end];
                let occ = Occurrence { seq, end };
                match self.grams.get_mut(key) {
                    Some(list) => list.push(occ),
                    None => {
                        self.grams.insert(key.into(), vec![occ]);
                    }
                }
            }
        }
    }

    /// The occurrences of the longest suffix of `context` (at most `max_match` tokens) that
    /// occurred with at least one token after it, oldest first; empty when none did.
    fn longest_match(&self, context: &[i64]) -> Vec<Occurrence> {
        for m in (1..=self.max_match.min(context.len())).rev() {
            let Some(list) = self.grams.get(&context[context.len() - m..]) else {
                continue;
            };
            let found: Vec<Occurrence> = list
                .iter()
                .copied()
                .filter(|o| self.seqs[&o.seq].len() > o.end)
                .collect();
            if !found.is_empty() {
                return found;
            }
        }
        Vec::new()
    }

    /// The draft tree of the `budget` most frequent continuations of `context` (at most
    /// `max_depth` tokens deep, each of path probability at least `min_prob`) under the root
    /// `context[-1]`; `logprobs` are log path probabilities. No match gives the root alone.
    pub fn propose(
        &self,
        context: &[i64],
        max_depth: usize,
        budget: i64,
        min_prob: f64,
    ) -> Result<BuiltTree, DraftError> {
        if budget < 1 {
            return Err(TreeError::Budget(budget).into());
        }
        if !(0.0..=1.0).contains(&min_prob) {
            return Err(DraftError::MinProb(min_prob));
        }
        check_tokens(context, "context")?;
        let &root_token = context.last().ok_or(DraftError::EmptyContext)?;
        let budget = usize::try_from(budget).unwrap_or(usize::MAX);

        let occurrences = if max_depth == 0 {
            Vec::new()
        } else {
            self.longest_match(context)
        };
        let trie = self.trie(&occurrences, max_depth);
        let total = occurrences.len() as f64;
        let kept = |count: u64| count as f64 >= min_prob * total;

        let n = budget.min(trie.len() - 1) + 1;
        check_tree_size(n)?;
        let mut tree = DraftTree::with_root(n, root_token, true);
        // (count, lower number first) -> (trie node, its parent's index in the tree).
        let mut heap: BinaryHeap<(u64, Reverse<usize>, usize)> = BinaryHeap::new();
        let push_children = |heap: &mut BinaryHeap<_>, node: usize, at: usize| {
            for &c in &trie[node].children {
                if kept(trie[c].count) {
                    heap.push((trie[c].count, Reverse(c), at));
                }
            }
        };
        push_children(&mut heap, 0, 0);
        while tree.len() < n {
            let Some((count, Reverse(node), parent)) = heap.pop() else {
                break;
            };
            let t = &trie[node];
            let logprob = (count as f64 / total).ln();
            tree.push(t.token, parent as i32, t.depth, logprob);
            push_children(&mut heap, node, tree.len() - 1);
        }
        Ok(BuiltTree::from_tree(tree))
    }

    /// The continuation trie of `occurrences`, `max_depth` tokens deep; node 0 is the root.
    fn trie(&self, occurrences: &[Occurrence], max_depth: usize) -> Vec<TrieNode> {
        let mut trie = vec![TrieNode {
            token: -1,
            depth: 0,
            count: occurrences.len() as u64,
            children: Vec::new(),
        }];
        for o in occurrences {
            let seq = &self.seqs[&o.seq];
            let mut node = 0;
            for &tok in seq[o.end..].iter().take(max_depth) {
                let found = trie[node]
                    .children
                    .iter()
                    .copied()
                    .find(|&c| trie[c].token == tok);
                node = match found {
                    Some(c) => c,
                    None => {
                        let c = trie.len();
                        let depth = trie[node].depth + 1;
                        trie.push(TrieNode {
                            token: tok,
                            depth,
                            count: 0,
                            children: Vec::new(),
                        });
                        trie[node].children.push(c);
                        c
                    }
                };
                trie[node].count += 1;
            }
        }
        trie
    }
}

fn check_tokens(tokens: &[i64], what: &str) -> Result<(), DraftError> {
    for (i, &t) in tokens.iter().enumerate() {
        check_token(t, || format!("{what}[{i}]"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The brute-force model: every sequence with the order in which its positions entered
    /// the index, each proposal recomputed from scratch.
    #[derive(Default)]
    struct Naive {
        seqs: Vec<(u64, Vec<i64>, bool)>,
        /// (sequence, end) in the order they were indexed.
        events: Vec<(u64, usize)>,
    }

    impl Naive {
        fn extend(&mut self, tokens: &[i64]) {
            if self.seqs.is_empty() {
                self.seqs.push((LIVE, Vec::new(), true));
            }
            let live = &mut self.seqs[0].1;
            for &t in tokens {
                live.push(t);
                self.events.push((LIVE, live.len()));
            }
        }

        fn add(&mut self, id: u64, tokens: &[i64]) {
            if self.seqs.is_empty() {
                self.seqs.push((LIVE, Vec::new(), true));
            }
            self.seqs.push((id, tokens.to_vec(), true));
            self.events.extend((1..=tokens.len()).map(|e| (id, e)));
        }

        fn remove(&mut self, id: u64) {
            self.seqs.iter_mut().find(|s| s.0 == id).unwrap().2 = false;
        }

        fn seq(&self, id: u64) -> Option<&Vec<i64>> {
            self.seqs.iter().find(|s| s.0 == id && s.2).map(|s| &s.1)
        }

        /// Every trie prefix (path, count) sorted by count descending, then first appearance.
        fn ranked(
            &self,
            context: &[i64],
            max_match: usize,
            depth: usize,
        ) -> (Vec<(Vec<i64>, u64)>, u64) {
            for m in (1..=max_match.min(context.len())).rev() {
                let suffix = &context[context.len() - m..];
                let conts: Vec<&[i64]> = self
                    .events
                    .iter()
                    .filter_map(|&(id, end)| {
                        let s = self.seq(id)?;
                        (end >= m && &s[end - m..end] == suffix && s.len() > end)
                            .then(|| &s[end..(end + depth).min(s.len())])
                    })
                    .collect();
                if conts.is_empty() || depth == 0 {
                    continue;
                }
                // (path, count, first occurrence, length)
                let mut paths: Vec<(Vec<i64>, u64, usize, usize)> = Vec::new();
                for (i, c) in conts.iter().enumerate() {
                    for l in 1..=c.len() {
                        match paths.iter_mut().find(|p| p.0 == c[..l]) {
                            Some(p) => p.1 += 1,
                            None => paths.push((c[..l].to_vec(), 1, i, l)),
                        }
                    }
                }
                paths.sort_by_key(|p| (Reverse(p.1), p.2, p.3));
                return (
                    paths.into_iter().map(|p| (p.0, p.1)).collect(),
                    conts.len() as u64,
                );
            }
            (Vec::new(), 0)
        }
    }

    /// The tree's drafted paths in node order, with their log-probs.
    fn paths(b: &BuiltTree) -> Vec<(Vec<i64>, f64)> {
        let t = &b.tree;
        let mut out: Vec<Vec<i64>> = vec![Vec::new()];
        for i in 1..t.len() {
            let mut p = out[t.parents[i] as usize].clone();
            p.push(t.tokens[i]);
            out.push(p);
        }
        out.into_iter()
            .zip(t.logprobs.iter().copied())
            .skip(1)
            .collect()
    }

    fn check_against_naive(
        idx: &SuffixIndex,
        naive: &Naive,
        context: &[i64],
        depth: usize,
        budget: usize,
        min_prob: f64,
    ) {
        let built = idx
            .propose(context, depth, budget as i64, min_prob)
            .unwrap();
        DraftTree::validate_structure(&built.tree.parents, &built.tree.depths).unwrap();
        assert_eq!(built.tree.tokens[0], *context.last().unwrap());
        let (ranked, total) = naive.ranked(context, idx.max_match(), depth);
        let want: Vec<(Vec<i64>, u64)> = ranked
            .into_iter()
            .filter(|p| p.1 as f64 >= min_prob * total as f64)
            .take(budget)
            .collect();
        let got = paths(&built);
        assert_eq!(got.len(), want.len(), "got {got:?}, want {want:?}");
        for ((gp, glp), (wp, wc)) in got.iter().zip(&want) {
            assert_eq!(gp, wp);
            assert!((glp - (*wc as f64 / total as f64).ln()).abs() < 1e-12);
            // Prefix-closed: every proper prefix is in the tree (parents precede children).
            assert!(gp.len() == 1 || got.iter().any(|(p, _)| p[..] == gp[..gp.len() - 1]));
        }
    }

    #[test]
    fn proposes_the_frequent_continuations() {
        let mut idx = SuffixIndex::new(3).unwrap();
        // "1 2 3" twice, "1 2 4" once, then the context ends in "1 2".
        idx.extend(&[1, 2, 3, 9, 1, 2, 3, 8, 1, 2, 4, 7, 1, 2])
            .unwrap();
        let b = idx.propose(&[1, 2], 2, 3, 0.0).unwrap();
        // "3" (2 of 3), then the once-seen "3 9", "3 8" and "4" in order of appearance.
        assert_eq!(b.tree.tokens, [2, 3, 9, 8]);
        assert_eq!(b.tree.parents, [-1, 0, 1, 1]);
        assert_eq!(b.tree.depths, [0, 1, 2, 2]);
        let lp: Vec<f64> = b.tree.logprobs.iter().map(|x| x.exp()).collect();
        assert!((lp[1] - 2.0 / 3.0).abs() < 1e-12 && (lp[2] - 1.0 / 3.0).abs() < 1e-12);
        // min_prob drops the once-seen paths.
        let b = idx.propose(&[1, 2], 2, 8, 0.5).unwrap();
        assert_eq!(b.tree.tokens, [2, 3]);
    }

    #[test]
    fn appending_updates_proposals() {
        let mut idx = SuffixIndex::new(2).unwrap();
        idx.extend(&[5, 6]).unwrap();
        assert_eq!(idx.propose(&[5, 6], 3, 4, 0.0).unwrap().tree.len(), 1);
        idx.extend(&[7, 5, 6]).unwrap();
        // "5 6" was followed by "7 5 6"; the newest "5 6" ends the sequence.
        assert_eq!(
            idx.propose(&[5, 6], 3, 4, 0.0).unwrap().tree.tokens,
            [6, 7, 5, 6]
        );
        idx.extend(&[8]).unwrap();
        let b = idx.propose(&[5, 6], 1, 4, 0.0).unwrap();
        assert_eq!(b.tree.tokens, [6, 7, 8]);
    }

    #[test]
    fn corpus_add_and_remove() {
        let mut idx = SuffixIndex::new(2).unwrap();
        idx.extend(&[1, 2]).unwrap();
        let a = idx.add_corpus(&[1, 2, 3, 4]).unwrap();
        assert_eq!(
            idx.propose(&[1, 2], 2, 4, 0.0).unwrap().tree.tokens,
            [2, 3, 4]
        );
        idx.remove_corpus(a).unwrap();
        assert_eq!(idx.propose(&[1, 2], 2, 4, 0.0).unwrap().tree.tokens, [2]);
        assert_eq!(idx.remove_corpus(a), Err(DraftError::UnknownCorpus(a)));
        assert_eq!(
            idx.remove_corpus(LIVE),
            Err(DraftError::UnknownCorpus(LIVE))
        );
        assert_eq!(idx.num_corpus(), 0);
    }

    #[test]
    fn empty_and_no_match_give_the_root() {
        let idx = SuffixIndex::new(4).unwrap();
        let b = idx.propose(&[3], 4, 4, 0.0).unwrap();
        assert_eq!(
            (b.tree.tokens.clone(), b.tree.parents.clone()),
            (vec![3], vec![-1])
        );
        let mut idx = SuffixIndex::new(4).unwrap();
        idx.extend(&[1, 2, 3]).unwrap();
        assert_eq!(idx.propose(&[9], 4, 4, 0.0).unwrap().tree.len(), 1);
        assert_eq!(idx.propose(&[1], 0, 4, 0.0).unwrap().tree.len(), 1);
    }

    #[test]
    fn bad_input_is_refused() {
        assert_eq!(SuffixIndex::new(0).unwrap_err(), DraftError::MaxMatch(0));
        let mut idx = SuffixIndex::new(2).unwrap();
        assert_eq!(
            idx.propose(&[1], 2, 0, 0.0).unwrap_err(),
            DraftError::Tree(TreeError::Budget(0))
        );
        assert!(matches!(
            idx.propose(&[1, -1], 2, 1, 0.0),
            Err(DraftError::Tree(TreeError::TokenOutOfRange {
                token: -1,
                ..
            }))
        ));
        assert_eq!(
            idx.propose(&[], 2, 1, 0.0).unwrap_err(),
            DraftError::EmptyContext
        );
        assert!(matches!(
            idx.propose(&[1], 2, 1, f64::NAN),
            Err(DraftError::MinProb(_))
        ));
        assert!(matches!(
            idx.propose(&[1], 2, 1, 1.5),
            Err(DraftError::MinProb(_))
        ));
        // A refused extend or add changes nothing.
        assert!(idx.extend(&[1, 2, -3]).is_err());
        assert!(idx.add_corpus(&[1 << 40]).is_err());
        assert!(idx.is_empty() && idx.num_corpus() == 0);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Extend(Vec<i64>),
        Add(Vec<i64>),
        Remove(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        let toks = || prop::collection::vec(0i64..3, 0..8);
        prop_oneof![
            3 => toks().prop_map(Op::Extend),
            2 => toks().prop_map(Op::Add),
            1 => (0usize..4).prop_map(Op::Remove),
        ]
    }

    proptest! {
        #[test]
        fn selection_equals_brute_force(
            ops in prop::collection::vec(op(), 1..8),
            context in prop::collection::vec(0i64..3, 1..5),
            max_match in 1usize..4,
            depth in 0usize..5,
            budget in 1usize..12,
            min_prob in prop_oneof![Just(0.0), 0.0f64..=1.0],
        ) {
            let mut idx = SuffixIndex::new(max_match).unwrap();
            let mut naive = Naive::default();
            let mut ids = Vec::new();
            for op in &ops {
                match op {
                    Op::Extend(t) => {
                        idx.extend(t).unwrap();
                        naive.extend(t);
                    }
                    Op::Add(t) => {
                        let id = idx.add_corpus(t).unwrap();
                        naive.add(id, t);
                        ids.push(id);
                    }
                    Op::Remove(i) => {
                        if let Some(&id) = ids.get(*i) {
                            let first = naive.seq(id).is_some();
                            prop_assert_eq!(idx.remove_corpus(id).is_ok(), first);
                            if first {
                                naive.remove(id);
                            }
                        }
                    }
                }
                check_against_naive(&idx, &naive, &context, depth, budget, min_prob);
            }
        }
    }
}
