//! `BlockManager`: sequences, their block tables, allocation, append with copy-on-write,
//! fork and free, plus read-only views and the invariant checker the tests use.

use std::collections::VecDeque;
use std::sync::Arc;

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use super::error::KvError;
use super::ids::{BlockId, MAX_SLOTS};
use super::pool::Pool;
use super::prefix_cache::BlockHash;

/// Caller-chosen sequence id. A plain alias, not a newtype: it is an opaque hash-map key that
/// is never converted or used as an index, so a newtype would remove no cast, only add
/// wrapping at every call site and in the binding.
pub type SeqId = u64;

/// How many recently freed ids are remembered to tell a double free from an unknown id.
const FREED_MEMORY: usize = 1 << 16;

/// Slots of positions `start..end` through `blocks`, one division per block (not per slot).
#[inline]
pub(crate) fn push_slots(
    blocks: &[BlockId],
    bs: usize,
    start: usize,
    end: usize,
    out: &mut Vec<i32>,
) {
    let mut p = start;
    while p < end {
        let (b, off) = (blocks[p / bs], p % bs);
        let run = (bs - off).min(end - p);
        out.extend((off..off + run).map(|o| b.slot(bs, o).get()));
        p += run;
    }
}

/// Refuse parallel arrays of different lengths ("3 sequences but 2 counts").
pub(crate) fn same_len(a: usize, a_what: &str, b: usize, b_what: &str) -> Result<(), KvError> {
    if a != b {
        return Err(KvError::Invalid(format!("{a} {a_what} but {b} {b_what}")));
    }
    Ok(())
}

/// The ids met so far in one batch call, to refuse an id given twice.
pub(crate) struct Seen(HashSet<SeqId>);

impl Seen {
    pub fn with_capacity(n: usize) -> Self {
        Seen(HashSet::with_capacity_and_hasher(n, Default::default()))
    }

    /// Record `id`; a repeat is the error `twice` makes of it.
    pub fn first(
        &mut self,
        id: SeqId,
        twice: impl FnOnce(SeqId) -> KvError,
    ) -> Result<(), KvError> {
        if self.0.insert(id) {
            Ok(())
        } else {
            Err(twice(id))
        }
    }

    pub fn contains(&self, id: &SeqId) -> bool {
        self.0.contains(id)
    }
}

/// The error of a sequence given twice in one step.
pub(crate) fn twice_in_step(seq: SeqId) -> KvError {
    KvError::Invalid(format!("sequence {seq} appears twice in one step"))
}

#[inline]
fn plan(bs: usize, s: &Seq, n: usize, tail_refcount: u32) -> (usize, bool) {
    if n == 0 {
        return (0, false);
    }
    let total = s.len + s.pending;
    let cow = !total.is_multiple_of(bs) && tail_refcount > 1;
    // Saturate: an absurd `n` must read as "out of blocks", not overflow.
    let need = total.saturating_add(n).div_ceil(bs) - s.blocks.len();
    (need.saturating_add(usize::from(cow)), cow)
}

#[derive(Debug, Clone)]
pub(crate) struct Seq {
    /// Block table: covers `len + pending` slots, so `blocks.len() == ceil((len+pending)/bs)`.
    pub blocks: Vec<BlockId>,
    /// Committed tokens.
    pub len: usize,
    /// Tentative (draft-tree) slots after the committed ones.
    pub pending: usize,
    /// Committed token ids, while known (prefix caching only).
    pub tokens: Option<Vec<i64>>,
    /// Content hashes of the leading full blocks registered (or found) in the prefix cache.
    pub hashes: Vec<BlockHash>,
    /// Leading committed tokens whose K/V is known to be written (`<= len`): only blocks
    /// inside this prefix may be registered.
    pub computed: usize,
    /// Per-request salt and extra key, hashed into every block of the sequence.
    pub cache_salt: Arc<[u8]>,
    pub extra_key: u64,
}

/// New slots of an append or a tree reservation, and the copy-on-write it needs first.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Appended {
    pub slots: Vec<i32>,
    /// `(src_block, dst_block)`: copy the shared partial tail before writing the new slots.
    pub cow: Option<(u32, u32)>,
}

#[derive(Debug, Clone)]
pub struct BlockManager {
    pub(crate) block_size: usize,
    pub(crate) pool: Pool,
    pub(crate) seqs: HashMap<SeqId, Seq>,
    pub(crate) prefix_caching: bool,
    freed: HashSet<SeqId>,
    freed_order: VecDeque<SeqId>,
}

impl BlockManager {
    pub fn new(
        num_blocks: usize,
        block_size: usize,
        prefix_caching: bool,
    ) -> Result<Self, KvError> {
        // Slot ids are i32 and free-queue links reserve u32::MAX.
        let fits = num_blocks
            .checked_mul(block_size)
            .is_some_and(|slots| slots <= MAX_SLOTS);
        if num_blocks == 0 || block_size == 0 {
            return Err(KvError::Invalid(format!(
                "num_blocks ({num_blocks}) and block_size ({block_size}) must be >= 1"
            )));
        }
        if !fits {
            return Err(KvError::Invalid(format!(
                "num_blocks * block_size = {num_blocks} * {block_size} exceeds 2^31 - 1 slots"
            )));
        }
        Ok(BlockManager {
            block_size,
            pool: Pool::new(num_blocks),
            seqs: HashMap::default(),
            prefix_caching,
            freed: HashSet::default(),
            freed_order: VecDeque::new(),
        })
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }
    pub fn num_blocks(&self) -> usize {
        self.pool.num_blocks()
    }
    pub fn num_free_blocks(&self) -> usize {
        self.pool.num_free()
    }
    pub fn prefix_caching(&self) -> bool {
        self.prefix_caching
    }
    pub fn num_sequences(&self) -> usize {
        self.seqs.len()
    }
    /// Blocks a new sequence of `num_tokens` tokens needs.
    pub fn blocks_for(&self, num_tokens: usize) -> usize {
        num_tokens.div_ceil(self.block_size)
    }
    /// Whether a new sequence of `num_tokens` tokens fits now (without prefix hits).
    pub fn can_allocate(&self, num_tokens: usize) -> bool {
        self.blocks_for(num_tokens) <= self.pool.num_free()
    }
    pub fn contains(&self, seq: SeqId) -> bool {
        self.seqs.contains_key(&seq)
    }
    pub fn sequences(&self) -> Vec<SeqId> {
        self.seqs.keys().copied().collect()
    }
    pub fn refcounts(&self) -> &[u32] {
        self.pool.refcounts()
    }
    /// Free blocks from least to most recently freed (the eviction order).
    pub fn free_queue(&self) -> Vec<u32> {
        self.pool
            .free_queue()
            .into_iter()
            .map(BlockId::get)
            .collect()
    }
    /// Blocks currently registered in the prefix cache (held or evictable).
    pub fn num_cached_blocks(&self) -> usize {
        self.pool.num_cached()
    }

    pub(crate) fn get(&self, seq: SeqId) -> Result<&Seq, KvError> {
        match self.seqs.get(&seq) {
            Some(s) => Ok(s),
            None => Err(self.missing(seq)),
        }
    }

    pub(crate) fn missing(&self, seq: SeqId) -> KvError {
        if self.freed.contains(&seq) {
            KvError::AlreadyFreed(seq)
        } else {
            KvError::UnknownSequence(seq)
        }
    }

    pub(crate) fn check_new(&self, seq: SeqId) -> Result<(), KvError> {
        if self.seqs.contains_key(&seq) {
            return Err(KvError::SequenceExists(seq));
        }
        Ok(())
    }

    pub(crate) fn check_fits(&self, needed: usize) -> Result<(), KvError> {
        let free = self.pool.num_free();
        if needed > free {
            return Err(KvError::OutOfBlocks { needed, free });
        }
        Ok(())
    }

    /// `(committed, tentative)` token counts of `seq`.
    pub fn seq_len(&self, seq: SeqId) -> Result<(usize, usize), KvError> {
        let s = self.get(seq)?;
        Ok((s.len, s.pending))
    }

    /// The blocks holding `seq`'s slots, in position order.
    pub fn block_table(&self, seq: SeqId) -> Result<Vec<u32>, KvError> {
        Ok(self.get(seq)?.blocks.iter().map(|b| b.get()).collect())
    }

    /// Slot ids of positions `start .. start + n` of `seq` (committed or tentative).
    pub fn slot_mapping(&self, seq: SeqId, start: usize, n: usize) -> Result<Vec<i32>, KvError> {
        let s = self.get(seq)?;
        let end = start.saturating_add(n);
        if end > s.len + s.pending {
            return Err(KvError::Invalid(format!(
                "positions {start}..{end} of sequence {seq} are outside its {} slots",
                s.len + s.pending
            )));
        }
        let mut out = Vec::with_capacity(n);
        push_slots(&s.blocks, self.block_size, start, end, &mut out);
        Ok(out)
    }

    /// Start a sequence of `num_tokens` committed slots in fresh blocks.
    pub fn allocate(&mut self, seq: SeqId, num_tokens: usize) -> Result<(), KvError> {
        self.check_new(seq)?;
        let need = self.blocks_for(num_tokens);
        self.check_fits(need)?;
        let blocks = (0..need).map(|_| self.pool.take()).collect();
        self.insert(
            seq,
            Seq {
                blocks,
                len: num_tokens,
                pending: 0,
                tokens: None,
                hashes: vec![],
                computed: num_tokens,
                cache_salt: Arc::from(&[][..]),
                extra_key: 0,
            },
        );
        Ok(())
    }

    pub(crate) fn insert(&mut self, seq: SeqId, s: Seq) {
        // A reused id is live again; forgetting it in `freed` keeps the ring small.
        self.freed.remove(&seq);
        self.seqs.insert(seq, s);
    }

    /// Blocks to take (copy-on-write included) and whether the tail is copied, to grow `s`
    /// by `n` slots, given the tail's current refcount.
    #[inline]
    pub(crate) fn grow_plan(&self, s: &Seq, n: usize, tail_refcount: u32) -> (usize, bool) {
        plan(self.block_size, s, n, tail_refcount)
    }

    #[inline]
    pub(crate) fn tail_refcount(&self, s: &Seq) -> u32 {
        s.blocks.last().map_or(0, |&b| self.pool.holders(b))
    }

    /// Grow `seq` by `n` slots after its last one (checked by the caller); returns the
    /// copy-on-write and sets `pending` to `pending` (tree slots) or adds `n` to `len`.
    pub(crate) fn grow(
        &mut self,
        seq: SeqId,
        n: usize,
        tentative: bool,
        out: &mut Vec<i32>,
    ) -> Option<(u32, u32)> {
        let bs = self.block_size;
        let pool = &mut self.pool;
        let s = self
            .seqs
            .get_mut(&seq)
            .expect("grow: sequence checked by the caller");
        let tail_rc = s.blocks.last().map_or(0, |&b| pool.holders(b));
        let (_, cow) = plan(bs, s, n, tail_rc);
        let mut pair = None;
        if cow {
            let old = *s.blocks.last().unwrap();
            let new = pool.take();
            pool.decref(old);
            *s.blocks.last_mut().unwrap() = new;
            pair = Some((old.get(), new.get()));
        }
        let total = s.len + s.pending;
        let want = (total + n).div_ceil(bs);
        while s.blocks.len() < want {
            s.blocks.push(pool.take());
        }
        push_slots(&s.blocks, bs, total, total + n, out);
        if tentative {
            s.pending = n;
        } else {
            s.len += n;
        }
        pair
    }

    /// Append `n` committed slots to `seq`, copying its shared (or cached) partial tail first.
    /// `tokens` (length `n`) keep the sequence's blocks hashable for the prefix cache;
    /// without them the sequence stops registering blocks. The caller writes the new slots'
    /// K/V after this call, so they are registered only after `mark_computed` (or the next
    /// commit), not here.
    pub fn append_slots(
        &mut self,
        seq: SeqId,
        n: usize,
        tokens: Option<&[i64]>,
    ) -> Result<Appended, KvError> {
        let s = self.get(seq)?;
        if s.pending > 0 {
            return Err(KvError::PendingStep(seq));
        }
        if let Some(t) = tokens {
            if t.len() != n {
                return Err(KvError::Invalid(format!(
                    "{} token ids for {n} slots",
                    t.len()
                )));
            }
        }
        let (need, _) = self.grow_plan(s, n, self.tail_refcount(s));
        self.check_fits(need)?;
        let mut slots = Vec::with_capacity(n);
        let cow = self.grow(seq, n, false, &mut slots);
        self.extend_tokens(seq, tokens);
        Ok(Appended { slots, cow })
    }

    /// Share every block of `parent` with a new sequence `child` (no copy).
    pub fn fork(&mut self, parent: SeqId, child: SeqId) -> Result<(), KvError> {
        let p = self.get(parent)?;
        if p.pending > 0 {
            return Err(KvError::PendingStep(parent));
        }
        self.check_new(child)?;
        let c = p.clone();
        for &b in &c.blocks {
            self.pool.incref(b);
        }
        self.insert(child, c);
        Ok(())
    }

    /// Release `seq` and its blocks (tail first, so a prefix outlives its tail in the LRU).
    pub fn free(&mut self, seq: SeqId) -> Result<(), KvError> {
        let s = self.seqs.remove(&seq).ok_or_else(|| self.missing(seq))?;
        for &b in s.blocks.iter().rev() {
            self.pool.decref(b);
        }
        if self.freed.insert(seq) {
            self.freed_order.push_back(seq);
            if self.freed_order.len() > FREED_MEMORY {
                let old = self.freed_order.pop_front().unwrap();
                if !self.seqs.contains_key(&old) {
                    self.freed.remove(&old);
                }
            }
        }
        Ok(())
    }

    /// `allocate` for many new sequences; all or nothing.
    pub fn allocate_batch(&mut self, seqs: &[SeqId], counts: &[usize]) -> Result<(), KvError> {
        same_len(seqs.len(), "sequences", counts.len(), "counts")?;
        let mut seen = Seen::with_capacity(seqs.len());
        for &seq in seqs {
            self.check_new(seq)?;
            seen.first(seq, |s| {
                KvError::Invalid(format!("sequence {s} appears twice"))
            })?;
        }
        self.check_fits(
            counts
                .iter()
                .fold(0usize, |a, &n| a.saturating_add(self.blocks_for(n))),
        )?;
        for (&seq, &n) in seqs.iter().zip(counts) {
            self.allocate(seq, n).expect("checked above");
        }
        Ok(())
    }

    /// `fork(parents[i], children[i])` for all `i`: parents must exist before the call,
    /// children must not; all or nothing.
    pub fn fork_batch(&mut self, parents: &[SeqId], children: &[SeqId]) -> Result<(), KvError> {
        same_len(parents.len(), "parents", children.len(), "children")?;
        let mut seen = Seen::with_capacity(children.len());
        for (&p, &c) in parents.iter().zip(children) {
            if self.get(p)?.pending > 0 {
                return Err(KvError::PendingStep(p));
            }
            self.check_new(c)?;
            seen.first(c, |c| KvError::Invalid(format!("child {c} appears twice")))?;
        }
        if let Some(&p) = parents.iter().find(|p| seen.contains(p)) {
            return Err(KvError::Invalid(format!(
                "sequence {p} is both a parent and a child"
            )));
        }
        for (&p, &c) in parents.iter().zip(children) {
            self.fork(p, c).expect("checked above");
        }
        Ok(())
    }

    /// `free` for many sequences; all or nothing.
    pub fn free_batch(&mut self, seqs: &[SeqId]) -> Result<(), KvError> {
        let mut seen = Seen::with_capacity(seqs.len());
        for &seq in seqs {
            self.get(seq)?;
            seen.first(seq, KvError::AlreadyFreed)?;
        }
        for &seq in seqs {
            self.free(seq).expect("checked above");
        }
        Ok(())
    }

    /// Keep only the first `len` committed tokens of `seq` (outside a step), releasing
    /// emptied blocks. Cached blocks stay cached; a cached block left as a partial tail is
    /// copied before it is written again.
    pub fn truncate_seq(&mut self, seq: SeqId, len: usize) -> Result<(), KvError> {
        let s = self.get(seq)?;
        if s.pending > 0 {
            return Err(KvError::PendingStep(seq));
        }
        if len > s.len {
            return Err(KvError::Invalid(format!(
                "truncate sequence {seq} to {len}: only {} tokens are committed",
                s.len
            )));
        }
        let bs = self.block_size;
        let s = self.seqs.get_mut(&seq).unwrap();
        s.len = len;
        s.computed = s.computed.min(len);
        if let Some(t) = &mut s.tokens {
            t.truncate(len);
        }
        s.hashes.truncate(len / bs);
        self.truncate(seq);
        Ok(())
    }

    /// `true` when block `b` is registered in the prefix cache.
    pub fn is_cached(&self, b: u32) -> bool {
        self.pool.is_cached(BlockId::new(b))
    }

    /// Drop blocks of `seq` beyond its `len + pending` slots (tail first).
    pub(crate) fn truncate(&mut self, seq: SeqId) {
        let s = self.seqs.get_mut(&seq).unwrap();
        let keep = (s.len + s.pending).div_ceil(self.block_size);
        for &b in s.blocks[keep..].iter().rev() {
            self.pool.decref(b);
        }
        s.blocks.truncate(keep);
    }

    /// Every structural invariant, recomputed from scratch: refcount == number of tables
    /// holding the block, free queue == refcount-0 blocks (both link directions), table
    /// lengths match token counts, hash map and block hashes agree.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut count = vec![0u32; self.num_blocks()];
        for (id, s) in &self.seqs {
            if s.blocks.len() != (s.len + s.pending).div_ceil(self.block_size) {
                return Err(format!(
                    "sequence {id}: {} blocks for {}+{} slots",
                    s.blocks.len(),
                    s.len,
                    s.pending
                ));
            }
            for &b in &s.blocks {
                count[b.index()] += 1;
            }
        }
        let refcounts = self.pool.refcounts();
        if let Some(b) = (0..count.len()).find(|&b| count[b] != refcounts[b]) {
            return Err(format!(
                "block {b}: refcount {} but {} tables hold it",
                refcounts[b], count[b]
            ));
        }
        self.pool.check_links()
    }
}
