"""Bitmask helpers for numpy arrays (xgrammar / llguidance names)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .._arrays import as_list, check_int
from ..errors import GrammarError, SpecdecTypeError
from .bitmask import check_rows_allow_some, get_bitmask_shape

__all__ = [
    "allocate_token_bitmask",
    "apply_token_bitmask_inplace",
    "get_bitmask_shape",
    "reset_token_bitmask",
    "unpack_bitmask",
]


def allocate_token_bitmask(batch_size: int, vocab_size: int) -> np.ndarray:
    """An int32 ``[batch_size, ceil(vocab_size / 32)]`` buffer with every token allowed (all
    bits set, as xgrammar allocates): a row no constraint fills masks nothing."""
    return np.full(get_bitmask_shape(batch_size, vocab_size), -1, dtype=np.int32)


def reset_token_bitmask(bitmask: np.ndarray) -> None:
    """Allow every token again in every row."""
    if not isinstance(bitmask, np.ndarray) or bitmask.dtype != np.int32:
        raise SpecdecTypeError("bitmask must be an int32 numpy array")
    bitmask.fill(-1)


def unpack_bitmask(bitmask: np.ndarray, vocab_size: int) -> np.ndarray:
    """bool ``[rows, vocab_size]``: True where the token is allowed (ids past the bitmask's
    ``32 * words`` are disallowed)."""
    bits = np.unpackbits(
        np.ascontiguousarray(bitmask).view(np.uint8), axis=-1, bitorder="little"
    ).astype(bool)
    if bits.shape[-1] < vocab_size:
        pad = np.zeros((*bits.shape[:-1], vocab_size - bits.shape[-1]), dtype=bool)
        bits = np.concatenate([bits, pad], axis=-1)
    return bits[..., :vocab_size]


def apply_token_bitmask_inplace(
    logits: np.ndarray,
    bitmask: np.ndarray,
    *,
    vocab_size: int | None = None,
    indices: Sequence[int] | None = None,
) -> None:
    """Set disallowed entries of float ``logits`` ``[B, V]`` (or ``[V]``) to ``-inf``.
    ``bitmask`` is int32 ``[B, W]`` (or ``[len(indices), W]`` with ``indices`` naming the
    logits rows to mask); ``vocab_size`` limits the columns considered (default ``V``).
    Raises :class:`~specdec.NoAllowedTokens` (logits untouched) if a row allows nothing."""
    if not isinstance(logits, np.ndarray) or not np.issubdtype(logits.dtype, np.floating):
        raise SpecdecTypeError("logits must be a floating-point numpy array")
    if not isinstance(bitmask, np.ndarray) or bitmask.dtype != np.int32:
        raise SpecdecTypeError("bitmask must be an int32 numpy array")
    if not logits.flags.writeable:
        raise GrammarError("logits are read-only")
    lg = logits[None] if logits.ndim == 1 else logits
    bm = bitmask[None] if bitmask.ndim == 1 else bitmask
    if lg.ndim != 2 or bm.ndim != 2:
        raise GrammarError(
            f"logits {logits.shape} and bitmask {bitmask.shape} must be [B, V] and [B, W]"
        )
    rows: Any = slice(None)
    if indices is not None:
        rows = [check_int(i, "index", 0, GrammarError) for i in as_list(indices, "indices")]
        if max(rows, default=-1) >= lg.shape[0]:
            raise GrammarError(f"indices {rows} outside logits of {lg.shape[0]} rows")
    v = lg.shape[-1] if vocab_size is None else check_int(vocab_size, "vocab_size", 1, GrammarError)
    target = lg[rows]
    if bm.shape[0] != target.shape[0] or v > lg.shape[-1]:
        raise GrammarError(
            f"logits {logits.shape} and bitmask {bitmask.shape} must be [B, V] and "
            "[B, ceil(V/32)] (or one bitmask row per index)"
        )
    allowed = unpack_bitmask(bm, v)
    check_rows_allow_some(np.asarray(allowed.any(axis=1)))
    masked = target[:, :v]
    masked[~allowed] = -np.inf
    lg[rows, :v] = masked
