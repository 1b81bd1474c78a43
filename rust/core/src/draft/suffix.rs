//! A suffix index over token sequences that proposes draft trees of continuations with
//! their empirical frequencies (prompt lookup and SuffixDecoding-style drafting, no model).
//!
//! # Structure
//!
//! Two indexes take part in a proposal: the request's own [`SuffixIndex`] (its prompt and
//! what it generated so far) and, optionally, one partition of a shared
//! [`SuffixCorpus`](super::SuffixCorpus) (earlier outputs under the request's cache salt).
//! Both are [`Grams`]: for every context length `m` in `1..=max_match`, a hash map from each
//! `m`-gram seen to its occurrences (sequence, end position), in the order they entered the
//! index. This is simpler than a suffix tree and does what a drafter needs:
//!
//! - appending a token to a sequence adds `max_match` occurrences (one per `m`), so a request
//!   extends its own index as it generates at O(`max_match`) map updates per token, and a
//!   corpus sequence is added the same way, touching nothing else;
//! - a corpus sequence leaves by marking its occurrences dead; a list is compacted once more
//!   than half of it is dead, so removal is amortised O(`max_match`) per token;
//! - a proposal looks up the longest suffix of the context that occurred with at least one
//!   token after it, in either index, and reads the continuations from the stored sequences.
//!
//! Memory is O(total tokens x `max_match`) occurrences; a suffix tree would be O(total
//! tokens) but harder to update in place when a corpus sequence leaves.
//!
//! # Proposals
//!
//! The occurrences of the longest matching suffix are pooled: the corpus partition's first
//! (in the order its sequences were added), then the request's own. Their continuations (up
//! to `max_depth` tokens after each occurrence) form a trie whose node counts are how many
//! occurrences continue with that path. A node's path probability is the product of the
//! conditional frequencies `child_count / parent_count` from the root, which telescopes to
//! `count / root_count`. The tree holds the `budget` trie prefixes of highest path
//! probability, chosen best-first with a heap in which a child enters only once its parent
//! is chosen (so the tree is prefix-closed) and emitted in pop order. Ties go to the prefix
//! that appeared first: trie nodes are numbered as they are created, walking the
//! occurrences in pooled order and each continuation from its first token, and the lower
//! number wins. Counts are integers, so the order is exact; a parent's count is at least its
//! child's and its number lower, so the selection equals sorting every trie prefix by
//! (count descending, number ascending) and keeping the first `budget`.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rustc_hash::FxHashMap;

use super::corpus::CorpusPart;
use super::DraftError;
use crate::tree::build::check_token;
use crate::tree::{check_tree_size, BuiltTree, DraftTree, TreeError};

/// The id of a corpus sequence (an earlier output) in a [`SuffixCorpus`](super::SuffixCorpus).
pub type CorpusId = u64;

/// One occurrence of an `m`-gram: it ends just before `tokens[end]` of sequence `seq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Occurrence {
    pub seq: u64,
    pub end: usize,
}

/// The occurrences of one gram, oldest first, and how many of them belong to sequences that
/// have left the index (skipped by lookups until the list is compacted).
#[derive(Debug, Clone, Default)]
struct OccList {
    occ: Vec<Occurrence>,
    dead: usize,
}

/// Every `m`-gram (`1 <= m <= max_match`) of a set of sequences -> its occurrences.
#[derive(Debug, Clone, Default)]
pub(super) struct Grams {
    map: FxHashMap<Box<[i64]>, OccList>,
}

/// `(end, m)` for every gram of `tokens` ending after position `from`.
fn gram_ends(len: usize, from: usize, max_match: usize) -> impl Iterator<Item = (usize, usize)> {
    (from + 1..=len).flat_map(move |end| (1..=max_match.min(end)).map(move |m| (end, m)))
}

impl Grams {
    /// Index the grams of sequence `seq` (its tokens `tokens`) that end after position `from`.
    pub fn insert(&mut self, seq: u64, tokens: &[i64], from: usize, max_match: usize) {
        for (end, m) in gram_ends(tokens.len(), from, max_match) {
            let key = &tokens[end - m..end];
            let occ = Occurrence { seq, end };
            match self.map.get_mut(key) {
                Some(list) => list.occ.push(occ),
                None => {
                    let list = OccList {
                        occ: vec![occ],
                        dead: 0,
                    };
                    self.map.insert(key.into(), list);
                }
            }
        }
    }

    /// Mark the occurrences of a sequence that left (its tokens were `tokens`) dead and
    /// compact the lists more than half dead; `alive` tells the sequences still indexed.
    pub fn remove(&mut self, tokens: &[i64], max_match: usize, alive: impl Fn(u64) -> bool) {
        // Every (end, m) is one occurrence of the sequence in the list of its gram. Counting first
        // and compacting after keeps the counts exact: a list compacted early would lose
        // occurrences of the sequence that a later (end, m) still counts.
        for (end, m) in gram_ends(tokens.len(), 0, max_match) {
            if let Some(list) = self.map.get_mut(&tokens[end - m..end]) {
                list.dead += 1;
            }
        }
        for (end, m) in gram_ends(tokens.len(), 0, max_match) {
            let key = &tokens[end - m..end];
            let Some(list) = self.map.get_mut(key) else {
                continue;
            };
            if 2 * list.dead > list.occ.len() {
                list.occ.retain(|o| alive(o.seq));
                list.dead = 0;
                if list.occ.is_empty() {
                    self.map.remove(key);
                }
            }
        }
    }

    /// The occurrences of `gram`, oldest first (dead ones included).
    pub fn get(&self, gram: &[i64]) -> &[Occurrence] {
        self.map.get(gram).map_or(&[], |l| &l.occ)
    }

    #[cfg(test)]
    pub fn num_lists(&self) -> usize {
        self.map.len()
    }
}

/// The request's own sequence id in its [`Grams`].
const LIVE: u64 = 0;

/// The suffix index of one request's own tokens (its prompt, then each step's accepted
/// tokens), which it extends as it generates.
#[derive(Debug, Clone)]
pub struct SuffixIndex {
    max_match: usize,
    tokens: Vec<i64>,
    grams: Grams,
}

/// A proposed tree and the corpus sequences whose occurrences it was drafted from (ascending
/// id), for the caller to mark as used ([`SuffixCorpus::touch`](super::SuffixCorpus::touch)).
#[derive(Debug, Clone)]
pub struct Proposal {
    pub built: BuiltTree,
    pub matched: Vec<CorpusId>,
}

/// How short a match a proposal accepts and how deep it drafts from it: a suffix of at least
/// `min_match` tokens must have occurred, and with `depth_factor` the tree is at most
/// `floor(depth_factor x matched length)` tokens deep (at least 1). A short match is weak
/// evidence however often it occurred: one token seen before predicts little of what
/// follows, eight tokens seen before mostly do (suffix decoding's `max_spec_factor`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MatchLimits {
    pub min_match: usize,
    pub depth_factor: Option<f64>,
}

impl Default for MatchLimits {
    fn default() -> Self {
        MatchLimits {
            min_match: 1,
            depth_factor: None,
        }
    }
}

impl MatchLimits {
    fn check(&self) -> Result<(), DraftError> {
        if self.min_match == 0 {
            return Err(DraftError::MinMatch(self.min_match));
        }
        match self.depth_factor {
            Some(f) if !(f.is_finite() && f > 0.0) => Err(DraftError::DepthFactor(f)),
            _ => Ok(()),
        }
    }

    /// The depth drafted after a match of `matched` tokens, within `max_depth`.
    fn depth(&self, matched: usize, max_depth: usize) -> usize {
        match self.depth_factor {
            None => max_depth,
            Some(f) => ((f * matched as f64).floor() as usize).clamp(1, max_depth.max(1)),
        }
    }
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
        Ok(SuffixIndex {
            max_match,
            tokens: Vec::new(),
            grams: Grams::default(),
        })
    }

    pub fn max_match(&self) -> usize {
        self.max_match
    }

    /// Tokens of the request's own sequence so far.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    pub fn tokens(&self) -> &[i64] {
        &self.tokens
    }

    /// Append tokens to the request's own sequence (the prompt, then each step's accepted
    /// tokens). All are checked before any is added.
    pub fn extend(&mut self, tokens: &[i64]) -> Result<(), DraftError> {
        check_tokens(tokens, "extend")?;
        let from = self.tokens.len();
        self.tokens.extend_from_slice(tokens);
        self.grams.insert(LIVE, &self.tokens, from, self.max_match);
        Ok(())
    }

    /// The draft tree of the `budget` most frequent continuations of `context` (at most
    /// `max_depth` tokens deep, each of path probability at least `min_prob`) under the root
    /// `context[-1]`, pooled over this index and `corpus` (a salt's partition of a shared
    /// corpus, built with the same `max_match`); `logprobs` are log path probabilities. No
    /// match gives the root alone. Only the last `max_match` tokens of `context` are read.
    pub fn propose(
        &self,
        context: &[i64],
        corpus: Option<CorpusPart<'_>>,
        max_depth: usize,
        budget: i64,
        min_prob: f64,
    ) -> Result<Proposal, DraftError> {
        self.propose_limited(
            context,
            corpus,
            max_depth,
            budget,
            min_prob,
            MatchLimits::default(),
        )
    }

    /// [`propose`](Self::propose) with [`MatchLimits`]: no match shorter than
    /// `limits.min_match` counts, and the tree's depth follows the matched length.
    pub fn propose_limited(
        &self,
        context: &[i64],
        corpus: Option<CorpusPart<'_>>,
        max_depth: usize,
        budget: i64,
        min_prob: f64,
        limits: MatchLimits,
    ) -> Result<Proposal, DraftError> {
        limits.check()?;
        if budget < 1 {
            return Err(TreeError::Budget(budget).into());
        }
        if !(0.0..=1.0).contains(&min_prob) {
            return Err(DraftError::MinProb(min_prob));
        }
        if let Some(c) = &corpus {
            if c.max_match() != self.max_match {
                return Err(DraftError::MaxMatchMismatch {
                    index: self.max_match,
                    corpus: c.max_match(),
                });
            }
        }
        check_tokens(context, "context")?;
        let &root_token = context.last().ok_or(DraftError::EmptyContext)?;
        let budget = usize::try_from(budget).unwrap_or(usize::MAX);

        let (continuations, matched) = if max_depth == 0 {
            (Vec::new(), Vec::new())
        } else {
            self.longest_match(context, corpus.as_ref(), max_depth, limits)
        };
        let trie = trie(&continuations);
        let total = continuations.len() as f64;
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
        Ok(Proposal {
            built: BuiltTree::from_tree(tree),
            matched,
        })
    }

    /// The continuations (at most `limits.depth(m, max_depth)` tokens) of every occurrence
    /// of the longest suffix of `context` (`m` tokens: at most `max_match`, at least
    /// `limits.min_match`) that occurred with at least one token after it, the corpus's
    /// first, and the corpus sequences they came from; empty when no suffix did.
    fn longest_match<'a>(
        &'a self,
        context: &[i64],
        corpus: Option<&CorpusPart<'a>>,
        max_depth: usize,
        limits: MatchLimits,
    ) -> (Vec<&'a [i64]>, Vec<CorpusId>) {
        for m in (limits.min_match..=self.max_match.min(context.len())).rev() {
            let depth = limits.depth(m, max_depth);
            let cont = |s: &'a [i64], end: usize| &s[end..(end + depth).min(s.len())];
            let gram = &context[context.len() - m..];
            let mut found = Vec::new();
            let mut matched: Vec<CorpusId> = Vec::new();
            if let Some(c) = corpus {
                for (id, seq, end) in c.occurrences(gram) {
                    if seq.len() > end {
                        found.push(cont(seq, end));
                        // Occurrences come by ascending sequence id: duplicates are adjacent.
                        if matched.last() != Some(&id) {
                            matched.push(id);
                        }
                    }
                }
            }
            let own = self.grams.get(gram).iter();
            found.extend(
                own.filter(|o| self.tokens.len() > o.end)
                    .map(|o| cont(&self.tokens, o.end)),
            );
            if !found.is_empty() {
                return (found, matched);
            }
        }
        (Vec::new(), Vec::new())
    }
}

/// The continuation trie of `continuations`; node 0 is the root.
fn trie(continuations: &[&[i64]]) -> Vec<TrieNode> {
    let mut trie = vec![TrieNode {
        token: -1,
        depth: 0,
        count: continuations.len() as u64,
        children: Vec::new(),
    }];
    for cont in continuations {
        let mut node = 0;
        for &tok in cont.iter() {
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

pub(super) fn check_tokens(tokens: &[i64], what: &str) -> Result<(), DraftError> {
    for (i, &t) in tokens.iter().enumerate() {
        check_token(t, || format!("{what}[{i}]"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::SuffixCorpus;
    use super::*;
    use proptest::prelude::*;

    /// The brute-force model: the request's own tokens and the corpus sequences with their
    /// salts and order of use, each proposal recomputed from scratch.
    struct Naive {
        live: Vec<i64>,
        max_tokens: usize,
        /// (id, salt, tokens) of the held corpus sequences, in the order they were added.
        corpus: Vec<(u64, Option<Vec<u8>>, Vec<i64>)>,
        /// Held ids, least recently used first.
        lru: Vec<u64>,
        next_id: u64,
    }

    impl Naive {
        fn new(max_tokens: usize) -> Self {
            Naive {
                live: Vec::new(),
                max_tokens,
                corpus: Vec::new(),
                lru: Vec::new(),
                next_id: 0,
            }
        }

        fn extend(&mut self, tokens: &[i64]) {
            self.live.extend_from_slice(tokens);
        }

        fn num_tokens(&self) -> usize {
            self.corpus.iter().map(|c| c.2.len()).sum()
        }

        /// Add a corpus sequence, evicting the least recently used until it fits; `None`
        /// when it is longer than the whole bound.
        fn add(&mut self, salt: Option<&[u8]>, tokens: &[i64]) -> Option<u64> {
            if tokens.len() > self.max_tokens {
                return None;
            }
            while self.num_tokens() + tokens.len() > self.max_tokens {
                let oldest = self.lru[0];
                self.remove(oldest);
            }
            let id = self.next_id;
            self.next_id += 1;
            self.corpus
                .push((id, salt.map(<[u8]>::to_vec), tokens.to_vec()));
            self.lru.push(id);
            Some(id)
        }

        fn remove(&mut self, id: u64) -> bool {
            let held = self.lru.contains(&id);
            self.corpus.retain(|c| c.0 != id);
            self.lru.retain(|&i| i != id);
            held
        }

        fn touch(&mut self, ids: &[u64]) {
            for id in ids {
                if self.lru.contains(id) {
                    self.lru.retain(|i| i != id);
                    self.lru.push(*id);
                }
            }
        }

        /// Every trie prefix (path, count) sorted by count descending, then first appearance,
        /// the number of occurrences, and the corpus sequences they came from. `salt`: the
        /// corpus partition pooled with the request's own tokens (`None`: no corpus).
        #[allow(clippy::type_complexity)]
        fn ranked(
            &self,
            context: &[i64],
            salt: Option<Option<&[u8]>>,
            max_match: usize,
            depth: usize,
        ) -> (Vec<(Vec<i64>, u64)>, u64, Vec<u64>) {
            // The corpus sequences of the salt in the order added, then the request's own.
            let mut seqs: Vec<(Option<u64>, &[i64])> = match salt {
                None => Vec::new(),
                Some(s) => self
                    .corpus
                    .iter()
                    .filter(|c| c.1.as_deref() == s)
                    .map(|c| (Some(c.0), &c.2[..]))
                    .collect(),
            };
            seqs.push((None, &self.live));
            for m in (1..=max_match.min(context.len())).rev() {
                let suffix = &context[context.len() - m..];
                let mut matched = Vec::new();
                let mut conts: Vec<&[i64]> = Vec::new();
                for &(id, s) in &seqs {
                    for end in m..s.len() {
                        if &s[end - m..end] == suffix {
                            conts.push(&s[end..(end + depth).min(s.len())]);
                            if let Some(id) = id.filter(|id| !matched.contains(id)) {
                                matched.push(id);
                            }
                        }
                    }
                }
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
                    matched,
                );
            }
            (Vec::new(), 0, Vec::new())
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

    /// One proposal of the index (pooled with `corpus`'s partition of `salt` when given)
    /// against the model's; both then mark the matched sequences used.
    #[allow(clippy::too_many_arguments)]
    fn check_against_naive(
        idx: &SuffixIndex,
        corpus: &mut SuffixCorpus,
        naive: &mut Naive,
        context: &[i64],
        salt: Option<Option<&[u8]>>,
        depth: usize,
        budget: usize,
        min_prob: f64,
    ) {
        let part = salt.map(|s| corpus.part(s));
        let p = idx
            .propose(context, part, depth, budget as i64, min_prob)
            .unwrap();
        let built = &p.built;
        DraftTree::validate_structure(&built.tree.parents, &built.tree.depths).unwrap();
        assert_eq!(built.tree.tokens[0], *context.last().unwrap());
        let (ranked, total, matched) = naive.ranked(context, salt, idx.max_match(), depth);
        assert_eq!(p.matched, matched);
        let want: Vec<(Vec<i64>, u64)> = ranked
            .into_iter()
            .filter(|p| p.1 as f64 >= min_prob * total as f64)
            .take(budget)
            .collect();
        let got = paths(built);
        assert_eq!(got.len(), want.len(), "got {got:?}, want {want:?}");
        for ((gp, glp), (wp, wc)) in got.iter().zip(&want) {
            assert_eq!(gp, wp);
            assert!((glp - (*wc as f64 / total as f64).ln()).abs() < 1e-12);
            // Prefix-closed: every proper prefix is in the tree (parents precede children).
            assert!(gp.len() == 1 || got.iter().any(|(p, _)| p[..] == gp[..gp.len() - 1]));
        }
        corpus.touch(&p.matched);
        naive.touch(&matched);
    }

    fn tokens_of(p: &Proposal) -> Vec<i64> {
        p.built.tree.tokens.clone()
    }

    #[test]
    fn proposes_the_frequent_continuations() {
        let mut idx = SuffixIndex::new(3).unwrap();
        // "1 2 3" twice, "1 2 4" once, then the context ends in "1 2".
        idx.extend(&[1, 2, 3, 9, 1, 2, 3, 8, 1, 2, 4, 7, 1, 2])
            .unwrap();
        let b = idx.propose(&[1, 2], None, 2, 3, 0.0).unwrap().built;
        // "3" (2 of 3), then the once-seen "3 9", "3 8" and "4" in order of appearance.
        assert_eq!(b.tree.tokens, [2, 3, 9, 8]);
        assert_eq!(b.tree.parents, [-1, 0, 1, 1]);
        assert_eq!(b.tree.depths, [0, 1, 2, 2]);
        let lp: Vec<f64> = b.tree.logprobs.iter().map(|x| x.exp()).collect();
        assert!((lp[1] - 2.0 / 3.0).abs() < 1e-12 && (lp[2] - 1.0 / 3.0).abs() < 1e-12);
        // min_prob drops the once-seen paths.
        let b = idx.propose(&[1, 2], None, 2, 8, 0.5).unwrap();
        assert_eq!(tokens_of(&b), [2, 3]);
    }

    #[test]
    fn appending_updates_proposals() {
        let mut idx = SuffixIndex::new(2).unwrap();
        idx.extend(&[5, 6]).unwrap();
        assert_eq!(
            idx.propose(&[5, 6], None, 3, 4, 0.0)
                .unwrap()
                .built
                .tree
                .len(),
            1
        );
        idx.extend(&[7, 5, 6]).unwrap();
        // "5 6" was followed by "7 5 6"; the newest "5 6" ends the sequence.
        let p = idx.propose(&[5, 6], None, 3, 4, 0.0).unwrap();
        assert_eq!(tokens_of(&p), [6, 7, 5, 6]);
        idx.extend(&[8]).unwrap();
        assert_eq!(
            tokens_of(&idx.propose(&[5, 6], None, 1, 4, 0.0).unwrap()),
            [6, 7, 8]
        );
        assert_eq!(idx.tokens(), [5, 6, 7, 5, 6, 8]);
    }

    #[test]
    fn corpus_add_remove_and_salts() {
        let mut idx = SuffixIndex::new(2).unwrap();
        idx.extend(&[1, 2]).unwrap();
        let mut corpus = SuffixCorpus::new(2, 100).unwrap();
        let a = corpus.add(Some(b"a"), &[1, 2, 3, 4]).unwrap();
        let p = idx
            .propose(&[1, 2], Some(corpus.part(Some(b"a"))), 2, 4, 0.0)
            .unwrap();
        assert_eq!((tokens_of(&p), p.matched), (vec![2, 3, 4], vec![a]));
        // Another salt, no salt, or no corpus: the root alone.
        for part in [Some(corpus.part(Some(b"b"))), Some(corpus.part(None)), None] {
            let p = idx.propose(&[1, 2], part, 2, 4, 0.0).unwrap();
            assert_eq!((tokens_of(&p), p.matched.len()), (vec![2], 0));
        }
        assert_eq!((corpus.num_partitions(), corpus.num_tokens()), (1, 4));
        corpus.remove(a).unwrap();
        let p = idx
            .propose(&[1, 2], Some(corpus.part(Some(b"a"))), 2, 4, 0.0)
            .unwrap();
        assert_eq!(tokens_of(&p), [2]);
        assert_eq!(corpus.remove(a), Err(DraftError::UnknownCorpus(a)));
        assert!(corpus.is_empty() && corpus.num_partitions() == 0 && corpus.num_lists() == 0);
    }

    #[test]
    fn the_corpus_evicts_the_least_recently_used() {
        let idx = SuffixIndex::new(1).unwrap();
        let mut corpus = SuffixCorpus::new(1, 6).unwrap();
        let a = corpus.add(None, &[1, 10]).unwrap();
        let b = corpus.add(None, &[2, 20]).unwrap();
        let c = corpus.add(None, &[3, 30]).unwrap();
        // A proposal drafts from `a`: `b` is now the least recently used.
        let p = idx
            .propose(&[1], Some(corpus.part(None)), 1, 1, 0.0)
            .unwrap();
        assert_eq!(p.matched, [a]);
        corpus.touch(&p.matched);
        assert_eq!(corpus.ids_by_use(), [b, c, a]);
        let d = corpus.add(None, &[4, 40, 41]).unwrap(); // 3 tokens: `b` and `c` leave
        assert_eq!(corpus.ids_by_use(), [a, d]);
        assert_eq!(corpus.num_tokens(), 5);
        corpus.touch(&[b, a]); // `b` left: skipped
        assert_eq!(corpus.ids_by_use(), [d, a]);
        assert_eq!(
            corpus.add(None, &[0; 7]),
            Err(DraftError::CorpusTooLong { len: 7, max: 6 })
        );
        assert_eq!(corpus.len(), 2);
    }

    #[test]
    fn empty_and_no_match_give_the_root() {
        let idx = SuffixIndex::new(4).unwrap();
        let b = idx.propose(&[3], None, 4, 4, 0.0).unwrap().built;
        assert_eq!(
            (b.tree.tokens.clone(), b.tree.parents.clone()),
            (vec![3], vec![-1])
        );
        let mut idx = SuffixIndex::new(4).unwrap();
        idx.extend(&[1, 2, 3]).unwrap();
        assert_eq!(
            idx.propose(&[9], None, 4, 4, 0.0).unwrap().built.tree.len(),
            1
        );
        assert_eq!(
            idx.propose(&[1], None, 0, 4, 0.0).unwrap().built.tree.len(),
            1
        );
    }

    #[test]
    fn match_limits_bound_the_match_and_the_depth() {
        let mut idx = SuffixIndex::new(4).unwrap();
        // "3 4" recurs followed by "5 6 7 8"; "9 3" and "1 2 3 4" occur once each.
        idx.extend(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 3, 4, 5, 6, 7, 8, 0])
            .unwrap();
        let limited = |ctx: &[i64], min_match: usize, depth_factor: Option<f64>| {
            let limits = MatchLimits {
                min_match,
                depth_factor,
            };
            tokens_of(&idx.propose_limited(ctx, None, 8, 16, 0.0, limits).unwrap())
        };
        // Context "... 0 3 4": the longest match is "3 4" (2 tokens, twice): "5 6 7 8" then
        // "9 3 4 5" (first seen) and "0".
        let all = [4, 5, 6, 7, 8, 9, 3, 4, 5, 0];
        assert_eq!(limited(&[0, 3, 4], 1, None), all);
        assert_eq!(limited(&[0, 3, 4], 2, None), all);
        // No 3-token match: the root alone.
        assert_eq!(limited(&[0, 3, 4], 3, None), [4]);
        // depth_factor 1.5: floor(1.5 x 2) = 3 tokens deep; 0.1: still 1.
        assert_eq!(limited(&[0, 3, 4], 1, Some(1.5)), [4, 5, 6, 7]);
        assert_eq!(limited(&[0, 3, 4], 1, Some(0.1)), [4, 5]);
        // A 4-token match "1 2 3 4" drafts 8 deep at factor 2.
        assert_eq!(
            limited(&[1, 2, 3, 4], 4, Some(2.0)),
            [4, 5, 6, 7, 8, 9, 3, 4, 5]
        );
        // The defaults are propose's.
        assert_eq!(
            limited(&[0, 3, 4], 1, None),
            tokens_of(&idx.propose(&[0, 3, 4], None, 8, 16, 0.0).unwrap())
        );
        for (min_match, factor, err) in [
            (0, None, DraftError::MinMatch(0)),
            (1, Some(0.0), DraftError::DepthFactor(0.0)),
            (
                1,
                Some(f64::INFINITY),
                DraftError::DepthFactor(f64::INFINITY),
            ),
        ] {
            let limits = MatchLimits {
                min_match,
                depth_factor: factor,
            };
            assert_eq!(
                idx.propose_limited(&[3, 4], None, 8, 4, 0.0, limits)
                    .unwrap_err(),
                err
            );
        }
    }

    #[test]
    fn bad_input_is_refused() {
        assert_eq!(SuffixIndex::new(0).unwrap_err(), DraftError::MaxMatch(0));
        assert_eq!(
            SuffixCorpus::new(0, 9).unwrap_err(),
            DraftError::MaxMatch(0)
        );
        let mut idx = SuffixIndex::new(2).unwrap();
        let mut corpus = SuffixCorpus::new(3, 9).unwrap();
        assert_eq!(
            idx.propose(&[1], None, 2, 0, 0.0).unwrap_err(),
            DraftError::Tree(TreeError::Budget(0))
        );
        assert!(matches!(
            idx.propose(&[1, -1], None, 2, 1, 0.0),
            Err(DraftError::Tree(TreeError::TokenOutOfRange {
                token: -1,
                ..
            }))
        ));
        assert_eq!(
            idx.propose(&[], None, 2, 1, 0.0).unwrap_err(),
            DraftError::EmptyContext
        );
        assert!(matches!(
            idx.propose(&[1], None, 2, 1, f64::NAN),
            Err(DraftError::MinProb(_))
        ));
        assert!(matches!(
            idx.propose(&[1], None, 2, 1, 1.5),
            Err(DraftError::MinProb(_))
        ));
        assert_eq!(
            idx.propose(&[1], Some(corpus.part(None)), 2, 1, 0.0)
                .unwrap_err(),
            DraftError::MaxMatchMismatch {
                index: 2,
                corpus: 3
            }
        );
        // A refused extend or add changes nothing.
        assert!(idx.extend(&[1, 2, -3]).is_err());
        assert!(corpus.add(None, &[1 << 40]).is_err());
        assert_eq!(corpus.remove(0), Err(DraftError::UnknownCorpus(0)));
        assert!(idx.is_empty() && corpus.is_empty() && corpus.num_lists() == 0);
    }

    /// `None`, the empty salt and a salt: three distinct partitions.
    const SALTS: [Option<&[u8]>; 3] = [None, Some(b""), Some(b"a")];

    #[derive(Debug, Clone)]
    enum Op {
        Extend(Vec<i64>),
        Add(usize, Vec<i64>),
        Remove(usize),
        /// A proposal for this context under `SALTS[i]`, or with no corpus for 3.
        Propose(Vec<i64>, usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        let toks = || prop::collection::vec(0i64..3, 0..8);
        prop_oneof![
            3 => toks().prop_map(Op::Extend),
            3 => (0usize..3, toks()).prop_map(|(s, t)| Op::Add(s, t)),
            1 => (0usize..6).prop_map(Op::Remove),
            3 => (prop::collection::vec(0i64..3, 1..5), 0usize..4)
                .prop_map(|(c, s)| Op::Propose(c, s)),
        ]
    }

    proptest! {
        #[test]
        fn selection_equals_brute_force(
            ops in prop::collection::vec(op(), 1..14),
            max_match in 1usize..4,
            max_tokens in 0usize..24,
            depth in 0usize..5,
            budget in 1usize..12,
            min_prob in prop_oneof![Just(0.0), 0.0f64..=1.0],
        ) {
            let mut idx = SuffixIndex::new(max_match).unwrap();
            let mut corpus = SuffixCorpus::new(max_match, max_tokens).unwrap();
            let mut naive = Naive::new(max_tokens);
            let mut ids = Vec::new();
            for op in &ops {
                match op {
                    Op::Extend(t) => {
                        idx.extend(t).unwrap();
                        naive.extend(t);
                    }
                    Op::Add(s, t) => {
                        let got = corpus.add(SALTS[*s], t).ok();
                        prop_assert_eq!(got, naive.add(SALTS[*s], t));
                        ids.extend(got);
                    }
                    Op::Remove(i) => {
                        if let Some(&id) = ids.get(*i) {
                            prop_assert_eq!(corpus.remove(id).is_ok(), naive.remove(id));
                        }
                    }
                    Op::Propose(context, s) => {
                        let salt = SALTS.get(*s).copied();
                        check_against_naive(
                            &idx, &mut corpus, &mut naive, context, salt, depth, budget, min_prob,
                        );
                    }
                }
                prop_assert_eq!(corpus.ids_by_use(), naive.lru.clone());
                prop_assert_eq!(corpus.num_tokens(), naive.num_tokens());
                prop_assert!(corpus.num_tokens() <= max_tokens);
                let salts = naive.corpus.iter().map(|c| c.1.clone());
                let partitions: std::collections::HashSet<_> = salts.collect();
                prop_assert_eq!(corpus.num_partitions(), partitions.len());
            }
            // Nothing is left behind once every sequence leaves.
            for id in corpus.ids_by_use() {
                corpus.remove(id).unwrap();
            }
            prop_assert!(corpus.num_tokens() == 0 && corpus.num_partitions() == 0);
            prop_assert_eq!(corpus.num_lists(), 0);
        }
    }
}
