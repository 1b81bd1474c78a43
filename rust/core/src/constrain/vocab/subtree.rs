//! Per-node summaries of the token trie that let an automaton walk settle a whole subtree
//! without visiting it: which ASCII bytes occur below a node, and whether the node's subtree
//! (and what lies below the node) is valid UTF-8. A string lexeme's body state loops on
//! nearly every ASCII byte and decodes UTF-8 characters back to itself, so for it almost
//! every subtree is "all alive" and a walk of a 131k vocabulary visits a few thousand nodes
//! instead of a quarter of a million. One small record per node, beside the trie's own, so
//! a walk that jumps over subtrees touches two cache lines per visit.

use super::trie::TrieNode;
use super::utf8;

/// The subtree from the node's byte on is valid UTF-8 read from a character boundary (a
/// token's last character may be cut short).
const UTF8: u8 = 1;
/// The same for each child's subtree (what follows the node's byte).
const KIDS_UTF8: u8 = 2;

#[derive(Debug, Clone, Copy, Default)]
pub struct NodeInfo {
    /// Bit `b` set when ASCII byte `b` occurs below the node (in a child's subtree).
    kids_ascii: [u64; 2],
    /// Bit `b - 0xC0` set when UTF-8 lead byte `b` occurs below the node.
    kids_lead: u64,
    flags: u8,
}

/// What a state lets through whole: ASCII bytes (bit per byte) and UTF-8 lead bytes (bit
/// `b - 0xC0`: every character starting with `b`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allowed {
    pub ascii: [u64; 2],
    pub lead: u64,
}

#[derive(Debug, Default)]
pub struct SubtreeSummary {
    pub info: Vec<NodeInfo>,
    /// Every token of the trie (a mask with almost all tokens alive starts from it and
    /// clears the dead ones).
    pub all: Box<[u32]>,
}

/// (ASCII bits, lead bits) of byte `b`.
#[inline]
fn bit(b: u8) -> ([u64; 2], u64) {
    match b {
        0..=63 => ([1 << b, 0], 0),
        64..=127 => ([0, 1 << (b - 64)], 0),
        0xC0..=0xFF => ([0, 0], 1 << (b - 0xC0)),
        _ => ([0, 0], 0),
    }
}

impl SubtreeSummary {
    pub fn build(nodes: &[TrieNode], token_ids: &[u32], words: usize) -> Self {
        let n = nodes.len();
        let mut info = vec![NodeInfo::default(); n];
        // Per node and UTF-8 state before its byte: is the subtree valid from there?
        let mut valid = vec![0u8; n];
        for i in (0..n).rev() {
            let node = nodes[i];
            let mut ok = 0u8;
            for u in 0..utf8::STATES as u8 {
                if utf8::next(u, node.byte).is_some() {
                    ok |= 1 << u;
                }
            }
            let mut kids = [0u64; 2];
            let mut lead = 0u64;
            let mut kids_utf8 = true;
            let mut j = i + 1;
            while j < node.end as usize {
                let (own, own_lead) = bit(nodes[j].byte);
                kids[0] |= info[j].kids_ascii[0] | own[0];
                kids[1] |= info[j].kids_ascii[1] | own[1];
                lead |= info[j].kids_lead | own_lead;
                kids_utf8 &= valid[j] & (1 << utf8::BOUNDARY) != 0;
                for u in 0..utf8::STATES as u8 {
                    if ok & (1 << u) != 0 {
                        let u2 = utf8::next(u, node.byte).expect("checked");
                        if valid[j] & (1 << u2) == 0 {
                            ok &= !(1 << u);
                        }
                    }
                }
                j = nodes[j].end as usize;
            }
            valid[i] = ok;
            let mut flags = 0;
            if ok & (1 << utf8::BOUNDARY) != 0 {
                flags |= UTF8;
            }
            if kids_utf8 {
                flags |= KIDS_UTF8;
            }
            info[i] = NodeInfo {
                kids_ascii: kids,
                kids_lead: lead,
                flags,
            };
        }
        let mut all = vec![0u32; words];
        for &t in token_ids {
            all[t as usize / 32] |= 1 << (t % 32);
        }
        SubtreeSummary {
            info,
            all: all.into(),
        }
    }

    /// Is the subtree of node `i` (byte `byte`; `kids`: only what lies below it) valid UTF-8
    /// from a boundary, with all its ASCII bytes and lead bytes in `allowed`?
    #[inline]
    pub fn fits(&self, i: usize, byte: u8, kids: bool, allowed: &Allowed) -> bool {
        let inf = &self.info[i];
        let (mut a, mut l) = (inf.kids_ascii, inf.kids_lead);
        if !kids {
            let (own, own_lead) = bit(byte);
            a = [a[0] | own[0], a[1] | own[1]];
            l |= own_lead;
        }
        let flag = if kids { KIDS_UTF8 } else { UTF8 };
        inf.flags & flag != 0
            && a[0] & !allowed.ascii[0] == 0
            && a[1] & !allowed.ascii[1] == 0
            && l & !allowed.lead == 0
    }
}
