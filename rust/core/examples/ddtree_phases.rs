//! Where a DDTree build's time goes at L = 16, B = 1024 (validation, the best-first loop,
//! ancestor bits; the child links derived on request), for profiling work. Not a benchmark
//! of record: that is `cargo bench --bench tree`. Run: `cargo run --release -p specdec-core
//! --example ddtree_phases`.

use specdec_core::testing::drafter_marginals;
use specdec_core::tree::{ancestor_bits, build_checked, build_ddtree, child_links, Marginals};
use std::hint::black_box;
use std::time::Instant;

/// Best per-call time in microseconds over 25 runs of 3000 calls.
fn time<F: FnMut()>(mut f: F) -> f64 {
    (0..200).for_each(|_| f());
    (0..25)
        .map(|_| {
            let t = Instant::now();
            (0..3000).for_each(|_| f());
            t.elapsed().as_secs_f64() / 3000.0 * 1e6
        })
        .fold(f64::MAX, f64::min)
}

fn main() {
    let b = 1024;
    for (name, scale) in [("flat", 3.0), ("peaked", 6.0)] {
        let (lp, ids) = drafter_marginals(16, b, 8192, 42, scale);
        let m = Marginals::new(&lp, &ids, 16, b, b as i64).unwrap();
        // Time the builds before keeping a tree alive: a live 140 KB bitmap from an earlier
        // build changes glibc's heap layout so that every build can fault its bitmap's
        // pages in again (not seen through Python).
        let all = time(|| {
            drop(black_box(build_checked(
                &lp, &ids, 16, b, b as i64, 0, None,
            )))
        });
        let validate = time(|| drop(black_box(Marginals::new(&lp, &ids, 16, b, b as i64))));
        let with_contract = time(|| drop(black_box(build_ddtree(&m, b, 0, None))));
        let built = build_checked(&lp, &ids, 16, b, b as i64, 0, None).unwrap();
        let parents = &built.tree.parents;
        let bits = time(|| drop(black_box(ancestor_bits(parents))));
        let links = time(|| drop(black_box(child_links(parents))));
        println!(
            "{name}: build_checked {all:.2} us = checks ~{:.2} + loop ~{:.2} + ancestor bits \
             {bits:.2}; on request: child links {links:.2} (a full `Marginals::new`, ids \
             included: {validate:.2})",
            all - with_contract,
            with_contract - bits
        );
    }
}
