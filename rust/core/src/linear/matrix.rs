//! [`QuantMatrix`]: a weight matrix in a block format, repacked into tiles of 16 rows so that
//! one vector load gives 16 output columns' quants at one input column.

use std::sync::OnceLock;

use super::format::{BlockFormat, BLOCK};
use super::int8::{self, int8_block_bytes, Int8Rows};
use super::kernel::{self, tile_block_bytes, MAX_ROWS, TILE};
use super::pool::{self, OutPtr};
use super::{LinearError, Numeric};
use crate::constrain::apply_bitmask_row;

/// Whether the fast kernel runs on this CPU (AVX-512F). Without it [`QuantMatrix::matmul`]
/// runs the portable kernel: the same results, many times slower than a BLAS.
pub fn simd_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        kernel::avx512::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether the int8 mode's fast kernel runs on this CPU (AVX-512 F, BW and VNNI). Without
/// it [`QuantMatrix::matmul_int8`] runs the portable kernel: the same results, slower.
pub fn int8_simd_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        int8::vnni::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// A `rows x cols` weight matrix (`rows` outputs, `cols` inputs, as a linear layer's weight)
/// in a GGUF block format.
#[derive(Debug, Clone)]
pub struct QuantMatrix {
    format: BlockFormat,
    rows: usize,
    cols: usize,
    /// `ceil(rows / 16)` tiles, each `cols / 32` tile-blocks; rows past `rows` are zero.
    tiles: Vec<u8>,
    /// The same tiles in the int8 mode's layout ([`int8::repack`]), made on its first use.
    int8_tiles: OnceLock<Vec<u8>>,
}

impl PartialEq for QuantMatrix {
    fn eq(&self, other: &Self) -> bool {
        // The int8 layout is derived from the tiles, and only exists once used.
        (self.format, self.rows, self.cols) == (other.format, other.rows, other.cols)
            && self.tiles == other.tiles
    }
}

impl Eq for QuantMatrix {}

/// How many parts a product of `weight_bytes` over `units` tiles (or pairs) is split into:
/// below ~64 KiB of weights a second thread costs more than it saves; else about 8 parts a
/// thread, so a helper that joins late still finds some.
fn chunks(weight_bytes: usize, units: usize) -> usize {
    if weight_bytes < 1 << 16 {
        1
    } else {
        units.min(8 * (pool::helpers() + 1))
    }
}

/// One tile's products for a group of rows: `(tile, first row, rows, results)`.
type TileRows<'a> = dyn Fn(usize, usize, usize, &mut [[f32; TILE]; MAX_ROWS]) + Sync + 'a;

/// How [`QuantMatrix::matmul_pair_in`] joins a row's values of the two halves:
/// `(first half's, second half's, out)`, equal lengths.
pub type Combine<'a> = dyn Fn(&[f32], &[f32], &mut [f32]) + Sync + 'a;

impl QuantMatrix {
    /// A matrix from GGUF's bytes: `rows` rows, each `cols / 32` blocks of `format`.
    pub fn from_gguf(
        format: BlockFormat,
        rows: usize,
        cols: usize,
        raw: &[u8],
    ) -> Result<Self, LinearError> {
        if rows == 0 || cols == 0 {
            return Err(LinearError::Empty { rows, cols });
        }
        if !cols.is_multiple_of(BLOCK) {
            return Err(LinearError::Columns { format, cols });
        }
        let nb = cols / BLOCK;
        let bb = format.block_bytes();
        let expected = rows * nb * bb;
        if raw.len() != expected {
            return Err(LinearError::Bytes {
                format,
                rows,
                cols,
                expected,
                got: raw.len(),
            });
        }
        let tbb = tile_block_bytes(format);
        let ntiles = rows.div_ceil(TILE);
        let mut tiles = vec![0u8; ntiles * nb * tbb];
        for row in 0..rows {
            let (t, lane) = (row / TILE, row % TILE);
            for b in 0..nb {
                let src = &raw[(row * nb + b) * bb..][..bb];
                let dst = &mut tiles[(t * nb + b) * tbb..][..tbb];
                dst[2 * lane..2 * lane + 2].copy_from_slice(&src[0..2]);
                match format {
                    BlockFormat::Q4_1 => {
                        dst[32 + 2 * lane..34 + 2 * lane].copy_from_slice(&src[2..4]);
                        let q = |k: usize| {
                            let byte = src[4 + k % 16];
                            if k < 16 {
                                byte & 0x0f
                            } else {
                                byte >> 4
                            }
                        };
                        for p in 0..BLOCK / 2 {
                            dst[64 + 16 * p + lane] = q(2 * p) | (q(2 * p + 1) << 4);
                        }
                    }
                    BlockFormat::Q8_0 => {
                        for k in 0..BLOCK {
                            dst[32 + 16 * k + lane] = src[2 + k];
                        }
                    }
                }
            }
        }
        Ok(Self {
            format,
            rows,
            cols,
            tiles,
            int8_tiles: OnceLock::new(),
        })
    }

    /// The matrices one above the other (their rows concatenated): layers that read the same
    /// input (q/k/v, gate/up) as one product.
    pub fn stack(parts: &[(BlockFormat, usize, usize, &[u8])]) -> Result<Self, LinearError> {
        let Some(&(format, _, cols, _)) = parts.first() else {
            return Err(LinearError::Empty { rows: 0, cols: 0 });
        };
        let mut raw = Vec::new();
        let mut rows = 0;
        for &(f, r, c, bytes) in parts {
            if f != format || c != cols {
                return Err(LinearError::Join(cols, c));
            }
            let expected = r * (c / BLOCK) * f.block_bytes();
            if c % BLOCK != 0 || bytes.len() != expected {
                return Self::from_gguf(f, r, c, bytes); // the error for that part
            }
            raw.extend_from_slice(bytes);
            rows += r;
        }
        Self::from_gguf(format, rows, cols, &raw)
    }

    pub fn format(&self) -> BlockFormat {
        self.format
    }

    /// Output columns of a product (the weight's rows).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input columns (the weight's columns).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes the matrix holds (the int8 layout included once made).
    pub fn nbytes(&self) -> usize {
        self.tiles.len() + self.int8_tiles.get().map_or(0, Vec::len)
    }

    /// The float32 weights, row-major `rows x cols`, as gguf-py dequantizes them.
    pub fn dequantize(&self) -> Vec<f32> {
        let nb = self.cols / BLOCK;
        let tbb = tile_block_bytes(self.format);
        let mut out = vec![0f32; self.rows * self.cols];
        let mut w = [[0f32; TILE]; BLOCK];
        for (i, tb) in self.tiles.chunks_exact(tbb).enumerate() {
            let (t, b) = (i / nb, i % nb);
            kernel::dequantize_tile_block(self.format, tb, &mut w);
            for lane in 0..TILE.min(self.rows - t * TILE) {
                for (k, wk) in w.iter().enumerate() {
                    out[(t * TILE + lane) * self.cols + b * BLOCK + k] = wk[lane];
                }
            }
        }
        out
    }

    /// `out = x @ W.T`: `x` is `m x cols` row-major, `out` `m x rows`. Split over the
    /// cores by output columns (see `pool`); the fast kernel where the CPU has it.
    pub fn matmul(&self, x: &[f32], m: usize, out: &mut [f32]) -> Result<(), LinearError> {
        self.check(x, m, out)?;
        self.matmul_with(x, m, out, simd_available());
        Ok(())
    }

    /// [`matmul`](Self::matmul) or [`matmul_int8`](Self::matmul_int8), as `numeric` says.
    pub fn matmul_in(
        &self,
        numeric: Numeric,
        x: &[f32],
        m: usize,
        out: &mut [f32],
    ) -> Result<(), LinearError> {
        match numeric {
            Numeric::Exact => self.matmul(x, m, out),
            Numeric::Int8 => self.matmul_int8(x, m, out),
        }
    }

    /// Whether [`matmul_pair_in`](Self::matmul_pair_in) applies: the rows split into two
    /// halves of whole tiles.
    pub fn pairs(&self) -> bool {
        self.rows.is_multiple_of(2 * TILE)
    }

    /// For a matrix whose rows are two halves `[A | B]` (see [`pairs`](Self::pairs)):
    /// `out[r, j] = combine(x @ A.T, x @ B.T)[r, j]`, `out` `m x rows / 2`. Each core
    /// computes a tile of `A` and the matching tile of `B` and combines them at once, so the
    /// two halves' values never leave the core that made them (as `[A | B]` products
    /// followed by a pass over both, they are split between the cores' caches and read by
    /// one). The products are [`matmul_in`](Self::matmul_in)'s, bit for bit.
    pub fn matmul_pair_in(
        &self,
        numeric: Numeric,
        x: &[f32],
        m: usize,
        out: &mut [f32],
        combine: &Combine<'_>,
    ) -> Result<(), LinearError> {
        if !self.pairs() {
            return Err(LinearError::Halves {
                rows: self.rows,
                tile: TILE,
            });
        }
        self.check_input(x, m)?;
        if out.len() != m * self.rows / 2 {
            return Err(LinearError::OutputSize {
                rows: m,
                cols: self.rows / 2,
                expected: m * self.rows / 2,
                got: out.len(),
            });
        }
        match numeric {
            Numeric::Exact => {
                let per_tile = (self.cols / BLOCK) * tile_block_bytes(self.format);
                let simd = simd_available();
                self.split_pairs(
                    m,
                    out,
                    self.tiles.len(),
                    &self.exact_tiles(x, simd, per_tile),
                    combine,
                );
            }
            Numeric::Int8 => {
                let simd = int8_simd_available();
                let q = self.quantize(x, m, simd)?;
                let tiles = self.int8_tiles();
                self.split_pairs(
                    m,
                    out,
                    tiles.len(),
                    &self.int8_tile_rows(&q, tiles, simd),
                    combine,
                );
            }
        }
        Ok(())
    }

    /// [`matmul_in`](Self::matmul_in) where `allowed` says which outputs are wanted, and
    /// every other output is `-inf`: `m` rows of `ceil(rows / 32)` words, bit `j % 32` of
    /// word `j / 32` set where output `j` is wanted (the layout of a grammar's token
    /// bitmask, the product an LM head whose logits a grammar masks). A tile of 16 outputs
    /// that no row wants is not computed, and one that only rows wanting most tiles want is
    /// computed for those rows alone: a row that allows a few tokens pays for their
    /// weights, not the whole matrix. Wanted outputs are `matmul_in`'s, bit for bit.
    pub fn matmul_masked_in(
        &self,
        numeric: Numeric,
        x: &[f32],
        m: usize,
        out: &mut [f32],
        allowed: &[u32],
    ) -> Result<(), LinearError> {
        self.check(x, m, out)?;
        let words = self.rows.div_ceil(32);
        if allowed.len() != m * words {
            return Err(LinearError::MaskSize {
                rows: m,
                words,
                got: allowed.len(),
            });
        }
        let ntiles = self.rows.div_ceil(TILE);
        // Tile t holds outputs 16t..16t + 16: one half of word t / 2.
        let wants =
            |r: usize, t: usize| (allowed[r * words + t / 2] >> (16 * (t % 2))) & 0xffff != 0;
        let (mut dense, mut sparse) = (Vec::new(), Vec::new());
        for r in 0..m {
            let n = (0..ntiles).filter(|&t| wants(r, t)).count();
            if 2 * n > ntiles {
                dense.push(r);
            } else {
                sparse.push(r);
            }
        }
        if sparse.is_empty() {
            self.matmul_in(numeric, x, m, out)?;
        } else {
            // The tiles some sparse row wants, for every row (a loaded tile costs little more
            // for a few more rows); the others for the dense rows only.
            let mut shared = vec![false; ntiles];
            for &r in &sparse {
                for (t, s) in shared.iter_mut().enumerate() {
                    *s |= wants(r, t);
                }
            }
            let some: Vec<usize> = (0..ntiles).filter(|&t| shared[t]).collect();
            let rest: Vec<usize> = (0..ntiles).filter(|&t| !shared[t]).collect();
            let every: Vec<usize> = (0..m).collect();
            let xd: Vec<f32> = dense
                .iter()
                .flat_map(|&r| &x[r * self.cols..(r + 1) * self.cols])
                .copied()
                .collect();
            match numeric {
                Numeric::Exact => {
                    let per_tile = (self.cols / BLOCK) * tile_block_bytes(self.format);
                    let simd = simd_available();
                    let bytes = self.tiles.len();
                    self.split_some(
                        &some,
                        &every,
                        out,
                        bytes,
                        &self.exact_tiles(x, simd, per_tile),
                    );
                    let tile_rows = self.exact_tiles(&xd, simd, per_tile);
                    self.split_some(&rest, &dense, out, bytes, &tile_rows);
                }
                Numeric::Int8 => {
                    let simd = int8_simd_available();
                    let q = self.quantize(x, m, simd)?;
                    let tiles = self.int8_tiles();
                    let tile_rows = self.int8_tile_rows(&q, tiles, simd);
                    self.split_some(&some, &every, out, tiles.len(), &tile_rows);
                    if !dense.is_empty() {
                        let qd = self.quantize(&xd, dense.len(), simd)?;
                        let tile_rows = self.int8_tile_rows(&qd, tiles, simd);
                        self.split_some(&rest, &dense, out, tiles.len(), &tile_rows);
                    }
                }
            }
        }
        // Outputs not computed are never wanted: this sets them, with the rest unwanted.
        for (row, mask) in out
            .chunks_exact_mut(self.rows)
            .zip(allowed.chunks_exact(words))
        {
            apply_bitmask_row(row, mask.iter().copied());
        }
        Ok(())
    }

    /// [`matmul`](Self::matmul) with the portable kernel only (the reference).
    pub fn matmul_portable(&self, x: &[f32], m: usize, out: &mut [f32]) -> Result<(), LinearError> {
        self.check(x, m, out)?;
        self.matmul_with(x, m, out, false);
        Ok(())
    }

    /// `out = x @ W.T` in the int8 mode (see [`int8`](super::int8)): each row of `x`
    /// quantized per block of 32 to 8 bits, integer dot products with the quants. Rows with
    /// a non-finite value are refused (their quantization would hide it).
    pub fn matmul_int8(&self, x: &[f32], m: usize, out: &mut [f32]) -> Result<(), LinearError> {
        self.check(x, m, out)?;
        let simd = int8_simd_available();
        let q = self.quantize(x, m, simd)?;
        self.matmul_int8_rows(&q, out, simd);
        Ok(())
    }

    /// [`matmul_int8`](Self::matmul_int8) with the portable kernel only (the reference).
    pub fn matmul_int8_portable(
        &self,
        x: &[f32],
        m: usize,
        out: &mut [f32],
    ) -> Result<(), LinearError> {
        self.check(x, m, out)?;
        let q = self.quantize(x, m, false)?;
        self.matmul_int8_rows(&q, out, false);
        Ok(())
    }

    fn check_input(&self, x: &[f32], m: usize) -> Result<(), LinearError> {
        if x.len() != m * self.cols {
            let got = x.len().checked_div(m).unwrap_or(x.len());
            return Err(LinearError::InputWidth {
                expected: self.cols,
                got,
            });
        }
        Ok(())
    }

    /// `x` quantized ([`int8::quantize_rows`]; `simd` false: the portable steps).
    fn quantize(&self, x: &[f32], m: usize, simd: bool) -> Result<Int8Rows, LinearError> {
        // Whole chunks folded without an early exit vectorize; the position only on failure.
        let finite = x
            .chunks(256)
            .all(|c| c.iter().fold(true, |ok, v| ok & v.is_finite()));
        if !finite {
            let i = x.iter().position(|v| !v.is_finite()).unwrap_or(0);
            return Err(LinearError::NonFinite {
                row: i / self.cols,
                col: i % self.cols,
            });
        }
        Ok(if simd {
            int8::quantize_rows(x, m, self.cols)
        } else {
            int8::quantize_rows_portable(x, m, self.cols)
        })
    }

    fn int8_tiles(&self) -> &[u8] {
        self.int8_tiles
            .get_or_init(|| int8::repack(self.format, &self.tiles))
    }

    fn matmul_int8_rows(&self, x: &Int8Rows, out: &mut [f32], simd: bool) {
        let tiles = self.int8_tiles();
        self.split(x.m, out, tiles.len(), &self.int8_tile_rows(x, tiles, simd));
    }

    /// The int8 mode's products of one tile for a group of rows of `x`.
    fn int8_tile_rows<'a>(
        &'a self,
        x: &'a Int8Rows,
        tiles: &'a [u8],
        simd: bool,
    ) -> impl Fn(usize, usize, usize, &mut [[f32; TILE]; MAX_ROWS]) + Sync + 'a {
        let per_tile = (self.cols / BLOCK) * int8_block_bytes(self.format);
        move |t, r0, rows, res| {
            let tile = &tiles[t * per_tile..][..per_tile];
            #[cfg(target_arch = "x86_64")]
            if simd {
                int8::vnni::run(self.format, tile, x, r0, rows, res);
            } else {
                int8::portable(self.format, tile, x, r0, rows, res);
            }
            #[cfg(not(target_arch = "x86_64"))]
            {
                let _ = simd;
                int8::portable(self.format, tile, x, r0, rows, res);
            }
        }
    }

    fn check(&self, x: &[f32], m: usize, out: &[f32]) -> Result<(), LinearError> {
        self.check_input(x, m)?;
        if out.len() != m * self.rows {
            return Err(LinearError::OutputSize {
                rows: m,
                cols: self.rows,
                expected: m * self.rows,
                got: out.len(),
            });
        }
        Ok(())
    }

    fn matmul_with(&self, x: &[f32], m: usize, out: &mut [f32], simd: bool) {
        let per_tile = (self.cols / BLOCK) * tile_block_bytes(self.format);
        self.split(
            m,
            out,
            self.tiles.len(),
            &self.exact_tiles(x, simd, per_tile),
        );
    }

    /// The exact mode's products of one tile for a group of rows of `x`.
    fn exact_tiles<'a>(
        &'a self,
        x: &'a [f32],
        simd: bool,
        per_tile: usize,
    ) -> impl Fn(usize, usize, usize, &mut [[f32; TILE]; MAX_ROWS]) + Sync + 'a {
        move |t, r0, rows, res| {
            let tile = &self.tiles[t * per_tile..][..per_tile];
            let xs = &x[r0 * self.cols..(r0 + rows) * self.cols];
            #[cfg(target_arch = "x86_64")]
            if simd {
                kernel::avx512::run(self.format, tile, xs, self.cols, rows, res);
            } else {
                kernel::portable(self.format, tile, xs, self.cols, rows, res);
            }
            #[cfg(not(target_arch = "x86_64"))]
            {
                let _ = simd;
                kernel::portable(self.format, tile, xs, self.cols, rows, res);
            }
        }
    }

    /// Runs `tile_rows(t, r0, rows, res)` for every tile `t` and group of up to
    /// [`MAX_ROWS`] rows from `r0`, split over the cores by tiles (output columns), and
    /// copies each `res` into `out` (`m x rows`).
    fn split(&self, m: usize, out: &mut [f32], weight_bytes: usize, tile_rows: &TileRows<'_>) {
        if m == 0 {
            return;
        }
        let ntiles = self.rows.div_ceil(TILE);
        let chunks = chunks(weight_bytes, ntiles);
        let ptr = OutPtr(out.as_mut_ptr());
        let run = |part: usize| {
            let (lo, hi) = (ntiles * part / chunks, ntiles * (part + 1) / chunks);
            let mut res = [[0f32; TILE]; MAX_ROWS];
            for t in lo..hi {
                let width = TILE.min(self.rows - t * TILE);
                for r0 in (0..m).step_by(MAX_ROWS) {
                    let rows = MAX_ROWS.min(m - r0);
                    tile_rows(t, r0, rows, &mut res);
                    for (r, vals) in res.iter().enumerate().take(rows) {
                        let at = (r0 + r) * self.rows + t * TILE;
                        // SAFETY: `at + width <= m * rows` (checked sizes); each part writes
                        // only its own tiles' columns, so no two threads touch one value.
                        unsafe { std::ptr::copy_nonoverlapping(vals.as_ptr(), ptr.add(at), width) };
                    }
                }
            }
        };
        pool::run(chunks, &run);
    }

    /// [`split`](Self::split) over the tiles `tiles` only, for the rows `tile_rows` reads:
    /// its row `i` is written to row `rows_out[i]` of `out` (distinct rows, each below
    /// `out.len() / self.rows`). `weight_bytes`: the whole matrix's.
    fn split_some(
        &self,
        tiles: &[usize],
        rows_out: &[usize],
        out: &mut [f32],
        weight_bytes: usize,
        tile_rows: &TileRows<'_>,
    ) {
        let k = rows_out.len();
        if k == 0 || tiles.is_empty() {
            return;
        }
        let ntiles = self.rows.div_ceil(TILE);
        let chunks = chunks(weight_bytes / ntiles * tiles.len(), tiles.len());
        let ptr = OutPtr(out.as_mut_ptr());
        let run = |part: usize| {
            let (lo, hi) = (
                tiles.len() * part / chunks,
                tiles.len() * (part + 1) / chunks,
            );
            let mut res = [[0f32; TILE]; MAX_ROWS];
            for &t in &tiles[lo..hi] {
                let width = TILE.min(self.rows - t * TILE);
                for r0 in (0..k).step_by(MAX_ROWS) {
                    let rows = MAX_ROWS.min(k - r0);
                    tile_rows(t, r0, rows, &mut res);
                    for (r, vals) in res.iter().enumerate().take(rows) {
                        let at = rows_out[r0 + r] * self.rows + t * TILE;
                        // SAFETY: `at + width <= out.len()` (rows_out below the output's
                        // rows); each part writes only its own tiles' columns.
                        unsafe { std::ptr::copy_nonoverlapping(vals.as_ptr(), ptr.add(at), width) };
                    }
                }
            }
        };
        pool::run(chunks, &run);
    }

    /// [`split`](Self::split) over pairs of tiles: tile `t` of the first half and tile
    /// `t` of the second, joined by `combine` into `out` (`m x rows / 2`).
    fn split_pairs(
        &self,
        m: usize,
        out: &mut [f32],
        weight_bytes: usize,
        tile_rows: &TileRows<'_>,
        combine: &Combine<'_>,
    ) {
        if m == 0 {
            return;
        }
        let (half, npairs) = (self.rows / 2, self.rows / 2 / TILE);
        let chunks = chunks(weight_bytes, npairs);
        let ptr = OutPtr(out.as_mut_ptr());
        let run = |part: usize| {
            let (lo, hi) = (npairs * part / chunks, npairs * (part + 1) / chunks);
            let mut a = [[0f32; TILE]; MAX_ROWS];
            let mut b = [[0f32; TILE]; MAX_ROWS];
            for t in lo..hi {
                for r0 in (0..m).step_by(MAX_ROWS) {
                    let rows = MAX_ROWS.min(m - r0);
                    tile_rows(t, r0, rows, &mut a);
                    tile_rows(t + npairs, r0, rows, &mut b);
                    for (r, (va, vb)) in a.iter().zip(&b).enumerate().take(rows) {
                        // SAFETY: `(r0 + r) * half + t * TILE + TILE <= m * half` (whole
                        // tiles), and each part writes only its own tiles' columns.
                        let o = unsafe {
                            std::slice::from_raw_parts_mut(
                                ptr.add((r0 + r) * half + t * TILE),
                                TILE,
                            )
                        };
                        combine(va, vb, o);
                    }
                }
            }
        };
        pool::run(chunks, &run);
    }
}
