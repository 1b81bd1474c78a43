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

use super::{max_nodes, Marginals, TokenFilter};
use crate::tree::{BuiltTree, DraftTree};

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

/// As [`build_ddtree`](super::build_ddtree), with ranks restricted to the tokens `filter` allows at each node.
/// Uses one heap over all candidates: with a filter, the rank-class queues of `ddtree.rs`
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
    let mut tree = DraftTree::with_root(cap, root_token, true);

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
    while tree.len() < cap {
        let Some(e) = heap.pop() else { break };
        if min_logprob.is_some_and(|min| e.score < min) {
            break;
        }
        let (row, rank, parent) = (e.row as usize, e.rank as usize, e.parent as usize);
        let node = tree.len();
        let token = m.token(row, rank);
        tree.push(token, parent as i32, row as i32 + 1, e.score);
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
    BuiltTree::from_tree(tree)
}
