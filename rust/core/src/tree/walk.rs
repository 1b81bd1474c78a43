//! The verifier walk: follow the verifier's chosen tokens down the tree; the first miss is
//! the bonus token.

use super::{ChildLinks, TreeError};

/// Result of walking a tree with the verifier's choices.
#[derive(Debug, Clone, PartialEq)]
pub struct WalkOutcome {
    /// Accepted node indices in root-to-leaf order (root excluded).
    pub accepted: Vec<i32>,
    /// The verifier's token at the last accepted node (or the root), which is not in the tree.
    pub bonus: i64,
}

/// Descend from the root while the token the verifier chose at the current node is one of
/// its children; the first miss is the bonus token. `chosen[i]` is the verifier's token at
/// node i (its argmax, or one sample from its distribution).
pub fn walk(tokens: &[i64], links: &ChildLinks, chosen: &[i64]) -> Result<WalkOutcome, TreeError> {
    let n = tokens.len();
    if chosen.len() < n || links.first_child.len() != n || links.next_sibling.len() != n {
        return Err(TreeError::Shape(format!(
            "walk needs one chosen token per node: tree has {n} nodes, got {} choices",
            chosen.len()
        )));
    }
    let mut accepted = Vec::new();
    let mut node = 0usize;
    loop {
        let want = chosen[node];
        let mut child = links.first_child[node];
        while child >= 0 && tokens[child as usize] != want {
            child = links.next_sibling[child as usize];
        }
        if child < 0 {
            return Ok(WalkOutcome {
                accepted,
                bonus: want,
            });
        }
        if child as usize <= node || child as usize >= n {
            return Err(TreeError::InvalidTree(format!(
                "child link {child} of node {node} does not point forward"
            )));
        }
        accepted.push(child);
        node = child as usize;
    }
}
