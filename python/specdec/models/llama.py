"""A compact Llama/Qwen2-style decoder (RMSNorm, RoPE, GQA, SwiGLU, tied or untied head) whose
forward runs one decode step over a :class:`~specdec.cache.KVCache`, and a loader for local
Hugging Face checkpoint directories (``config.json`` + ``*.safetensors``, no network).

Parameter names follow the Hugging Face layout (``model.layers.0.self_attn.q_proj.weight``...)
so a checkpoint's state dict loads as is.
"""

from __future__ import annotations

import json
import math
import weakref
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch import Tensor, nn

from .._core import LlamaStack, QuantMatrix
from ..cache.dense import DenseKVCache
from ..cache.paged import PagedDecodeStep, PagedKVCache, PagedKVPool
from ..errors import CheckpointError, ConfigError, SpecdecTypeError, VerifyError
from ..protocols import HiddenCapture, KVCache, Target
from ..verify.attention import Backend, FlexFallback, attend, check_bool_mask
from .fused import StepKV, batch_kv, pool_kv, run_step, single_kv
from .quant import (
    NUMERIC_MODES,
    Numeric,
    QuantBlocks,
    QuantizedLinears,
    kernel_available,
    quant_matmul,
    stack,
    torch_threads,
)

__all__ = ["LlamaConfig", "LlamaModel", "load_checkpoint", "causal_mask", "check_step_inputs"]


@dataclass
class LlamaConfig:
    vocab_size: int = 256
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # bias on q/k/v/o (Llama's flag)
    qkv_bias: bool = False  # bias on q/k/v only (Qwen2)
    mlp_bias: bool = False

    def __post_init__(self) -> None:
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        dims = (
            self.vocab_size,
            self.hidden_size,
            self.intermediate_size,
            self.num_hidden_layers,
            self.num_attention_heads,
            self.num_key_value_heads,
            self.head_dim,
            self.max_position_embeddings,
        )
        if min(dims) <= 0:
            raise ConfigError(f"config dimensions must be positive: {self}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"num_attention_heads {self.num_attention_heads} must be a multiple of "
                f"num_key_value_heads {self.num_key_value_heads}"
            )
        if self.head_dim % 2:
            raise ConfigError(f"head_dim must be even for RoPE, got {self.head_dim}")

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> LlamaConfig:
        """From a Hugging Face ``config.json`` dict (Llama, Qwen2, Mistral without sliding
        window). Unsupported features (RoPE scaling, sliding window) raise ConfigError rather
        than giving silently different logits."""
        mt = cfg.get("model_type", "llama")
        if mt not in ("llama", "qwen2", "mistral"):
            raise ConfigError(f"unsupported model_type {mt!r} (llama, qwen2, mistral)")
        rope = cfg.get("rope_parameters") or {}
        scaling = cfg.get("rope_scaling")
        rtype = (scaling or {}).get("rope_type", (scaling or {}).get("type")) or rope.get(
            "rope_type", "default"
        )
        if rtype != "default":
            raise ConfigError(f"RoPE scaling {rtype!r} is not supported")
        if cfg.get("use_sliding_window") or (mt == "mistral" and cfg.get("sliding_window")):
            raise ConfigError("sliding-window attention is not supported")
        if cfg.get("hidden_act", "silu") != "silu":
            raise ConfigError(f"hidden_act {cfg.get('hidden_act')!r} is not supported (silu)")
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in cfg.items() if k in names}
        kw["rope_theta"] = float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
        if mt == "qwen2":
            kw["qkv_bias"] = True
        return cls(**kw)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in at least float32 (as the reference implementation does) for bf16/fp16.
        if x.dtype == torch.float32:  # the fused kernel: same math, one call
            return nn.functional.rms_norm(x, self.weight.shape, self.weight, self.eps)
        dt = torch.promote_types(x.dtype, torch.float32)
        h = x.to(dt)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def _norm(x: Tensor, norm: RMSNorm) -> Tensor:
    """``norm(x)`` without the module call (the fused kernel for float32, as RMSNorm does)."""
    if x.dtype == torch.float32:
        w = norm.weight
        return nn.functional.rms_norm(x, w.shape, w, norm.eps)
    out: Tensor = norm(x)
    return out


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_cos_sin(
    positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin ``[T, head_dim]`` for the half-split RoPE layout of Llama checkpoints."""
    ft = torch.promote_types(dtype, torch.float32)
    inv = 1.0 / (
        theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=ft) / head_dim)
    )
    ang = positions.to(ft)[:, None] * inv[None]
    emb = torch.cat((ang, ang), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rope(x: Tensor, cos: Tensor, sin_signed: Tensor) -> Tensor:
    """RoPE on ``x [..., D]``: ``x * cos + rotate_half(x) * sin`` in four ops, bit for bit
    (``rotate_half(x) * sin`` is the halves of ``x`` swapped times ``sin`` with its first half
    negated: a negation is exact). ``cos`` / ``sin_signed`` broadcast against ``x``."""
    half = x.shape[-1] // 2
    rot = x.view(*x.shape[:-1], 2, half).flip(-2).flatten(-2)
    rot.mul_(sin_signed)
    return (x * cos).add_(rot)


# -- packed linear layers ------------------------------------------------------------------
# On the CPU a float32 ``F.linear`` goes to the BLAS (MKL in the stock wheels), which repacks
# the weight on every call and, on non-Intel CPUs, runs a slow generic path: at the few rows
# of a decode step it reads the weights far below memory bandwidth. oneDNN's linear on a
# weight packed once (what ``torch.compile``'s CPU freezing uses) does the same product 2-4x
# faster. Layers that read the same input (q/k/v, gate/up) are packed as one weight, one call
# (the same sums: each output column is its own dot product). The packed copies live beside
# the parameters (twice the weight memory; ``LlamaModel.release_plain_linears`` frees the
# plain ones) and are rebuilt when a weight changes (its version counter) or is replaced;
# they go with the weights.
_Entry = tuple[tuple["weakref.ref[Tensor]", ...], tuple[int, ...], Tensor, Tensor | None]
_packed: dict[tuple[int, ...], _Entry] = {}


def _can_pack() -> bool:
    try:
        return bool(
            torch.backends.mkldnn.is_available()  # type: ignore[no-untyped-call]
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and hasattr(torch.ops.mkldnn, "_linear_pointwise")
        )
    except Exception:  # pragma: no cover - exotic builds
        return False


_PACK_OK = _can_pack()


def _version(t: Tensor) -> int:
    try:
        return int(t._version)
    except RuntimeError:  # an inference-mode tensor: no version counter (it never changes)
        return -1


def _cat_bias(ws: Sequence[Tensor], bs: Sequence[Tensor | None]) -> Tensor | None:
    """The biases of layers ``ws`` fused into one (zeros for a layer without); None if none
    has one."""
    if all(b is None for b in bs):
        return None
    parts = [b if b is not None else w.new_zeros(w.shape[0]) for w, b in zip(ws, bs, strict=True)]
    return torch.cat(parts).detach()


def _pack(ws: Sequence[Tensor], bs: Sequence[Tensor | None]) -> tuple[Tensor, Tensor | None]:
    """The packed concatenation of weights ``ws`` (and of their biases ``bs``), cached."""
    held = [*ws, *(b for b in bs if b is not None)]
    key = tuple(id(t) for t in held)
    vers = tuple(_version(t) for t in held)
    hit = _packed.get(key)
    if (
        hit is not None
        and hit[1] == vers
        and all(r() is t for r, t in zip(hit[0], held, strict=True))
    ):
        return hit[2], hit[3]
    w = ws[0] if len(ws) == 1 else torch.cat(list(ws))
    p: Tensor = torch.ops.mkldnn._reorder_linear_weight(w.detach())
    bias = _cat_bias(ws, bs)

    def drop(_: object) -> None:  # a weight went: its packed copy goes
        _packed.pop(key, None)

    refs = tuple(weakref.ref(t, drop) for t in held)
    _packed[key] = (refs, vers, p, bias)
    return p, bias


def linears(
    x: Tensor,
    ws: Sequence[Tensor],
    bs: Sequence[Tensor | None],
    *,
    packed: bool = True,
    cat: bool = False,
) -> tuple[Tensor, ...]:
    """``F.linear(x, ws[i], bs[i])`` for each ``i`` (with ``cat``: one tensor, the outputs
    concatenated along the last dim). With ``packed``, where that applies (CPU float32
    weights, no autograd), one oneDNN call on the packed concatenation (results differ from
    the BLAS's in the last bits only: another summation order); else plain ``F.linear``
    calls."""
    if (
        packed
        and _PACK_OK
        and not torch.is_grad_enabled()
        and all(w.device.type == "cpu" and w.dtype == torch.float32 for w in ws)
    ):
        p, b = _pack(ws, bs)
        out: Tensor = torch.ops.mkldnn._linear_pointwise(x, p, b, "none", [], "")
        if len(ws) == 1 or cat:
            return (out,)
        return tuple(torch.split(out, [w.shape[0] for w in ws], dim=-1))
    outs = tuple(nn.functional.linear(x, w, b) for w, b in zip(ws, bs, strict=True))
    return (torch.cat(outs, dim=-1),) if cat and len(outs) > 1 else outs


_Packs = list[tuple[Tensor, Tensor | None]]
# A step's linear groups: oneDNN-packed weights, or the GGUF blocks (see ``quant``).
_Groups = Sequence[tuple[Tensor | QuantMatrix, Tensor | None]]
# (weights, their versions, packed groups, the registration count when it was checked)
_Plan = tuple[list[Tensor], list[int], _Packs, int]
# Per model: the weights a decode step reads, their versions, and their packed groups.
_plans: weakref.WeakKeyDictionary[nn.Module, _Plan] = weakref.WeakKeyDictionary()


# Parameter and submodule (re)registrations anywhere in the process (assigning a new weight
# or layer, ``load_state_dict(assign=True)``), counted by global nn.Module hooks: while the
# count stands, a model's packed plan only needs its weights' version counters checked, not
# a walk over its modules (a walk costs ~0.4 ms a step on SmolLM2-135M). The hooks are
# torch's only way to see such assignments; they are installed while some model has a plan
# and removed with the last such model.
_registrations = 0
_hook_handles: list[Any] = []
_watchers: weakref.WeakSet[nn.Module] = weakref.WeakSet()


def _count_registration(*_: object) -> None:
    global _registrations
    _registrations += 1


def _watch_registrations(model: nn.Module) -> None:
    global _registrations
    if model in _watchers:
        return
    if not _hook_handles:
        from torch.nn.modules import module as nn_module

        _hook_handles.append(
            nn_module.register_module_parameter_registration_hook(_count_registration)
        )
        _hook_handles.append(
            nn_module.register_module_module_registration_hook(_count_registration)
        )
        _registrations += 1  # unseen while unhooked: every plan checks its weights again
    _watchers.add(model)
    weakref.finalize(model, _unwatch)


def _unwatch() -> None:
    if not any(True for _ in _watchers):  # the last model with a plan is gone (live ones)
        for h in _hook_handles:
            h.remove()
        _hook_handles.clear()


@dataclass
class _Fused:
    """A model's fused-step stack (:meth:`LlamaModel._fused_stack`): built from
    ``quantized`` and the norm weights ``norms`` (copied into it) at their ``versions``, with
    the registration count when they were last checked."""

    quantized: QuantizedLinears
    norms: list[Tensor]
    versions: list[int]
    registrations: int
    stack: LlamaStack


def _restore_hook(module: LlamaModel, *_: object) -> None:
    module.restore_plain_linears()


def _pointwise(
    x: Tensor, wb: tuple[Tensor | QuantMatrix, Tensor | None], numeric: Numeric = "exact"
) -> Tensor:
    w = wb[0]
    if isinstance(w, QuantMatrix):
        return quant_matmul(x, w, wb[1], numeric)
    out: Tensor = torch.ops.mkldnn._linear_pointwise(x, w, wb[1], "none", [], "")
    return out


def _kernel_threads(plan: _Groups | None, threads: int | None) -> AbstractContextManager[None]:
    """Around a forward on the quantized blocks: torch's own ops on ``threads`` threads
    (``LlamaModel.kernel_torch_threads``)."""
    if threads is None or plan is None or not plan or not isinstance(plan[0][0], QuantMatrix):
        return nullcontext()
    return torch_threads(threads)


class Attention(nn.Module):
    q_proj: nn.Linear
    k_proj: nn.Linear
    v_proj: nn.Linear
    o_proj: nn.Linear
    h: int
    hkv: int
    hd: int

    def __init__(self, c: LlamaConfig) -> None:
        super().__init__()
        hd = c.head_dim or 0
        qkv = c.attention_bias or c.qkv_bias
        self.q_proj = nn.Linear(c.hidden_size, c.num_attention_heads * hd, bias=qkv)
        self.k_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * hd, bias=qkv)
        self.v_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * hd, bias=qkv)
        self.o_proj = nn.Linear(c.num_attention_heads * hd, c.hidden_size, bias=c.attention_bias)
        self.h, self.hkv, self.hd = c.num_attention_heads, c.num_key_value_heads, hd


class MLP(nn.Module):
    def __init__(self, c: LlamaConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=c.mlp_bias)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=c.mlp_bias)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=c.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))
        return out


class DecoderLayer(nn.Module):
    self_attn: Attention
    mlp: MLP
    input_layernorm: RMSNorm
    post_attention_layernorm: RMSNorm

    def __init__(self, c: LlamaConfig) -> None:
        super().__init__()
        self.self_attn = Attention(c)
        self.mlp = MLP(c)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)


class Backbone(nn.Module):
    embed_tokens: nn.Embedding
    norm: RMSNorm

    def __init__(self, c: LlamaConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def decoder_layers(self) -> list[DecoderLayer]:
        """The layers, typed (``nn.ModuleList`` items are untyped)."""
        return [cast(DecoderLayer, layer) for layer in self.layers]


def causal_mask(committed_len: int, num_new: int, device: torch.device | str) -> torch.Tensor:
    """``[T, L+T]`` bool: every new token sees the committed prefix and earlier new tokens."""
    m = torch.ones(num_new, committed_len + num_new, dtype=torch.bool, device=device)
    m[:, committed_len:] = torch.tril(m[:, committed_len:])
    return m


def check_step_inputs(
    target: Target, input_ids: Any, position_ids: Any, mask: Any, cache: Any
) -> None:
    """The checks every target runs before a step (clear errors instead of index faults)."""
    vocab_size, max_positions, device = target.vocab_size, target.max_positions, target.device
    if not isinstance(cache, KVCache):
        raise SpecdecTypeError(f"cache must be a specdec.cache.KVCache, got {type(cache).__name__}")
    for name, t in (("input_ids", input_ids), ("position_ids", position_ids)):
        if not isinstance(t, torch.Tensor):
            raise SpecdecTypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in (torch.int64, torch.int32):
            raise SpecdecTypeError(f"{name} must be int64/int32, got {t.dtype}")
        if t.dim() != 1:
            raise VerifyError(f"{name} must be 1-D [T], got shape {tuple(t.shape)}")
        if t.device != device:
            raise VerifyError(f"{name} is on {t.device}, the model on {device}")
    t_new = input_ids.shape[0]
    if t_new == 0:
        raise VerifyError("a step needs at least one token (empty tree)")
    if position_ids.shape != input_ids.shape:
        raise VerifyError(
            f"position_ids {tuple(position_ids.shape)} must match input_ids "
            f"{tuple(input_ids.shape)}"
        )
    lo, hi = int(input_ids.min()), int(input_ids.max())
    if lo < 0 or hi >= vocab_size:
        raise VerifyError(f"token ids must be in [0, {vocab_size}), got range [{lo}, {hi}]")
    pmin, pmax = int(position_ids.min()), int(position_ids.max())
    if pmin < 0 or pmax >= max_positions:
        raise VerifyError(
            f"positions must be in [0, {max_positions}) (the model's maximum), got [{pmin}, {pmax}]"
        )
    if cache.pending:
        raise VerifyError("the cache has an uncommitted step: commit or roll it back first")
    if mask is not None:
        check_bool_mask(mask)
        want = (t_new, cache.committed_len + t_new)
        if tuple(mask.shape) != want:
            raise VerifyError(
                f"mask must be [T, committed + T] = {list(want)}, got {tuple(mask.shape)}"
            )
        if mask.device != device:
            raise VerifyError(f"mask is on {mask.device}, the model on {device}")


class LlamaModel(nn.Module):
    """Llama-style causal LM. One :meth:`forward` call is one decode step: it calls
    ``cache.begin(T)``, appends this step's K/V for every layer and returns logits
    ``[T, vocab]``; the caller then commits or rolls back the cache."""

    def __init__(self, config: LlamaConfig, *, backend: Backend = "auto") -> None:
        super().__init__()
        self.config = config
        self.model = Backbone(config)
        self.lm_head = (
            None
            if config.tie_word_embeddings
            else nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        )
        self.backend: Backend = backend
        self._flex = FlexFallback()  # what backend="auto" learnt on this model
        # Every forward path (forward, forward_batch, forward_last, forward_paged) runs CPU
        # float32 linear layers through oneDNN on packed weights (see ``linears``): about 2x
        # faster than the BLAS at 1-65 rows; logits differ from ``F.linear``'s by ~1e-4 (another
        # summation order). False: plain ``F.linear`` (transformers' own summation).
        self.packed_linear = True
        # GGUF's quantized blocks of the linear layers (load_gguf attaches them where the
        # formats allow and the CPU has AVX-512): steps of at most ``quant_max_rows`` rows
        # multiply by them instead of the float weights (~2-4x less time at 1-8 rows on
        # SmolLM2; from ~60 rows oneDNN's float32 product is faster). ``quant_linear``
        # False: never.
        self.quantized: QuantizedLinears | None = None
        self.quant_linear = True
        self.quant_max_rows = 48
        # torch's intra-op threads while a step runs on the quantized blocks: 1, since its
        # ops are small at a few rows and its OpenMP workers, which spin for a while after
        # every parallel op, would take the cores the kernel's threads run on (measured on
        # SmolLM2: the kernel's share of a step 12 ms with them spinning, 7 ms without;
        # the whole 1-row step ~10x slower). torch's setting is process-wide, so it is set
        # only inside such a step; None leaves it alone (a process whose other threads run
        # torch work meanwhile).
        self.kernel_torch_threads: int | None = 1
        # A step on the quantized blocks (CPU float32, a dense cache, a paged one, or a batch
        # of either) runs as one Rust call over the whole stack (``LlamaStack``): the same
        # float32 math up to summation order, without ~120 products' and ~300 small ops'
        # dispatch from Python. False: layer by layer in torch (the reference).
        self.fused_step: bool = True
        self._fused: _Fused | None = None
        self._numeric: Numeric = "exact"
        # After release_plain_linears: (module, group, offset) for each freed weight.
        self._released: list[tuple[nn.Linear, int, int]] = []
        self._hooked = False
        self._rope_tab: tuple[Tensor, Tensor] | None = None  # see _rope_tables

    # -- hidden states -------------------------------------------------------------------
    # Per call (``hidden=HiddenCapture(...)``), never per model: one model serves several
    # generators, each with its own drafter's layers.
    captures_hidden = True

    @property
    def numeric(self) -> Numeric:
        """How products on the GGUF blocks round: ``"exact"`` (the default: the float32
        product, within 1e-4 of the float reference) or ``"int8"`` (each input row
        quantized per block of 32 to 8 bits, integer dot products with the quants:
        llama.cpp's numeric class, faster; logits differ from the float reference by the
        activations' rounding). In ``"int8"`` every step runs on the blocks, whatever its
        rows (a tree step and the one-token steps of plain decoding round alike), so
        speculation stays lossless against the same mode's own plain decoding. Needs the
        blocks (:func:`~specdec.models.gguf.load_gguf` attaches them on CPUs with
        AVX-512)."""
        return self._numeric

    @numeric.setter
    def numeric(self, mode: str) -> None:
        if mode not in NUMERIC_MODES:
            raise ConfigError(f"numeric must be 'exact' or 'int8', got {mode!r}")
        if mode == "int8" and self.quantized is None:
            raise ConfigError(
                "numeric='int8' multiplies by the GGUF blocks, and this model has none "
                "(load it with load_gguf from Q4_1/Q8_0 weights on a CPU with AVX-512)"
            )
        self._numeric = mode

    def check_capture(self, hidden: HiddenCapture) -> None:
        """Raise a ``ConfigError`` when ``hidden`` names layers this model lacks."""
        n = self.config.num_hidden_layers
        ids = tuple(int(i) for i in hidden.layers)
        bad = [i for i in ids if not 0 <= i < n]
        if bad:
            raise ConfigError(f"hidden-state layers {bad} are not in [0, {n}) (the model's layers)")
        if list(ids) != sorted(set(ids)):
            raise ConfigError(f"hidden-state layers must be strictly increasing, got {list(ids)}")

    @staticmethod
    def _keep_hidden(hidden: HiddenCapture | None, kept: list[torch.Tensor], x: Tensor) -> None:
        if hidden is None:
            return
        if hidden.final:
            kept.append(x)
        hidden.states = torch.cat(kept, -1) if kept else None

    # -- linear layers -------------------------------------------------------------------
    @staticmethod
    def _lin(x: Tensor, *mods: nn.Linear, packed: bool, cat: bool = False) -> tuple[Tensor, ...]:
        ws, bs = [m.weight for m in mods], [m.bias for m in mods]
        return linears(x, ws, bs, packed=packed, cat=cat)

    def _linear_mods(self) -> list[tuple[nn.Linear, ...]]:
        """The linear layers of :meth:`_linear_groups` (the head: none where it is tied)."""
        mods: list[tuple[nn.Linear, ...]] = []
        for layer in self.model.decoder_layers():
            a, m = layer.self_attn, layer.mlp
            mods += [(a.q_proj, a.k_proj, a.v_proj), (a.o_proj,), (m.gate_proj, m.up_proj)]
            mods.append((m.down_proj,))
        mods.append(() if self.lm_head is None else (self.lm_head,))
        return mods

    def _linear_groups(self) -> list[tuple[list[Tensor], list[Tensor | None]]]:
        """A decode step's linear layers: per layer qkv, o, gate/up, down; then the head."""
        groups: list[tuple[list[Tensor], list[Tensor | None]]] = []
        for ms in self._linear_mods()[:-1]:
            groups.append(([x.weight for x in ms], [x.bias for x in ms]))
        w = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        groups.append(([w], [None]))
        return groups

    def _decode_plan(self, release: bool = False) -> _Groups | None:
        """The packed groups of :meth:`_linear_groups`, or None where packing does not apply
        (:attr:`packed_linear` off, not CPU float32, autograd on). One pass per call checks
        that no weight was replaced or changed in place since they were packed (else they are
        packed again), so a step does no per-layer cache look-ups. With ``release``, each
        group's plain weights are freed as soon as it is packed (see
        :meth:`release_plain_linears`)."""
        if not (self.packed_linear and _PACK_OK) or torch.is_grad_enabled():
            return None
        plan = _plans.get(self)
        if (
            not release
            and plan is not None
            and plan[3] == _registrations
            and plan[1] == [_version(t) for t in plan[0]]
        ):
            return plan[2]  # nothing registered anywhere since, no weight changed in place
        _watch_registrations(self)
        groups = self._linear_groups()
        held = [t for ws, bs in groups for t in (*ws, *bs) if t is not None]
        vers = [_version(t) for t in held]
        if (
            plan is not None
            and plan[1] == vers
            and len(plan[0]) == len(held)
            and all(a is b for a, b in zip(plan[0], held, strict=True))
        ):
            if release:
                for j, mods in enumerate(self._linear_mods()):
                    self._release_group(j, mods)
            _plans[self] = (held, vers, plan[2], _registrations)
            return plan[2]
        if self._released:  # re-packing reads the plain weights: bring them back first
            self.restore_plain_linears()
            return self._decode_plan(release)
        if any(t.device.type != "cpu" or t.dtype != torch.float32 for t in held):
            return None
        packs = []
        for j, ((ws, bs), mods) in enumerate(zip(groups, self._linear_mods(), strict=True)):
            packs.append(_pack(ws, bs))
            if release:  # one group at a time: the peak holds one group twice, not all
                self._release_group(j, mods)
        _plans[self] = (held, vers, packs, _registrations)
        return packs

    def attach_quantized(self, blocks: Mapping[str, QuantBlocks]) -> bool:
        """Keep the GGUF ``blocks`` of the linear layers (by state-dict name) for steps of
        few rows (:attr:`quantized`). Only where every decode-step weight has blocks, one
        format per group, and the fast kernel runs on this CPU; returns whether it did.
        The blocks must dequantize to the model's current weights (as loaded)."""
        self.quantized = None
        if not kernel_available() or self.dtype != torch.float32 or self.device.type != "cpu":
            return False
        names = {id(p): n for n, p in self.named_parameters()}
        plan: list[tuple[Tensor | QuantMatrix, Tensor | None]] = []
        held: list[Tensor] = []
        for ws, bs in self._linear_groups():
            parts = [blocks.get(names.get(id(w), "")) for w in ws]
            found = [b for b in parts if b is not None]
            if len(found) != len(ws) or len({b.format for b in found}) != 1:
                return False
            plan.append((stack(found), _cat_bias(ws, bs)))
            held += [*ws, *(b for b in bs if b is not None)]
        _watch_registrations(self)
        vers = [_version(t) for t in held]
        self.quantized = QuantizedLinears(plan, held, vers, _registrations)
        return True

    def _quant_groups(self, rows: int) -> _Groups | None:
        """:attr:`quantized` as a step's groups where it applies to ``rows`` rows and still
        stands for the model's weights (none replaced, none changed in place)."""
        qz = self.quantized
        if qz is None or not self.quant_linear:
            return None
        if rows > self.quant_max_rows and self.numeric == "exact":
            return None
        if torch.is_grad_enabled():
            return None
        if [_version(t) for t in qz.held] != qz.versions:
            self.quantized = None  # a weight changed in place: the blocks no longer match
            return None
        if qz.registrations != _registrations:  # something was (re)assigned somewhere
            held = [t for ws, bs in self._linear_groups() for t in (*ws, *bs) if t is not None]
            if len(held) != len(qz.held) or any(
                a is not b for a, b in zip(held, qz.held, strict=True)
            ):
                self.quantized = None  # a weight was replaced
                return None
            qz.registrations = _registrations
        return qz.plan

    def _linear_plan(self, packed: bool, rows: int) -> _Groups | None:
        """The step's linear groups: the quantized blocks for a step of ``rows`` rows where
        they apply (:meth:`_quant_groups`), else the packed groups with ``packed`` where
        they apply, else None (plain ``F.linear`` on the plain weights, restored first if
        :meth:`release_plain_linears` freed them)."""
        if packed:
            quant = self._quant_groups(rows)
            if quant is not None:
                return quant
        plan = self._decode_plan() if packed else None
        if plan is None and self._released:
            self.restore_plain_linears()
        return plan

    def _norm_weights(self) -> list[Tensor]:
        """The RMSNorm weights a fused stack copies: per layer input and post-attention, then
        the final norm."""
        out = []
        for layer in self.model.decoder_layers():
            out += [layer.input_layernorm.weight, layer.post_attention_layernorm.weight]
        return [*out, self.model.norm.weight]

    def _fused_stack(self, plan: _Groups | None, pos: Tensor) -> LlamaStack | None:
        """The fused-step stack where a step's linear groups are the quantized blocks
        (``plan``, from :meth:`_linear_plan`: its checks hold for them) and
        :attr:`fused_step` is on; built on first use, again when a norm weight was
        replaced or changed in place (it holds copies of them), and with longer RoPE
        tables when positions ``pos`` pass the end of its own (grown as
        :meth:`_rope_tables` grows, not sized for the model's maximum at once)."""
        qz = self.quantized
        if not self.fused_step or qz is None or plan is not qz.plan:
            return None
        need = int(pos.max()) + 1
        f = self._fused
        have = 0 if f is None else f.stack.rope_positions
        if need > have:
            f = None
        if f is not None and f.quantized is qz:
            if f.registrations != _registrations:
                norms = self._norm_weights()
                if len(norms) == len(f.norms) and all(
                    a is b for a, b in zip(norms, f.norms, strict=True)
                ):
                    f.registrations = _registrations
            if f.registrations == _registrations and [_version(t) for t in f.norms] == f.versions:
                return f.stack
        self._fused = None
        norms = self._norm_weights()
        if any(n.dtype != torch.float32 or n.device.type != "cpu" for n in norms):
            return None
        c = self.config
        hd = c.head_dim or 0
        # The tables of _rope_tables (a position's values do not depend on the length).
        n = max(need, min(c.max_position_embeddings, max(256, 2 * have)))
        cos, sin = rope_cos_sin(torch.arange(n), hd, c.rope_theta, torch.float32)
        sin = torch.cat((-sin[:, : hd // 2], sin[:, hd // 2 :]), dim=-1)
        mats = [m for m, _ in qz.plan]
        if not all(isinstance(m, QuantMatrix) for m in mats):
            return None
        dims = (
            c.hidden_size,
            c.intermediate_size,
            c.num_hidden_layers,
            c.num_attention_heads,
            c.num_key_value_heads,
            hd,
            c.vocab_size,
        )
        stack = LlamaStack(
            dims,
            c.rms_norm_eps,
            cast(list[QuantMatrix], mats),
            [None if b is None else b.detach().contiguous().numpy() for _, b in qz.plan],
            [n.detach().contiguous().numpy() for n in norms],
            cos.contiguous().numpy(),
            sin.contiguous().numpy(),
        )
        vers = [_version(t) for t in norms]
        self._fused = _Fused(qz, norms, vers, _registrations, stack)
        return stack

    def release_plain_linears(self) -> int:
        """Pack the decoder's linear layers and the LM head (as the packed paths do), then
        free the plain float copies of their weights, one group at a time (the peak holds one
        group twice, not the model): the model keeps one copy of them, the packed one. The
        embedding keeps its plain weight (the token lookup reads it; a tied LM head's packed
        copy stays beside it). Returns the bytes freed; 0 where packing does not apply.
        Whatever needs the plain weights again (:attr:`packed_linear` off, autograd, a weight
        replaced, ``.to()``, :meth:`state_dict`, :meth:`load_state_dict` on this module) first
        restores them, bit for bit, from the packed copies (:meth:`restore_plain_linears`).
        Reading or changing a released weight directly is not supported: restore first."""
        if self._released or not self.packed_linear:
            return 0
        with torch.no_grad():
            plan = self._decode_plan(release=True)
        if plan is None:
            return 0
        if not self._hooked:  # restore before the module's state is read or loaded
            self.register_state_dict_pre_hook(_restore_hook)  # type: ignore[no-untyped-call]
            self.register_load_state_dict_pre_hook(_restore_hook)  # type: ignore[no-untyped-call]
            self._hooked = True
        return sum(m.out_features * m.in_features * 4 for m, _, _ in self._released)  # float32

    def _release_group(self, j: int, mods: tuple[nn.Linear, ...]) -> None:
        off = 0
        for mod in mods:
            w = mod.weight
            self._released.append((mod, j, off))
            off += w.shape[0]
            w.data = w.data.new_empty((0, w.shape[1]))  # keeps identity and version

    def restore_plain_linears(self) -> None:
        """Undo :meth:`release_plain_linears`: the plain weights again, equal bit for bit to
        those packed (oneDNN's reorder back to the plain layout)."""
        if not self._released:
            return
        if self not in _plans:  # a copy (deepcopy, pickle) of a released model
            raise ConfigError("this model's plain linear weights were released and not copied")
        plan = _plans[self][2]
        dense: dict[int, Tensor] = {}
        with torch.no_grad():
            for mod, j, off in self._released:
                if j not in dense:
                    dense[j] = plan[j][0].to_dense()
                n = mod.out_features
                mod.weight.data = dense[j][off : off + n].clone()
        self._released = []

    def _apply(self, fn: Any, recurse: bool = True) -> LlamaModel:  # .to(), .double(), ...
        # Conversions swap a parameter's data in place (same tensor, same version counter):
        # the packed copies would look current, so they go.
        self.restore_plain_linears()
        for ws, bs in self._linear_groups():
            held = [*ws, *(b for b in bs if b is not None)]
            _packed.pop(tuple(id(t) for t in held), None)
        _plans.pop(self, None)
        self.quantized = None  # the conversion may change the weights' values or dtype
        self._fused = None
        return cast(LlamaModel, super()._apply(fn, recurse))  # type: ignore[no-untyped-call]

    def _proj(
        self, x: Tensor, plan: _Groups | None, j: int, *mods: nn.Linear
    ) -> tuple[Tensor, ...]:
        """The linear layers ``mods`` (group ``j`` of :meth:`_linear_groups`) on ``x``: one
        packed oneDNN call with a ``plan``, else plain ``F.linear`` calls."""
        if plan is None:
            return self._lin(x, *mods, packed=False)
        out = _pointwise(x, plan[j], self.numeric)
        if len(mods) == 1:
            return (out,)
        return tuple(torch.split(out, [m.out_features for m in mods], dim=-1))

    def _mlp(self, mlp: MLP, x: Tensor, plan: _Groups | None, i: int) -> Tensor:
        g, u = self._proj(x, plan, 4 * i + 2, mlp.gate_proj, mlp.up_proj)
        return self._proj(nn.functional.silu(g) * u, plan, 4 * i + 3, mlp.down_proj)[0]

    def _head(self, x: Tensor, plan: _Groups | None) -> Tensor:
        if plan is not None:
            return _pointwise(x, plan[-1], self.numeric)
        w = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return linears(x, [w], [None], packed=False)[0]

    # -- target protocol -----------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def max_positions(self) -> int:
        return self.config.max_position_embeddings

    @property
    def device(self) -> torch.device:
        return self.model.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.embed_tokens.weight.dtype

    def new_cache(self, max_len: int | None = None) -> DenseKVCache:
        """A dense cache sized for this model (``max_len`` defaults to the model maximum)."""
        c = self.config
        return DenseKVCache(
            c.num_hidden_layers,
            c.num_key_value_heads,
            c.head_dim or 0,
            max_len or c.max_position_embeddings,
            dtype=self.dtype,
            device=self.device,
        )

    @torch.no_grad()
    def forward(
        self,
        input_ids: Tensor,
        position_ids: Tensor,
        cache: KVCache,
        mask: Tensor | None = None,
        *,
        hidden: HiddenCapture | None = None,
    ) -> Tensor:
        """Tokens ``[T]`` at positions ``[T]`` attending to the cache's committed prefix plus
        this step's tokens under ``mask`` ``[T, committed + T]`` (bool, True = visible;
        ``None`` = causal). Returns logits ``[T, vocab]``; the step stays pending in
        ``cache``. ``hidden``: hidden states to keep from this forward (its ``states``
        ``[T, width]`` after the call)."""
        return self._step(
            input_ids,
            position_ids,
            cache,
            mask,
            packed=self.packed_linear,
            last=False,
            hidden=hidden,
        )

    @torch.no_grad()
    def forward_last(self, input_ids: Tensor, position_ids: Tensor, cache: KVCache) -> Tensor:
        """:meth:`forward` with the causal mask, returning only the last token's logits
        ``[vocab]`` (a prefill: the LM head runs on one row) and with the decode paths'
        linear layers (:attr:`packed_linear`)."""
        out = self._step(input_ids, position_ids, cache, None, packed=self.packed_linear, last=True)
        return out[0]

    def _step(
        self,
        input_ids: Tensor,
        position_ids: Tensor,
        cache: KVCache,
        mask: Tensor | None,
        *,
        packed: bool,
        last: bool,
        hidden: HiddenCapture | None = None,
    ) -> Tensor:
        c = self.config
        check_step_inputs(self, input_ids, position_ids, mask, cache)
        if hidden is not None:
            self.check_capture(hidden)
        if (cache.num_layers, cache.num_kv_heads, cache.head_dim) != (
            c.num_hidden_layers,
            c.num_key_value_heads,
            c.head_dim,
        ):
            raise VerifyError(
                f"cache layout (layers, kv heads, head dim) = "
                f"{(cache.num_layers, cache.num_kv_heads, cache.head_dim)} does not match the "
                f"model's {(c.num_hidden_layers, c.num_key_value_heads, c.head_dim)}"
            )
        t_new = input_ids.shape[0]
        if mask is not None and t_new == 1 and bool(mask.all()):
            mask = None  # one token seeing everything: attention needs no mask
        cache.begin(t_new)
        try:
            return self._run(input_ids, position_ids, cache, mask, packed, last, hidden)
        except BaseException:
            cache.rollback()
            raise

    def _rope_tables(self, pos: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos and sign-folded sin ``[T, D]`` (see :func:`_rope`) for positions ``pos``,
        gathered from per-position tables built once (grown as positions grow): the values
        :func:`rope_cos_sin` gives, one gather per forward instead of a trig pass."""
        c = self.config
        hd = c.head_dim or 0
        need = int(pos.max()) + 1
        tab = self._rope_tab
        if (
            tab is None
            or tab[0].shape[0] < need
            or (tab[0].dtype, tab[0].device)
            != (
                dtype,
                pos.device,
            )
        ):
            have = 0 if tab is None else tab[0].shape[0]
            n = max(need, min(c.max_position_embeddings, max(256, 2 * have)))
            cos, sin = rope_cos_sin(torch.arange(n, device=pos.device), hd, c.rope_theta, dtype)
            sin = torch.cat((-sin[:, : hd // 2], sin[:, hd // 2 :]), dim=-1)
            tab = self._rope_tab = (cos, sin)
        idx = pos.reshape(-1).long()
        return tab[0].index_select(0, idx), tab[1].index_select(0, idx)

    def _run(
        self,
        ids: torch.Tensor,
        pos: torch.Tensor,
        cache: KVCache,
        mask: torch.Tensor | None,
        pk: bool,
        last: bool,
        hidden: HiddenCapture | None,
    ) -> torch.Tensor:
        """``mask`` None: causal."""
        t_new = ids.shape[0]
        plan = self._linear_plan(pk, t_new)  # None: plain F.linear calls
        stack = self._fused_stack(plan, pos)
        kv = None if stack is None else single_kv(cache, t_new)
        if stack is not None and kv is not None:
            logits, states = run_step(
                stack,
                self.model.embed_tokens.weight,
                ids,
                pos,
                kv,
                None if mask is None else mask[None],
                last=last,
                hidden=hidden,
                vocab=self.config.vocab_size,
                numeric=self.numeric,
            )
            if hidden is not None:
                hidden.states = states
            return logits
        if mask is None and t_new > 1:
            mask = causal_mask(cache.committed_len, t_new, self.device)
        with _kernel_threads(plan, self.kernel_torch_threads):
            return self._run_plan(ids, pos, cache, mask, plan, last, hidden)

    def _run_plan(
        self,
        ids: torch.Tensor,
        pos: torch.Tensor,
        cache: KVCache,
        mask: torch.Tensor | None,
        plan: _Groups | None,
        last: bool,
        hidden: HiddenCapture | None,
    ) -> torch.Tensor:
        c = self.config
        hd = c.head_dim or 0
        t_new = ids.shape[0]
        x = self.model.embed_tokens(ids.long())
        cos, sin = self._rope_tables(pos, x.dtype)
        cos, sin = cos[:, None], sin[:, None]  # broadcast over heads: [T, 1, D]
        kept: list[torch.Tensor] = []
        silu, keep = nn.functional.silu, () if hidden is None else hidden.layers
        hq, hkv = c.num_attention_heads, c.num_key_value_heads
        nqk = hq + hkv
        backend, inter = self.backend, c.intermediate_size
        for i, layer in enumerate(self.model.decoder_layers()):
            a, m = layer.self_attn, layer.mlp
            h = _norm(x, layer.input_layernorm)
            # One [T, Hq + 2 Hkv, D] projection; RoPE on the q and k heads in one go.
            if plan is None:
                qkv = self._lin(h, a.q_proj, a.k_proj, a.v_proj, packed=False, cat=True)[0]
            else:  # the packed q/k/v come out concatenated
                qkv = _pointwise(h, plan[4 * i], self.numeric)
            qkv = qkv.view(t_new, nqk + hkv, hd)
            qk = _rope(qkv[:, :nqk], cos, sin)
            k_all, v_all = cache.append(i, qk[:, hq:].transpose(0, 1), qkv[:, nqk:].transpose(0, 1))
            o = attend(
                qk[None, :, :hq].transpose(1, 2),
                k_all[None],
                v_all[None],
                mask,
                backend=backend,
                checked=i > 0,
                fallback=self._flex,
            )
            o = o[0].transpose(0, 1).reshape(t_new, hq * hd)
            if plan is None:
                x = x + self._lin(o, a.o_proj, packed=False)[0]
                x = x + self._mlp(m, _norm(x, layer.post_attention_layernorm), None, i)
            else:
                x = x + _pointwise(o, plan[4 * i + 1], self.numeric)
                h = _norm(x, layer.post_attention_layernorm)
                gu = _pointwise(
                    h, plan[4 * i + 2], self.numeric
                )  # narrow: cheaper than torch.split
                g, u = gu.narrow(-1, 0, inter), gu.narrow(-1, inter, inter)
                x = x + _pointwise(silu(g) * u, plan[4 * i + 3], self.numeric)
            if i in keep:
                kept.append(x)
        x = self.model.norm(x)
        self._keep_hidden(hidden, kept, x)
        return self._head(x[-1:] if last else x, plan)

    @torch.no_grad()
    def forward_batch(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        caches: Sequence[KVCache],
        mask: torch.Tensor,
        *,
        hidden: HiddenCapture | None = None,
    ) -> torch.Tensor:
        """R sequences (one cache each) in one forward: ``input_ids``/``position_ids``
        ``[R, T]`` and ``mask`` ``[R, T, P_max + T]`` laid out as
        :func:`specdec.tree.batch_tree_inputs` does (row r's prefix in columns
        ``[0, committed_r)``, then the step's T tokens). Returns logits ``[R, T, vocab]``;
        each cache's step stays pending. ``hidden``: as in :meth:`forward` (``states``
        ``[R, T, width]``)."""
        if hidden is not None:
            self.check_capture(hidden)
        if not isinstance(input_ids, torch.Tensor) or not isinstance(position_ids, torch.Tensor):
            raise SpecdecTypeError("input_ids and position_ids must be torch.Tensors")
        if input_ids.dim() != 2 or position_ids.shape != input_ids.shape:
            raise VerifyError(
                f"input_ids {tuple(input_ids.shape)} and position_ids "
                f"{tuple(position_ids.shape)} must both be [R, T]"
            )
        r, t_new = input_ids.shape
        if r == 0 or len(caches) != r:
            raise VerifyError(f"need one cache per row: {r} rows, {len(caches)} caches")
        p_max = max(cache.committed_len for cache in caches)
        for i, cache in enumerate(caches):
            check_step_inputs(self, input_ids[i], position_ids[i], None, cache)
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            raise SpecdecTypeError("mask must be a bool torch.Tensor (True = visible)")
        if tuple(mask.shape) != (r, t_new, p_max + t_new) or mask.device != self.device:
            raise VerifyError(
                f"mask must be [R, T, P_max + T] = {[r, t_new, p_max + t_new]} on "
                f"{self.device}, got {tuple(mask.shape)} on {mask.device}"
            )
        begun: list[KVCache] = []
        try:
            for cache in caches:
                cache.begin(t_new)
                begun.append(cache)
            return self._run_batch(input_ids, position_ids, caches, mask, p_max, hidden)
        except BaseException:
            for cache in begun:
                cache.rollback()
            raise

    def _run_batch(
        self,
        ids: torch.Tensor,
        pos: torch.Tensor,
        caches: Sequence[KVCache],
        mask: torch.Tensor,
        p_max: int,
        hidden: HiddenCapture | None,
    ) -> torch.Tensor:
        plan = self._linear_plan(self.packed_linear, ids.numel())  # None: F.linear calls
        stack = self._fused_stack(plan, pos)
        r, t_new = ids.shape
        kv = None if stack is None else batch_kv(caches, t_new, p_max)
        if stack is not None and kv is not None:
            logits, states = run_step(
                stack,
                self.model.embed_tokens.weight,
                ids,
                pos,
                kv,
                mask,
                last=False,
                hidden=hidden,
                vocab=self.config.vocab_size,
                numeric=self.numeric,
            )
            if hidden is not None:
                hidden.states = None if states is None else states.view(r, t_new, -1)
            return logits.view(r, t_new, -1)
        with _kernel_threads(plan, self.kernel_torch_threads):
            return self._run_batch_plan(ids, pos, caches, mask, p_max, plan, hidden)

    def _run_batch_plan(
        self,
        ids: torch.Tensor,
        pos: torch.Tensor,
        caches: Sequence[KVCache],
        mask: torch.Tensor,
        p_max: int,
        plan: _Groups | None,
        hidden: HiddenCapture | None,
    ) -> torch.Tensor:
        c = self.config
        hd = c.head_dim or 0
        r, t_new = ids.shape
        x = self.model.embed_tokens(ids.long())  # [R, T, hidden]
        cos, sin = self._rope_tables(pos, x.dtype)
        cos, sin = cos.view(r, 1, t_new, hd), sin.view(r, 1, t_new, hd)
        lens = [cache.committed_len for cache in caches]
        kept: list[torch.Tensor] = []
        keep = () if hidden is None else hidden.layers
        for i, layer in enumerate(self.model.decoder_layers()):
            a = layer.self_attn
            h = layer.input_layernorm(x)
            q, k, v = self._proj(h, plan, 4 * i, a.q_proj, a.k_proj, a.v_proj)
            q = q.view(r, t_new, a.h, hd).transpose(1, 2)
            k = k.view(r, t_new, a.hkv, hd).transpose(1, 2)
            v = v.view(r, t_new, a.hkv, hd).transpose(1, 2)
            q, k = _rope(q, cos, sin), _rope(k, cos, sin)
            # Each cache returns its own [prefix + step] K/V; pad prefixes to P_max (the
            # mask hides the padding columns).
            kk = k.new_zeros(r, a.hkv, p_max + t_new, hd)
            vv = v.new_zeros(r, a.hkv, p_max + t_new, hd)
            for j, cache in enumerate(caches):
                k_all, v_all = cache.append(i, k[j], v[j])
                n = lens[j]
                kk[j, :, :n], kk[j, :, p_max:] = k_all[:, :n], k_all[:, n:]
                vv[j, :, :n], vv[j, :, p_max:] = v_all[:, :n], v_all[:, n:]
            o = attend(q, kk, vv, mask, backend=self.backend, fallback=self._flex)
            o = o.transpose(1, 2).reshape(r, t_new, a.h * hd)
            x = x + self._proj(o, plan, 4 * i + 1, a.o_proj)[0]
            x = x + self._mlp(layer.mlp, layer.post_attention_layernorm(x), plan, i)
            if i in keep:
                kept.append(x)
        x = self.model.norm(x)
        self._keep_hidden(hidden, kept, x)
        return self._head(x, plan)

    @torch.no_grad()
    def forward_paged(
        self, input_ids: Tensor, position_ids: Tensor, caches: Sequence[PagedKVCache]
    ) -> Tensor:
        """One new token for each of R sequences of one :class:`~specdec.cache.PagedKVPool`
        (beams, or independent requests) in one forward: ``input_ids`` / ``position_ids``
        ``[R]``, row r attending to ``caches[r]``'s committed prefix and its own token.
        Every layer does one scatter of the new K/V and one gather by the rows' block
        tables, whatever R is. Returns logits ``[R, vocab]``; each cache's step stays
        pending (``pool.commit_decode(caches)`` or ``pool.rollback_decode(caches)``)."""
        for name, t in (("input_ids", input_ids), ("position_ids", position_ids)):
            if not isinstance(t, torch.Tensor) or t.dtype not in (torch.int64, torch.int32):
                raise SpecdecTypeError(f"{name} must be an int64/int32 torch.Tensor")
            if t.dim() != 1 or t.device != self.device:
                raise VerifyError(f"{name} must be 1-D [R] on {self.device}")
        r = input_ids.shape[0]
        if r == 0 or position_ids.shape[0] != r or len(caches) != r:
            raise VerifyError(
                f"need one token, position and cache per row: {r} tokens, "
                f"{position_ids.shape[0]} positions, {len(caches)} caches"
            )
        if any(not isinstance(c, PagedKVCache) for c in caches):
            raise SpecdecTypeError("forward_paged takes PagedKVCache sequences")
        c = self.config
        pool = caches[0].pool
        if (pool.num_layers, pool.num_kv_heads, pool.head_dim) != (
            c.num_hidden_layers,
            c.num_key_value_heads,
            c.head_dim,
        ):
            raise VerifyError("the pool's layout does not match the model's")
        lo, hi = int(input_ids.min()), int(input_ids.max())
        if lo < 0 or hi >= c.vocab_size:
            raise VerifyError(f"token ids must be in [0, {c.vocab_size}), got [{lo}, {hi}]")
        pmin, pmax = int(position_ids.min()), int(position_ids.max())
        if pmin < 0 or pmax >= c.max_position_embeddings:
            raise VerifyError(
                f"positions must be in [0, {c.max_position_embeddings}), got [{pmin}, {pmax}]"
            )
        step = pool.begin_decode(caches)
        try:
            return self._run_paged(input_ids, position_ids, pool, step)
        except BaseException:
            pool.rollback_decode(caches)
            raise

    def _run_paged(
        self, ids: Tensor, pos: Tensor, pool: PagedKVPool, step: PagedDecodeStep
    ) -> Tensor:
        plan = self._linear_plan(self.packed_linear, ids.shape[0])  # None: F.linear calls
        stack = self._fused_stack(plan, pos)
        pkv = None if stack is None else pool_kv(pool)
        if stack is not None and pkv is not None:
            table = step.table.numpy()
            kv = StepKV(
                [pkv], np.zeros(len(table), dtype=np.int64), table, step.new_slots.numpy()[:, None]
            )
            logits, _ = run_step(
                stack,
                self.model.embed_tokens.weight,
                ids,
                pos,
                kv,
                step.mask[:, None],
                last=False,
                hidden=None,
                vocab=self.config.vocab_size,
                numeric=self.numeric,
            )
            return logits
        with _kernel_threads(plan, self.kernel_torch_threads):
            return self._run_paged_plan(ids, pos, pool.k_slots, pool.v_slots, step, plan)

    def _run_paged_plan(
        self,
        ids: Tensor,
        pos: Tensor,
        k_slots: Tensor,
        v_slots: Tensor,
        step: PagedDecodeStep,
        plan: _Groups | None,
    ) -> Tensor:
        c = self.config
        hd = c.head_dim or 0
        r = ids.shape[0]
        x = self.model.embed_tokens(ids.long())[:, None]  # [R, 1, hidden]
        cos, sin = self._rope_tables(pos, x.dtype)
        cos, sin = cos.view(r, 1, hd), sin.view(r, 1, hd)
        mask: Tensor | None = step.mask[:, None]  # [R, 1, S]
        if mask is not None and bool(mask.all()):
            mask = None  # every row sees its whole table (equal lengths): no mask needed
        flat = step.table.reshape(-1)
        silu = nn.functional.silu
        for i, layer in enumerate(self.model.decoder_layers()):
            a, m = layer.self_attn, layer.mlp
            h = layer.input_layernorm(x)
            # One [R, Hq + 2 Hkv, D] projection; RoPE on the q and k heads in one go.
            if plan is None:
                qkv = self._lin(h, a.q_proj, a.k_proj, a.v_proj, packed=False, cat=True)[0]
            else:  # the packed q/k/v come out concatenated
                qkv = _pointwise(h, plan[4 * i], self.numeric)
            qkv = qkv.view(r, a.h + 2 * a.hkv, hd)
            qk = qkv[:, : a.h + a.hkv]
            qk = _rope(qk, cos, sin)
            q = qk[:, : a.h, None]  # [R, Hq, 1, D]
            ks, vs = k_slots[i], v_slots[i]
            ks[step.new_slots] = qk[:, a.h :].to(ks.dtype)
            vs[step.new_slots] = qkv[:, a.h + a.hkv :].to(vs.dtype)
            # [R, S, Hkv, D] -> [R, Hkv, S, D]: beams sharing a prefix block read the same slots
            # (index_select: one flat gather, cheaper than advanced indexing).
            kk = ks.index_select(0, flat).view(r, -1, a.hkv, hd).transpose(1, 2)
            vv = vs.index_select(0, flat).view(r, -1, a.hkv, hd).transpose(1, 2)
            if kk.dtype != q.dtype:
                kk, vv = kk.to(q.dtype), vv.to(q.dtype)
            o = attend(q, kk, vv, mask, backend=self.backend, checked=i > 0, fallback=self._flex)
            o = o.transpose(1, 2).reshape(r, 1, a.h * hd)
            if plan is None:
                x = x + self._lin(o, a.o_proj, packed=False)[0]
                x = x + self._mlp(m, layer.post_attention_layernorm(x), None, i)
            else:
                x = x + _pointwise(o, plan[4 * i + 1], self.numeric)
                gu = _pointwise(layer.post_attention_layernorm(x), plan[4 * i + 2], self.numeric)
                n = m.gate_proj.out_features
                g, u = gu.narrow(-1, 0, n), gu.narrow(-1, n, n)
                x = x + _pointwise(silu(g) * u, plan[4 * i + 3], self.numeric)
        x = self.model.norm(x[:, 0])
        return self._head(x, plan)

    def init_random(self, seed: int = 0, std: float = 0.3) -> LlamaModel:
        """Random weights (deterministic per seed), large enough that logits are far from
        uniform, for tests and benchmarks."""
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("layernorm.weight") or name.endswith("norm.weight"):
                    p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g, dtype=torch.float64))
                else:
                    fan = p.shape[-1] if p.dim() > 1 else 1
                    s = std if p.dim() == 1 or "embed" in name else 1.0 / math.sqrt(fan)
                    p.copy_(s * torch.randn(p.shape, generator=g, dtype=torch.float64))
        return self


def load_checkpoint(
    path: str | Path,
    *,
    dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
    backend: Backend = "auto",
) -> LlamaModel:
    """Load a local Llama/Qwen2-format checkpoint directory (``config.json`` and one or more
    ``*.safetensors`` files). ``dtype`` defaults to the config's ``torch_dtype``/``dtype``
    (float32 if absent)."""
    from safetensors.torch import load_file

    d = Path(path)
    cfg_path = d / "config.json"
    if not cfg_path.is_file():
        raise CheckpointError(f"no config.json in {d}")
    cfg = json.loads(cfg_path.read_text())
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"no *.safetensors files in {d}")
    config = LlamaConfig.from_hf(cfg)
    if dtype is None:
        name = cfg.get("dtype") or cfg.get("torch_dtype") or "float32"
        dtype = getattr(torch, str(name).replace("torch.", ""), None)
        if not isinstance(dtype, torch.dtype):
            raise CheckpointError(f"unknown checkpoint dtype {name!r}")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    with torch.device("meta"):
        model = LlamaModel(config, backend=backend)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    expected = set(shapes)
    missing = sorted(expected - set(state))
    unexpected = sorted(k for k in set(state) - expected if "rotary_emb" not in k)
    if missing or unexpected:
        raise CheckpointError(
            f"checkpoint {d} does not match the config: missing {missing[:5]}, "
            f"unexpected {unexpected[:5]}"
        )
    for k in expected:
        if tuple(state[k].shape) != shapes[k]:
            raise CheckpointError(
                f"{k}: checkpoint shape {tuple(state[k].shape)}, expected {shapes[k]}"
            )
    model.load_state_dict(
        {k: state[k].to(device=device, dtype=dtype) for k in expected}, assign=True
    )
    return model.eval()
