"""Stage 1 of the decode step, draft: drafters (:class:`~specdec.protocols.Drafter`), one file
each. :class:`SequenceDrafter` adapts a one-sequence drafter to the batched protocol."""

from __future__ import annotations

from ..protocols import Drafter, DraftRequest
from .base import SequenceDrafter
from .model import ModelDrafter, greedy_rollout

__all__ = ["Drafter", "DraftRequest", "SequenceDrafter", "ModelDrafter", "greedy_rollout"]
