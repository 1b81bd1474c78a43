//! Distinct token ids within each marginals row.
//!
//! Two columns of one row with the same token id are two children of the same parent with
//! the same token: a walk can only ever follow the first, so the second wastes budget and
//! the "optimal" tree is not. Only the columns the build may read are checked, the same
//! ones whose log-probs are validated, and among them only the finite entries: a -inf entry
//! never enters the tree (both builders stop a row at its first -inf), and since rows are
//! sorted the finite entries are a prefix, found by a binary search.
//!
//! Each row is checked in one pass over its ids with a thread-local stamp array indexed by
//! id: a slot holding the row's stamp means the id was seen earlier in the row. Every row
//! takes a new stamp, so nothing is cleared between rows or calls (the array is zeroed only
//! when the 16-bit stamp wraps). The pass is branch-free apart from growing the array; the
//! rare failing row is rescanned to name the first repeat. Ids at or above `STAMPED_IDS`
//! (or negative ones, whose range check happens where they enter the tree) fall back to
//! sorting the row.

use std::cell::RefCell;
use std::collections::HashMap;

use crate::tree::TreeError;

/// Ids below this are checked with the stamp array (2 bytes per id, so at most 2 MiB per
/// thread, grown to the largest id seen).
const STAMPED_IDS: u64 = 1 << 20;

struct Stamps {
    seen: Vec<u16>,
    stamp: u16,
}

impl Stamps {
    /// A stamp no slot holds yet (slots start at 0, stamps at 1).
    #[inline]
    fn next_stamp(&mut self) -> u16 {
        if self.stamp == u16::MAX {
            self.seen.fill(0);
            self.stamp = 0;
        }
        self.stamp += 1;
        self.stamp
    }
}

thread_local! {
    static STAMPS: RefCell<Stamps> = const {
        RefCell::new(Stamps {
            seen: Vec::new(),
            stamp: 0,
        })
    };
}

/// Check that the finite entries among the first `used` columns of every row carry
/// distinct token ids; the error names the first row with a repeat, the repeated id and
/// both columns. `logprobs` must already be validated (rows sorted descending, no NaN).
pub(super) fn check_distinct(
    logprobs: &[f32],
    token_ids: &[i64],
    width: usize,
    used: usize,
) -> Result<(), TreeError> {
    let rows = logprobs.len() / width;
    STAMPS.with(|cell| {
        let mut stamps = cell.borrow_mut();
        for d in 0..rows {
            let row = &logprobs[d * width..d * width + used];
            let n = row.partition_point(|&v| v != f32::NEG_INFINITY);
            let ids = &token_ids[d * width..d * width + n];
            if !row_is_distinct(&mut stamps, ids) {
                return Err(first_repeat(ids, d));
            }
        }
        Ok(())
    })
}

#[inline]
fn row_is_distinct(stamps: &mut Stamps, ids: &[i64]) -> bool {
    if ids.len() < 2 {
        return true;
    }
    // The ids OR-ed bound them all (negative ids set the top bit); the OR vectorizes where
    // an unsigned 64-bit max does not.
    let max = ids.iter().fold(0u64, |acc, &t| acc | t as u64);
    if max >= STAMPED_IDS {
        return sorted_is_distinct(ids);
    }
    if max as usize >= stamps.seen.len() {
        // Zero slots never hold a live stamp.
        let len = (max as usize + 1).next_power_of_two().max(4096);
        stamps.seen.resize(len, 0);
    }
    let stamp = stamps.next_stamp();
    let seen = stamps.seen.as_mut_ptr();
    let mut repeat = false;
    for &t in ids {
        // SAFETY: 0 <= t <= max (their OR, below 2^20) < seen.len(), grown just above.
        let slot = unsafe { &mut *seen.add(t as usize) };
        repeat |= *slot == stamp;
        *slot = stamp;
    }
    !repeat
}

/// Fallback for rows with large or negative ids.
#[cold]
fn sorted_is_distinct(ids: &[i64]) -> bool {
    let mut sorted = ids.to_vec();
    sorted.sort_unstable();
    sorted.windows(2).all(|w| w[0] != w[1])
}

/// The first column of row `d` whose id an earlier column already holds.
#[cold]
fn first_repeat(ids: &[i64], d: usize) -> TreeError {
    let mut first = HashMap::with_capacity(ids.len());
    for (rank, &token) in ids.iter().enumerate() {
        if let Some(&first_rank) = first.get(&token) {
            return TreeError::DuplicateToken {
                depth: d,
                rank,
                first_rank,
                token,
            };
        }
        first.insert(token, rank);
    }
    unreachable!("row {d} was found to hold a repeated id")
}
