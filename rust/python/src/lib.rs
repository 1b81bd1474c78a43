//! The `specdec._core` extension: thin `#[pyfunction]`/`#[pyclass]` wrappers over
//! `specdec-core`, numpy in and out without copies, heavy work with the GIL released.

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

use pyo3::prelude::*;

mod arrays;
mod constrain;
mod decode;
mod draft;
mod errors;
mod kv;
mod linear;
mod locked;
mod model;
mod tree;

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    errors::init(m.py())?;
    tree::register(m)?;
    kv::register(m)?;
    constrain::register(m)?;
    draft::register(m)?;
    decode::register(m)?;
    linear::register(m)?;
    model::register(m)?;
    Ok(())
}
