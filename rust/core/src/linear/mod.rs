//! The target's linear layers straight from llama.cpp's quantized block formats (GGUF
//! `Q4_1`, `Q8_0`): a [`QuantMatrix`] keeps a weight matrix at 5 or 8.5 bits a weight and
//! multiplies by float32 rows, dequantizing on the fly.
//!
//! A decode step reads every weight once and does little arithmetic with it, so its speed is
//! the memory read: a float32 copy of a `Q4_1` matrix is 6.4x the bytes. Each weight is
//! dequantized exactly as gguf-py does (`d * q + m`, two float32 roundings; `q * d` for
//! `Q8_0`), so the product is the float32 product with the float32 weights any other loader
//! gets, up to summation order: every output is one fused multiply-add chain over even `k`
//! and one over odd `k`, added at the end, whatever the number of rows (a row's result does
//! not depend on the rows beside it). The AVX-512 kernel and the portable one follow that
//! order, so they agree bit for bit.
//!
//! [`int8`] is the opt-in fast numeric mode: the input rows quantized to 8 bits per block
//! and integer dot products with the quants (llama.cpp's numeric class), a VNNI kernel and a
//! portable one that agree bit for bit.

mod format;
pub mod int8;
mod kernel;
mod matrix;
pub(crate) mod pool;

pub use format::{BlockFormat, BLOCK};

/// How a product rounds: [`Numeric::Exact`], the float32 product of the dequantized weights
/// (up to summation order); [`Numeric::Int8`], the inputs quantized to 8 bits per block
/// and integer dot products ([`int8`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Numeric {
    #[default]
    Exact,
    Int8,
}

impl Numeric {
    /// The mode of a name (`"exact"`, `"int8"`).
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "exact" => Some(Self::Exact),
            "int8" => Some(Self::Int8),
            _ => None,
        }
    }
}
pub use matrix::{int8_simd_available, simd_available, Combine, QuantMatrix};

use thiserror::Error;

/// Everything that can be wrong with a quantized matrix or the rows it multiplies.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LinearError {
    #[error("unknown block format {0:?} (supported: Q4_1, Q8_0)")]
    UnknownFormat(String),
    #[error("a matrix needs at least one row and one column, got {rows} x {cols}")]
    Empty { rows: usize, cols: usize },
    #[error("{cols} columns do not split into {format} blocks of 32")]
    Columns { format: BlockFormat, cols: usize },
    #[error("{rows} x {cols} {format} needs {expected} bytes of blocks, got {got}")]
    Bytes {
        format: BlockFormat,
        rows: usize,
        cols: usize,
        expected: usize,
        got: usize,
    },
    #[error("input rows have {got} columns, the matrix {expected}")]
    InputWidth { expected: usize, got: usize },
    #[error("output must be {rows} x {cols} ({expected} values), got {got} values")]
    OutputSize {
        rows: usize,
        cols: usize,
        expected: usize,
        got: usize,
    },
    #[error(
        "input row {row} has a non-finite value at column {col}: the int8 mode cannot quantize it"
    )]
    NonFinite { row: usize, col: usize },
    #[error("cannot join matrices with {0} and {1} columns (or of different formats)")]
    Join(usize, usize),
    #[error("{rows} rows do not split into two halves of whole {tile}-row tiles")]
    Halves { rows: usize, tile: usize },
    #[error("an output mask must be {rows} rows of {words} words, got {got} words")]
    MaskSize {
        rows: usize,
        words: usize,
        got: usize,
    },
}
