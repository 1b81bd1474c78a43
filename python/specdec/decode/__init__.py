"""Decode loops over the pipeline stages: the batched speculative generator
(:mod:`.speculative`) with its adaptive budget (:mod:`.budget`), and the autoregressive
baseline (:mod:`.autoregressive`); beam search joins here."""

from __future__ import annotations

from .autoregressive import autoregressive_generate
from .budget import AdaptiveBudget, BudgetChoice, CostModel
from .common import GenerationResult, RequestOutput
from .speculative import SpeculativeGenerator

__all__ = [
    "AdaptiveBudget",
    "BudgetChoice",
    "CostModel",
    "GenerationResult",
    "RequestOutput",
    "SpeculativeGenerator",
    "autoregressive_generate",
]
