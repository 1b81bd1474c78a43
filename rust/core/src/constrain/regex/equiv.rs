//! Bounded state equivalence (Moore's refinement, one round per byte of lookahead): two DFA
//! states in the same level-`k` class die on exactly the same strings of length <= `k`.
//! A trie walk for a new state can then start from a cached state's mask and descend only
//! where the two states' classes differ at the subtree's remaining height (counted classes
//! such as `[^\n]{1,80}` differ only on the few tokens longer than the remaining count);
//! states equal up to the longest token share their mask outright.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU32, Ordering};

use super::dfa::{StateId, TableDfa, DEAD};

/// Multiply-rotate hasher for short `u32` signatures (SipHash dominates otherwise).
#[derive(Default)]
struct SigHasher(u64);

impl Hasher for SigHasher {
    fn finish(&self) -> u64 {
        // Fold the well-mixed high bits into the low ones (bucket index).
        self.0 ^ (self.0 >> 32)
    }
    fn write(&mut self, bytes: &[u8]) {
        // `[u32]` hashes as one byte slice: mix 8 bytes per step.
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.write_u64(u64::from_le_bytes(c.try_into().expect("8 bytes")));
        }
        for &b in chunks.remainder() {
            self.write_u32(b as u32);
        }
    }
    #[inline]
    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    #[inline]
    fn write_u32(&mut self, x: u32) {
        self.0 = (self.0.rotate_left(5) ^ x as u64).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    #[inline]
    fn write_usize(&mut self, x: usize) {
        self.write_u32(x as u32);
    }
}

#[derive(Debug)]
pub struct StateLevels {
    states: usize,
    /// Highest stored level.
    top: usize,
    /// The partition stopped changing at `top` (it holds for every deeper level too).
    converged: bool,
    /// `cls[k * states + idx]`: class of state `idx` at level `k` (0 ..= top).
    cls: Vec<u32>,
    /// `rep[k * states + class]`: 1 + index of a state with a cached mask in that class.
    rep: Vec<AtomicU32>,
    /// One byte per byte class, and the trie nodes under that class's first bytes.
    bytes: Vec<u8>,
    weight: Vec<usize>,
}

impl StateLevels {
    /// Refine up to `max_level` rounds over the DFA's byte classes (`reps`: one byte each).
    pub fn build(dfa: &TableDfa, reps: &[u8], weight: Vec<usize>, max_level: usize) -> StateLevels {
        let states = dfa.num_states();
        // Level 0: dead or not (every kept state can still reach a match).
        let mut cls: Vec<u32> = (0..states).map(|i| (i != 0) as u32).collect();
        let mut count = if states > 1 { 2 } else { 1 };
        let mut top = 0;
        let mut converged = false;
        let nc = reps.len();
        // Successor indices over one byte per class, compact (fits in L1 for typical DFAs).
        let mut succ = vec![0u32; states * nc];
        for (i, s) in dfa.states().enumerate() {
            for (c, &b) in reps.iter().enumerate() {
                succ[i * nc + c] = dfa.next(s, b).index() as u32;
            }
        }
        let w = nc + 1;
        let mut sig = vec![0u32; states * w];
        let mut next = vec![0u32; states];
        while top < max_level {
            let prev = &cls[top * states..(top + 1) * states];
            for i in 0..states {
                let row = &mut sig[i * w..(i + 1) * w];
                row[0] = prev[i];
                for (slot, &j) in row[1..].iter_mut().zip(&succ[i * nc..(i + 1) * nc]) {
                    *slot = prev[j as usize];
                }
            }
            let mut ids: HashMap<&[u32], u32, BuildHasherDefault<SigHasher>> =
                HashMap::with_capacity_and_hasher(count * 2, Default::default());
            for i in 0..states {
                let n = ids.len() as u32;
                next[i] = *ids.entry(&sig[i * w..(i + 1) * w]).or_insert(n);
            }
            if ids.len() == count {
                converged = true; // every later level is the same partition
                break;
            }
            count = ids.len();
            cls.extend_from_slice(&next);
            top += 1;
        }
        let rep = (0..(top + 1) * states).map(|_| AtomicU32::new(0)).collect();
        StateLevels {
            states,
            top,
            converged,
            cls,
            rep,
            bytes: reps.to_vec(),
            weight,
        }
    }

    /// Do states in the same class at the top level die on the same strings of any length
    /// up to `len`?
    pub fn top(&self) -> usize {
        self.top
    }

    /// Class of state `idx` at `level` (clamped to the stored levels).
    pub fn class(&self, level: usize, idx: usize) -> u32 {
        self.cls[level.min(self.top) * self.states + idx]
    }

    pub fn covers(&self, len: usize) -> bool {
        self.converged || self.top >= len
    }

    /// Do states `a` and `b` die on the same strings of length <= `level`?
    /// (Beyond the stored levels only identical states are known to.)
    #[inline(always)]
    pub fn same(&self, level: usize, a: StateId, b: StateId) -> bool {
        if level > self.top && !self.converged {
            return a == b;
        }
        let base = level.min(self.top) * self.states;
        // SAFETY: `base` indexes a stored level and `a`, `b` are states of this DFA.
        unsafe {
            *self.cls.get_unchecked(base + a.index()) == *self.cls.get_unchecked(base + b.index())
        }
    }

    /// Record that state `idx`'s mask is cached: it becomes its classes' reference (the most
    /// recent one, usually the nearest: counted states are reached in count order).
    pub fn note_cached(&self, idx: usize) {
        for k in 0..=self.top {
            let c = self.cls[k * self.states + idx] as usize;
            self.rep[k * self.states + c].store(idx as u32 + 1, Ordering::Relaxed);
        }
    }

    /// The cached state agreeing with `idx` to the highest level (>= 1), and that level.
    pub fn best_ref(&self, idx: usize) -> Option<(usize, usize)> {
        (1..=self.top).rev().find_map(|k| {
            let c = self.cls[k * self.states + idx] as usize;
            match self.rep[k * self.states + c].load(Ordering::Relaxed) {
                0 => None,
                r => Some((r as usize - 1, k)),
            }
        })
    }
}

impl StateLevels {
    /// Trie nodes under the first bytes that `s` does not kill, and under those whose
    /// transitions from `s` and `t` differ (what a diff walk of `s` against `t` may enter).
    pub fn first_byte_costs(&self, dfa: &TableDfa, s: usize, t: usize) -> (usize, usize) {
        let (s, t) = (StateId::from_index(s), StateId::from_index(t));
        let (mut own, mut diff) = (0, 0);
        for (&b, &w) in self.bytes.iter().zip(&self.weight) {
            let a = dfa.next(s, b);
            if a != DEAD {
                own += w;
            }
            if a != dfa.next(t, b) {
                diff += w;
            }
        }
        (own, diff)
    }

    /// For a wide state without a leveled reference: the cached state whose first-byte
    /// transitions differ from `idx`'s under the fewest trie nodes (a diff walk then only
    /// enters those subtrees), if that is well under a full walk.
    pub fn first_byte_ref(
        &self,
        dfa: &TableDfa,
        idx: usize,
        min_walk: usize,
        cached: impl Fn(usize) -> bool,
    ) -> Option<usize> {
        let state = StateId::from_index(idx);
        let row: Vec<StateId> = self.bytes.iter().map(|&b| dfa.next(state, b)).collect();
        let own: usize = row
            .iter()
            .zip(&self.weight)
            .filter(|(&s, _)| s != DEAD)
            .map(|(_, &w)| w)
            .sum();
        if own <= min_walk {
            return None;
        }
        let mut best = (own / 4, None);
        for t in 1..self.states {
            if t == idx || !cached(t) {
                continue;
            }
            let ts = StateId::from_index(t);
            let mut cost = 0;
            for ((&b, &s), &w) in self.bytes.iter().zip(&row).zip(&self.weight) {
                if dfa.next(ts, b) != s {
                    cost += w;
                }
            }
            if cost < best.0 {
                best = (cost, Some(t));
            }
        }
        best.1
    }
}
