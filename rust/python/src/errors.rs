//! The one place where core errors become Python exceptions. The exception classes live in
//! `specdec.errors` (so they can inherit from both `SpecdecError` and `ValueError`, ...); they
//! are looked up once, when the extension is imported.

use pyo3::exceptions::{PyException, PyOverflowError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;
use specdec_core::constrain::GrammarError;
use specdec_core::decode::BudgetError;
use specdec_core::draft::DraftError;
use specdec_core::kv::KvError;
use specdec_core::linear::LinearError;
use specdec_core::model::ModelError;
use specdec_core::tree::TreeError;

/// The Python classes the extension raises, in `CLASS_NAMES` order.
#[derive(Clone, Copy)]
pub enum Class {
    Tree,
    KvCache,
    OutOfBlocks,
    UnknownSequence,
    DoubleFree,
    SlotNotReserved,
    Grammar,
    Type,
    Draft,
    Config,
    Verify,
    UnsupportedSchema,
}

const CLASS_NAMES: [&str; 12] = [
    "TreeError",
    "KVCacheError",
    "OutOfBlocks",
    "UnknownSequence",
    "DoubleFree",
    "SlotNotReserved",
    "GrammarError",
    "SpecdecTypeError",
    "DraftError",
    "ConfigError",
    "VerifyError",
    "UnsupportedSchemaError",
];

static CLASSES: PyOnceLock<Vec<Py<PyType>>> = PyOnceLock::new();

/// Look the exception classes up (called once from the module's init).
pub fn init(py: Python<'_>) -> PyResult<()> {
    CLASSES.get_or_try_init(py, || {
        let module = py.import("specdec.errors")?;
        CLASS_NAMES
            .iter()
            .map(|name| Ok(module.getattr(*name)?.cast_into::<PyType>()?.unbind()))
            .collect::<PyResult<Vec<_>>>()
    })?;
    Ok(())
}

/// A Python exception of `class` with `message`.
pub fn raise(class: Class, message: String) -> PyErr {
    Python::attach(|py| match CLASSES.get(py) {
        Some(classes) => PyErr::from_type(classes[class as usize].bind(py).clone(), message),
        None => PyRuntimeError::new_err(format!("{message} (specdec.errors was not loaded)")),
    })
}

/// Any error of the core, tagged with the Python class that reports it.
pub enum Error {
    Tree(TreeError),
    Kv(KvError),
    Grammar(GrammarError),
    Draft(DraftError),
    Budget(BudgetError),
    Linear(LinearError),
    Model(ModelError),
}

impl From<ModelError> for Error {
    fn from(e: ModelError) -> Self {
        Error::Model(e)
    }
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

impl From<DraftError> for Error {
    fn from(e: DraftError) -> Self {
        match e {
            DraftError::Tree(e) => Error::Tree(e),
            e => Error::Draft(e),
        }
    }
}

impl From<BudgetError> for Error {
    fn from(e: BudgetError) -> Self {
        Error::Budget(e)
    }
}

impl From<LinearError> for Error {
    fn from(e: LinearError) -> Self {
        Error::Linear(e)
    }
}

impl From<KvError> for Error {
    fn from(e: KvError) -> Self {
        Error::Kv(e)
    }
}

impl From<Error> for PyErr {
    fn from(e: Error) -> PyErr {
        let (class, message) = match e {
            Error::Tree(e) => (Class::Tree, e.to_string()),
            Error::Kv(e) => (
                match e {
                    KvError::UnknownSequence(_) => Class::UnknownSequence,
                    KvError::AlreadyFreed(_) => Class::DoubleFree,
                    KvError::OutOfBlocks { .. } => Class::OutOfBlocks,
                    KvError::NotReserved { .. } => Class::SlotNotReserved,
                    _ => Class::KvCache,
                },
                e.to_string(),
            ),
            Error::Grammar(GrammarError::Inexact {
                keyword,
                pointer,
                detail,
            }) => {
                let message = GrammarError::Inexact {
                    keyword: keyword.clone(),
                    pointer: pointer.clone(),
                    detail,
                }
                .to_string();
                // (message, keyword, pointer): the class keeps the last two as attributes.
                return Python::attach(|py| match CLASSES.get(py) {
                    Some(classes) => PyErr::from_type(
                        classes[Class::UnsupportedSchema as usize].bind(py).clone(),
                        (message, keyword, pointer),
                    ),
                    None => PyRuntimeError::new_err(message),
                });
            }
            Error::Grammar(e) => (Class::Grammar, e.to_string()),
            Error::Draft(e) => (Class::Draft, e.to_string()),
            Error::Budget(e) => (Class::Config, e.to_string()),
            Error::Linear(e) => (Class::Config, e.to_string()),
            Error::Model(e) => (
                match e {
                    ModelError::Weights(_) | ModelError::Capture(_) | ModelError::Linear(_) => {
                        Class::Config
                    }
                    ModelError::Slot { .. }
                    | ModelError::Buffer { .. }
                    | ModelError::Layout { .. } => Class::KvCache,
                    ModelError::Size { .. }
                    | ModelError::Shape(_)
                    | ModelError::Position { .. } => Class::Verify,
                },
                e.to_string(),
            ),
        };
        raise(class, message)
    }
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

/// Re-raise an argument-conversion error as a specdec one: a wrong type as
/// `SpecdecTypeError`, a value out of range (a negative id, an int too large) as `value`.
pub fn conversion_error(py: Python<'_>, err: PyErr, value: Class) -> PyErr {
    let message = err.value(py).to_string();
    if err.is_instance_of::<PyTypeError>(py) {
        raise(Class::Type, message)
    } else if err.is_instance_of::<PyOverflowError>(py) || err.is_instance_of::<PyValueError>(py) {
        raise(value, message)
    } else if err.is_instance_of::<PyException>(py) {
        // The object's own conversion failed (a meta tensor's __index__ raises RuntimeError):
        // it is not an argument of the expected type.
        raise(Class::Type, message)
    } else {
        err // KeyboardInterrupt and the like pass through
    }
}

/// What a Rust argument type accepts, in Python words.
fn expected<T>() -> &'static str {
    let name = std::any::type_name::<T>();
    let array = name.contains("PyReadonlyArray");
    match () {
        _ if array && name.contains("u64") => "a 1-D uint64 numpy array",
        _ if array && name.contains("i64") => "a 1-D int64 numpy array",
        _ if array => "a numpy array",
        _ if name.starts_with("alloc::vec::Vec") => "a list of ints",
        _ if name == "bool" => "a bool",
        _ if name == "f64" => "a float",
        _ if name.starts_with('u') => "an int >= 0",
        _ => "an int",
    }
}

/// `#[pyo3(from_py_with = kv_arg)]`: extract a KV argument, reporting bad values as
/// `KVCacheError` and wrong types as `SpecdecTypeError`, both naming what was expected and
/// what came (Python adds the argument's name as a note).
pub fn kv_arg<'a, 'py, T>(ob: &'a Bound<'py, PyAny>) -> PyResult<T>
where
    T: FromPyObject<'a, 'py>,
    T::Error: Into<PyErr>,
{
    typed_arg(ob, Class::KvCache)
}

/// `#[pyo3(from_py_with = draft_arg)]`: [`kv_arg`] for drafter arguments (`DraftError`).
pub fn draft_arg<'a, 'py, T>(ob: &'a Bound<'py, PyAny>) -> PyResult<T>
where
    T: FromPyObject<'a, 'py>,
    T::Error: Into<PyErr>,
{
    typed_arg(ob, Class::Draft)
}

/// `#[pyo3(from_py_with = config_arg)]`: [`kv_arg`] for settings (`ConfigError`).
pub fn config_arg<'a, 'py, T>(ob: &'a Bound<'py, PyAny>) -> PyResult<T>
where
    T: FromPyObject<'a, 'py>,
    T::Error: Into<PyErr>,
{
    typed_arg(ob, Class::Config)
}

/// Extract an argument, reporting bad values as `value` and wrong types as
/// `SpecdecTypeError`, both naming what was expected and what came.
fn typed_arg<'a, 'py, T>(ob: &'a Bound<'py, PyAny>, value: Class) -> PyResult<T>
where
    T: FromPyObject<'a, 'py>,
    T::Error: Into<PyErr>,
{
    ob.extract::<T>().map_err(|e| {
        let py = ob.py();
        let got = ob
            .repr()
            .map_or_else(|_| "?".to_string(), |r| r.to_string());
        let got: String = got.chars().take(80).collect();
        let e: PyErr = e.into();
        let detail = format!("expected {}, got {got} ({})", expected::<T>(), e.value(py));
        conversion_error(py, PyErr::from_type(e.get_type(py), detail), value)
    })
}
