"""Greedy decoding: the target's argmax."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import DecodingRule

__all__ = ["Greedy"]


@dataclass(frozen=True)
class Greedy(DecodingRule):
    """argmax at every node (ties: the lowest token id, as ``torch.argmax``)."""

    def choose(
        self,
        logits: torch.Tensor,
        generator: torch.Generator | None = None,
        *,
        uniforms: torch.Tensor | None = None,
    ) -> torch.Tensor:
        self._check(logits)
        return logits.argmax(dim=-1)
