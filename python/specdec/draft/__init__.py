"""Stage 1 of the decode step, draft: drafters (:class:`~specdec.protocols.Drafter`), one file
each (:class:`NgramDrafter` and :class:`SuffixDrafter` need no model and also propose whole
trees, :class:`~specdec.protocols.TreeDrafter`). :class:`SequenceDrafter` adapts a
one-sequence drafter to the batched protocol. :class:`BlockDrafter` (DFlash-style) and
:class:`MedusaDrafter` are trained (``python -m specdec.train``) and read the target's hidden
states. :class:`GrammarDrafts` drafts what a request's grammar forces, in the model's spelling
(:class:`Spelling`, :mod:`.grammar`)."""

from __future__ import annotations

from ..protocols import Drafter, DraftRequest, TreeDrafter
from .base import SequenceDrafter
from .block import BlockDrafter, BlockDrafterConfig
from .checkpoint import DraftVocab
from .combined import CombinedDrafter
from .grammar import GrammarDraft, GrammarDrafts, Spelling
from .medusa import MedusaConfig, MedusaDrafter
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
    "BlockDrafter",
    "BlockDrafterConfig",
    "MedusaDrafter",
    "MedusaConfig",
    "CombinedDrafter",
    "GrammarDraft",
    "GrammarDrafts",
    "Spelling",
    "DraftVocab",
    "TreeDrafter",
]
