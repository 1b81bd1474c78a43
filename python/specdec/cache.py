"""The KV-cache protocol the models and the verifier use, and the dense implementation.

One cache object holds one sequence. A decode step feeds ``num_new`` tokens (the tree's root
plus its drafted nodes, or one token, or a prompt) in one forward:

    cache.begin(num_new)                    # reserve tentative room after the committed prefix
    k_all, v_all = cache.append(layer, k, v)  # per layer: store, get [committed + new] K/V
    cache.commit(keep)                      # keep these new tokens (indices into the step's
                                            # tokens, increasing), contiguous; drop the rest
    # or cache.rollback()                   # drop all of this step's tokens

The paged implementation (``specdec.kv.PagedKVCache``) follows the same protocol.

Who calls what: the target model's forward (``LlamaModel.forward``, ``HFTarget.__call__``)
calls ``begin(T)`` itself and ``append`` once per layer, and leaves the step pending; the
caller (``specdec.verify.Verifier``, the generate loops) then calls ``commit`` or
``rollback``. A forward that raises rolls its step back.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch

from .errors import VerifyError

__all__ = ["KVCache", "DenseKVCache"]


class KVCache(ABC):
    """Per-sequence K/V storage for every layer, with tentative slots for one step."""

    num_layers: int
    num_kv_heads: int
    head_dim: int

    @property
    @abstractmethod
    def committed_len(self) -> int:
        """Tokens committed so far (the next token's position)."""

    @property
    @abstractmethod
    def pending(self) -> int:
        """Tokens of the current step stored tentatively (0 outside a step)."""

    @abstractmethod
    def begin(self, num_new: int) -> None:
        """Start a step of ``num_new`` tokens (any earlier tentative tokens must be gone)."""

    @abstractmethod
    def append(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store this step's ``[kv_heads, num_new, head_dim]`` K/V for ``layer`` and return the
        layer's keys and values ``[kv_heads, committed_len + num_new, head_dim]``: the
        committed prefix first, then this step's tokens in order."""

    @abstractmethod
    def commit(self, keep: Sequence[int] | torch.Tensor) -> None:
        """Keep the step's tokens at indices ``keep`` (strictly increasing) as committed,
        contiguous after the prefix, and release every other tentative token."""

    @abstractmethod
    def rollback(self) -> None:
        """Release every tentative token of the current step."""

    @abstractmethod
    def committed_kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The committed ``[kv_heads, committed_len, head_dim]`` K/V of ``layer``."""


def check_keep(keep: Sequence[int] | torch.Tensor, pending: int) -> torch.Tensor:
    """``keep`` as an int64 CPU tensor, checked: strictly increasing, within the step."""
    idx = torch.as_tensor(keep, dtype=torch.long).reshape(-1).cpu()
    if len(idx) and (int(idx[0]) < 0 or int(idx[-1]) >= pending):
        raise VerifyError(f"commit indices {idx.tolist()} outside this step's {pending} tokens")
    if len(idx) > 1 and not bool((idx[1:] > idx[:-1]).all()):
        raise VerifyError(f"commit indices must be strictly increasing, got {idx.tolist()}")
    return idx


class DenseKVCache(KVCache):
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

    @property
    def committed_len(self) -> int:
        return self._len

    @property
    def pending(self) -> int:
        return self._pending

    def begin(self, num_new: int) -> None:
        if num_new <= 0:
            raise VerifyError(f"a step needs at least one token, got {num_new}")
        if self._len + num_new > self.max_len:
            raise VerifyError(
                f"cache holds {self.max_len} tokens: {self._len} committed + {num_new} new "
                "do not fit"
            )
        self._pending = num_new

    def append(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n = self._pending
        expect = (self.num_kv_heads, n, self.head_dim)
        if tuple(k.shape) != expect or tuple(v.shape) != expect:
            raise VerifyError(f"append expects K/V of shape {expect}, got {tuple(k.shape)}")
        end = self._len + n
        self.k[layer, :, self._len : end] = k
        self.v[layer, :, self._len : end] = v
        return self.k[layer, :, :end], self.v[layer, :, :end]

    def commit(self, keep: Sequence[int] | torch.Tensor) -> None:
        idx = check_keep(keep, self._pending)
        m = len(idx)
        src = (idx + self._len).to(self.k.device)
        # Advanced indexing gathers into a new tensor first, so overlapping moves are safe.
        self.k[:, :, self._len : self._len + m] = self.k[:, :, src]
        self.v[:, :, self._len : self._len + m] = self.v[:, :, src]
        self._len += m
        self._pending = 0

    def rollback(self) -> None:
        self._pending = 0

    def committed_kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[layer, :, : self._len], self.v[layer, :, : self._len]

    def truncate(self, length: int) -> None:
        """Keep only the first ``length`` committed tokens (no step may be pending), e.g. to
        re-run a step from the same prefix."""
        if self._pending:
            raise VerifyError("truncate during a step: commit or roll it back first")
        if not 0 <= length <= self._len:
            raise VerifyError(f"truncate to {length}: only {self._len} tokens are committed")
        self._len = length
