"""Tree shapes (:class:`~specdec.protocols.TreeShape`): how one request's draft logits become
the tree the target verifies. A new shape is one class here with a ``build`` method."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._arrays import check_int
from ..errors import ConfigError
from .build import ddtree_from_logits, log_threshold, tree_from_branches
from .draft_tree import DraftTree

if TYPE_CHECKING:
    import torch

    from ..protocols import TreeShape

__all__ = ["DDTreeShape", "ChainShape", "tree_shape"]


@dataclass(frozen=True)
class DDTreeShape:
    """The best-first DDTree of at most ``budget`` drafted nodes, none of a path probability
    below ``min_prob`` (in [0, 1])."""

    budget: int
    min_prob: float = 0.0

    def __post_init__(self) -> None:
        check_int(self.budget, "budget", 1, ConfigError)
        log_threshold(self.min_prob, ConfigError)

    @property
    def max_drafted(self) -> int:
        return self.budget

    def build(self, logits: torch.Tensor, root_token: int) -> DraftTree:
        tree = ddtree_from_logits(
            logits, self.budget, min_prob=self.min_prob, root_tokens=root_token
        )
        assert isinstance(tree, DraftTree)  # [L, V] logits give one tree
        return tree


@dataclass(frozen=True)
class ChainShape:
    """The drafter's argmax path over its first ``depth`` depths (DFlash-style single path)."""

    depth: int

    def __post_init__(self) -> None:
        check_int(self.depth, "depth", 1, ConfigError)

    @property
    def max_drafted(self) -> int:
        return self.depth

    def build(self, logits: torch.Tensor, root_token: int) -> DraftTree:
        chain = logits[: self.depth].argmax(dim=-1).tolist()
        return tree_from_branches([chain], root_token=root_token)


def tree_shape(kind: str | TreeShape, *, budget: int, depth: int) -> TreeShape:
    """A shape by name (``"ddtree"``: budget nodes; ``"chain"``: depth nodes) or as given.
    ``depth`` is a chain's length, not a limit (the drafter's first ``depth`` argmax tokens):
    a generator passes its ``max_depth``."""
    if kind == "ddtree":
        return DDTreeShape(budget)
    if kind == "chain":
        return ChainShape(depth)
    if isinstance(kind, str):
        raise ConfigError(f"tree shape must be 'ddtree', 'chain' or a TreeShape, got {kind!r}")
    return kind
