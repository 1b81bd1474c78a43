"""Decode loops over the pipeline stages: the batched speculative generator
(:mod:`.speculative`) with its adaptive budget (:mod:`.budget`), the autoregressive baseline
(:mod:`.autoregressive`) and beam search on shared KV blocks (:mod:`.beam`)."""

from __future__ import annotations

from .autoregressive import autoregressive_generate
from .beam import BeamHypothesis, BeamSearchResult, beam_search
from .budget import AdaptiveBudget, BudgetChoice, CostModel
from .common import GenerationResult, RequestOutput
from .speculative import KVUsage, SpeculativeGenerator

__all__ = [
    "AdaptiveBudget",
    "BeamHypothesis",
    "BeamSearchResult",
    "BudgetChoice",
    "CostModel",
    "GenerationResult",
    "RequestOutput",
    "SpeculativeGenerator",
    "KVUsage",
    "autoregressive_generate",
    "beam_search",
]
