"""The dense KV cache: contiguous per-layer buffers, one sequence each."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ..errors import VerifyError
from .base import StepCache, check_keep

_NUMPY = (torch.float32, torch.float64, torch.float16)  # dtypes with a numpy view

__all__ = ["DenseKVCache"]


class DenseKVCache(StepCache):
    """Contiguous per-layer buffers ``[kv_heads, max_len, head_dim]``; commit is one index
    copy per layer."""

    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        max_len: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ) -> None:
        if min(num_layers, num_kv_heads, head_dim, max_len) <= 0:
            raise VerifyError("cache dimensions must be positive")
        self.num_layers, self.num_kv_heads, self.head_dim = num_layers, num_kv_heads, head_dim
        self.max_len = max_len
        shape = (num_layers, num_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self._len = 0
        self._pending = 0

    def begin(self, num_new: int) -> None:
        self._pending = self._check_begin(num_new, self.max_len)

    def append(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self._check_append(k, v)
        n = self._pending
        end = self._len + n
        self.k[layer, :, self._len : end] = k
        self.v[layer, :, self._len : end] = v
        return self.k[layer, :, :end], self.v[layer, :, :end]

    def commit(self, keep: Sequence[int] | np.ndarray | torch.Tensor) -> None:
        idx = check_keep(keep, self._pending).numpy()
        m = len(idx)
        # Kept tokens already in place (a prefill, a one-token step, the root and a chain's
        # accepted head) need no copy: move only from the first one out of place.
        first = m if m == 0 or int(idx[-1]) == m - 1 else int(np.argmax(idx != np.arange(m)))
        if first < m:
            src = idx[first:] + self._len
            dst = slice(self._len + first, self._len + m)
            # Advanced indexing gathers into a new array first: overlapping moves are safe.
            # On the CPU through numpy views (a few torch ops cost several times the move).
            for buf in (self.k, self.v):
                if buf.device.type == "cpu" and buf.dtype in _NUMPY and not buf.requires_grad:
                    a = buf.numpy()
                    a[:, :, dst] = a[:, :, src]
                else:
                    buf[:, :, dst] = buf[:, :, torch.from_numpy(src).to(buf.device)]
        self._len += m
        self._pending = 0

    def rollback(self) -> None:
        self._pending = 0

    def committed_kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[layer, :, : self._len], self.v[layer, :, : self._len]

    def truncate(self, length: int) -> None:
        """Keep only the first ``length`` committed tokens (no step may be pending), e.g. to
        re-run a step from the same prefix."""
        self._len = self._check_truncate(length)
