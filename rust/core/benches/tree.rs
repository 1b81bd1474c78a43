//! DDTree build (tree + ancestor bits) at L=16 over B, plus the dense mask, the child links
//! (derived on request), the walk and a batch of 32 trees with rayon. Run:
//! `cargo bench -p specdec-core --bench tree`.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use rayon::prelude::*;
use specdec_core::tree::{attention_mask, build_checked, walk};
use std::hint::black_box;

/// Drafter-like marginals: log-softmax of seeded normal logits (std `scale`) over `vocab`,
/// top `k` sorted. Scale 3 gives a flat drafter (mean top-1 probability ~0.19, wide trees),
/// 6 a peaked one (~0.53, deeper trees), as `specdec bench` does.
pub fn marginals(l: usize, k: usize, vocab: usize, seed: u64, scale: f64) -> (Vec<f32>, Vec<i64>) {
    let mut s = seed;
    let mut uniform = || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((s >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    let mut lp = Vec::with_capacity(l * k);
    let mut ids = Vec::with_capacity(l * k);
    for _ in 0..l {
        let mut row: Vec<(f32, i64)> = (0..vocab)
            .map(|t| {
                // Box-Muller: one standard normal from two uniforms.
                let (u1, u2) = (uniform(), uniform());
                let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
                ((z * scale) as f32, t as i64)
            })
            .collect();
        let max = row.iter().map(|x| x.0).fold(f32::MIN, f32::max);
        let lse = max + row.iter().map(|x| (x.0 - max).exp()).sum::<f32>().ln();
        row.iter_mut().for_each(|x| x.0 -= lse);
        row.sort_by(|a, b| b.0.total_cmp(&a.0));
        for &(v, t) in &row[..k] {
            lp.push(v);
            ids.push(t);
        }
    }
    (lp, ids)
}

fn bench_build(c: &mut Criterion) {
    for (name, scale) in [("flat", 3.0), ("peaked", 6.0)] {
        let mut g = c.benchmark_group(format!("ddtree_build_L16_{name}"));
        for &b in &[16usize, 64, 256, 1024] {
            let (lp, ids) = marginals(16, b, 8192, 42, scale);
            g.bench_with_input(BenchmarkId::from_parameter(b), &b, |bench, &b| {
                bench
                    .iter(|| black_box(build_checked(&lp, &ids, 16, b, b as i64, 0, None).unwrap()))
            });
        }
        g.finish();
    }
    let (lp, ids) = marginals(16, 1024, 8192, 42, 6.0);
    let built = build_checked(&lp, &ids, 16, 1024, 1024, 0, None).unwrap();
    c.bench_function("dense_bool_mask_B1024_prefix512", |bench| {
        bench.iter(|| black_box(attention_mask::<bool>(&built.bits, 512)))
    });
    let chosen: Vec<i64> = built.tree.tokens.iter().map(|&t| t + 1).collect();
    let links = built.links();
    c.bench_function("child_links_B1024", |bench| {
        bench.iter(|| black_box(built.links()))
    });
    c.bench_function("walk_B1024", |bench| {
        bench.iter(|| black_box(walk(&built.tree.tokens, &links, &chosen).unwrap()))
    });
}

fn bench_batch(c: &mut Criterion) {
    let reqs: Vec<(Vec<f32>, Vec<i64>)> =
        (0..32).map(|i| marginals(16, 256, 8192, i, 6.0)).collect();
    c.bench_function("ddtree_batch_R32_B256_rayon", |bench| {
        bench.iter(|| {
            let out: Vec<_> = reqs
                .par_iter()
                .map(|(lp, ids)| build_checked(lp, ids, 16, 256, 256, 0, None).unwrap())
                .collect();
            black_box(out)
        })
    });
}

criterion_group!(benches, bench_build, bench_batch);
criterion_main!(benches);
