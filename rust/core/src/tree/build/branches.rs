//! Trees from explicit token paths (Medusa choices, static EAGLE trees).

use super::check_token;
use crate::tree::{check_tree_size, BuiltTree, DraftTree, TreeError};

/// Merge token paths into one tree under `root_token`, shared prefixes once. Nodes are
/// packed breadth-first: by depth, then by parent index, then by first appearance among the
/// branches. Branch trees carry no drafter probabilities: `logprobs` are 0 and the expected
/// acceptance is NaN.
pub fn tree_from_branches(branches: &[Vec<i64>], root_token: i64) -> Result<BuiltTree, TreeError> {
    if branches.is_empty() {
        return Err(TreeError::Shape(
            "tree_from_branches needs at least one branch".into(),
        ));
    }
    // Trie in insertion order: children[node] lists (token, trie node).
    let mut children: Vec<Vec<(i64, usize)>> = vec![Vec::new()];
    for (b, branch) in branches.iter().enumerate() {
        if branch.is_empty() {
            return Err(TreeError::Shape(format!("branch {b} is empty")));
        }
        let mut node = 0usize;
        for (d, &tok) in branch.iter().enumerate() {
            check_token(tok, || format!("branches[{b}][{d}]"))?;
            node = match children[node].iter().find(|&&(t, _)| t == tok) {
                Some(&(_, c)) => c,
                None => {
                    let c = children.len();
                    children.push(Vec::new());
                    children[node].push((tok, c));
                    c
                }
            };
        }
    }
    // Breadth-first order over the trie gives exactly the packing described above.
    let n = children.len();
    check_tree_size(n)?;
    let mut tree = DraftTree::with_root(n, root_token, false);
    let mut queue = vec![0usize];
    let mut head = 0;
    while head < queue.len() {
        let trie_node = queue[head];
        for &(tok, c) in &children[trie_node] {
            tree.push(tok, head as i32, tree.depths[head] + 1, 0.0);
            queue.push(c);
        }
        head += 1;
    }
    Ok(BuiltTree::from_tree(tree))
}
