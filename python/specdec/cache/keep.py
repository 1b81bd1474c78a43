"""The commit-index check every KV cache shares."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ..errors import SpecdecTypeError, VerifyError

__all__ = ["check_keep"]


def check_keep(keep: Sequence[int] | np.ndarray | torch.Tensor, pending: int) -> torch.Tensor:
    """``keep`` as an int64 CPU tensor, checked: strictly increasing, within the step."""
    try:
        idx = keep if isinstance(keep, torch.Tensor) else torch.as_tensor(np.asarray(keep))
    except (TypeError, ValueError, RuntimeError) as e:
        raise SpecdecTypeError(f"commit indices must be integers: {e}") from None
    if idx.numel() and (
        idx.dtype.is_floating_point or idx.dtype.is_complex or idx.dtype == torch.bool
    ):
        raise SpecdecTypeError(f"commit indices must be integers, got {idx.dtype}")
    idx = idx.to(torch.long).reshape(-1).cpu()
    if len(idx) and (int(idx[0]) < 0 or int(idx[-1]) >= pending):
        raise VerifyError(f"commit indices {idx.tolist()} outside this step's {pending} tokens")
    if len(idx) > 1 and not bool((idx[1:] > idx[:-1]).all()):
        raise VerifyError(f"commit indices must be strictly increasing, got {idx.tolist()}")
    return idx
