//! numpy helpers: borrow contiguous input without copying, hand vectors out without copying.

use std::borrow::Cow;
use std::sync::Mutex;

use numpy::ndarray::Array2;
use numpy::{
    Element, PyArray, PyArray1, PyArray2, PyArrayMethods, PyReadonlyArray, PyUntypedArrayMethods,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

/// The array's data as one slice in row-major order: borrowed when C-contiguous, else
/// gathered once (numpy's `as_slice` also accepts Fortran order, whose memory order is not
/// the row-major order the callers index by).
pub fn as_slice<'a, T: Element + Copy, D: numpy::ndarray::Dimension>(
    a: &'a PyReadonlyArray<'_, T, D>,
) -> Cow<'a, [T]> {
    match a.as_slice() {
        Ok(s) if a.is_c_contiguous() => Cow::Borrowed(s),
        _ => Cow::Owned(a.as_array().iter().copied().collect()),
    }
}

/// Shape of an array as a vector.
pub fn shape<T: Element, D: numpy::ndarray::Dimension>(
    a: &PyReadonlyArray<'_, T, D>,
) -> Vec<usize> {
    a.shape().to_vec()
}

/// Move a vector into a 1-D numpy array (no copy).
pub fn vec1<'py, T: Element>(py: Python<'py>, v: Vec<T>) -> Bound<'py, PyArray1<T>> {
    PyArray1::from_vec(py, v)
}

/// Move a row-major vector into a 2-D numpy array (no copy, one array object).
pub fn vec2_typed<'py, T: Element>(
    py: Python<'py>,
    v: Vec<T>,
    rows: usize,
    cols: usize,
) -> PyResult<Bound<'py, PyArray2<T>>> {
    let a = Array2::from_shape_vec((rows, cols), v)
        .map_err(|e| PyValueError::new_err(format!("{rows} x {cols} array: {e}")))?;
    Ok(PyArray2::from_owned_array(py, a))
}

/// [`vec2_typed`] as a plain object.
pub fn vec2<'py, T: Element>(
    py: Python<'py>,
    v: Vec<T>,
    rows: usize,
    cols: usize,
) -> PyResult<Bound<'py, PyAny>> {
    Ok(vec2_typed(py, v, rows, cols)?.into_any())
}

/// Borrow an array this crate handed out for reading; a conflicting borrow (another thread
/// writing it through Rust) is an error, not a panic.
pub fn read<'py, T: Element, D: numpy::ndarray::Dimension>(
    a: &Bound<'py, PyArray<T, D>>,
) -> PyResult<PyReadonlyArray<'py, T, D>> {
    a.try_readonly()
        .map_err(|e| PyValueError::new_err(format!("array in use: {e}")))
}

/// A result array built on first access: the vector moves into numpy (no copy) only if the
/// caller reads it, so a named result with fields a caller ignores costs no array for them.
pub struct LazyArray<T> {
    data: Mutex<Option<Vec<T>>>,
    /// Columns of a 2-D array (None: 1-D).
    cols: Option<usize>,
    array: PyOnceLock<Py<PyAny>>,
}

impl<T: Element + Send> LazyArray<T> {
    pub fn new(v: Vec<T>, cols: Option<usize>) -> Self {
        LazyArray {
            data: Mutex::new(Some(v)),
            cols,
            array: PyOnceLock::new(),
        }
    }

    pub fn get(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let array = self.array.get_or_try_init(py, || {
            // Taken once, under the once-lock: a poisoned mutex still holds the data.
            let v =
                (self.data.lock().unwrap_or_else(|e| e.into_inner()).take()).unwrap_or_default();
            Ok::<_, PyErr>(match self.cols {
                None => vec1(py, v).into_any().unbind(),
                Some(c) => {
                    let rows = v.len() / c.max(1);
                    vec2(py, v, rows, c)?.unbind()
                }
            })
        })?;
        Ok(array.clone_ref(py))
    }
}
