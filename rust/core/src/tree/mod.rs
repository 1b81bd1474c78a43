//! Draft trees, by stage: [`build`] them (DDTree from drafter marginals, or from explicit
//! branches), describe them to a verifier ([`contract`]: ancestor bits, dense masks, position
//! ids, child links, retrieve indices, padding), and [`walk`](mod@walk) them with the verifier's
//! choices. The common items are re-exported here.
//!
//! Array conventions (shared with the Python layer): a tree of `n = N + 1` nodes has the
//! root (the last committed or bonus token) at index 0 with depth 0 and parent -1; drafted
//! nodes follow, and a parent's index is always smaller than its child's.

pub mod build;
pub mod contract;
mod error;
pub mod walk;

pub use build::{
    build_checked, build_checked_with, build_ddtree, build_ddtree_filtered, check_sibling_tokens,
    max_nodes, tree_from_branches, AllowAll, Marginals, TokenFilter,
};
pub use contract::{
    ancestor_bits, attention_mask, check_alloc, check_tree_size, child_links, pad_tree,
    position_ids, retrieve_indices, AncestorBits, ChildLinks, MaskValue, Padded, MAX_TREE_NODES,
};
pub use error::TreeError;
pub use walk::{walk, WalkOutcome};

/// The node arrays of a draft tree (length `n`, root first).
#[derive(Debug, Clone, PartialEq)]
pub struct DraftTree {
    pub tokens: Vec<i64>,
    pub parents: Vec<i32>,
    pub depths: Vec<i32>,
    /// Cumulative prefix log-probability under the drafter (root: 0).
    pub logprobs: Vec<f64>,
    /// False for trees from explicit branches, which carry no drafter probabilities.
    pub scored: bool,
}

impl DraftTree {
    /// A tree holding only its root, with room for `capacity` nodes (what builders fill).
    pub(crate) fn with_root(capacity: usize, root_token: i64, scored: bool) -> Self {
        let mut t = DraftTree {
            tokens: Vec::with_capacity(capacity),
            parents: Vec::with_capacity(capacity),
            depths: Vec::with_capacity(capacity),
            logprobs: Vec::with_capacity(capacity),
            scored,
        };
        t.push(root_token, -1, 0, 0.0);
        t
    }

    #[inline(always)]
    pub(crate) fn push(&mut self, token: i64, parent: i32, depth: i32, logprob: f64) {
        self.tokens.push(token);
        self.parents.push(parent);
        self.depths.push(depth);
        self.logprobs.push(logprob);
    }

    /// Number of nodes including the root.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// A tree always has its root, so it is never empty; kept for clippy's `len` rule.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Surrogate expected acceptance length (Prop. 1 of the DDTree paper): the drafted
    /// prefixes' probabilities summed; NaN for unscored trees. Computed on demand, off the
    /// build's hot path.
    pub fn expected_acceptance(&self) -> f64 {
        if !self.scored {
            return f64::NAN;
        }
        self.logprobs.iter().skip(1).map(|s| s.exp()).sum()
    }

    /// [`DraftTree::validate_structure`], also allowing padding nodes (parent -1, depth 0)
    /// after the root: arrays from Python may have been edited, and walks up the parents
    /// (retrieve indices) must end.
    pub fn validate_padded_structure(parents: &[i32], depths: &[i32]) -> Result<(), TreeError> {
        if parents.len() != depths.len() || parents.is_empty() {
            return Err(TreeError::Shape(format!(
                "parents ({}) and depths ({}) must have the same length >= 1",
                parents.len(),
                depths.len()
            )));
        }
        for (i, (&p, &d)) in parents.iter().zip(depths).enumerate() {
            let ok = if p == -1 {
                d == 0
            } else {
                p >= 0 && (p as usize) < i && d == depths[p as usize] + 1
            };
            if !ok {
                return Err(TreeError::InvalidTree(format!(
                    "node {i}: parent {p}, depth {d} (a parent must precede its child, one \
                     level up; roots and padding have parent -1 and depth 0)"
                )));
            }
        }
        Ok(())
    }

    /// Check the structural invariants of externally supplied arrays.
    pub fn validate_structure(parents: &[i32], depths: &[i32]) -> Result<(), TreeError> {
        if parents.is_empty() {
            return Err(TreeError::InvalidTree(
                "a tree needs at least its root".into(),
            ));
        }
        if parents.len() != depths.len() {
            return Err(TreeError::Shape(format!(
                "parents has {} entries but depths has {}",
                parents.len(),
                depths.len()
            )));
        }
        if parents[0] != -1 || depths[0] != 0 {
            return Err(TreeError::InvalidTree(
                "node 0 must be the root (parent -1, depth 0)".into(),
            ));
        }
        for i in 1..parents.len() {
            let p = parents[i];
            if p < 0 || p as usize >= i {
                return Err(TreeError::InvalidTree(format!(
                    "parents[{i}] = {p} must be in [0, {i})"
                )));
            }
            if depths[i] != depths[p as usize] + 1 {
                return Err(TreeError::InvalidTree(format!(
                    "depths[{i}] = {} but its parent has depth {}",
                    depths[i], depths[p as usize]
                )));
            }
        }
        Ok(())
    }
}

/// A built tree with the ancestor bits every verifier needs, computed in the same pass.
/// The child links only a walk needs are derived on request ([`BuiltTree::links`]): most
/// callers hand the bits to a verifier and never walk in Rust.
#[derive(Debug, Clone)]
pub struct BuiltTree {
    pub tree: DraftTree,
    pub bits: AncestorBits,
}

impl BuiltTree {
    pub fn from_tree(tree: DraftTree) -> Self {
        let bits = ancestor_bits(&tree.parents);
        BuiltTree { tree, bits }
    }

    /// First-child / next-sibling links for the walk.
    pub fn links(&self) -> ChildLinks {
        child_links(&self.tree.parents)
    }
}
