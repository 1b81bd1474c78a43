//! Trie walks that compute a state's allowed tokens: one pruned preorder walk from scratch,
//! or a diff walk that turns a similar state's cached mask into this state's.

use super::class_trie::ClassTrie;
use super::dfa::{StateId, TableDfa, DEAD};
use super::equiv::StateLevels;
use crate::constrain::vocab::{TokenTrie, TrieNode};

/// A trie in preorder as the walks read it: the vocabulary's byte trie, or a grammar's
/// merged class trie (whose heavy nodes carry ready bitmaps).
#[derive(Clone, Copy)]
pub(super) struct TrieView<'a> {
    pub nodes: &'a [TrieNode],
    pub ids: &'a [u32],
    /// Per node: depth of its subtree below it.
    pub below: &'a [u16],
    pub max_depth: usize,
    pub heavy: Option<&'a ClassTrie>,
}

impl<'a> TrieView<'a> {
    pub fn bytes(t: &'a TokenTrie) -> Self {
        TrieView {
            nodes: &t.nodes,
            ids: &t.token_ids,
            below: &t.below,
            max_depth: t.max_depth,
            heavy: None,
        }
    }

    pub fn classes(t: &'a ClassTrie) -> Self {
        TrieView {
            nodes: &t.nodes,
            ids: &t.token_ids,
            below: &t.below,
            max_depth: t.max_depth,
            heavy: Some(t),
        }
    }

    /// One past the last token id of the tokens ending in `nodes[j..]`'s first node.
    #[inline]
    fn tok_at(&self, j: usize) -> usize {
        match self.nodes.get(j) {
            Some(node) => node.tok_start as usize,
            None => self.ids.len(),
        }
    }
}

/// Trie nodes under each first byte.
pub(super) fn first_byte_nodes(trie: &TokenTrie) -> [usize; 256] {
    let mut under = [0usize; 256];
    let mut i = 0;
    while i < trie.nodes.len() {
        let node = trie.nodes[i];
        under[node.byte as usize] = node.end as usize - i;
        i = node.end as usize;
    }
    under
}

/// One preorder walk of the whole trie from `state`, skipping a subtree as soon as the DFA
/// dies, setting the bits of the tokens reached; returns nodes visited.
pub(super) fn walk_nodes(dfa: &TableDfa, state: StateId, t: &TrieView, out: &mut [u32]) -> usize {
    walk_range(dfa, state, t, 0, t.nodes.len(), out)
}

/// [`walk_nodes`] over the subtree `nodes[start..stop]` (a whole subtree, or the whole
/// trie), `state` being the DFA state before its root's byte.
fn walk_range(
    dfa: &TableDfa,
    state: StateId,
    t: &TrieView,
    start: usize,
    stop: usize,
    out: &mut [u32],
) -> usize {
    let TrieView {
        nodes,
        ids,
        max_depth,
        heavy,
        ..
    } = *t;
    let mut stack = vec![DEAD; max_depth + 1];
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
        // SAFETY: i < stop <= n, the length of `nodes`.
        let node = unsafe { *nodes.get_unchecked(i) };
        let d = node.depth as usize;
        // SAFETY: trie depths are in 1..=max_depth (the stack's length - 1), and `stack`
        // only holds states returned by this DFA (never TERMINATED).
        let s = unsafe { dfa.next_unchecked(*stack.get_unchecked(d - 1), node.byte) };
        if s == DEAD {
            i = node.end as usize;
            continue;
        }
        // SAFETY: d <= max_depth, as above.
        unsafe { *stack.get_unchecked_mut(d) = s };
        match heavy.map(|ct| ct.heavy[i]) {
            Some(h) if h != u32::MAX => {
                let bm = &heavy.expect("checked").bitmaps[h as usize];
                for (o, &w) in out.iter_mut().zip(bm.iter()) {
                    *o |= w;
                }
            }
            _ => {
                for &tok in &ids[node.tok_start as usize..t.tok_at(i + 1)] {
                    out[tok as usize / 32] |= 1 << (tok % 32);
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
pub(super) fn diff_walk(
    dfa: &TableDfa,
    lv: &StateLevels,
    pair: [StateId; 2],
    t: &TrieView,
    out: &mut [u32],
) {
    let mut sa = vec![DEAD; t.max_depth + 1];
    let mut sb = vec![DEAD; t.max_depth + 1];
    sa[0] = pair[0];
    sb[0] = pair[1];
    let n = t.nodes.len();
    let mut i = 0;
    while i < n {
        let node = t.nodes[i];
        let d = node.depth as usize;
        let a = dfa.next(sa[d - 1], node.byte);
        let b = dfa.next(sb[d - 1], node.byte);
        let end = node.end as usize;
        if lv.same(t.below[i] as usize, a, b) {
            i = end;
            continue;
        }
        if a == DEAD {
            for &tok in &t.ids[node.tok_start as usize..t.tok_at(end)] {
                out[tok as usize / 32] &= !(1 << (tok % 32));
            }
            i = end;
            continue;
        }
        if b == DEAD {
            walk_range(dfa, sa[d - 1], t, i, end, out);
            i = end;
            continue;
        }
        // Both alive: the tokens ending here are already set.
        sa[d] = a;
        sb[d] = b;
        i += 1;
    }
}
