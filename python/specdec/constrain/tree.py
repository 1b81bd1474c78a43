"""Constraints over draft trees: one bitmask row per tree node (each node's state follows its
path from the matcher's), and the grammar-aware DDTree that spends the budget on valid
prefixes only."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _core
from .._arrays import as_array, check_bool, check_int
from ..errors import GrammarError, SpecdecTypeError
from ..tree import DraftTree
from ..tree.build import log_threshold
from .bitmask import bitmask_rows
from .matcher import Matcher, _check_matcher

if TYPE_CHECKING:
    import torch

__all__ = ["fill_tree_bitmask", "build_ddtree_constrained"]


def fill_tree_bitmask(
    matcher: Matcher,
    tree: DraftTree,
    bitmask: np.ndarray | torch.Tensor,
    row_offset: int = 0,
) -> np.ndarray:
    """Fill rows ``row_offset .. row_offset + tree.num_nodes`` with each node's mask (root
    first; the root's state is the matcher's current one, i.e. the root token is already
    accepted). Returns bool ``[num_nodes]``: False where the grammar rejects the node's path
    (its row is all zeros). Padding nodes of a padded tree get all-zero rows and False."""
    buf = bitmask_rows(bitmask)
    if not isinstance(tree, DraftTree):
        raise SpecdecTypeError(f"tree must be a DraftTree, got {type(tree).__name__}")
    offset = check_int(row_offset, "row_offset", 0, GrammarError)
    return _core.fill_tree_bitmask(_check_matcher(matcher)._m, tree._arrays, buf, offset)


def build_ddtree_constrained(
    logprobs: Any,
    token_ids: Any,
    budget: int,
    matcher: Matcher,
    root_token: int = -1,
    min_prob: float = 0.0,
    check_duplicates: bool = True,
) -> DraftTree:
    """Grammar-aware DDTree: as :func:`specdec.build_ddtree` over ``[L, K]`` marginals, with
    each node's candidate ranks restricted to the tokens its grammar state allows (the root's
    state is the matcher's), so the whole budget goes to valid prefixes. Unlike the plain
    builder, all K columns are read: the grammar may reject any number of top-ranked tokens,
    so pass as wide a top-K as the constraint may need. ``min_prob`` (in [0, 1]) stops the
    build once the best remaining valid prefix's probability is below it. A token id
    repeated in a row raises when it gives one parent two children (``check_duplicates=False``
    skips that)."""
    lp = as_array(logprobs, np.float32, "logprobs", 2, exact=True)
    ids = as_array(token_ids, np.int64, "token_ids", 2, exact=False)
    arrays = _core.build_ddtree_constrained(
        lp,
        ids,
        check_int(budget, "budget"),
        _check_matcher(matcher)._m,
        check_int(root_token, "root_token"),
        log_threshold(min_prob),
        check_bool(check_duplicates, "check_duplicates"),
    )
    return DraftTree._from_core(arrays)
