//! The int8 numeric mode: each input row is quantized per block of 32 columns to 8-bit
//! integers (scale `amax / 127`, round half to even, as llama.cpp's `Q8` activations), and
//! multiplied by the blocks' own integer quants with integer dot products (AVX-512 VNNI's
//! `vpdpbusd`: four byte products summed into each 32-bit lane), then scaled once per block.
//! A weight block's float weights are never formed: per output and block,
//!
//! - `Q4_1` (`w = d q + m`): `out += (d * dx) * Σ q qx`, then `out += m * sx`, where
//!   `sx = dx * Σ qx` is the row block's own sum;
//! - `Q8_0` (`w = d q`): `out += (d * dx) * Σ q qx`.
//!
//! The integer sums are exact (at most `32 * 127 * 127`, below `2^24`, so exact as floats
//! too), and the float steps are the same multiply and fused multiply-adds in the same
//! block order on every path: the VNNI kernel and the portable one agree bit for bit, and a
//! row's result does not depend on the rows beside it. The result differs from the float32
//! product by the activations' rounding (a relative error of about `2^-8` per value), the
//! numeric class of llama.cpp's CPU backend.

use half::f16;

use super::format::{BlockFormat, BLOCK};
use super::kernel::{tile_block_bytes, MAX_ROWS, TILE};

/// Input rows quantized per block: `q` (`m x cols`), and per row block its scale `d` and
/// `s = d * Σ q` (`m x cols / 32` each).
#[derive(Debug, Clone, PartialEq)]
pub struct Int8Rows {
    pub m: usize,
    pub cols: usize,
    pub q: Vec<i8>,
    pub d: Vec<f32>,
    pub s: Vec<f32>,
}

/// Quantize `m` rows of `cols` (a multiple of 32) floats. A block of zeros (or one whose
/// largest magnitude is not finite) gets scale 0 and zero quants; the caller checks for
/// non-finite inputs if it must refuse them. Runs [`vnni::quantize`] where the CPU has
/// AVX-512 (the same values, bit for bit), else [`quantize_rows_portable`].
pub fn quantize_rows(x: &[f32], m: usize, cols: usize) -> Int8Rows {
    #[cfg(target_arch = "x86_64")]
    if vnni::quantize_available() {
        let mut out = empty_rows(m, cols);
        vnni::quantize(x, &mut out);
        return out;
    }
    quantize_rows_portable(x, m, cols)
}

fn empty_rows(m: usize, cols: usize) -> Int8Rows {
    let nb = cols / BLOCK;
    Int8Rows {
        m,
        cols,
        q: vec![0i8; m * cols],
        d: vec![0f32; m * nb],
        s: vec![0f32; m * nb],
    }
}

/// [`quantize_rows`] in plain Rust (the reference).
pub fn quantize_rows_portable(x: &[f32], m: usize, cols: usize) -> Int8Rows {
    debug_assert_eq!(x.len(), m * cols);
    debug_assert_eq!(cols % BLOCK, 0);
    let mut out = empty_rows(m, cols);
    for (i, (xb, qb)) in x
        .chunks_exact(BLOCK)
        .zip(out.q.chunks_exact_mut(BLOCK))
        .enumerate()
    {
        if let Some((d, s)) = quantize_block(xb, qb) {
            out.d[i] = d;
            out.s[i] = s;
        }
    }
    out
}

/// One block's quants into `qb`; its `(scale, scale * Σ quants)`, or None (scale 0: the
/// quants stay zero).
fn quantize_block(xb: &[f32], qb: &mut [i8]) -> Option<(f32, f32)> {
    let amax = xb.iter().fold(0f32, |a, &v| a.max(v.abs()));
    let scale = amax / 127.0;
    if !(scale > 0.0 && scale.is_finite()) {
        return None;
    }
    let inv = 1.0 / scale;
    let mut sum = 0i32;
    for (o, &v) in qb.iter_mut().zip(xb) {
        // |v * inv| <= 127 up to one rounding: the clamp only guards that rounding.
        let r = (v * inv).round_ties_even().clamp(-127.0, 127.0) as i8;
        *o = r;
        sum += i32::from(r);
    }
    Some((scale, scale * sum as f32))
}

/// Bytes of one int8-mode tile-block (16 weight rows x 32 columns).
pub fn int8_block_bytes(format: BlockFormat) -> usize {
    match format {
        // d[16] f32, m[16] f32, then 4 x 64 bytes of nibbles (see `repack`).
        BlockFormat::Q4_1 => 128 + 256,
        // d[16] f32, Σq[16] i32, then 8 x 64 bytes of signed quants.
        BlockFormat::Q8_0 => 128 + 512,
    }
}

/// The int8 mode's tiles from the float mode's (`super::kernel`'s layout): per tile-block
/// the scales as f32, then the quants grouped so that one 64-byte load gives each of the
/// 16 lanes (weight rows) four consecutive columns, as `vpdpbusd` multiplies them:
///
/// - `Q4_1`: load `j` (0..4) holds, in lane `l`'s byte `i`, column `8j + i`'s quant in the
///   low nibble and column `8j + 4 + i`'s in the high one;
/// - `Q8_0`: load `j` (0..8) holds in lane `l`'s byte `i` column `4j + i`'s quant, and each
///   lane's quant sum (the offset that makes the inputs unsigned costs `128 * Σq`).
pub fn repack(format: BlockFormat, tiles: &[u8]) -> Vec<u8> {
    let (src_bb, dst_bb) = (tile_block_bytes(format), int8_block_bytes(format));
    let mut out = vec![0u8; tiles.len() / src_bb * dst_bb];
    for (src, dst) in tiles.chunks_exact(src_bb).zip(out.chunks_exact_mut(dst_bb)) {
        let half = |i: usize| f16::from_le_bytes([src[2 * i], src[2 * i + 1]]).to_f32();
        for lane in 0..TILE {
            dst[4 * lane..4 * lane + 4].copy_from_slice(&half(lane).to_le_bytes());
        }
        match format {
            BlockFormat::Q4_1 => {
                for lane in 0..TILE {
                    let m = half(TILE + lane).to_le_bytes();
                    dst[64 + 4 * lane..68 + 4 * lane].copy_from_slice(&m);
                }
                // Float layout: byte `64 + 16 p + lane` holds columns 2p (low), 2p + 1.
                let q = |lane: usize, k: usize| {
                    let b = src[64 + 16 * (k / 2) + lane];
                    if k.is_multiple_of(2) {
                        b & 0x0f
                    } else {
                        b >> 4
                    }
                };
                for j in 0..4 {
                    for lane in 0..TILE {
                        for i in 0..4 {
                            dst[128 + 64 * j + 4 * lane + i] =
                                q(lane, 8 * j + i) | (q(lane, 8 * j + 4 + i) << 4);
                        }
                    }
                }
            }
            BlockFormat::Q8_0 => {
                // Float layout: byte `32 + 16 k + lane` holds column k.
                for lane in 0..TILE {
                    let sum: i32 = (0..BLOCK)
                        .map(|k| i32::from(src[32 + 16 * k + lane] as i8))
                        .sum();
                    dst[64 + 4 * lane..68 + 4 * lane].copy_from_slice(&sum.to_le_bytes());
                }
                for j in 0..8 {
                    for lane in 0..TILE {
                        for i in 0..4 {
                            dst[128 + 64 * j + 4 * lane + i] = src[32 + 16 * (4 * j + i) + lane];
                        }
                    }
                }
            }
        }
    }
    out
}

fn f32_at(b: &[u8], i: usize) -> f32 {
    f32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
}

/// `out[r][lane]` for rows `r0..r0 + rows` of `x` and one int8 tile (the reference: scalar
/// integer sums, then the module's float steps in block order).
pub fn portable(
    format: BlockFormat,
    tile: &[u8],
    x: &Int8Rows,
    r0: usize,
    rows: usize,
    out: &mut [[f32; TILE]; MAX_ROWS],
) {
    let bb = int8_block_bytes(format);
    let nb = x.cols / BLOCK;
    for o in out.iter_mut().take(rows) {
        *o = [0.0; TILE];
    }
    for (b, tb) in tile.chunks_exact(bb).enumerate() {
        for (r, out_r) in out.iter_mut().enumerate().take(rows) {
            let row = r0 + r;
            let xq = &x.q[row * x.cols + b * BLOCK..][..BLOCK];
            let (dx, sx) = (x.d[row * nb + b], x.s[row * nb + b]);
            for lane in 0..TILE {
                let mut acc = 0i32;
                for (k, &xk) in xq.iter().enumerate() {
                    let wq = match format {
                        BlockFormat::Q4_1 => {
                            let (j, i) = (k / 8, k % 8);
                            let byte = tb[128 + 64 * j + 4 * lane + i % 4];
                            i32::from(if i < 4 { byte & 0x0f } else { byte >> 4 })
                        }
                        BlockFormat::Q8_0 => {
                            i32::from(tb[128 + 64 * (k / 4) + 4 * lane + k % 4] as i8)
                        }
                    };
                    acc += wq * i32::from(xk);
                }
                let u = f32_at(tb, lane) * dx;
                let mut v = u.mul_add(acc as f32, out_r[lane]);
                if format == BlockFormat::Q4_1 {
                    v = f32_at(tb, TILE + lane).mul_add(sx, v);
                }
                out_r[lane] = v;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub mod vnni {
    use std::arch::x86_64::*;

    use super::{int8_block_bytes, BlockFormat, Int8Rows, BLOCK, MAX_ROWS, TILE};

    /// Whether this CPU runs [`run`] (AVX-512 F, BW and VNNI).
    pub fn available() -> bool {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vnni")
    }

    /// Whether this CPU runs [`quantize`] (AVX-512 F).
    pub fn quantize_available() -> bool {
        std::arch::is_x86_feature_detected!("avx512f")
    }

    /// [`super::quantize_rows_portable`] into `out` (sized for `x`), 16 values per
    /// instruction: the same scale and reciprocal per block, the same products, rounded
    /// half to even (the rounding is fixed in the instruction, whatever the thread's MXCSR
    /// says). A block whose reciprocal scale overflows (subnormal inputs) takes the
    /// portable steps. The caller checked [`quantize_available`].
    pub fn quantize(x: &[f32], out: &mut Int8Rows) {
        assert!(quantize_available() && x.len() == out.m * out.cols);
        assert!(out.cols.is_multiple_of(BLOCK) && out.q.len() == x.len());
        // SAFETY: AVX-512F present (asserted); sizes as asserted.
        unsafe { quantize_avx512(x, out) }
    }

    /// # Safety
    /// AVX-512F present; `out` sized for `x` (see [`quantize`]).
    #[target_feature(enable = "avx512f")]
    unsafe fn quantize_avx512(x: &[f32], out: &mut Int8Rows) {
        const ROUND: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
        let (lo, hi) = (_mm512_set1_epi32(-127), _mm512_set1_epi32(127));
        for (i, (xb, qb)) in x
            .chunks_exact(BLOCK)
            .zip(out.q.chunks_exact_mut(BLOCK))
            .enumerate()
        {
            // SAFETY: `xb` is 32 floats and `qb` 32 bytes (chunks of BLOCK = 32).
            unsafe {
                let a = _mm512_loadu_ps(xb.as_ptr());
                let b = _mm512_loadu_ps(xb.as_ptr().add(16));
                let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
                let scale = amax / 127.0;
                if !(scale > 0.0 && scale.is_finite()) {
                    continue;
                }
                let inv = 1.0 / scale;
                if !inv.is_finite() {
                    if let Some((d, s)) = super::quantize_block(xb, qb) {
                        out.d[i] = d;
                        out.s[i] = s;
                    }
                    continue;
                }
                let vi = _mm512_set1_ps(inv);
                let qa = _mm512_cvt_roundps_epi32::<ROUND>(_mm512_mul_ps(a, vi));
                let qb32 = _mm512_cvt_roundps_epi32::<ROUND>(_mm512_mul_ps(b, vi));
                let qa = _mm512_max_epi32(_mm512_min_epi32(qa, hi), lo);
                let qb32 = _mm512_max_epi32(_mm512_min_epi32(qb32, hi), lo);
                let sum = _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb32));
                _mm_storeu_si128(qb.as_mut_ptr().cast(), _mm512_cvtepi32_epi8(qa));
                _mm_storeu_si128(qb.as_mut_ptr().add(16).cast(), _mm512_cvtepi32_epi8(qb32));
                out.d[i] = scale;
                out.s[i] = scale * sum as f32;
            }
        }
    }

    /// [`super::portable`] with `vpdpbusd`. The caller checked [`available`].
    pub fn run(
        format: BlockFormat,
        tile: &[u8],
        x: &Int8Rows,
        r0: usize,
        rows: usize,
        out: &mut [[f32; TILE]; MAX_ROWS],
    ) {
        assert!(available() && rows <= MAX_ROWS && r0 + rows <= x.m);
        assert_eq!(tile.len(), x.cols / BLOCK * int8_block_bytes(format));
        macro_rules! go {
            ($($n:literal)*) => {
                match rows {
                    $($n => {
                        // SAFETY: the features are present (asserted above); `tile` holds
                        // cols / 32 int8 tile-blocks and `x` rows r0..r0 + rows.
                        unsafe {
                            match format {
                                BlockFormat::Q4_1 => q4_1::<$n>(tile, x, r0, out),
                                BlockFormat::Q8_0 => q8_0::<$n>(tile, x, r0, out),
                            }
                        }
                    })*
                    _ => {}
                }
            };
        }
        go!(1 2 3 4 5 6 7 8);
    }

    /// The four quants at `p` as one 32-bit lane pattern, broadcast to every lane.
    ///
    /// # Safety
    /// `p` points at four readable bytes; AVX-512F present.
    #[inline(always)]
    unsafe fn quad(p: *const i8) -> __m512i {
        // SAFETY: the caller's contract.
        unsafe { _mm512_set1_epi32(p.cast::<i32>().read_unaligned()) }
    }

    /// # Safety
    /// AVX-512 F/BW/VNNI present; `tile` holds `x.cols / 32` Q4_1 int8 tile-blocks, and
    /// `x` rows `r0..r0 + R`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn q4_1<const R: usize>(
        tile: &[u8],
        x: &Int8Rows,
        r0: usize,
        out: &mut [[f32; TILE]; MAX_ROWS],
    ) {
        let nb = x.cols / BLOCK;
        let (xq, xd, xs) = (x.q.as_ptr(), x.d.as_ptr(), x.s.as_ptr());
        let mut acc_f = [_mm512_setzero_ps(); R];
        let nib = _mm512_set1_epi8(0x0f);
        for (b, tb) in tile
            .chunks_exact(int8_block_bytes(BlockFormat::Q4_1))
            .enumerate()
        {
            let p = tb.as_ptr();
            // Integer sums are exact in any order. Low and high nibbles share a row's chain
            // where enough rows interleave to hide `vpdpbusd`'s latency; a few rows keep
            // two chains each.
            let mut lo_acc = [_mm512_setzero_si512(); R];
            let mut hi_acc = [_mm512_setzero_si512(); R];
            for j in 0..4 {
                // SAFETY: `tb` is 384 bytes: nibbles at 128..384; each row of `x` holds
                // `cols` quants, and k0 + 8 j + 8 <= (b + 1) * 32 <= cols.
                unsafe {
                    let v = _mm512_loadu_si512(p.add(128 + 64 * j).cast());
                    let lo = _mm512_and_si512(v, nib);
                    let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), nib);
                    for r in 0..R {
                        let xr = xq.add((r0 + r) * x.cols + b * BLOCK + 8 * j);
                        lo_acc[r] = _mm512_dpbusd_epi32(lo_acc[r], lo, quad(xr));
                        if R >= 4 {
                            lo_acc[r] = _mm512_dpbusd_epi32(lo_acc[r], hi, quad(xr.add(4)));
                        } else {
                            hi_acc[r] = _mm512_dpbusd_epi32(hi_acc[r], hi, quad(xr.add(4)));
                        }
                    }
                }
            }
            // SAFETY: d at 0 and m at 64 of the 384-byte block; row blocks of `x` in range.
            unsafe {
                let (dw, mw) = (_mm512_loadu_ps(p.cast()), _mm512_loadu_ps(p.add(64).cast()));
                for r in 0..R {
                    let at = (r0 + r) * nb + b;
                    let acc = if R >= 4 {
                        lo_acc[r]
                    } else {
                        _mm512_add_epi32(lo_acc[r], hi_acc[r])
                    };
                    let u = _mm512_mul_ps(dw, _mm512_set1_ps(*xd.add(at)));
                    let f = _mm512_fmadd_ps(u, _mm512_cvtepi32_ps(acc), acc_f[r]);
                    acc_f[r] = _mm512_fmadd_ps(mw, _mm512_set1_ps(*xs.add(at)), f);
                }
            }
        }
        for r in 0..R {
            // SAFETY: `out[r]` is 16 floats.
            unsafe { _mm512_storeu_ps(out[r].as_mut_ptr(), acc_f[r]) };
        }
    }

    /// # Safety
    /// AVX-512 F/BW/VNNI present; `tile` holds `x.cols / 32` Q8_0 int8 tile-blocks, and
    /// `x` rows `r0..r0 + R`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn q8_0<const R: usize>(
        tile: &[u8],
        x: &Int8Rows,
        r0: usize,
        out: &mut [[f32; TILE]; MAX_ROWS],
    ) {
        let nb = x.cols / BLOCK;
        let (xq, xd) = (x.q.as_ptr(), x.d.as_ptr());
        let mut acc_f = [_mm512_setzero_ps(); R];
        // `vpdpbusd` multiplies unsigned by signed bytes: the inputs go unsigned as
        // `qx + 128` (the sign bit flipped), and `128 * Σq` comes off after.
        let flip = _mm512_set1_epi32(0x8080_8080u32 as i32);
        for (b, tb) in tile
            .chunks_exact(int8_block_bytes(BlockFormat::Q8_0))
            .enumerate()
        {
            let p = tb.as_ptr();
            let mut even = [_mm512_setzero_si512(); R];
            let mut odd = [_mm512_setzero_si512(); R];
            for j in (0..8).step_by(2) {
                // SAFETY: `tb` is 640 bytes: quants at 128..640; row quants in range as in
                // `q4_1`.
                unsafe {
                    let w0 = _mm512_loadu_si512(p.add(128 + 64 * j).cast());
                    let w1 = _mm512_loadu_si512(p.add(192 + 64 * j).cast());
                    for r in 0..R {
                        let xr = xq.add((r0 + r) * x.cols + b * BLOCK + 4 * j);
                        let x0 = _mm512_xor_si512(quad(xr), flip);
                        let x1 = _mm512_xor_si512(quad(xr.add(4)), flip);
                        even[r] = _mm512_dpbusd_epi32(even[r], x0, w0);
                        odd[r] = _mm512_dpbusd_epi32(odd[r], x1, w1);
                    }
                }
            }
            // SAFETY: d at 0 and Σq at 64 of the 640-byte block; row blocks in range.
            unsafe {
                let dw = _mm512_loadu_ps(p.cast());
                let offset = _mm512_slli_epi32::<7>(_mm512_loadu_si512(p.add(64).cast()));
                for r in 0..R {
                    let acc = _mm512_sub_epi32(_mm512_add_epi32(even[r], odd[r]), offset);
                    let u = _mm512_mul_ps(dw, _mm512_set1_ps(*xd.add((r0 + r) * nb + b)));
                    acc_f[r] = _mm512_fmadd_ps(u, _mm512_cvtepi32_ps(acc), acc_f[r]);
                }
            }
        }
        for r in 0..R {
            // SAFETY: `out[r]` is 16 floats.
            unsafe { _mm512_storeu_ps(out[r].as_mut_ptr(), acc_f[r]) };
        }
    }
}
