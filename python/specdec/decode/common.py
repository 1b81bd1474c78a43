"""What the decode loops share: the result type, the prompt check and the emit rule (stop at
``max_new_tokens`` or the first EOS)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .._arrays import token_tensor
from ..errors import VerifyError

__all__ = ["GenerationResult", "emit", "prompt_ids"]


@dataclass
class GenerationResult:
    """``tokens``: generated tokens (prompt excluded); ``accepted``: drafted tokens accepted
    per step; ``timings``: total seconds per stage."""

    tokens: list[int]
    steps: int = 0
    accepted: list[int] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def tokens_per_step(self) -> float:
        return len(self.tokens) / max(self.steps, 1)


def emit(out: list[int], new: Sequence[int], limit: int, eos: int | None) -> bool:
    """Append ``new`` to ``out`` up to ``limit`` tokens or the first EOS; True when done."""
    for t in new:
        out.append(int(t))
        if len(out) >= limit or (eos is not None and t == eos):
            return True
    return False


def prompt_ids(prompt: Any) -> list[int]:
    """The prompt as a non-empty list of ints."""
    ids = token_tensor(prompt, "prompt", "cpu").tolist()
    if not ids:
        raise VerifyError("the prompt needs at least one token")
    return [int(t) for t in ids]
