//! specdec-core: the CPU-bound steps of tree speculative decoding, free of Python.

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

pub mod constrain;
pub mod kv;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod tree;
