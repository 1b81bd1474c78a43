//! Prefix caching: a full block is found by its content hash, and a new sequence reuses the
//! longest run of cached blocks; a freed cached block stays hittable in the free queue until
//! it is taken for new data (LRU eviction, only when space is needed).
//!
//! **Hash.** SHA-256 over this byte string, kept whole (32 bytes) as the cache key:
//!
//! ```text
//! b"specdec/kv-block/v1"              19 bytes: domain tag and encoding version
//! 0x00  |  0x01 ++ parent (32 bytes)  a sequence's first block, or the previous block's hash
//! extra_key                           u64 little-endian (a grammar or adapter id)
//! len(cache_salt) ++ cache_salt       u64 little-endian byte count, then the bytes
//! len(tokens) ++ tokens               u64 little-endian count, then each token i64 LE
//! ```
//!
//! Every variable part is length-prefixed and the parent is flagged, so two different
//! inputs never encode alike; a collision then needs a SHA-256 collision (about 2^128 work).
//! A 64-bit keyed-by-a-constant hash let anyone craft a colliding prompt offline in about
//! 2^32 tries and read or poison another tenant's K/V. `cache_salt` is per request: equal
//! prompts under different salts share no block.
//!
//! **Registration.** A block enters the cache only once its K/V is written: when the
//! sequence's computed prefix covers it (`mark_computed`, or a tree-step `commit`, whose
//! forward read the whole prefix and wrote the kept nodes). Allocation and `append_slots`
//! hand out slots to be written later, so registering there would let a second sequence
//! with the same prompt, allocated in the same scheduling step, skip K/V nobody wrote yet.

use std::collections::HashSet;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::error::KvError;
use super::ids::BlockId;
use super::manager::{BlockManager, Seq, SeqId};

/// A block's content hash (the full SHA-256 digest: truncating it would bring collisions
/// back within reach).
pub type BlockHash = [u8; 32];

/// Domain tag and encoding version: a digest of this crate's block encoding can never equal
/// one of another encoding (or of a later version of this one).
const DOMAIN: &[u8] = b"specdec/kv-block/v1";

/// The content hash of one block: see the module doc for the exact byte encoding.
pub fn block_hash(
    parent: Option<&BlockHash>,
    tokens: &[i64],
    cache_salt: &[u8],
    extra_key: u64,
) -> BlockHash {
    let mut h = Sha256::new();
    h.update(DOMAIN);
    match parent {
        None => h.update([0u8]),
        Some(p) => {
            h.update([1u8]);
            h.update(p);
        }
    }
    h.update(extra_key.to_le_bytes());
    h.update((cache_salt.len() as u64).to_le_bytes());
    h.update(cache_salt);
    h.update((tokens.len() as u64).to_le_bytes());
    // Encode through a stack buffer: one update per 64 tokens, no allocation per block.
    let mut buf = [0u8; 512];
    for chunk in tokens.chunks(64) {
        for (dst, &t) in buf.chunks_exact_mut(8).zip(chunk) {
            dst.copy_from_slice(&t.to_le_bytes());
        }
        h.update(&buf[..chunk.len() * 8]);
    }
    h.finalize().into()
}

impl BlockManager {
    /// Start `seq` holding `tokens`, reusing the longest cached prefix of full blocks with the
    /// same `cache_salt` and `extra_key` (at most `len - 1` tokens, so the last token is
    /// always computed). Returns the number of cached tokens whose K/V is already in place;
    /// the caller writes the rest, then calls `mark_computed` so its blocks become cached.
    pub fn allocate_tokens(
        &mut self,
        seq: SeqId,
        tokens: &[i64],
        cache_salt: &[u8],
        extra_key: u64,
    ) -> Result<usize, KvError> {
        self.alloc_tokens(seq, tokens, cache_salt, extra_key, false)
    }

    /// Start `seq` holding only the cached prefix of `tokens` (at most `len - 1` tokens, in
    /// whole blocks) and return its length; the caller then runs the rest as a step and
    /// commits it with its token ids, so blocks are registered only once their K/V exists.
    pub fn allocate_cached_prefix(
        &mut self,
        seq: SeqId,
        tokens: &[i64],
        cache_salt: &[u8],
        extra_key: u64,
    ) -> Result<usize, KvError> {
        self.alloc_tokens(seq, tokens, cache_salt, extra_key, true)
    }

    fn alloc_tokens(
        &mut self,
        seq: SeqId,
        tokens: &[i64],
        cache_salt: &[u8],
        extra_key: u64,
        prefix_only: bool,
    ) -> Result<usize, KvError> {
        self.check_new(seq)?;
        let bs = self.block_size;
        let mut total = self.blocks_for(tokens.len());
        let mut hashes: Vec<BlockHash> = vec![];
        let mut hits: Vec<BlockId> = vec![];
        if self.prefix_caching {
            // Hash only while blocks hit: a miss ends the reusable prefix.
            let max_hits = tokens.len().saturating_sub(1) / bs;
            for chunk in tokens.chunks_exact(bs).take(max_hits) {
                let h = block_hash(hashes.last(), chunk, cache_salt, extra_key);
                match self.pool.cached_block(&h) {
                    Some(b) => {
                        hits.push(b);
                        hashes.push(h);
                    }
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
                // The hit blocks are registered already; nothing else is computed yet.
                hashes,
                computed: cached,
                cache_salt: Arc::from(cache_salt),
                extra_key,
            },
        );
        Ok(cached)
    }

    /// The K/V of the first `num_tokens` committed tokens of `seq` is written: register the
    /// full blocks they cover (a no-op below what is already known to be computed).
    pub fn mark_computed(&mut self, seq: SeqId, num_tokens: usize) -> Result<(), KvError> {
        let s = self.get(seq)?;
        if num_tokens > s.len {
            return Err(KvError::Invalid(format!(
                "sequence {seq}: {num_tokens} computed tokens but only {} are committed",
                s.len
            )));
        }
        let s = self.seqs.get_mut(&seq).unwrap();
        s.computed = s.computed.max(num_tokens);
        self.register_full_blocks(seq);
        Ok(())
    }

    /// Record committed token ids of `seq` (or stop tracking it when they are unknown).
    /// `len` has already grown by `tokens.len()`; nothing is registered here.
    pub(crate) fn extend_tokens(&mut self, seq: SeqId, tokens: Option<&[i64]>) {
        let s = self.seqs.get_mut(&seq).unwrap();
        match (&mut s.tokens, tokens) {
            (Some(known), Some(t)) => known.extend_from_slice(t),
            (Some(_), None) => s.tokens = None,
            _ => {}
        }
    }

    /// Register the full blocks of `seq` inside its computed prefix (token ids known).
    pub(crate) fn register_full_blocks(&mut self, seq: SeqId) {
        let bs = self.block_size;
        let s = self.seqs.get_mut(&seq).unwrap();
        let Some(tokens) = &s.tokens else { return };
        debug_assert_eq!(tokens.len(), s.len);
        debug_assert!(s.computed <= s.len);
        while s.hashes.len() < s.computed / bs {
            let i = s.hashes.len();
            let h = block_hash(
                s.hashes.last(),
                &tokens[i * bs..(i + 1) * bs],
                &s.cache_salt,
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
