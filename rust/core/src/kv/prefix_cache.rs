//! Prefix caching: a full block is identified by the chained hash of (parent block's hash,
//! its token ids, an extra key such as a LoRA or multimodal id). A new sequence reuses the
//! longest run of cached blocks; a freed cached block stays hittable in the free queue until
//! it is taken for new data (LRU eviction, only when space is needed).

use std::collections::hash_map::DefaultHasher;
use std::collections::HashSet;
use std::hash::Hasher;

use super::error::KvError;
use super::ids::BlockId;
use super::manager::{BlockManager, Seq, SeqId};

/// Chained block hash (SipHash, 64 bits: a collision needs ~2^32 cached blocks).
pub fn block_hash(parent: Option<u64>, tokens: &[i64], extra_key: u64) -> u64 {
    let mut h = DefaultHasher::new();
    h.write_u64(parent.map_or(0x9e37_79b9_7f4a_7c15, |p| p ^ 0x5bd1_e995));
    h.write_u64(extra_key);
    for &t in tokens {
        h.write_i64(t);
    }
    h.finish()
}

impl BlockManager {
    /// Start `seq` holding `tokens`, reusing the longest cached prefix of full blocks (at most
    /// `len - 1` tokens, so the last token is always computed). Returns the number of cached
    /// tokens whose K/V is already in place; the caller writes the rest.
    pub fn allocate_tokens(
        &mut self,
        seq: SeqId,
        tokens: &[i64],
        extra_key: u64,
    ) -> Result<usize, KvError> {
        self.alloc_tokens(seq, tokens, extra_key, false)
    }

    /// Start `seq` holding only the cached prefix of `tokens` (at most `len - 1` tokens, in
    /// whole blocks) and return its length; the caller then runs the rest as a step and
    /// commits it with its token ids, so blocks are registered only once their K/V exists.
    pub fn allocate_cached_prefix(
        &mut self,
        seq: SeqId,
        tokens: &[i64],
        extra_key: u64,
    ) -> Result<usize, KvError> {
        self.alloc_tokens(seq, tokens, extra_key, true)
    }

    fn alloc_tokens(
        &mut self,
        seq: SeqId,
        tokens: &[i64],
        extra_key: u64,
        prefix_only: bool,
    ) -> Result<usize, KvError> {
        self.check_new(seq)?;
        let bs = self.block_size;
        let mut total = self.blocks_for(tokens.len());
        let mut hashes = Vec::with_capacity(tokens.len() / bs);
        let mut hits: Vec<BlockId> = vec![];
        if self.prefix_caching {
            let mut parent = None;
            for chunk in tokens.chunks_exact(bs) {
                let h = block_hash(parent, chunk, extra_key);
                hashes.push(h);
                parent = Some(h);
            }
            let max_hits = tokens.len().saturating_sub(1) / bs;
            for h in &hashes[..max_hits] {
                match self.pool.cached_block(*h) {
                    Some(b) => hits.push(b),
                    None => break,
                }
            }
        }
        let mut tokens = tokens;
        if prefix_only {
            total = hits.len();
            tokens = &tokens[..hits.len() * bs];
        }
        // Hit blocks sitting in the free queue leave it, so they are not free for the rest.
        let free_hits = hits.iter().filter(|&&b| self.pool.refcount(b) == 0).count();
        let need = total - hits.len();
        let free = self.pool.num_free() - free_hits;
        if need > free {
            return Err(KvError::OutOfBlocks { needed: need, free });
        }
        let cached = hits.len() * bs;
        let mut blocks = hits;
        for &b in &blocks {
            self.pool.incref(b);
        }
        while blocks.len() < total {
            blocks.push(self.pool.take());
        }
        let tracked = self.prefix_caching.then(|| tokens.to_vec());
        self.insert(
            seq,
            Seq {
                blocks,
                len: tokens.len(),
                pending: 0,
                tokens: tracked,
                hashes: vec![],
                extra_key,
            },
        );
        self.register_full_blocks(seq);
        Ok(cached)
    }

    /// Record committed token ids of `seq` (or stop tracking it when they are unknown) and
    /// register its newly full blocks. `len` has already grown by `tokens.len()`.
    pub(crate) fn extend_tokens(&mut self, seq: SeqId, tokens: Option<&[i64]>) {
        let s = self.seqs.get_mut(&seq).unwrap();
        match (&mut s.tokens, tokens) {
            (Some(known), Some(t)) => known.extend_from_slice(t),
            (Some(_), None) => s.tokens = None,
            _ => {}
        }
        if s.tokens.is_some() {
            self.register_full_blocks(seq);
        }
    }

    fn register_full_blocks(&mut self, seq: SeqId) {
        let bs = self.block_size;
        let s = self.seqs.get_mut(&seq).unwrap();
        let Some(tokens) = &s.tokens else { return };
        debug_assert_eq!(tokens.len(), s.len);
        while s.hashes.len() < s.len / bs {
            let i = s.hashes.len();
            let h = block_hash(
                s.hashes.last().copied(),
                &tokens[i * bs..(i + 1) * bs],
                s.extra_key,
            );
            s.hashes.push(h);
            self.pool.register(s.blocks[i], h);
        }
    }

    /// Distinct blocks held by any sequence (for tests and stats).
    pub fn num_used_blocks(&self) -> usize {
        self.seqs
            .values()
            .flat_map(|s| s.blocks.iter())
            .collect::<HashSet<_>>()
            .len()
    }
}
