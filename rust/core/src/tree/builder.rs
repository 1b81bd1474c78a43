//! DDTree best-first builder (Algorithm 1 of "Accelerating Speculative Decoding with Block
//! Diffusion Draft Trees"): a max-heap over rank tuples where popping emits a node and pushes
//! its next sibling (same parent, next allowed rank) and its first child (next depth, first
//! allowed rank). Because every log-prob is <= 0, a prefix never scores above its
//! predecessor, so the pops come out in non-increasing order and the first B pops are a
//! top-B, prefix-closed set.
//!
//! Ties: entries with equal scores pop in the order they were pushed (FIFO). Scores are
//! f64 sums `parent_score + logprob[d][r]`, computed the same way for siblings and children,
//! so the rule is reproducible by any reference that adds in that order.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::{check_token, check_tree_size, BuiltTree, DraftTree, Marginals, TreeError};

/// Restricts which tokens may extend a node (used by grammar-aware trees).
pub trait TokenFilter {
    /// May `token` follow the already emitted node `parent`?
    fn allows(&mut self, parent: usize, token: i64) -> bool;
    /// Node `node` was emitted as the child of `parent` with `token` (an allowed one).
    fn emitted(&mut self, node: usize, parent: usize, token: i64);
}

/// The filter of an unconstrained tree.
pub struct AllowAll;

impl TokenFilter for AllowAll {
    #[inline(always)]
    fn allows(&mut self, _parent: usize, _token: i64) -> bool {
        true
    }
    #[inline(always)]
    fn emitted(&mut self, _node: usize, _parent: usize, _token: i64) {}
}

#[derive(Clone, Copy)]
struct Entry {
    score: f64,
    /// Score of the parent prefix; a sibling's score is `base + logprob`.
    base: f64,
    seq: u32,
    parent: u32,
    /// 0-based index into the marginals' rows (node depth - 1).
    row: u32,
    rank: u32,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Entry {
    fn cmp(&self, other: &Self) -> Ordering {
        // Max-heap on score; among equal scores the smaller sequence number wins.
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.seq.cmp(&self.seq))
    }
}

/// Most nodes, root included, that a tree of `budget` drafted nodes over `rows` depths of
/// `k` candidates can hold: `budget + 1`, or every prefix plus the root when there are
/// fewer. The builders size their buffers by it, so a budget far above what the marginals
/// can fill allocates nothing extra.
pub fn max_nodes(budget: usize, rows: usize, k: usize) -> usize {
    let (mut prefixes, mut level) = (0usize, 1usize);
    for _ in 0..rows {
        level = level.saturating_mul(k);
        prefixes = prefixes.saturating_add(level);
        if prefixes >= budget {
            return budget.saturating_add(1);
        }
    }
    prefixes + 1
}

/// Build the optimal tree of at most `budget` drafted nodes under a root token.
pub fn build_ddtree(
    m: &Marginals<'_>,
    budget: usize,
    root_token: i64,
    min_logprob: Option<f64>,
) -> BuiltTree {
    super::queues::build(m, budget, root_token, min_logprob)
}

/// As [`build_ddtree`], with ranks restricted to the tokens `filter` allows at each node.
/// Uses one heap over all candidates: with a filter, the rank-class queues of `queues.rs`
/// are no longer sorted.
pub fn build_ddtree_filtered<F: TokenFilter>(
    m: &Marginals<'_>,
    budget: usize,
    root_token: i64,
    min_logprob: Option<f64>,
    filter: &mut F,
) -> BuiltTree {
    // Every validated column: with a filter, allowed tokens may sit below rank `budget`.
    let k = m.used_width();
    let rows = m.depth();
    let cap = max_nodes(budget, rows, k);
    let mut tokens = Vec::with_capacity(cap);
    let mut parents = Vec::with_capacity(cap);
    let mut depths = Vec::with_capacity(cap);
    let mut logprobs = Vec::with_capacity(cap);
    tokens.push(root_token);
    parents.push(-1i32);
    depths.push(0i32);
    logprobs.push(0.0f64);

    // First rank >= `from` at `row` that is finite and allowed after `parent`.
    // Rows are sorted, so the first -inf ends the search.
    let next_rank = |filter: &mut F, parent: usize, row: usize, from: usize| -> Option<usize> {
        (from..k)
            .take_while(|&r| m.logprob(row, r) != f32::NEG_INFINITY)
            .find(|&r| filter.allows(parent, m.token(row, r)))
    };

    let mut heap = BinaryHeap::with_capacity(2 * cap);
    let mut seq = 0u32;
    let mut push =
        |heap: &mut BinaryHeap<Entry>, base: f64, parent: usize, row: usize, rank: usize| {
            heap.push(Entry {
                score: base + m.logprob(row, rank) as f64,
                base,
                seq,
                parent: parent as u32,
                row: row as u32,
                rank: rank as u32,
            });
            seq += 1;
        };
    if let Some(r) = next_rank(filter, 0, 0, 0) {
        push(&mut heap, 0.0, 0, 0, r);
    }
    while tokens.len() < cap {
        let Some(e) = heap.pop() else { break };
        if min_logprob.is_some_and(|min| e.score < min) {
            break;
        }
        let (row, rank, parent) = (e.row as usize, e.rank as usize, e.parent as usize);
        let node = tokens.len();
        let token = m.token(row, rank);
        tokens.push(token);
        parents.push(parent as i32);
        depths.push(row as i32 + 1);
        logprobs.push(e.score);
        filter.emitted(node, parent, token);
        if let Some(r) = next_rank(filter, parent, row, rank + 1) {
            push(&mut heap, e.base, parent, row, r);
        }
        if row + 1 < rows {
            if let Some(r) = next_rank(filter, node, row + 1, 0) {
                push(&mut heap, e.score, node, row + 1, r);
            }
        }
    }
    finish(tokens, parents, depths, logprobs)
}

/// Package the node arrays with their ancestor bits and child links.
pub(super) fn finish(
    tokens: Vec<i64>,
    parents: Vec<i32>,
    depths: Vec<i32>,
    logprobs: Vec<f64>,
) -> BuiltTree {
    BuiltTree::from_tree(DraftTree {
        tokens,
        parents,
        depths,
        logprobs,
        scored: true,
    })
}

/// Validate and build in one call (what the bindings use). Token ids are range-checked
/// where the tree uses them: an id outside [0, 2^31) that enters the tree is an error,
/// one in a column the tree never reaches is not read.
pub fn build_checked(
    logprobs: &[f32],
    token_ids: &[i64],
    depth: usize,
    width: usize,
    budget: i64,
    root_token: i64,
    min_logprob: Option<f64>,
) -> Result<BuiltTree, TreeError> {
    let m = Marginals::for_build(logprobs, token_ids, depth, width, budget)?;
    check_tree_size(max_nodes(budget as usize, depth, m.used_width()))?;
    if let Some(v) = min_logprob {
        if v.is_nan() {
            return Err(TreeError::Shape("min_logprob must not be NaN".into()));
        }
    }
    let built = build_ddtree(&m, budget as usize, root_token, min_logprob);
    let drafted = &built.tree.tokens[1..];
    if drafted.iter().fold(0u64, |acc, &t| acc | t as u64) >> 31 != 0 {
        return Err(out_of_range_token(&built.tree, token_ids, width));
    }
    Ok(built)
}

/// Name the first drafted node whose token id is out of range by its marginals entry.
#[cold]
fn out_of_range_token(tree: &DraftTree, token_ids: &[i64], width: usize) -> TreeError {
    let (node, &token) = (tree.tokens.iter().enumerate().skip(1))
        .find(|&(_, &t)| check_token(t, String::new).is_err())
        .expect("an out-of-range token was seen");
    let d = tree.depths[node] as usize - 1;
    let rank = token_ids[d * width..(d + 1) * width]
        .iter()
        .position(|&t| t == token)
        .unwrap_or(0);
    check_token(token, || format!("token_ids[{d}, {rank}]")).expect_err("the token is out of range")
}
