"""Decode loops over the pipeline stages: tree speculation (:mod:`.speculative`) and the
autoregressive baseline (:mod:`.autoregressive`); beam search joins here."""

from __future__ import annotations

from .autoregressive import autoregressive_generate
from .common import GenerationResult
from .speculative import SpeculativeGenerator

__all__ = ["GenerationResult", "SpeculativeGenerator", "autoregressive_generate"]
