//! The step's vector primitives. Each is written over 16 explicit lanes (a fixed summation
//! order) and compiled twice: plain, and inside an AVX-512 function (the same operations 16
//! wide, so both give the same bits); [`simd!`] picks one at run time.

/// Lanes of the explicit reductions (one 512-bit vector).
const LANES: usize = 16;

/// `pub fn name(simd: bool, args...)`: the body compiled plain and for AVX-512F, the latter
/// run where `simd` is true (the caller checked the CPU).
macro_rules! simd {
    ($(#[$m:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$m])*
        #[allow(clippy::too_many_arguments)]
        $vis fn $name(simd: bool, $($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            #[allow(clippy::too_many_arguments)]
            fn body($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx512f")]
            #[allow(clippy::too_many_arguments)]
            unsafe fn fast($($arg: $ty),*) $(-> $ret)? {
                body($($arg),*)
            }
            #[cfg(target_arch = "x86_64")]
            if simd {
                // SAFETY: callers pass `simd` only where AVX-512F is present.
                return unsafe { fast($($arg),*) };
            }
            let _ = simd;
            body($($arg),*)
        }
    };
}

/// The 16 lanes summed pairwise (a fixed order).
#[inline(always)]
fn reduce(mut acc: [f32; LANES]) -> f32 {
    let mut w = LANES / 2;
    while w > 0 {
        for j in 0..w {
            acc[j] += acc[j + w];
        }
        w /= 2;
    }
    acc[0]
}

/// `sum_i a[i] * b[i]` (equal lengths), lane `i % 16` summing its terms in order.
#[inline(always)]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for ((s, &p), &q) in acc.iter_mut().zip(x).zip(y) {
            *s += p * q;
        }
    }
    for ((s, &p), &q) in acc.iter_mut().zip(ra).zip(rb) {
        *s += p * q;
    }
    reduce(acc)
}

/// `sum_i a[i]^2 ` in the order of [`dot`].
#[inline(always)]
pub(crate) fn sum_squares(a: &[f32]) -> f32 {
    dot(a, a)
}

/// `sum_i a[i]`, lane `i % 16` summing its terms in order.
#[inline(always)]
pub(crate) fn sum(a: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let ca = a.chunks_exact(LANES);
    let ra = ca.remainder();
    for x in ca {
        for (s, &p) in acc.iter_mut().zip(x) {
            *s += p;
        }
    }
    for (s, &p) in acc.iter_mut().zip(ra) {
        *s += p;
    }
    reduce(acc)
}

/// `out[i] += p * v[i]`.
#[inline(always)]
pub(crate) fn axpy(out: &mut [f32], p: f32, v: &[f32]) {
    for (o, &x) in out.iter_mut().zip(v) {
        *o += p * x;
    }
}

const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23: adding it rounds to an integer
const MAGIC_BITS: i32 = 0x4B40_0000;

/// `e^x` to about 2 ulp (Cody-Waite reduction by ln 2, a degree-5 polynomial, the power of
/// two from the exponent bits): no branch, so a loop over it vectorizes. Inputs are clamped
/// to [-87, 88] (results stay normal and finite: the softmax and SiLU read them so).
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    let x = x.clamp(-87.0, 88.0);
    let t = x * std::f32::consts::LOG2_E + MAGIC;
    let fx = t - MAGIC;
    let n = (t.to_bits() as i32).wrapping_sub(MAGIC_BITS);
    // ln 2 in two parts: fx * 0.693359375 is exact (9 + 8 significant bits).
    let r = x - fx * 0.693_359_4 - fx * -2.121_944_4e-4;
    let z = r * r;
    let y = ((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r
        + 1.666_666_5e-1)
        * r
        + 0.5;
    let y = y * z + r + 1.0;
    y * f32::from_bits(((n + 127) as u32) << 23)
}

simd! {
    /// RMSNorm of each `width`-wide row of `x` into `out`: `(x * (1 / sqrt(mean(x^2) +
    /// eps))) * w`, as torch rounds it.
    pub(crate) fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
        let width = w.len();
        for (xr, or) in x.chunks_exact(width).zip(out.chunks_exact_mut(width)) {
            let inv = 1.0 / (sum_squares(xr) / width as f32 + eps).sqrt();
            for ((o, &a), &g) in or.iter_mut().zip(xr).zip(w) {
                *o = (a * inv) * g;
            }
        }
    }
}

simd! {
    /// `out[r, j] = silu(gu[r, j]) * gu[r, n + j]` for rows of `gu` `[gate (n) | up (n)]`:
    /// `silu(g) = g / (1 + e^-g)`.
    pub(crate) fn silu_mul(gu: &[f32], n: usize, out: &mut [f32]) {
        for (row, or) in gu.chunks_exact(2 * n).zip(out.chunks_exact_mut(n)) {
            let (g, u) = row.split_at(n);
            silu_mul_into(g, u, or);
        }
    }
}

simd! {
    /// `out[j] = silu(g[j]) * u[j]` (equal lengths): [`silu_mul`] on parts of a row.
    pub(crate) fn silu_mul_part(g: &[f32], u: &[f32], out: &mut [f32]) {
        silu_mul_into(g, u, out)
    }
}

#[inline(always)]
fn silu_mul_into(g: &[f32], u: &[f32], out: &mut [f32]) {
    for ((o, &a), &b) in out.iter_mut().zip(g).zip(u) {
        *o = (a / (1.0 + exp(-a))) * b;
    }
}

simd! {
    /// RoPE in place on the first `rotated` values (the q and k heads, `hd` each) of every
    /// `width`-wide token row of `qkv`, at the token's position: `x * cos + rot(x) * sin`
    /// from the tables `[positions, hd]` (`sin` with its first half negated), each product
    /// and the sum rounded as torch rounds them, the halves apart.
    pub(crate) fn rope(
        qkv: &mut [f32],
        width: usize,
        rotated: usize,
        hd: usize,
        positions: &[i64],
        cos_tab: &[f32],
        sin_tab: &[f32],
    ) {
        let half = hd / 2;
        let mut tmp = vec![0f32; hd];
        for (tok, &p) in qkv.chunks_exact_mut(width).zip(positions) {
            let at = p as usize * hd;
            let (cos, sin) = (&cos_tab[at..at + hd], &sin_tab[at..at + hd]);
            let (cos_lo, cos_hi) = cos.split_at(half);
            let (sin_lo, sin_hi) = sin.split_at(half);
            for x in tok[..rotated].chunks_exact_mut(hd) {
                tmp.copy_from_slice(x);
                let (t_lo, t_hi) = tmp.split_at(half);
                let (x_lo, x_hi) = x.split_at_mut(half);
                for ((((o, &a), &b), &c), &s) in
                    x_lo.iter_mut().zip(t_lo).zip(t_hi).zip(cos_lo).zip(sin_lo)
                {
                    *o = a * c + b * s;
                }
                for ((((o, &a), &b), &c), &s) in
                    x_hi.iter_mut().zip(t_hi).zip(t_lo).zip(cos_hi).zip(sin_hi)
                {
                    *o = a * c + b * s;
                }
            }
        }
    }
}

simd! {
    /// `x[i] += y[i]` (the residual).
    pub(crate) fn add_assign(x: &mut [f32], y: &[f32]) {
        for (a, &b) in x.iter_mut().zip(y) {
            *a += b;
        }
    }
}

/// The largest value of one part of a row and where it first occurs, NaN counting as the
/// largest (its first occurrence): numpy's and torch's argmax. Parts of a row combine with
/// [`Peak::max`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Peak {
    pub value: f32,
    pub index: usize,
}

impl Peak {
    /// The peak of two parts, `self` the one before `other` (ties keep the first).
    pub(crate) fn max(self, other: Peak) -> Peak {
        if self.value.is_nan() || !(other.value > self.value || other.value.is_nan()) {
            self
        } else {
            other
        }
    }
}

simd! {
    /// [`Peak`] of `x` (non-empty), its index offset by `start`: a lane-wise max and NaN
    /// scan (no branch, so it vectorizes), then the first 16-value chunk holding the peak.
    pub(crate) fn peak(x: &[f32], start: usize) -> Peak {
        let mut m = [f32::NEG_INFINITY; LANES];
        let mut nan = [false; LANES];
        let c = x.chunks_exact(LANES);
        let rest = c.remainder();
        for chunk in c {
            for ((a, n), &v) in m.iter_mut().zip(nan.iter_mut()).zip(chunk) {
                *a = if v > *a { v } else { *a };
                *n |= v.is_nan();
            }
        }
        let mut best = m.iter().fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a });
        for &v in rest {
            best = if v > best { v } else { best };
        }
        let is_nan = nan.iter().any(|&n| n) || rest.iter().any(|v| v.is_nan());
        // -inf everywhere (or NaN): the first value that is the peak
        let hit = |v: f32| if is_nan { v.is_nan() } else { v == best };
        let mut at = 0;
        for chunk in x.chunks(LANES) {
            if chunk.iter().fold(false, |h, &v| h | hit(v)) {
                let i = chunk.iter().position(|&v| hit(v)).unwrap_or(0);
                return Peak { value: x[at + i], index: start + at + i };
            }
            at += chunk.len();
        }
        Peak { value: x[0], index: start }
    }
}

/// Softmax of `scores` in place (max subtracted; `e / sum`).
#[inline(always)]
pub(crate) fn softmax_in_place(scores: &mut [f32]) {
    let m = scores.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    for s in scores.iter_mut() {
        *s = exp(*s - m);
    }
    let total = sum(scores);
    for s in scores.iter_mut() {
        *s /= total;
    }
}

#[cfg(test)]
simd! {
    /// [`softmax_in_place`], dispatched (for the tests).
    fn softmax(scores: &mut [f32]) {
        softmax_in_place(scores)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_within_a_few_ulp() {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            let want = (x as f64).exp();
            let got = exp(x) as f64;
            worst = worst.max(((got - want) / want).abs());
            x += 0.0137;
        }
        assert!(worst < 4.0 * f32::EPSILON as f64, "{worst}");
        assert_eq!(exp(0.0), 1.0);
        assert!(exp(-1000.0) > 0.0 && exp(-1000.0) < 1e-37);
        assert!(exp(f32::NAN).is_nan());
    }

    #[test]
    fn plain_and_simd_agree_bit_for_bit() {
        if !crate::linear::simd_available() {
            return;
        }
        let x: Vec<f32> = (0..3 * 40)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        let w: Vec<f32> = (0..40).map(|i| 1.0 + i as f32 / 100.0).collect();
        let (mut a, mut b) = (vec![0f32; 120], vec![0f32; 120]);
        rms_norm(false, &x, &w, 1e-5, &mut a);
        rms_norm(true, &x, &w, 1e-5, &mut b);
        assert_eq!(a, b);
        let (mut a, mut b) = (vec![0f32; 60], vec![0f32; 60]);
        silu_mul(false, &x, 20, &mut a);
        silu_mul(true, &x, 20, &mut b);
        assert_eq!(a, b);
        let (mut a, mut b) = (x.clone(), x.clone());
        softmax(false, &mut a);
        softmax(true, &mut b);
        assert_eq!(a, b);
    }
}
