//! Stateful property test of the paged-KV `BlockManager`: random operation sequences run
//! against the manager and a plain model (per-sequence committed token ids and the K/V
//! "content" each position must hold). A fake slot storage executes the manager's
//! copy-on-write pairs and commit moves exactly as the tensor layer does; after every
//! operation the storage seen through each block table must equal the model, the
//! structural invariants must hold, and a refused operation must change nothing.
//!
//! Writes may lag allocation, as in a scheduler that allocates a step's sequences before
//! running its forward: a sequence's prompt K/V can stay unwritten for a while, and
//! `mark_computed` reports only the written prefix. A prefix hit must still read exactly the
//! model's K/V, so a block registered before its K/V exists fails the test. The cache salt
//! enters the model's content, so a hit across salts fails it too.

use std::collections::HashMap;

use proptest::prelude::*;
use specdec_core::kv::{BlockManager, KvError, SeqId};
use specdec_core::testing::{self, kv_snapshot as snapshot, Lcg};

const NUM_SEQ_IDS: u64 = 8;

/// K/V "content" of a position: a function of the whole token prefix (as in a real model).
fn content(prev: u64, token: i64, extra: u64) -> u64 {
    let mut x = prev ^ (token as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ extra.rotate_left(17);
    x ^= x >> 31;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^ (x >> 29) | 1 // never 0: 0 marks a slot never written
}

#[derive(Clone, Debug, Default)]
struct ModelSeq {
    tokens: Vec<i64>,
    values: Vec<u64>,
    /// Whether position i's K/V has been written to the storage yet.
    written: Vec<bool>,
    /// Content key: the extra key, and the cache salt's index above bit 8.
    extra: u64,
}

impl ModelSeq {
    fn push(&mut self, t: i64) {
        let prev = self.values.last().copied().unwrap_or(7);
        self.values.push(content(prev, t, self.extra));
        self.tokens.push(t);
        self.written.push(true);
    }

    /// Leading positions whose K/V is written (what the caller may report as computed).
    fn written_prefix(&self) -> usize {
        self.written.iter().take_while(|&&w| w).count()
    }

    fn truncate(&mut self, n: usize) {
        self.values.truncate(n);
        self.tokens.truncate(n);
        self.written.truncate(n);
    }
}

const SALTS: [&[u8]; 2] = [b"", b"tenant-b"];

struct Harness {
    m: BlockManager,
    storage: Vec<u64>,
    model: HashMap<SeqId, ModelSeq>,
    ops_ok: usize,
    cows: usize,
    hits: usize,
    bad_commits: usize,
}

impl Harness {
    fn new(num_blocks: usize, bs: usize, caching: bool) -> Self {
        let m = BlockManager::new(num_blocks, bs, caching).unwrap();
        Harness {
            storage: vec![0; num_blocks * bs],
            m,
            model: HashMap::new(),
            ops_ok: 0,
            cows: 0,
            hits: 0,
            bad_commits: 0,
        }
    }

    fn write(&mut self, slots: &[i32], vals: &[u64]) {
        for (&s, &v) in slots.iter().zip(vals) {
            self.storage[s as usize] = v;
        }
    }

    fn do_cow(&mut self, pair: Option<(u32, u32)>) {
        if let Some((src, dst)) = pair {
            let bs = self.m.block_size();
            let (src, dst) = (src as usize * bs, dst as usize * bs);
            self.storage.copy_within(src..src + bs, dst);
            self.cows += 1;
        }
    }

    /// Copy-on-write must happen exactly when growing into a shared partial tail.
    fn expect_cow(&self, seq: SeqId) -> bool {
        let (len, pending) = self.m.seq_len(seq).unwrap();
        let tail = *self.m.block_table(seq).unwrap().last().unwrap_or(&0);
        (len + pending) % self.m.block_size() != 0
            && (self.m.refcounts()[tail as usize] > 1 || self.m.is_cached(tail))
    }

    fn check(&self) {
        self.m.check_invariants().unwrap();
        // Refcounts recomputed here too, from the public views only.
        let mut count = vec![0u32; self.m.num_blocks()];
        for s in self.m.sequences() {
            for b in self.m.block_table(s).unwrap() {
                count[b as usize] += 1;
            }
        }
        assert_eq!(count, self.m.refcounts());
        let free = self.m.free_queue();
        assert_eq!(free.len(), self.m.num_free_blocks());
        assert!(
            free.iter().all(|&b| count[b as usize] == 0),
            "a free block is referenced"
        );
        let used = count.iter().filter(|&&c| c > 0).count();
        assert_eq!(
            used + free.len(),
            self.m.num_blocks(),
            "free + used != total"
        );
        assert_eq!(self.m.num_sequences(), self.model.len());
        for (&seq, ms) in &self.model {
            let (len, _) = self.m.seq_len(seq).unwrap();
            assert_eq!(len, ms.values.len());
            let slots = self.m.slot_mapping(seq, 0, len).unwrap();
            for (i, &s) in slots.iter().enumerate() {
                if ms.written[i] {
                    assert_eq!(
                        self.storage[s as usize], ms.values[i],
                        "sequence {seq}: K/V content at {i} differs from the model"
                    );
                }
            }
        }
    }

    /// The caller's late writes: store every unwritten position of `seq` (as the forward
    /// that finishes its prefill does).
    fn write_pending(&mut self, seq: SeqId) {
        let ms = &self.model[&seq];
        let len = ms.values.len();
        let slots = self.m.slot_mapping(seq, 0, len).unwrap();
        let todo: Vec<(i32, u64)> = (0..len)
            .filter(|&i| !ms.written[i])
            .map(|i| (slots[i], ms.values[i]))
            .collect();
        for (s, v) in todo {
            self.storage[s as usize] = v;
        }
        self.model.get_mut(&seq).unwrap().written.fill(true);
    }

    fn pick(&self, x: u64) -> SeqId {
        x % NUM_SEQ_IDS
    }

    fn gen_tokens(n: usize, seed: u64) -> Vec<i64> {
        // A 2-letter alphabet makes shared prefixes (and prefix hits) common.
        (0..n).map(|i| ((seed >> (i % 61)) & 1) as i64).collect()
    }

    /// Run one operation; returns whether the manager accepted it.
    fn step(&mut self, op: &Op) -> Result<(), KvError> {
        let before = snapshot(&self.m);
        let r = self.apply(op);
        if r.is_err() {
            assert_eq!(
                before,
                snapshot(&self.m),
                "refused {op:?} changed the manager"
            );
        } else {
            self.ops_ok += 1;
        }
        self.check();
        r
    }

    fn apply(&mut self, op: &Op) -> Result<(), KvError> {
        let seq = self.pick(op.a);
        match op.kind {
            // Allocate with token ids (prefix cache path).
            0 | 1 => {
                let n = (op.n % 13) as usize;
                let extra = op.seed % 2;
                let salt = (op.b % 2) as usize;
                let tokens = Self::gen_tokens(n, op.seed);
                // Kind 1 takes only the cached prefix (the rest comes later as appends).
                let cached = if op.kind == 0 {
                    self.m.allocate_tokens(seq, &tokens, SALTS[salt], extra)?
                } else {
                    self.m
                        .allocate_cached_prefix(seq, &tokens, SALTS[salt], extra)?
                };
                let n = if op.kind == 0 { n } else { cached };
                let mut ms = ModelSeq {
                    extra: extra | (salt as u64) << 8,
                    ..Default::default()
                };
                tokens[..n].iter().for_each(|&t| ms.push(t));
                let slots = self.m.slot_mapping(seq, 0, n).unwrap();
                // A prefix hit must already hold exactly the K/V of those tokens.
                let got: Vec<u64> = slots[..cached]
                    .iter()
                    .map(|&s| self.storage[s as usize])
                    .collect();
                assert_eq!(got, ms.values[..cached], "prefix hit with different K/V");
                if !self.m.prefix_caching() {
                    assert_eq!(cached, 0);
                }
                self.hits += cached;
                // Half the time the prompt's K/V is written later (kinds 5, 6, 13), as when
                // more sequences start in the same scheduling step before its forward.
                if (op.b >> 1).is_multiple_of(2) {
                    self.write(&slots[cached..], &ms.values[cached..]);
                    self.m.mark_computed(seq, n).unwrap();
                } else {
                    ms.written[cached..].fill(false);
                }
                self.model.insert(seq, ms);
            }
            // Append committed tokens.
            2 => {
                let n = (op.n % 6) as usize;
                let tokens = Self::gen_tokens(n, op.seed);
                let want_cow = self.m.contains(seq) && n > 0 && self.expect_cow(seq);
                let ap = self.m.append_slots(seq, n, Some(&tokens))?;
                assert_eq!(
                    ap.cow.is_some(),
                    want_cow,
                    "copy-on-write iff growing a shared partial tail"
                );
                self.do_cow(ap.cow);
                let ms = self.model.get_mut(&seq).unwrap();
                tokens.iter().for_each(|&t| ms.push(t));
                let vals = ms.values[ms.values.len() - n..].to_vec();
                let written = ms.written_prefix();
                self.write(&ap.slots, &vals);
                if op.b.is_multiple_of(2) {
                    self.m.mark_computed(seq, written).unwrap();
                }
            }
            3 => {
                let child = self.pick(op.b);
                self.m.fork(seq, child)?;
                let ms = self.model[&seq].clone();
                self.model.insert(child, ms);
            }
            4 => {
                self.m.free(seq)?;
                self.model.remove(&seq);
            }
            // A draft-tree step: reserve, write every node, commit a random increasing subset
            // (or roll back). Accepted nodes hold their committed value, the rest garbage.
            5 | 6 => {
                let n = 1 + (op.n % 9) as usize;
                if self.m.contains(seq) {
                    // The step's forward reads the whole prefix: it must be written first.
                    self.write_pending(seq);
                }
                let want_cow = self.m.contains(seq) && self.expect_cow(seq);
                let ap = self.m.reserve_tree(seq, n)?;
                assert_eq!(ap.cow.is_some(), want_cow);
                self.do_cow(ap.cow);
                let tokens = Self::gen_tokens(n, op.seed);
                let accepted: Vec<i64> = (0..n as i64)
                    .filter(|&i| (op.seed >> (i + 20)) & 1 == 1)
                    .collect();
                let mut ms = self.model[&seq].clone();
                let mut vals: Vec<u64> = (0..n).map(|i| 0xdead_0000 + i as u64).collect();
                for &i in &accepted {
                    ms.push(tokens[i as usize]);
                    vals[i as usize] = *ms.values.last().unwrap();
                }
                self.write(&ap.slots, &vals);
                if op.kind == 6 && op.b.is_multiple_of(3) {
                    self.m.rollback(seq)?;
                    return Ok(());
                }
                let acc_tokens: Vec<i64> = accepted.iter().map(|&i| tokens[i as usize]).collect();
                let moves = self.m.commit(seq, &accepted, Some(&acc_tokens)).unwrap();
                // Gather every source first, then scatter (as one index copy does).
                let moved: Vec<u64> = moves
                    .iter()
                    .map(|&(s, _)| self.storage[s as usize])
                    .collect();
                for (&(_, d), v) in moves.iter().zip(moved) {
                    self.storage[d as usize] = v;
                }
                self.model.insert(seq, ms);
            }
            // Commit of a node that was never reserved: outside a step, or inside one with an
            // index beyond the reservation. Either is refused with the state unchanged.
            7 => {
                let bad = [op.n as i64 % 20 - 3];
                if !self.m.contains(seq)
                    || self.m.seq_len(seq).unwrap().1 > 0
                    || op.b.is_multiple_of(2)
                {
                    let r = self.m.commit(seq, &bad, None);
                    assert!(r.is_err(), "commit outside a step accepted");
                    return r.map(|_| ());
                }
                let n = 1 + (op.n % 5) as usize;
                let ap = self.m.reserve_tree(seq, n)?;
                self.do_cow(ap.cow);
                let bad = [if op.seed.is_multiple_of(2) {
                    -1
                } else {
                    n as i64 + (op.seed % 3) as i64
                }];
                let before = snapshot(&self.m);
                let r = self.m.commit(seq, &[0, bad[0]], None);
                assert!(matches!(r, Err(KvError::NotReserved { .. })), "{r:?}");
                assert_eq!(
                    before,
                    snapshot(&self.m),
                    "refused commit changed the manager"
                );
                self.bad_commits += 1;
                self.m.rollback(seq).unwrap();
            }
            // Beam reorder over a random subset of live sequences.
            8 => {
                let mut beams: Vec<SeqId> = self.m.sequences();
                beams.sort();
                beams.retain(|&s| (op.seed >> s) & 1 == 1 || s == seq);
                let k = beams.len().max(1);
                let parents: Vec<usize> = (0..beams.len())
                    .map(|i| ((op.seed >> (8 + 3 * i)) as usize) % k)
                    .collect();
                self.m.reorder(&beams, &parents)?;
                let new: Vec<ModelSeq> = parents
                    .iter()
                    .map(|&p| self.model[&beams[p]].clone())
                    .collect();
                for (b, ms) in beams.into_iter().zip(new) {
                    self.model.insert(b, ms);
                }
            }
            // Batched forms over a random set of ids (duplicates and unknown ids included).
            10 => {
                let ids: Vec<SeqId> = (0..1 + op.n % 4)
                    .map(|i| self.pick(op.seed >> (8 * i)))
                    .collect();
                let counts: Vec<usize> = (0..ids.len())
                    .map(|i| ((op.b >> (4 * i)) % 6) as usize)
                    .collect();
                match op.b % 4 {
                    0 => {
                        let out = self.m.append_slots_batch(&ids, &counts)?;
                        for (i, &seq) in ids.iter().enumerate() {
                            let ms = self.model.get_mut(&seq).unwrap();
                            (0..counts[i]).for_each(|k| ms.push(1000 + k as i64));
                        }
                        for &pair in &out.cow {
                            self.do_cow(Some(pair));
                        }
                        for (i, &seq) in ids.iter().enumerate() {
                            let ms = &self.model[&seq];
                            let vals = ms.values[ms.values.len() - counts[i]..].to_vec();
                            self.write(&out.slots[out.offsets[i]..out.offsets[i + 1]], &vals);
                        }
                    }
                    1 => {
                        let parents: Vec<SeqId> =
                            ids.iter().map(|&s| self.pick(s + 1 + op.a)).collect();
                        self.m.fork_batch(&parents, &ids)?;
                        for (&p, &c) in parents.iter().zip(&ids) {
                            let ms = self.model[&p].clone();
                            self.model.insert(c, ms);
                        }
                    }
                    2 => {
                        self.m.free_batch(&ids)?;
                        for s in &ids {
                            self.model.remove(s);
                        }
                    }
                    _ => {
                        self.m.allocate_batch(&ids, &counts)?;
                        for (i, &seq) in ids.iter().enumerate() {
                            let mut ms = ModelSeq {
                                extra: 5,
                                ..Default::default()
                            };
                            (0..counts[i]).for_each(|k| ms.push(k as i64 + 77));
                            let slots = self.m.slot_mapping(seq, 0, counts[i]).unwrap();
                            self.write(&slots, &ms.values.clone());
                            self.model.insert(seq, ms);
                        }
                    }
                }
            }
            // Truncate to a random shorter length (a cached full block may become the tail).
            12 => {
                let len = self.model.get(&seq).map_or(0, |ms| ms.values.len());
                let to = (op.n as usize) % (len + 2);
                self.m.truncate_seq(seq, to)?;
                self.model.get_mut(&seq).unwrap().truncate(to);
            }
            // The late K/V of a sequence is written; report some of it as computed.
            13 => {
                let len = self.model.get(&seq).map_or(0, |ms| ms.values.len());
                let to = (op.n as usize) % (len + 2);
                if !self.m.contains(seq) || to > len {
                    let r = self.m.mark_computed(seq, to);
                    assert!(r.is_err(), "mark_computed past the committed tokens");
                    return r;
                }
                self.write_pending(seq);
                self.m.mark_computed(seq, to).unwrap();
            }
            // Allocate without token ids.
            _ => {
                let n = (op.n % 10) as usize;
                self.m.allocate(seq, n)?;
                let mut ms = ModelSeq {
                    extra: 99,
                    ..Default::default()
                };
                (0..n).for_each(|i| ms.push(op.seed as i64 + i as i64));
                let slots = self.m.slot_mapping(seq, 0, n).unwrap();
                self.write(&slots, &ms.values.clone());
                // Without token ids the sequence never registers blocks.
                self.model.insert(
                    seq,
                    ModelSeq {
                        tokens: vec![],
                        ..ms
                    },
                );
            }
        }
        Ok(())
    }

    fn free_all(&mut self) {
        for s in self.m.sequences() {
            self.m.free(s).unwrap();
            self.model.remove(&s);
        }
        self.check();
        assert_eq!(
            self.m.num_free_blocks(),
            self.m.num_blocks(),
            "free count != total after freeing all"
        );
        assert!(self.m.refcounts().iter().all(|&r| r == 0));
    }
}

#[derive(Clone, Debug)]
struct Op {
    kind: u8,
    a: u64,
    b: u64,
    n: u16,
    seed: u64,
}

fn op() -> impl Strategy<Value = Op> {
    (
        0u8..14,
        any::<u64>(),
        any::<u64>(),
        any::<u16>(),
        any::<u64>(),
    )
        .prop_map(|(kind, a, b, n, seed)| Op {
            kind,
            a,
            b,
            n,
            seed,
        })
}

const OPS_PER_CASE: usize = 200;

proptest! {
    #![proptest_config(ProptestConfig { cases: testing::cases(256), ..ProptestConfig::default() })]

    /// 256 cases x up to 200 operations (~5 * 10^4 operations), small pools so that
    /// sharing, copy-on-write, eviction and out-of-blocks all happen often.
    #[test]
    fn block_manager_matches_model(
        ops in prop::collection::vec(op(), 1..=OPS_PER_CASE),
        num_blocks in 4usize..40,
        bs in 1usize..5,
        caching in any::<bool>(),
    ) {
        let mut h = Harness::new(num_blocks, bs, caching);
        for op in &ops {
            let _ = h.step(op);
        }
        h.free_all();
    }
}

/// Totals over a fixed long random run, so the figures below are not vacuous: many
/// operations succeed, copies-on-write and prefix hits both happen.
#[test]
fn long_run_exercises_everything() {
    let mut rng = Lcg::new(0x1234_5678_9abc_def0);
    let mut next = || rng.bits();
    let mut total = 0;
    let (mut ok, mut cows, mut hits, mut bad, mut errs) =
        (0, 0, 0, 0, HashMap::<String, usize>::new());
    for round in 0..100 {
        let mut h = Harness::new(16 + round % 24, 1 + round % 4, round % 2 == 0);
        for _ in 0..1000 {
            let op = Op {
                kind: (next() % 14) as u8,
                a: next(),
                b: next(),
                n: next() as u16,
                seed: next(),
            };
            if let Err(e) = h.step(&op) {
                let name = format!("{e:?}");
                *errs
                    .entry(name.split(['(', ' ']).next().unwrap().to_string())
                    .or_default() += 1;
            }
            total += 1;
        }
        h.free_all();
        ok += h.ops_ok;
        cows += h.cows;
        hits += h.hits;
        bad += h.bad_commits;
    }
    assert_eq!(total, 100_000);
    assert!(ok > 40_000, "only {ok} operations succeeded");
    assert!(
        cows > 100 && hits > 100 && bad > 100,
        "cows {cows}, cached tokens {hits}, bad commits {bad}"
    );
    println!("100000 ops: {ok} accepted, {cows} copies-on-write, {hits} cached tokens hit, {bad} bad commits, refusals {errs:?}");
    for kind in [
        "UnknownSequence",
        "AlreadyFreed",
        "SequenceExists",
        "OutOfBlocks",
        "NoStep",
    ] {
        assert!(
            errs.get(kind).copied().unwrap_or(0) > 0,
            "no {kind} error in the run: {errs:?}"
        );
    }
}
