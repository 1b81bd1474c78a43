"""The verifier walk: descend the tree along the target's own choices."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import _core
from .._arrays import as_array, as_list
from ..errors import SpecdecTypeError
from .draft_tree import DraftTree

__all__ = ["WalkResult", "walk", "walk_batch"]


@dataclass(frozen=True)
class WalkResult:
    """``accepted``: accepted node indices (root excluded) in root-to-leaf order;
    ``accepted_tokens``: their tokens; ``bonus_token``: the verifier's token after the last
    accepted node, which the tree did not contain (the next step's root)."""

    accepted: np.ndarray
    bonus_token: int
    accepted_tokens: list[int]

    @property
    def num_accepted(self) -> int:
        return len(self.accepted)

    @property
    def tokens(self) -> list[int]:
        """Every token this step emits: the accepted ones then the bonus."""
        return [*self.accepted_tokens, self.bonus_token]

    def kept_nodes(self) -> np.ndarray:
        """int64 ``[0, *accepted]``: the step's nodes whose K/V a cache keeps (the root was
        fed with the tree, so it is committed too) — what ``KVCache.commit`` takes."""
        keep = np.empty(len(self.accepted) + 1, dtype=np.int64)
        keep[0] = 0
        keep[1:] = self.accepted
        return keep


def _result(tree: DraftTree, out: _core.WalkOutcome) -> WalkResult:
    acc = out.accepted
    return WalkResult(acc, out.bonus_token, tree.tokens[acc].tolist())


def _check_tree(tree: Any) -> DraftTree:
    if not isinstance(tree, DraftTree):
        raise SpecdecTypeError(f"tree must be a DraftTree, got {type(tree).__name__}")
    return tree


def walk(tree: DraftTree, chosen_tokens: Any) -> WalkResult:
    """Descend from the root while the verifier's chosen token at the current node is one of
    its children; the first miss is the bonus token. ``chosen_tokens[i]`` is the verifier's
    token at node i (argmax, or one sample of its own distribution); padding nodes are never
    entered."""
    _check_tree(tree)
    chosen = as_array(chosen_tokens, np.int64, "chosen_tokens", 1, exact=False)
    return _result(tree, _core.walk(tree._arrays, chosen))


def walk_batch(trees: Sequence[DraftTree], chosen_tokens: Any) -> list[WalkResult]:
    """:func:`walk` for R trees in one call; ``chosen_tokens`` is ``[R, n_max]`` (row i uses
    its first ``trees[i].num_nodes`` entries)."""
    trees = as_list(trees, "trees")
    chosen = as_array(chosen_tokens, np.int64, "chosen_tokens", 2, exact=False)
    outs = _core.walk_batch([_check_tree(t)._arrays for t in trees], chosen)
    return [_result(t, o) for t, o in zip(trees, outs, strict=True)]
