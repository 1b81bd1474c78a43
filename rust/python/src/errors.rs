//! The one place where core errors become Python exceptions. The exception classes live in
//! `specdec.errors` (so they can inherit from both `SpecdecError` and `ValueError`, ...).

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyType;
use specdec_core::constrain::GrammarError;
use specdec_core::kv::KvError;
use specdec_core::tree::TreeError;

/// Any error of the core, tagged with the Python class that reports it.
pub enum Error {
    Tree(TreeError),
    Kv(KvError),
    Grammar(GrammarError),
}

impl From<TreeError> for Error {
    fn from(e: TreeError) -> Self {
        Error::Tree(e)
    }
}

impl From<GrammarError> for Error {
    fn from(e: GrammarError) -> Self {
        Error::Grammar(e)
    }
}

impl From<KvError> for Error {
    fn from(e: KvError) -> Self {
        Error::Kv(e)
    }
}

impl Error {
    fn class_and_message(&self) -> (&'static str, String) {
        match self {
            Error::Tree(e) => ("TreeError", e.to_string()),
            Error::Kv(e) => (
                match e {
                    KvError::UnknownSequence(_) => "UnknownSequence",
                    KvError::AlreadyFreed(_) => "DoubleFree",
                    KvError::OutOfBlocks { .. } => "OutOfBlocks",
                    KvError::NotReserved { .. } => "SlotNotReserved",
                    _ => "KVCacheError",
                },
                e.to_string(),
            ),
            Error::Grammar(e) => ("GrammarError", e.to_string()),
        }
    }
}

impl From<Error> for PyErr {
    fn from(e: Error) -> PyErr {
        let (class, message) = e.class_and_message();
        Python::attach(|py| match exception_class(py, class) {
            Ok(cls) => PyErr::from_type(cls, message),
            Err(err) => PyRuntimeError::new_err(format!("{message} (and {err})")),
        })
    }
}

fn exception_class<'py>(py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyType>> {
    Ok(py
        .import("specdec.errors")?
        .getattr(name)?
        .cast_into::<PyType>()?)
}

/// `result.or_raise()?` turns any core error into its Python exception.
pub trait OrRaise<T> {
    fn or_raise(self) -> PyResult<T>;
}

impl<T, E: Into<Error>> OrRaise<T> for Result<T, E> {
    fn or_raise(self) -> PyResult<T> {
        self.map_err(|e| PyErr::from(e.into()))
    }
}
