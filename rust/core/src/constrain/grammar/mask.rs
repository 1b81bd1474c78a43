//! Allowed-token masks of parser states: one pruned preorder walk of the vocabulary's token
//! trie (a subtree is skipped as soon as the parser dies, and each trie node costs one cached
//! transition), with the result cached per state under a memory cap.

use rustc_hash::FxHashMap;

use super::cfg::Grammar;
use super::earley::{Chart, DEAD_SET};
use crate::constrain::vocab::TokenTrie;

#[derive(Debug)]
pub struct MaskStore {
    masks: FxHashMap<u32, Box<[u32]>>,
    used_bytes: usize,
    cap_bytes: usize,
}

impl MaskStore {
    pub fn new(cap_bytes: usize) -> Self {
        MaskStore {
            masks: FxHashMap::default(),
            used_bytes: 0,
            cap_bytes,
        }
    }

    pub fn get(&self, state: u32) -> Option<&[u32]> {
        self.masks.get(&state).map(|m| &m[..])
    }

    /// Keep `mask` if the cap allows (beyond it, masks are recomputed on every request).
    pub fn offer(&mut self, state: u32, mask: &[u32]) {
        let size = std::mem::size_of_val(mask);
        if self.used_bytes + size <= self.cap_bytes && !self.masks.contains_key(&state) {
            self.masks.insert(state, mask.into());
            self.used_bytes += size;
        }
    }

    pub fn used_bytes(&self) -> usize {
        self.used_bytes
    }
}

/// Set in `out` (zeroed first) the bits of the tokens the parser accepts from `state`.
pub fn walk(chart: &mut Chart, g: &Grammar, trie: &TokenTrie, state: u32, out: &mut [u32]) {
    out.fill(0);
    let mut stack = vec![DEAD_SET; trie.max_depth + 1];
    stack[0] = state;
    let nodes = &trie.nodes;
    let mut i = 0;
    while i < nodes.len() {
        let node = nodes[i];
        let d = node.depth as usize;
        let s = chart.step(g, stack[d - 1], node.byte);
        if s == DEAD_SET {
            i = node.end as usize;
            continue;
        }
        stack[d] = s;
        let toks = &trie.token_ids[trie.tok_start[i] as usize..trie.tok_start[i + 1] as usize];
        for &t in toks {
            out[t as usize / 32] |= 1 << (t % 32);
        }
        i += 1;
    }
}
