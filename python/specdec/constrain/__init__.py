"""Stage 3 of the decode step, mask: constraints over a real tokenizer's bytes. A vocabulary
(:mod:`.vocab`), constraint engines (regexes: :mod:`.regex`; context-free grammars:
:mod:`.grammar`), matchers that follow one sequence (:mod:`.matcher`), masks over draft
trees and the grammar-aware DDTree (:mod:`.tree`), and
bitmask helpers per array framework (:mod:`.numpy`, :mod:`.torch`; layout in :mod:`.bitmask`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .bitmask import get_bitmask_shape
from .grammar import CfgGrammar
from .matcher import Matcher, fill_next_token_bitmask_batch
from .numpy import allocate_token_bitmask
from .regex import RegexGrammar
from .tree import build_ddtree_constrained, fill_tree_bitmask
from .vocab import Vocabulary

if TYPE_CHECKING:
    import torch

__all__ = [
    "Vocabulary",
    "RegexGrammar",
    "CfgGrammar",
    "Matcher",
    "allocate_token_bitmask",
    "apply_token_bitmask",
    "apply_token_bitmask_inplace",
    "get_bitmask_shape",
    "reset_token_bitmask",
    "fill_next_token_bitmask_batch",
    "fill_tree_bitmask",
    "build_ddtree_constrained",
]


def _backend(x: Any) -> Any:
    """The helper module for ``x``'s array framework (torch imported only when needed)."""
    import numpy as np

    if isinstance(x, np.ndarray):
        from . import numpy as np_backend

        return np_backend
    from . import torch as torch_backend

    return torch_backend


def apply_token_bitmask_inplace(logits: Any, bitmask: Any, **kwargs: Any) -> None:
    """Set disallowed logits to ``-inf`` in place: torch logits (any device) or numpy logits,
    dispatched to :mod:`.torch` or :mod:`.numpy` (``vocab_size=``, ``indices=`` as there)."""
    _backend(logits).apply_token_bitmask_inplace(logits, bitmask, **kwargs)


def apply_token_bitmask(logits: torch.Tensor, bitmask: Any) -> torch.Tensor:
    """:func:`apply_token_bitmask_inplace`, returning ``logits``."""
    apply_token_bitmask_inplace(logits, bitmask)
    return logits


def reset_token_bitmask(bitmask: Any) -> None:
    """Allow every token again in every row (numpy array or torch tensor)."""
    _backend(bitmask).reset_token_bitmask(bitmask)
