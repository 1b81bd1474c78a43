//! Tile kernels: the products of up to [`MAX_ROWS`] input rows with one tile of
//! [`TILE`] weight rows (output columns), in the summation order the module promises: per
//! output, one fused multiply-add chain over the even `k`, one over the odd `k`, added at the
//! end. [`portable`] is the reference; [`avx512`] does the same operations 16 lanes wide.

use half::f16;

use super::format::{BlockFormat, BLOCK};

/// Output columns per tile (one 16-lane float vector).
pub const TILE: usize = 16;
/// Input rows one kernel call handles (two accumulators each stay in registers).
pub const MAX_ROWS: usize = 8;

/// Bytes of one tile-block: the 16 rows' scales (and minima), then their 32 quants per row
/// interleaved so that one load gives the 16 rows' quants at one `k`.
pub fn tile_block_bytes(format: BlockFormat) -> usize {
    match format {
        // d[16], m[16] as f16; then 16 k-pairs of 16 bytes: low nibble k = 2p, high 2p + 1.
        BlockFormat::Q4_1 => 64 + 256,
        // d[16] as f16; then 32 k of 16 signed bytes.
        BlockFormat::Q8_0 => 32 + 512,
    }
}

/// Dequantize one tile-block into `w[k][lane]`.
pub fn dequantize_tile_block(format: BlockFormat, tb: &[u8], w: &mut [[f32; TILE]; BLOCK]) {
    let half = |i: usize| f16::from_le_bytes([tb[2 * i], tb[2 * i + 1]]).to_f32();
    match format {
        BlockFormat::Q4_1 => {
            for lane in 0..TILE {
                let (d, m) = (half(lane), half(TILE + lane));
                for p in 0..BLOCK / 2 {
                    let b = tb[64 + 16 * p + lane];
                    // One rounding, as gguf-py's two: `d * q` is exact (an f16 significand
                    // of 11 bits times 4 bits fits in float32's 24), so only the add rounds.
                    w[2 * p][lane] = d.mul_add(f32::from(b & 0x0f), m);
                    w[2 * p + 1][lane] = d.mul_add(f32::from(b >> 4), m);
                }
            }
        }
        BlockFormat::Q8_0 => {
            for lane in 0..TILE {
                let d = half(lane);
                for (k, wk) in w.iter_mut().enumerate() {
                    wk[lane] = f32::from(tb[32 + 16 * k + lane] as i8) * d;
                }
            }
        }
    }
}

/// `out[r][lane] = sum_k x[r * cols + k] * w[k][lane]` for `rows` rows (reference order).
pub fn portable(
    format: BlockFormat,
    tile: &[u8],
    x: &[f32],
    cols: usize,
    rows: usize,
    out: &mut [[f32; TILE]; MAX_ROWS],
) {
    let tbb = tile_block_bytes(format);
    let mut even = [[0f32; TILE]; MAX_ROWS];
    let mut odd = [[0f32; TILE]; MAX_ROWS];
    let mut w = [[0f32; TILE]; BLOCK];
    for (b, tb) in tile.chunks_exact(tbb).enumerate() {
        dequantize_tile_block(format, tb, &mut w);
        for r in 0..rows {
            let xr = &x[r * cols + b * BLOCK..][..BLOCK];
            for p in 0..BLOCK / 2 {
                for lane in 0..TILE {
                    even[r][lane] = xr[2 * p].mul_add(w[2 * p][lane], even[r][lane]);
                    odd[r][lane] = xr[2 * p + 1].mul_add(w[2 * p + 1][lane], odd[r][lane]);
                }
            }
        }
    }
    for r in 0..rows {
        for lane in 0..TILE {
            out[r][lane] = even[r][lane] + odd[r][lane];
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub mod avx512 {
    use std::arch::x86_64::*;

    use super::{tile_block_bytes, BlockFormat, BLOCK, MAX_ROWS, TILE};

    /// Whether this CPU runs [`run`].
    pub fn available() -> bool {
        std::arch::is_x86_feature_detected!("avx512f")
    }

    /// [`super::portable`], 16 lanes at a time. The caller checked [`available`].
    pub fn run(
        format: BlockFormat,
        tile: &[u8],
        x: &[f32],
        cols: usize,
        rows: usize,
        out: &mut [[f32; TILE]; MAX_ROWS],
    ) {
        assert!(available() && rows <= MAX_ROWS && x.len() >= rows * cols);
        assert_eq!(tile.len(), cols / BLOCK * tile_block_bytes(format));
        macro_rules! go {
            ($($n:literal)*) => {
                match rows {
                    $($n => {
                        // SAFETY: AVX-512F is present (asserted above); `tile` holds
                        // cols / 32 tile-blocks and `x` holds `rows` rows of `cols`.
                        unsafe {
                            match format {
                                BlockFormat::Q4_1 => q4_1::<$n>(tile, x, cols, out),
                                BlockFormat::Q8_0 => q8_0::<$n>(tile, x, cols, out),
                            }
                        }
                    })*
                    _ => {}
                }
            };
        }
        go!(1 2 3 4 5 6 7 8);
    }

    /// Both k-chains of every row, at input column `k` (even) and `k + 1` (odd), with the 16
    /// lanes' weights `w0` / `w1` there (a macro: closures would not see AVX-512).
    macro_rules! accumulate {
        ($x:ident, $cols:ident, $k:expr, $w0:ident, $w1:ident, $even:ident, $odd:ident) => {
            for r in 0..$even.len() {
                // SAFETY: row r of `x` holds `cols` values and k + 1 < cols (the callers'
                // contracts).
                let (x0, x1) = unsafe {
                    let xr = $x.as_ptr().add(r * $cols + $k);
                    (*xr, *xr.add(1))
                };
                $even[r] = _mm512_fmadd_ps(_mm512_set1_ps(x0), $w0, $even[r]);
                $odd[r] = _mm512_fmadd_ps(_mm512_set1_ps(x1), $w1, $odd[r]);
            }
        };
    }

    /// `out[r] = even[r] + odd[r]`.
    ///
    /// # Safety
    /// AVX-512F present.
    #[target_feature(enable = "avx512f")]
    unsafe fn finish<const R: usize>(
        even: &[__m512; R],
        odd: &[__m512; R],
        out: &mut [[f32; TILE]; MAX_ROWS],
    ) {
        for r in 0..R {
            // SAFETY: `out[r]` is 16 floats.
            unsafe { _mm512_storeu_ps(out[r].as_mut_ptr(), _mm512_add_ps(even[r], odd[r])) };
        }
    }

    /// # Safety
    /// AVX-512F present; `tile` holds `cols / 32` Q4_1 tile-blocks, `x` `R` rows of `cols`.
    #[target_feature(enable = "avx512f")]
    unsafe fn q4_1<const R: usize>(
        tile: &[u8],
        x: &[f32],
        cols: usize,
        out: &mut [[f32; TILE]; MAX_ROWS],
    ) {
        let mut even = [_mm512_setzero_ps(); R];
        let mut odd = [_mm512_setzero_ps(); R];
        // q as a float by table: `permutexvar` reads only an index's low 4 bits, so the low
        // nibble needs no mask and no conversion (one shift for the high one).
        let ints = _mm512_setr_ps(
            0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0,
        );
        for (b, tb) in tile
            .chunks_exact(tile_block_bytes(BlockFormat::Q4_1))
            .enumerate()
        {
            let p = tb.as_ptr();
            // SAFETY: `tb` is 320 bytes: scales at 0, minima at 32, quants at 64..320.
            let (d, m) = unsafe {
                (
                    _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())),
                    _mm512_cvtph_ps(_mm256_loadu_si256(p.add(32).cast())),
                )
            };
            let xb = b * BLOCK;
            for k2 in 0..BLOCK / 2 {
                // SAFETY: 64 + 16 * k2 + 16 <= 320.
                let q =
                    unsafe { _mm512_cvtepu8_epi32(_mm_loadu_si128(p.add(64 + 16 * k2).cast())) };
                // d * q + m with one rounding, as the portable kernel (d * q is exact).
                let w0 = _mm512_fmadd_ps(d, _mm512_permutexvar_ps(q, ints), m);
                let w1 =
                    _mm512_fmadd_ps(d, _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(q), ints), m);
                accumulate!(x, cols, xb + 2 * k2, w0, w1, even, odd);
            }
        }
        // SAFETY: AVX-512F is present (this function's own contract).
        unsafe { finish(&even, &odd, out) };
    }

    /// # Safety
    /// AVX-512F present; `tile` holds `cols / 32` Q8_0 tile-blocks, `x` `R` rows of `cols`.
    #[target_feature(enable = "avx512f")]
    unsafe fn q8_0<const R: usize>(
        tile: &[u8],
        x: &[f32],
        cols: usize,
        out: &mut [[f32; TILE]; MAX_ROWS],
    ) {
        let mut even = [_mm512_setzero_ps(); R];
        let mut odd = [_mm512_setzero_ps(); R];
        for (b, tb) in tile
            .chunks_exact(tile_block_bytes(BlockFormat::Q8_0))
            .enumerate()
        {
            let p = tb.as_ptr();
            // SAFETY: `tb` is 544 bytes: scales at 0, quants at 32..544.
            let d = unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())) };
            let xb = b * BLOCK;
            for k2 in 0..BLOCK / 2 {
                // SAFETY: 32 + 32 * k2 + 32 <= 544.
                let (q0, q1) = unsafe {
                    (
                        _mm512_cvtepi8_epi32(_mm_loadu_si128(p.add(32 + 32 * k2).cast())),
                        _mm512_cvtepi8_epi32(_mm_loadu_si128(p.add(48 + 32 * k2).cast())),
                    )
                };
                let w0 = _mm512_mul_ps(_mm512_cvtepi32_ps(q0), d);
                let w1 = _mm512_mul_ps(_mm512_cvtepi32_ps(q1), d);
                accumulate!(x, cols, xb + 2 * k2, w0, w1, even, odd);
            }
        }
        // SAFETY: AVX-512F is present (this function's own contract).
        unsafe { finish(&even, &odd, out) };
    }
}
