"""specdec in vLLM (the ``vllm`` extra; vLLM itself is installed separately, see
``make test-vllm``): :class:`SuffixProposer`, a ``custom_class`` speculative proposer over
specdec's suffix indices (:mod:`.proposer`); :class:`GrammarLogitsProcessor`, a V1 logits
processor for per-request grammars given in ``SamplingParams.extra_args["specdec"]``
(:mod:`.logits`); :func:`export_smollm2`, the SmolLM2 weights as a directory vLLM loads
(:mod:`.export`).

Importing this package imports neither vLLM nor its submodules: each name loads its module
on first use, so vLLM's class-path lookups (``specdec.integrations.vllm.SuffixProposer``,
``specdec.integrations.vllm:GrammarLogitsProcessor``) work."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .export import export_smollm2
    from .logits import GrammarLogitsProcessor
    from .proposer import SuffixProposer

__all__ = ["SuffixProposer", "GrammarLogitsProcessor", "export_smollm2"]

_MODULES = {
    "SuffixProposer": "proposer",
    "GrammarLogitsProcessor": "logits",
    "export_smollm2": "export",
}


def __getattr__(name: str) -> object:
    if name in _MODULES:
        return getattr(importlib.import_module(f".{_MODULES[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
