"""Stage 4 of the decode step, verify: packed tree attention (:mod:`.attention`), the target's
own decoding rules (:mod:`.rules`) and the verifier that runs one target forward per step,
walks the tree and commits the accepted path (:mod:`.verifier`)."""

from __future__ import annotations

from .attention import Backend, attend, flex_available, tree_attention
from .rules import DecodingRule, Greedy, Sampling
from .verifier import STAGES, StepResult, Verifier

__all__ = [
    "Backend",
    "attend",
    "flex_available",
    "tree_attention",
    "DecodingRule",
    "Greedy",
    "Sampling",
    "STAGES",
    "StepResult",
    "Verifier",
]
