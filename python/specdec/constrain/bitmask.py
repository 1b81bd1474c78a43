"""The bitmask layout every constraint fills (the one xgrammar and llguidance use, so their
kernels work on it): int32 ``[rows, ceil(V / 32)]``; bit ``t % 32`` of word ``t // 32`` set =
token ``t`` allowed. Framework-specific helpers live beside this file (:mod:`.numpy`,
:mod:`.torch`); this module holds what they share."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._arrays import check_int, tensor_to_numpy
from ..errors import GrammarError, NoAllowedTokens, SpecdecTypeError

__all__ = ["get_bitmask_shape", "bitmask_rows", "check_rows_allow_some"]


def get_bitmask_shape(batch_size: int, vocab_size: int) -> tuple[int, int]:
    """``(batch_size, ceil(vocab_size / 32))``."""
    rows = check_int(batch_size, "batch_size", 0, GrammarError)
    vocab = check_int(vocab_size, "vocab_size", 1, GrammarError)
    return rows, (vocab + 31) // 32


def bitmask_rows(bitmask: Any) -> np.ndarray:
    """A writable numpy view (no copy) of an int32 ``[rows, words]`` buffer: a numpy array or
    a CPU torch tensor, C-contiguous. Anything else raises with what is wrong."""
    if type(bitmask) is np.ndarray:
        arr = bitmask
    elif hasattr(bitmask, "detach") and hasattr(bitmask, "device"):  # torch tensor
        if bitmask.device.type != "cpu":
            raise GrammarError(f"bitmask must be on the CPU to be filled, got {bitmask.device}")
        arr = tensor_to_numpy(bitmask, "bitmask")
    elif isinstance(bitmask, np.ndarray):
        arr = np.asarray(bitmask)
    else:
        raise SpecdecTypeError(
            f"bitmask must be a numpy array or a torch tensor, got {type(bitmask).__name__}"
        )
    if arr.dtype != np.int32:
        raise SpecdecTypeError(f"bitmask must be int32, got {arr.dtype}")
    if arr.ndim != 2:
        raise GrammarError(f"bitmask must be 2-D [rows, words], got shape {arr.shape}")
    if not arr.flags.c_contiguous:
        raise GrammarError("bitmask must be C-contiguous")
    if not arr.flags.writeable:
        raise GrammarError("bitmask is read-only")
    return arr


def check_rows_allow_some(allowed_any: np.ndarray) -> None:
    """Raise :class:`NoAllowedTokens` naming the rows that allow no token."""
    if not allowed_any.all():
        rows = np.flatnonzero(~allowed_any).tolist()
        raise NoAllowedTokens(f"no token is allowed in row(s) {rows} of the bitmask")
