//! [`LlamaStack`]: a Llama-style decoder (RMSNorm, RoPE, GQA, SwiGLU) on quantized weights,
//! run for a whole step in one call.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use super::kv::{KvBuffer, StepRows, Strides};
use super::ops;
use super::ModelError;
use crate::linear::pool::{self, OutPtr};
use crate::linear::{simd_available, Numeric, QuantMatrix};

/// The model's dimensions.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LlamaDims {
    pub hidden: usize,
    pub intermediate: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
    pub eps: f32,
}

impl LlamaDims {
    /// Width of the packed q/k/v output: `(heads + 2 kv_heads) * head_dim`.
    fn qkv_width(&self) -> usize {
        (self.heads + 2 * self.kv_heads) * self.head_dim
    }
}

/// A linear layer: `x @ W.T (+ bias)`.
#[derive(Debug, Clone)]
pub struct Linear {
    pub weight: Arc<QuantMatrix>,
    pub bias: Option<Vec<f32>>,
}

impl Linear {
    fn check(&self, name: &str, rows: usize, cols: usize) -> Result<(), ModelError> {
        let w = &self.weight;
        if (w.rows(), w.cols()) != (rows, cols) {
            return Err(ModelError::Weights(format!(
                "{name} must be {rows} x {cols}, got {} x {}",
                w.rows(),
                w.cols()
            )));
        }
        match &self.bias {
            Some(b) if b.len() != rows => Err(ModelError::Weights(format!(
                "{name}'s bias must have {rows} values, got {}",
                b.len()
            ))),
            _ => Ok(()),
        }
    }

    /// `out = x @ W.T + bias` for `m` rows, rounded as `numeric` says.
    fn apply(
        &self,
        numeric: Numeric,
        x: &[f32],
        m: usize,
        out: &mut [f32],
    ) -> Result<(), ModelError> {
        self.weight.matmul_in(numeric, x, m, out)?;
        if let Some(b) = &self.bias {
            for row in out.chunks_exact_mut(b.len()) {
                for (o, &c) in row.iter_mut().zip(b) {
                    *o += c;
                }
            }
        }
        Ok(())
    }
}

/// One decoder layer's weights: q/k/v packed as one product (`[q | k | v]` rows), gate/up as
/// one (`[gate | up]`).
#[derive(Debug, Clone)]
pub struct LayerWeights {
    pub input_norm: Vec<f32>,
    pub qkv: Linear,
    pub o: Linear,
    pub post_norm: Vec<f32>,
    pub gate_up: Linear,
    pub down: Linear,
}

/// Which hidden states a step keeps: the residual stream after each of `layers` (strictly
/// increasing) and, with `last_norm`, the final norm's output; written into `out`
/// `[tokens, (layers.len() + last_norm) * hidden]`, concatenated in that order.
#[derive(Debug)]
pub struct Capture<'a> {
    pub layers: &'a [usize],
    pub last_norm: bool,
    pub out: &'a mut [f32],
}

/// Where a stack's profiled steps spent their time ([`LlamaStack::set_profiling`]): wall
/// time of the calls, and its split into the products (every linear layer and the head,
/// biases included, and SwiGLU where the gate and up products are joined in place),
/// attention, and everything else (input checks, buffers, norms, RoPE, K/V writes,
/// residual adds, hidden-state copies). The phases sum to `wall_ns` up to the last clock
/// read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepProfile {
    pub calls: u64,
    pub wall_ns: u64,
    pub matmul_ns: u64,
    pub attention_ns: u64,
    pub other_ns: u64,
}

/// A stack's profiling switch and totals: atomics, so steps on a shared stack (`&self`)
/// add to them. A clone starts with profiling off and nothing counted.
#[derive(Debug, Default)]
struct Profiler {
    on: AtomicBool,
    /// calls, wall, then the phases in [`Laps`] order.
    totals: [AtomicU64; 5],
}

impl Clone for Profiler {
    fn clone(&self) -> Self {
        Self::default()
    }
}

const MATMUL: usize = 0;
const ATTENTION: usize = 1;
const OTHER: usize = 2;

/// One step's clock while profiling is on: each [`lap`](Self::lap) charges the time since
/// the previous one to a phase. Off, it holds no clock and a lap is one branch.
struct Laps {
    start: Option<Instant>,
    last: Option<Instant>,
    ns: [u64; 3],
}

impl Laps {
    fn new(on: bool) -> Self {
        let start = on.then(Instant::now);
        Self {
            start,
            last: start,
            ns: [0; 3],
        }
    }

    #[inline]
    fn lap(&mut self, phase: usize) {
        if let Some(last) = &mut self.last {
            let now = Instant::now();
            self.ns[phase] += now.duration_since(*last).as_nanos() as u64;
            *last = now;
        }
    }
}

/// A decoder stack: layers, final norm, LM head and the RoPE tables.
#[derive(Debug, Clone)]
pub struct LlamaStack {
    dims: LlamaDims,
    layers: Vec<LayerWeights>,
    norm: Vec<f32>,
    head: Linear,
    /// `cos` and sign-folded `sin` `[positions, head_dim]`: rotating `x` is
    /// `x * cos + swap_halves(x) * sin` (the first half of `sin` negated).
    rope_cos: Vec<f32>,
    rope_sin: Vec<f32>,
    profiler: Profiler,
}

thread_local! {
    /// Per thread: the visible slots' offsets and their scores (grown, never shrunk).
    static SCRATCH: RefCell<(Vec<usize>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// The attention of `nh` query heads sharing one K/V head (`q`, `out`: `nh` rows of
/// `d`) over the K/V rows at `offs` of `k` / `v`: `out = softmax(q . k * scale) @ v`
/// (`scores`: room for `nh * offs.len()` values; every `o + d` within `k` and `v`, which the
/// step's checks guarantee). The AVX-512 kernel where the CPU has it and the head dim is a
/// multiple of 16 (the same math, summed in another order): it reads each K/V row once for
/// the `nh` heads.
#[allow(clippy::too_many_arguments)]
fn attend_heads(
    simd: bool,
    d: usize,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    offs: &[usize],
    scale: f32,
    scores: &mut [f32],
    out: &mut [f32],
) {
    let (n, nh) = (offs.len(), q.len() / d);
    assert!(scores.len() == nh * n && out.len() == nh * d && q.len() == nh * d);
    #[cfg(target_arch = "x86_64")]
    if simd && d.is_multiple_of(16) && d <= 128 && (1..=4).contains(&nh) {
        let end = offs.iter().max().map_or(0, |&o| o + d);
        assert!(end <= k.len() && end <= v.len());
        // SAFETY: AVX-512F is present (`simd`); every row read lies within `k` / `v`
        // (asserted above); `q`, `out` and `scores` have the sizes asserted above.
        unsafe {
            match nh {
                1 => fast::attend::<1>(d, q, k, v, offs, scale, scores, out),
                2 => fast::attend::<2>(d, q, k, v, offs, scale, scores, out),
                3 => fast::attend::<3>(d, q, k, v, offs, scale, scores, out),
                _ => fast::attend::<4>(d, q, k, v, offs, scale, scores, out),
            }
        }
        return;
    }
    let _ = simd;
    for ((qh, sh), oh) in q
        .chunks_exact(d)
        .zip(scores.chunks_exact_mut(n))
        .zip(out.chunks_exact_mut(d))
    {
        for (s, &o) in sh.iter_mut().zip(offs) {
            *s = ops::dot(qh, &k[o..o + d]) * scale;
        }
        ops::softmax_in_place(sh);
        oh.fill(0.0);
        for (&p, &o) in sh.iter().zip(offs) {
            ops::axpy(oh, p, &v[o..o + d]);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod fast {
    use std::arch::x86_64::*;

    /// `e^x` 16 lanes at a time: [`super::ops::exp`]'s operations.
    ///
    /// # Safety
    /// AVX-512F present.
    #[target_feature(enable = "avx512f")]
    unsafe fn exp16(x: __m512) -> __m512 {
        let x = _mm512_min_ps(
            _mm512_max_ps(x, _mm512_set1_ps(-87.0)),
            _mm512_set1_ps(88.0),
        );
        let t = _mm512_add_ps(
            _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)),
            _mm512_set1_ps(12_582_912.0),
        );
        let fx = _mm512_sub_ps(t, _mm512_set1_ps(12_582_912.0));
        let n = _mm512_sub_epi32(_mm512_castps_si512(t), _mm512_set1_epi32(0x4B40_0000));
        let r = _mm512_sub_ps(x, _mm512_mul_ps(fx, _mm512_set1_ps(0.693_359_4)));
        let r = _mm512_sub_ps(r, _mm512_mul_ps(fx, _mm512_set1_ps(-2.121_944_4e-4)));
        let z = _mm512_mul_ps(r, r);
        let c = |a: f32| _mm512_set1_ps(a);
        let mut y = _mm512_add_ps(_mm512_mul_ps(c(1.987_569_1e-4), r), c(1.398_199_9e-3));
        y = _mm512_add_ps(_mm512_mul_ps(y, r), c(8.333_452e-3));
        y = _mm512_add_ps(_mm512_mul_ps(y, r), c(4.166_579_6e-2));
        y = _mm512_add_ps(_mm512_mul_ps(y, r), c(1.666_666_5e-1));
        y = _mm512_add_ps(_mm512_mul_ps(y, r), c(0.5));
        y = _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(y, z), r), c(1.0));
        let pow2 = _mm512_slli_epi32::<23>(_mm512_add_epi32(n, _mm512_set1_epi32(127)));
        _mm512_mul_ps(y, _mm512_castsi512_ps(pow2))
    }

    /// `out[j]` = the sum of `acc[j]`'s 16 lanes, for 16 vectors at once: pairs of vectors
    /// are folded into each other's halves, quarters, then lanes (46 instructions, not 16
    /// horizontal sums of ~8 each).
    ///
    /// # Safety
    /// AVX-512F present.
    #[target_feature(enable = "avx512f")]
    unsafe fn hsum16(acc: &[__m512; 16]) -> __m512 {
        // Rows j and j + 8: their 256-bit halves' sums, j's in the low half.
        let mut t = [_mm512_setzero_ps(); 8];
        for (j, tj) in t.iter_mut().enumerate() {
            let (a, b) = (acc[j], acc[j + 8]);
            *tj = _mm512_add_ps(
                _mm512_shuffle_f32x4::<0b01_00_01_00>(a, b),
                _mm512_shuffle_f32x4::<0b11_10_11_10>(a, b),
            );
        }
        // One row per 128-bit lane: rows (j, j + 8, j + 4, j + 12) of u[j].
        let mut u = [_mm512_setzero_ps(); 4];
        for (j, uj) in u.iter_mut().enumerate() {
            let (a, b) = (t[j], t[j + 4]);
            *uj = _mm512_add_ps(
                _mm512_shuffle_f32x4::<0b10_00_10_00>(a, b),
                _mm512_shuffle_f32x4::<0b11_01_11_01>(a, b),
            );
        }
        // Two rows per lane, interleaved: u[j]'s at even positions, u[j + 2]'s at odd.
        let v0 = _mm512_add_ps(
            _mm512_unpacklo_ps(u[0], u[2]),
            _mm512_unpackhi_ps(u[0], u[2]),
        );
        let v1 = _mm512_add_ps(
            _mm512_unpacklo_ps(u[1], u[3]),
            _mm512_unpackhi_ps(u[1], u[3]),
        );
        // Whole sums: lane L holds rows (r0, r2, r1, r3) of u[0..4]'s lane L.
        let w = _mm512_add_ps(
            _mm512_shuffle_ps::<0b01_00_01_00>(v0, v1),
            _mm512_shuffle_ps::<0b11_10_11_10>(v0, v1),
        );
        // w holds rows 0 2 1 3 8 10 9 11 4 6 5 7 12 14 13 15: back in order.
        let idx = _mm512_setr_epi32(0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15);
        _mm512_permutexvar_ps(idx, w)
    }

    /// [`super::attend_heads`] for `NH` heads and a head dim `d = 16 * nv`, `nv <= 8`.
    ///
    /// # Safety
    /// AVX-512F present; `q` and `out` hold `NH * d` values, `scores` `NH` per offset, and
    /// `o + d` is within `k` and `v` for every offset `o`.
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments, clippy::needless_range_loop)] // heads x lanes
    pub(super) unsafe fn attend<const NH: usize>(
        d: usize,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        offs: &[usize],
        scale: f32,
        scores: &mut [f32],
        out: &mut [f32],
    ) {
        let nv = d / 16;
        let n = offs.len();
        let mut qv = [[_mm512_setzero_ps(); 8]; NH];
        for (h, qh) in qv.iter_mut().enumerate() {
            for (c, lane) in qh.iter_mut().enumerate().take(nv) {
                // SAFETY: q holds NH * 16 * nv values.
                *lane = unsafe { _mm512_loadu_ps(q.as_ptr().add(h * d + 16 * c)) };
            }
        }
        let mut m = [f32::NEG_INFINITY; NH];
        let sp = scores.as_mut_ptr();
        // Scores 16 keys at a time per head: 16 dot products' lanes summed by one transpose
        // (`hsum16`), not a horizontal sum per key and head.
        let full = n / 16 * 16;
        let sv = _mm512_set1_ps(scale);
        // Each block's 16 K rows (4 KiB at d = 64) stay in L1 while every head reads them.
        let mut mv = [_mm512_set1_ps(f32::NEG_INFINITY); NH];
        for j0 in (0..full).step_by(16) {
            for h in 0..NH {
                let mut acc = [_mm512_setzero_ps(); 16];
                for (jj, a) in acc.iter_mut().enumerate() {
                    // SAFETY: offs[j0 + jj] + 16 * nv is within k (the caller's contract).
                    let kp = unsafe { k.as_ptr().add(*offs.get_unchecked(j0 + jj)) };
                    for c in 0..nv {
                        // SAFETY: as above.
                        let kc = unsafe { _mm512_loadu_ps(kp.add(16 * c)) };
                        *a = _mm512_fmadd_ps(qv[h][c], kc, *a);
                    }
                }
                // SAFETY: AVX-512F present (this function's contract).
                let s = _mm512_mul_ps(unsafe { hsum16(&acc) }, sv);
                // SAFETY: h * n + j0 + 16 <= NH * n.
                unsafe { _mm512_storeu_ps(sp.add(h * n + j0), s) };
                mv[h] = _mm512_max_ps(mv[h], s);
            }
        }
        for h in 0..NH {
            m[h] = _mm512_reduce_max_ps(mv[h]);
        }
        for (j, &o) in offs.iter().enumerate().skip(full) {
            // SAFETY: o + 16 * nv is within k (the caller's contract).
            let kp = unsafe { k.as_ptr().add(o) };
            let mut acc = [_mm512_setzero_ps(); NH];
            for c in 0..nv {
                // SAFETY: as above.
                let kc = unsafe { _mm512_loadu_ps(kp.add(16 * c)) };
                for h in 0..NH {
                    acc[h] = _mm512_fmadd_ps(qv[h][c], kc, acc[h]);
                }
            }
            for h in 0..NH {
                let s = _mm512_reduce_add_ps(acc[h]) * scale;
                // SAFETY: h * n + j < NH * n.
                unsafe { *sp.add(h * n + j) = s };
                m[h] = m[h].max(s);
            }
        }
        // Softmax per head: e^(s - max), summed in 16 lanes, then scaled by 1 / sum.
        let mut inv = [0f32; NH];
        for h in 0..NH {
            // SAFETY: head h's scores are sp[h * n .. (h + 1) * n].
            let p = unsafe { sp.add(h * n) };
            let full = n / 16 * 16;
            let mv = _mm512_set1_ps(m[h]);
            let mut total = _mm512_setzero_ps();
            for i in (0..full).step_by(16) {
                // SAFETY: i + 16 <= n.
                unsafe {
                    let e = exp16(_mm512_sub_ps(_mm512_loadu_ps(p.add(i)), mv));
                    _mm512_storeu_ps(p.add(i), e);
                    total = _mm512_add_ps(total, e);
                }
            }
            let mut sum = _mm512_reduce_add_ps(total);
            if full < n {
                let mask: __mmask16 = (1u32 << (n - full)).wrapping_sub(1) as __mmask16;
                // SAFETY: the masked lanes are i < n.
                unsafe {
                    let x = _mm512_maskz_loadu_ps(mask, p.add(full));
                    let e = exp16(_mm512_sub_ps(x, mv));
                    _mm512_mask_storeu_ps(p.add(full), mask, e);
                    sum += _mm512_reduce_add_ps(_mm512_maskz_mov_ps(mask, e));
                }
            }
            inv[h] = 1.0 / sum;
        }
        let mut acc = [[_mm512_setzero_ps(); 8]; NH];
        for (j, &o) in offs.iter().enumerate() {
            // SAFETY: o + 16 * nv is within v (the caller's contract).
            let vp = unsafe { v.as_ptr().add(o) };
            let mut pv = [_mm512_setzero_ps(); NH];
            for h in 0..NH {
                // SAFETY: h * n + j < NH * n.
                pv[h] = _mm512_set1_ps(unsafe { *sp.add(h * n + j) } * inv[h]);
            }
            for c in 0..nv {
                // SAFETY: as above.
                let vc = unsafe { _mm512_loadu_ps(vp.add(16 * c)) };
                for h in 0..NH {
                    acc[h][c] = _mm512_fmadd_ps(pv[h], vc, acc[h][c]);
                }
            }
        }
        for (h, ah) in acc.iter().enumerate() {
            for (c, a) in ah.iter().enumerate().take(nv) {
                // SAFETY: out holds NH * 16 * nv values.
                unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(h * d + 16 * c), *a) };
            }
        }
    }
}

impl LlamaStack {
    /// A stack from its weights, checked against `dims`. `rope_cos` / `rope_sin`: the
    /// tables `[positions, head_dim]` (see the field docs).
    pub fn new(
        dims: LlamaDims,
        layers: Vec<LayerWeights>,
        norm: Vec<f32>,
        head: Linear,
        rope_cos: Vec<f32>,
        rope_sin: Vec<f32>,
    ) -> Result<Self, ModelError> {
        let d = dims;
        let bad = |m: String| Err(ModelError::Weights(m));
        if [
            d.hidden,
            d.intermediate,
            d.heads,
            d.kv_heads,
            d.head_dim,
            d.vocab,
        ]
        .contains(&0)
        {
            return bad(format!("dimensions must be positive: {d:?}"));
        }
        if !d.heads.is_multiple_of(d.kv_heads) || !d.head_dim.is_multiple_of(2) {
            return bad(format!(
                "heads ({}) must be a multiple of kv_heads ({}) and head_dim ({}) even",
                d.heads, d.kv_heads, d.head_dim
            ));
        }
        if !(d.eps.is_finite() && d.eps >= 0.0) {
            return bad(format!("eps must be finite and >= 0, got {}", d.eps));
        }
        if layers.len() != d.layers || layers.is_empty() {
            return bad(format!(
                "{} layers given, the dimensions say {}",
                layers.len(),
                d.layers
            ));
        }
        let norm_len = |name: &str, n: &[f32]| {
            if n.len() == d.hidden {
                Ok(())
            } else {
                Err(ModelError::Weights(format!(
                    "{name} must have {} values, got {}",
                    d.hidden,
                    n.len()
                )))
            }
        };
        for (i, l) in layers.iter().enumerate() {
            norm_len(&format!("layer {i} input norm"), &l.input_norm)?;
            norm_len(&format!("layer {i} post-attention norm"), &l.post_norm)?;
            l.qkv
                .check(&format!("layer {i} q/k/v"), d.qkv_width(), d.hidden)?;
            l.o.check(&format!("layer {i} o"), d.hidden, d.heads * d.head_dim)?;
            l.gate_up
                .check(&format!("layer {i} gate/up"), 2 * d.intermediate, d.hidden)?;
            l.down
                .check(&format!("layer {i} down"), d.hidden, d.intermediate)?;
        }
        norm_len("final norm", &norm)?;
        head.check("head", d.vocab, d.hidden)?;
        if rope_cos.is_empty()
            || !rope_cos.len().is_multiple_of(d.head_dim)
            || rope_sin.len() != rope_cos.len()
        {
            return bad(format!(
                "RoPE tables must be [positions, {}], got {} and {} values",
                d.head_dim,
                rope_cos.len(),
                rope_sin.len()
            ));
        }
        Ok(Self {
            dims,
            layers,
            norm,
            head,
            rope_cos,
            rope_sin,
            profiler: Profiler::default(),
        })
    }

    /// Turns the per-phase clock of [`step`](Self::step) on or off (off when built). Off,
    /// a step reads no clock.
    pub fn set_profiling(&self, on: bool) {
        self.profiler.on.store(on, Ordering::Relaxed);
    }

    pub fn profiling(&self) -> bool {
        self.profiler.on.load(Ordering::Relaxed)
    }

    /// The totals of the steps that succeeded while profiling was on, since the last
    /// [`reset_profile`](Self::reset_profile).
    pub fn profile(&self) -> StepProfile {
        let t = |i: usize| self.profiler.totals[i].load(Ordering::Relaxed);
        StepProfile {
            calls: t(0),
            wall_ns: t(1),
            matmul_ns: t(2 + MATMUL),
            attention_ns: t(2 + ATTENTION),
            other_ns: t(2 + OTHER),
        }
    }

    pub fn reset_profile(&self) {
        for t in &self.profiler.totals {
            t.store(0, Ordering::Relaxed);
        }
    }

    pub fn dims(&self) -> &LlamaDims {
        &self.dims
    }

    /// Positions the RoPE tables cover.
    pub fn rope_positions(&self) -> usize {
        self.rope_cos.len() / self.dims.head_dim
    }

    /// One step: `x` `[rows * tokens, hidden]` (the new tokens' embeddings, row-major by
    /// row then token) through every layer, each layer writing the new tokens' K/V into
    /// `kv` at `rows.new_slots` and attending as `rows` says; then the final norm and the
    /// head into `logits` (`[rows * tokens, vocab]`, or with `last` `[rows, vocab]`: each
    /// row's last token only). Inputs are checked first: on an error nothing is written.
    pub fn step(
        &self,
        x: &[f32],
        rows: &StepRows<'_>,
        kv: &mut [KvBuffer<'_>],
        last: bool,
        logits: &mut [f32],
        capture: Option<Capture<'_>>,
    ) -> Result<(), ModelError> {
        self.step_in(Numeric::Exact, x, rows, kv, last, logits, capture)
    }

    /// [`step`](Self::step) with the products rounded as `numeric` says.
    #[allow(clippy::too_many_arguments)]
    pub fn step_in(
        &self,
        numeric: Numeric,
        x: &[f32],
        rows: &StepRows<'_>,
        kv: &mut [KvBuffer<'_>],
        last: bool,
        logits: &mut [f32],
        capture: Option<Capture<'_>>,
    ) -> Result<(), ModelError> {
        self.step_masked(numeric, x, rows, kv, last, logits, capture, None)
    }

    /// [`step_in`](Self::step_in) whose logits are masked: `allowed` holds one row of
    /// `ceil(vocab / 32)` words per logits row (a grammar's token bitmask: bit `t % 32` of
    /// word `t / 32` set where token `t` is allowed), and every token it does not allow
    /// gets `-inf`. The head computes only the weights of the tiles of 16 tokens that some
    /// row allows ([`QuantMatrix::matmul_masked_in`]): where a grammar allows a few tokens
    /// the head (a fifth of SmolLM2's weights) is mostly skipped. Allowed tokens' logits
    /// are `step_in`'s, bit for bit.
    #[allow(clippy::too_many_arguments)]
    pub fn step_masked(
        &self,
        numeric: Numeric,
        x: &[f32],
        rows: &StepRows<'_>,
        kv: &mut [KvBuffer<'_>],
        last: bool,
        logits: &mut [f32],
        capture: Option<Capture<'_>>,
        allowed: Option<&[u32]>,
    ) -> Result<(), ModelError> {
        if let Some(a) = allowed {
            let heads_out = if last {
                rows.rows
            } else {
                rows.rows * rows.tokens
            };
            super::check_size(
                "head mask",
                heads_out * self.dims.vocab.div_ceil(32),
                a.len(),
            )?;
        }
        let mut laps = Laps::new(self.profiling());
        self.run(
            numeric, x, rows, kv, last, logits, capture, allowed, &mut laps,
        )?;
        if let Some(start) = laps.start {
            laps.lap(OTHER);
            let p = &self.profiler.totals;
            p[0].fetch_add(1, Ordering::Relaxed);
            p[1].fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
            for (t, ns) in p[2..].iter().zip(laps.ns) {
                t.fetch_add(ns, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        numeric: Numeric,
        x: &[f32],
        rows: &StepRows<'_>,
        kv: &mut [KvBuffer<'_>],
        last: bool,
        logits: &mut [f32],
        capture: Option<Capture<'_>>,
        allowed: Option<&[u32]>,
        laps: &mut Laps,
    ) -> Result<(), ModelError> {
        let d = self.dims;
        rows.check(kv, self.rope_positions())?;
        let strides = kv
            .iter()
            .enumerate()
            .map(|(i, b)| b.strides(i, d.layers, d.kv_heads, d.head_dim))
            .collect::<Result<Vec<_>, _>>()?;
        let n = rows.rows * rows.tokens;
        super::check_size("x", n * d.hidden, x.len())?;
        let heads_out = if last { rows.rows } else { n };
        super::check_size("logits", heads_out * d.vocab, logits.len())?;
        let mut capture = capture;
        if let Some(c) = &capture {
            if c.layers.windows(2).any(|w| w[0] >= w[1])
                || c.layers.last().is_some_and(|&l| l >= d.layers)
            {
                return Err(ModelError::Capture(format!(
                    "layers must be strictly increasing and below {}, got {:?}",
                    d.layers, c.layers
                )));
            }
            let width = (c.layers.len() + usize::from(c.last_norm)) * d.hidden;
            super::check_size("hidden-state output", n * width, c.out.len())?;
        }
        let simd = simd_available();
        let (hid, qw) = (d.hidden, d.qkv_width());
        let mut x = x.to_vec();
        let mut h = vec![0f32; n * hid];
        let mut qkv = vec![0f32; n * qw];
        let mut att = vec![0f32; n * d.heads * d.head_dim];
        let mut tmp = vec![0f32; n * hid];
        let mut gu = Vec::new(); // [gate | up], where they are not joined in the product
        let mut act = vec![0f32; n * d.intermediate];
        let mut kept = 0;
        for (l, w) in self.layers.iter().enumerate() {
            ops::rms_norm(simd, &x, &w.input_norm, d.eps, &mut h);
            laps.lap(OTHER);
            w.qkv.apply(numeric, &h, n, &mut qkv)?;
            laps.lap(MATMUL);
            self.rope(simd, &mut qkv, rows.positions);
            self.write_kv(&qkv, l, rows, kv, &strides);
            laps.lap(OTHER);
            self.attention(simd, &qkv, l, rows, kv, &strides, &mut att);
            laps.lap(ATTENTION);
            w.o.apply(numeric, &att, n, &mut tmp)?;
            laps.lap(MATMUL);
            ops::add_assign(simd, &mut x, &tmp);
            ops::rms_norm(simd, &x, &w.post_norm, d.eps, &mut h);
            laps.lap(OTHER);
            if w.gate_up.bias.is_none() && w.gate_up.weight.pairs() {
                // SwiGLU inside the product: each core joins the gate and up values it made.
                let silu = |g: &[f32], u: &[f32], o: &mut [f32]| ops::silu_mul_part(simd, g, u, o);
                w.gate_up
                    .weight
                    .matmul_pair_in(numeric, &h, n, &mut act, &silu)?;
                laps.lap(MATMUL);
            } else {
                gu.resize(n * 2 * d.intermediate, 0.0);
                w.gate_up.apply(numeric, &h, n, &mut gu)?;
                laps.lap(MATMUL);
                Self::silu_mul_rows(simd, &gu, d.intermediate, &mut act);
                laps.lap(OTHER);
            }
            w.down.apply(numeric, &act, n, &mut tmp)?;
            laps.lap(MATMUL);
            ops::add_assign(simd, &mut x, &tmp);
            if let Some(c) = &mut capture {
                if c.layers.get(kept) == Some(&l) {
                    Self::keep(c, kept, hid, &x);
                    kept += 1;
                }
            }
        }
        ops::rms_norm(simd, &x, &self.norm, d.eps, &mut h);
        if let Some(c) = &mut capture {
            if c.last_norm {
                Self::keep(c, kept, hid, &h);
            }
        }
        let lasts: Vec<f32>;
        let (rows_in, m) = if last {
            let t = rows.tokens;
            lasts = (0..rows.rows)
                .flat_map(|r| {
                    h[((r + 1) * t - 1) * hid..(r + 1) * t * hid]
                        .iter()
                        .copied()
                })
                .collect();
            (&lasts[..], rows.rows)
        } else {
            (&h[..], n)
        };
        laps.lap(OTHER);
        match allowed {
            Some(a) if self.head.bias.is_none() => {
                self.head
                    .weight
                    .matmul_masked_in(numeric, rows_in, m, logits, a)?;
            }
            Some(a) => {
                self.head.apply(numeric, rows_in, m, logits)?;
                let words = d.vocab.div_ceil(32);
                for (row, mask) in logits.chunks_exact_mut(d.vocab).zip(a.chunks_exact(words)) {
                    crate::constrain::apply_bitmask_row(row, mask.iter().copied());
                }
            }
            None => self.head.apply(numeric, rows_in, m, logits)?,
        }
        laps.lap(MATMUL);
        Ok(())
    }

    /// [`ops::silu_mul`] over the rows of `gu`, the rows shared by the cores from two rows
    /// on: each row's gate and up values were just written by both cores' halves of the
    /// product, and one thread reading them all waits on the other core's cache. (One row
    /// split in two parts measures slower than one thread doing it.)
    fn silu_mul_rows(simd: bool, gu: &[f32], n: usize, act: &mut [f32]) {
        let rows = act.len() / n;
        if rows < 2 {
            ops::silu_mul(simd, gu, n, act);
            return;
        }
        let ptr = OutPtr(act.as_mut_ptr());
        let run = |r: usize| {
            // SAFETY: chunk r alone writes row r of `act` (`n` values at `r * n`), and `act`
            // outlives the run.
            let out = unsafe { std::slice::from_raw_parts_mut(ptr.add(r * n), n) };
            ops::silu_mul(simd, &gu[r * 2 * n..(r + 1) * 2 * n], n, out);
        };
        pool::run(rows, &run);
    }

    /// `src` `[tokens, hidden]` into block `at` of each token's capture row.
    fn keep(c: &mut Capture<'_>, at: usize, hidden: usize, src: &[f32]) {
        let width = (c.layers.len() + usize::from(c.last_norm)) * hidden;
        for (row, s) in c.out.chunks_exact_mut(width).zip(src.chunks_exact(hidden)) {
            row[at * hidden..(at + 1) * hidden].copy_from_slice(s);
        }
    }

    /// RoPE on the q and k heads of every token, at its position (checked in range).
    fn rope(&self, simd: bool, qkv: &mut [f32], positions: &[i64]) {
        let d = self.dims;
        ops::rope(
            simd,
            qkv,
            d.qkv_width(),
            (d.heads + d.kv_heads) * d.head_dim,
            d.head_dim,
            positions,
            &self.rope_cos,
            &self.rope_sin,
        );
    }

    /// The new tokens' K (after RoPE) and V into their slots of layer `l`.
    fn write_kv(
        &self,
        qkv: &[f32],
        l: usize,
        rows: &StepRows<'_>,
        kv: &mut [KvBuffer<'_>],
        strides: &[Strides],
    ) {
        let d = self.dims;
        let hd = d.head_dim;
        for (i, tok) in qkv.chunks_exact(d.qkv_width()).enumerate() {
            let b = rows.buffers[i / rows.tokens] as usize;
            let slot = rows.new_slots[i] as usize;
            let (buf, st) = (&mut kv[b], strides[b]);
            for g in 0..d.kv_heads {
                let at = st.at(l, g, slot);
                let k = &tok[(d.heads + g) * hd..][..hd];
                let v = &tok[(d.heads + d.kv_heads + g) * hd..][..hd];
                buf.k[at..at + hd].copy_from_slice(k);
                buf.v[at..at + hd].copy_from_slice(v);
            }
        }
    }

    /// Every new token's attention over its row's visible slots of layer `l`, into `out`
    /// `[tokens, heads * head_dim]`; split over the cores by (row, query head).
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        simd: bool,
        qkv: &[f32],
        l: usize,
        rows: &StepRows<'_>,
        kv: &[KvBuffer<'_>],
        strides: &[Strides],
        out: &mut [f32],
    ) {
        let d = self.dims;
        let (hd, hq, t_new) = (d.head_dim, d.heads, rows.tokens);
        let group = hq / d.kv_heads;
        let scale = 1.0 / (hd as f32).sqrt();
        // A chunk: one token's queries of `nh` heads of one K/V group, each K/V row read
        // once for them (at a long prefix the K/V reads, not the arithmetic, set the pace).
        let nh = (1..=group.min(4))
            .rev()
            .find(|n| group.is_multiple_of(*n))
            .unwrap_or(1);
        let per_token = hq / nh;
        let ptr = OutPtr(out.as_mut_ptr());
        let run = |chunk: usize| {
            let (i, h) = (chunk / per_token, chunk % per_token * nh);
            let (r, t) = (i / t_new, i % t_new);
            let b = rows.buffers[r] as usize;
            let (buf, st) = (&kv[b], strides[b]);
            let base = st.at(l, h / group, 0);
            let (k, v) = (&buf.k[base..], &buf.v[base..]);
            let row_slots = &rows.slots[r * rows.width..(r + 1) * rows.width];
            SCRATCH.with(|cell| {
                let mut cell = cell.borrow_mut();
                let (offs, scores) = &mut *cell;
                offs.clear();
                for (c, &s) in row_slots.iter().enumerate() {
                    if rows.visible(r, t, c) {
                        offs.push(st.at(0, 0, s as usize));
                    }
                }
                if scores.len() < nh * offs.len() {
                    scores.resize(nh * offs.len(), 0.0);
                }
                let q = &qkv[i * d.qkv_width() + h * hd..][..nh * hd];
                let at = (i * hq + h) * hd;
                // SAFETY: `at + nh * hd <= out.len()` (i < rows * tokens, h + nh <= heads),
                // and chunk (i, h) alone writes token i's heads h..h + nh: no two chunks
                // touch one value, and `out` outlives the run.
                let o = unsafe { std::slice::from_raw_parts_mut(ptr.add(at), nh * hd) };
                if offs.is_empty() {
                    o.fill(0.0);
                } else {
                    let sc = &mut scores[..nh * offs.len()];
                    attend_heads(simd, hd, q, k, v, offs, scale, sc, o);
                }
            });
        };
        let chunks = rows.rows * t_new * per_token;
        let work = rows.rows * t_new * hq * rows.width * hd;
        if work < 1 << 15 {
            (0..chunks).for_each(run);
        } else {
            pool::run(chunks, &run);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The portable attention (what CPUs without AVX-512 run) and the AVX-512 kernel
    /// against a float64 reference, for 1-4 heads, scattered rows and a ragged tail.
    #[test]
    fn attention_kernels_match_a_float64_reference() {
        // Key counts below, at and past the AVX-512 kernel's blocks of 16 keys.
        for (d, rows) in [(32, 37), (64, 24), (64, 100), (16, 5)] {
            attention_case(d, rows);
        }
    }

    fn attention_case(d: usize, rows: usize) {
        let val = |i: usize| ((i * 7919 % 1013) as f32 / 1013.0 - 0.5) * 3.0;
        let k: Vec<f32> = (0..rows * 2 * d).map(val).collect();
        let v: Vec<f32> = (0..rows * 2 * d).map(|i| val(i + 17)).collect();
        let offs: Vec<usize> = (0..rows)
            .filter(|r| r % 3 != 1)
            .map(|r| r * 2 * d + d)
            .collect();
        let scale = 1.0 / (d as f32).sqrt();
        for nh in 1..=4 {
            let q: Vec<f32> = (0..nh * d).map(|i| val(i + 5)).collect();
            let mut want = vec![0f64; nh * d];
            for h in 0..nh {
                let qh = &q[h * d..(h + 1) * d];
                let s: Vec<f64> = offs
                    .iter()
                    .map(|&o| {
                        let dot: f64 = (0..d).map(|e| f64::from(qh[e]) * f64::from(k[o + e])).sum();
                        dot * f64::from(scale)
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let tot: f64 = s.iter().map(|x| (x - m).exp()).sum();
                for (x, &o) in s.iter().zip(&offs) {
                    for e in 0..d {
                        want[h * d + e] += (x - m).exp() / tot * f64::from(v[o + e]);
                    }
                }
            }
            for simd in [false, simd_available()] {
                let mut scores = vec![0f32; nh * offs.len()];
                let mut out = vec![0f32; nh * d];
                attend_heads(simd, d, &q, &k, &v, &offs, scale, &mut scores, &mut out);
                for (g, w) in out.iter().zip(&want) {
                    assert!(
                        (f64::from(*g) - w).abs() < 1e-5,
                        "nh {nh} simd {simd}: {g} vs {w}"
                    );
                }
            }
        }
    }
}
