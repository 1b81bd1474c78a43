//! The unconstrained DDTree build with rank-class queues instead of one big heap.
//!
//! Every heap entry of Algorithm 1 is a candidate (parent, depth d, rank r) whose score is
//! `score(parent) + logprob[d][r]`. Candidates of one class (d, r) are pushed in pop order of
//! their triggers (the parent for r = 0, the sibling at rank r - 1 otherwise), whose scores
//! differ from the candidate's by a constant of the class, and pops are non-increasing. So
//! each class is already a sorted FIFO queue, and only the queue heads need a heap, which
//! stays small (about the number of active classes instead of about B). Ties pop in push
//! order exactly as in the one-heap version (`builder.rs`), so both give the same tree.
//!
//! Fast path: the child candidate is pushed last, so when its score is strictly above the
//! heap top it is the next pop (its class queue is then necessarily empty: a queued head
//! would be in the heap with a score at least as high). It is emitted directly, without
//! entering the arena, its queue or the heap. Skipping its push sequence number is harmless:
//! only the relative order of sequence numbers matters, and that is unchanged.
//!
//! The loop reads and writes without bounds checks (each `SAFETY` note names the bound):
//! with the checks the compiler keeps the loop's values in memory instead of registers.
//! The proptests compare this builder with the checked one-heap builder, ties included.

use super::min_heap::MinHeap as HeadHeap;
use super::{max_nodes, Marginals};
use crate::tree::{BuiltTree, DraftTree};

const NONE: u32 = u32::MAX;

/// A pushed candidate; its index in the arena is its push sequence number.
#[derive(Clone, Copy)]
struct Cand {
    score: f64,
    parent: u32,
    next: u32,
}

/// The FIFO queue of class (row, rank).
#[derive(Clone, Copy)]
struct Queue {
    row: u32,
    rank: u32,
    /// `row * width + rank`: the class's entry in the marginals.
    cell: u32,
    head: u32,
    tail: u32,
    /// Queue of class (row, rank + 1), NONE until created. Class (row, r + 1) only gets
    /// candidates when one of (row, r) pops, so it is reached from (row, r).
    sib: u32,
}

/// Order key of a score: scores are finite and <= 0, so `0.0 - score` is >= +0.0 (a -0.0
/// score, possible when logprob[0][0] is -0.0, maps to +0.0 as well, the same key as +0.0,
/// matching `==` on f64) and its bits grow as the score falls.
#[inline(always)]
fn score_key(score: f64) -> u64 {
    (0.0 - score).to_bits()
}

/// Heap item: the head candidate of one queue, packed as `score_key << 64 | seq << 32 |
/// queue`. Smaller is better: higher score first, equal scores in push order (seqs are
/// unique, so the queue bits never decide).
#[inline(always)]
fn head_item(score: f64, seq: u32, queue: u32) -> u128 {
    ((score_key(score) as u128) << 64) | ((seq as u128) << 32) | queue as u128
}

/// Candidate arena, class queues and the heap of queue heads.
struct Classes {
    arena: Vec<Cand>,
    queues: Vec<Queue>,
    heap: HeadHeap,
}

impl Classes {
    #[inline(always)]
    fn new_queue(&mut self, row: usize, rank: usize, width: usize) -> u32 {
        let q = self.queues.len();
        debug_assert!(q < self.queues.capacity());
        // SAFETY: the capacity reserved in `build` covers every queue (one per row plus at
        // most one new sibling class per pop).
        unsafe {
            self.queues.as_mut_ptr().add(q).write(Queue {
                row: row as u32,
                rank: rank as u32,
                cell: (row * width + rank) as u32,
                head: NONE,
                tail: NONE,
                sib: NONE,
            });
            self.queues.set_len(q + 1);
        }
        q as u32
    }

    /// Append a candidate to queue `q`; a queue that was empty enters the heap.
    #[inline(always)]
    fn push(&mut self, q: u32, score: f64, parent: u32) {
        let seq = self.arena.len();
        debug_assert!(seq < self.arena.capacity());
        // SAFETY: the arena's capacity covers every push (two per pop; see `build`).
        unsafe {
            self.arena.as_mut_ptr().add(seq).write(Cand {
                score,
                parent,
                next: NONE,
            });
            self.arena.set_len(seq + 1);
        }
        let seq = seq as u32;
        // SAFETY: `q` was handed out by `new_queue`, so it is below `queues.len()`.
        let queue = unsafe { self.queues.get_unchecked_mut(q as usize) };
        if queue.head == NONE {
            queue.head = seq;
            queue.tail = seq;
            self.heap.push(head_item(score, seq, q));
        } else {
            let tail = queue.tail;
            queue.tail = seq;
            // SAFETY: a queue's tail is a candidate pushed earlier, below `arena.len()`.
            unsafe { self.arena.get_unchecked_mut(tail as usize).next = seq };
        }
    }
}

pub(super) fn build(
    m: &Marginals<'_>,
    budget: usize,
    root_token: i64,
    min_logprob: Option<f64>,
) -> BuiltTree {
    let k = m.used_width().min(budget);
    let rows = m.depth();
    let cap = max_nodes(budget, rows, k);
    let mut tree = DraftTree::with_root(cap, root_token, true);

    let lp0 = m.logprob(0, 0);
    let min = min_logprob.unwrap_or(f64::NEG_INFINITY);
    if cap < 2 || k == 0 || lp0 == f32::NEG_INFINITY || (lp0 as f64) < min {
        return BuiltTree::from_tree(tree);
    }
    let (lp, ids, width) = m.raw();
    // Bounds used by the unchecked accesses below: `row < rows` and `rank < k <= width`, so
    // `row * width + rank` is inside the validated `[rows, width]` arrays; node, queue and
    // candidate indices are below the lengths written so far, which never exceed the
    // capacities reserved here (one node per pop up to `cap`, two candidates per pop, one
    // new queue per pop plus one per row).
    // SAFETY: callers pass `row * width + rank` with the bounds above.
    let lpv = |i: usize| unsafe { *lp.get_unchecked(i) };

    let mut c = Classes {
        arena: Vec::with_capacity(2 * cap),
        queues: Vec::with_capacity(cap + rows),
        // A queue is in the heap at most once.
        heap: HeadHeap::with_capacity(cap + rows),
    };
    for row in 0..rows {
        c.new_queue(row, 0, width);
    }
    let out_tok = tree.tokens.as_mut_ptr();
    let out_par = tree.parents.as_mut_ptr();
    let out_dep = tree.depths.as_mut_ptr();
    let out_lp = tree.logprobs.as_mut_ptr();

    let mut n = 1usize;
    let mut score = lp0 as f64;
    let mut parent = 0u32;
    let mut q = 0u32;
    loop {
        // SAFETY: `q` is a queue index handed out by `new_queue`.
        let Queue {
            row,
            rank,
            cell,
            sib,
            ..
        } = unsafe { *c.queues.get_unchecked(q as usize) };
        let (row, rank, cell) = (row as usize, rank as usize, cell as usize);
        let node = n as u32;
        // SAFETY: `n < cap`, the capacity of the four node vectors; `cell` is an entry of
        // the validated marginals.
        unsafe {
            out_tok.add(n).write(*ids.get_unchecked(cell));
            out_par.add(n).write(parent as i32);
            out_dep.add(n).write(row as i32 + 1);
            out_lp.add(n).write(score);
        }
        n += 1;
        if n >= cap {
            break;
        }
        if rank + 1 < k {
            let v = lpv(cell + 1);
            if v != f32::NEG_INFINITY {
                let mut sq = sib;
                if sq == NONE {
                    sq = c.new_queue(row, rank + 1, width);
                    // SAFETY: `q` is a queue index handed out by `new_queue`.
                    unsafe { c.queues.get_unchecked_mut(q as usize).sib = sq };
                }
                // The parent is already emitted: its score is in the output.
                // SAFETY: `parent < n`, a node written above.
                let base = unsafe { *out_lp.add(parent as usize) };
                c.push(sq, base + v as f64, parent);
            }
        }
        if row + 1 < rows {
            let v = lpv(cell - rank + width);
            if v != f32::NEG_INFINITY {
                let child = score + v as f64;
                let cq = (row + 1) as u32;
                let beats_top = match c.heap.first() {
                    Some(top) => score_key(child) < (top >> 64) as u64,
                    None => true,
                };
                if beats_top {
                    if child < min {
                        break;
                    }
                    score = child;
                    parent = node;
                    q = cq;
                    continue;
                }
                c.push(cq, child, node);
            }
        }
        // Pop the heap top: advance its class queue and put the next head in its place.
        let Some(top) = c.heap.first() else { break };
        let seq = (top >> 32) as u32;
        let tq = top as u32;
        // SAFETY: heap items name pushed candidates.
        let cand = unsafe { *c.arena.get_unchecked(seq as usize) };
        if cand.score < min {
            break;
        }
        // SAFETY: heap items name queues handed out by `new_queue`.
        unsafe { c.queues.get_unchecked_mut(tq as usize).head = cand.next };
        let next_head = (cand.next != NONE).then(|| {
            // SAFETY: a candidate's `next` link names a later pushed candidate.
            let s = unsafe { c.arena.get_unchecked(cand.next as usize).score };
            head_item(s, cand.next, tq)
        });
        c.heap.replace_top(next_head);
        score = cand.score;
        parent = cand.parent;
        q = tq;
    }
    // SAFETY: nodes 0..n were written above, n <= cap.
    unsafe {
        tree.tokens.set_len(n);
        tree.parents.set_len(n);
        tree.depths.set_len(n);
        tree.logprobs.set_len(n);
    }
    // Free the scratch (allocated last, so it goes back to the top of the allocator's heap)
    // before the large ancestor bitmap is allocated.
    drop(c);
    BuiltTree::from_tree(tree)
}
