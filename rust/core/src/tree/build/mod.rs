//! Building draft trees: the DDTree best-first builder over validated marginals (rank-class
//! queues when unconstrained, one heap when a [`TokenFilter`] restricts the ranks) and trees
//! from explicit branches.

mod branches;
mod ddtree;
mod distinct;
mod marginals;
mod min_heap;
mod one_heap;

pub use branches::tree_from_branches;
pub use distinct::check_sibling_tokens;
pub use marginals::Marginals;
pub use one_heap::build_ddtree_filtered;

use super::{check_tree_size, BuiltTree, DraftTree, TreeError};

/// Restricts which tokens may extend a node (used by grammar-aware trees).
pub trait TokenFilter {
    /// May `token` follow the already emitted node `parent`?
    fn allows(&mut self, parent: usize, token: i64) -> bool;
    /// Node `node` was emitted as the child of `parent` with `token` (an allowed one).
    fn emitted(&mut self, node: usize, parent: usize, token: i64);
}

/// The filter of an unconstrained tree.
pub struct AllowAll;

impl TokenFilter for AllowAll {
    #[inline(always)]
    fn allows(&mut self, _parent: usize, _token: i64) -> bool {
        true
    }
    #[inline(always)]
    fn emitted(&mut self, _node: usize, _parent: usize, _token: i64) {}
}

/// Most nodes, root included, that a tree of `budget` drafted nodes over `rows` depths of
/// `k` candidates can hold: `budget + 1`, or every prefix plus the root when there are
/// fewer. The builders size their buffers by it, so a budget far above what the marginals
/// can fill allocates nothing extra.
pub fn max_nodes(budget: usize, rows: usize, k: usize) -> usize {
    let (mut prefixes, mut level) = (0usize, 1usize);
    for _ in 0..rows {
        level = level.saturating_mul(k);
        prefixes = prefixes.saturating_add(level);
        if prefixes >= budget {
            return budget.saturating_add(1);
        }
    }
    prefixes + 1
}

/// Build the optimal tree of at most `budget` drafted nodes under a root token.
pub fn build_ddtree(
    m: &Marginals<'_>,
    budget: usize,
    root_token: i64,
    min_logprob: Option<f64>,
) -> BuiltTree {
    ddtree::build(m, budget, root_token, min_logprob)
}

/// Validate and build in one call. Token ids are range-checked where the tree uses them:
/// an id outside [0, 2^31) that enters the tree is an error, one in a column the tree never
/// reaches is not read. A parent given two children with the same token id is an error
/// ([`TreeError::DuplicateToken`], naming the row and both columns); an id repeated where
/// it never gives one parent two children is accepted, as the tree is then the one the
/// repeat-free marginals give (see `distinct.rs`).
pub fn build_checked(
    logprobs: &[f32],
    token_ids: &[i64],
    depth: usize,
    width: usize,
    budget: i64,
    root_token: i64,
    min_logprob: Option<f64>,
) -> Result<BuiltTree, TreeError> {
    build_checked_with(
        logprobs,
        token_ids,
        depth,
        width,
        budget,
        root_token,
        min_logprob,
        true,
    )
}

/// As [`build_checked`] (what the bindings use); `check_duplicates: false` skips the
/// duplicate-id check on the built tree, for callers whose ids are distinct by
/// construction, such as a top-K's indices.
#[allow(clippy::too_many_arguments)]
pub fn build_checked_with(
    logprobs: &[f32],
    token_ids: &[i64],
    depth: usize,
    width: usize,
    budget: i64,
    root_token: i64,
    min_logprob: Option<f64>,
    check_duplicates: bool,
) -> Result<BuiltTree, TreeError> {
    let used = marginals::budget_columns(width, budget)?;
    let m = Marginals::with_columns(logprobs, token_ids, depth, width, used, false)?;
    check_tree_size(max_nodes(budget as usize, depth, m.used_width()))?;
    if let Some(v) = min_logprob {
        if v.is_nan() {
            return Err(TreeError::Shape("min_logprob must not be NaN".into()));
        }
    }
    let built = build_ddtree(&m, budget as usize, root_token, min_logprob);
    let drafted = &built.tree.tokens[1..];
    if drafted.iter().fold(0u64, |acc, &t| acc | t as u64) >> 31 != 0 {
        return Err(out_of_range_token(&built.tree, token_ids, width));
    }
    if check_duplicates {
        distinct::check_prefix_children(&built.tree, &m)?;
    }
    Ok(built)
}

/// Name the first drafted node whose token id is out of range by its marginals entry.
#[cold]
fn out_of_range_token(tree: &DraftTree, token_ids: &[i64], width: usize) -> TreeError {
    let (node, &token) = (tree.tokens.iter().enumerate().skip(1))
        .find(|&(_, &t)| check_token(t, String::new).is_err())
        .expect("an out-of-range token was seen");
    let d = tree.depths[node] as usize - 1;
    let rank = token_ids[d * width..(d + 1) * width]
        .iter()
        .position(|&t| t == token)
        .unwrap_or(0);
    check_token(token, || format!("token_ids[{d}, {rank}]")).expect_err("the token is out of range")
}

#[inline]
pub(crate) fn check_token(token: i64, location: impl FnOnce() -> String) -> Result<(), TreeError> {
    if (0..=i32::MAX as i64).contains(&token) {
        Ok(())
    } else {
        Err(TreeError::TokenOutOfRange {
            token,
            location: location(),
        })
    }
}
