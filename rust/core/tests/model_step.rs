//! [`LlamaStack::step`] against a plain scalar reference: the same model computed in f64
//! from the dequantized weights, over each row's whole sequence (prefix causal, the step's
//! tokens under their mask), with its own K/V. Dense buffers (one per row, prefixes of
//! different lengths, padding columns), a shared paged buffer (two rows on the same prefix
//! slots, scattered slots), trees (ancestor masks, positions by depth), the parallel
//! attention path, hidden-state capture, `last`, and bad input.

use std::sync::Arc;

use half::f16;
use specdec_core::linear::{BlockFormat, QuantMatrix, BLOCK};
use specdec_core::model::{
    Capture, KvBuffer, KvOrder, LayerWeights, Linear, LlamaDims, LlamaStack, ModelError,
    StepProfile, StepRows,
};
use specdec_core::testing::Lcg;

const DIMS: LlamaDims = LlamaDims {
    hidden: 64,
    intermediate: 96,
    layers: 2,
    heads: 4,
    kv_heads: 2,
    head_dim: 16,
    vocab: 48,
    eps: 1e-5,
};
const ROPE_POSITIONS: usize = 256;

fn uniform(g: &mut Lcg, lo: f32, hi: f32) -> f32 {
    lo + (hi - lo) * g.uniform() as f32
}

/// Random GGUF blocks whose weights have a spread of about `1 / sqrt(cols)`.
fn matrix(g: &mut Lcg, format: BlockFormat, rows: usize, cols: usize) -> Arc<QuantMatrix> {
    let mut raw = Vec::new();
    let spread = 1.0 / (cols as f32).sqrt();
    for _ in 0..rows * cols / BLOCK {
        match format {
            BlockFormat::Q8_0 => {
                let d = f16::from_f32(spread / 73.0 * uniform(g, 0.5, 1.5));
                raw.extend_from_slice(&d.to_le_bytes());
                raw.extend((0..32).map(|_| g.below(255) as u8 ^ 0x80));
            }
            BlockFormat::Q4_1 => {
                let d = f16::from_f32(spread / 4.6 * uniform(g, 0.5, 1.5));
                let m = f16::from_f32(-7.5 * d.to_f32() + uniform(g, -0.1, 0.1) * spread);
                raw.extend_from_slice(&d.to_le_bytes());
                raw.extend_from_slice(&m.to_le_bytes());
                raw.extend((0..16).map(|_| g.below(256) as u8));
            }
        }
    }
    Arc::new(QuantMatrix::from_gguf(format, rows, cols, &raw).unwrap())
}

fn norm(g: &mut Lcg) -> Vec<f32> {
    (0..DIMS.hidden).map(|_| uniform(g, 0.9, 1.1)).collect()
}

fn rope_tables() -> (Vec<f32>, Vec<f32>) {
    let hd = DIMS.head_dim;
    let (mut cos, mut sin) = (Vec::new(), Vec::new());
    for p in 0..ROPE_POSITIONS {
        for j in 0..hd {
            let i = (j % (hd / 2)) as f32;
            let ang = p as f32 / 10000f32.powf(2.0 * i / hd as f32);
            cos.push(ang.cos());
            sin.push(if j < hd / 2 { -ang.sin() } else { ang.sin() });
        }
    }
    (cos, sin)
}

fn model(seed: u64, bias: bool) -> LlamaStack {
    let d = DIMS;
    let mut g = Lcg::new(seed);
    let lin = |g: &mut Lcg, f, rows, cols| Linear {
        weight: matrix(g, f, rows, cols),
        bias: bias.then(|| (0..rows).map(|_| uniform(g, -0.2, 0.2)).collect()),
    };
    let qkv = (d.heads + 2 * d.kv_heads) * d.head_dim;
    let layers = (0..d.layers)
        .map(|_| LayerWeights {
            input_norm: norm(&mut g),
            qkv: lin(&mut g, BlockFormat::Q4_1, qkv, d.hidden),
            o: lin(&mut g, BlockFormat::Q8_0, d.hidden, d.heads * d.head_dim),
            post_norm: norm(&mut g),
            gate_up: lin(&mut g, BlockFormat::Q4_1, 2 * d.intermediate, d.hidden),
            down: lin(&mut g, BlockFormat::Q8_0, d.hidden, d.intermediate),
        })
        .collect();
    let final_norm = norm(&mut g);
    let head = Linear {
        weight: matrix(&mut g, BlockFormat::Q8_0, d.vocab, d.hidden),
        bias: None,
    };
    let (cos, sin) = rope_tables();
    LlamaStack::new(d, layers, final_norm, head, cos, sin).unwrap()
}

/// A linear layer in f64: weights `[rows, cols]` and the bias.
type Lin64 = (Vec<f64>, Option<Vec<f64>>);

/// The model in f64, straight from the dequantized weights.
struct Reference {
    layers: Vec<[Lin64; 4]>,
    norms: Vec<[Vec<f64>; 2]>,
    final_norm: Vec<f64>,
    head: Vec<f64>,
}

fn to64(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| f64::from(x)).collect()
}

impl Reference {
    /// The weights of [`model`] (the same draws from the same seed), dequantized.
    fn new(seed: u64, bias: bool) -> Self {
        let d = DIMS;
        let mut g = Lcg::new(seed);
        let lin = |g: &mut Lcg, f, rows, cols| {
            let w = matrix(g, f, rows, cols);
            let b = bias.then(|| {
                (0..rows)
                    .map(|_| f64::from(uniform(g, -0.2, 0.2)))
                    .collect()
            });
            (to64(&w.dequantize()), b)
        };
        let qkv = (d.heads + 2 * d.kv_heads) * d.head_dim;
        let mut layers = Vec::new();
        let mut norms = Vec::new();
        for _ in 0..d.layers {
            let n1 = to64(&norm(&mut g));
            let a = lin(&mut g, BlockFormat::Q4_1, qkv, d.hidden);
            let o = lin(&mut g, BlockFormat::Q8_0, d.hidden, d.heads * d.head_dim);
            let n2 = to64(&norm(&mut g));
            let gu = lin(&mut g, BlockFormat::Q4_1, 2 * d.intermediate, d.hidden);
            let dn = lin(&mut g, BlockFormat::Q8_0, d.hidden, d.intermediate);
            layers.push([a, o, gu, dn]);
            norms.push([n1, n2]);
        }
        let final_norm = to64(&norm(&mut g));
        let head = to64(&matrix(&mut g, BlockFormat::Q8_0, d.vocab, d.hidden).dequantize());
        Reference {
            layers,
            norms,
            final_norm,
            head,
        }
    }

    fn linear(w: &Lin64, x: &[f64]) -> Vec<f64> {
        let cols = x.len();
        let rows = w.0.len() / cols;
        (0..rows)
            .map(|r| {
                let s: f64 = (0..cols).map(|c| w.0[r * cols + c] * x[c]).sum();
                s + w.1.as_ref().map_or(0.0, |b| b[r])
            })
            .collect()
    }

    fn rms(x: &[f64], w: &[f64]) -> Vec<f64> {
        let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
        let inv = 1.0 / (ms + f64::from(DIMS.eps)).sqrt();
        x.iter().zip(w).map(|(a, g)| a * inv * g).collect()
    }

    /// Llama's RoPE with the half-split layout: `x * cos + rotate_half(x) * sin`.
    fn rope(x: &mut [f64], pos: usize, cos: &[f32], sin_folded: &[f32]) {
        let hd = x.len();
        let h = hd / 2;
        let rot: Vec<f64> = (0..hd)
            .map(|j| if j < h { -x[j + h] } else { x[j - h] })
            .collect();
        for j in 0..hd {
            let c = f64::from(cos[pos * hd + j]);
            let s = f64::from(sin_folded[pos * hd + j]) * if j < h { -1.0 } else { 1.0 };
            x[j] = x[j] * c + rot[j] * s;
        }
    }

    /// Per token of a sequence: logits, the residual after each layer, the final norm.
    #[allow(clippy::type_complexity)]
    fn run(
        &self,
        emb: &[Vec<f32>],
        pos: &[usize],
        visible: &dyn Fn(usize, usize) -> bool,
    ) -> (Vec<Vec<f64>>, Vec<Vec<Vec<f64>>>, Vec<Vec<f64>>) {
        let d = DIMS;
        let (cos, sin) = rope_tables();
        let n = emb.len();
        let hd = d.head_dim;
        let mut x: Vec<Vec<f64>> = emb.iter().map(|e| to64(e)).collect();
        let mut per_layer = Vec::new();
        for (l, w) in self.layers.iter().enumerate() {
            let mut q = vec![vec![vec![0f64; hd]; d.heads]; n];
            let mut k = vec![vec![vec![0f64; hd]; d.kv_heads]; n];
            let mut v = vec![vec![vec![0f64; hd]; d.kv_heads]; n];
            for i in 0..n {
                let h = Self::rms(&x[i], &self.norms[l][0]);
                let y = Self::linear(&w[0], &h);
                for a in 0..d.heads {
                    q[i][a].copy_from_slice(&y[a * hd..(a + 1) * hd]);
                    Self::rope(&mut q[i][a], pos[i], &cos, &sin);
                }
                for a in 0..d.kv_heads {
                    k[i][a].copy_from_slice(&y[(d.heads + a) * hd..][..hd]);
                    Self::rope(&mut k[i][a], pos[i], &cos, &sin);
                    v[i][a].copy_from_slice(&y[(d.heads + d.kv_heads + a) * hd..][..hd]);
                }
            }
            for i in 0..n {
                let mut att = vec![0f64; d.heads * hd];
                for a in 0..d.heads {
                    let g = a / (d.heads / d.kv_heads);
                    let js: Vec<usize> = (0..n).filter(|&j| visible(i, j)).collect();
                    let sc: Vec<f64> = js
                        .iter()
                        .map(|&j| {
                            let dot: f64 = (0..hd).map(|e| q[i][a][e] * k[j][g][e]).sum();
                            dot / (hd as f64).sqrt()
                        })
                        .collect();
                    let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let ex: Vec<f64> = sc.iter().map(|s| (s - m).exp()).collect();
                    let tot: f64 = ex.iter().sum();
                    for (p, &j) in ex.iter().zip(&js) {
                        for e in 0..hd {
                            att[a * hd + e] += p / tot * v[j][g][e];
                        }
                    }
                }
                let o = Self::linear(&w[1], &att);
                for (a, b) in x[i].iter_mut().zip(o) {
                    *a += b;
                }
                let h = Self::rms(&x[i], &self.norms[l][1]);
                let gu = Self::linear(&w[2], &h);
                let act: Vec<f64> = (0..d.intermediate)
                    .map(|j| {
                        let gt = gu[j];
                        gt / (1.0 + (-gt).exp()) * gu[d.intermediate + j]
                    })
                    .collect();
                let dn = Self::linear(&w[3], &act);
                for (a, b) in x[i].iter_mut().zip(dn) {
                    *a += b;
                }
            }
            per_layer.push(x.clone());
        }
        let fin: Vec<Vec<f64>> = x.iter().map(|r| Self::rms(r, &self.final_norm)).collect();
        let head = (self.head.clone(), None);
        let logits = fin.iter().map(|h| Self::linear(&head, h)).collect();
        (logits, per_layer, fin)
    }
}

fn embeddings(g: &mut Lcg, n: usize) -> Vec<Vec<f32>> {
    (0..n)
        .map(|_| (0..DIMS.hidden).map(|_| uniform(g, -1.7, 1.7)).collect())
        .collect()
}

fn close(got: &[f32], want: &[f64], what: &str) {
    let scale = want.iter().fold(1f64, |a, b| a.max(b.abs()));
    let worst = got
        .iter()
        .zip(want)
        .fold(0f64, |a, (&g, &w)| a.max((f64::from(g) - w).abs()));
    // Float32 against float64: the step's rounding, far below the exact mode's 1e-4.
    assert!(
        worst <= 2e-5 * scale,
        "{what}: off by {worst} (scale {scale})"
    );
}

/// A tree's parents -> (depths, ancestor-or-self mask [n, n]).
fn tree(parents: &[i64]) -> (Vec<usize>, Vec<bool>) {
    let n = parents.len();
    let mut depth = vec![0usize; n];
    let mut mask = vec![false; n * n];
    for i in 0..n {
        let mut j = i as i64;
        while j >= 0 {
            mask[i * n + j as usize] = true;
            j = parents[j as usize];
        }
        if parents[i] >= 0 {
            depth[i] = depth[parents[i] as usize] + 1;
        }
    }
    (depth, mask)
}

fn flat(rows: &[Vec<f32>]) -> Vec<f32> {
    rows.iter().flatten().copied().collect()
}

/// A causal prefill of `emb` into `kv` at `slots` (one row), returning its logits.
fn prefill(
    m: &LlamaStack,
    kv: &mut [KvBuffer<'_>],
    buffer: i64,
    emb: &[Vec<f32>],
    slots: &[i64],
) -> Vec<f32> {
    let n = emb.len();
    let positions: Vec<i64> = (0..n as i64).collect();
    let rows = StepRows {
        rows: 1,
        tokens: n,
        positions: &positions,
        buffers: &[buffer],
        width: n,
        slots,
        new_slots: slots,
        mask: None,
    };
    let mut logits = vec![0f32; n * DIMS.vocab];
    m.step(&flat(emb), &rows, kv, false, &mut logits, None)
        .unwrap();
    logits
}

fn kv_len(slots: usize) -> usize {
    DIMS.layers * DIMS.kv_heads * slots * DIMS.head_dim
}

#[test]
fn dense_rows_with_unequal_prefixes_and_trees_match_the_reference() {
    for bias in [false, true] {
        let (m, reference) = (model(11, bias), Reference::new(11, bias));
        let mut g = Lcg::new(5);
        let (p0, p1) = (7usize, 100usize); // row 1's attention runs on the pool
        let parents = [-1i64, 0, 0, 1]; // a branching tree
        let (depth, tmask) = tree(&parents);
        let t = parents.len();
        let (pre0, pre1) = (embeddings(&mut g, p0), embeddings(&mut g, p1));
        let (new0, new1) = (embeddings(&mut g, t), embeddings(&mut g, t));
        let cap = 128;
        let (mut k0, mut v0) = (vec![0f32; kv_len(cap)], vec![0f32; kv_len(cap)]);
        let (mut k1, mut v1) = (vec![0f32; kv_len(cap)], vec![0f32; kv_len(cap)]);
        let mut kv = [
            KvBuffer {
                k: &mut k0,
                v: &mut v0,
                order: KvOrder::HeadsFirst,
                slots: cap,
            },
            KvBuffer {
                k: &mut k1,
                v: &mut v1,
                order: KvOrder::HeadsFirst,
                slots: cap,
            },
        ];
        let causal = |i: usize, j: usize| j <= i;
        for (b, pre) in [(0, &pre0), (1, &pre1)] {
            let slots: Vec<i64> = (0..pre.len() as i64).collect();
            let got = prefill(&m, &mut kv, b, pre, &slots);
            let pos: Vec<usize> = (0..pre.len()).collect();
            let (want, _, _) = reference.run(pre, &pos, &causal);
            close(&got, &want.concat(), "prefill");
        }
        // forward_batch's layout: prefix columns, padding to the longest, then the tree.
        let pmax = p1;
        let width = pmax + t;
        let mut slots = vec![0i64; 2 * width];
        let mut mask = vec![false; 2 * t * width];
        let mut new_slots = Vec::new();
        let mut positions = Vec::new();
        for (r, p) in [p0, p1].into_iter().enumerate() {
            for c in 0..p {
                slots[r * width + c] = c as i64;
            }
            for i in 0..t {
                slots[r * width + pmax + i] = (p + i) as i64;
                new_slots.push((p + i) as i64);
                positions.push((p + depth[i]) as i64);
                for c in 0..p {
                    mask[(r * t + i) * width + c] = true;
                }
                for j in 0..t {
                    mask[(r * t + i) * width + pmax + j] = tmask[i * t + j];
                }
            }
        }
        let rows = StepRows {
            rows: 2,
            tokens: t,
            positions: &positions,
            buffers: &[0, 1],
            width,
            slots: &slots,
            new_slots: &new_slots,
            mask: Some(&mask),
        };
        let x = [flat(&new0), flat(&new1)].concat();
        let mut logits = vec![0f32; 2 * t * DIMS.vocab];
        let hw = 2 * DIMS.hidden;
        let mut hidden = vec![0f32; 2 * t * hw];
        let capture = Capture {
            layers: &[0],
            last_norm: true,
            out: &mut hidden,
        };
        m.step(&x, &rows, &mut kv, false, &mut logits, Some(capture))
            .unwrap();
        for (r, (pre, new, p)) in [(&pre0, &new0, p0), (&pre1, &new1, p1)]
            .into_iter()
            .enumerate()
        {
            let seq: Vec<Vec<f32>> = pre.iter().chain(new.iter()).cloned().collect();
            let pos: Vec<usize> = (0..p).chain(depth.iter().map(|dd| p + dd)).collect();
            let vis = |i: usize, j: usize| {
                if i < p || j < p {
                    j <= i
                } else {
                    tmask[(i - p) * t + (j - p)]
                }
            };
            let (want, layers, fin) = reference.run(&seq, &pos, &vis);
            let got = &logits[r * t * DIMS.vocab..(r + 1) * t * DIMS.vocab];
            close(got, &want[p..].concat(), "tree logits");
            for i in 0..t {
                let row = &hidden[(r * t + i) * hw..(r * t + i + 1) * hw];
                close(&row[..DIMS.hidden], &layers[0][p + i], "layer 0 state");
                close(&row[DIMS.hidden..], &fin[p + i], "final norm state");
            }
        }
    }
}

#[test]
fn paged_rows_sharing_prefix_slots_match_the_reference() {
    let (m, reference) = (model(3, false), Reference::new(3, false));
    let mut g = Lcg::new(9);
    let nslots = 64;
    let (mut k, mut v) = (vec![0f32; kv_len(nslots)], vec![0f32; kv_len(nslots)]);
    let mut kv = [KvBuffer {
        k: &mut k,
        v: &mut v,
        order: KvOrder::SlotsFirst,
        slots: nslots,
    }];
    // A prefix in scattered slots, shared by both rows; each row's tree in its own slots.
    let p = 9;
    let prefix_slots: Vec<i64> = (0..p as i64).map(|i| (i * 7 + 3) % nslots as i64).collect();
    let pre = embeddings(&mut g, p);
    prefill(&m, &mut kv, 0, &pre, &prefix_slots);
    let trees = [vec![-1i64, 0, 1], vec![-1i64, 0, 0]];
    let t = 3;
    let own = [[40i64, 41, 50], [60, 33, 44]];
    let news = [embeddings(&mut g, t), embeddings(&mut g, t)];
    let width = p + t;
    let (mut slots, mut mask, mut positions, mut new_slots) = (vec![], vec![], vec![], vec![]);
    for r in 0..2 {
        let (depth, tm) = tree(&trees[r]);
        slots.extend(prefix_slots.iter().chain(own[r].iter()));
        new_slots.extend(own[r]);
        for i in 0..t {
            positions.push((p + depth[i]) as i64);
            mask.extend(std::iter::repeat_n(true, p));
            mask.extend((0..t).map(|j| tm[i * t + j]));
        }
    }
    let rows = StepRows {
        rows: 2,
        tokens: t,
        positions: &positions,
        buffers: &[0, 0],
        width,
        slots: &slots,
        new_slots: &new_slots,
        mask: Some(&mask),
    };
    let x = [flat(&news[0]), flat(&news[1])].concat();
    for last in [false, true] {
        let mut logits = vec![0f32; if last { 2 } else { 2 * t } * DIMS.vocab];
        m.step(&x, &rows, &mut kv, last, &mut logits, None).unwrap();
        for r in 0..2 {
            let (depth, tm) = tree(&trees[r]);
            let seq: Vec<Vec<f32>> = pre.iter().chain(news[r].iter()).cloned().collect();
            let pos: Vec<usize> = (0..p).chain(depth.iter().map(|dd| p + dd)).collect();
            let vis = |i: usize, j: usize| {
                if i < p || j < p {
                    j <= i
                } else {
                    tm[(i - p) * t + (j - p)]
                }
            };
            let (want, _, _) = reference.run(&seq, &pos, &vis);
            if last {
                let got = &logits[r * DIMS.vocab..(r + 1) * DIMS.vocab];
                close(got, &want[p + t - 1], "last logits");
            } else {
                let got = &logits[r * t * DIMS.vocab..(r + 1) * t * DIMS.vocab];
                close(got, &want[p..].concat(), "paged tree logits");
            }
        }
    }
}

#[test]
fn the_result_of_a_row_does_not_depend_on_its_neighbours() {
    // One row alone and the same row beside another: the same bits (products split by
    // output column; attention per row and head).
    let m = model(4, false);
    let mut g = Lcg::new(1);
    let nslots = 32;
    let (mut k, mut v) = (vec![0f32; kv_len(nslots)], vec![0f32; kv_len(nslots)]);
    let mut kv = [KvBuffer {
        k: &mut k,
        v: &mut v,
        order: KvOrder::SlotsFirst,
        slots: nslots,
    }];
    let pre = embeddings(&mut g, 5);
    prefill(&m, &mut kv, 0, &pre, &[0, 1, 2, 3, 4]);
    let x = flat(&embeddings(&mut g, 2));
    let alone = StepRows {
        rows: 1,
        tokens: 1,
        positions: &[5],
        buffers: &[0],
        width: 6,
        slots: &[0, 1, 2, 3, 4, 10],
        new_slots: &[10],
        mask: None,
    };
    let mut a = vec![0f32; DIMS.vocab];
    m.step(&x[..DIMS.hidden], &alone, &mut kv, false, &mut a, None)
        .unwrap();
    let both = StepRows {
        rows: 2,
        tokens: 1,
        positions: &[5, 5],
        buffers: &[0, 0],
        width: 6,
        slots: &[0, 1, 2, 3, 4, 10, 0, 1, 2, 3, 4, 11],
        new_slots: &[10, 11],
        mask: None,
    };
    let mut b = vec![0f32; 2 * DIMS.vocab];
    m.step(&x, &both, &mut kv, false, &mut b, None).unwrap();
    assert_eq!(a[..], b[..DIMS.vocab]);
}

#[test]
fn a_profiled_step_splits_its_wall_time_and_computes_the_same_bits() {
    // Off (as built), a step counts nothing; on, each phase is > 0 and they sum to no more
    // than the call's wall time as the caller sees it; the logits are those of the step
    // unprofiled, bit for bit.
    let m = model(8, true);
    let mut g = Lcg::new(2);
    let nslots = 64;
    let (mut k, mut v) = (vec![0f32; kv_len(nslots)], vec![0f32; kv_len(nslots)]);
    let mut kv = [KvBuffer {
        k: &mut k,
        v: &mut v,
        order: KvOrder::HeadsFirst,
        slots: nslots,
    }];
    let pre = embeddings(&mut g, 40);
    let slots: Vec<i64> = (0..40).collect();
    prefill(&m, &mut kv, 0, &pre, &slots);
    assert!(!m.profiling());
    assert_eq!(m.profile(), StepProfile::default());
    let (depth, tmask) = tree(&[-1, 0, 0, 1, 3]);
    let t = depth.len();
    let width = 40 + t;
    let all: Vec<i64> = (0..width as i64).collect();
    let positions: Vec<i64> = depth.iter().map(|&dd| (40 + dd) as i64).collect();
    let mut mask = vec![true; t * width];
    for i in 0..t {
        for j in 0..t {
            mask[i * width + 40 + j] = tmask[i * t + j];
        }
    }
    let rows = StepRows {
        rows: 1,
        tokens: t,
        positions: &positions,
        buffers: &[0],
        width,
        slots: &all,
        new_slots: &all[40..],
        mask: Some(&mask),
    };
    let x = flat(&embeddings(&mut g, t));
    let mut plain = vec![0f32; t * DIMS.vocab];
    m.step(&x, &rows, &mut kv, false, &mut plain, None).unwrap();
    m.set_profiling(true);
    let mut profiled = vec![0f32; t * DIMS.vocab];
    let t0 = std::time::Instant::now();
    m.step(&x, &rows, &mut kv, false, &mut profiled, None)
        .unwrap();
    let outside = t0.elapsed().as_nanos() as u64;
    assert_eq!(plain, profiled);
    let p = m.profile();
    assert_eq!(p.calls, 1);
    assert!(
        p.matmul_ns > 0 && p.attention_ns > 0 && p.other_ns > 0,
        "{p:?}"
    );
    let phases = p.matmul_ns + p.attention_ns + p.other_ns;
    assert!(
        phases <= p.wall_ns && p.wall_ns <= outside,
        "{p:?}, {outside} ns outside"
    );
    // A failed step counts nothing; a second one adds to the totals; reset clears them.
    let short = vec![0f32; DIMS.hidden];
    assert!(m
        .step(&short, &rows, &mut kv, false, &mut profiled, None)
        .is_err());
    assert_eq!(m.profile(), p);
    m.step(&x, &rows, &mut kv, false, &mut profiled, None)
        .unwrap();
    let two = m.profile();
    assert!(two.calls == 2 && two.wall_ns > p.wall_ns && two.matmul_ns > p.matmul_ns);
    m.reset_profile();
    assert_eq!(m.profile(), StepProfile::default());
    m.set_profiling(false);
    m.step(&x, &rows, &mut kv, false, &mut profiled, None)
        .unwrap();
    assert_eq!(m.profile(), StepProfile::default());
}

#[test]
fn bad_input_is_an_error_and_writes_nothing() {
    let m = model(2, false);
    let nslots = 16;
    let (mut k, mut v) = (vec![0f32; kv_len(nslots)], vec![0f32; kv_len(nslots)]);
    let x = vec![0.5f32; 2 * DIMS.hidden];
    let ok = StepRows {
        rows: 1,
        tokens: 2,
        positions: &[0, 1],
        buffers: &[0],
        width: 2,
        slots: &[0, 1],
        new_slots: &[0, 1],
        mask: None,
    };
    let mut logits = vec![0f32; 2 * DIMS.vocab];
    let mut run = |rows: StepRows<'_>, x: &[f32], logits: &mut [f32], cap: Option<Capture<'_>>| {
        let mut kv = [KvBuffer {
            k: &mut k,
            v: &mut v,
            order: KvOrder::HeadsFirst,
            slots: nslots,
        }];
        m.step(x, &rows, &mut kv, false, logits, cap)
    };
    let e = run(
        StepRows {
            new_slots: &[0, 16],
            ..ok
        },
        &x,
        &mut logits,
        None,
    );
    assert!(
        matches!(
            e,
            Err(ModelError::Slot {
                row: 0,
                slot: 16,
                slots: 16
            })
        ),
        "{e:?}"
    );
    let e = run(
        StepRows {
            slots: &[-1, 1],
            ..ok
        },
        &x,
        &mut logits,
        None,
    );
    assert!(matches!(e, Err(ModelError::Slot { slot: -1, .. })), "{e:?}");
    let e = run(
        StepRows {
            buffers: &[1],
            ..ok
        },
        &x,
        &mut logits,
        None,
    );
    assert!(
        matches!(e, Err(ModelError::Buffer { buffer: 1, .. })),
        "{e:?}"
    );
    let e = run(
        StepRows {
            positions: &[0, 256],
            ..ok
        },
        &x,
        &mut logits,
        None,
    );
    assert!(
        matches!(e, Err(ModelError::Position { position: 256, .. })),
        "{e:?}"
    );
    let e = run(
        StepRows {
            mask: Some(&[true; 3]),
            ..ok
        },
        &x,
        &mut logits,
        None,
    );
    assert!(
        matches!(e, Err(ModelError::Size { what: "mask", .. })),
        "{e:?}"
    );
    let e = run(
        StepRows {
            width: 1,
            slots: &[0],
            ..ok
        },
        &x,
        &mut logits,
        None,
    );
    assert!(matches!(e, Err(ModelError::Shape(_))), "{e:?}");
    let e = run(ok, &x[1..], &mut logits, None);
    assert!(
        matches!(e, Err(ModelError::Size { what: "x", .. })),
        "{e:?}"
    );
    let e = run(ok, &x, &mut logits[1..], None);
    assert!(
        matches!(e, Err(ModelError::Size { what: "logits", .. })),
        "{e:?}"
    );
    let mut out = vec![0f32; 2 * DIMS.hidden];
    let cap = Capture {
        layers: &[2],
        last_norm: false,
        out: &mut out,
    };
    let e = run(ok, &x, &mut logits, Some(cap));
    assert!(matches!(e, Err(ModelError::Capture(_))), "{e:?}");
    let cap = Capture {
        layers: &[0],
        last_norm: true,
        out: &mut out,
    };
    let e = run(ok, &x, &mut logits, Some(cap));
    assert!(matches!(e, Err(ModelError::Size { .. })), "{e:?}");
    assert!(k.iter().chain(&v).all(|&a| a == 0.0), "an error wrote K/V");
    let (mut k2, mut v2) = (vec![0f32; 7], vec![0f32; 7]);
    let mut kv = [KvBuffer {
        k: &mut k2,
        v: &mut v2,
        order: KvOrder::HeadsFirst,
        slots: nslots,
    }];
    let e = m.step(&x, &ok, &mut kv, false, &mut logits, None);
    assert!(
        matches!(e, Err(ModelError::Layout { index: 0, .. })),
        "{e:?}"
    );
}

#[test]
fn weights_that_do_not_fit_are_refused() {
    let good = model(1, false);
    let d = *good.dims();
    let mut g = Lcg::new(2);
    let (cos, sin) = rope_tables();
    let layer = LayerWeights {
        input_norm: vec![1.0; d.hidden],
        qkv: Linear {
            weight: matrix(&mut g, BlockFormat::Q8_0, 64, d.hidden),
            bias: None,
        },
        o: Linear {
            weight: matrix(&mut g, BlockFormat::Q8_0, d.hidden, 64),
            bias: None,
        },
        post_norm: vec![1.0; d.hidden],
        gate_up: Linear {
            weight: matrix(&mut g, BlockFormat::Q8_0, 192, d.hidden),
            bias: None,
        },
        down: Linear {
            weight: matrix(&mut g, BlockFormat::Q8_0, d.hidden, 96),
            bias: None,
        },
    };
    let head = Linear {
        weight: matrix(&mut g, BlockFormat::Q8_0, d.vocab, d.hidden),
        bias: None,
    };
    let e = LlamaStack::new(
        LlamaDims { layers: 1, ..d },
        vec![layer],
        vec![1.0; d.hidden],
        head,
        cos,
        sin,
    );
    assert!(
        matches!(&e, Err(ModelError::Weights(m)) if m.contains("q/k/v")),
        "{e:?}"
    );
}
