"""Packed linear layers (oneDNN) and the process-wide count of parameter registrations that
tells a model's packed plan when to look at its weights again.

On the CPU a float32 ``F.linear`` goes to the BLAS (MKL in the stock wheels), which repacks
the weight on every call and, on non-Intel CPUs, runs a slow generic path: at the few rows
of a decode step it reads the weights far below memory bandwidth. oneDNN's linear on a
weight packed once (what ``torch.compile``'s CPU freezing uses) does the same product 2-4x
faster. Layers that read the same input (q/k/v, gate/up) are packed as one weight, one call
(the same sums: each output column is its own dot product). The packed copies live beside
the parameters (twice the weight memory; ``LlamaModel.release_plain_linears`` frees the
plain ones) and are rebuilt when a weight changes (its version counter) or is replaced;
they go with the weights.
"""

from __future__ import annotations

import operator
import weakref
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["linears", "registrations"]

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


_get_version = operator.attrgetter("_version")


def _versions(ts: Sequence[Tensor]) -> list[int]:
    """:func:`_version` of each of ``ts``, in one C-level pass where none is an
    inference-mode tensor: a step checks about 120 weights, and the Python loop over them
    was a tenth of a step's host work."""
    try:
        return list(map(_get_version, ts))
    except RuntimeError:
        return [_version(t) for t in ts]


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


def registrations() -> int:
    """The registrations counted so far (see :func:`_watch_registrations`)."""
    return _registrations
