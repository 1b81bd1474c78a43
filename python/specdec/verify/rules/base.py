"""The decoding-rule extension point: the target's own rule, applied at every tree node."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from ...errors import SpecdecTypeError, VerifyError

__all__ = ["DecodingRule", "apply_rule"]


class DecodingRule(ABC):
    """The target's own decoding rule, applied independently at every row of ``logits``."""

    @abstractmethod
    def choose(
        self,
        logits: torch.Tensor,
        generator: torch.Generator | None = None,
        *,
        uniforms: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``[T, V]`` logits -> ``[T]`` int64 chosen tokens. A rule that draws at random
        takes its randomness from ``generator``, or, when given, from ``uniforms`` (one
        float64 in [0, 1) per row: seeded sampling keyed by position, see
        :func:`~specdec.verify.rules.sampling.keyed_uniforms`)."""

    @staticmethod
    def _check(logits: torch.Tensor) -> None:
        if not isinstance(logits, torch.Tensor):
            raise SpecdecTypeError(f"logits must be a torch.Tensor, got {type(logits).__name__}")
        if logits.dim() != 2 or logits.shape[0] == 0 or logits.shape[1] == 0:
            raise VerifyError(f"logits must be [T, V] with T, V >= 1, got {tuple(logits.shape)}")
        if not logits.is_floating_point():
            raise SpecdecTypeError(f"logits must be floating point, got {logits.dtype}")


def apply_rule(
    rule: DecodingRule,
    logits: torch.Tensor,
    generator: torch.Generator | None,
    uniforms: torch.Tensor | None,
) -> torch.Tensor:
    """``rule.choose``, passing ``uniforms`` only when there are some: a rule written
    before seeded sampling (``choose(logits, generator)``) keeps working unseeded."""
    if uniforms is None:
        return rule.choose(logits, generator)
    try:
        return rule.choose(logits, generator, uniforms=uniforms)
    except TypeError as e:
        if "uniforms" not in str(e):
            raise
        raise SpecdecTypeError(
            f"{type(rule).__name__}.choose takes no uniforms: seeded sampling needs a rule "
            "whose choose accepts them (see DecodingRule.choose)"
        ) from e
