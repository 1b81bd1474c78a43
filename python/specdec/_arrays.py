"""Input conversion shared by every stage: borrow an array without copying when it already has
the right type, refuse wrong types with :class:`SpecdecTypeError` and wrong shapes with the
stage's own error class."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .errors import SpecdecError, SpecdecTypeError, TreeError

__all__ = [
    "as_array",
    "as_list",
    "check_int",
    "check_float",
    "token_tensor",
    "F32",
    "I64",
    "I32",
]

F32, I64, I32 = np.dtype(np.float32), np.dtype(np.int64), np.dtype(np.int32)
I64_MIN, I64_MAX = -(2**63), 2**63 - 1
_DTYPES: dict[type, np.dtype[Any]] = {np.float32: F32, np.int64: I64, np.int32: I32}


def as_array(
    x: Any,
    dtype: type,
    name: str,
    ndim: int,
    exact: bool,
    error: type[SpecdecError] = TreeError,
) -> np.ndarray:
    """Borrow ``x`` as a numpy array of ``dtype`` without copying when it already is one.
    ``exact``: refuse other dtypes instead of converting (float marginals must be float32);
    integer inputs convert between integer dtypes only. Torch tensors are read on the CPU."""
    # Fast path (once per decode step on the hot path): already the right array.
    if type(x) is np.ndarray and x.ndim == ndim and x.dtype is _DTYPES.get(dtype):
        return x
    if not isinstance(x, np.ndarray):
        if hasattr(x, "detach") and hasattr(x, "cpu"):  # torch tensor
            x = tensor_to_numpy(x, name)
        else:
            try:
                x = np.asarray(x)
            except (TypeError, ValueError) as e:
                raise SpecdecTypeError(f"{name} must be an array: {e}") from None
    if x.dtype == object:
        raise SpecdecTypeError(f"{name} must be a numeric array, got objects")
    if x.ndim != ndim:
        raise error(f"{name} must be {ndim}-D, got shape {x.shape}")
    if x.dtype != dtype:
        # Integers convert only to another integer dtype (never to floats: no silent rounding).
        if exact or not (np.issubdtype(x.dtype, np.integer) and np.issubdtype(dtype, np.integer)):
            raise SpecdecTypeError(f"{name} must have dtype {np.dtype(dtype).name}, got {x.dtype}")
        info = np.iinfo(dtype)
        if x.size and (x.min() < info.min or x.max() > info.max):
            raise error(f"{name} has values outside {np.dtype(dtype).name}")
        x = x.astype(dtype)
    out: np.ndarray = x
    return out


def tensor_to_numpy(t: Any, name: str) -> np.ndarray:
    """A torch tensor's values as a numpy array (copied to the host if needed); tensors
    without data (the meta device) or with dtypes numpy lacks are refused."""
    try:
        # A CPU tensor without grad is viewed as is (no detach, no copy).
        cpu = t.device.type == "cpu" and not t.requires_grad
        out: np.ndarray = t.numpy() if cpu else t.detach().cpu().numpy()
    except (RuntimeError, TypeError, NotImplementedError) as e:
        raise SpecdecTypeError(
            f"{name} cannot be read as an array ({t.dtype} on {t.device}): {e}"
        ) from None
    return out


def check_int(
    value: Any, name: str, minimum: int | None = None, error: type[SpecdecError] = TreeError
) -> int:
    """``value`` as a Python int (numpy integers accepted, bools refused), at least
    ``minimum`` when given."""
    if type(value) is not int:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise SpecdecTypeError(f"{name} must be an int, got {type(value).__name__}")
        value = int(value)
    if minimum is not None and value < minimum:
        raise error(f"{name} must be >= {minimum}, got {value}")
    if not I64_MIN <= value <= I64_MAX:  # Rust would raise OverflowError
        raise error(f"{name} must fit in int64, got {value}")
    out: int = value
    return out


def check_float(x: Any, name: str, error: type[SpecdecError] = TreeError) -> float:
    """``x`` as a float (ints accepted, bools and NaN refused)."""
    if isinstance(x, bool) or not isinstance(x, (int, float, np.integer, np.floating)):
        raise SpecdecTypeError(f"{name} must be a number, got {type(x).__name__}")
    try:
        out = float(x)
    except OverflowError:  # an int beyond the float range
        raise error(f"{name} is out of the float range, got {x}") from None
    if math.isnan(out):
        raise error(f"{name} must not be NaN")
    return out


def as_list(x: Any, name: str) -> list[Any]:
    """The items of a list-like ``x`` (list, tuple, 1-D array, any iterable); a str, bytes,
    scalar or 0-D array is refused with :class:`SpecdecTypeError`."""
    if not isinstance(x, (str, bytes)):
        try:
            return list(x)
        except TypeError:  # not iterable, or a 0-D array or tensor
            pass
    raise SpecdecTypeError(f"{name} must be a sequence, got {type(x).__name__}")


def check_bool(x: Any, name: str) -> bool:
    """``x`` as a bool (numpy bools accepted; ints refused, as a flag that is not a bool is
    usually a misplaced positional argument)."""
    if not isinstance(x, (bool, np.bool_)):
        raise SpecdecTypeError(f"{name} must be a bool, got {type(x).__name__}")
    return bool(x)


def token_tensor(tokens: Any, name: str, device: Any) -> Any:
    """``tokens`` (ints, a numpy array or a tensor) as a 1-D int64 torch tensor on ``device``;
    floats and other types refused."""
    import torch

    if isinstance(tokens, torch.Tensor):
        t = tokens
    else:
        try:
            t = torch.as_tensor(np.asarray(tokens))
        except (TypeError, ValueError, RuntimeError) as e:
            raise SpecdecTypeError(f"{name} must be token ids: {e}") from None
    if t.numel() and (t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool):
        raise SpecdecTypeError(f"{name} must be integer token ids, got {t.dtype}")
    return t.to(device=device, dtype=torch.long).reshape(-1)
