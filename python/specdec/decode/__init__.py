"""Decode loops over the pipeline stages: tree speculation (:mod:`.speculative`) and the
autoregressive baseline (:mod:`.autoregressive`) and beam search on shared KV blocks
(:mod:`.beam`)."""

from __future__ import annotations

from .autoregressive import autoregressive_generate
from .beam import BeamHypothesis, BeamSearchResult, beam_search
from .common import GenerationResult
from .speculative import SpeculativeGenerator

__all__ = [
    "BeamHypothesis",
    "BeamSearchResult",
    "GenerationResult",
    "SpeculativeGenerator",
    "autoregressive_generate",
    "beam_search",
]
