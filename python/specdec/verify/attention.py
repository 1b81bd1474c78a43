"""Packed tree attention: every tree node attends to the committed prefix and its own
ancestors (itself included), never to siblings or cousins, in one call.

Shapes (``B`` = trees in the batch, ``Hq`` query heads, ``Hkv`` K/V heads with
``Hq % Hkv == 0`` for GQA, ``P`` prefix length, ``N`` tree nodes, ``D`` head dim)::

    q                  [B, Hq, N, D]
    k_prefix, v_prefix [B, Hkv, P, D]     committed, read-only
    k_tree, v_tree     [B, Hkv, N, D]     this step's tentative K/V
    mask               [N, P+N] or [B, N, P+N] bool (True = visible)
    output             [B, Hq, N, D]

Backends: ``"sdpa"`` (``scaled_dot_product_attention`` with the bool mask; any device),
``"flex"`` (``flex_attention`` with a block mask built from the tree mask; CUDA, compiled) and
``"math"`` (plain matmul/softmax, the reference). ``"auto"`` picks flex on CUDA when it is
available and falls back to SDPA otherwise (or when flex fails).

A batch of R trees is padded to one budget (:func:`specdec.tree.batch_tree_inputs`): padding
nodes see only themselves and padding prefix slots are invisible, so no row is ever fully
masked.
"""

from __future__ import annotations

import math
import weakref
from typing import Any, Literal

import torch
import torch.nn.functional as F

from ..errors import SpecdecTypeError, VerifyError

__all__ = [
    "Backend",
    "FlexFallback",
    "attend",
    "tree_attention",
    "flex_available",
]

Backend = Literal["auto", "sdpa", "flex", "math"]

_flex_fn: Any = None  # compiled flex_attention, built once on first CUDA use


class FlexFallback:
    """What ``backend="auto"`` learnt for one caller (a model): after flex attention failed
    once (no kernel for a shape or build), its later calls go straight to SDPA. Kept per
    object, so one model's failure never switches another off."""

    def __init__(self) -> None:
        self.flex_failed = False


def flex_available() -> bool:
    """True when ``torch.nn.attention.flex_attention`` can be imported."""
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except Exception:
        return False
    return True


def check_bool_mask(mask: object) -> None:
    """A mask must be a bool tensor (True = visible)."""
    if not isinstance(mask, torch.Tensor):
        raise SpecdecTypeError(f"mask must be a torch.Tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise SpecdecTypeError(f"mask must be bool (True = visible), got {mask.dtype}")


def _check_attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise SpecdecTypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise VerifyError(f"{name} must be 4-D [B, H, L, D], got shape {tuple(t.shape)}")
        if not t.is_floating_point():
            raise SpecdecTypeError(f"{name} must be floating point, got {t.dtype}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise SpecdecTypeError(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    if k.device != q.device or v.device != q.device:
        raise VerifyError(f"q, k, v devices differ: {q.device}, {k.device}, {v.device}")
    b, hq, n, d = q.shape
    if k.shape != v.shape:
        raise VerifyError(f"k {tuple(k.shape)} and v {tuple(v.shape)} shapes differ")
    if k.shape[0] != b or k.shape[3] != d:
        raise VerifyError(f"k/v {tuple(k.shape)} do not match q {tuple(q.shape)} in batch/head dim")
    hkv = k.shape[1]
    if hkv == 0 or hq % hkv:
        raise VerifyError(f"query heads {hq} must be a multiple of K/V heads {hkv}")
    if n == 0:
        raise VerifyError("no query tokens (empty tree)")
    if mask is not None:
        check_bool_mask(mask)
        if mask.device != q.device:
            raise VerifyError(f"mask is on {mask.device}, q on {q.device}")
        s = k.shape[2]
        if mask.dim() == 2:
            ok = tuple(mask.shape) == (n, s)
        elif mask.dim() == 3:
            ok = tuple(mask.shape) == (b, n, s) or tuple(mask.shape) == (1, n, s)
        else:
            ok = False
        if not ok:
            raise VerifyError(
                f"mask must be [N, S] or [B, N, S] = [{b}, {n}, {s}], got {tuple(mask.shape)}"
            )


def _math(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> torch.Tensor:
    rep = q.shape[1] // k.shape[1]
    if rep > 1:
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    scores = (q @ k.transpose(-2, -1)) * scale
    if mask is not None:
        m = mask if mask.dim() == 2 else mask[:, None]
        scores = scores.masked_fill(~m, -math.inf)
    return torch.softmax(scores, dim=-1) @ v


def _sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> torch.Tensor:
    m = None if mask is None else (mask if mask.dim() == 2 else mask[:, None])
    rep = q.shape[1] // k.shape[1]
    if rep > 1:
        try:
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=m, scale=scale, enable_gqa=True
            )
        except TypeError:  # torch without enable_gqa
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=scale)


_block_cache: tuple[Any, int, Any] | None = None  # (weakref to mask, version, BlockMask)


def _block_mask(mask: torch.Tensor, n: int, s: int) -> Any:
    """The flex block mask of a dense ``[N, S]`` / ``[B, N, S]`` bool mask. A model passes
    the same mask object to every layer: the last one is cached while that very tensor is
    alive and unmodified (a weak reference, not its address, which the allocator reuses)."""
    global _block_cache
    from torch.nn.attention.flex_attention import create_block_mask

    c = _block_cache
    if c is not None and c[0]() is mask and c[1] == mask._version:
        return c[2]
    m3 = mask if mask.dim() == 3 else mask[None]
    mb = m3.shape[0]

    # Whole blocks that are fully masked (far-apart subtrees, padding) are skipped.
    def mask_mod(bi: Any, h: Any, qi: Any, ki: Any) -> Any:
        return m3[bi if mb > 1 else 0, qi, ki]

    block = create_block_mask(mask_mod, mb if mb > 1 else None, None, n, s, device=m3.device)
    _block_cache = (weakref.ref(mask), mask._version, block)
    return block


def _flex(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> torch.Tensor:
    global _flex_fn
    from torch.nn.attention.flex_attention import flex_attention

    n, s = q.shape[2], k.shape[2]
    if mask is None:
        mask = torch.ones(n, s, dtype=torch.bool, device=q.device)
    block = _block_mask(mask, n, s)
    if _flex_fn is None:
        _flex_fn = torch.compile(flex_attention, dynamic=True) if q.is_cuda else flex_attention
    rep = q.shape[1] // k.shape[1]
    out: torch.Tensor = _flex_fn(q, k, v, block_mask=block, scale=scale, enable_gqa=rep > 1)
    return out


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    *,
    scale: float | None = None,
    backend: Backend = "auto",
    checked: bool = False,
    fallback: FlexFallback | None = None,
) -> torch.Tensor:
    """Attention of ``q [B, Hq, N, D]`` over already concatenated ``k, v [B, Hkv, S, D]``
    with a bool ``mask`` ``[N, S]`` / ``[B, N, S]`` (True = visible) or ``None`` (all
    visible). GQA when ``Hkv < Hq``. Returns ``[B, Hq, N, D]``. ``checked=True`` skips the
    argument checks (a model whose forward checked its inputs once, not per layer).
    ``fallback``: where ``"auto"`` remembers that flex attention failed (None: it tries
    flex again on the next call)."""
    if not checked:
        _check_attend(q, k, v, mask)
    sc = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if backend == "math":
        return _math(q, k, v, mask, sc)
    if backend == "sdpa":
        return _sdpa(q, k, v, mask, sc)
    if backend == "flex":
        return _flex(q, k, v, mask, sc)
    if backend != "auto":
        raise VerifyError(f"backend must be auto, sdpa, flex or math, got {backend!r}")
    if q.is_cuda and not (fallback is not None and fallback.flex_failed) and flex_available():
        try:
            return _flex(q, k, v, mask, sc)
        except Exception:  # compile/kernel unavailable for this shape or build: use SDPA
            if fallback is not None:
                fallback.flex_failed = True
    return _sdpa(q, k, v, mask, sc)


def tree_attention(
    q: torch.Tensor,
    k_prefix: torch.Tensor,
    v_prefix: torch.Tensor,
    k_tree: torch.Tensor,
    v_tree: torch.Tensor,
    mask: torch.Tensor,
    *,
    scale: float | None = None,
    backend: Backend = "auto",
) -> torch.Tensor:
    """Queries of the tree nodes against ``[committed prefix K/V + tree K/V]`` under the tree
    mask ``[N, P+N]`` or ``[B, N, P+N]`` (e.g. ``DraftTree.attention_mask(P)``). 3-D inputs
    (no batch dim) are accepted and give a 3-D output."""
    for name, t in (
        ("q", q),
        ("k_prefix", k_prefix),
        ("v_prefix", v_prefix),
        ("k_tree", k_tree),
        ("v_tree", v_tree),
    ):
        if not isinstance(t, torch.Tensor):
            raise SpecdecTypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not isinstance(mask, torch.Tensor):
        raise SpecdecTypeError(f"mask must be a torch.Tensor, got {type(mask).__name__}")
    unbatched = q.dim() == 3
    if unbatched:
        q, k_prefix, v_prefix, k_tree, v_tree = (
            t.unsqueeze(0) for t in (q, k_prefix, v_prefix, k_tree, v_tree)
        )
    dims = {t.dim() for t in (q, k_prefix, v_prefix, k_tree, v_tree)}
    if dims != {4}:
        raise VerifyError("q and all K/V must be [B, H, L, D] (or all [H, L, D])")
    if k_tree.shape[2] != q.shape[2] or v_tree.shape[2] != q.shape[2]:
        raise VerifyError(
            f"tree K/V hold {k_tree.shape[2]} nodes, queries {q.shape[2]}: they must match"
        )
    if k_prefix.shape[:2] != k_tree.shape[:2] or k_prefix.shape[3] != k_tree.shape[3]:
        raise VerifyError(
            f"prefix K {tuple(k_prefix.shape)} and tree K {tuple(k_tree.shape)} disagree"
        )
    for a, b in ((k_prefix, v_prefix), (k_tree, v_tree)):
        if a.dtype != b.dtype:
            raise SpecdecTypeError(f"K and V dtypes differ: {a.dtype}, {b.dtype}")
        if a.device != b.device or a.shape != b.shape:
            raise VerifyError("K and V must have the same shape and device")
    if k_prefix.dtype != k_tree.dtype:
        raise SpecdecTypeError(
            f"prefix K/V {k_prefix.dtype} and tree K/V {k_tree.dtype} dtypes differ"
        )
    if k_prefix.device != k_tree.device:
        raise VerifyError(f"prefix K/V on {k_prefix.device}, tree K/V on {k_tree.device}")
    k = torch.cat((k_prefix, k_tree), dim=2)
    v = torch.cat((v_prefix, v_tree), dim=2)
    out = attend(q, k, v, mask, scale=scale, backend=backend)
    return out[0] if unbatched else out
