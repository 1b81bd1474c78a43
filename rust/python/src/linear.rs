//! Bindings of `specdec_core::linear`: `QuantMatrix` as a `#[pyclass]` newtype; products
//! read and write numpy arrays in place (no copies) with the GIL released.

use std::sync::Arc;

use numpy::{
    PyArray2, PyReadonlyArray1, PyReadonlyArray2, PyReadwriteArray2, PyUntypedArrayMethods,
};
use pyo3::prelude::*;
use specdec_core::linear as core;

use crate::arrays::{as_slice, vec2_typed};
use crate::errors::{config_arg, raise, Class, OrRaise};

/// A weight matrix in a GGUF block format (Q4_1, Q8_0), multiplied without dequantizing it.
#[pyclass(module = "specdec._core", name = "QuantMatrix", frozen)]
pub struct QuantMatrix(Arc<core::QuantMatrix>);

impl QuantMatrix {
    /// The matrix, shared (a model stack holds the same blocks, not a copy).
    pub fn shared(&self) -> Arc<core::QuantMatrix> {
        Arc::clone(&self.0)
    }
}

fn format(name: &str) -> PyResult<core::BlockFormat> {
    core::BlockFormat::from_name(name).or_raise()
}

#[pymethods]
impl QuantMatrix {
    /// `rows x cols` weights from GGUF's bytes (`raw`: uint8, the rows' blocks in order).
    #[new]
    fn new(
        py: Python<'_>,
        #[pyo3(from_py_with = config_arg)] format_name: String,
        #[pyo3(from_py_with = config_arg)] rows: usize,
        #[pyo3(from_py_with = config_arg)] cols: usize,
        #[pyo3(from_py_with = config_arg)] raw: PyReadonlyArray1<'_, u8>,
    ) -> PyResult<Self> {
        let f = format(&format_name)?;
        let bytes = as_slice(&raw);
        let m = py
            .detach(|| core::QuantMatrix::from_gguf(f, rows, cols, &bytes))
            .or_raise()?;
        Ok(QuantMatrix(Arc::new(m)))
    }

    /// The matrices' rows concatenated: `parts` of `(format, rows, cols, raw)`.
    #[staticmethod]
    fn stack(
        py: Python<'_>,
        #[pyo3(from_py_with = config_arg)] parts: Vec<(
            String,
            usize,
            usize,
            PyReadonlyArray1<'_, u8>,
        )>,
    ) -> PyResult<Self> {
        let formats = parts
            .iter()
            .map(|p| format(&p.0))
            .collect::<PyResult<Vec<_>>>()?;
        let bytes: Vec<_> = parts.iter().map(|p| as_slice(&p.3)).collect();
        let args: Vec<_> = parts
            .iter()
            .zip(&formats)
            .zip(&bytes)
            .map(|((p, &f), b)| (f, p.1, p.2, &b[..]))
            .collect();
        Ok(QuantMatrix(Arc::new(
            py.detach(|| core::QuantMatrix::stack(&args)).or_raise()?,
        )))
    }

    #[getter]
    fn format(&self) -> String {
        self.0.format().to_string()
    }

    /// Output columns of a product (the weight's rows).
    #[getter]
    fn rows(&self) -> usize {
        self.0.rows()
    }

    /// Input columns (the weight's columns).
    #[getter]
    fn cols(&self) -> usize {
        self.0.cols()
    }

    #[getter]
    fn nbytes(&self) -> usize {
        self.0.nbytes()
    }

    /// `out[:] = x @ W.T`: `x` float32 `[m, cols]`, `out` a C-contiguous float32 `[m, rows]`;
    /// `numeric`: `"exact"` (float32 products) or `"int8"` (see `core::int8`).
    #[pyo3(signature = (x, out, *, numeric = "exact"))]
    fn matmul(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = config_arg)] x: PyReadonlyArray2<'_, f32>,
        #[pyo3(from_py_with = config_arg)] mut out: PyReadwriteArray2<'_, f32>,
        numeric: &str,
    ) -> PyResult<()> {
        let Some(numeric) = core::Numeric::from_name(numeric) else {
            return Err(raise(
                Class::Config,
                format!("numeric must be 'exact' or 'int8', got {numeric:?}"),
            ));
        };
        let m = x.shape()[0];
        if x.shape()[1] != self.0.cols() {
            let e = core::LinearError::InputWidth {
                expected: self.0.cols(),
                got: x.shape()[1],
            };
            return Err(e).or_raise();
        }
        let xs = as_slice(&x);
        let c_order = out.is_c_contiguous();
        let (Ok(o), true) = (out.as_slice_mut(), c_order) else {
            return Err(raise(
                Class::Config,
                "out must be a C-contiguous array".to_string(),
            ));
        };
        let w = &self.0;
        py.detach(|| w.matmul_in(numeric, &xs, m, o)).or_raise()
    }

    /// The float32 weights `[rows, cols]`, as gguf-py dequantizes them.
    fn dequantize<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let w = &self.0;
        let v = py.detach(|| w.dequantize());
        vec2_typed(py, v, self.0.rows(), self.0.cols())
    }

    fn __repr__(&self) -> String {
        format!(
            "QuantMatrix({}, rows={}, cols={})",
            self.0.format(),
            self.0.rows(),
            self.0.cols()
        )
    }
}

/// Whether the fast (AVX-512) kernel runs on this CPU.
#[pyfunction]
fn quant_simd_available() -> bool {
    core::simd_available()
}

/// Whether the int8 mode's fast (AVX-512 VNNI) kernel runs on this CPU.
#[pyfunction]
fn quant_int8_simd_available() -> bool {
    core::int8_simd_available()
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<QuantMatrix>()?;
    m.add_function(wrap_pyfunction!(quant_simd_available, m)?)?;
    m.add_function(wrap_pyfunction!(quant_int8_simd_available, m)?)?;
    Ok(())
}
