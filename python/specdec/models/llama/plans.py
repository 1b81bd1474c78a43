"""A step's linear groups: the oneDNN-packed weights of the decoder's linear layers, or the
GGUF blocks kept for steps of few rows, and the fused-step stack built on the blocks.
:class:`LinearPlans` is the part of :class:`~specdec.models.llama.LlamaModel` that keeps
them current with the weights (replaced, changed in place, converted, released)."""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import torch
from torch import Tensor, nn

from ..._core import LlamaStack, QuantMatrix
from ...errors import ConfigError
from ..quant import (
    NUMERIC_MODES,
    Numeric,
    QuantBlocks,
    QuantizedLinears,
    kernel_available,
    quant_matmul,
    stack,
    torch_threads,
)
from .config import LlamaConfig
from .layers import Backbone, rope_cos_sin
from .packing import (
    _PACK_OK,
    _cat_bias,
    _pack,
    _packed,
    _version,
    _versions,
    _watch_registrations,
    linears,
    registrations,
)

__all__ = ["LinearPlans"]

_P = TypeVar("_P", bound="LinearPlans")

_Packs = list[tuple[Tensor, Tensor | None]]
# A step's linear groups: oneDNN-packed weights, or the GGUF blocks (see ``quant``).
_Groups = Sequence[tuple[Tensor | QuantMatrix, Tensor | None]]
# (weights, their versions, packed groups, the registration count when it was checked)
_Plan = tuple[list[Tensor], list[int], _Packs, int]
# Per model: the weights a decode step reads, their versions, and their packed groups.
_plans: weakref.WeakKeyDictionary[nn.Module, _Plan] = weakref.WeakKeyDictionary()


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


def _restore_hook(module: LinearPlans, *_: object) -> None:
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


class LinearPlans(nn.Module):
    """The linear-group bookkeeping of a Llama model (its attributes are set by
    :class:`~specdec.models.llama.LlamaModel`'s constructor)."""

    config: LlamaConfig
    model: Backbone
    lm_head: nn.Linear | None
    packed_linear: bool
    quantized: QuantizedLinears | None
    quant_linear: bool
    quant_max_rows: int
    fused_step: bool
    _fused: _Fused | None
    _numeric: Numeric
    _released: list[tuple[nn.Linear, int, int]]
    _hooked: bool

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

    @property
    def device(self) -> torch.device:
        return self.model.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.embed_tokens.weight.dtype

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
            and plan[3] == registrations()
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
            _plans[self] = (held, vers, plan[2], registrations())
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
        _plans[self] = (held, vers, packs, registrations())
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
        self.quantized = QuantizedLinears(plan, held, vers, registrations())
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
        if _versions(qz.held) != qz.versions:
            self.quantized = None  # a weight changed in place: the blocks no longer match
            return None
        if qz.registrations != registrations():  # something was (re)assigned somewhere
            held = [t for ws, bs in self._linear_groups() for t in (*ws, *bs) if t is not None]
            if len(held) != len(qz.held) or any(
                a is not b for a, b in zip(held, qz.held, strict=True)
            ):
                self.quantized = None  # a weight was replaced
                return None
            qz.registrations = registrations()
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
            if f.registrations != registrations():
                norms = self._norm_weights()
                if len(norms) == len(f.norms) and all(
                    a is b for a, b in zip(norms, f.norms, strict=True)
                ):
                    f.registrations = registrations()
            if f.registrations == registrations() and _versions(f.norms) == f.versions:
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
        self._fused = _Fused(qz, norms, vers, registrations(), stack)
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

    def _apply(self: _P, fn: Any, recurse: bool = True) -> _P:  # .to(), .double(), ...
        # Conversions swap a parameter's data in place (same tensor, same version counter):
        # the packed copies would look current, so they go.
        self.restore_plain_linears()
        for ws, bs in self._linear_groups():
            held = [*ws, *(b for b in bs if b is not None)]
            _packed.pop(tuple(id(t) for t in held), None)
        _plans.pop(self, None)
        self.quantized = None  # the conversion may change the weights' values or dtype
        self._fused = None
        return cast(_P, super()._apply(fn, recurse))  # type: ignore[no-untyped-call]

    def _head(self, x: Tensor, plan: _Groups | None) -> Tensor:
        if plan is not None:
            return _pointwise(x, plan[-1], self.numeric)
        w = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return linears(x, [w], [None], packed=False)[0]
