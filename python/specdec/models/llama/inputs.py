"""What a step's inputs must satisfy (:func:`check_step_inputs`, shared by every target) and
the causal mask of a step without a tree."""

from __future__ import annotations

from typing import Any

import torch

from ...errors import SpecdecTypeError, VerifyError
from ...protocols import KVCache, Target
from ...verify.attention import check_bool_mask

__all__ = ["causal_mask", "check_step_inputs"]


def causal_mask(committed_len: int, num_new: int, device: torch.device | str) -> torch.Tensor:
    """``[T, L+T]`` bool: every new token sees the committed prefix and earlier new tokens."""
    m = torch.ones(num_new, committed_len + num_new, dtype=torch.bool, device=device)
    m[:, committed_len:] = torch.tril(m[:, committed_len:])
    return m


def _range(t: torch.Tensor) -> tuple[int, int]:
    """The smallest and largest value of a 1-D integer tensor: through numpy on the CPU
    (four torch reductions cost 40 us of a step's host work there, numpy's a tenth; over a
    step's few values, Python's own min and max cost less again)."""
    if t.is_cpu:
        a = t.numpy()
        if a.size <= 64:
            v = a.tolist()
            return min(v), max(v)
        return int(a.min()), int(a.max())
    return int(t.min()), int(t.max())


def check_step_inputs(
    target: Target, input_ids: Any, position_ids: Any, mask: Any, cache: Any
) -> None:
    """The checks every target runs before a step (clear errors instead of index faults)."""
    vocab_size, max_positions, device = target.vocab_size, target.max_positions, target.device
    # On the CPU, is_cpu says it without building a device object per tensor.
    cpu = device.type == "cpu"
    if not isinstance(cache, KVCache):
        raise SpecdecTypeError(f"cache must be a specdec.cache.KVCache, got {type(cache).__name__}")
    for name, t in (("input_ids", input_ids), ("position_ids", position_ids)):
        if not isinstance(t, torch.Tensor):
            raise SpecdecTypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in (torch.int64, torch.int32):
            raise SpecdecTypeError(f"{name} must be int64/int32, got {t.dtype}")
        if t.dim() != 1:
            raise VerifyError(f"{name} must be 1-D [T], got shape {tuple(t.shape)}")
        if (not t.is_cpu) if cpu else (t.device != device):
            raise VerifyError(f"{name} is on {t.device}, the model on {device}")
    t_new = input_ids.shape[0]
    if t_new == 0:
        raise VerifyError("a step needs at least one token (empty tree)")
    if position_ids.shape != input_ids.shape:
        raise VerifyError(
            f"position_ids {tuple(position_ids.shape)} must match input_ids "
            f"{tuple(input_ids.shape)}"
        )
    lo, hi = _range(input_ids)
    if lo < 0 or hi >= vocab_size:
        raise VerifyError(f"token ids must be in [0, {vocab_size}), got range [{lo}, {hi}]")
    pmin, pmax = _range(position_ids)
    if pmin < 0 or pmax >= max_positions:
        raise VerifyError(
            f"positions must be in [0, {max_positions}) (the model's maximum), got [{pmin}, {pmax}]"
        )
    if cache.pending:
        raise VerifyError("the cache has an uncommitted step: commit or roll it back first")
    if mask is not None:
        check_bool_mask(mask)
        want = (t_new, cache.committed_len + t_new)
        if tuple(mask.shape) != want:
            raise VerifyError(
                f"mask must be [T, committed + T] = {list(want)}, got {tuple(mask.shape)}"
            )
        if (not mask.is_cpu) if cpu else (mask.device != device):
            raise VerifyError(f"mask is on {mask.device}, the model on {device}")
