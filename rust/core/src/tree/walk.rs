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
///
/// The links may come from edited arrays, so each is checked before it is followed: a
/// child must lie after its parent and a sibling after the previous child, both inside the
/// tree. Indices then only grow, so the walk ends (no cycle) and never reads out of bounds;
/// a link that breaks the rule is [`TreeError::InvalidTree`]. A negative link ends a list.
pub fn walk(tokens: &[i64], links: &ChildLinks, chosen: &[i64]) -> Result<WalkOutcome, TreeError> {
    let n = tokens.len();
    if chosen.len() < n || links.first_child.len() != n || links.next_sibling.len() != n {
        return Err(TreeError::Shape(format!(
            "walk needs one chosen token per node: tree has {n} nodes, got {} choices",
            chosen.len()
        )));
    }
    if n == 0 {
        return Err(TreeError::InvalidTree(
            "a tree needs at least its root".into(),
        ));
    }
    // Slices of length exactly `n`, so an index checked `< n` needs no second bounds check.
    let (chosen, first_child, next_sibling) = (
        &chosen[..n],
        &links.first_child[..n],
        &links.next_sibling[..n],
    );
    let mut accepted = Vec::new();
    let mut node = 0usize;
    loop {
        let want = chosen[node];
        let mut link = first_child[node];
        // The last index read: the parent, then each sibling in turn.
        let mut after = node;
        let child = loop {
            let Ok(c) = usize::try_from(link) else {
                return Ok(WalkOutcome {
                    accepted,
                    bonus: want,
                });
            };
            if c <= after || c >= n {
                return Err(bad_link(node, after, link, n));
            }
            if tokens[c] == want {
                break c;
            }
            after = c;
            link = next_sibling[c];
        };
        accepted.push(link);
        node = child;
    }
}

/// The error for link `link` read at index `at` while looking for a child of `node`.
#[cold]
fn bad_link(node: usize, at: usize, link: i32, n: usize) -> TreeError {
    let (name, rule) = if at == node {
        ("first_child", "a child comes after its parent")
    } else {
        ("next_sibling", "a sibling comes after the previous child")
    };
    TreeError::InvalidTree(format!(
        "{name}[{at}] = {link} (children of node {node}) must be in ({at}, {n}): {rule}, \
         inside the tree"
    ))
}
