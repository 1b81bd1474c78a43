"""A compact Llama/Qwen2-style decoder (RMSNorm, RoPE, GQA, SwiGLU, tied or untied head) whose
forward runs one decode step over a :class:`~specdec.cache.KVCache`, and a loader for local
Hugging Face checkpoint directories (``config.json`` + ``*.safetensors``, no network).

Parameter names follow the Hugging Face layout (``model.layers.0.self_attn.q_proj.weight``...)
so a checkpoint's state dict loads as is. One module per part: :mod:`.config`, :mod:`.layers`
(modules, RMSNorm and RoPE math), :mod:`.inputs` (step input checks), :mod:`.packing`
(oneDNN-packed linears), :mod:`.plans` (a step's linear groups, GGUF blocks, the fused
stack), :mod:`.kv_access` (how the torch layer loop reads and writes K/V), :mod:`.model`
(:class:`LlamaModel`) and :mod:`.loader`.
"""

from __future__ import annotations

# Every name the single-file module had stays importable from here (``_registrations``
# excepted: a count rebound as it grows, read it through ``packing.registrations()``).
from ..fused import run_step as run_step
from .config import LlamaConfig
from .inputs import (
    causal_mask,
    check_step_inputs,
)
from .layers import MLP as MLP
from .layers import Attention as Attention
from .layers import Backbone as Backbone
from .layers import DecoderLayer as DecoderLayer
from .layers import RMSNorm as RMSNorm
from .layers import _norm as _norm
from .layers import _rope as _rope
from .layers import _rotate_half as _rotate_half
from .layers import rope_cos_sin as rope_cos_sin
from .loader import load_checkpoint
from .model import LlamaModel
from .packing import _PACK_OK as _PACK_OK
from .packing import _can_pack as _can_pack
from .packing import _cat_bias as _cat_bias
from .packing import _count_registration as _count_registration
from .packing import _Entry as _Entry
from .packing import _hook_handles as _hook_handles
from .packing import _pack as _pack
from .packing import _packed as _packed
from .packing import _unwatch as _unwatch
from .packing import _version as _version
from .packing import _watch_registrations as _watch_registrations
from .packing import _watchers as _watchers
from .packing import linears as linears
from .plans import _Fused as _Fused
from .plans import _Groups as _Groups
from .plans import _kernel_threads as _kernel_threads
from .plans import _Packs as _Packs
from .plans import _Plan as _Plan
from .plans import _plans as _plans
from .plans import _pointwise as _pointwise
from .plans import _restore_hook as _restore_hook

__all__ = ["LlamaConfig", "LlamaModel", "load_checkpoint", "causal_mask", "check_step_inputs"]
