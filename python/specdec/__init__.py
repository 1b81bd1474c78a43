"""specdec: Rust-accelerated speculative decoding with draft trees.

One decode step: draft -> build tree -> mask -> verify -> walk -> commit.
"""

from __future__ import annotations

from ._core import BlockManager, __version__
from .errors import (
    DoubleFree,
    GrammarError,
    KVCacheError,
    NoAllowedTokens,
    OutOfBlocks,
    SlotNotReserved,
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

# Verification needs torch: import it on first use so `import specdec` stays light.
_TORCH_EXPORTS = {
    "tree_attention": "attention",
    "KVCache": "cache",
    "DenseKVCache": "cache",
    "PagedKVPool": "kv",
    "PagedKVCache": "kv",
    "Verifier": "verify",
    "StepResult": "verify",
    "Greedy": "verify",
    "Sampling": "verify",
    "SpeculativeGenerator": "generate",
    "autoregressive_generate": "generate",
}


def __getattr__(name: str) -> object:
    if name in _TORCH_EXPORTS:
        import importlib

        return getattr(importlib.import_module(f".{_TORCH_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    "tree_attention",
    "KVCache",
    "DenseKVCache",
    "PagedKVPool",
    "PagedKVCache",
    "Verifier",
    "StepResult",
    "Greedy",
    "Sampling",
    "SpeculativeGenerator",
    "autoregressive_generate",
    "SpecdecError",
    "TreeError",
    "VerifyError",
    "KVCacheError",
    "OutOfBlocks",
    "UnknownSequence",
    "DoubleFree",
    "SlotNotReserved",
    "BlockManager",
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
