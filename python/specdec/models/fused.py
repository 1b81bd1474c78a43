"""Where a fused step (:class:`specdec._core.LlamaStack`) reads and writes a step's K/V: the
caches' own tensors as numpy views (no copy), per row the slots it attends over and the
slots its new tokens go to.

One mechanism for every cache: a :class:`~specdec.cache.DenseKVCache` is a buffer
``[layers, kv_heads, max_len, head_dim]`` of its own (slot = position), a
:class:`~specdec.cache.PagedKVCache` a row of its pool's shared ``[layers, slots, kv_heads,
head_dim]`` buffer (slots from its block table). Other caches, dtypes and devices: ``None``
(the caller runs the torch path).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from .._core import LlamaStack
from ..cache.dense import DenseKVCache
from ..cache.paged import PagedKVCache, PagedKVPool
from ..protocols import HiddenCapture, KVCache
from .quant import Numeric

__all__ = ["StepKV", "StepOut", "batch_kv", "pool_kv", "single_kv", "run_step"]

_KV = tuple[np.ndarray, np.ndarray, bool]

# A step holds the K/V arrays of its caches as mutable slices while it runs (the GIL
# released): two steps at once on sequences of one pool would alias them. Steps wait for
# each other instead, as calls on every shared object do (the kernel's thread pool runs one
# product at a time anyway).
_STEP_LOCK = threading.Lock()


@dataclass
class StepKV:
    """A step's K/V addressing (see :meth:`specdec._core.LlamaStack.step`)."""

    kv: list[_KV]
    buffers: np.ndarray  # [R] int64
    slots: np.ndarray  # [R, S] int64
    new_slots: np.ndarray  # [R, T] int64


def _f32_cpu(t: Tensor) -> bool:
    return t.dtype == torch.float32 and t.device.type == "cpu"


def _dense(cache: DenseKVCache) -> _KV | None:
    if not (_f32_cpu(cache.k) and cache.k.is_contiguous() and cache.v.is_contiguous()):
        return None
    return cache.k.numpy(), cache.v.numpy(), False


def pool_kv(pool: PagedKVPool) -> _KV | None:
    """A pool's slot-indexed K/V as one buffer."""
    k, v = pool.k_slots, pool.v_slots
    if not (_f32_cpu(k) and k.is_contiguous() and v.is_contiguous()):
        return None
    return k.numpy(), v.numpy(), True


def _step_slots(cache: PagedKVCache) -> np.ndarray:
    """The slots of a begun step's sequence: its committed prefix, then the new tokens."""
    slots = cache._step_slots
    if slots is None:  # begun through begin_decode
        n = cache._len + cache._pending
        return np.asarray(cache.pool.manager.slot_mapping(cache.seq, 0, n), dtype=np.int64)
    return slots.numpy()


def single_kv(cache: KVCache, t_new: int) -> StepKV | None:
    """One sequence's begun step of ``t_new`` tokens."""
    one = np.zeros(1, dtype=np.int64)
    if isinstance(cache, DenseKVCache):
        kv = _dense(cache)
        if kv is None:
            return None
        n = cache.committed_len
        slots = np.arange(n + t_new, dtype=np.int64)[None]
        return StepKV([kv], one, slots, slots[:, n:])
    if isinstance(cache, PagedKVCache):
        kv = pool_kv(cache.pool)
        if kv is None:
            return None
        slots = _step_slots(cache)[None]
        return StepKV([kv], one, slots, slots[:, cache.committed_len :])
    return None


def batch_kv(caches: Sequence[KVCache], t_new: int, p_max: int) -> StepKV | None:
    """Begun steps of ``t_new`` tokens on R sequences (all dense, or all of one pool), in
    ``forward_batch``'s column layout: row r's prefix in columns ``[0, committed_r)``, the
    step's tokens in ``[p_max, p_max + T)``; the columns between (the mask hides them) read
    slot 0."""
    r = len(caches)
    lens = np.fromiter((c.committed_len for c in caches), dtype=np.int64, count=r)
    cols = np.arange(p_max + t_new, dtype=np.int64)[None]
    new = lens[:, None] + np.arange(t_new, dtype=np.int64)[None]
    if all(isinstance(c, DenseKVCache) for c in caches):
        kvs = [_dense(c) for c in caches if isinstance(c, DenseKVCache)]
        if any(kv is None for kv in kvs):
            return None
        slots = np.where(cols < lens[:, None], cols, 0)
        slots[:, p_max:] = new
        buffers = np.arange(r, dtype=np.int64)
        return StepKV([kv for kv in kvs if kv is not None], buffers, slots, new)
    paged = [c for c in caches if isinstance(c, PagedKVCache)]
    if len(paged) != r or any(c.pool is not paged[0].pool for c in paged):
        return None
    pkv = pool_kv(paged[0].pool)
    if pkv is None:
        return None
    slots = np.zeros((r, p_max + t_new), dtype=np.int64)
    new_slots = np.empty((r, t_new), dtype=np.int64)
    for i, c in enumerate(paged):
        s, n = _step_slots(c), int(lens[i])
        slots[i, :n] = s[:n]
        slots[i, p_max:] = new_slots[i] = s[n:]
    return StepKV([pkv], np.zeros(r, dtype=np.int64), slots, new_slots)


@dataclass
class StepOut:
    """What :func:`run_step` wrote: ``logits`` ``[R * T, vocab]`` (``last``: ``[R, vocab]``),
    the captured hidden states ``[R * T, width]`` (None without a capture) and each logits
    row's argmax (None unless asked for)."""

    logits: Tensor
    states: Tensor | None
    argmax: Tensor | None


def run_step(
    stack: LlamaStack,
    embed: Tensor,
    ids: Tensor,
    pos: Tensor,
    kv: StepKV,
    mask: Tensor | None,
    *,
    last: bool,
    hidden: HiddenCapture | None,
    vocab: int,
    numeric: Numeric = "exact",
    argmax: bool = False,
    allowed: np.ndarray | None = None,
) -> StepOut:
    """The step through ``stack`` (see :class:`StepOut`). ``mask``: ``[R, T, S]`` bool, or
    None (causal); ``argmax``: the rows' argmax too, scanned on both cores; ``allowed``: a
    token bitmask row per logits row, the logits masked by it (see
    :class:`~specdec.protocols.LogitsMask`)."""
    r, t = kv.new_slots.shape
    width = embed.shape[1]
    table = embed.detach()
    flat_ids = ids.reshape(-1).long()
    # The stack gathers the rows itself (a torch gather costs more than the copy it makes);
    # a strided table (never a loaded model's) is gathered here instead.
    gather = table.is_contiguous()
    x = None if gather else table.index_select(0, flat_ids).numpy()
    p = pos.reshape(-1)
    positions = (p if p.dtype == torch.int64 else p.long()).numpy()
    logits = torch.empty(r if last else r * t, vocab, dtype=torch.float32)
    layers: tuple[int, ...] = ()
    final = False
    states = None
    if hidden is not None and hidden.active:
        layers, final = tuple(int(i) for i in hidden.layers), bool(hidden.final)
        states = torch.empty(r * t, (len(layers) + final) * width, dtype=torch.float32)
    top = torch.empty(logits.shape[0], dtype=torch.int64) if argmax else None
    with _STEP_LOCK:
        stack.step(
            x,
            positions,
            kv.kv,
            kv.buffers,
            kv.slots,
            kv.new_slots,
            None if mask is None else mask.numpy(),
            logits.numpy(),
            last,
            layers,
            final,
            None if states is None else states.numpy(),
            numeric=numeric,
            argmax=None if top is None else top.numpy(),
            ids=flat_ids.numpy() if gather else None,
            embed=table.numpy() if gather else None,
            allowed=allowed,
        )
    return StepOut(logits, states, top)
