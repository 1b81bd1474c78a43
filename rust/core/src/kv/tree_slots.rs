//! Tentative draft-tree slots: reserve after the committed prefix, then commit the accepted
//! nodes (moves that make them contiguous) or roll back. Batched forms cover a decode step.

use rustc_hash::FxHashMap as HashMap;

use super::error::KvError;
use super::ids::BlockId;
use super::manager::{same_len, twice_in_step, Appended, BlockManager, Seen, SeqId};

/// A decode step's reservations: `slots[offsets[i]..offsets[i+1]]` belong to `seqs[i]`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReserveBatch {
    pub slots: Vec<i32>,
    pub offsets: Vec<usize>,
    /// `(src_block, dst_block)` copies to run before writing any slot.
    pub cow: Vec<(u32, u32)>,
}

/// A decode step's commit moves: copy slot `src[i]` to `dst[i]` (gather all, then scatter).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CommitBatch {
    pub src: Vec<i32>,
    pub dst: Vec<i32>,
}

impl BlockManager {
    /// Reserve `n` tentative slots after the committed prefix of `seq` (the tree's nodes in
    /// order). Copy-on-write applies to a shared partial tail, as for `append_slots`.
    pub fn reserve_tree(&mut self, seq: SeqId, n: usize) -> Result<Appended, KvError> {
        let batch = self.reserve_tree_batch(&[seq], &[n])?;
        Ok(Appended {
            slots: batch.slots,
            cow: batch.cow.first().copied(),
        })
    }

    /// Reserve for many sequences at once; all or nothing.
    pub fn reserve_tree_batch(
        &mut self,
        seqs: &[SeqId],
        counts: &[usize],
    ) -> Result<ReserveBatch, KvError> {
        self.grow_batch(seqs, counts, true)
    }

    /// `append_slots` (committed slots, no token ids) for many sequences; all or nothing.
    pub fn append_slots_batch(
        &mut self,
        seqs: &[SeqId],
        counts: &[usize],
    ) -> Result<ReserveBatch, KvError> {
        self.grow_batch(seqs, counts, false)
    }

    fn grow_batch(
        &mut self,
        seqs: &[SeqId],
        counts: &[usize],
        tentative: bool,
    ) -> Result<ReserveBatch, KvError> {
        same_len(seqs.len(), "sequences", counts.len(), "counts")?;
        // Validate everything and count blocks exactly (a shared tail copied by one sequence
        // is no longer shared for the next), before touching anything.
        let mut seen = Seen::with_capacity(seqs.len());
        let mut tail_rc: HashMap<BlockId, u32> = HashMap::default();
        let mut need = 0usize;
        for (&seq, &n) in seqs.iter().zip(counts) {
            let s = self.get(seq)?;
            seen.first(seq, twice_in_step)?;
            if s.pending > 0 {
                return Err(KvError::PendingStep(seq));
            }
            if n == 0 && tentative {
                return Err(KvError::Invalid(format!(
                    "sequence {seq}: a tree has at least one node"
                )));
            }
            // Only shared tails can change between members; others read the pool directly.
            let rc = match s.blocks.last() {
                Some(&b) if self.pool.holders(b) > 1 => {
                    *tail_rc.entry(b).or_insert(self.pool.holders(b))
                }
                Some(&b) => self.pool.holders(b),
                None => 0,
            };
            let (k, cow) = self.grow_plan(s, n, rc);
            if cow {
                *tail_rc.get_mut(s.blocks.last().unwrap()).unwrap() -= 1;
            }
            need = need.saturating_add(k);
        }
        self.check_fits(need)?;
        let mut out = ReserveBatch {
            slots: Vec::with_capacity(counts.iter().sum()),
            offsets: Vec::with_capacity(seqs.len() + 1),
            cow: vec![],
        };
        out.offsets.push(0);
        for (&seq, &n) in seqs.iter().zip(counts) {
            if !tentative {
                // Committed slots without token ids: the sequence stops registering blocks.
                self.seqs.get_mut(&seq).unwrap().tokens = None;
            }
            if let Some(pair) = self.grow(seq, n, tentative, &mut out.slots) {
                out.cow.push(pair);
            }
            out.offsets.push(out.slots.len());
        }
        Ok(out)
    }

    fn check_accepted(
        &self,
        seq: SeqId,
        accepted: &[i64],
        tokens: Option<&[i64]>,
    ) -> Result<(), KvError> {
        let s = self.get(seq)?;
        if s.pending == 0 {
            return Err(KvError::NoStep(seq));
        }
        let mut prev = -1i64;
        for &i in accepted {
            if i < 0 || i as usize >= s.pending {
                return Err(KvError::NotReserved {
                    seq,
                    node: i,
                    reserved: s.pending,
                });
            }
            if i <= prev {
                return Err(KvError::Invalid(format!(
                    "sequence {seq}: accepted nodes must be strictly increasing, got {accepted:?}"
                )));
            }
            prev = i;
        }
        if let Some(t) = tokens {
            if t.len() != accepted.len() {
                return Err(KvError::Invalid(format!(
                    "sequence {seq}: {} token ids for {} accepted nodes",
                    t.len(),
                    accepted.len()
                )));
            }
        }
        Ok(())
    }

    /// Keep the tentative nodes `accepted` (increasing indices into the reservation) as
    /// committed tokens at contiguous positions; release the rest and any emptied block.
    /// Returns the `(src_slot, dst_slot)` moves (gather all sources, then scatter).
    pub fn commit(
        &mut self,
        seq: SeqId,
        accepted: &[i64],
        tokens: Option<&[i64]>,
    ) -> Result<Vec<(i32, i32)>, KvError> {
        self.check_accepted(seq, accepted, tokens)?;
        let mut out = CommitBatch::default();
        self.commit_unchecked(seq, accepted, tokens, &mut out);
        Ok(out.src.into_iter().zip(out.dst).collect())
    }

    /// Commit many sequences: `accepted[offsets[i]..offsets[i+1]]` for `seqs[i]`; all or
    /// nothing. `tokens`, when given, align with `accepted`.
    pub fn commit_batch(
        &mut self,
        seqs: &[SeqId],
        accepted: &[i64],
        offsets: &[usize],
        tokens: Option<&[i64]>,
    ) -> Result<CommitBatch, KvError> {
        if offsets.len() != seqs.len() + 1
            || offsets[0] != 0
            || offsets.windows(2).any(|w| w[0] > w[1])
            || offsets[seqs.len()] != accepted.len()
        {
            return Err(KvError::Invalid(format!(
                "offsets must be {} non-decreasing entries from 0 to {}",
                seqs.len() + 1,
                accepted.len()
            )));
        }
        if tokens.is_some_and(|t| t.len() != accepted.len()) {
            return Err(KvError::Invalid("tokens must align with accepted".into()));
        }
        let mut seen = Seen::with_capacity(seqs.len());
        for (i, &seq) in seqs.iter().enumerate() {
            seen.first(seq, twice_in_step)?;
            let r = offsets[i]..offsets[i + 1];
            self.check_accepted(seq, &accepted[r.clone()], tokens.map(|t| &t[r]))?;
        }
        let mut out = CommitBatch::default();
        for (i, &seq) in seqs.iter().enumerate() {
            let r = offsets[i]..offsets[i + 1];
            self.commit_unchecked(seq, &accepted[r.clone()], tokens.map(|t| &t[r]), &mut out);
        }
        Ok(out)
    }

    fn commit_unchecked(
        &mut self,
        seq: SeqId,
        accepted: &[i64],
        tokens: Option<&[i64]>,
        out: &mut CommitBatch,
    ) {
        let bs = self.block_size;
        let s = self.seqs.get_mut(&seq).unwrap();
        let slot = |pos: usize| s.blocks[pos / bs].slot(bs, pos % bs).get();
        for (j, &i) in accepted.iter().enumerate() {
            let i = i as usize;
            if i != j {
                out.src.push(slot(s.len + i));
                out.dst.push(slot(s.len + j));
            }
        }
        s.len += accepted.len();
        s.pending = 0;
        let keep = s.len.div_ceil(bs);
        for &b in s.blocks[keep..].iter().rev() {
            self.pool.decref(b);
        }
        s.blocks.truncate(keep);
        // The step's forward read the whole committed prefix and wrote the kept nodes: all
        // of the sequence's K/V exists now, so its full blocks may be registered.
        s.computed = s.len;
        if s.tokens.is_some() {
            self.extend_tokens(seq, tokens);
            self.register_full_blocks(seq);
        }
    }

    /// Release every tentative slot of `seq` (no-op outside a step).
    pub fn rollback(&mut self, seq: SeqId) -> Result<(), KvError> {
        self.get(seq)?;
        self.seqs.get_mut(&seq).unwrap().pending = 0;
        self.truncate(seq);
        Ok(())
    }
}
