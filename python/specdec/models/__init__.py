"""Target models (:class:`~specdec.protocols.Target`): the compact Llama-style decoder with its
checkpoint loader, llama.cpp GGUF files (:mod:`specdec.models.gguf`: weights, tokenizer, chat
format, the packaged SmolLM2-135M-Instruct), and the ``transformers`` adapter
(:mod:`specdec.models.hf`, imported on demand)."""

from __future__ import annotations

from .gguf import LoadedModel, load_gguf, smollm2
from .llama import LlamaConfig, LlamaModel, load_checkpoint

__all__ = ["LlamaConfig", "LlamaModel", "load_checkpoint", "LoadedModel", "load_gguf", "smollm2"]
