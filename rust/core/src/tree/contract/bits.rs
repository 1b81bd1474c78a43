//! The ancestor relation as bit-packed rows, the form every verifier mask is derived from.

use std::mem::MaybeUninit;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{ancestor_words, random_parents};

    fn read(out: &[MaybeUninit<u64>]) -> Vec<u64> {
        // SAFETY: the callers create every element with `MaybeUninit::new`.
        out.iter().map(|x| unsafe { x.assume_init() }).collect()
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
            let want = ancestor_words(&parents, w);
            assert_eq!(ancestor_bits(&parents).words, want);
            let mut out = vec![MaybeUninit::new(7u64); n * w];
            fill_rows(&parents, w, &mut out);
            assert_eq!(read(&out), want, "generic path, n = {n}");
            #[cfg(target_arch = "x86_64")]
            if std::is_x86_feature_detected!("avx2") {
                let mut out = vec![MaybeUninit::new(7u64); n * w];
                // SAFETY: the CPU has AVX2 (checked just above).
                unsafe { fill_rows_avx2(&parents, w, &mut out) };
                assert_eq!(read(&out), want, "AVX2 path, n = {n}");
            }
        }
    }
}
