//! The block pool: refcounts, an intrusive doubly linked free queue (O(1) push, pop and
//! removal from the middle) in LRU order, and the prefix cache's hash -> block map.

use std::collections::HashMap;

use super::ids::BlockId;
use super::prefix_cache::BlockHash;

const NIL: BlockId = BlockId::NIL;

#[derive(Debug, Clone)]
pub(crate) struct Pool {
    refcount: Vec<u32>,
    /// Content hash of a full cached block (prefix caching), if registered.
    hash: Vec<Option<BlockHash>>,
    prev: Vec<BlockId>,
    next: Vec<BlockId>,
    head: BlockId,
    tail: BlockId,
    num_free: usize,
    /// Hash -> the block registered under it. Std's randomly keyed SipHash, not Fx: the
    /// keys derive from (possibly adversarial) prompts, and a fixed hash would let one grind
    /// prompts whose digests all fall into one bucket.
    cached: HashMap<BlockHash, BlockId>,
}

impl Pool {
    pub fn new(num_blocks: usize) -> Self {
        // Initially every block is free, in index order.
        let link = |i: Option<usize>| {
            i.filter(|&i| i < num_blocks)
                .map_or(NIL, BlockId::from_index)
        };
        Pool {
            refcount: vec![0; num_blocks],
            hash: vec![None; num_blocks],
            prev: (0..num_blocks).map(|i| link(i.checked_sub(1))).collect(),
            next: (0..num_blocks).map(|i| link(Some(i + 1))).collect(),
            head: link(Some(0)),
            tail: link(num_blocks.checked_sub(1)),
            num_free: num_blocks,
            cached: HashMap::new(),
        }
    }

    #[inline]
    pub fn num_free(&self) -> usize {
        self.num_free
    }

    #[inline]
    pub fn num_blocks(&self) -> usize {
        self.refcount.len()
    }

    #[inline]
    pub fn refcounts(&self) -> &[u32] {
        &self.refcount
    }

    #[inline]
    pub fn refcount(&self, b: BlockId) -> u32 {
        self.refcount[b.index()]
    }

    /// The block registered under hash `h`, if any (held, or free but not yet reused).
    #[inline]
    pub fn cached_block(&self, h: &BlockHash) -> Option<BlockId> {
        self.cached.get(h).copied()
    }

    /// Blocks registered in the prefix cache.
    pub fn num_cached(&self) -> usize {
        self.cached.len()
    }

    /// Is block `b` registered in the prefix cache? (False for ids out of range.)
    pub fn is_cached(&self, b: BlockId) -> bool {
        self.hash.get(b.index()).is_some_and(|h| h.is_some())
    }

    /// Register full block `b` under hash `h`, unless `b` already carries a hash or another
    /// block holds `h` (the same content in another block stays private).
    pub fn register(&mut self, b: BlockId, h: BlockHash) {
        if self.hash[b.index()].is_none() && !self.cached.contains_key(&h) {
            self.hash[b.index()] = Some(h);
            self.cached.insert(h, b);
        }
    }

    /// Unlink `b` from the free queue (it must be in it).
    #[inline]
    fn unlink(&mut self, b: BlockId) {
        let (p, n) = (self.prev[b.index()], self.next[b.index()]);
        if p == NIL {
            self.head = n;
        } else {
            self.next[p.index()] = n;
        }
        if n == NIL {
            self.tail = p;
        } else {
            self.prev[n.index()] = p;
        }
        self.prev[b.index()] = NIL;
        self.next[b.index()] = NIL;
        self.num_free -= 1;
    }

    /// Append `b` at the most-recently-freed end.
    #[inline]
    fn push_tail(&mut self, b: BlockId) {
        self.prev[b.index()] = self.tail;
        self.next[b.index()] = NIL;
        if self.tail == NIL {
            self.head = b;
        } else {
            self.next[self.tail.index()] = b;
        }
        self.tail = b;
        self.num_free += 1;
    }

    /// Take the least recently freed block, evicting its cached hash; refcount becomes 1.
    /// The caller has checked that a block is free.
    #[inline]
    pub fn take(&mut self) -> BlockId {
        let b = self.head;
        debug_assert!(b != NIL, "take() on an empty free queue");
        self.unlink(b);
        if let Some(h) = self.hash[b.index()].take() {
            if self.cached.get(&h) == Some(&b) {
                self.cached.remove(&h);
            }
        }
        self.refcount[b.index()] = 1;
        b
    }

    /// One more holder of `b`; a cached block with no holder leaves the free queue.
    #[inline]
    pub fn incref(&mut self, b: BlockId) {
        if self.refcount[b.index()] == 0 {
            self.unlink(b);
        }
        self.refcount[b.index()] += 1;
    }

    /// One holder fewer; at zero the block joins the free queue's tail (its hash stays
    /// hittable until the block is taken again).
    #[inline]
    pub fn decref(&mut self, b: BlockId) {
        let r = &mut self.refcount[b.index()];
        debug_assert!(*r > 0);
        *r -= 1;
        if *r == 0 {
            self.push_tail(b);
        }
    }

    /// Holders that forbid writing into `b`: its tables, plus one for the prefix cache
    /// (a cached block's content must stay what its hash says). Above 1 means copy on write.
    #[inline]
    pub fn holders(&self, b: BlockId) -> u32 {
        self.refcount[b.index()] + u32::from(self.hash[b.index()].is_some())
    }

    /// The free queue from least to most recently freed.
    pub fn free_queue(&self) -> Vec<BlockId> {
        let mut out = Vec::with_capacity(self.num_free);
        let mut b = self.head;
        while b != NIL {
            out.push(b);
            b = self.next[b.index()];
        }
        out
    }

    /// Free-queue links agree with refcounts both ways (used by the invariant checker).
    pub fn check_links(&self) -> Result<(), String> {
        let q = self.free_queue();
        if q.len() != self.num_free {
            return Err(format!(
                "free queue has {} blocks, counter says {}",
                q.len(),
                self.num_free
            ));
        }
        let mut back = Vec::with_capacity(q.len());
        let mut b = self.tail;
        while b != NIL {
            back.push(b);
            b = self.prev[b.index()];
        }
        back.reverse();
        if back != q {
            return Err("free queue's backward links disagree with its forward links".into());
        }
        for &b in &q {
            if self.refcount[b.index()] != 0 {
                return Err(format!(
                    "block {b} is free but has refcount {}",
                    self.refcount[b.index()]
                ));
            }
        }
        let zero = self.refcount.iter().filter(|&&r| r == 0).count();
        if zero != q.len() {
            return Err(format!(
                "{zero} blocks have refcount 0 but {} are free",
                q.len()
            ));
        }
        for (&h, &b) in &self.cached {
            if self.hash[b.index()] != Some(h) {
                return Err(format!(
                    "hash map names block {b}, which does not carry that hash"
                ));
            }
        }
        for (b, h) in self.hash.iter().enumerate() {
            if let Some(h) = h {
                if self.cached.get(h) != Some(&BlockId::from_index(b)) {
                    return Err(format!(
                        "block {b} carries a hash the map does not point back to"
                    ));
                }
            }
        }
        Ok(())
    }
}
