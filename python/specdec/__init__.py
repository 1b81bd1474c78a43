"""specdec: Rust-accelerated speculative decoding with draft trees.

One decode step, one subpackage per stage::

    draft (specdec.draft) -> build tree (specdec.tree) -> mask (specdec.constrain)
      -> verify (specdec.verify, over specdec.cache) -> walk (specdec.tree)
      -> commit (specdec.cache)

The extension points are in :mod:`specdec.protocols`; :mod:`specdec.decode` runs the loops
(speculative, autoregressive, and :func:`beam_search` on shared paged KV blocks).
"""

from __future__ import annotations

from ._core import BlockManager, __version__
from .constrain import (
    CfgGrammar,
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
    DraftError,
    GrammarError,
    KVCacheError,
    NoAllowedTokens,
    OutOfBlocks,
    SlotNotReserved,
    SpecdecError,
    SpecdecTypeError,
    TreeError,
    UnknownSequence,
    UnsupportedSchemaError,
    VerifyError,
)
from .protocols import (
    ArgmaxCapture,
    Constraint,
    Drafter,
    DraftRequest,
    HiddenCapture,
    KVCache,
    LogitsMask,
    RequestLifecycle,
    Target,
    TreeDrafter,
    TreeShape,
)
from .tree import (
    ChainShape,
    DDTreeShape,
    DraftTree,
    TreeBatch,
    TreeTensors,
    WalkResult,
    batch_tree_inputs,
    build_ddtree,
    build_ddtree_batch,
    ddtree_from_logits,
    tree_from_branches,
    tree_shape,
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
    "beam_search": "decode",
    "BeamHypothesis": "decode",
    "BeamSearchResult": "decode",
    "GenerationResult": "decode",
    "RequestOutput": "decode",
}


def __getattr__(name: str) -> object:
    if name in _TORCH_EXPORTS:
        import importlib

        return getattr(importlib.import_module(f".{_TORCH_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "__version__",
    "allocate_token_bitmask",
    "ArgmaxCapture",
    "LogitsMask",
    "apply_token_bitmask",
    "apply_token_bitmask_inplace",
    "autoregressive_generate",
    "batch_tree_inputs",
    "beam_search",
    "BeamHypothesis",
    "BeamSearchResult",
    "BlockManager",
    "build_ddtree",
    "build_ddtree_batch",
    "build_ddtree_constrained",
    "CfgGrammar",
    "ChainShape",
    "CheckpointError",
    "ConfigError",
    "Constraint",
    "ddtree_from_logits",
    "DDTreeShape",
    "DenseKVCache",
    "DoubleFree",
    "DraftError",
    "Drafter",
    "DraftRequest",
    "DraftTree",
    "fill_next_token_bitmask_batch",
    "fill_tree_bitmask",
    "GenerationResult",
    "get_bitmask_shape",
    "GrammarError",
    "HiddenCapture",
    "Greedy",
    "KVCache",
    "KVCacheError",
    "Matcher",
    "NoAllowedTokens",
    "OutOfBlocks",
    "PagedKVCache",
    "PagedKVPool",
    "RegexGrammar",
    "RequestLifecycle",
    "RequestOutput",
    "reset_token_bitmask",
    "Sampling",
    "SlotNotReserved",
    "SpecdecError",
    "SpecdecTypeError",
    "SpeculativeGenerator",
    "StepResult",
    "Target",
    "tree_attention",
    "tree_from_branches",
    "tree_shape",
    "TreeBatch",
    "TreeDrafter",
    "TreeError",
    "TreeShape",
    "TreeTensors",
    "UnknownSequence",
    "UnsupportedSchemaError",
    "Verifier",
    "VerifyError",
    "Vocabulary",
    "walk",
    "walk_batch",
    "WalkResult",
]
