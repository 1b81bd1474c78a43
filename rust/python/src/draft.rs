//! Bindings of `specdec_core::draft`: `SuffixIndex` as a `#[pyclass]` newtype whose proposals
//! cross as `TreeArrays`, built with the GIL released.

use pyo3::prelude::*;
use specdec_core::draft as core;

use crate::errors::{draft_arg, OrRaise};
use crate::tree::TreeArrays;

/// A suffix index over the request's own tokens and a corpus of earlier outputs.
#[pyclass(module = "specdec._core", name = "SuffixIndex")]
pub struct SuffixIndex(core::SuffixIndex);

#[pymethods]
impl SuffixIndex {
    #[new]
    #[pyo3(signature = (max_match=8))]
    fn new(#[pyo3(from_py_with = draft_arg)] max_match: usize) -> PyResult<Self> {
        Ok(SuffixIndex(core::SuffixIndex::new(max_match).or_raise()?))
    }

    #[getter]
    fn max_match(&self) -> usize {
        self.0.max_match()
    }

    #[getter]
    fn num_corpus(&self) -> usize {
        self.0.num_corpus()
    }

    fn __len__(&self) -> usize {
        self.0.len()
    }

    /// Append tokens to the request's own sequence.
    fn extend(&mut self, #[pyo3(from_py_with = draft_arg)] tokens: Vec<i64>) -> PyResult<()> {
        self.0.extend(&tokens).or_raise()
    }

    /// Add an earlier output to the corpus; returns its id.
    fn add_corpus(&mut self, #[pyo3(from_py_with = draft_arg)] tokens: Vec<i64>) -> PyResult<u64> {
        self.0.add_corpus(&tokens).or_raise()
    }

    /// Drop a corpus sequence.
    fn remove_corpus(&mut self, #[pyo3(from_py_with = draft_arg)] id: u64) -> PyResult<()> {
        self.0.remove_corpus(id).or_raise()
    }

    /// The tree of the `budget` most frequent continuations of `context`.
    #[pyo3(signature = (context, max_depth, budget, min_prob=0.0))]
    fn propose(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = draft_arg)] context: Vec<i64>,
        #[pyo3(from_py_with = draft_arg)] max_depth: usize,
        #[pyo3(from_py_with = draft_arg)] budget: i64,
        #[pyo3(from_py_with = draft_arg)] min_prob: f64,
    ) -> PyResult<TreeArrays> {
        let index = &self.0;
        let built = py
            .detach(|| index.propose(&context, max_depth, budget, min_prob))
            .or_raise()?;
        TreeArrays::built(py, built)
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<SuffixIndex>()?;
    Ok(())
}
