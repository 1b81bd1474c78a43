//! specdec-core: the CPU-bound steps of tree speculative decoding, free of Python.
//!
//! One concern per module:
//! - [`tree`]: DDTree best-first builder, trees from explicit branches, the verifier
//!   contract (ancestor bits, masks, positions, child links, retrieve indices, padding)
//!   and the verifier walk.
//! - [`kv`]: paged KV-cache bookkeeping (block pool, refcounts, tree slots, beams, prefix cache).
//! - [`grammar`]: vocabularies, token trie, regex automata, allowed-token bitmaps.

pub mod grammar;
pub mod kv;
pub mod tree;
