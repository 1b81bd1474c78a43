//! The unconstrained DDTree build with rank-class queues instead of one big heap.
//!
//! Every heap entry of Algorithm 1 is a candidate (parent, depth d, rank r) whose score is
//! `score(parent) + logprob[d][r]`. Candidates of one class (d, r) are pushed in pop order of
//! their triggers (the parent for r = 0, the sibling at rank r - 1 otherwise), whose scores
//! differ from the candidate's by a constant of the class, and pops are non-increasing. So
//! each class is already a sorted FIFO queue, and only the queue heads need a heap, which
//! stays small (about the number of active classes instead of about B). Ties pop in push
//! order exactly as in the one-heap version (`builder.rs`), so both give the same tree.

use super::{BuiltTree, Marginals};

const NONE: u32 = u32::MAX;

/// A pushed candidate; its index in the arena is its push sequence number.
#[derive(Clone, Copy)]
struct Cand {
    score: f64,
    parent: u32,
    next: u32,
}

#[derive(Clone, Copy)]
struct Queue {
    row: u32,
    rank: u32,
    head: u32,
    tail: u32,
}

/// Heap item: the head candidate of one queue.
#[derive(Clone, Copy)]
struct Head {
    score: f64,
    seq: u32,
    queue: u32,
}

#[inline(always)]
fn before(a: &Head, b: &Head) -> bool {
    // Higher score first; equal scores in push order. Non-short-circuit operators keep the
    // comparison branch-free: heap comparisons are unpredictable.
    (a.score > b.score) | ((a.score == b.score) & (a.seq < b.seq))
}

struct HeadHeap(Vec<Head>);

impl HeadHeap {
    fn push(&mut self, h: Head) {
        let v = &mut self.0;
        let mut i = v.len();
        v.push(h);
        while i > 0 {
            let p = (i - 1) / 2;
            if !before(&h, &v[p]) {
                break;
            }
            v[i] = v[p];
            i = p;
        }
        v[i] = h;
    }

    /// Replace the top with `h` (or remove it when `h` is None) and restore the order.
    fn replace_top(&mut self, h: Option<Head>) {
        let v = &mut self.0;
        let h = match h {
            Some(h) => h,
            None => {
                let last = v.pop().expect("replace_top on an empty heap");
                if v.is_empty() {
                    return;
                }
                last
            }
        };
        // Floyd's variant: walk the hole down to a leaf along the better children (a
        // branch-free choice per level), then sift `h` up from there (usually a step or two).
        let n = v.len();
        let mut i = 0;
        loop {
            let l = 2 * i + 1;
            if l >= n {
                break;
            }
            let c = if l + 1 < n {
                l + before(&v[l + 1], &v[l]) as usize
            } else {
                l
            };
            v[i] = v[c];
            i = c;
        }
        while i > 0 {
            let p = (i - 1) / 2;
            if !before(&h, &v[p]) {
                break;
            }
            v[i] = v[p];
            i = p;
        }
        v[i] = h;
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
    let cap = budget + 1;
    let mut tokens = Vec::with_capacity(cap);
    let mut parents = Vec::with_capacity(cap);
    let mut depths = Vec::with_capacity(cap);
    let mut logprobs = Vec::with_capacity(cap);
    tokens.push(root_token);
    parents.push(-1i32);
    depths.push(0i32);
    logprobs.push(0.0f64);

    let mut arena: Vec<Cand> = Vec::with_capacity(2 * cap);
    // At most one class per pushed candidate.
    let mut queues: Vec<Queue> = Vec::with_capacity(2 * cap);
    // queue_of[row][rank] -> queue index. Class (row, r + 1) first appears when a candidate
    // of (row, r) pops, so each row's classes are created in rank order: push, never resize.
    let mut queue_of: Vec<Vec<u32>> = (0..rows).map(|_| Vec::with_capacity(k.min(64))).collect();
    let mut heap = HeadHeap(Vec::with_capacity(64));

    // Append a candidate to class (row, rank); a queue that was empty enters the heap.
    let mut push = |arena: &mut Vec<Cand>,
                    queues: &mut Vec<Queue>,
                    heap: &mut HeadHeap,
                    score: f64,
                    parent: u32,
                    row: usize,
                    rank: usize| {
        let seq = arena.len() as u32;
        arena.push(Cand {
            score,
            parent,
            next: NONE,
        });
        let ids = &mut queue_of[row];
        let q = if rank == ids.len() {
            ids.push(queues.len() as u32);
            queues.push(Queue {
                row: row as u32,
                rank: rank as u32,
                head: NONE,
                tail: NONE,
            });
            queues.len() - 1
        } else {
            ids[rank] as usize
        };
        let queue = &mut queues[q];
        if queue.head == NONE {
            queue.head = seq;
            queue.tail = seq;
            heap.push(Head {
                score,
                seq,
                queue: q as u32,
            });
        } else {
            arena[queue.tail as usize].next = seq;
            queue.tail = seq;
        }
    };

    if m.logprob(0, 0) != f32::NEG_INFINITY {
        push(
            &mut arena,
            &mut queues,
            &mut heap,
            m.logprob(0, 0) as f64,
            0,
            0,
            0,
        );
    }
    while tokens.len() < cap {
        let Some(&top) = heap.0.first() else { break };
        if min_logprob.is_some_and(|min| top.score < min) {
            break;
        }
        let q = top.queue as usize;
        let cand = arena[top.seq as usize];
        let Queue { row, rank, .. } = queues[q];
        let (row, rank) = (row as usize, rank as usize);
        // Advance this class's queue and put its next head in place of the popped one.
        queues[q].head = cand.next;
        let next_head = (cand.next != NONE).then(|| Head {
            score: arena[cand.next as usize].score,
            seq: cand.next,
            queue: top.queue,
        });
        heap.replace_top(next_head);

        let node = tokens.len() as u32;
        tokens.push(m.token(row, rank));
        parents.push(cand.parent as i32);
        depths.push(row as i32 + 1);
        logprobs.push(top.score);
        if rank + 1 < k {
            let v = m.logprob(row, rank + 1);
            if v != f32::NEG_INFINITY {
                let base = logprobs[cand.parent as usize];
                push(
                    &mut arena,
                    &mut queues,
                    &mut heap,
                    base + v as f64,
                    cand.parent,
                    row,
                    rank + 1,
                );
            }
        }
        if row + 1 < rows {
            let v = m.logprob(row + 1, 0);
            if v != f32::NEG_INFINITY {
                push(
                    &mut arena,
                    &mut queues,
                    &mut heap,
                    top.score + v as f64,
                    node,
                    row + 1,
                    0,
                );
            }
        }
    }
    super::builder::finish(tokens, parents, depths, logprobs)
}
