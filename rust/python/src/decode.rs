//! Bindings of `specdec_core::decode`: the adaptive budget's statistics as a `#[pyclass]`
//! newtype; trees cross as the `TreeArrays` they already are (their arrays borrowed, not
//! copied), values and choices come back as numpy arrays.

use std::borrow::Cow;

use numpy::{PyArray1, PyArray2, PyReadonlyArray1};
use pyo3::prelude::*;
use specdec_core::decode::{self as core, Accepted, BudgetParams, Pick, TreeView, BINS, BIN_EDGES};

use crate::arrays::{as_slice, read, vec1, vec2_typed};
use crate::errors::{Class, OrRaise};
use crate::locked::Locked;
use crate::tree::TreeArrays;

/// A tree's arrays, borrowed for one call.
struct Borrowed<'py> {
    parents: PyReadonlyArray1<'py, i32>,
    depths: PyReadonlyArray1<'py, i32>,
    logprobs: Option<PyReadonlyArray1<'py, f64>>,
    num_real: usize,
}

impl<'py> Borrowed<'py> {
    fn new(py: Python<'py>, t: &TreeArrays) -> PyResult<Self> {
        Ok(Borrowed {
            parents: read(t.parents(py))?,
            depths: read(t.depths(py))?,
            logprobs: if t.scored() {
                Some(read(t.logprobs(py))?)
            } else {
                None
            },
            num_real: t.num_real(),
        })
    }
}

/// A borrowed tree's arrays as slices (contiguous arrays borrowed, others gathered once).
struct Slices<'a> {
    parents: Cow<'a, [i32]>,
    depths: Cow<'a, [i32]>,
    logprobs: Option<Cow<'a, [f64]>>,
    num_real: usize,
}

impl<'a> Slices<'a> {
    fn new(t: &'a Borrowed<'_>) -> Self {
        Slices {
            parents: as_slice(&t.parents),
            depths: as_slice(&t.depths),
            logprobs: t.logprobs.as_ref().map(as_slice),
            num_real: t.num_real,
        }
    }

    /// The core's view (which checks it before use).
    fn view(&self) -> TreeView<'_> {
        TreeView {
            parents: &self.parents,
            depths: &self.depths,
            logprobs: self.logprobs.as_deref(),
            num_real: self.num_real,
        }
    }
}

/// Lends one tree to the core for `f`: its arrays borrowed, viewed as slices.
fn with_view<R>(
    py: Python<'_>,
    tree: &TreeArrays,
    f: impl FnOnce(&TreeView<'_>) -> PyResult<R>,
) -> PyResult<R> {
    let b = Borrowed::new(py, tree)?;
    let slices = Slices::new(&b);
    f(&slices.view())
}

/// Rows of different lengths as one row-major `(data, rows, cols)`, zero-padded.
fn padded<'a>(rows: impl Iterator<Item = &'a [f64]>) -> (Vec<f64>, usize, usize) {
    let rows: Vec<&[f64]> = rows.collect();
    let cols = rows.iter().map(|r| r.len()).max().unwrap_or(0);
    let mut flat = vec![0.0; rows.len() * cols];
    for (r, row) in rows.iter().enumerate() {
        flat[r * cols..r * cols + row.len()].copy_from_slice(row);
    }
    (flat, rows.len(), cols)
}

/// `[2, bins]` per-depth-class sums as one row-major vector.
fn flat_bins(a: &[[f64; BINS]; 2]) -> Vec<f64> {
    a.iter().flatten().copied().collect()
}

fn params(prior: f64, prior_weight: f64, band_optimism: f64) -> PyResult<BudgetParams> {
    let p = BudgetParams {
        prior,
        prior_weight,
        band_optimism,
    };
    p.check().or_raise()?;
    Ok(p)
}

/// Per size, the requests' summed expected acceptance (`gains`, `[most + 1]`) and the
/// candidate each request takes (`picks`, `[requests, most + 1]`).
#[pyclass(frozen, module = "specdec._core", name = "BudgetGains")]
pub struct BudgetGains {
    #[pyo3(get)]
    gains: Py<PyArray1<f64>>,
    #[pyo3(get)]
    picks: Py<PyArray2<i64>>,
}

/// One observed tree's decided nodes: their priced values summed and how many were accepted
/// (see the core's `Tally`).
#[pyclass(frozen, module = "specdec._core", name = "BudgetTally")]
pub struct BudgetTally {
    #[pyo3(get)]
    predicted: f64,
    #[pyo3(get)]
    realised: f64,
}

impl From<specdec_core::decode::Tally> for BudgetTally {
    fn from(t: specdec_core::decode::Tally) -> Self {
        BudgetTally {
            predicted: t.predicted,
            realised: t.realised,
        }
    }
}

/// What the adaptive budget has learnt from verified steps (see `specdec.decode.budget`).
/// The shrinkage settings come with each call.
///
/// Shared across threads: every call takes the statistics' lock (see [`Locked`]), with the
/// GIL held when it is free (the calls are short). No critical section touches a Python
/// object: trees are borrowed and arguments converted before, arrays made after.
#[pyclass(frozen, module = "specdec._core", name = "BudgetStats")]
pub struct BudgetStats(Locked<core::BudgetStats>);

#[pymethods]
impl BudgetStats {
    #[new]
    fn new() -> Self {
        BudgetStats(Locked::new(core::BudgetStats::default()))
    }

    /// `[2, bins]`: per depth class (depth 1, deeper) and probability bin, the calibration
    /// ratio (accepted over predicted, shrunk).
    #[pyo3(signature = (*, prior, prior_weight, band_optimism))]
    fn calibration<'py>(
        &self,
        py: Python<'py>,
        prior: f64,
        prior_weight: f64,
        band_optimism: f64,
    ) -> PyResult<Bound<'py, PyArray2<f64>>> {
        let p = params(prior, prior_weight, band_optimism)?;
        let cal = self.0.with(py, |s| flat_bins(&s.calibration(&p)));
        vec2_typed(py, cal, 2, BINS)
    }

    /// `[bands]`: per rank band of `source`'s trees (a request's candidate position), the
    /// size calibration's factor.
    #[pyo3(signature = (bands, *, prior, prior_weight, band_optimism, source = 0))]
    fn band_factors<'py>(
        &self,
        py: Python<'py>,
        bands: usize,
        prior: f64,
        prior_weight: f64,
        band_optimism: f64,
        source: usize,
    ) -> PyResult<Bound<'py, PyArray1<f64>>> {
        let p = params(prior, prior_weight, band_optimism)?;
        let f = self.0.with(py, |s| s.band_factors(&p, source, bands));
        Ok(vec1(py, f))
    }

    /// Each drafted node's expected contribution to the acceptance length (`[num_real -
    /// 1]`); `sized=False`: before the size calibration (`source`'s, see `band_factors`).
    #[pyo3(signature = (tree, *, prior, prior_weight, band_optimism, sized=true, source = 0))]
    #[allow(clippy::too_many_arguments)]
    fn node_values<'py>(
        &self,
        py: Python<'py>,
        tree: PyRef<'py, TreeArrays>,
        prior: f64,
        prior_weight: f64,
        band_optimism: f64,
        sized: bool,
        source: usize,
    ) -> PyResult<Bound<'py, PyArray1<f64>>> {
        let p = params(prior, prior_weight, band_optimism)?;
        let mut out = Vec::new();
        with_view(py, &tree, |view| {
            self.0
                .with(py, |s| {
                    let cal = s.calibration(&p);
                    if sized {
                        s.node_values(&p, view, source, &cal, &mut out)
                    } else {
                        s.path_values(view, &cal, &mut out)
                    }
                })
                .or_raise()
        })?;
        Ok(vec1(py, out))
    }

    /// Per request (a list of its candidate trees) and size `0..=most`: the candidate
    /// ranked highest at that size (`pick`: "drafted", by the drafters' path probabilities,
    /// or "calibrated", by the node values), and the requests' summed values (`scales`: per
    /// request, one factor per candidate on its values).
    #[pyo3(signature = (
        candidates, most, *, prior, prior_weight, band_optimism, pick = "drafted", scales = None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn choose(
        &self,
        py: Python<'_>,
        candidates: Vec<Vec<PyRef<'_, TreeArrays>>>,
        most: usize,
        prior: f64,
        prior_weight: f64,
        band_optimism: f64,
        pick: &str,
        scales: Option<Vec<Vec<f64>>>,
    ) -> PyResult<BudgetGains> {
        let p = params(prior, prior_weight, band_optimism)?;
        let pick = match pick {
            "drafted" => Pick::Drafted,
            "calibrated" => Pick::Calibrated,
            other => {
                return Err(crate::errors::raise(
                    Class::Config,
                    format!("pick must be 'drafted' or 'calibrated', got {other:?}"),
                ))
            }
        };
        if most >= specdec_core::tree::MAX_TREE_NODES {
            return Err(crate::errors::raise(
                Class::Config,
                format!("most = {most} drafted nodes is more than a tree can hold"),
            ));
        }
        let flat: Vec<Borrowed<'_>> = candidates
            .iter()
            .flatten()
            .map(|t| Borrowed::new(py, t))
            .collect::<PyResult<_>>()?;
        let slices: Vec<Slices<'_>> = flat.iter().map(Slices::new).collect();
        let mut views = slices.iter().map(Slices::view);
        let reqs: Vec<Vec<TreeView<'_>>> = candidates
            .iter()
            .map(|trees| views.by_ref().take(trees.len()).collect())
            .collect();
        let c = self
            .0
            .with(py, |s| s.choose(&p, &reqs, most, pick, scales.as_deref()))
            .or_raise()?;
        let picks = c.picks.into_iter().map(|x| x as i64).collect();
        Ok(BudgetGains {
            gains: vec1(py, c.gains).unbind(),
            picks: vec2_typed(py, picks, candidates.len(), most + 1)?.unbind(),
        })
    }

    /// Learn from a verified tree of `source` (see `band_factors`): `accepted` is its
    /// accepted node indices (int64 array, root excluded) or their count (the likeliest
    /// path's first nodes).
    #[pyo3(signature = (tree, accepted, *, prior, prior_weight, band_optimism, source = 0))]
    #[allow(clippy::too_many_arguments)]
    fn observe(
        &self,
        py: Python<'_>,
        tree: PyRef<'_, TreeArrays>,
        accepted: &Bound<'_, PyAny>,
        prior: f64,
        prior_weight: f64,
        band_optimism: f64,
        source: usize,
    ) -> PyResult<BudgetTally> {
        let p = params(prior, prior_weight, band_optimism)?;
        let nodes = accepted.extract::<PyReadonlyArray1<'_, i64>>().ok();
        let nodes = nodes.as_ref().map(as_slice);
        let acc = match &nodes {
            Some(nodes) => Accepted::Nodes(nodes),
            None => Accepted::Count(crate::errors::config_arg::<usize>(accepted)?),
        };
        with_view(py, &tree, |view| {
            self.0
                .with(py, |s| s.observe(&p, view, source, acc))
                .or_raise()
        })
        .map(BudgetTally::from)
    }

    /// Learn from a drafted tree the step's rule decided beyond the nodes it verified:
    /// `path` is the tokens the step committed (int64: accepted, then the bonus), the
    /// rule's choice at each depth of its path (see the core's `Accepted::Path`); the
    /// tree is `source`'s (see `band_factors`).
    #[pyo3(signature = (tree, path, *, prior, prior_weight, band_optimism, source = 0))]
    #[allow(clippy::too_many_arguments)]
    fn observe_path(
        &self,
        py: Python<'_>,
        tree: PyRef<'_, TreeArrays>,
        path: PyReadonlyArray1<'_, i64>,
        prior: f64,
        prior_weight: f64,
        band_optimism: f64,
        source: usize,
    ) -> PyResult<BudgetTally> {
        let p = params(prior, prior_weight, band_optimism)?;
        let tokens = read(tree.tokens(py))?;
        let (tokens, path) = (as_slice(&tokens), as_slice(&path));
        let acc = Accepted::Path {
            tokens: &tokens,
            path: &path,
        };
        with_view(py, &tree, |view| {
            self.0
                .with(py, |s| s.observe(&p, view, source, acc))
                .or_raise()
        })
        .map(BudgetTally::from)
    }

    /// `[2, bins]` predicted (conditional probabilities summed) of tried nodes.
    #[getter]
    fn predicted<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<f64>>> {
        let flat = self.0.with(py, |s| flat_bins(&s.predicted));
        vec2_typed(py, flat, 2, BINS)
    }

    /// `[2, bins]` accepted tried nodes.
    #[getter]
    fn realised<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<f64>>> {
        let flat = self.0.with(py, |s| flat_bins(&s.realised));
        vec2_typed(py, flat, 2, BINS)
    }

    /// `[sources, bands]`: per source and rank band, observed nodes' values summed (0
    /// past a source's last band).
    #[getter]
    fn band_predicted<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<f64>>> {
        let (flat, rows, cols) = self.0.with(py, |s| {
            padded(s.sources.iter().map(|x| &x.band_predicted[..]))
        });
        vec2_typed(py, flat, rows, cols)
    }

    /// `[sources, bands]`: per source and rank band, observed nodes accepted.
    #[getter]
    fn band_realised<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<f64>>> {
        let (flat, rows, cols) = self.0.with(py, |s| {
            padded(s.sources.iter().map(|x| &x.band_realised[..]))
        });
        vec2_typed(py, flat, rows, cols)
    }

    /// Per depth: verified trees that reached it.
    #[getter]
    fn tried<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<f64>> {
        vec1(py, self.0.with(py, |s| s.tried.clone()))
    }

    /// Per depth: steps that accepted that deep.
    #[getter]
    fn reached<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<f64>> {
        vec1(py, self.0.with(py, |s| s.reached.clone()))
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // The bins' upper edges (the last bin's, +inf, left out): Python's CALIBRATION_BINS.
    m.add("CALIBRATION_BIN_EDGES", BIN_EDGES.to_vec())?;
    m.add_class::<BudgetStats>()?;
    m.add_class::<BudgetGains>()?;
    m.add_class::<BudgetTally>()?;
    Ok(())
}
