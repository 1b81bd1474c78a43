"""``specdec serve``: an OpenAI-compatible HTTP server on the speculative generator.

One engine thread owns a :class:`~specdec.decode.SpeculativeGenerator` (continuous
batching, paged KV with prefix caching, a drafter, per-request grammars) and steps it while
requests are in flight; the ASGI app (Starlette, run by uvicorn) validates requests, renders
chats, streams text and counts everything for Prometheus. Needs the ``serve`` extra
(``pip install 'specdec[serve]'``); importing :mod:`specdec` never imports it.

    engine    :mod:`.engine`    model + generator + loop thread (no HTTP)
    app       :mod:`.app`       routes, SSE, errors, disconnects
    protocol  :mod:`.protocol`  request bodies (pydantic) and OpenAI's error body
    text      :mod:`.text`      incremental detokenization, stop strings, chat templates
    metrics   :mod:`.metrics`   Prometheus counters and histograms
"""

from __future__ import annotations

from .engine import DRAFTERS, ConstraintSpec, Engine, EngineConfig, EngineRequest
from .server import run_server

__all__ = [
    "DRAFTERS",
    "ConstraintSpec",
    "Engine",
    "EngineConfig",
    "EngineRequest",
    "run_server",
]
