//! Padding a tree to a fixed node count (static shapes for compiled verifiers).

use super::check_tree_size;
use crate::tree::{DraftTree, TreeError};

/// A tree padded to a fixed node count; padding nodes see only themselves, have parent -1
/// and depth 0, and are nobody's child, so a walk never accepts them.
#[derive(Debug, Clone)]
pub struct Padded {
    pub tree: DraftTree,
    pub num_real: usize,
}

pub fn pad_tree(tree: &DraftTree, budget: usize, pad_token: i64) -> Result<Padded, TreeError> {
    let n = tree.len();
    let drafted = n.saturating_sub(1);
    if drafted > budget {
        return Err(TreeError::PadTooSmall { drafted, budget });
    }
    let total = budget.saturating_add(1);
    check_tree_size(total)?;
    let mut t = tree.clone();
    t.tokens.resize(total, pad_token);
    t.parents.resize(total, -1);
    t.depths.resize(total, 0);
    t.logprobs.resize(total, f64::NEG_INFINITY);
    Ok(Padded {
        tree: t,
        num_real: n,
    })
}
