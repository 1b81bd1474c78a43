"""Tree builders: the DDTree best-first builder over per-depth marginals (single, batched, and
from logits on any device) and trees from explicit branches. The work is in Rust."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _core
from .._arrays import (
    F32,
    I64,
    I64_MAX,
    I64_MIN,
    as_array,
    as_list,
    check_bool,
    check_float,
    check_int,
)
from ..errors import SpecdecError, SpecdecTypeError, TreeError
from .draft_tree import DraftTree

if TYPE_CHECKING:
    import torch

__all__ = ["build_ddtree", "build_ddtree_batch", "ddtree_from_logits", "tree_from_branches"]

_NDARRAY = np.ndarray


def log_threshold(min_prob: Any, error: type[SpecdecError] = TreeError) -> float | None:
    """The log threshold the Rust builders take for a path-probability threshold
    ``min_prob`` in [0, 1] (0: none)."""
    p = check_float(min_prob, "min_prob", error)
    if not 0.0 <= p <= 1.0:
        raise error(f"min_prob must be in [0, 1], got {p}")
    return None if p == 0.0 else math.log(p)


def _token(t: Any) -> int:
    # int() would truncate floats silently; token ids must be integers.
    if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
        raise TypeError(f"token ids must be ints, got {type(t).__name__}")
    if not I64_MIN <= t <= I64_MAX:
        raise TreeError(f"token id {t} is outside int64")
    return int(t)


def build_ddtree(
    logprobs: Any,
    token_ids: Any,
    budget: int,
    *,
    min_prob: float = 0.0,
    root_token: int = -1,
    check_duplicates: bool = True,
) -> DraftTree:
    """Build the optimal draft tree of at most ``budget`` drafted nodes from per-depth
    marginals (``[L, K]`` float32 log-probs, each row sorted descending, and their int64
    token ids): best-first heap over rank tuples, K = min(budget, K). Entries at -inf never
    enter the tree; equal scores pop in push order. ``min_prob`` (in [0, 1]) stops the build
    once the best remaining prefix's probability is below it. ``root_token`` is stored at
    index 0 (-1 = unknown). Log-probs are checked in every column the build may read; token
    ids where the tree uses them (an id outside [0, 2^31) that enters the tree raises
    :class:`TreeError`). A token id repeated in a row raises :class:`TreeError` naming the
    depth and both columns when it gives one parent two children with that token (the second
    would waste budget); a repeat the tree never reaches is accepted.
    ``check_duplicates=False`` skips that check (about 1 us at B = 1024) when the ids are
    distinct by construction (a top-K's indices)."""
    # Checks inline: this runs once per decode step, and at B = 1024 the whole build takes
    # about 20 us, so every call saved shows.
    if type(budget) is not int:
        budget = check_int(budget, "budget")
    if type(root_token) is not int:
        root_token = check_int(root_token, "root_token")
    threshold = None if type(min_prob) is float and min_prob == 0.0 else log_threshold(min_prob)
    if type(check_duplicates) is not bool:
        check_duplicates = check_bool(check_duplicates, "check_duplicates")
    lp, ids = logprobs, token_ids
    if not (type(lp) is _NDARRAY and lp.dtype is F32 and lp.ndim == 2):
        lp = as_array(lp, np.float32, "logprobs", 2, exact=True)
    if not (type(ids) is _NDARRAY and ids.dtype is I64 and ids.ndim == 2):
        ids = as_array(ids, np.int64, "token_ids", 2, exact=False)
    try:
        arrays = _core.build_ddtree(lp, ids, budget, root_token, threshold, check_duplicates)
    except OverflowError:  # an int past int64 that skipped check_int on the fast path above
        raise TreeError(f"budget {budget} or root_token {root_token} is outside int64") from None
    return DraftTree._from_core(arrays)


def build_ddtree_batch(
    logprobs: Any,
    token_ids: Any,
    budgets: Sequence[int] | np.ndarray | int,
    *,
    min_prob: float = 0.0,
    root_tokens: Sequence[int] | np.ndarray | None = None,
    check_duplicates: bool = True,
) -> list[DraftTree]:
    """Build R trees from ``[R, L, K]`` marginals, each with its own budget, in parallel in
    Rust with the GIL released. Errors name the request; ``min_prob`` and
    ``check_duplicates`` as in :func:`build_ddtree`."""
    lp = as_array(logprobs, np.float32, "logprobs", 3, exact=True)
    ids = as_array(token_ids, np.int64, "token_ids", 3, exact=False)
    threshold = log_threshold(min_prob)
    check_duplicates = check_bool(check_duplicates, "check_duplicates")
    if np.isscalar(budgets):
        budgets = check_int(budgets, "budget")
    b = np.full(lp.shape[0], budgets, dtype=np.int64) if np.isscalar(budgets) else budgets
    b = as_array(b, np.int64, "budgets", 1, exact=False)
    roots = (
        None if root_tokens is None else as_array(root_tokens, np.int64, "root_tokens", 1, False)
    )
    return [
        DraftTree._from_core(t)
        for t in _core.build_ddtree_batch(lp, ids, b, roots, threshold, check_duplicates)
    ]


def tree_from_branches(branches: Sequence[Sequence[int]], *, root_token: int = -1) -> DraftTree:
    """Merge explicit token paths (Medusa choices, static EAGLE trees) into one tree, shared
    prefixes once, packed breadth-first (by depth, then parent, then first appearance).
    ``logprobs`` are 0 and ``expected_acceptance`` NaN: branches carry no probabilities."""
    try:
        paths = [[_token(t) for t in as_list(b, "branch")] for b in as_list(branches, "branches")]
    except TreeError:
        raise
    except (TypeError, ValueError) as e:
        raise SpecdecTypeError(f"branches must be a sequence of token-id sequences: {e}") from None
    return DraftTree._from_core(
        _core.tree_from_branches(paths, check_int(root_token, "root_token"))
    )


def ddtree_from_logits(
    logits: torch.Tensor,
    budget: int | Sequence[int],
    *,
    temperature: float = 1.0,
    min_prob: float = 0.0,
    root_tokens: int | Sequence[int] | None = None,
) -> DraftTree | list[DraftTree]:
    """Draft logits ``[L, V]`` (one tree) or ``[R, L, V]`` (a list) on any device ->
    log-softmax and top-K on that device (K = min(max budget, V)), one host copy of the
    ``[.., L, K]`` result, then the Rust builder (``min_prob``: as in :func:`build_ddtree`,
    of the tempered distribution)."""
    import torch

    if not isinstance(logits, torch.Tensor):
        raise SpecdecTypeError(f"logits must be a torch.Tensor, got {type(logits).__name__}")
    if logits.dim() not in (2, 3) or logits.shape[-1] == 0 or logits.shape[-2] == 0:
        raise TreeError(
            f"logits must be [L, V] or [R, L, V] with L, V >= 1, got {tuple(logits.shape)}"
        )
    if not logits.is_floating_point():
        raise SpecdecTypeError(f"logits must be floating point, got {logits.dtype}")
    if logits.device.type == "meta":
        raise SpecdecTypeError("logits on the meta device hold no values")
    temperature = check_float(temperature, "temperature")
    if not temperature > 0:
        raise TreeError(f"temperature must be > 0, got {temperature}")
    single = logits.dim() == 2
    x = logits.unsqueeze(0) if single else logits
    if isinstance(budget, (int, np.integer)) and not isinstance(budget, bool):
        budgets = [int(budget)] * x.shape[0]
    elif isinstance(budget, (Sequence, np.ndarray)):
        budgets = [check_int(b, "budget") for b in as_list(budget, "budget")]
    else:
        raise SpecdecTypeError(f"budget must be an int or one int per request, got {budget!r}")
    if not budgets or len(budgets) != x.shape[0] or min(budgets) <= 0:
        raise TreeError(
            f"need one budget >= 1 per request, got {budgets} for {x.shape[0]} requests"
        )
    k = min(max(budgets), x.shape[-1])
    with torch.no_grad():
        lp = torch.log_softmax(x.float() / temperature if temperature != 1.0 else x.float(), -1)
        vals, idx = torch.topk(lp, k, dim=-1, sorted=True)
        if x.device.type == "cpu":
            lpv, ids = vals.numpy(), idx.numpy()  # views, no copy
        else:
            # One device->host transfer: the float32 values' bits ride along with the ids.
            packed = torch.cat([idx, vals.view(torch.int32).to(torch.int64)], dim=-1).cpu()
            ids = packed[..., :k].numpy()
            lpv = packed[..., k:].to(torch.int32).view(torch.float32).numpy()
    # A NaN logit turns its whole row NaN after log-softmax, so the top-K values show it.
    if np.isnan(lpv).any():
        raise TreeError("logits contain NaN (or +inf, which log-softmax turns into NaN)")
    ids, lpv = np.ascontiguousarray(ids), np.ascontiguousarray(lpv)
    roots: Any = root_tokens
    # A top-K's indices are distinct in every row: no duplicate-id check needed.
    if single:
        root = -1 if roots is None else check_int(roots, "root_tokens")
        return build_ddtree(
            lpv[0],
            ids[0],
            budgets[0],
            min_prob=min_prob,
            root_token=root,
            check_duplicates=False,
        )
    if isinstance(roots, (int, np.integer)):
        roots = [int(roots)] * x.shape[0]
    return build_ddtree_batch(
        lpv, ids, budgets, min_prob=min_prob, root_tokens=roots, check_duplicates=False
    )
