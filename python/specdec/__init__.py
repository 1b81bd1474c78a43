"""specdec: Rust-accelerated speculative decoding with draft trees.

One decode step, one subpackage per stage::

    draft (specdec.draft) -> build tree (specdec.tree) -> mask (specdec.constrain)
      -> verify (specdec.verify, over specdec.cache) -> walk (specdec.tree)
      -> commit (specdec.cache)

The extension points are in :mod:`specdec.protocols`; :mod:`specdec.decode` runs the loops.
"""

from __future__ import annotations

from ._core import BlockManager, __version__
from .constrain import (
    Matcher,
    RegexGrammar,
    Vocabulary,
    allocate_token_bitmask,
    apply_token_bitmask,
    apply_token_bitmask_inplace,
    build_ddtree_constrained,
    fill_next_token_bitmask_batch,
    fill_tree_bitmask,
    get_bitmask_shape,
    reset_token_bitmask,
)
from .errors import (
    CheckpointError,
    ConfigError,
    DoubleFree,
    GrammarError,
    KVCacheError,
    NoAllowedTokens,
    OutOfBlocks,
    SlotNotReserved,
    SpecdecError,
    SpecdecTypeError,
    TreeError,
    UnknownSequence,
    VerifyError,
)
from .protocols import Constraint, Drafter, DraftRequest, KVCache, Target, TreeShape
from .tree import (
    ChainShape,
    DDTreeShape,
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

# Verification needs torch: import it on first use so `import specdec` stays light.
_TORCH_EXPORTS = {
    "tree_attention": "verify",
    "Verifier": "verify",
    "StepResult": "verify",
    "Greedy": "verify",
    "Sampling": "verify",
    "DenseKVCache": "cache",
    "PagedKVPool": "cache",
    "PagedKVCache": "cache",
    "SpeculativeGenerator": "decode",
    "autoregressive_generate": "decode",
    "GenerationResult": "decode",
    "TreeBatch": "tree",
    "batch_tree_inputs": "tree",
}


def __getattr__(name: str) -> object:
    if name in _TORCH_EXPORTS:
        import importlib

        return getattr(importlib.import_module(f".{_TORCH_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "__version__",
    # protocols
    "Target",
    "Drafter",
    "DraftRequest",
    "TreeShape",
    "KVCache",
    "Constraint",
    # tree
    "DraftTree",
    "TreeTensors",
    "WalkResult",
    "TreeBatch",
    "DDTreeShape",
    "ChainShape",
    "build_ddtree",
    "build_ddtree_batch",
    "ddtree_from_logits",
    "tree_from_branches",
    "batch_tree_inputs",
    "walk",
    "walk_batch",
    # verify
    "tree_attention",
    "Verifier",
    "StepResult",
    "Greedy",
    "Sampling",
    # cache
    "DenseKVCache",
    "PagedKVPool",
    "PagedKVCache",
    "BlockManager",
    # decode
    "SpeculativeGenerator",
    "autoregressive_generate",
    "GenerationResult",
    # constrain
    "Vocabulary",
    "RegexGrammar",
    "Matcher",
    "allocate_token_bitmask",
    "apply_token_bitmask",
    "apply_token_bitmask_inplace",
    "get_bitmask_shape",
    "reset_token_bitmask",
    "build_ddtree_constrained",
    "fill_next_token_bitmask_batch",
    "fill_tree_bitmask",
    # errors
    "SpecdecError",
    "SpecdecTypeError",
    "TreeError",
    "VerifyError",
    "ConfigError",
    "CheckpointError",
    "KVCacheError",
    "OutOfBlocks",
    "UnknownSequence",
    "DoubleFree",
    "SlotNotReserved",
    "GrammarError",
    "NoAllowedTokens",
]
