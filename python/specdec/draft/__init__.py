"""Stage 1 of the decode step, draft: drafters (:class:`~specdec.protocols.Drafter`), one file
each (:class:`NgramDrafter` and :class:`SuffixDrafter` need no model and also propose whole
trees, :class:`~specdec.protocols.TreeDrafter`). :class:`SequenceDrafter` adapts a
one-sequence drafter to the batched protocol."""

from __future__ import annotations

from ..protocols import Drafter, DraftRequest, TreeDrafter
from .base import SequenceDrafter
from .model import ModelDrafter, greedy_rollout
from .ngram import NgramDrafter
from .suffix import SuffixDrafter

__all__ = [
    "Drafter",
    "DraftRequest",
    "SequenceDrafter",
    "ModelDrafter",
    "greedy_rollout",
    "NgramDrafter",
    "SuffixDrafter",
    "TreeDrafter",
]
