"""The drafter extension point's helper: a drafter that drafts one sequence at a time."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch

from .._arrays import check_int
from ..errors import ConfigError, SpecdecTypeError
from ..protocols import DraftRequest

__all__ = ["SequenceDrafter"]


class SequenceDrafter(ABC):
    """Implements :class:`~specdec.protocols.Drafter` over ``draft_one(context, depth) ->
    [depth, V]``, one request at a time (drafters with a batched forward implement
    ``draft`` themselves)."""

    @abstractmethod
    def draft_one(self, context: Sequence[int], depth: int) -> torch.Tensor:
        """Per-depth logits ``[depth, V]`` for the tokens after ``context``."""

    def draft(self, requests: Sequence[DraftRequest], depth: int) -> torch.Tensor:
        """``[R, depth, V]``: :meth:`draft_one` for each request."""
        depth = check_int(depth, "depth", 1, ConfigError)
        if not requests:
            raise ConfigError("draft needs at least one request")
        for r in requests:
            if not isinstance(r, DraftRequest):
                raise SpecdecTypeError(f"requests must be DraftRequest, got {type(r).__name__}")
        return torch.stack([self.draft_one(r.context, depth) for r in requests])
