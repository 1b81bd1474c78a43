//! What a verifier needs from a tree besides its node arrays.

use std::mem::MaybeUninit;

use super::{DraftTree, TreeError};

/// Ancestor relation as bit-packed rows: bit j of row i (word j / 64, bit j % 64) is set
/// iff node j is node i or one of its ancestors.
#[derive(Debug, Clone, PartialEq)]
pub struct AncestorBits {
    pub rows: usize,
    pub words_per_row: usize,
    pub words: Vec<u64>,
}

impl AncestorBits {
    #[inline]
    pub fn row(&self, i: usize) -> &[u64] {
        &self.words[i * self.words_per_row..(i + 1) * self.words_per_row]
    }

    #[inline]
    pub fn get(&self, i: usize, j: usize) -> bool {
        self.row(i)[j / 64] >> (j % 64) & 1 == 1
    }
}

/// Refuse sizes whose arrays cannot exist instead of aborting on a failed allocation: node
/// indices are int32, and the ancestor bitmap of `n` nodes takes `n * ceil(n / 64)` words.
pub fn check_tree_size(n: usize) -> Result<(), TreeError> {
    if n > i32::MAX as usize {
        return Err(TreeError::TooLarge(format!(
            "a tree of {n} nodes: node indices must fit in int32"
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

/// Panics unless `parents[i] < i` for every node (callers that take outside input check it
/// first and report a `TreeError`); the vector paths below rely on it.
pub fn ancestor_bits(parents: &[i32]) -> AncestorBits {
    let n = parents.len();
    let forward = (parents.iter().zip(0i32..)).fold(true, |ok, (&p, i)| ok & (p < i));
    assert!(
        forward,
        "ancestor_bits: every parent must precede its child"
    );
    let w = n.div_ceil(64).max(1);
    let mut words: Vec<u64> = Vec::with_capacity(n * w);
    let rows = &mut words.spare_capacity_mut()[..n * w];
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above).
        unsafe { fill_rows_avx2(parents, w, rows) };
    } else {
        fill_rows(parents, w, rows);
    }
    #[cfg(not(target_arch = "x86_64"))]
    fill_rows(parents, w, rows);
    // SAFETY: `fill_rows` wrote all `n * w` words.
    unsafe { words.set_len(n * w) };
    AncestorBits {
        rows: n,
        words_per_row: w,
        words,
    }
}

/// Write every word of the `n` rows once: row i is a copy of its parent's row (ancestors of
/// p are <= p, so the words past them are zero there too), or zeros for a root, plus its
/// own bit. The copy is an inline word loop (a `memcpy` call per 136-byte row costs more
/// than the copy).
#[inline(always)]
fn fill_rows(parents: &[i32], w: usize, out: &mut [MaybeUninit<u64>]) {
    for (i, &p) in parents.iter().enumerate() {
        let (done, row) = out.split_at_mut(i * w);
        let row = &mut row[..w];
        if p >= 0 {
            let src = &done[p as usize * w..p as usize * w + w];
            for (d, s) in row.iter_mut().zip(src) {
                *d = *s;
            }
        } else {
            for d in row.iter_mut() {
                d.write(0);
            }
        }
        // SAFETY: every word of row i was written just above.
        unsafe { *row[i / 64].assume_init_mut() |= 1u64 << (i % 64) };
    }
}

/// `fill_rows` with explicit 32-byte vectors: each 4-word chunk of the parent's row is
/// loaded, the own bit ORed in while in a register (a compare of the chunk's word indices
/// against the bit's word selects it), and stored once; roots copy a zero row. No store is
/// read back, so nothing waits on store forwarding.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn fill_rows_avx2(parents: &[i32], w: usize, out: &mut [MaybeUninit<u64>]) {
    use std::arch::x86_64::*;
    let zeros = vec![0u64; w];
    let base = out.as_mut_ptr() as *mut u64;
    let chunks = w / 4;
    let lanes = _mm256_setr_epi64x(0, 1, 2, 3);
    for (i, &p) in parents.iter().enumerate() {
        // SAFETY: rows 0..i are written before row i reads its parent p < i; all offsets
        // stay below n * w = out.len().
        unsafe {
            let src = if p >= 0 {
                base.add(p as usize * w) as *const u64
            } else {
                zeros.as_ptr()
            };
            let dst = base.add(i * w);
            let word = (i / 64) as i64;
            let bit = _mm256_set1_epi64x((1u64 << (i % 64)) as i64);
            let mut idx = _mm256_sub_epi64(lanes, _mm256_set1_epi64x(word));
            let four = _mm256_set1_epi64x(4);
            for c in 0..chunks {
                let v = _mm256_loadu_si256(src.add(4 * c) as *const __m256i);
                let own = _mm256_and_si256(_mm256_cmpeq_epi64(idx, _mm256_setzero_si256()), bit);
                _mm256_storeu_si256(dst.add(4 * c) as *mut __m256i, _mm256_or_si256(v, own));
                idx = _mm256_add_epi64(idx, four);
            }
            for j in 4 * chunks..w {
                let own = if j as i64 == word {
                    1u64 << (i % 64)
                } else {
                    0
                };
                *dst.add(j) = *src.add(j) | own;
            }
        }
    }
}

/// First-child / next-sibling links (-1 = none); children keep index order, which for a
/// DDTree is non-increasing log-prob. This is the layout SGLang's tree kernels and
/// xgrammar's `traverse_draft_tree` take.
#[derive(Debug, Clone, PartialEq)]
pub struct ChildLinks {
    pub first_child: Vec<i32>,
    pub next_sibling: Vec<i32>,
}

pub fn child_links(parents: &[i32]) -> ChildLinks {
    let n = parents.len();
    let mut first_child = vec![-1i32; n];
    let mut next_sibling = vec![-1i32; n];
    // Walk backwards, prepending each child to its parent's list: children end up in index
    // order without a last-child array.
    for (i, &p) in parents.iter().enumerate().skip(1).rev() {
        if p < 0 {
            continue; // padding node: nobody's child
        }
        let p = p as usize;
        next_sibling[i] = first_child[p];
        first_child[p] = i as i32;
    }
    ChildLinks {
        first_child,
        next_sibling,
    }
}

/// Values of a dense mask: what a visible and a hidden entry hold.
pub trait MaskValue: Copy {
    const VISIBLE: Self;
    const HIDDEN: Self;
}
impl MaskValue for bool {
    const VISIBLE: Self = true;
    const HIDDEN: Self = false;
}
impl MaskValue for f32 {
    const VISIBLE: Self = 0.0;
    const HIDDEN: Self = f32::NEG_INFINITY;
}

/// Dense `[n, prefix_len + n]` mask, row-major: node i sees every prefix key and the tree
/// keys of itself and its ancestors.
pub fn attention_mask<T: MaskValue>(bits: &AncestorBits, prefix_len: usize) -> Vec<T> {
    let n = bits.rows;
    let cols = prefix_len + n;
    let mut out = vec![T::HIDDEN; n * cols];
    for (i, row) in out.chunks_exact_mut(cols).enumerate() {
        row[..prefix_len].fill(T::VISIBLE);
        for (w, &word) in bits.row(i).iter().enumerate() {
            let mut word = word;
            while word != 0 {
                let j = w * 64 + word.trailing_zeros() as usize;
                row[prefix_len + j] = T::VISIBLE;
                word &= word - 1;
            }
        }
    }
    out
}

/// RoPE position of every node: `prefix_len + depth` (the root sits at `prefix_len`, right
/// after the committed prefix), never the packed index.
pub fn position_ids(depths: &[i32], prefix_len: i64) -> Vec<i64> {
    depths.iter().map(|&d| prefix_len + d as i64).collect()
}

/// One row per leaf (in index order): the node indices from the root to the leaf, padded
/// with -1 to `max_depth + 1` columns. Returns (rows, columns, data).
pub fn retrieve_indices(parents: &[i32], depths: &[i32]) -> (usize, usize, Vec<i32>) {
    let n = parents.len();
    let mut has_child = vec![false; n];
    for &p in parents.iter().skip(1) {
        if p >= 0 {
            has_child[p as usize] = true;
        }
    }
    let cols = depths.iter().copied().max().unwrap_or(0) as usize + 1;
    let leaves: Vec<usize> = (0..n)
        .filter(|&i| !has_child[i] && (i == 0 || parents[i] >= 0))
        .collect();
    let mut data = vec![-1i32; leaves.len() * cols];
    for (row, &leaf) in leaves.iter().enumerate() {
        let mut node = leaf as i32;
        let mut d = depths[leaf] as usize;
        while node >= 0 {
            data[row * cols + d] = node;
            node = parents[node as usize];
            d = d.wrapping_sub(1);
        }
    }
    (leaves.len(), cols, data)
}

/// A tree padded to a fixed node count; padding nodes see only themselves, have parent -1
/// and depth 0, and are nobody's child, so a walk never accepts them.
#[derive(Debug, Clone)]
pub struct Padded {
    pub tree: DraftTree,
    pub num_real: usize,
}

pub fn pad_tree(tree: &DraftTree, budget: usize, pad_token: i64) -> Result<Padded, TreeError> {
    let n = tree.len();
    let drafted = n.saturating_sub(1);
    if drafted > budget {
        return Err(TreeError::PadTooSmall { drafted, budget });
    }
    let total = budget.saturating_add(1);
    check_tree_size(total)?;
    let mut t = tree.clone();
    t.tokens.resize(total, pad_token);
    t.parents.resize(total, -1);
    t.depths.resize(total, 0);
    t.logprobs.resize(total, f64::NEG_INFINITY);
    Ok(Padded {
        tree: t,
        num_real: n,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random parent arrays (each parent before its child, some extra roots).
    fn random_parents(n: usize, seed: u64) -> Vec<i32> {
        let mut s = seed;
        (0..n)
            .map(|i| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                if i == 0 || (s >> 60) == 0 {
                    -1
                } else {
                    ((s >> 33) % i as u64) as i32
                }
            })
            .collect()
    }

    fn naive_bits(parents: &[i32], w: usize) -> Vec<u64> {
        let mut words = vec![0u64; parents.len() * w];
        for i in 0..parents.len() {
            let mut j = i as i32;
            while j >= 0 {
                words[i * w + j as usize / 64] |= 1 << (j as usize % 64);
                j = parents[j as usize];
            }
        }
        words
    }

    #[test]
    fn every_fill_path_equals_the_naive_bits() {
        for (seed, n) in [
            (1, 1),
            (2, 63),
            (3, 64),
            (4, 65),
            (5, 300),
            (6, 1025),
            (7, 513),
            (8, 577),
        ] {
            let parents = random_parents(n, seed);
            let w = n.div_ceil(64).max(1);
            let want = naive_bits(&parents, w);
            assert_eq!(ancestor_bits(&parents).words, want);
            let mut out = vec![MaybeUninit::new(7u64); n * w];
            fill_rows(&parents, w, &mut out);
            let got: Vec<u64> = out.iter().map(|x| unsafe { x.assume_init() }).collect();
            assert_eq!(got, want, "generic path, n = {n}");
            #[cfg(target_arch = "x86_64")]
            if std::is_x86_feature_detected!("avx2") {
                let mut out = vec![MaybeUninit::new(7u64); n * w];
                unsafe { fill_rows_avx2(&parents, w, &mut out) };
                let got: Vec<u64> = out.iter().map(|x| unsafe { x.assume_init() }).collect();
                assert_eq!(got, want, "AVX2 path, n = {n}");
            }
        }
    }
}
