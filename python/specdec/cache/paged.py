"""Paged KV cache: Rust owns the block bookkeeping (``BlockManager``), torch owns the tensors.

A :class:`PagedKVPool` holds every layer's K/V as ``[num_layers, num_blocks, block_size,
kv_heads, head_dim]`` (so ``pool.k[layer]`` is the per-layer ``[num_blocks, block_size,
kv_heads, head_dim]`` tensor) and one :class:`BlockManager`. Each :class:`PagedKVCache` is one
sequence in the pool and implements the :class:`~specdec.protocols.KVCache` protocol, so the
models and the tree verifier run on it unchanged:

* ``begin(n)`` reserves ``n`` tentative tree slots (copying a shared partial tail block first),
* ``append`` writes this step's K/V through the slot mapping and gathers the sequence's
  ``[kv_heads, committed + n, head_dim]`` keys/values by its block table,
* ``commit(keep)`` runs the manager's ``(src_slot, dst_slot)`` moves as one index copy for all
  layers; ``rollback()`` releases the tentative slots.

Forked sequences and beams share blocks; copy-on-write copies are one index copy too.

Prefix caching (``prefix_caching=True``): a full block is found by its content hash, and a
block enters the cache only when the commit that fills it happens with the kept tokens' ids
(``commit(keep, tokens=...)`` or ``commit_fed(fed)``), i.e. once its K/V exists. A commit
without ids ends the sequence's registration: the cache never guesses ids from the prompt,
since a speculative chain step's commit (``keep == 0..m-1``) looks exactly like a prefill.
The hash of block ``i`` is SHA-256 over this byte string (``_core.block_hash`` computes it)::

    b"specdec/kv-block/v1"                      19 bytes: domain tag and encoding version
    0x00  or  0x01 + parent_digest              first block, or block i-1's 32-byte hash
    extra_key                                   u64 little-endian (a grammar or adapter id)
    len(cache_salt) + cache_salt                u64 little-endian length, then the bytes
    len(tokens) + tokens                        u64 little-endian count, then i64 LE each

Every variable part is length-prefixed, so distinct inputs never encode alike, and the
whole 32-byte digest is the key: a collision costs about 2^128 work, not the 2^32 of a
64-bit hash. ``cache_salt`` (bytes, or str as UTF-8; per request) keeps tenants apart:
equal prompts under different salts share no block.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .._core import BlockManager
from ..errors import KVCacheError, VerifyError
from .base import StepCache, check_keep

__all__ = ["BlockManager", "PagedDecodeStep", "PagedKVPool", "PagedKVCache"]


def _as_i64(x: Sequence[int] | np.ndarray | torch.Tensor) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    return np.ascontiguousarray(np.asarray(x, dtype=np.int64).reshape(-1))


@dataclass(frozen=True)
class PagedDecodeStep:
    """Where a batched one-token step reads and writes (:meth:`PagedKVPool.begin_decode`).

    ``new_slots`` ``[R]``: the slot of each row's new token; ``table`` ``[R, S]``: the slots
    of each row's committed prefix and then its new token, padded with slot 0; ``mask``
    ``[R, S]`` bool: which columns of ``table`` are real (True) rather than padding."""

    new_slots: torch.Tensor
    table: torch.Tensor
    mask: torch.Tensor


class PagedKVPool:
    """Block storage for many sequences plus their bookkeeping."""

    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        num_blocks: int,
        block_size: int = 16,
        *,
        prefix_caching: bool = False,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ) -> None:
        if min(num_layers, num_kv_heads, head_dim) <= 0:
            raise VerifyError("cache dimensions must be positive")
        self.manager = BlockManager(num_blocks, block_size, prefix_caching)
        self.num_layers, self.num_kv_heads, self.head_dim = num_layers, num_kv_heads, head_dim
        self.num_blocks, self.block_size = num_blocks, block_size
        self.device = torch.device(device)
        shape = (num_layers, num_blocks, block_size, num_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=self.device)
        self.v = torch.zeros(shape, dtype=dtype, device=self.device)
        # Slot-indexed views: slot = block * block_size + offset.
        flat = (num_layers, num_blocks * block_size, num_kv_heads, head_dim)
        self.k_slots = self.k.view(flat)
        self.v_slots = self.v.view(flat)
        self._next_seq = 0

    def _new_id(self) -> int:
        self._next_seq += 1
        return self._next_seq - 1

    def _index(self, a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.asarray(a, dtype=np.int64)).to(self.device)

    def copy_blocks(self, pairs: np.ndarray) -> None:
        """Copy-on-write: ``pairs[:, 0]`` blocks into ``pairs[:, 1]``, all layers at once."""
        if len(pairs):
            src, dst = self._index(pairs[:, 0]), self._index(pairs[:, 1])
            self.k[:, dst] = self.k[:, src]
            self.v[:, dst] = self.v[:, src]

    def move_slots(self, src: np.ndarray, dst: np.ndarray) -> None:
        """Commit moves, all layers at once (advanced indexing gathers before it scatters,
        so overlapping moves are safe)."""
        if len(src):
            s, d = self._index(src), self._index(dst)
            self.k_slots[:, d] = self.k_slots[:, s]
            self.v_slots[:, d] = self.v_slots[:, s]

    def sequence(
        self,
        tokens: Sequence[int] | None = None,
        extra_key: int = 0,
        *,
        cache_salt: bytes | str | None = None,
    ) -> PagedKVCache:
        """A new empty sequence, or with ``tokens`` one that starts with their longest cached
        prefix under ``cache_salt`` and ``extra_key`` (``cache.committed_len`` tokens already
        hold K/V; run the rest as a step and ``commit(keep, tokens=...)`` or
        ``commit_fed(fed)`` it so its full blocks become cached)."""
        return PagedKVCache(self, tokens=tokens, extra_key=extra_key, cache_salt=cache_salt)

    def reorder(self, beams: Sequence[PagedKVCache], parents: Sequence[int]) -> None:
        """Beam ``beams[i]`` continues ``beams[parents[i]]`` (shared blocks, no tensor copy)."""
        self.manager.reorder([b.seq for b in beams], [int(p) for p in parents])
        lens = [beams[int(p)]._len for p in parents]
        for b, n in zip(beams, lens, strict=True):
            b._len = n
            b._committed_slots = None

    def begin_decode(self, caches: Sequence[PagedKVCache]) -> PagedDecodeStep:
        """Start a one-token step on every cache (sequences of this pool, none inside a
        step) with one Rust call: a shared partial tail is copied first (copy-on-write), so
        beams that share their prefix blocks each write their own tail. The step stays
        pending until :meth:`commit_decode` or :meth:`rollback_decode`."""
        if not caches:
            raise VerifyError("begin_decode needs at least one sequence")
        for c in caches:
            if c.pool is not self:
                raise VerifyError(f"sequence {c.seq} belongs to another pool")
            if c._pending:
                raise VerifyError(f"sequence {c.seq} is inside a step; commit or roll back first")
        seqs = np.fromiter((c.seq for c in caches), dtype=np.uint64, count=len(caches))
        res = self.manager.reserve_tree_batch(seqs, np.ones(len(caches), dtype=np.int64))
        self.copy_blocks(res.cow)
        lens = [c._len + 1 for c in caches]
        table = np.zeros((len(caches), max(lens)), dtype=np.int64)
        for i, (c, n) in enumerate(zip(caches, lens, strict=True)):
            c._pending = 1
            c._step_slots = None
            table[i, :n] = self.manager.slot_mapping(c.seq, 0, n)
        ends = np.asarray(lens, dtype=np.int64)
        mask = np.arange(table.shape[1])[None, :] < ends[:, None]
        return PagedDecodeStep(
            new_slots=self._index(table[np.arange(len(caches)), ends - 1]),
            table=self._index(table),
            mask=torch.from_numpy(mask).to(self.device),
        )

    def commit_decode(self, caches: Sequence[PagedKVCache]) -> None:
        """Keep every cache's one token of a :meth:`begin_decode` step (one Rust call; a
        single kept token never moves, so there is no tensor work)."""
        n = len(caches)
        seqs = np.fromiter((c.seq for c in caches), dtype=np.uint64, count=n)
        self.manager.commit_batch(
            seqs, np.zeros(n, dtype=np.int64), np.arange(n + 1, dtype=np.int64)
        )
        for c in caches:
            c._len += 1
            c._pending = 0
            c._committed_slots = None

    def rollback_decode(self, caches: Sequence[PagedKVCache]) -> None:
        """Drop the pending token of every cache of a :meth:`begin_decode` step."""
        for c in caches:
            if c._pending:
                c.rollback()


class PagedKVCache(StepCache):
    """One sequence of a :class:`PagedKVPool`, following the ``KVCache`` protocol."""

    def __init__(
        self,
        pool: PagedKVPool,
        *,
        tokens: Sequence[int] | None = None,
        extra_key: int = 0,
        cache_salt: bytes | str | None = None,
        _seq: int | None = None,
    ) -> None:
        self.pool = pool
        self.num_layers, self.num_kv_heads = pool.num_layers, pool.num_kv_heads
        self.head_dim = pool.head_dim
        self._pending = 0
        self._committed_slots: torch.Tensor | None = None
        self._step_slots: torch.Tensor | None = None
        if _seq is not None:  # fork: the manager already holds the sequence
            self.seq = _seq
            self._len = pool.manager.seq_len(_seq).committed
            return
        self.seq = pool._new_id()
        if tokens is None:
            pool.manager.allocate(self.seq, 0)
            self._len = 0
        else:
            toks = _as_i64(tokens)
            self._len = pool.manager.allocate_cached_prefix(self.seq, toks, extra_key, cache_salt)

    @classmethod
    def standalone(
        cls,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        max_len: int,
        *,
        block_size: int = 16,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ) -> PagedKVCache:
        """A pool just large enough for one sequence of ``max_len`` (drop-in for
        ``DenseKVCache(num_layers, num_kv_heads, head_dim, max_len)``)."""
        blocks = -(-max_len // block_size) + 1  # +1: room for a copy-on-write
        pool = PagedKVPool(
            num_layers, num_kv_heads, head_dim, blocks, block_size, dtype=dtype, device=device
        )
        return cls(pool)

    # ---- KVCache protocol ------------------------------------------------------------------
    def begin(self, num_new: int) -> None:
        num_new = self._check_begin(num_new, None)
        if self._pending:
            self.rollback()  # as the dense cache: a new step replaces an unfinished one
        reservation = self.pool.manager.reserve_tree(self.seq, num_new)
        self.pool.copy_blocks(reservation.cow)
        allslots = self.pool.manager.slot_mapping(self.seq, 0, self._len + num_new)
        self._step_slots = self.pool._index(allslots)
        self._pending = num_new

    def append(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self._check_append(k, v)
        assert self._step_slots is not None
        new = self._step_slots[self._len :]
        ks, vs = self.pool.k_slots[layer], self.pool.v_slots[layer]
        ks[new] = k.transpose(0, 1).to(ks.dtype)
        vs[new] = v.transpose(0, 1).to(vs.dtype)
        # Gather the sequence's K/V by its block table: [T, H, D] -> [H, T, D].
        return ks[self._step_slots].transpose(0, 1), vs[self._step_slots].transpose(0, 1)

    def commit(
        self,
        keep: Sequence[int] | np.ndarray | torch.Tensor,
        tokens: Sequence[int] | np.ndarray | None = None,
    ) -> None:
        """As ``KVCache.commit``; ``tokens`` (the kept tokens' ids) let a prefix-caching pool
        register the blocks they fill. A commit without ids ends the sequence's prefix-cache
        registration: ids are never inferred (from the prompt given at creation, say), since
        a chain step keeping ``0..m-1`` of generated tokens looks exactly like a prefill."""
        idx = check_keep(keep, self._pending)
        m = len(idx)
        toks = None if tokens is None else _as_i64(tokens)
        moves = self.pool.manager.commit(self.seq, idx.numpy(), toks)
        self.pool.move_slots(moves.src, moves.dst)
        self._len += m
        self._pending = 0
        self._step_slots = None
        self._committed_slots = None

    def commit_fed(self, fed: torch.Tensor) -> None:
        """Keep every token of a causal step that fed ``fed``: exactly those ids, so their
        full blocks may enter the prefix cache."""
        self.commit(torch.arange(fed.numel()), tokens=_as_i64(fed))

    def commit_tree(self, keep: np.ndarray, tokens: np.ndarray) -> None:
        """Keep a tree step's root and accepted nodes, registering the full blocks they fill
        (their K/V was written by the step's forward)."""
        self.commit(keep, tokens=tokens)

    def rollback(self) -> None:
        self.pool.manager.rollback(self.seq)
        self._pending = 0
        self._step_slots = None

    def committed_kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self._committed_slots is None:
            slots = self.pool.manager.slot_mapping(self.seq, 0, self._len)
            self._committed_slots = self.pool._index(slots)
        s = self._committed_slots
        return (
            self.pool.k_slots[layer][s].transpose(0, 1),
            self.pool.v_slots[layer][s].transpose(0, 1),
        )

    def truncate(self, length: int) -> None:
        """Keep only the first ``length`` committed tokens (no step may be pending), e.g. to
        re-run a step from the same prefix (as ``DenseKVCache.truncate``)."""
        length = self._check_truncate(length)
        self.pool.manager.truncate(self.seq, length)
        self._len = length
        self._committed_slots = None

    # ---- sharing ---------------------------------------------------------------------------
    def fork(self) -> PagedKVCache:
        """A new sequence sharing every block of this one (no copy until one of them grows
        into a shared partial block)."""
        if self._pending:
            raise KVCacheError(f"sequence {self.seq} is inside a step; commit or roll back first")
        child = self.pool._new_id()
        self.pool.manager.fork(self.seq, child)
        return PagedKVCache(self.pool, _seq=child)

    def block_table(self) -> np.ndarray:
        return self.pool.manager.block_table(self.seq)

    def free(self) -> None:
        """Release this sequence's blocks (cached ones stay hittable until evicted)."""
        self.pool.manager.free(self.seq)
        self._len = self._pending = 0
        self._committed_slots = self._step_slots = None
