//! A whole decoder step of a Llama-style model for a few rows in one call: every layer's
//! norms, products on the GGUF blocks ([`crate::linear::QuantMatrix`]), RoPE, the new K/V
//! written into the caller's cache tensors, attention over each row's visible slots, and
//! the LM head.
//!
//! At the few rows of a decode or verify step, each of a model's ~120 products takes tens
//! of microseconds; driving them one by one from Python costs about as much again in
//! dispatch. Here the step is one call, with the float32 math of the torch path up to
//! summation order (the products are the same kernel, bit for bit; RoPE is bit for bit;
//! norms, softmax and SiLU sum or round in another order).
//!
//! KV addressing is one mechanism for every cache: a row's K/V lives in one of the step's
//! [`KvBuffer`]s (a dense cache `[layers, kv_heads, slots, head_dim]` per sequence, or a
//! paged pool `[layers, slots, kv_heads, head_dim]` shared by all rows), and the row names
//! the slots it attends to (its prefix, then its new tokens, padding allowed) and the slots
//! its new tokens are written to. A per-row mask `[T, S]` says which of those slots each new
//! token sees (a tree: the prefix and its ancestors), or none for a causal step.

mod kv;
mod llama;
mod ops;

use thiserror::Error;

use crate::linear::LinearError;

pub use kv::{KvBuffer, KvOrder, StepRows};
pub use llama::{Capture, LayerWeights, Linear, LlamaDims, LlamaStack, StepProfile};

/// Everything that can be wrong with a stack's weights or a step's inputs.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ModelError {
    /// The weights do not fit the dimensions (construction).
    #[error("{0}")]
    Weights(String),
    /// An input or output array of the wrong size.
    #[error("{what} has {got} values, expected {expected}")]
    Size {
        what: &'static str,
        expected: usize,
        got: usize,
    },
    /// A step needs at least one row and one token, and room for them.
    #[error("{0}")]
    Shape(String),
    #[error("row {row}: slot {slot} is outside its KV buffer's {slots} slots")]
    Slot { row: usize, slot: i64, slots: usize },
    #[error("row {row}: KV buffer {buffer} does not exist ({buffers} given)")]
    Buffer {
        row: usize,
        buffer: i64,
        buffers: usize,
    },
    #[error("position {position} is outside the RoPE table's {len} positions")]
    Position { position: i64, len: usize },
    #[error("KV buffer {index}: {detail}")]
    Layout { index: usize, detail: String },
    #[error("hidden-state capture: {0}")]
    Capture(String),
    #[error(transparent)]
    Linear(#[from] LinearError),
}

/// [`ModelError::Size`] unless `got == expected`.
pub(crate) fn check_size(
    what: &'static str,
    expected: usize,
    got: usize,
) -> Result<(), ModelError> {
    if expected == got {
        Ok(())
    } else {
        Err(ModelError::Size {
            what,
            expected,
            got,
        })
    }
}

/// Every `vocab`-wide row of `logits`: where its largest value first occurs, NaN counting as
/// the largest (numpy's and torch's argmax), into `out` (one per row). A greedy step reads
/// this instead of the logits: the LM head's output is split between the cores' caches, and
/// here each core scans a part of every row, where one thread after the step read them all.
pub fn row_argmax(logits: &[f32], vocab: usize, out: &mut [i64]) -> Result<(), ModelError> {
    if vocab == 0 {
        return Err(ModelError::Shape(
            "argmax needs a vocabulary of at least one".into(),
        ));
    }
    check_size("logits", out.len() * vocab, logits.len())?;
    let simd = crate::linear::simd_available();
    // Parts of 16K values: small enough that both cores share a row, large enough that a
    // part costs more than claiming it.
    let parts = vocab.div_ceil(1 << 14);
    let width = vocab.div_ceil(parts);
    let peaks: Vec<std::sync::Mutex<Option<ops::Peak>>> =
        (0..out.len() * parts).map(|_| Default::default()).collect();
    let run = |chunk: usize| {
        let (r, p) = (chunk / parts, chunk % parts);
        let lo = p * width;
        let hi = (lo + width).min(vocab);
        let row = &logits[r * vocab..(r + 1) * vocab];
        let peak = ops::peak(simd, &row[lo..hi], lo);
        *peaks[chunk].lock().unwrap_or_else(|e| e.into_inner()) = Some(peak);
    };
    if out.len() * vocab < 1 << 14 {
        (0..peaks.len()).for_each(run);
    } else {
        crate::linear::pool::run(peaks.len(), &run);
    }
    let mut peaks = peaks
        .into_iter()
        .map(|m| m.into_inner().unwrap_or_else(|e| e.into_inner()));
    for o in out.iter_mut() {
        let best = (0..parts)
            .filter_map(|_| peaks.next().flatten())
            .reduce(ops::Peak::max);
        *o = best.map_or(0, |b| b.index as i64);
    }
    Ok(())
}
