"""Stage 2 of the decode step, build tree (and the walk after verification): draft trees, the
DDTree builders, trees from explicit branches, tree shapes, batching of trees for one
forward, and the verifier walk."""

from __future__ import annotations

from .batch import TreeBatch, batch_tree_inputs
from .build import build_ddtree, build_ddtree_batch, ddtree_from_logits, tree_from_branches
from .draft_tree import DraftTree, TreeTensors
from .shapes import ChainShape, DDTreeShape, tree_shape
from .walk import WalkResult, walk, walk_batch

__all__ = [
    "DraftTree",
    "TreeTensors",
    "WalkResult",
    "TreeBatch",
    "build_ddtree",
    "build_ddtree_batch",
    "ddtree_from_logits",
    "tree_from_branches",
    "batch_tree_inputs",
    "DDTreeShape",
    "ChainShape",
    "tree_shape",
    "walk",
    "walk_batch",
]
