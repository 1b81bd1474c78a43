"""Target models (:class:`~specdec.protocols.Target`): the compact Llama-style decoder with its
checkpoint loader, and the ``transformers`` adapter (:mod:`specdec.models.hf`, imported on
demand)."""

from __future__ import annotations

from .llama import LlamaConfig, LlamaModel, load_checkpoint

__all__ = ["LlamaConfig", "LlamaModel", "load_checkpoint"]
