"""Verify trees through an unmodified ``transformers`` causal LM (Llama, Qwen2, ...).

The tree goes in as one forward with a 4-D additive mask ``[1, 1, T, L+T]`` (the tree mask),
explicit ``position_ids`` (prefix + depth) and ``cache_position``; transformers passes a
prepared 4-D mask through untouched. :class:`~specdec.cache.HFKVCache` implements the
:class:`~specdec.protocols.KVCache` protocol over a ``DynamicCache`` so the same
:class:`~specdec.verify.Verifier` commits: it compacts every layer's cache to the accepted path.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import Tensor

from ..cache.hf import HFKVCache
from ..errors import SpecdecTypeError
from ..protocols import KVCache
from .llama import causal_mask, check_step_inputs

__all__ = ["HFTarget"]


class HFTarget:
    """A :class:`~specdec.protocols.Target` over a transformers causal LM (eval mode, batch 1).
    Like :class:`~specdec.models.llama.LlamaModel`, a call begins the step in the cache."""

    def __init__(self, model: Any) -> None:
        if not hasattr(model, "config") or not callable(model):
            raise SpecdecTypeError(
                f"model must be a transformers PreTrainedModel, got {type(model).__name__}"
            )
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
        return torch.device(next(self.model.parameters()).device)

    @property
    def dtype(self) -> torch.dtype:
        dtype: torch.dtype = next(self.model.parameters()).dtype
        return dtype

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
        self, input_ids: Tensor, position_ids: Tensor, cache: KVCache, mask: Tensor | None = None
    ) -> Tensor:
        check_step_inputs(self, input_ids, position_ids, mask, cache)
        if not isinstance(cache, HFKVCache):
            raise SpecdecTypeError(
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
        logits: torch.Tensor = out.logits[0]
        return logits
