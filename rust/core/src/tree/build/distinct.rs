//! Distinct tokens among siblings: a built tree must not give one parent two children with
//! the same token id (a walk can only ever follow the first, so the second wastes budget).
//! The check runs on the built tree, so a repeated id that never gives one parent two
//! such children (past the columns the build reached, at -inf, below `min_logprob`) is
//! accepted: the tree is then exactly the one the repeat-free marginals would give.
//!
//! Unconstrained builds ([`check_prefix_children`]): `ddtree.rs` (and `one_heap.rs` with
//! `AllowAll`) push a parent's rank-0 child when the parent pops and its rank-r + 1 child
//! only when the rank-r one pops (a row's first -inf, the budget and `min_logprob` only stop
//! pushes or the whole build). So the children of a parent `p` at depth d are exactly the
//! entries [0, c_p) of row d (0-based, the row of depth d + 1), and with M_d the largest c_p
//! at depth d, two siblings share a token iff row d repeats an id among its first M_d
//! columns: the parent with M_d children holds both entries, and siblings' ranks are below
//! c_p <= M_d. One pass counts children, one takes the per-depth maximum, and a stamp pass
//! checks the row prefixes (sum M_d <= N ids).
//!
//! Filtered builds ([`check_sibling_tokens`]): a parent's children skip disallowed tokens,
//! so they are not a rank prefix; children are grouped by parent and each group checked.
//!
//! Both report the same error: the shallowest depth with two siblings sharing a token and,
//! in that row, the first column whose id siblings share and an earlier column holds, with
//! that id's first column. For a prefix build this is the first repeat among the first M_d
//! columns; for a filtered one, the two columns the siblings came from (a parent takes its
//! allowed entries in rank order, so two children with one id are its first two columns).

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};

use super::Marginals;
use crate::tree::{DraftTree, TreeError};

/// Ids below this are checked with the stamp array (2 bytes per id, so at most 2 MiB per
/// thread, grown to the largest id seen); others (or negative ones) are sorted.
const STAMPED_IDS: u64 = 1 << 20;

const NONE: u32 = u32::MAX;

/// Per-thread scratch, reused across calls.
struct Scratch {
    /// Generation stamps indexed by id.
    seen: Vec<u16>,
    stamp: u16,
    /// Children per node (prefix check), or the first child (grouping).
    counts: Vec<u32>,
    /// Largest child count per depth (prefix check), or the next sibling (grouping).
    other: Vec<u32>,
    /// One parent's children's ids (grouping).
    group: Vec<i64>,
}

impl Scratch {
    /// A stamp no slot holds yet (slots start at 0, stamps at 1).
    #[inline]
    fn next_stamp(&mut self) -> u16 {
        if self.stamp == u16::MAX {
            self.seen.fill(0);
            self.stamp = 0;
        }
        self.stamp += 1;
        self.stamp
    }

    /// Are the ids distinct?
    #[inline]
    fn distinct(&mut self, ids: &[i64]) -> bool {
        if ids.len() < 2 {
            return true;
        }
        // The ids OR-ed bound them all (negative ids set the top bit).
        let max = ids.iter().fold(0u64, |acc, &t| acc | t as u64);
        if max >= STAMPED_IDS {
            return sorted_is_distinct(ids);
        }
        if max as usize >= self.seen.len() {
            // Zero slots never hold a live stamp.
            let len = (max as usize + 1).next_power_of_two().max(4096);
            self.seen.resize(len, 0);
        }
        let stamp = self.next_stamp();
        let seen = &mut self.seen[..=max as usize];
        let mut repeat = false;
        for &t in ids {
            // 0 <= t <= max: the index is in bounds.
            let slot = &mut seen[t as usize];
            repeat |= *slot == stamp;
            *slot = stamp;
        }
        !repeat
    }
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = const {
        RefCell::new(Scratch {
            seen: Vec::new(),
            stamp: 0,
            counts: Vec::new(),
            other: Vec::new(),
            group: Vec::new(),
        })
    };
}

/// Check a tree built by the unconstrained builder from `m`: no parent has two children
/// with one token id. Exact only for builders that give each parent a rank prefix of its
/// row (see the module notes); [`check_sibling_tokens`] holds for any builder.
pub(super) fn check_prefix_children(tree: &DraftTree, m: &Marginals<'_>) -> Result<(), TreeError> {
    let n = tree.parents.len();
    if n < 3 {
        return Ok(());
    }
    let (_, ids, width) = m.raw();
    let rows = m.depth();
    let ok = SCRATCH.with(|cell| {
        let s = &mut *cell.borrow_mut();
        // One pass over the children: a child's count of earlier siblings is its rank, and
        // M for its row is the largest rank + 1.
        let counts = &mut s.counts;
        counts.clear();
        counts.resize(n, 0);
        let widest = &mut s.other;
        widest.clear();
        widest.resize(rows + 1, 0);
        for (&p, &d) in tree.parents[1..].iter().zip(&tree.depths[1..]) {
            let c = &mut counts[p as usize];
            *c += 1;
            // A branch, not a `max`: the maximum rarely grows, and an unconditional store
            // would chain consecutive same-depth nodes through memory.
            let w = &mut widest[d as usize - 1];
            if *c > *w {
                *w = *c;
            }
        }
        for d in 0..rows {
            let mw = s.other[d] as usize;
            if !s.distinct(&ids[d * width..d * width + mw]) {
                return false;
            }
        }
        true
    });
    if ok {
        Ok(())
    } else {
        Err(sibling_error(tree, m))
    }
}

/// Check that no parent of `tree` (built from `m` by any builder, filtered ones included)
/// has two children with one token id; the error names the depth and both columns.
pub fn check_sibling_tokens(tree: &DraftTree, m: &Marginals<'_>) -> Result<(), TreeError> {
    let n = tree.parents.len();
    if n < 3 {
        return Ok(());
    }
    let ok = SCRATCH.with(|cell| {
        let s = &mut *cell.borrow_mut();
        // Children lists in index order: first child per node, next sibling per node.
        s.counts.clear();
        s.counts.resize(n, NONE);
        s.other.clear();
        s.other.resize(n, NONE);
        for i in (1..n).rev() {
            let p = tree.parents[i] as usize;
            s.other[i] = s.counts[p];
            s.counts[p] = i as u32;
        }
        for p in 0..n {
            let first = s.counts[p];
            if first == NONE || s.other[first as usize] == NONE {
                continue;
            }
            let mut group = std::mem::take(&mut s.group);
            group.clear();
            let mut c = first;
            while c != NONE {
                group.push(tree.tokens[c as usize]);
                c = s.other[c as usize];
            }
            let ok = s.distinct(&group);
            s.group = group;
            if !ok {
                return false;
            }
        }
        true
    });
    if ok {
        Ok(())
    } else {
        Err(sibling_error(tree, m))
    }
}

/// Fallback for large or negative ids.
#[cold]
fn sorted_is_distinct(ids: &[i64]) -> bool {
    let mut sorted = ids.to_vec();
    sorted.sort_unstable();
    sorted.windows(2).all(|w| w[0] != w[1])
}

/// The error for a tree known to give some parent two children with one id (see the
/// module notes for which pair is named).
#[cold]
fn sibling_error(tree: &DraftTree, m: &Marginals<'_>) -> TreeError {
    let mut seen = HashSet::new();
    // (row, id) pairs that two siblings share.
    let mut shared = HashSet::new();
    for i in 1..tree.parents.len() {
        if !seen.insert((tree.parents[i], tree.tokens[i])) {
            shared.insert((tree.depths[i] as usize - 1, tree.tokens[i]));
        }
    }
    let mut rows: Vec<usize> = shared.iter().map(|&(d, _)| d).collect();
    rows.sort_unstable();
    let d = *rows.first().expect("two siblings share a token");
    let mut first = HashMap::new();
    for rank in 0..m.used_width() {
        if m.logprob(d, rank) == f32::NEG_INFINITY {
            break;
        }
        let token = m.token(d, rank);
        match first.get(&token) {
            Some(&first_rank) if shared.contains(&(d, token)) => {
                return TreeError::DuplicateToken {
                    depth: d,
                    rank,
                    first_rank,
                    token,
                };
            }
            Some(_) => {}
            None => {
                first.insert(token, rank);
            }
        }
    }
    unreachable!("siblings at depth {} share a token from row {d}", d + 1)
}
