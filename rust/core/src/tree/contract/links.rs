//! Child links: what the walk follows from a node to its children.

/// First-child / next-sibling links (-1 = none); children keep index order, which for a
/// DDTree is non-increasing log-prob. This is the layout SGLang's tree kernels and
/// xgrammar's `traverse_draft_tree` take.
#[derive(Debug, Clone, PartialEq)]
pub struct ChildLinks {
    pub first_child: Vec<i32>,
    pub next_sibling: Vec<i32>,
}

pub fn child_links(parents: &[i32]) -> ChildLinks {
    let n = parents.len();
    let mut first_child = vec![-1i32; n];
    let mut next_sibling = vec![-1i32; n];
    // Walk backwards, prepending each child to its parent's list: children end up in index
    // order without a last-child array.
    for (i, &p) in parents.iter().enumerate().skip(1).rev() {
        if p < 0 {
            continue; // padding node: nobody's child
        }
        let p = p as usize;
        next_sibling[i] = first_child[p];
        first_child[p] = i as i32;
    }
    ChildLinks {
        first_child,
        next_sibling,
    }
}
