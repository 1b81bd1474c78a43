//! Bindings of `specdec_core::tree`. A tree crosses the boundary as one named object,
//! `TreeArrays`: its node arrays (numpy, moved out of Rust without copies), the ancestor
//! bits, the number of real (non-padding) nodes, and the walk's child links derived on first
//! use. Walk outcomes cross as `WalkOutcome`.

use numpy::{PyArray1, PyArray2, PyReadonlyArray1, PyReadonlyArray2, PyReadonlyArray3};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use rayon::prelude::*;
use specdec_core::tree::{self as core, BuiltTree, ChildLinks, DraftTree, TreeError};

use crate::arrays::{as_slice, read, shape, vec1, vec2_typed};
use crate::errors::OrRaise;

type Links = (Py<PyArray1<i32>>, Py<PyArray1<i32>>);

/// The largest dense attention mask built on request (2 GiB).
const MAX_DENSE_MASK_BYTES: usize = 1 << 31;

/// A draft tree's arrays, built and checked in Rust. `expected` is None when it is to be
/// summed from `logprobs` on demand, NaN for unscored trees (explicit branches).
#[pyclass(frozen, module = "specdec._core", name = "TreeArrays")]
pub struct TreeArrays {
    #[pyo3(get)]
    tokens: Py<PyArray1<i64>>,
    #[pyo3(get)]
    parents: Py<PyArray1<i32>>,
    #[pyo3(get)]
    depths: Py<PyArray1<i32>>,
    #[pyo3(get)]
    logprobs: Py<PyArray1<f64>>,
    #[pyo3(get)]
    bits: Py<PyArray2<u64>>,
    #[pyo3(get)]
    expected: Option<f64>,
    #[pyo3(get)]
    num_real: usize,
    links: PyOnceLock<Links>,
}

impl TreeArrays {
    pub(crate) fn from_built(py: Python<'_>, b: BuiltTree, num_real: usize) -> PyResult<Self> {
        let BuiltTree { tree, bits } = b;
        Ok(TreeArrays {
            tokens: vec1(py, tree.tokens).unbind(),
            parents: vec1(py, tree.parents).unbind(),
            depths: vec1(py, tree.depths).unbind(),
            logprobs: vec1(py, tree.logprobs).unbind(),
            bits: vec2_typed(py, bits.words, bits.rows, bits.words_per_row)?.unbind(),
            // None: Python sums exp(logprobs) lazily (vectorized) when asked; NaN: unscored.
            expected: if tree.scored { None } else { Some(f64::NAN) },
            num_real,
            links: PyOnceLock::new(),
        })
    }

    pub(crate) fn built(py: Python<'_>, b: BuiltTree) -> PyResult<Self> {
        let n = b.tree.len();
        Self::from_built(py, b, n)
    }

    pub(crate) fn tokens<'py>(&self, py: Python<'py>) -> &Bound<'py, PyArray1<i64>> {
        self.tokens.bind(py)
    }

    pub(crate) fn parents<'py>(&self, py: Python<'py>) -> &Bound<'py, PyArray1<i32>> {
        self.parents.bind(py)
    }

    pub(crate) fn depths<'py>(&self, py: Python<'py>) -> &Bound<'py, PyArray1<i32>> {
        self.depths.bind(py)
    }

    pub(crate) fn logprobs<'py>(&self, py: Python<'py>) -> &Bound<'py, PyArray1<f64>> {
        self.logprobs.bind(py)
    }

    /// False for trees without drafter probabilities (explicit branches: expected NaN).
    pub(crate) fn scored(&self) -> bool {
        self.expected.is_none_or(|e| !e.is_nan())
    }

    pub(crate) fn num_real(&self) -> usize {
        self.num_real
    }

    fn links<'py>(&'py self, py: Python<'py>) -> PyResult<&'py Links> {
        self.links.get_or_try_init(py, || {
            let parents = read(self.parents.bind(py))?;
            let parents = as_slice(&parents);
            // The arrays are numpy's: a caller may have edited them since the build, and a
            // parent that does not precede its child would make the walk loop.
            if let Some((i, &p)) =
                (parents.iter().enumerate()).find(|&(i, &p)| p < -1 || p >= i as i32)
            {
                return Err(TreeError::InvalidTree(format!(
                    "parents[{i}] = {p} must be -1 or in [0, {i})"
                )))
                .or_raise();
            }
            let l = core::child_links(&parents);
            Ok((
                vec1(py, l.first_child).unbind(),
                vec1(py, l.next_sibling).unbind(),
            ))
        })
    }

    /// The real nodes as a core tree (padding dropped).
    fn real_tree(&self, py: Python<'_>) -> PyResult<DraftTree> {
        let k = self.num_real;
        Ok(DraftTree {
            tokens: as_slice(&read(self.tokens.bind(py))?)[..k].to_vec(),
            parents: as_slice(&read(self.parents.bind(py))?)[..k].to_vec(),
            depths: as_slice(&read(self.depths.bind(py))?)[..k].to_vec(),
            logprobs: as_slice(&read(self.logprobs.bind(py))?)[..k].to_vec(),
            scored: self.scored(),
        })
    }

    /// Walk with the verifier's choices (`chosen` has at least one entry per node).
    fn walk_with(&self, py: Python<'_>, chosen: &[i64]) -> PyResult<core::WalkOutcome> {
        let (fc, ns) = self.links(py)?;
        let links = ChildLinks {
            first_child: as_slice(&read(fc.bind(py))?).into_owned(),
            next_sibling: as_slice(&read(ns.bind(py))?).into_owned(),
        };
        core::walk(&as_slice(&read(self.tokens.bind(py))?), &links, chosen).or_raise()
    }
}

/// Depths from parents: a real node is one deeper than its parent; a root or padding node
/// (parent -1) has depth 0.
fn derive_depths(parents: &[i32]) -> Result<Vec<i32>, TreeError> {
    let mut depths = Vec::with_capacity(parents.len());
    for (i, &p) in parents.iter().enumerate() {
        let d = match p {
            -1 => 0,
            p if p >= 0 && (p as usize) < i => depths[p as usize] + 1,
            p => {
                return Err(TreeError::InvalidTree(format!(
                    "parents[{i}] = {p} must be -1 or in [0, {i})"
                )))
            }
        };
        depths.push(d);
    }
    Ok(depths)
}

/// Bits past the last node would index past the mask's columns (the arrays are numpy's and
/// may have been edited since the build).
fn check_bits(b: &core::AncestorBits) -> Result<(), TreeError> {
    if b.words_per_row * 64 < b.rows {
        return Err(TreeError::Shape(format!(
            "ancestor bits [{}, {}] have too few words per row",
            b.rows, b.words_per_row
        )));
    }
    let (n, last) = (b.rows, b.rows / 64);
    let stray = |i: &usize| {
        b.row(*i)[last..].iter().enumerate().any(|(w, &word)| {
            let allowed = if w == 0 && n % 64 != 0 {
                (1u64 << (n % 64)) - 1
            } else {
                0
            };
            word & !allowed != 0
        })
    };
    match (0..n).find(stray) {
        Some(i) => Err(TreeError::InvalidTree(format!(
            "ancestor bits row {i} names a node at or past {n}"
        ))),
        None => Ok(()),
    }
}

/// Real nodes first (root at 0, each parent earlier, depth = parent's + 1), then padding
/// (parent -1, depth 0) only. Returns the number of real nodes.
fn check_arrays(parents: &[i32], depths: &[i32]) -> Result<usize, TreeError> {
    DraftTree::validate_padded_structure(parents, depths)?;
    let num_real = (1..parents.len())
        .find(|&i| parents[i] == -1)
        .unwrap_or(parents.len());
    if let Some(i) = (num_real..parents.len()).find(|&i| parents[i] != -1) {
        return Err(TreeError::InvalidTree(format!(
            "node {i} has parent {} after padding node {num_real}: padding comes last",
            parents[i]
        )));
    }
    core::check_tree_size(parents.len())?;
    Ok(num_real)
}

#[pymethods]
impl TreeArrays {
    /// Check node arrays given from outside and derive the ancestor bits (depths are derived
    /// from the parents when omitted; log-probs default to 0).
    #[new]
    #[pyo3(signature = (tokens, parents, depths=None, logprobs=None, expected=None))]
    fn new(
        py: Python<'_>,
        tokens: PyReadonlyArray1<'_, i64>,
        parents: PyReadonlyArray1<'_, i32>,
        depths: Option<PyReadonlyArray1<'_, i32>>,
        logprobs: Option<PyReadonlyArray1<'_, f64>>,
        expected: Option<f64>,
    ) -> PyResult<Self> {
        let tokens = as_slice(&tokens).into_owned();
        let parents = as_slice(&parents).into_owned();
        let n = tokens.len();
        let same = |what: &str, len: usize| {
            if len == n {
                Ok(())
            } else {
                Err(TreeError::Shape(format!(
                    "{what} has {len} entries, tokens has {n}"
                )))
            }
        };
        same("parents", parents.len()).or_raise()?;
        let depths = match depths {
            Some(d) => as_slice(&d).into_owned(),
            None => derive_depths(&parents).or_raise()?,
        };
        same("depths", depths.len()).or_raise()?;
        let logprobs = match logprobs {
            Some(l) => as_slice(&l).into_owned(),
            None => vec![0.0; n],
        };
        same("logprobs", logprobs.len()).or_raise()?;
        let num_real = check_arrays(&parents, &depths).or_raise()?;
        let bits = core::ancestor_bits(&parents);
        let tree = DraftTree {
            tokens,
            parents,
            depths,
            logprobs,
            scored: true,
        };
        let mut out = Self::from_built(py, BuiltTree { tree, bits }, num_real)?;
        out.expected = expected;
        Ok(out)
    }

    /// int32 first child of each node (-1 = leaf), derived on first use.
    #[getter]
    fn first_child(&self, py: Python<'_>) -> PyResult<Py<PyArray1<i32>>> {
        Ok(self.links(py)?.0.clone_ref(py))
    }

    /// int32 next child of the same parent, in index order (-1 = last).
    #[getter]
    fn next_sibling(&self, py: Python<'_>) -> PyResult<Py<PyArray1<i32>>> {
        Ok(self.links(py)?.1.clone_ref(py))
    }

    /// Dense `[n, prefix_len + n]` mask: bool, or float32 additive (0 / -inf).
    #[pyo3(signature = (prefix_len, additive=false))]
    fn attention_mask<'py>(
        &self,
        py: Python<'py>,
        prefix_len: usize,
        additive: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let bits = read(self.bits.bind(py))?;
        let s = shape(&bits);
        let b = core::AncestorBits {
            rows: s[0],
            words_per_row: s[1],
            words: as_slice(&bits).into_owned(),
        };
        check_bits(&b).or_raise()?;
        let cols = prefix_len.checked_add(b.rows);
        let elem = if additive { 4 } else { 1 };
        let bytes = cols.and_then(|c| c.checked_mul(b.rows)?.checked_mul(elem));
        // A dense mask this large is a mistake (or a 100M-token context, where only the
        // ancestor bits or a block mask make sense): refuse it rather than fill gigabytes.
        if bytes.is_none_or(|b| b > MAX_DENSE_MASK_BYTES) {
            return Err(TreeError::TooLarge(format!(
                "a dense [{}, {prefix_len} + {}] mask takes over {} GiB: use the ancestor bits",
                b.rows,
                b.rows,
                MAX_DENSE_MASK_BYTES >> 30
            )))
            .or_raise();
        }
        core::check_alloc("the dense attention mask", b.rows, bytes).or_raise()?;
        let cols = prefix_len + b.rows;
        Ok(if additive {
            vec2_typed(
                py,
                core::attention_mask::<f32>(&b, prefix_len),
                b.rows,
                cols,
            )?
            .into_any()
        } else {
            vec2_typed(
                py,
                core::attention_mask::<bool>(&b, prefix_len),
                b.rows,
                cols,
            )?
            .into_any()
        })
    }

    /// int64 `prefix_len + depth` per node (RoPE positions follow depth).
    fn position_ids<'py>(&self, py: Python<'py>, prefix_len: i64) -> PyResult<Bound<'py, PyAny>> {
        if prefix_len < 0 {
            return Err(TreeError::Shape(format!(
                "prefix_len must be >= 0, got {prefix_len}"
            )))
            .or_raise();
        }
        let depths = read(self.depths.bind(py))?;
        let depths = as_slice(&depths);
        let deepest = depths.iter().copied().max().unwrap_or(0);
        if prefix_len.checked_add(deepest.into()).is_none() {
            return Err(TreeError::Shape(format!(
                "prefix_len {prefix_len} + depth {deepest} overflows int64"
            )))
            .or_raise();
        }
        Ok(vec1(py, core::position_ids(&depths, prefix_len)).into_any())
    }

    /// One row per leaf, root to leaf, padded with -1 (padding nodes are not leaves).
    fn retrieve_indices<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let (parents, depths) = (read(self.parents.bind(py))?, read(self.depths.bind(py))?);
        let (parents, depths) = (as_slice(&parents), as_slice(&depths));
        // The arrays are numpy's: a caller may have edited them since the build.
        DraftTree::validate_padded_structure(&parents, &depths).or_raise()?;
        let (rows, cols, data) = core::retrieve_indices(&parents, &depths);
        Ok(vec2_typed(py, data, rows, cols)?.into_any())
    }

    /// The real nodes padded to `budget` drafted nodes (`budget + 1` in all); a padded tree
    /// may be padded again to any budget that holds its real nodes.
    fn padded(&self, py: Python<'_>, budget: usize, pad_token: i64) -> PyResult<Self> {
        let tree = self.real_tree(py)?;
        DraftTree::validate_structure(&tree.parents, &tree.depths).or_raise()?;
        let padded = core::pad_tree(&tree, budget, pad_token).or_raise()?;
        let mut out = Self::from_built(py, BuiltTree::from_tree(padded.tree), padded.num_real)?;
        out.expected = self.expected;
        Ok(out)
    }

    /// The same tree with the root's token set (a copy of the tokens; the other arrays are
    /// shared).
    fn with_root(&self, py: Python<'_>, token: i64) -> PyResult<Self> {
        check_root(token).or_raise()?;
        let mut tokens = read(self.tokens.bind(py))?.as_array().to_vec();
        if let Some(t) = tokens.first_mut() {
            *t = token;
        }
        let links = PyOnceLock::new();
        if let Some((fc, ns)) = self.links.get(py) {
            let _ = links.set(py, (fc.clone_ref(py), ns.clone_ref(py)));
        }
        Ok(TreeArrays {
            tokens: vec1(py, tokens).unbind(),
            parents: self.parents.clone_ref(py),
            depths: self.depths.clone_ref(py),
            logprobs: self.logprobs.clone_ref(py),
            bits: self.bits.clone_ref(py),
            expected: self.expected,
            num_real: self.num_real,
            links,
        })
    }

    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        self.tokens.bind(py).len()
    }
}

/// The verifier walk's outcome: accepted node indices (root excluded, root to leaf) and
/// the bonus token.
#[pyclass(frozen, module = "specdec._core", name = "WalkOutcome")]
pub struct WalkOutcome {
    #[pyo3(get)]
    accepted: Py<PyArray1<i32>>,
    #[pyo3(get)]
    bonus_token: i64,
}

impl WalkOutcome {
    fn new(py: Python<'_>, o: core::WalkOutcome) -> Self {
        WalkOutcome {
            accepted: vec1(py, o.accepted).unbind(),
            bonus_token: o.bonus,
        }
    }
}

fn check_root(root_token: i64) -> Result<(), TreeError> {
    if root_token < -1 || root_token > i32::MAX as i64 {
        return Err(TreeError::TokenOutOfRange {
            token: root_token,
            location: "root_token".into(),
        });
    }
    Ok(())
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
#[pyo3(signature = (logprobs, token_ids, budget, root_token=-1, min_logprob=None, check_duplicates=true))]
fn build_ddtree(
    py: Python<'_>,
    logprobs: PyReadonlyArray2<'_, f32>,
    token_ids: PyReadonlyArray2<'_, i64>,
    budget: i64,
    root_token: i64,
    min_logprob: Option<f64>,
    check_duplicates: bool,
) -> PyResult<TreeArrays> {
    let (l, k) = check_single_build(&logprobs, &token_ids, root_token, min_logprob).or_raise()?;
    let (lp, ids) = (as_slice(&logprobs), as_slice(&token_ids));
    let built = core::build_checked_with(
        &lp,
        &ids,
        l,
        k,
        budget,
        root_token,
        min_logprob,
        check_duplicates,
    )
    .or_raise()?;
    TreeArrays::built(py, built)
}

/// Build R trees from `[R, L, K]` marginals in parallel, each with its own budget.
#[pyfunction]
#[pyo3(signature = (logprobs, token_ids, budgets, root_tokens=None, min_logprob=None, check_duplicates=true))]
fn build_ddtree_batch(
    py: Python<'_>,
    logprobs: PyReadonlyArray3<'_, f32>,
    token_ids: PyReadonlyArray3<'_, i64>,
    budgets: PyReadonlyArray1<'_, i64>,
    root_tokens: Option<PyReadonlyArray1<'_, i64>>,
    min_logprob: Option<f64>,
    check_duplicates: bool,
) -> PyResult<Vec<TreeArrays>> {
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
    if min_logprob.is_some_and(f64::is_nan) {
        return Err(TreeError::Shape("min_logprob must not be NaN".into())).or_raise();
    }
    let (lp, ids) = (as_slice(&logprobs), as_slice(&token_ids));
    let (lp, ids): (&[f32], &[i64]) = (&lp, &ids);
    let stride = l * k;
    let built: Vec<BuiltTree> = py
        .detach(|| {
            (0..r)
                .into_par_iter()
                .map(|i| {
                    let span = i * stride..(i + 1) * stride;
                    core::build_checked_with(
                        &lp[span.clone()],
                        &ids[span],
                        l,
                        k,
                        budgets[i],
                        roots[i],
                        min_logprob,
                        check_duplicates,
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
    built
        .into_iter()
        .map(|b| TreeArrays::built(py, b))
        .collect()
}

/// Merge explicit token paths into a tree.
#[pyfunction]
#[pyo3(signature = (branches, root_token=-1))]
fn tree_from_branches(
    py: Python<'_>,
    branches: Vec<Vec<i64>>,
    root_token: i64,
) -> PyResult<TreeArrays> {
    check_root(root_token).or_raise()?;
    TreeArrays::built(
        py,
        core::tree_from_branches(&branches, root_token).or_raise()?,
    )
}

/// Walk one tree with the verifier's chosen token at every node.
#[pyfunction]
fn walk(
    py: Python<'_>,
    tree: &TreeArrays,
    chosen: PyReadonlyArray1<'_, i64>,
) -> PyResult<WalkOutcome> {
    let out = tree.walk_with(py, &as_slice(&chosen))?;
    Ok(WalkOutcome::new(py, out))
}

/// Walk R trees; `chosen` is `[R, n_max]` (row i uses its first `n_i` entries).
#[pyfunction]
fn walk_batch(
    py: Python<'_>,
    trees: Vec<PyRef<'_, TreeArrays>>,
    chosen: PyReadonlyArray2<'_, i64>,
) -> PyResult<Vec<WalkOutcome>> {
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
    let cols = s[1];
    trees
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let out = t.walk_with(py, &chosen[i * cols..(i + 1) * cols])?;
            Ok(WalkOutcome::new(py, out))
        })
        .collect()
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<TreeArrays>()?;
    m.add_class::<WalkOutcome>()?;
    m.add_function(wrap_pyfunction!(build_ddtree, m)?)?;
    m.add_function(wrap_pyfunction!(build_ddtree_batch, m)?)?;
    m.add_function(wrap_pyfunction!(tree_from_branches, m)?)?;
    m.add_function(wrap_pyfunction!(walk, m)?)?;
    m.add_function(wrap_pyfunction!(walk_batch, m)?)?;
    Ok(())
}
