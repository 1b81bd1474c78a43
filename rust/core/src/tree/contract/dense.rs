//! Dense attention masks for verifiers that take one.

use super::AncestorBits;

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
