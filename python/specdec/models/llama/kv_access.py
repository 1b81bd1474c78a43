"""Where the torch layer loop (:meth:`~specdec.models.llama.LlamaModel.forward` and its
batched siblings) writes a step's K/V and what its attention reads, one strategy per way
the rows' caches are laid out:

* :class:`OneCache`: one sequence's :class:`~specdec.protocols.KVCache` (any implementation),
  through its own ``append``;
* :class:`CacheRows`: R sequences with a cache each (any implementations, mixed), each row
  attending over its own cache's ``append`` result (a view for a dense cache): no padded
  copy of the prefixes, and no attention work on padding;
* :class:`PoolRows`: R sequences of one :class:`~specdec.cache.PagedKVPool`: per layer one
  scatter of the new K/V by slot and one gather by the rows' slot table.

A strategy's :meth:`~KVAccess.write_and_read` takes the layer's new K/V ``[R * T, Hkv, D]``
(token-major, the rows one after another, as the projection makes them) and returns the
attention calls to make, each a :class:`KVRead`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

import torch
from torch import Tensor

from ...cache.paged import PagedDecodeStep, PagedKVCache, PagedKVPool
from ...protocols import KVCache

__all__ = ["KVRead", "KVAccess", "OneCache", "CacheRows", "PoolRows", "batch_access"]


class KVRead(NamedTuple):
    """One attention call: queries ``q[rows]`` (None: all rows) over keys / values ``[B,
    Hkv, S, D]`` under ``mask`` (``[B, T, S]`` or ``[T, S]`` bool, True = visible; None:
    all visible)."""

    rows: slice | None
    k: Tensor
    v: Tensor
    mask: Tensor | None


class KVAccess(Protocol):
    def write_and_read(self, layer: int, k: Tensor, v: Tensor) -> Sequence[KVRead]:
        """Store layer ``layer``'s new K/V ``[R * T, Hkv, D]``; return what attention
        reads."""
        ...


class OneCache:
    """One sequence (R = 1): the cache appends and returns its ``[Hkv, L + T, D]``."""

    def __init__(self, cache: KVCache, mask: Tensor | None) -> None:
        self.cache, self.mask = cache, mask

    def write_and_read(self, layer: int, k: Tensor, v: Tensor) -> Sequence[KVRead]:
        k_all, v_all = self.cache.append(layer, k.transpose(0, 1), v.transpose(0, 1))
        return (KVRead(None, k_all[None], v_all[None], self.mask),)


def _visible(mask: Tensor, lens: Sequence[int], p_max: int) -> Tensor:
    """``mask`` ``[R, T, P_max + T]`` with each row's padding columns (between its prefix
    and the step) hidden, whatever the caller put there."""
    cols = torch.arange(mask.shape[-1], device=mask.device)
    n = torch.tensor(list(lens), device=mask.device)
    real = (cols[None] < n[:, None]) | (cols[None] >= p_max)
    return mask & real[:, None]


class CacheRows:
    """R sequences, a cache each: row r attends over its own cache's ``append`` result
    ``[Hkv, n_r + T, D]`` (one attention call per row) under its mask's real columns
    (prefix, then the step), taken once per step."""

    def __init__(self, caches: Sequence[KVCache], mask: Tensor, p_max: int) -> None:
        self.caches, self.t = caches, mask.shape[1]
        self.masks: list[Tensor | None] = []
        for r, cache in enumerate(caches):
            n = cache.committed_len
            m = torch.cat((mask[r, :, :n], mask[r, :, p_max:]), dim=-1)
            self.masks.append(None if bool(m.all()) else m[None])

    def write_and_read(self, layer: int, k: Tensor, v: Tensor) -> Sequence[KVRead]:
        out, t = [], self.t
        for r, cache in enumerate(self.caches):
            kr, vr = k[r * t : (r + 1) * t], v[r * t : (r + 1) * t]
            k_all, v_all = cache.append(layer, kr.transpose(0, 1), vr.transpose(0, 1))
            out.append(KVRead(slice(r, r + 1), k_all[None], v_all[None], self.masks[r]))
        return out


class PoolRows:
    """R sequences of one pool: the new K/V go to ``new_slots`` (``[R * T]``, row-major) and
    every row reads ``table`` (``[R, S]`` slots; the mask hides its padding) with one
    gather per layer, whatever R is (beams sharing a prefix block read the same slots)."""

    def __init__(
        self, pool: PagedKVPool, new_slots: Tensor, table: Tensor, mask: Tensor | None
    ) -> None:
        self.k_slots, self.v_slots = pool.k_slots, pool.v_slots
        self.new, self.flat, self.rows = new_slots, table.reshape(-1), table.shape[0]
        self.mask = mask

    @classmethod
    def decode(cls, pool: PagedKVPool, step: PagedDecodeStep) -> PoolRows:
        """A :meth:`~specdec.cache.PagedKVPool.begin_decode` step (one token a row)."""
        mask: Tensor | None = step.mask[:, None]  # [R, 1, S]
        if bool(step.mask.all()):
            mask = None  # every row sees its whole table (equal lengths): no mask needed
        return cls(pool, step.new_slots, step.table, mask)

    def write_and_read(self, layer: int, k: Tensor, v: Tensor) -> Sequence[KVRead]:
        hkv, hd = k.shape[1:]
        ks, vs = self.k_slots[layer], self.v_slots[layer]
        ks[self.new] = k.to(ks.dtype)
        vs[self.new] = v.to(vs.dtype)
        # [R * S, Hkv, D] -> [R, Hkv, S, D] (index_select: one flat gather, cheaper than
        # advanced indexing).
        kk = ks.index_select(0, self.flat).view(self.rows, -1, hkv, hd).transpose(1, 2)
        vv = vs.index_select(0, self.flat).view(self.rows, -1, hkv, hd).transpose(1, 2)
        if kk.dtype != k.dtype:
            kk, vv = kk.to(k.dtype), vv.to(k.dtype)
        return (KVRead(None, kk, vv, self.mask),)


def _pool_table(caches: Sequence[PagedKVCache], p_max: int) -> Tensor:
    """``[R, P_max + T]`` slots of begun steps in ``forward_batch``'s layout: row r's
    prefix, slot 0 up to ``p_max`` (padding), then its step's tokens."""
    rows = []
    for c in caches:
        s, n = c._step_slots, c.committed_len
        assert s is not None  # set by begin()
        rows.append(torch.cat((s[:n], s.new_zeros(p_max - n), s[n:])))
    return torch.stack(rows)


def batch_access(
    caches: Sequence[KVCache], mask: Tensor, p_max: int, heads: tuple[int, int, int]
) -> KVAccess:
    """The strategy of a ``forward_batch`` step (caches begun, ``mask`` ``[R, T, P_max +
    T]``): :class:`PoolRows` for sequences of one pool laid out as the model's ``heads``
    (layers, kv heads, head dim), else :class:`CacheRows` (whose ``append`` checks the
    layout)."""
    first = caches[0]
    if isinstance(first, PagedKVCache) and all(
        isinstance(c, PagedKVCache) and c.pool is first.pool for c in caches
    ):
        pool = first.pool
        if (pool.num_layers, pool.num_kv_heads, pool.head_dim) == heads:
            paged = [c for c in caches if isinstance(c, PagedKVCache)]
            table = _pool_table(paged, p_max)
            lens = [c.committed_len for c in paged]
            new_slots = table[:, p_max:].reshape(-1)
            return PoolRows(pool, new_slots, table, _visible(mask, lens, p_max))
    return CacheRows(caches, mask, p_max)
