//! Token trie in preorder arrays: walking it with an automaton visits each shared prefix once
//! and skips a whole subtree (`end`) as soon as the automaton dies.

use super::subtree::SubtreeSummary;
use super::Vocabulary;

/// One trie node; nodes are stored in preorder so a subtree is the index range `[i, end)`.
#[derive(Debug, Clone, Copy)]
pub struct TrieNode {
    pub byte: u8,
    pub depth: u16,
    /// One past the last node of this subtree.
    pub end: u32,
    /// Tokens ending here are `token_ids[tok_start[i]..tok_start[i + 1]]`.
    pub tok_start: u32,
}

#[derive(Debug, Default)]
pub struct TokenTrie {
    pub nodes: Vec<TrieNode>,
    /// Sentinel-terminated: `tok_start.len() == nodes.len() + 1`.
    pub tok_start: Vec<u32>,
    pub token_ids: Vec<u32>,
    pub max_depth: usize,
    /// Per node: depth of its subtree below it (for bounded-equivalence pruning).
    pub below: Vec<u16>,
    /// What each subtree holds, for walks that settle subtrees whole.
    pub summary: SubtreeSummary,
}

impl TokenTrie {
    /// Build over the vocabulary's text tokens (sorting them by bytes gives preorder).
    pub fn build(v: &Vocabulary) -> TokenTrie {
        let mut ids: Vec<u32> = (0..v.vocab_size() as u32)
            .filter(|&i| v.has_bytes(i as usize))
            .collect();
        ids.sort_unstable_by(|&a, &b| {
            v.token_bytes(a as usize)
                .cmp(v.token_bytes(b as usize))
                .then(a.cmp(&b))
        });
        // Tokens longer than u16 depth are unrealistic; they are left out (never allowed).
        ids.retain(|&i| v.token_bytes(i as usize).len() < u16::MAX as usize);
        let mut nodes: Vec<TrieNode> = Vec::with_capacity(ids.len() * 2);
        let mut tok_start: Vec<u32> = Vec::with_capacity(ids.len() * 2 + 1);
        let mut token_ids: Vec<u32> = Vec::with_capacity(ids.len());
        let mut prev: &[u8] = &[];
        let mut max_depth = 0;
        for &id in &ids {
            let b = v.token_bytes(id as usize);
            let lcp = b.iter().zip(prev).take_while(|(x, y)| x == y).count();
            for (d, &byte) in b.iter().enumerate().skip(lcp) {
                nodes.push(TrieNode {
                    byte,
                    depth: (d + 1) as u16,
                    end: 0,
                    tok_start: 0,
                });
                tok_start.push(token_ids.len() as u32);
            }
            // Sorted order puts a token right after its own last node (or its duplicate).
            token_ids.push(id);
            max_depth = max_depth.max(b.len());
            prev = b;
        }
        tok_start.push(token_ids.len() as u32);
        // Subtree ends: the next node whose depth is <= this one's.
        let n = nodes.len();
        let mut stack: Vec<usize> = Vec::with_capacity(max_depth + 1);
        for i in 0..n {
            while let Some(&top) = stack.last() {
                if nodes[top].depth >= nodes[i].depth {
                    nodes[top].end = i as u32;
                    stack.pop();
                } else {
                    break;
                }
            }
            stack.push(i);
        }
        for top in stack {
            nodes[top].end = n as u32;
        }
        for (i, node) in nodes.iter_mut().enumerate() {
            node.tok_start = tok_start[i];
        }
        let below = heights_below(&nodes);
        let summary = SubtreeSummary::build(&nodes, &token_ids, v.words());
        TokenTrie {
            nodes,
            tok_start,
            token_ids,
            max_depth,
            below,
            summary,
        }
    }

    pub fn num_nodes(&self) -> usize {
        self.nodes.len()
    }
}

/// Per preorder node: its subtree's depth below it (0 for a leaf).
pub fn heights_below(nodes: &[TrieNode]) -> Vec<u16> {
    let n = nodes.len();
    let mut below = vec![0u16; n];
    for i in (0..n).rev() {
        let mut h = 0u16;
        let mut j = i + 1;
        while j < nodes[i].end as usize {
            h = h.max(below[j] + 1);
            j = nodes[j].end as usize;
        }
        below[i] = h;
    }
    below
}
