"""specdec: Rust-accelerated speculative decoding with draft trees.

One decode step: draft -> build tree -> mask -> verify -> walk -> commit.
"""

from __future__ import annotations

from ._core import __version__
from .errors import (
    GrammarError,
    KVCacheError,
    NoAllowedTokens,
    OutOfBlocks,
    SpecdecError,
    TreeError,
    UnknownSequence,
    VerifyError,
)
from .grammar import (
    Matcher,
    RegexGrammar,
    Vocabulary,
    allocate_token_bitmask,
    apply_token_bitmask,
    build_ddtree_constrained,
    fill_next_token_bitmask_batch,
    fill_tree_bitmask,
)
from .tree import (
    DraftTree,
    TreeTensors,
    WalkResult,
    build_ddtree,
    build_ddtree_batch,
    ddtree_from_logits,
    tree_from_branches,
    walk,
    walk_batch,
)

__all__ = [
    "__version__",
    "DraftTree",
    "TreeTensors",
    "WalkResult",
    "build_ddtree",
    "build_ddtree_batch",
    "ddtree_from_logits",
    "tree_from_branches",
    "walk",
    "walk_batch",
    "SpecdecError",
    "TreeError",
    "VerifyError",
    "KVCacheError",
    "OutOfBlocks",
    "UnknownSequence",
    "GrammarError",
    "NoAllowedTokens",
    "Vocabulary",
    "RegexGrammar",
    "Matcher",
    "allocate_token_bitmask",
    "apply_token_bitmask",
    "build_ddtree_constrained",
    "fill_next_token_bitmask_batch",
    "fill_tree_bitmask",
]
