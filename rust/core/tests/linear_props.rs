//! Quantized linear layers against independent oracles: the per-block dequantization of the
//! GGUF bytes (gguf-py's formula), a float64 product of those weights, and the portable
//! kernel (the fast kernel must agree with it bit for bit).

use proptest::prelude::*;
use specdec_core::linear::{BlockFormat, LinearError, Numeric, QuantMatrix, BLOCK};

/// Random GGUF bytes for a `rows x cols` matrix whose f16 scales are finite and modest.
fn raw_matrix(format: BlockFormat, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let mut raw = Vec::new();
    for _ in 0..rows * cols / BLOCK {
        let mut half = |bias: u16| {
            let bits = 0x2000 + bias + (next() % 0x1800) as u16; // about 2^-7 .. 2^-1
            let sign = if next() % 2 == 0 { 0 } else { 0x8000 };
            (bits | sign).to_le_bytes()
        };
        raw.extend_from_slice(&half(0));
        if format == BlockFormat::Q4_1 {
            raw.extend_from_slice(&half(0x400));
        }
        let n = format.block_bytes() - raw.len() % format.block_bytes();
        raw.extend((0..n).map(|_| next() as u8));
    }
    raw
}

fn oracle_weights(format: BlockFormat, rows: usize, cols: usize, raw: &[u8]) -> Vec<f32> {
    let mut out = Vec::with_capacity(rows * cols);
    let mut block = [0f32; BLOCK];
    for b in raw.chunks_exact(format.block_bytes()) {
        format.dequantize_block(b, &mut block);
        out.extend_from_slice(&block);
    }
    out
}

fn rows_of(seed: u64, m: usize, cols: usize) -> Vec<f32> {
    (0..m * cols)
        .map(|i| {
            let h = (i as u64 ^ seed).wrapping_mul(0x2545_f491_4f6c_dd1d) >> 40;
            (h as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
        })
        .collect()
}

fn formats() -> impl Strategy<Value = BlockFormat> {
    prop_oneof![Just(BlockFormat::Q4_1), Just(BlockFormat::Q8_0)]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn dequantize_matches_gguf_blocks(
        format in formats(), rows in 1usize..40, nb in 1usize..5, seed: u64,
    ) {
        let cols = nb * BLOCK;
        let raw = raw_matrix(format, rows, cols, seed);
        let m = QuantMatrix::from_gguf(format, rows, cols, &raw).unwrap();
        let want = oracle_weights(format, rows, cols, &raw);
        let got = m.dequantize();
        prop_assert!(want.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()));
    }

    #[test]
    fn product_matches_float64_and_kernels_agree(
        format in formats(), rows in 1usize..70, nb in 1usize..6, m in 0usize..20, seed: u64,
    ) {
        let cols = nb * BLOCK;
        let raw = raw_matrix(format, rows, cols, seed);
        let w = oracle_weights(format, rows, cols, &raw);
        let q = QuantMatrix::from_gguf(format, rows, cols, &raw).unwrap();
        let x = rows_of(seed, m, cols);
        let mut fast = vec![f32::NAN; m * rows];
        let mut slow = vec![f32::NAN; m * rows];
        q.matmul(&x, m, &mut fast).unwrap();
        q.matmul_portable(&x, m, &mut slow).unwrap();
        prop_assert!(fast.iter().zip(&slow).all(|(a, b)| a.to_bits() == b.to_bits()));
        for r in 0..m {
            for o in 0..rows {
                let (mut dot, mut mag) = (0f64, 0f64);
                for k in 0..cols {
                    let p = f64::from(x[r * cols + k]) * f64::from(w[o * cols + k]);
                    dot += p;
                    mag += p.abs();
                }
                let got = f64::from(fast[r * rows + o]);
                prop_assert!((got - dot).abs() <= 1e-6 * mag + 1e-30, "{got} vs {dot}");
            }
        }
    }

    #[test]
    fn a_row_does_not_depend_on_its_neighbours(
        format in formats(), rows in 1usize..40, m in 2usize..20, seed: u64,
    ) {
        let cols = 2 * BLOCK;
        let q = QuantMatrix::from_gguf(format, rows, cols, &raw_matrix(format, rows, cols, seed)).unwrap();
        let x = rows_of(seed, m, cols);
        let mut all = vec![0f32; m * rows];
        q.matmul(&x, m, &mut all).unwrap();
        for r in 0..m {
            let mut one = vec![0f32; rows];
            q.matmul(&x[r * cols..(r + 1) * cols], 1, &mut one).unwrap();
            prop_assert_eq!(&all[r * rows..(r + 1) * rows], &one[..]);
        }
    }
}

#[test]
fn stack_is_the_rows_concatenated() {
    let f = BlockFormat::Q4_1;
    let (a, b) = (raw_matrix(f, 20, 64, 1), raw_matrix(f, 7, 64, 2));
    let stacked = QuantMatrix::stack(&[(f, 20, 64, &a), (f, 7, 64, &b)]).unwrap();
    let joined: Vec<u8> = a.iter().chain(&b).copied().collect();
    assert_eq!(stacked, QuantMatrix::from_gguf(f, 27, 64, &joined).unwrap());
    let c = raw_matrix(f, 7, 96, 3);
    assert_eq!(
        QuantMatrix::stack(&[(f, 20, 64, &a), (f, 7, 96, &c)]),
        Err(LinearError::Join(64, 96))
    );
}

#[test]
fn bad_shapes_are_refused() {
    let f = BlockFormat::Q8_0;
    let raw = raw_matrix(f, 4, 64, 5);
    assert!(matches!(
        QuantMatrix::from_gguf(f, 4, 63, &raw),
        Err(LinearError::Columns { .. })
    ));
    assert!(matches!(
        QuantMatrix::from_gguf(f, 5, 64, &raw),
        Err(LinearError::Bytes { .. })
    ));
    assert!(matches!(
        QuantMatrix::from_gguf(f, 0, 64, &[]),
        Err(LinearError::Empty { .. })
    ));
    assert!(matches!(
        BlockFormat::from_name("Q4_K"),
        Err(LinearError::UnknownFormat(_))
    ));
    let q = QuantMatrix::from_gguf(f, 4, 64, &raw).unwrap();
    let mut out = vec![0f32; 8];
    assert_eq!(
        q.matmul(&[0.0; 100], 2, &mut out),
        Err(LinearError::InputWidth {
            expected: 64,
            got: 50
        })
    );
    assert!(matches!(
        q.matmul(&[0.0; 128], 2, &mut out[..7]),
        Err(LinearError::OutputSize { .. })
    ));
}

// ---- the int8 mode --------------------------------------------------------------------

/// The int8 mode's arithmetic written plainly from the GGUF blocks (not the tiles): each
/// row block quantized (`amax / 127`, round half to even), then per output and block the
/// integer dot product of the quants and the module's float steps, in block order.
fn oracle_int8(format: BlockFormat, rows: usize, cols: usize, raw: &[u8], x: &[f32]) -> Vec<f32> {
    let nb = cols / BLOCK;
    let m = x.len() / cols;
    let bb = format.block_bytes();
    let half = |b: &[u8], i: usize| half::f16::from_le_bytes([b[i], b[i + 1]]).to_f32();
    let mut out = vec![0f32; m * rows];
    for r in 0..m {
        // (quants, scale, scale * sum) of each block of row r
        let blocks: Vec<([i32; BLOCK], f32, f32)> = (0..nb)
            .map(|b| {
                let xb = &x[r * cols + b * BLOCK..][..BLOCK];
                let amax = xb.iter().map(|v| v.abs()).fold(0f32, f32::max);
                let d = amax / 127.0;
                let mut q = [0i32; BLOCK];
                if d > 0.0 {
                    for (qk, &v) in q.iter_mut().zip(xb) {
                        *qk = (v * (1.0 / d)).round_ties_even() as i32;
                    }
                }
                let d = if d > 0.0 { d } else { 0.0 };
                (q, d, d * q.iter().sum::<i32>() as f32)
            })
            .collect();
        for o in 0..rows {
            let mut acc = 0f32;
            for (b, (qx, dx, sx)) in blocks.iter().enumerate() {
                let blk = &raw[(o * nb + b) * bb..][..bb];
                let wq = |k: usize| match format {
                    BlockFormat::Q4_1 => {
                        let byte = blk[4 + k % 16];
                        i32::from(if k < 16 { byte & 0x0f } else { byte >> 4 })
                    }
                    BlockFormat::Q8_0 => i32::from(blk[2 + k] as i8),
                };
                let dot: i32 = (0..BLOCK).map(|k| wq(k) * qx[k]).sum();
                acc = (half(blk, 0) * dx).mul_add(dot as f32, acc);
                if format == BlockFormat::Q4_1 {
                    acc = half(blk, 2).mul_add(*sx, acc);
                }
            }
            out[r * rows + o] = acc;
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn int8_mode_is_its_plain_arithmetic_on_every_kernel(
        format in formats(), rows in 1usize..70, nb in 1usize..6, m in 0usize..20, seed: u64,
        zero_block in any::<bool>(),
    ) {
        let cols = nb * BLOCK;
        let raw = raw_matrix(format, rows, cols, seed);
        let q = QuantMatrix::from_gguf(format, rows, cols, &raw).unwrap();
        let mut x = rows_of(seed, m, cols);
        if zero_block && m > 0 {
            x[..BLOCK].fill(0.0); // a block of zeros: scale 0
        }
        let want = oracle_int8(format, rows, cols, &raw, &x);
        let mut fast = vec![f32::NAN; m * rows];
        let mut slow = vec![f32::NAN; m * rows];
        q.matmul_int8(&x, m, &mut fast).unwrap();
        q.matmul_int8_portable(&x, m, &mut slow).unwrap();
        prop_assert!(slow.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()));
        prop_assert!(fast.iter().zip(&slow).all(|(a, b)| a.to_bits() == b.to_bits()));
        // And near the float64 product: each input moves by at most half a quantization
        // step, amax / 254 of its block.
        let w = oracle_weights(format, rows, cols, &raw);
        for r in 0..m {
            for o in 0..rows {
                let (mut dot, mut bound) = (0f64, 0f64);
                for b in 0..nb {
                    let xb = &x[r * cols + b * BLOCK..][..BLOCK];
                    let amax = xb.iter().map(|v| f64::from(v.abs())).fold(0f64, f64::max);
                    for k in 0..BLOCK {
                        let wk = f64::from(w[o * cols + b * BLOCK + k]);
                        dot += f64::from(xb[k]) * wk;
                        bound += (amax / 254.0 + 1e-6 * f64::from(xb[k].abs())) * wk.abs();
                    }
                }
                let got = f64::from(fast[r * rows + o]);
                prop_assert!((got - dot).abs() <= bound * 1.01 + 1e-30, "{got} vs {dot} (bound {bound})");
            }
        }
    }

    #[test]
    fn int8_row_does_not_depend_on_its_neighbours(
        format in formats(), rows in 1usize..40, m in 2usize..20, seed: u64,
    ) {
        let cols = 2 * BLOCK;
        let q = QuantMatrix::from_gguf(format, rows, cols, &raw_matrix(format, rows, cols, seed)).unwrap();
        let x = rows_of(seed, m, cols);
        let mut all = vec![0f32; m * rows];
        q.matmul_int8(&x, m, &mut all).unwrap();
        for r in 0..m {
            let mut one = vec![0f32; rows];
            q.matmul_int8(&x[r * cols..(r + 1) * cols], 1, &mut one).unwrap();
            prop_assert_eq!(&all[r * rows..(r + 1) * rows], &one[..]);
        }
    }
}

#[test]
fn int8_mode_refuses_non_finite_inputs() {
    let f = BlockFormat::Q4_1;
    let q = QuantMatrix::from_gguf(f, 4, 64, &raw_matrix(f, 4, 64, 9)).unwrap();
    let mut x = vec![0.5f32; 128];
    x[64 + 3] = f32::INFINITY;
    let mut out = vec![0f32; 8];
    assert_eq!(
        q.matmul_int8(&x, 2, &mut out),
        Err(LinearError::NonFinite { row: 1, col: 3 })
    );
    x[64 + 3] = f32::NAN;
    assert!(q.matmul_int8_portable(&x, 2, &mut out).is_err());
}

#[test]
fn int8_layout_does_not_change_equality() {
    let f = BlockFormat::Q8_0;
    let raw = raw_matrix(f, 4, 64, 3);
    let (a, b) = (
        QuantMatrix::from_gguf(f, 4, 64, &raw).unwrap(),
        QuantMatrix::from_gguf(f, 4, 64, &raw).unwrap(),
    );
    let mut out = vec![0f32; 4];
    a.matmul_int8(&[0.25; 64], 1, &mut out).unwrap();
    assert!(a.nbytes() > b.nbytes());
    assert_eq!(a, b);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// The joined product of a `[A | B]` matrix is the two halves' products, as the plain
    /// product gives them, joined by the combine function: bit for bit, in both modes,
    /// over 1-40 rows (several row groups) and halves of 1-5 tiles.
    #[test]
    fn a_pair_product_joins_the_plain_products(
        format in formats(),
        tiles in 1usize..6,
        blocks in 1usize..4,
        m in 1usize..40,
        seed in any::<u64>(),
        int8 in any::<bool>(),
    ) {
        let (half, cols) = (16 * tiles, 32 * blocks);
        let q = QuantMatrix::from_gguf(format, 2 * half, cols, &raw_matrix(format, 2 * half, cols, seed)).unwrap();
        prop_assert!(q.pairs());
        let x = rows_of(seed, m, cols);
        let numeric = if int8 { Numeric::Int8 } else { Numeric::Exact };
        let mut plain = vec![0f32; m * 2 * half];
        q.matmul_in(numeric, &x, m, &mut plain).unwrap();
        let join = |a: &[f32], b: &[f32], o: &mut [f32]| {
            for ((o, &a), &b) in o.iter_mut().zip(a).zip(b) {
                *o = a * 3.0 - b;
            }
        };
        let mut want = vec![0f32; m * half];
        for (row, w) in plain.chunks_exact(2 * half).zip(want.chunks_exact_mut(half)) {
            join(&row[..half], &row[half..], w);
        }
        let mut got = vec![f32::NAN; m * half];
        q.matmul_pair_in(numeric, &x, m, &mut got, &join).unwrap();
        prop_assert_eq!(got, want);
    }
}

#[test]
fn a_pair_product_needs_halves_of_whole_tiles_and_sizes_that_fit() {
    let f = BlockFormat::Q8_0;
    let odd = QuantMatrix::from_gguf(f, 48, 32, &raw_matrix(f, 48, 32, 1)).unwrap();
    assert!(!odd.pairs());
    let join = |_: &[f32], _: &[f32], _: &mut [f32]| {};
    let x = rows_of(1, 2, 32);
    assert!(matches!(
        odd.matmul_pair_in(Numeric::Exact, &x, 2, &mut [0.0; 48], &join),
        Err(LinearError::Halves { rows: 48, .. })
    ));
    let q = QuantMatrix::from_gguf(f, 64, 32, &raw_matrix(f, 64, 32, 1)).unwrap();
    assert!(matches!(
        q.matmul_pair_in(Numeric::Exact, &x, 2, &mut [0.0; 128], &join),
        Err(LinearError::OutputSize { .. })
    ));
    assert!(matches!(
        q.matmul_pair_in(Numeric::Exact, &x[..40], 2, &mut [0.0; 64], &join),
        Err(LinearError::InputWidth { .. })
    ));
    let mut bad = x.clone();
    bad[3] = f32::INFINITY;
    assert!(matches!(
        q.matmul_pair_in(Numeric::Int8, &bad, 2, &mut [0.0; 64], &join),
        Err(LinearError::NonFinite { row: 0, col: 3 })
    ));
}

/// A matrix large enough to be split over the cores (chunks of pairs that do not align
/// with the plain product's): still the plain products, joined.
#[test]
fn a_large_pair_product_split_over_the_cores_joins_the_plain_products() {
    let (f, half, cols, m) = (BlockFormat::Q4_1, 1536, 576, 5);
    let q = QuantMatrix::from_gguf(f, 2 * half, cols, &raw_matrix(f, 2 * half, cols, 9)).unwrap();
    let x = rows_of(9, m, cols);
    let join = |a: &[f32], b: &[f32], o: &mut [f32]| {
        for ((o, &a), &b) in o.iter_mut().zip(a).zip(b) {
            *o = a - 2.0 * b;
        }
    };
    for numeric in [Numeric::Exact, Numeric::Int8] {
        let mut plain = vec![0f32; m * 2 * half];
        q.matmul_in(numeric, &x, m, &mut plain).unwrap();
        let mut got = vec![f32::NAN; m * half];
        q.matmul_pair_in(numeric, &x, m, &mut got, &join).unwrap();
        for (r, row) in plain.chunks_exact(2 * half).enumerate() {
            for j in 0..half {
                assert_eq!(
                    got[r * half + j],
                    row[j] - 2.0 * row[half + j],
                    "{numeric:?} {r} {j}"
                );
            }
        }
    }
}

// ---- the int8 mode's quantization ----------------------------------------------------------

/// A value of one of the shapes quantization meets at its edges: plain, a multiple of the
/// block's step plus one half (ties), subnormal, zero of either sign, huge.
fn edgy() -> impl Strategy<Value = f32> {
    prop_oneof![
        -4.0f32..4.0,
        (-254i32..=254).prop_map(|k| k as f32 * 0.5),
        (1u32..0x007f_ffff).prop_map(f32::from_bits),
        (1u32..0x007f_ffff).prop_map(|b| -f32::from_bits(b)),
        Just(0.0f32),
        Just(-0.0f32),
        (-3.0e38f32..3.0e38),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn simd_quantization_is_the_portable_one_bit_for_bit(
        blocks in proptest::collection::vec(proptest::collection::vec(edgy(), BLOCK), 1..12),
        zeros in any::<bool>(),
    ) {
        use specdec_core::linear::int8::{quantize_rows, quantize_rows_portable};
        let mut x: Vec<f32> = blocks.concat();
        if zeros {
            x[..BLOCK].fill(0.0);
        }
        let (m, cols) = if x.len().is_multiple_of(2 * BLOCK) { (2, x.len() / 2) } else { (1, x.len()) };
        let fast = quantize_rows(&x, m, cols);
        let slow = quantize_rows_portable(&x, m, cols);
        prop_assert_eq!(&fast.q, &slow.q);
        prop_assert!(fast.d.iter().zip(&slow.d).all(|(a, b)| a.to_bits() == b.to_bits()));
        prop_assert!(fast.s.iter().zip(&slow.s).all(|(a, b)| a.to_bits() == b.to_bits()));
        // And the plain definition: scale amax / 127, quants round(x / scale) half to even.
        for (b, xb) in x.chunks_exact(BLOCK).enumerate() {
            let amax = xb.iter().map(|v| v.abs()).fold(0f32, f32::max);
            let d = amax / 127.0;
            if d > 0.0 && (1.0 / d).is_finite() {
                prop_assert_eq!(slow.d[b].to_bits(), d.to_bits());
                for (k, &v) in xb.iter().enumerate() {
                    let want = (v * (1.0 / d)).round_ties_even() as i32;
                    prop_assert_eq!(i32::from(slow.q[b * BLOCK + k]), want.clamp(-127, 127));
                }
            }
        }
    }
}

#[test]
fn quantization_of_subnormal_blocks_matches_the_portable_steps() {
    use specdec_core::linear::int8::{quantize_rows, quantize_rows_portable};
    // Blocks whose scale is positive but whose reciprocal overflows, or whose scale
    // underflows to zero: the SIMD path hands them to the portable steps.
    let mut x = vec![0f32; 3 * BLOCK];
    for (i, v) in x.iter_mut().enumerate() {
        let bits = match i / BLOCK {
            0 => 0x0000_1000 + i as u32 * 77,   // small subnormals
            1 => 0x0040_0000 + i as u32 * 1013, // large subnormals
            _ => i as u32 % 3,                  // tiny, with zeros
        };
        *v = if i % 2 == 0 {
            f32::from_bits(bits)
        } else {
            -f32::from_bits(bits)
        };
    }
    let (fast, slow) = (
        quantize_rows(&x, 1, x.len()),
        quantize_rows_portable(&x, 1, x.len()),
    );
    assert_eq!(fast.q, slow.q);
    assert_eq!(
        fast.d.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        slow.d.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
    assert_eq!(
        fast.s.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        slow.s.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
    assert!(
        slow.d.iter().any(|&d| d > 0.0 && !(1.0 / d).is_finite()),
        "{:?}",
        slow.d
    );
}

/// The plain product with every output `allowed` does not want set to `-inf`: the oracle
/// of the masked product (`words` per row; outputs past them unwanted).
fn masked_oracle(plain: &[f32], rows: usize, allowed: &[u32]) -> Vec<f32> {
    let words = rows.div_ceil(32);
    let mut want = plain.to_vec();
    for (r, row) in want.chunks_exact_mut(rows).enumerate() {
        for (j, v) in row.iter_mut().enumerate() {
            if allowed[r * words + j / 32] >> (j % 32) & 1 == 0 {
                *v = f32::NEG_INFINITY;
            }
        }
    }
    want
}

/// Per row a mask of one of three kinds: a few allowed outputs, most of them, or all.
fn masks(seed: u64, m: usize, rows: usize) -> Vec<u32> {
    let words = rows.div_ceil(32);
    let mut s = seed | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let mut out = vec![0u32; m * words];
    for r in 0..m {
        let kind = next() % 3;
        for j in 0..rows {
            let on = match kind {
                0 => next() % 23 == 0,
                1 => next() % 5 != 0,
                _ => true,
            };
            if on {
                out[r * words + j / 32] |= 1 << (j % 32);
            }
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Masked: each wanted output is the plain product's, bit for bit, every other one
    /// `-inf`, whatever mix of sparse and dense rows, in both numeric modes.
    #[test]
    fn a_masked_product_is_the_plain_product_masked(
        format in formats(),
        rows in 1usize..200,
        blocks in 1usize..4,
        m in 1usize..20,
        seed in any::<u64>(),
        int8 in any::<bool>(),
    ) {
        let cols = 32 * blocks;
        let q = QuantMatrix::from_gguf(format, rows, cols, &raw_matrix(format, rows, cols, seed)).unwrap();
        let x = rows_of(seed, m, cols);
        let numeric = if int8 { Numeric::Int8 } else { Numeric::Exact };
        let mut plain = vec![0f32; m * rows];
        q.matmul_in(numeric, &x, m, &mut plain).unwrap();
        let allowed = masks(seed, m, rows);
        let mut got = vec![f32::NAN; m * rows];
        q.matmul_masked_in(numeric, &x, m, &mut got, &allowed).unwrap();
        prop_assert_eq!(got, masked_oracle(&plain, rows, &allowed));
    }
}

/// An LM head's size, split over the cores, a grammar allowing a handful of tokens in some
/// rows and free text in others: the plain product masked.
#[test]
fn a_large_masked_product_is_the_plain_product_masked() {
    let (f, rows, cols, m) = (BlockFormat::Q8_0, 49152, 64, 6);
    let q = QuantMatrix::from_gguf(f, rows, cols, &raw_matrix(f, rows, cols, 5)).unwrap();
    let x = rows_of(5, m, cols);
    let words = rows / 32;
    let mut allowed = vec![0u32; m * words];
    for (t, tok) in [17usize, 4000, 4001, 30000, 49151].iter().enumerate() {
        allowed[(t % 3) * words + tok / 32] |= 1 << (tok % 32); // rows 0-2: a few tokens
    }
    allowed[3 * words..4 * words].fill(u32::MAX); // row 3: every token
    allowed[4 * words..5 * words].fill(0x7fff_ffff); // row 4: most
                                                     // row 5: none
    for numeric in [Numeric::Exact, Numeric::Int8] {
        let mut plain = vec![0f32; m * rows];
        q.matmul_in(numeric, &x, m, &mut plain).unwrap();
        let mut got = vec![f32::NAN; m * rows];
        q.matmul_masked_in(numeric, &x, m, &mut got, &allowed)
            .unwrap();
        assert_eq!(got, masked_oracle(&plain, rows, &allowed), "{numeric:?}");
        assert!(got[5 * rows..].iter().all(|&v| v == f32::NEG_INFINITY));
    }
}

#[test]
fn a_masked_product_needs_a_mask_row_per_input_row() {
    let f = BlockFormat::Q8_0;
    let q = QuantMatrix::from_gguf(f, 40, 32, &raw_matrix(f, 40, 32, 1)).unwrap();
    let x = rows_of(1, 2, 32);
    let mut out = [0.0; 80];
    assert!(matches!(
        q.matmul_masked_in(Numeric::Exact, &x, 2, &mut out, &[u32::MAX; 3]),
        Err(LinearError::MaskSize {
            rows: 2,
            words: 2,
            got: 3
        })
    ));
}
