"""Batching trees for one target forward: R trees padded to one node count, R prefixes to one
length."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._arrays import check_int
from ..errors import SpecdecTypeError, VerifyError
from .draft_tree import DraftTree

if TYPE_CHECKING:
    import torch

__all__ = ["TreeBatch", "batch_tree_inputs"]


@dataclass(frozen=True)
class TreeBatch:
    """R trees as one forward's inputs: ``tokens`` and ``positions`` int64 ``[R, n]``,
    ``mask`` bool ``[R, n, P_max + n]`` (True = visible)."""

    tokens: torch.Tensor
    positions: torch.Tensor
    mask: torch.Tensor


def batch_tree_inputs(
    trees: Sequence[DraftTree],
    prefix_lens: Sequence[int],
    *,
    budget: int | None = None,
    device: str | torch.device = "cpu",
) -> TreeBatch:
    """Pad R trees to one node count and R prefixes to one length.

    Returns tokens ``[R, n]``, positions ``[R, n]`` and mask ``[R, n, P_max + n]`` where
    ``n = budget + 1`` (default: the largest tree). Row r's prefix K/V occupy slots
    ``[0, prefix_lens[r])`` of a ``P_max``-long padded prefix; the remaining prefix slots are
    invisible. Padding nodes see only themselves."""
    import torch

    if len(trees) == 0 or len(trees) != len(prefix_lens):
        raise VerifyError(
            f"need one prefix length per tree, got {len(trees)} trees and "
            f"{len(prefix_lens)} lengths"
        )
    for t in trees:
        if not isinstance(t, DraftTree):
            raise SpecdecTypeError(f"trees must be DraftTree, got {type(t).__name__}")
    prefix_lens = [check_int(p, "prefix length", 0, VerifyError) for p in prefix_lens]
    most = max(t.num_nodes for t in trees) - 1
    bud = most if budget is None else check_int(budget, "budget", 0, VerifyError)
    if bud < most:
        raise VerifyError(f"budget {bud} is smaller than a tree of {most} drafted nodes")
    n = bud + 1
    p_max = max(prefix_lens)
    r = len(trees)
    tokens = torch.zeros(r, n, dtype=torch.long)
    positions = torch.zeros(r, n, dtype=torch.long)
    mask = torch.zeros(r, n, p_max + n, dtype=torch.bool)
    for i, (t, p) in enumerate(zip(trees, prefix_lens, strict=True)):
        tp = t.padded(bud) if t.num_nodes < n else t
        tokens[i] = torch.from_numpy(tp.tokens)
        positions[i] = torch.from_numpy(tp.position_ids(p))
        m = torch.from_numpy(tp.attention_mask(p))
        mask[i, :, :p] = m[:, :p]
        mask[i, :, p_max:] = m[:, p:]
    return TreeBatch(tokens.to(device), positions.to(device), mask.to(device))
