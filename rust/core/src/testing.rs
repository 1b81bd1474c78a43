//! Shared helpers of the tests and benches (feature `testing`): one seeded generator and the
//! brute-force oracles the fast paths are checked against. Nothing here is tuned for speed.

use crate::kv::{BlockManager, SeqId};

/// Knuth's MMIX linear congruential generator: deterministic, seedable, dependency-free.
/// The high bits are the good ones, so every derived value is taken from them.
#[derive(Debug, Clone)]
pub struct Lcg(u64);

impl Lcg {
    pub fn new(seed: u64) -> Self {
        Lcg(seed)
    }

    /// The next raw 64-bit state.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0
    }

    /// 64 bits that are all usable, low ones included: the high halves of two steps.
    pub fn bits(&mut self) -> u64 {
        (self.next() >> 32) | (self.next() & !0xffff_ffff)
    }

    /// A value in `[0, n)` from the high 31 bits (`n >= 1`).
    pub fn below(&mut self, n: u64) -> u64 {
        (self.next() >> 33) % n
    }

    /// A uniform double in (0, 1), never exactly 0 (safe under `ln`).
    pub fn uniform(&mut self) -> f64 {
        ((self.next() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
}

/// Random parent arrays: each parent before its child, about one node in 16 an extra root
/// (a forest, as padded trees are).
/// A proptest suite's case count: `default`, or `PROPTEST_CASES` when it is set (`make fuzz`
/// raises it; the explicit counts of the suites would otherwise override the variable).
pub fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

pub fn random_parents(n: usize, seed: u64) -> Vec<i32> {
    let mut rng = Lcg::new(seed);
    (0..n)
        .map(|i| {
            let s = rng.next();
            if i == 0 || (s >> 60) == 0 {
                -1
            } else {
                ((s >> 33) % i as u64) as i32
            }
        })
        .collect()
}

/// Brute-force ancestor walk: `out[j]` is true iff node `j` is node `i` or one of its
/// ancestors, found by following `parents` up to a root.
pub fn ancestors(parents: &[i32], i: usize) -> Vec<bool> {
    let mut out = vec![false; parents.len()];
    let mut j = i as i32;
    while j >= 0 {
        out[j as usize] = true;
        j = parents[j as usize];
    }
    out
}

/// The ancestor bitmap (`words_per_row` words per row) built from [`ancestors`].
pub fn ancestor_words(parents: &[i32], words_per_row: usize) -> Vec<u64> {
    let mut words = vec![0u64; parents.len() * words_per_row];
    for i in 0..parents.len() {
        for (j, _) in ancestors(parents, i).iter().enumerate().filter(|(_, &a)| a) {
            words[i * words_per_row + j / 64] |= 1 << (j % 64);
        }
    }
    words
}

/// Reference builder: every prefix over the first `k` ranks of each of `l` rows (log-probs
/// row-major with row stride `width`) with its summed log-prob, -inf entries skipped. The
/// optimal tree of budget B holds the B best.
pub fn all_prefixes(lp: &[f32], l: usize, width: usize, k: usize) -> Vec<(Vec<usize>, f64)> {
    let mut out = Vec::new();
    let mut frontier: Vec<(Vec<usize>, f64)> = vec![(vec![], 0.0)];
    for d in 0..l {
        let mut next = Vec::new();
        for (ranks, s) in &frontier {
            for r in 0..k {
                let v = lp[d * width + r];
                if v == f32::NEG_INFINITY {
                    continue;
                }
                let mut rr = ranks.clone();
                rr.push(r);
                next.push((rr, s + v as f64));
            }
        }
        out.extend(next.iter().cloned());
        frontier = next;
    }
    out
}

/// Reference walk: from the root, scan every node for a child carrying the chosen token.
/// Returns the accepted nodes and the bonus token.
pub fn naive_walk(tokens: &[i64], parents: &[i32], chosen: &[i64]) -> (Vec<i32>, i64) {
    let mut node = 0usize;
    let mut accepted = vec![];
    loop {
        let child =
            (1..tokens.len()).find(|&j| parents[j] == node as i32 && tokens[j] == chosen[node]);
        match child {
            Some(j) => {
                accepted.push(j as i32);
                node = j;
            }
            None => return (accepted, chosen[node]),
        }
    }
}

/// Drafter-like marginals: log-softmax of seeded normal logits (std `scale`) over `vocab`,
/// top `k` of each of `l` rows, sorted. Scale 3 gives a flat drafter (mean top-1
/// probability ~0.19, wide trees), 6 a peaked one (~0.53, deeper trees).
pub fn drafter_marginals(
    l: usize,
    k: usize,
    vocab: usize,
    seed: u64,
    scale: f64,
) -> (Vec<f32>, Vec<i64>) {
    let mut rng = Lcg::new(seed);
    let mut lp = Vec::with_capacity(l * k);
    let mut ids = Vec::with_capacity(l * k);
    for _ in 0..l {
        let mut row: Vec<(f32, i64)> = (0..vocab)
            .map(|t| {
                // Box-Muller: one standard normal from two uniforms.
                let (u1, u2) = (rng.uniform(), rng.uniform());
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

/// Everything a `BlockManager` shows: refcounts, free queue, (sequence, block table,
/// (committed, tentative)) sorted by id, and the number of cached blocks.
pub type KvSnapshot = (
    Vec<u32>,
    Vec<u32>,
    Vec<(SeqId, Vec<u32>, (usize, usize))>,
    usize,
);

/// Snapshot of the observable state, to prove a refused operation changed nothing.
pub fn kv_snapshot(m: &BlockManager) -> KvSnapshot {
    let mut seqs: Vec<_> = m
        .sequences()
        .into_iter()
        .map(|s| (s, m.block_table(s).unwrap(), m.seq_len(s).unwrap()))
        .collect();
    seqs.sort();
    (
        m.refcounts().to_vec(),
        m.free_queue(),
        seqs,
        m.num_cached_blocks(),
    )
}
