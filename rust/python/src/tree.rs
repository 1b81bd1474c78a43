//! Bindings of `specdec_core::tree`. Trees cross the boundary as tuples of numpy arrays
//! `(tokens, parents, depths, logprobs, ancestor_bits, expected_acceptance or None =
//! compute from logprobs)`; the Python `DraftTree` holds them and asks `child_links` for the
//! walk's links when first needed.

use numpy::{PyReadonlyArray1, PyReadonlyArray2, PyReadonlyArray3};
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use rayon::prelude::*;
use specdec_core::tree::{self as core, BuiltTree, ChildLinks, DraftTree, TreeError};

use crate::arrays::{as_slice, shape, vec1, vec2};
use crate::errors::OrRaise;

fn check_root(root_token: i64) -> Result<(), TreeError> {
    if root_token < -1 || root_token > i32::MAX as i64 {
        return Err(TreeError::TokenOutOfRange {
            token: root_token,
            location: "root_token".into(),
        });
    }
    Ok(())
}

pub(crate) fn built_to_py<'py>(py: Python<'py>, b: BuiltTree) -> PyResult<Bound<'py, PyTuple>> {
    let BuiltTree { tree, bits } = b;
    let items: Vec<Bound<'py, PyAny>> = vec![
        vec1(py, tree.tokens).into_any(),
        vec1(py, tree.parents).into_any(),
        vec1(py, tree.depths).into_any(),
        vec1(py, tree.logprobs).into_any(),
        vec2(py, bits.words, bits.rows, bits.words_per_row)?,
        // None: Python sums exp(logprobs) lazily (vectorized) when asked; NaN: unscored.
        if tree.scored {
            py.None().into_bound(py)
        } else {
            f64::NAN.into_pyobject(py)?.into_any()
        },
    ];
    PyTuple::new(py, items)
}

/// Checks shared by the plain and the grammar-aware single builds: one `[L, K]` shape for
/// both arrays, a root token in range, no NaN threshold. Returns (L, K).
pub(crate) fn check_single_build(
    logprobs: &PyReadonlyArray2<'_, f32>,
    token_ids: &PyReadonlyArray2<'_, i64>,
    root_token: i64,
    min_logprob: Option<f64>,
) -> Result<(usize, usize), TreeError> {
    let (ls, ts) = (shape(logprobs), shape(token_ids));
    if ls != ts {
        return Err(TreeError::Shape(format!(
            "logprobs {ls:?} and token_ids {ts:?} must have the same [L, K] shape"
        )));
    }
    check_root(root_token)?;
    if min_logprob.is_some_and(f64::is_nan) {
        return Err(TreeError::Shape("min_logprob must not be NaN".into()));
    }
    Ok((ls[0], ls[1]))
}

/// Build one DDTree from `[L, K]` marginals.
#[pyfunction]
#[pyo3(signature = (logprobs, token_ids, budget, root_token=-1, min_logprob=None))]
fn build_ddtree<'py>(
    py: Python<'py>,
    logprobs: PyReadonlyArray2<'py, f32>,
    token_ids: PyReadonlyArray2<'py, i64>,
    budget: i64,
    root_token: i64,
    min_logprob: Option<f64>,
) -> PyResult<Bound<'py, PyTuple>> {
    let (l, k) = check_single_build(&logprobs, &token_ids, root_token, min_logprob).or_raise()?;
    let (lp, ids) = (as_slice(&logprobs), as_slice(&token_ids));
    let built = core::build_checked(&lp, &ids, l, k, budget, root_token, min_logprob).or_raise()?;
    built_to_py(py, built)
}

/// Build R trees from `[R, L, K]` marginals in parallel, each with its own budget.
#[pyfunction]
#[pyo3(signature = (logprobs, token_ids, budgets, root_tokens=None, min_logprob=None))]
fn build_ddtree_batch<'py>(
    py: Python<'py>,
    logprobs: PyReadonlyArray3<'py, f32>,
    token_ids: PyReadonlyArray3<'py, i64>,
    budgets: PyReadonlyArray1<'py, i64>,
    root_tokens: Option<PyReadonlyArray1<'py, i64>>,
    min_logprob: Option<f64>,
) -> PyResult<Vec<Bound<'py, PyTuple>>> {
    let (ls, ts) = (shape(&logprobs), shape(&token_ids));
    let budgets = as_slice(&budgets);
    let (r, l, k) = (ls[0], ls[1], ls[2]);
    if ls != ts || budgets.len() != r {
        return Err(TreeError::Shape(format!(
            "logprobs {ls:?} and token_ids {ts:?} must both be [R, L, K] with one budget per \
             request (got {} budgets)",
            budgets.len()
        )))
        .or_raise();
    }
    let roots: Vec<i64> = match &root_tokens {
        Some(a) => as_slice(a).into_owned(),
        None => vec![-1; r],
    };
    if roots.len() != r {
        return Err(TreeError::Shape(format!(
            "{} root tokens for {r} requests",
            roots.len()
        )))
        .or_raise();
    }
    roots.iter().try_for_each(|&t| check_root(t)).or_raise()?;
    let (lp, ids) = (as_slice(&logprobs), as_slice(&token_ids));
    let (lp, ids): (&[f32], &[i64]) = (&lp, &ids);
    let stride = l * k;
    let built: Vec<BuiltTree> = py
        .detach(|| {
            (0..r)
                .into_par_iter()
                .map(|i| {
                    let span = i * stride..(i + 1) * stride;
                    core::build_checked(
                        &lp[span.clone()],
                        &ids[span],
                        l,
                        k,
                        budgets[i],
                        roots[i],
                        min_logprob,
                    )
                    .map_err(|e| match e {
                        TreeError::Shape(m) => TreeError::Shape(format!("request {i}: {m}")),
                        TreeError::Budget(b) => {
                            TreeError::Shape(format!("request {i}: budget must be >= 1, got {b}"))
                        }
                        other => TreeError::InvalidTree(format!("request {i}: {other}")),
                    })
                })
                .collect::<Result<Vec<_>, _>>()
        })
        .or_raise()?;
    built.into_iter().map(|b| built_to_py(py, b)).collect()
}

/// Merge explicit token paths into a tree.
#[pyfunction]
#[pyo3(signature = (branches, root_token=-1))]
fn tree_from_branches<'py>(
    py: Python<'py>,
    branches: Vec<Vec<i64>>,
    root_token: i64,
) -> PyResult<Bound<'py, PyTuple>> {
    check_root(root_token).or_raise()?;
    built_to_py(
        py,
        core::tree_from_branches(&branches, root_token).or_raise()?,
    )
}

/// Validate node arrays given from outside and derive the ancestor bits.
#[pyfunction]
fn tree_arrays<'py>(
    py: Python<'py>,
    parents: PyReadonlyArray1<'py, i32>,
    depths: PyReadonlyArray1<'py, i32>,
) -> PyResult<Bound<'py, PyAny>> {
    let (parents, depths) = (as_slice(&parents), as_slice(&depths));
    DraftTree::validate_structure(&parents, &depths).or_raise()?;
    core::check_tree_size(parents.len()).or_raise()?;
    let bits = core::ancestor_bits(&parents);
    vec2(py, bits.words, bits.rows, bits.words_per_row)
}

/// First-child / next-sibling links (-1 = none) of a parents array; each parent must be
/// -1 (the root, or a padding node) or an earlier node.
#[pyfunction]
fn child_links<'py>(
    py: Python<'py>,
    parents: PyReadonlyArray1<'py, i32>,
) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
    let parents = as_slice(&parents);
    if let Some((i, &p)) = (parents.iter().enumerate()).find(|&(i, &p)| p < -1 || p >= i as i32) {
        return Err(TreeError::InvalidTree(format!(
            "parents[{i}] = {p} must be -1 or in [0, {i})"
        )))
        .or_raise();
    }
    let links = core::child_links(&parents);
    Ok((
        vec1(py, links.first_child).into_any(),
        vec1(py, links.next_sibling).into_any(),
    ))
}

fn bits_from_py(bits: &PyReadonlyArray2<'_, u64>) -> core::AncestorBits {
    let s = shape(bits);
    core::AncestorBits {
        rows: s[0],
        words_per_row: s[1],
        words: as_slice(bits).into_owned(),
    }
}

/// Dense `[n, prefix_len + n]` mask: bool, or float32 additive (0 / -inf).
#[pyfunction]
#[pyo3(signature = (bits, prefix_len, additive=false))]
fn attention_mask<'py>(
    py: Python<'py>,
    bits: PyReadonlyArray2<'py, u64>,
    prefix_len: usize,
    additive: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let b = bits_from_py(&bits);
    if b.words_per_row * 64 < b.rows {
        return Err(TreeError::Shape(format!(
            "ancestor bits [{}, {}] have too few words per row",
            b.rows, b.words_per_row
        )))
        .or_raise();
    }
    // Bits past the last node would index past the mask's columns.
    let (n, last) = (b.rows, b.rows / 64);
    if let Some(i) = (0..n).find(|&i| {
        let row = b.row(i);
        row[last..].iter().enumerate().any(|(w, &word)| {
            let allowed = if w == 0 && n % 64 != 0 {
                (1u64 << (n % 64)) - 1
            } else {
                0
            };
            word & !allowed != 0
        })
    }) {
        return Err(TreeError::InvalidTree(format!(
            "ancestor bits row {i} names a node at or past {n}"
        )))
        .or_raise();
    }
    let cols = prefix_len.checked_add(b.rows);
    let elem = if additive { 4 } else { 1 };
    let bytes = cols.and_then(|c| c.checked_mul(b.rows)?.checked_mul(elem));
    core::check_alloc("the dense attention mask", b.rows, bytes).or_raise()?;
    let cols = prefix_len + b.rows;
    if additive {
        vec2(
            py,
            core::attention_mask::<f32>(&b, prefix_len),
            b.rows,
            cols,
        )
    } else {
        vec2(
            py,
            core::attention_mask::<bool>(&b, prefix_len),
            b.rows,
            cols,
        )
    }
}

/// int64 `prefix_len + depth` per node (`prefix_len` >= 0 is checked by the caller).
#[pyfunction]
fn position_ids<'py>(
    py: Python<'py>,
    depths: PyReadonlyArray1<'py, i32>,
    prefix_len: i64,
) -> Bound<'py, PyAny> {
    vec1(py, core::position_ids(&as_slice(&depths), prefix_len)).into_any()
}

/// One row per leaf, root to leaf, padded with -1.
#[pyfunction]
fn retrieve_indices<'py>(
    py: Python<'py>,
    parents: PyReadonlyArray1<'py, i32>,
    depths: PyReadonlyArray1<'py, i32>,
) -> PyResult<Bound<'py, PyAny>> {
    let (parents, depths) = (as_slice(&parents), as_slice(&depths));
    DraftTree::validate_padded_structure(&parents, &depths).or_raise()?;
    let (rows, cols, data) = core::retrieve_indices(&parents, &depths);
    vec2(py, data, rows, cols)
}

/// Pad a tree to `budget` drafted nodes (fixed shapes for CUDA graphs).
#[pyfunction]
fn pad_tree<'py>(
    py: Python<'py>,
    tokens: PyReadonlyArray1<'py, i64>,
    parents: PyReadonlyArray1<'py, i32>,
    depths: PyReadonlyArray1<'py, i32>,
    logprobs: PyReadonlyArray1<'py, f64>,
    budget: usize,
    pad_token: i64,
) -> PyResult<Bound<'py, PyTuple>> {
    let tree = DraftTree {
        tokens: as_slice(&tokens).into_owned(),
        parents: as_slice(&parents).into_owned(),
        depths: as_slice(&depths).into_owned(),
        logprobs: as_slice(&logprobs).into_owned(),
        scored: true,
    };
    DraftTree::validate_structure(&tree.parents, &tree.depths).or_raise()?;
    let padded = core::pad_tree(&tree, budget, pad_token).or_raise()?;
    built_to_py(py, BuiltTree::from_tree(padded.tree))
}

fn links_of(first_child: &[i32], next_sibling: &[i32]) -> ChildLinks {
    ChildLinks {
        first_child: first_child.to_vec(),
        next_sibling: next_sibling.to_vec(),
    }
}

/// Walk one tree with the verifier's chosen token at every node.
#[pyfunction]
fn walk<'py>(
    py: Python<'py>,
    tokens: PyReadonlyArray1<'py, i64>,
    first_child: PyReadonlyArray1<'py, i32>,
    next_sibling: PyReadonlyArray1<'py, i32>,
    chosen: PyReadonlyArray1<'py, i64>,
) -> PyResult<(Bound<'py, PyAny>, i64)> {
    let links = links_of(&as_slice(&first_child), &as_slice(&next_sibling));
    let out = core::walk(&as_slice(&tokens), &links, &as_slice(&chosen)).or_raise()?;
    Ok((vec1(py, out.accepted).into_any(), out.bonus))
}

type TreeLinks<'py> = (
    PyReadonlyArray1<'py, i64>,
    PyReadonlyArray1<'py, i32>,
    PyReadonlyArray1<'py, i32>,
);

/// Walk R trees; `chosen` is `[R, n_max]` (row i uses its first `n_i` entries).
#[pyfunction]
fn walk_batch<'py>(
    py: Python<'py>,
    trees: Vec<TreeLinks<'py>>,
    chosen: PyReadonlyArray2<'py, i64>,
) -> PyResult<Vec<(Bound<'py, PyAny>, i64)>> {
    let s = shape(&chosen);
    if s[0] != trees.len() {
        return Err(TreeError::Shape(format!(
            "chosen has {} rows for {} trees",
            s[0],
            trees.len()
        )))
        .or_raise();
    }
    let chosen = as_slice(&chosen);
    let owned: Vec<(Vec<i64>, ChildLinks)> = trees
        .iter()
        .map(|(t, f, n)| {
            (
                as_slice(t).into_owned(),
                links_of(&as_slice(f), &as_slice(n)),
            )
        })
        .collect();
    let cols = s[1];
    let outs = py
        .detach(|| {
            owned
                .iter()
                .enumerate()
                .map(|(i, (t, l))| core::walk(t, l, &chosen[i * cols..(i + 1) * cols]))
                .collect::<Result<Vec<_>, _>>()
        })
        .or_raise()?;
    Ok(outs
        .into_iter()
        .map(|o| (vec1(py, o.accepted).into_any(), o.bonus))
        .collect())
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(build_ddtree, m)?)?;
    m.add_function(wrap_pyfunction!(build_ddtree_batch, m)?)?;
    m.add_function(wrap_pyfunction!(tree_from_branches, m)?)?;
    m.add_function(wrap_pyfunction!(tree_arrays, m)?)?;
    m.add_function(wrap_pyfunction!(child_links, m)?)?;
    m.add_function(wrap_pyfunction!(attention_mask, m)?)?;
    m.add_function(wrap_pyfunction!(retrieve_indices, m)?)?;
    m.add_function(wrap_pyfunction!(position_ids, m)?)?;
    m.add_function(wrap_pyfunction!(pad_tree, m)?)?;
    m.add_function(wrap_pyfunction!(walk, m)?)?;
    m.add_function(wrap_pyfunction!(walk_batch, m)?)?;
    Ok(())
}
