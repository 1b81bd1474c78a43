//! Paged-KV bookkeeping in pure Rust (no Python): a mixed workload at 10k blocks / 256
//! sequences (allocate, append, fork, free, tree reserve + commit) and one decode step's
//! batched tree reserve + commit for 256 sequences. Run: `cargo bench -p specdec-core --bench kv`.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use specdec_core::kv::BlockManager;
use specdec_core::testing::Lcg as Rng;
use std::hint::black_box;

enum Op {
    Alloc(u64, usize),
    Fork(u64, u64),
    Free(u64),
    Append(u64, usize),
    Tree(u64, usize, Vec<i64>),
}

/// The same mix as `benches/bench_kv.py`: 10% allocate, 10% fork, 10% free (while more than
/// half the ids are live), 35% append 1..4 tokens, the rest a tree of 8..64 nodes with 1..6
/// accepted.
fn make_ops(n: usize, seqs: u64, seed: u64) -> Vec<Op> {
    let mut rng = Rng::new(seed);
    let mut live: Vec<u64> = vec![];
    let mut dead: Vec<u64> = (0..seqs).collect();
    let mut ops = Vec::with_capacity(n);
    for _ in 0..n {
        let r = rng.below(100);
        if !dead.is_empty() && (r < 10 || live.is_empty()) {
            let s = dead.swap_remove(rng.below(dead.len() as u64) as usize);
            ops.push(Op::Alloc(s, 32 + rng.below(480) as usize));
            live.push(s);
        } else if r < 20 && !dead.is_empty() {
            let s = dead.swap_remove(rng.below(dead.len() as u64) as usize);
            ops.push(Op::Fork(live[rng.below(live.len() as u64) as usize], s));
            live.push(s);
        } else if r < 30 && live.len() as u64 > seqs / 2 {
            let s = live.swap_remove(rng.below(live.len() as u64) as usize);
            dead.push(s);
            ops.push(Op::Free(s));
        } else if r < 65 {
            ops.push(Op::Append(
                live[rng.below(live.len() as u64) as usize],
                1 + rng.below(4) as usize,
            ));
        } else {
            let n = 8 + rng.below(57) as usize;
            let mut acc: Vec<i64> = vec![0];
            acc.extend((1..n as i64).filter(|_| rng.below(n as u64) < 3).take(5));
            ops.push(Op::Tree(
                live[rng.below(live.len() as u64) as usize],
                n,
                acc,
            ));
        }
    }
    ops
}

fn run(ops: &[Op]) -> usize {
    let mut m = BlockManager::new(10_000, 16, false).unwrap();
    let mut slots = 0;
    for op in ops {
        match op {
            Op::Alloc(s, n) => m.allocate(*s, *n).unwrap(),
            Op::Fork(p, c) => m.fork(*p, *c).unwrap(),
            Op::Free(s) => m.free(*s).unwrap(),
            Op::Append(s, n) => slots += m.append_slots(*s, *n, None).unwrap().slots.len(),
            Op::Tree(s, n, acc) => {
                slots += m.reserve_tree(*s, *n).unwrap().slots.len();
                slots += m.commit(*s, acc, None).unwrap().len();
            }
        }
    }
    slots
}

fn bench_mixed(c: &mut Criterion) {
    let ops = make_ops(100_000, 256, 7);
    let mut g = c.benchmark_group("kv_mixed_10k_blocks_256_seqs");
    g.throughput(Throughput::Elements(ops.len() as u64));
    g.sample_size(20);
    g.bench_function("100k_ops", |b| b.iter(|| black_box(run(&ops))));
    g.finish();
}

fn bench_step(c: &mut Criterion) {
    let seqs: Vec<u64> = (0..256).collect();
    let counts = vec![32usize; 256];
    let mut rng = Rng::new(3);
    let mut accepted = vec![];
    let mut offsets = vec![0usize];
    for _ in 0..256 {
        accepted.push(0i64);
        accepted.extend((1..32i64).filter(|_| rng.below(32) < 3).take(5));
        offsets.push(accepted.len());
    }
    let mut g = c.benchmark_group("kv_step_256_seqs");
    g.bench_function("reserve32_commit_batch", |b| {
        b.iter_batched_ref(
            || {
                let mut m = BlockManager::new(10_000, 16, false).unwrap();
                for &s in &seqs {
                    m.allocate(s, 100 + (s as usize) % 50).unwrap();
                }
                m
            },
            |m| {
                m.reserve_tree_batch(&seqs, &counts).unwrap();
                black_box(m.commit_batch(&seqs, &accepted, &offsets, None).unwrap());
            },
            criterion::BatchSize::LargeInput,
        )
    });
    g.finish();
}

/// Prefix caching: 64 prompts of 512 tokens (32 blocks of 16) sharing a 256-token system
/// prefix, each allocated with its token ids (hashing every full block), then freed.
fn bench_prefix(c: &mut Criterion) {
    let mut rng = Rng::new(11);
    let system: Vec<i64> = (0..256).map(|_| rng.below(32_000) as i64).collect();
    let prompts: Vec<Vec<i64>> = (0..64)
        .map(|_| {
            let mut p = system.clone();
            p.extend((0..256).map(|_| rng.below(32_000) as i64));
            p
        })
        .collect();
    let mut g = c.benchmark_group("kv_prefix_cache");
    g.throughput(Throughput::Elements(prompts.len() as u64));
    g.bench_function("allocate_tokens_512_x64", |b| {
        b.iter_batched_ref(
            || BlockManager::new(10_000, 16, true).unwrap(),
            |m| {
                let mut hit = 0;
                for (s, p) in prompts.iter().enumerate() {
                    hit += prefix_alloc(m, s as u64, p);
                }
                black_box(hit)
            },
            criterion::BatchSize::LargeInput,
        )
    });
    g.finish();
}

/// Allocate `seq` with its token ids, its K/V computed at once, then free it.
fn prefix_alloc(m: &mut BlockManager, seq: u64, p: &[i64]) -> usize {
    let hit = m.allocate_tokens(seq, p, b"", 0).unwrap();
    m.mark_computed(seq, p.len()).unwrap();
    m.free(seq).unwrap();
    hit
}

criterion_group!(benches, bench_mixed, bench_step, bench_prefix);
criterion_main!(benches);
