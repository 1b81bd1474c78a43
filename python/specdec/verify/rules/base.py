"""The decoding-rule extension point: the target's own rule, applied at every tree node."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from ...errors import SpecdecTypeError, VerifyError

__all__ = ["DecodingRule"]


class DecodingRule(ABC):
    """The target's own decoding rule, applied independently at every row of ``logits``."""

    @abstractmethod
    def choose(
        self, logits: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """``[T, V]`` logits -> ``[T]`` int64 chosen tokens."""

    @staticmethod
    def _check(logits: torch.Tensor) -> None:
        if not isinstance(logits, torch.Tensor):
            raise SpecdecTypeError(f"logits must be a torch.Tensor, got {type(logits).__name__}")
        if logits.dim() != 2 or logits.shape[0] == 0 or logits.shape[1] == 0:
            raise VerifyError(f"logits must be [T, V] with T, V >= 1, got {tuple(logits.shape)}")
        if not logits.is_floating_point():
            raise SpecdecTypeError(f"logits must be floating point, got {logits.dtype}")
