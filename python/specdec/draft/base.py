"""The drafter extension point's helper: a drafter that drafts one sequence at a time."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch

from .._arrays import check_int
from ..errors import ConfigError, SpecdecTypeError
from ..protocols import DraftRequest, HiddenCapture

__all__ = ["SequenceDrafter", "check_requests", "hidden_capture"]


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
        check_requests(requests)
        return torch.stack([self.draft_one(r.context, depth) for r in requests])


def check_requests(requests: Sequence[DraftRequest]) -> None:
    """At least one request, each a :class:`~specdec.protocols.DraftRequest` with a context of
    at least one token (its last token is the root of the next tree)."""
    if not requests:
        raise ConfigError("draft needs at least one request")
    for r in requests:
        if not isinstance(r, DraftRequest):
            raise SpecdecTypeError(f"requests must be DraftRequest, got {type(r).__name__}")
        if len(r.context) == 0:
            raise ConfigError("a request's context needs at least one token")


def hidden_capture(drafter: object) -> HiddenCapture | None:
    """The target hidden states ``drafter`` reads (its ``hidden_layers`` and
    ``hidden_final``), as a fresh capture to pass to the target's forwards; None for a
    drafter that reads none."""
    if not hasattr(drafter, "hidden_layers"):
        return None
    layers = tuple(int(i) for i in getattr(drafter, "hidden_layers", ()))
    return HiddenCapture(layers, bool(getattr(drafter, "hidden_final", False)))
