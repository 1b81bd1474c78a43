"""Bitmask helpers for torch tensors (xgrammar / llguidance names). The logits may live on any
device; the mask is expanded there."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .. import _core
from .._arrays import as_list, check_int
from ..errors import GrammarError, SpecdecTypeError
from .bitmask import check_rows_allow_some, get_bitmask_shape

__all__ = [
    "allocate_token_bitmask",
    "apply_token_bitmask_inplace",
    "get_bitmask_shape",
    "reset_token_bitmask",
]


def allocate_token_bitmask(batch_size: int, vocab_size: int) -> torch.Tensor:
    """A CPU int32 ``[batch_size, ceil(vocab_size / 32)]`` tensor with every token allowed
    (all bits set, as xgrammar allocates); matchers fill it in place."""
    return torch.full(get_bitmask_shape(batch_size, vocab_size), -1, dtype=torch.int32)


def reset_token_bitmask(bitmask: torch.Tensor) -> None:
    """Allow every token again in every row."""
    if not isinstance(bitmask, torch.Tensor) or bitmask.dtype != torch.int32:
        raise SpecdecTypeError("bitmask must be an int32 torch tensor")
    bitmask.fill_(-1)


def apply_token_bitmask_inplace(
    logits: torch.Tensor,
    bitmask: torch.Tensor | np.ndarray,
    *,
    vocab_size: int | None = None,
    indices: Sequence[int] | None = None,
) -> None:
    """Set disallowed logits to ``-inf`` in place. ``logits`` ``[B, V]`` (or ``[V]``) on any
    device; ``bitmask`` int32 ``[B, W]`` (numpy or torch, any device), or one row per entry of
    ``indices`` (the logits rows to mask). Ids at or past ``32 * W`` are disallowed;
    ``vocab_size`` limits the columns considered (default ``V``). Raises
    :class:`~specdec.NoAllowedTokens` (logits untouched) if a row allows no token."""
    if isinstance(bitmask, np.ndarray) and bitmask.dtype == np.int32:
        # torch warns on read-only numpy memory even when only reading it, and cannot view
        # negative strides: copy those cases.
        ok = bitmask.flags.writeable and min(bitmask.strides, default=0) >= 0
        bitmask = torch.from_numpy(bitmask if ok else bitmask.copy())
    if not isinstance(bitmask, torch.Tensor) or bitmask.dtype != torch.int32:
        raise SpecdecTypeError("bitmask must be an int32 numpy array or torch tensor")
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point():
        raise SpecdecTypeError("logits must be a floating-point torch tensor")
    if logits.device.type == "meta" or bitmask.device.type == "meta":
        raise SpecdecTypeError("logits and bitmask on the meta device hold no values")
    lg = logits.unsqueeze(0) if logits.dim() == 1 else logits
    bm = bitmask.unsqueeze(0) if bitmask.dim() == 1 else bitmask
    rows: Any = (
        slice(None)
        if indices is None
        else [check_int(i, "index", 0) for i in as_list(indices, "indices")]
    )
    if lg.dim() != 2 or bm.dim() != 2:
        raise GrammarError(
            f"logits {tuple(logits.shape)} and bitmask {tuple(bitmask.shape)} must be [B, V] "
            "and [B, ceil(V/32)]"
        )
    v = lg.shape[-1] if vocab_size is None else check_int(vocab_size, "vocab_size", 1)
    if v > lg.shape[-1]:
        raise GrammarError(f"vocab_size {v} is over the logits' {lg.shape[-1]} columns")
    n_rows = lg.shape[0] if indices is None else len(rows)
    if indices is not None and max(rows, default=-1) >= lg.shape[0]:
        raise GrammarError(f"indices {rows} outside logits of {lg.shape[0]} rows")
    if bm.shape[0] != n_rows:
        raise GrammarError(f"bitmask has {bm.shape[0]} rows for {n_rows} logits rows")
    if lg.device.type == "cpu" and bm.device.type == "cpu":
        _apply_cpu(lg, bm, v, None if indices is None else rows)
        return
    bm = bm.to(lg.device, non_blocking=True)
    shifts = torch.arange(32, device=lg.device, dtype=torch.int32)
    allowed = ((bm.unsqueeze(-1) >> shifts) & 1).bool().flatten(1)
    if allowed.shape[1] < v:
        pad = torch.zeros(
            (allowed.shape[0], v - allowed.shape[1]), dtype=torch.bool, device=lg.device
        )
        allowed = torch.cat([allowed, pad], dim=1)
    allowed = allowed[:, :v]
    check_rows_allow_some(allowed.any(dim=1).cpu().numpy())
    try:
        if indices is None:
            lg[:, :v].masked_fill_(~allowed, float("-inf"))
        else:
            idx = torch.tensor(rows, dtype=torch.long, device=lg.device)
            lg[idx, :v] = lg[idx, :v].masked_fill(~allowed, float("-inf"))
    except RuntimeError as e:  # autograd refuses in-place writes to a leaf that requires grad
        raise SpecdecTypeError(f"logits cannot be masked in place: {e}") from None


_BYTE_BOUNDS: np.ndarray | None = None


def _byte_bounds() -> np.ndarray:
    """float32 ``[256, 8]``: for each bitmask byte, per bit, the bound a logit is clamped to
    (+inf: allowed, unchanged; -inf: disallowed)."""
    global _BYTE_BOUNDS
    if _BYTE_BOUNDS is None:
        byte = np.arange(256, dtype=np.uint8)[:, None]
        bits = np.unpackbits(byte, axis=1, bitorder="little").astype(bool)
        _BYTE_BOUNDS = np.where(bits, np.float32(np.inf), np.float32(-np.inf))
    return _BYTE_BOUNDS


def _apply_cpu(lg: torch.Tensor, bm: torch.Tensor, v: int, rows: list[int] | None) -> None:
    """:func:`apply_token_bitmask_inplace` on the CPU: each bitmask byte looked up as eight
    bounds (+inf allowed, -inf not) and the logits clamped to them, branch-free; a masked
    fill or torch shifts cost several times more at vocabulary widths."""
    words = np.ascontiguousarray(bm.numpy(), dtype="<i4")  # little-endian: bit t%32 -> byte
    n = min(v, 32 * words.shape[1])
    full, rem = divmod(n, 32)
    allowed_any = (words[:, :full] != 0).any(axis=1)
    if rem:
        allowed_any |= (words[:, full] & np.int32((1 << rem) - 1)) != 0
    check_rows_allow_some(allowed_any)
    if lg.dtype == torch.float32 and lg.is_contiguous() and not lg.requires_grad:
        # A word at a time in Rust: most words of a grammar's row are all clear or all set.
        _core.apply_token_bitmask_f32(lg.numpy(), words, v, rows)
        return
    bounds = np.take(_byte_bounds(), words.view(np.uint8), axis=0)
    bounds = bounds.reshape(len(words), 32 * words.shape[1])
    bound = torch.from_numpy(bounds)[:, :n].to(lg.dtype)
    try:
        if rows is None:
            lg[:, :n].clamp_max_(bound)
            lg[:, n:v] = float("-inf")
        else:
            for k, r in enumerate(rows):
                lg[r, :n].clamp_max_(bound[k])
                lg[r, n:v] = float("-inf")
    except RuntimeError as e:  # autograd refuses in-place writes to a leaf that requires grad
        raise SpecdecTypeError(f"logits cannot be masked in place: {e}") from None
