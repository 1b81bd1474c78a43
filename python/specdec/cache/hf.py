"""The KV cache over a ``transformers`` ``DynamicCache`` (batch 1), so an unmodified
transformers model verifies trees with the same verifier: commit compacts every layer to the
accepted path."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..errors import VerifyError
from .base import StepCache, check_keep

__all__ = ["HFKVCache"]


class HFKVCache(StepCache):
    """One sequence's K/V held in a transformers ``DynamicCache`` (batch 1)."""

    def __init__(
        self, dynamic_cache: Any, num_layers: int, num_kv_heads: int, head_dim: int, max_len: int
    ) -> None:
        self.cache = dynamic_cache
        self.num_layers, self.num_kv_heads, self.head_dim = num_layers, num_kv_heads, head_dim
        self.max_len = max_len
        self._len = 0
        self._pending = 0

    def _layer(self, i: int) -> Any:
        return self.cache.layers[i]

    def begin(self, num_new: int) -> None:
        if self._pending:
            raise VerifyError("the previous step was neither committed nor rolled back")
        self._pending = self._check_begin(num_new, self.max_len)

    def append(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # transformers appends through DynamicCache.update during its own forward; this is
        # the same operation for callers that drive the protocol directly.
        self._check_append(k, v)
        ks, vs = self.cache.update(k[None], v[None], layer)
        return ks[0], vs[0]

    def _slice(self, keep: torch.Tensor | None) -> None:
        for i in range(self.num_layers):
            lay = self._layer(i)
            if (
                not getattr(lay, "is_initialized", True)
                or lay.keys is None
                or lay.keys.numel() == 0
            ):
                continue
            ks, vs = lay.keys, lay.values
            if keep is None:
                lay.keys, lay.values = ks[:, :, : self._len], vs[:, :, : self._len]
            else:
                idx = (keep + self._len).to(ks.device)
                lay.keys = torch.cat((ks[:, :, : self._len], ks[:, :, idx]), dim=2)
                lay.values = torch.cat((vs[:, :, : self._len], vs[:, :, idx]), dim=2)

    def commit(self, keep: Sequence[int] | np.ndarray | torch.Tensor) -> None:
        idx = check_keep(keep, self._pending)
        self._slice(idx)
        self._len += len(idx)
        self._pending = 0

    def rollback(self) -> None:
        self._slice(None)
        self._pending = 0

    def committed_kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        lay = self._layer(layer)
        if getattr(lay, "keys", None) is None or lay.keys.numel() == 0:
            empty = torch.empty(self.num_kv_heads, 0, self.head_dim)
            return empty, empty
        return lay.keys[0, :, : self._len], lay.values[0, :, : self._len]
