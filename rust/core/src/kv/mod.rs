//! Paged KV-cache bookkeeping: a pool of fixed-size blocks with refcounts and an O(1) LRU
//! free queue, per-sequence block tables, copy-on-write of a shared partial tail, tentative
//! draft-tree slots with commit moves, beam reordering and a SHA-256 content-hashed prefix cache.
//!
//! Slot ids are `block * block_size + offset` (i32, so they index a flattened
//! `[num_blocks * block_size, ...]` tensor directly). The manager owns no tensors: it returns
//! the copies (`(src_block, dst_block)` for copy-on-write, `(src_slot, dst_slot)` for commit
//! moves) that the tensor layer must execute.
//!
//! Pure bookkeeping over integer ids: nothing here needs `unsafe`.

#![forbid(unsafe_code)]

mod beams;
mod error;
mod ids;
mod manager;
mod pool;
mod prefix_cache;
mod tree_slots;

pub use error::KvError;
pub use manager::{Appended, BlockManager, SeqId};
pub use prefix_cache::{block_hash, BlockHash};
pub use tree_slots::{CommitBatch, ReserveBatch};
