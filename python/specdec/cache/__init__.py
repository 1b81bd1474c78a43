"""KV caches: the :class:`~specdec.protocols.KVCache` protocol and its implementations, one
file each: dense buffers (:mod:`.dense`), paged blocks with Rust bookkeeping (:mod:`.paged`)
and a ``transformers`` ``DynamicCache`` adapter (:mod:`.hf`)."""

from __future__ import annotations

from .._core import BlockManager
from ..protocols import KVCache
from .base import StepCache, check_keep
from .dense import DenseKVCache
from .hf import HFKVCache
from .paged import PagedKVCache, PagedKVPool

__all__ = [
    "KVCache",
    "DenseKVCache",
    "PagedKVPool",
    "PagedKVCache",
    "HFKVCache",
    "BlockManager",
    "StepCache",
    "check_keep",
]
