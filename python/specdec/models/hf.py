"""Verify trees through an unmodified ``transformers`` causal LM (Llama, Qwen2, ...).

The tree goes in as one forward with a 4-D additive mask ``[1, 1, T, L+T]`` (the tree mask),
explicit ``position_ids`` (prefix + depth) and ``cache_position``; transformers passes a
prepared 4-D mask through untouched. :class:`HFKVCache` implements the
:class:`~specdec.cache.KVCache` protocol over a ``DynamicCache`` so the same
:class:`~specdec.verify.Verifier` commits: it compacts every layer's cache to the accepted path.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch

from ..cache import KVCache, check_keep
from ..errors import VerifyError
from .llama import causal_mask, check_step_inputs

__all__ = ["HFKVCache", "HFTarget"]


class HFKVCache(KVCache):
    """One sequence's K/V held in a transformers ``DynamicCache`` (batch 1)."""

    def __init__(
        self, dynamic_cache: Any, num_layers: int, num_kv_heads: int, head_dim: int, max_len: int
    ) -> None:
        self.cache = dynamic_cache
        self.num_layers, self.num_kv_heads, self.head_dim = num_layers, num_kv_heads, head_dim
        self.max_len = max_len
        self._len = 0
        self._pending = 0

    @property
    def committed_len(self) -> int:
        return self._len

    @property
    def pending(self) -> int:
        return self._pending

    def _layer(self, i: int) -> Any:
        return self.cache.layers[i]

    def begin(self, num_new: int) -> None:
        if num_new <= 0:
            raise VerifyError(f"a step needs at least one token, got {num_new}")
        if self._pending:
            raise VerifyError("the previous step was neither committed nor rolled back")
        if self._len + num_new > self.max_len:
            raise VerifyError(
                f"cache holds {self.max_len} tokens: {self._len} committed + {num_new} new "
                "do not fit"
            )
        self._pending = num_new

    def append(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # transformers appends through DynamicCache.update during its own forward; this is
        # the same operation for callers that drive the protocol directly.
        expect = (self.num_kv_heads, self._pending, self.head_dim)
        if tuple(k.shape) != expect or tuple(v.shape) != expect:
            raise VerifyError(f"append expects K/V of shape {expect}, got {tuple(k.shape)}")
        ks, vs = self.cache.update(k[None], v[None], layer)
        return ks[0], vs[0]

    def _slice(self, keep: torch.Tensor | None) -> None:
        for i in range(self.num_layers):
            lay = self._layer(i)
            if (
                not getattr(lay, "is_initialized", True)
                or lay.keys is None
                or lay.keys.numel() == 0
            ):
                continue
            ks, vs = lay.keys, lay.values
            if keep is None:
                lay.keys, lay.values = ks[:, :, : self._len], vs[:, :, : self._len]
            else:
                idx = (keep + self._len).to(ks.device)
                lay.keys = torch.cat((ks[:, :, : self._len], ks[:, :, idx]), dim=2)
                lay.values = torch.cat((vs[:, :, : self._len], vs[:, :, idx]), dim=2)

    def commit(self, keep: Sequence[int] | torch.Tensor) -> None:
        idx = check_keep(keep, self._pending)
        self._slice(idx)
        self._len += len(idx)
        self._pending = 0

    def rollback(self) -> None:
        self._slice(None)
        self._pending = 0

    def committed_kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        lay = self._layer(layer)
        if getattr(lay, "keys", None) is None or lay.keys.numel() == 0:
            empty = torch.empty(self.num_kv_heads, 0, self.head_dim)
            return empty, empty
        return lay.keys[0, :, : self._len], lay.values[0, :, : self._len]


class HFTarget:
    """A :class:`~specdec.verify.Target` over a transformers causal LM (eval mode, batch 1).
    Like :class:`~specdec.models.llama.LlamaModel`, a call begins the step in the cache."""

    def __init__(self, model: Any) -> None:
        if not hasattr(model, "config") or not callable(model):
            raise TypeError(f"model must be a transformers PreTrainedModel, got {type(model)}")
        self.model = model.eval()
        # transformers renamed ``past_key_values`` to ``cache`` and dropped ``cache_position``
        # (positions come from ``position_ids``); pass whichever this version takes.
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._pass_cache_position = "cache_position" in params
        c = model.config
        self.num_layers = int(c.num_hidden_layers)
        self.num_kv_heads = int(getattr(c, "num_key_value_heads", None) or c.num_attention_heads)
        self.head_dim = int(getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads)

    @property
    def vocab_size(self) -> int:
        return int(self.model.config.vocab_size)

    @property
    def max_positions(self) -> int:
        return int(self.model.config.max_position_embeddings)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def new_cache(self, max_len: int | None = None) -> HFKVCache:
        from transformers import DynamicCache

        return HFKVCache(
            DynamicCache(config=self.model.config),
            self.num_layers,
            self.num_kv_heads,
            self.head_dim,
            max_len or self.max_positions,
        )

    @torch.no_grad()
    def __call__(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        cache: KVCache,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        check_step_inputs(
            input_ids,
            position_ids,
            mask,
            cache,
            vocab_size=self.vocab_size,
            max_positions=self.max_positions,
            device=self.device,
        )
        if not isinstance(cache, HFKVCache):
            raise TypeError(
                f"HFTarget needs an HFKVCache (new_cache()), got {type(cache).__name__}"
            )
        t_new = input_ids.shape[0]
        prefix = cache.committed_len
        if mask is None:
            mask = causal_mask(prefix, t_new, self.device)
        dt = self.dtype
        add = torch.zeros(1, 1, t_new, prefix + t_new, dtype=dt, device=self.device)
        add.masked_fill_(~mask[None, None], torch.finfo(dt).min)
        kw: dict[str, Any] = {self._cache_kw: cache.cache}
        if self._pass_cache_position:
            kw["cache_position"] = torch.arange(prefix, prefix + t_new, device=self.device)
        cache.begin(t_new)
        try:
            out = self.model(
                input_ids=input_ids.long()[None],
                position_ids=position_ids.long()[None],
                attention_mask=add,
                use_cache=True,
                **kw,
            )
        except BaseException:
            cache.rollback()
            raise
        return out.logits[0]
