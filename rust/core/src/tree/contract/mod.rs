//! What a verifier needs from a tree besides its node arrays: ancestor bits, dense masks,
//! position ids, child links, retrieve indices and padding.

mod bits;
mod dense;
mod links;
mod padding;
mod positions;
mod retrieve;

pub use bits::{ancestor_bits, AncestorBits};
pub use dense::{attention_mask, MaskValue};
pub use links::{child_links, ChildLinks};
pub use padding::{pad_tree, Padded};
pub use positions::position_ids;
pub use retrieve::retrieve_indices;

use super::TreeError;

/// The most nodes a tree may have: its ancestor bitmap (`n * ceil(n / 64)` words, quadratic)
/// then stays within 512 MiB, and far larger than any tree one verifier forward can score.
/// Larger trees took tens of seconds and gigabytes to build (found by `make fuzz`).
pub const MAX_TREE_NODES: usize = 1 << 16;

/// Refuse sizes whose arrays cannot exist instead of aborting on a failed allocation: node
/// indices are int32, and the ancestor bitmap of `n` nodes takes `n * ceil(n / 64)` words.
pub fn check_tree_size(n: usize) -> Result<(), TreeError> {
    if n > i32::MAX as usize {
        return Err(TreeError::TooLarge(format!(
            "a tree of {n} nodes: node indices must fit in int32"
        )));
    }
    if n > MAX_TREE_NODES {
        return Err(TreeError::TooLarge(format!(
            "a tree of {n} nodes is over the {MAX_TREE_NODES}-node limit (its ancestor bitmap \
             alone would take n^2 / 8 bytes)"
        )));
    }
    let words = n.div_ceil(64).max(1).checked_mul(n);
    check_alloc(
        "the ancestor bitmap",
        n,
        words.and_then(|w| w.checked_mul(8)),
    )
}

/// Probe an allocation of `bytes` (None: overflowed) for an array of `what` over `n` nodes;
/// only sizes above 1 GiB are probed, so everyday sizes cost nothing.
pub fn check_alloc(what: &str, n: usize, bytes: Option<usize>) -> Result<(), TreeError> {
    let too_large = || {
        TreeError::TooLarge(format!(
            "{what} of a {n}-node tree ({} bytes) cannot be allocated",
            bytes.map_or("over 2^64".to_string(), |b| b.to_string())
        ))
    };
    let bytes = bytes
        .filter(|&b| b <= isize::MAX as usize)
        .ok_or_else(too_large)?;
    if bytes > 1 << 30 {
        Vec::<u8>::new()
            .try_reserve_exact(bytes)
            .map_err(|_| too_large())?;
    }
    Ok(())
}
