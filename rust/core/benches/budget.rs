//! The adaptive budget's per-step work: value two candidate trees of 64 nodes at every size
//! (`choose`) and learn from a verified one (`observe`), as one SmolLM2 step with a combined
//! drafter asks. Run: `cargo bench -p specdec-core --bench budget`.

use criterion::{criterion_group, criterion_main, Criterion};
use specdec_core::decode::{Accepted, BudgetParams, BudgetStats, Pick, TreeView};
use specdec_core::testing::drafter_marginals as marginals;
use specdec_core::tree::{build_checked, BuiltTree};
use std::hint::black_box;

fn view(b: &BuiltTree) -> TreeView<'_> {
    TreeView {
        parents: &b.tree.parents,
        depths: &b.tree.depths,
        logprobs: Some(&b.tree.logprobs),
        num_real: b.tree.len(),
    }
}

fn bench_budget(c: &mut Criterion) {
    let p = BudgetParams {
        prior: 1.0,
        prior_weight: 2.0,
        band_optimism: 1.0,
    };
    let trees: Vec<BuiltTree> = (0..2)
        .map(|seed| {
            let (lp, ids) = marginals(8, 64, 8192, seed, 6.0);
            build_checked(&lp, &ids, 8, 64, 64, 0, None).unwrap()
        })
        .collect();
    let mut stats = BudgetStats::new();
    for step in 0..200 {
        let t = &trees[step % 2];
        stats
            .observe(&p, &view(t), 0, Accepted::Count(step % 4))
            .unwrap();
    }
    let cands = vec![trees.iter().map(view).collect::<Vec<_>>()];
    c.bench_function("budget_choose_2x64_nodes", |bench| {
        bench.iter(|| black_box(stats.choose(&p, &cands, 64, Pick::Drafted, None).unwrap()))
    });
    c.bench_function("budget_observe_64_nodes", |bench| {
        bench.iter(|| {
            let mut s = stats.clone();
            s.observe(&p, &view(&trees[0]), 0, Accepted::Count(2))
                .unwrap();
            black_box(s)
        })
    });
}

criterion_group!(benches, bench_budget);
criterion_main!(benches);
