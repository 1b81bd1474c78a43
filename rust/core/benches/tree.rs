//! DDTree build (tree + ancestor bits) at L=16 over B, plus the dense mask, the child links
//! (derived on request), the walk and a batch of 32 trees with rayon. Run:
//! `cargo bench -p specdec-core --bench tree`. Marginals as `specdec bench` makes them (see
//! `testing::drafter_marginals`).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use rayon::prelude::*;
use specdec_core::testing::drafter_marginals as marginals;
use specdec_core::tree::{attention_mask, build_checked, walk};
use std::hint::black_box;

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
