//! [`row_argmax`] against a scalar scan with numpy's rules (first maximum; NaN counts as
//! the largest, its first one): rows of a few values (one part, the serial path) and rows
//! of a vocabulary's size (several parts over the pool), with ties, infinities and NaNs.

use proptest::prelude::*;
use specdec_core::model::{row_argmax, ModelError};

fn reference(row: &[f32]) -> i64 {
    if let Some(i) = row.iter().position(|v| v.is_nan()) {
        return i as i64;
    }
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as i64
}

/// Values from a small set (ties are common), now and then an infinity or a NaN.
fn value() -> impl Strategy<Value = f32> {
    prop_oneof![
        20 => (-4i8..4).prop_map(f32::from),
        1 => Just(f32::INFINITY),
        1 => Just(f32::NEG_INFINITY),
        1 => Just(f32::NAN),
    ]
}

fn check(rows: usize, vocab: usize, logits: &[f32]) {
    let mut out = vec![-1i64; rows];
    row_argmax(logits, vocab, &mut out).unwrap();
    let want: Vec<i64> = logits.chunks_exact(vocab).map(reference).collect();
    assert_eq!(out, want);
}

proptest! {
    #[test]
    fn small_rows_match_the_reference(
        (vocab, logits) in (1usize..70).prop_flat_map(|v| (Just(v), prop::collection::vec(value(), v..=5 * v)))
    ) {
        let rows = logits.len() / vocab;
        check(rows, vocab, &logits[..rows * vocab]);
    }

    /// Rows of 40-50K values split over parts: the peak anywhere, ties across parts, NaNs
    /// placed after a larger value.
    #[test]
    fn vocabulary_rows_match_the_reference(
        vocab in 40_000usize..50_000,
        rows in 1usize..4,
        marks in prop::collection::vec((0usize..150_000, value()), 0..12),
    ) {
        let mut logits: Vec<f32> = (0..rows * vocab).map(|i| ((i * 7919) % 1000) as f32 / 1000.0).collect();
        for (at, v) in marks {
            let at = at % logits.len();
            logits[at] = v * 2.0;
        }
        check(rows, vocab, &logits);
    }
}

#[test]
fn all_negative_infinity_picks_the_first() {
    check(2, 20_000, &vec![f32::NEG_INFINITY; 40_000]);
}

#[test]
fn sizes_that_do_not_match_are_errors() {
    let mut out = vec![0i64; 2];
    assert!(matches!(
        row_argmax(&[0.0; 5], 3, &mut out),
        Err(ModelError::Size { .. })
    ));
    assert!(matches!(
        row_argmax(&[], 0, &mut out),
        Err(ModelError::Shape(_))
    ));
}
