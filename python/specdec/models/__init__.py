"""Target and draft models: the compact Llama-style decoder with its checkpoint loader, the
``transformers`` adapter (:mod:`specdec.models.hf`, imported on demand) and test drafters."""

from __future__ import annotations

from .drafters import AdversarialDrafter, ModelDrafter, OracleDrafter, RandomDrafter
from .llama import LlamaConfig, LlamaModel, load_checkpoint

__all__ = [
    "LlamaConfig",
    "LlamaModel",
    "load_checkpoint",
    "RandomDrafter",
    "OracleDrafter",
    "AdversarialDrafter",
    "ModelDrafter",
]
