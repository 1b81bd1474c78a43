"""What every KV cache implementation shares: the step counters, the argument checks of
``begin`` / ``append`` / ``truncate`` and the commit-index check."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from .._arrays import check_int
from ..errors import SpecdecTypeError, VerifyError
from ..protocols import KVCache

__all__ = ["StepCache", "check_keep"]


def check_keep(keep: Sequence[int] | np.ndarray | torch.Tensor, pending: int) -> torch.Tensor:
    """``keep`` as an int64 CPU tensor, checked: strictly increasing, within the step."""
    # Checked in numpy: a step commits a handful of indices, and torch's per-op dispatch
    # cost several times the work.
    try:
        if isinstance(keep, torch.Tensor):
            if keep.numel() and (
                keep.dtype.is_floating_point or keep.dtype.is_complex or keep.dtype == torch.bool
            ):
                raise SpecdecTypeError(f"commit indices must be integers, got {keep.dtype}")
            arr = keep.detach().cpu().numpy()
        else:
            arr = np.asarray(keep)
    except (TypeError, ValueError, RuntimeError) as e:
        raise SpecdecTypeError(f"commit indices must be integers: {e}") from None
    if arr.size and arr.dtype.kind not in "iu":
        raise SpecdecTypeError(f"commit indices must be integers, got {arr.dtype}")
    a = arr.astype(np.int64, copy=False).reshape(-1)
    if len(a) and (int(a[0]) < 0 or int(a[-1]) >= pending):
        raise VerifyError(f"commit indices {a.tolist()} outside this step's {pending} tokens")
    if len(a) > 1 and not bool((a[1:] > a[:-1]).all()):
        raise VerifyError(f"commit indices must be strictly increasing, got {a.tolist()}")
    return torch.from_numpy(np.ascontiguousarray(a))


class StepCache(KVCache):
    """A :class:`~specdec.protocols.KVCache` that counts committed (``_len``) and pending
    (``_pending``) tokens itself; subclasses store the K/V."""

    _len: int = 0
    _pending: int = 0

    @property
    def committed_len(self) -> int:
        return self._len

    @property
    def pending(self) -> int:
        return self._pending

    def _check_begin(self, num_new: int, max_len: int | None) -> int:
        """``num_new`` checked: at least one token, and room for it when ``max_len`` bounds
        the cache."""
        num_new = check_int(num_new, "num_new", None, VerifyError)
        if num_new <= 0:
            raise VerifyError(f"a step needs at least one token, got {num_new}")
        if max_len is not None and self._len + num_new > max_len:
            raise VerifyError(
                f"cache holds {max_len} tokens: {self._len} committed + {num_new} new do not fit"
            )
        return num_new

    def _check_append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """This step's K/V must be ``[kv_heads, pending, head_dim]`` tensors."""
        expect = (self.num_kv_heads, self._pending, self.head_dim)
        if not isinstance(k, torch.Tensor) or not isinstance(v, torch.Tensor):
            raise SpecdecTypeError("append takes K and V as torch tensors")
        if self._pending == 0 or tuple(k.shape) != expect or tuple(v.shape) != expect:
            raise VerifyError(f"append expects K/V of shape {expect}, got {tuple(k.shape)}")

    def _check_truncate(self, length: int) -> int:
        """A truncation to ``length`` committed tokens, outside a step."""
        length = check_int(length, "length", None, VerifyError)
        if self._pending:
            raise VerifyError("truncate during a step: commit or roll it back first")
        if not 0 <= length <= self._len:
            raise VerifyError(f"truncate to {length}: only {self._len} tokens are committed")
        return length
