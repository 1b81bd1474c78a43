//! A grammar's quotient of the token trie: bytes the DFA never tells apart (same transition
//! from every state) are merged into one class, so tokens such as "hello" and "world" share
//! one path. Built lazily for grammars whose masks need large walks (wide classes such as
//! `[^"]`), where it shrinks the walk by orders of magnitude. Nodes holding many tokens keep
//! a ready bitmap so a walk ORs words instead of setting bits one by one.

use std::collections::HashMap;

use super::dfa::{StateId, TableDfa};
use crate::constrain::vocab::{heights_below, TokenTrie, TrieNode};

/// Nodes with at least this many tokens get a precomputed bitmap.
const HEAVY: usize = 1024;

#[derive(Debug)]
pub struct ClassTrie {
    pub nodes: Vec<TrieNode>,
    pub token_ids: Vec<u32>,
    pub max_depth: usize,
    /// Per node: index into `bitmaps`, or `u32::MAX`.
    pub heavy: Vec<u32>,
    pub bitmaps: Vec<Box<[u32]>>,
    /// Per node: depth of its subtree below it.
    pub below: Vec<u16>,
}

/// Byte -> representative byte of its class (the smallest byte with the same DFA column),
/// and the number of classes.
pub fn byte_classes(dfa: &TableDfa) -> ([u8; 256], usize) {
    let mut seen: HashMap<Vec<StateId>, u8> = HashMap::new();
    let mut rep = [0u8; 256];
    for b in 0..=255u8 {
        let col: Vec<StateId> = dfa.states().map(|s| dfa.next(s, b)).collect();
        rep[b as usize] = *seen.entry(col).or_insert(b);
    }
    (rep, seen.len())
}

impl ClassTrie {
    pub fn build(trie: &TokenTrie, rep: &[u8; 256], words: usize) -> ClassTrie {
        let n = trie.nodes.len();
        // 1. Map every byte-trie node to its merged node (0 = root) through a dense
        //    [merged node x class] child table (few classes by construction).
        let mut class_idx = [0u8; 256];
        let mut reps: Vec<u8> = Vec::new();
        for b in 0..256 {
            let r = rep[b];
            class_idx[b] = match reps.iter().position(|&x| x == r) {
                Some(k) => k as u8,
                None => {
                    reps.push(r);
                    (reps.len() - 1) as u8
                }
            };
        }
        let nc = reps.len();
        let mut table: Vec<u32> = vec![0; nc];
        let mut edges: Vec<(u32, u8, u32)> = Vec::new(); // (parent, class byte, child)
        let mut merged_of = Vec::with_capacity(n);
        let mut count = 1u32;
        let mut stack = vec![0u32; trie.max_depth + 1];
        for node in &trie.nodes {
            let d = node.depth as usize;
            let parent = stack[d - 1];
            let slot = parent as usize * nc + class_idx[node.byte as usize] as usize;
            let mut child = table[slot];
            if child == 0 {
                child = count;
                count += 1;
                table[slot] = child;
                table.resize(table.len() + nc, 0);
                edges.push((parent, rep[node.byte as usize], child));
            }
            stack[d] = child;
            merged_of.push(child);
        }
        let m = count as usize;
        // 2. Tokens per merged node (CSR).
        let mut tok_count = vec![0u32; m + 1];
        for (i, &k) in merged_of.iter().enumerate() {
            tok_count[k as usize + 1] += trie.tok_start[i + 1] - trie.tok_start[i];
        }
        for k in 0..m {
            tok_count[k + 1] += tok_count[k];
        }
        let mut fill = tok_count.clone();
        let mut toks = vec![0u32; trie.token_ids.len()];
        for (i, &k) in merged_of.iter().enumerate() {
            let k = k as usize;
            for &t in &trie.token_ids[trie.tok_start[i] as usize..trie.tok_start[i + 1] as usize] {
                toks[fill[k] as usize] = t;
                fill[k] += 1;
            }
        }
        // 3. Children per merged node (CSR, ordered by class byte).
        edges.sort_unstable_by_key(|&(p, c, _)| (p, c));
        let mut child_start = vec![0u32; m + 1];
        for &(p, _, _) in &edges {
            child_start[p as usize + 1] += 1;
        }
        for k in 0..m {
            child_start[k + 1] += child_start[k];
        }
        // 4. Preorder layout by an iterative DFS.
        let mut nodes: Vec<TrieNode> = Vec::with_capacity(m);
        let mut token_ids = Vec::with_capacity(toks.len());
        let mut heavy = Vec::with_capacity(m);
        let mut bitmaps = Vec::new();
        let mut max_depth = 0;
        let mut work: Vec<(u32, u8, u16)> = Vec::new();
        let mut open: Vec<usize> = Vec::new();
        let kids = |k: usize| &edges[child_start[k] as usize..child_start[k + 1] as usize];
        for &(_, c, id) in kids(0).iter().rev() {
            work.push((id, c, 1));
        }
        while let Some((id, c, depth)) = work.pop() {
            while let Some(&top) = open.last() {
                if nodes[top].depth >= depth {
                    nodes[top].end = nodes.len() as u32;
                    open.pop();
                } else {
                    break;
                }
            }
            let k = id as usize;
            let mine = &toks[tok_count[k] as usize..tok_count[k + 1] as usize];
            open.push(nodes.len());
            nodes.push(TrieNode {
                byte: c,
                depth,
                end: 0,
                tok_start: token_ids.len() as u32,
            });
            token_ids.extend_from_slice(mine);
            if mine.len() >= HEAVY {
                let mut bm = vec![0u32; words].into_boxed_slice();
                for &t in mine {
                    bm[t as usize / 32] |= 1 << (t % 32);
                }
                heavy.push(bitmaps.len() as u32);
                bitmaps.push(bm);
            } else {
                heavy.push(u32::MAX);
            }
            max_depth = max_depth.max(depth as usize);
            for &(_, c2, id2) in kids(k).iter().rev() {
                work.push((id2, c2, depth + 1));
            }
        }
        let len = nodes.len() as u32;
        for top in open {
            nodes[top].end = len;
        }
        let below = heights_below(&nodes);
        ClassTrie {
            below,
            nodes,
            token_ids,
            max_depth,
            heavy,
            bitmaps,
        }
    }
}
