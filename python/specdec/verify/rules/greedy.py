"""Greedy decoding: the target's argmax."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
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
        if logits.device.type == "cpu" and logits.dtype == torch.float32 and logits.dim() >= 1:
            # numpy's argmax: 14 us over 5 x 49,152 logits where torch's takes 185 us (a
            # tenth of a two-core step's host work); the same first-maximum ties and NaNs.
            return torch.from_numpy(np.argmax(logits.detach().numpy(), axis=-1))
        return logits.argmax(dim=-1)
