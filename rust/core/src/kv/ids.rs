//! Typed block and slot numbers. Every integer conversion of a block or slot lives here; the
//! bookkeeping works on the types. The widths are safe because `BlockManager::new` refuses a
//! pool with more than `i32::MAX` slots (so every block index fits a `u32` below the free
//! queue's `u32::MAX` sentinel, and every slot fits an `i32`).

use std::fmt;

/// The most slots a pool may hold: slot ids are `i32` so they index tensors directly.
pub(crate) const MAX_SLOTS: usize = i32::MAX as usize;

/// A block of the pool (an index into its per-block arrays).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct BlockId(u32);

impl BlockId {
    /// The free queue's end-of-list marker, never a real block (see [`MAX_SLOTS`]).
    pub const NIL: BlockId = BlockId(u32::MAX);

    /// Block number `raw` as seen by callers (it may be out of range).
    #[inline]
    pub const fn new(raw: u32) -> Self {
        BlockId(raw)
    }

    /// Block at index `i` of a pool (`i < num_blocks <= MAX_SLOTS`).
    #[inline]
    pub fn from_index(i: usize) -> Self {
        debug_assert!(i <= MAX_SLOTS);
        BlockId(i as u32)
    }

    /// Index into the pool's per-block arrays.
    #[inline]
    pub fn index(self) -> usize {
        self.0 as usize
    }

    /// The number callers see (block tables, copy-on-write pairs).
    #[inline]
    pub fn get(self) -> u32 {
        self.0
    }

    /// Slot `offset` (`< block_size`) of this block.
    #[inline]
    pub fn slot(self, block_size: usize, offset: usize) -> SlotId {
        SlotId((self.index() * block_size + offset) as i32)
    }
}

impl fmt::Display for BlockId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A slot: `block * block_size + offset`, a row of a flattened `[num_blocks * block_size, ..]`
/// KV tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct SlotId(i32);

impl SlotId {
    /// The number callers see (an int32 tensor index).
    #[inline]
    pub fn get(self) -> i32 {
        self.0
    }
}
