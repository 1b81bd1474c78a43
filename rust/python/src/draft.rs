//! Bindings of `specdec_core::draft`: `SuffixIndex` (one request's own tokens) and
//! `SuffixCorpus` (earlier outputs shared by requests, partitioned by cache salt) as frozen
//! `#[pyclass]`es whose proposals cross as `TreeArrays`, built with the GIL released.
//!
//! Each holds its core value behind a lock, so a second thread waits instead of failing: a
//! `Mutex` for an index (one request's), an `RwLock` for a corpus (read by every request's
//! proposals at once). Locks are taken only with the GIL released and dropped before it is
//! taken back, so no thread ever waits for the GIL while holding one. The one nesting is an
//! index's lock, then its corpus's, never the other way round.

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock};

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use specdec_core::draft::{self as core, DraftError};

use crate::errors::{draft_arg, Class, OrRaise};
use crate::kv::salt_of;
use crate::tree::TreeArrays;

/// What can go wrong under a lock: the core refused the input, or an earlier panic left the
/// value behind the lock half-changed.
enum Failure {
    Draft(DraftError),
    Poisoned,
}

impl From<DraftError> for Failure {
    fn from(e: DraftError) -> Self {
        Failure::Draft(e)
    }
}

impl<T> From<PoisonError<T>> for Failure {
    fn from(_: PoisonError<T>) -> Self {
        Failure::Poisoned
    }
}

/// Turn a [`Failure`] into its Python exception (with the GIL held, after the locks are gone).
trait OrRaiseFailure<T> {
    fn or_raise_failure(self) -> PyResult<T>;
}

impl<T> OrRaiseFailure<T> for Result<T, Failure> {
    fn or_raise_failure(self) -> PyResult<T> {
        self.or_else(|e| match e {
            Failure::Draft(e) => Err(e).or_raise(),
            Failure::Poisoned => Err(PyRuntimeError::new_err(
                "a suffix index or corpus was left unusable by an earlier panic",
            )),
        })
    }
}

/// `#[pyo3(from_py_with = draft_salt_arg)]`: a cache salt (`None`, bytes, or str as UTF-8);
/// `None` is a partition of its own, apart from `b""`.
fn draft_salt_arg(ob: &Bound<'_, PyAny>) -> PyResult<Option<Vec<u8>>> {
    salt_of(ob, Class::Draft)
}

/// A suffix index over one request's own tokens.
#[pyclass(module = "specdec._core", name = "SuffixIndex", frozen)]
pub struct SuffixIndex {
    max_match: usize,
    inner: Mutex<core::SuffixIndex>,
}

impl SuffixIndex {
    fn lock(&self) -> Result<MutexGuard<'_, core::SuffixIndex>, Failure> {
        Ok(self.inner.lock()?)
    }
}

#[pymethods]
impl SuffixIndex {
    #[new]
    #[pyo3(signature = (max_match=8))]
    fn new(#[pyo3(from_py_with = draft_arg)] max_match: usize) -> PyResult<Self> {
        let index = core::SuffixIndex::new(max_match).or_raise()?;
        Ok(SuffixIndex {
            max_match,
            inner: Mutex::new(index),
        })
    }

    #[getter]
    fn max_match(&self) -> usize {
        self.max_match
    }

    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        py.detach(|| Ok(self.lock()?.len())).or_raise_failure()
    }

    /// Append tokens to the request's own sequence.
    fn extend(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = draft_arg)] tokens: Vec<i64>,
    ) -> PyResult<()> {
        py.detach(|| Ok(self.lock()?.extend(&tokens)?))
            .or_raise_failure()
    }

    /// The tree of the `budget` most frequent continuations of `context`, pooled with the
    /// `cache_salt` partition of `corpus`; the corpus sequences drafted from become its most
    /// recently used. `min_match`: the shortest suffix that counts as a match;
    /// `depth_factor`: at most `floor(depth_factor x matched length)` tokens deep.
    #[pyo3(signature = (
        context, max_depth, budget, min_prob=0.0, corpus=None, cache_salt=None, min_match=1,
        depth_factor=None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn propose(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = draft_arg)] context: Vec<i64>,
        #[pyo3(from_py_with = draft_arg)] max_depth: usize,
        #[pyo3(from_py_with = draft_arg)] budget: i64,
        #[pyo3(from_py_with = draft_arg)] min_prob: f64,
        corpus: Option<&Bound<'_, SuffixCorpus>>,
        #[pyo3(from_py_with = draft_salt_arg)] cache_salt: Option<Vec<u8>>,
        #[pyo3(from_py_with = draft_arg)] min_match: usize,
        #[pyo3(from_py_with = draft_arg)] depth_factor: Option<f64>,
    ) -> PyResult<TreeArrays> {
        let corpus: Option<&SuffixCorpus> = corpus.map(Bound::get);
        let limits = core::MatchLimits {
            min_match,
            depth_factor,
        };
        let built = py
            .detach(|| {
                let index = self.lock()?;
                let Some(corpus) = corpus else {
                    return Ok(index
                        .propose_limited(&context, None, max_depth, budget, min_prob, limits)?);
                };
                let proposal = {
                    let held = corpus.inner.read()?;
                    let part = held.part(cache_salt.as_deref());
                    index.propose_limited(
                        &context,
                        Some(part),
                        max_depth,
                        budget,
                        min_prob,
                        limits,
                    )?
                };
                drop(index);
                if !proposal.matched.is_empty() {
                    corpus.inner.write()?.touch(&proposal.matched);
                }
                Ok(proposal)
            })
            .or_raise_failure()?;
        TreeArrays::built(py, built.built)
    }
}

/// Earlier outputs shared by every request, one partition per cache salt, at most
/// `max_tokens` tokens in all (least recently used sequences leave first).
#[pyclass(module = "specdec._core", name = "SuffixCorpus", frozen)]
pub struct SuffixCorpus {
    max_match: usize,
    max_tokens: usize,
    inner: RwLock<core::SuffixCorpus>,
}

impl SuffixCorpus {
    /// `f` of the corpus under its read lock, with the GIL released.
    fn read<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&core::SuffixCorpus) -> T + Send,
    ) -> PyResult<T> {
        py.detach(|| Ok(f(&*self.inner.read()?))).or_raise_failure()
    }
}

#[pymethods]
impl SuffixCorpus {
    #[new]
    #[pyo3(signature = (max_match=8, max_tokens=262144))]
    fn new(
        #[pyo3(from_py_with = draft_arg)] max_match: usize,
        #[pyo3(from_py_with = draft_arg)] max_tokens: usize,
    ) -> PyResult<Self> {
        let corpus = core::SuffixCorpus::new(max_match, max_tokens).or_raise()?;
        Ok(SuffixCorpus {
            max_match,
            max_tokens,
            inner: RwLock::new(corpus),
        })
    }

    #[getter]
    fn max_match(&self) -> usize {
        self.max_match
    }

    #[getter]
    fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// Tokens held over every partition.
    #[getter]
    fn num_tokens(&self, py: Python<'_>) -> PyResult<usize> {
        self.read(py, core::SuffixCorpus::num_tokens)
    }

    /// Salts that hold at least one sequence.
    #[getter]
    fn num_partitions(&self, py: Python<'_>) -> PyResult<usize> {
        self.read(py, core::SuffixCorpus::num_partitions)
    }

    /// Sequences held over every partition.
    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        self.read(py, core::SuffixCorpus::len)
    }

    fn __contains__(&self, py: Python<'_>, id: &Bound<'_, PyAny>) -> PyResult<bool> {
        let Ok(id) = id.extract::<u64>() else {
            return Ok(false);
        };
        self.read(py, |c| c.contains(id))
    }

    /// The held sequence ids, least recently used first.
    fn ids_by_use(&self, py: Python<'_>) -> PyResult<Vec<u64>> {
        self.read(py, core::SuffixCorpus::ids_by_use)
    }

    /// Add an earlier output under `cache_salt`, evicting least recently used sequences until
    /// it fits; returns its id.
    #[pyo3(signature = (tokens, cache_salt=None))]
    fn add(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = draft_arg)] tokens: Vec<i64>,
        #[pyo3(from_py_with = draft_salt_arg)] cache_salt: Option<Vec<u8>>,
    ) -> PyResult<u64> {
        py.detach(|| Ok(self.inner.write()?.add(cache_salt.as_deref(), &tokens)?))
            .or_raise_failure()
    }

    /// Drop a held sequence.
    fn remove(&self, py: Python<'_>, #[pyo3(from_py_with = draft_arg)] id: u64) -> PyResult<()> {
        py.detach(|| Ok(self.inner.write()?.remove(id)?))
            .or_raise_failure()
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<SuffixIndex>()?;
    m.add_class::<SuffixCorpus>()?;
    Ok(())
}
