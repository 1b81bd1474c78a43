"""The Llama/Qwen2-style decoder (RMSNorm, RoPE, GQA, SwiGLU, tied or untied head) whose
forward runs one decode step over a :class:`~specdec.cache.KVCache` (or R of them, or R
sequences of one paged pool): the fused Rust step where it applies, else one torch layer
loop over a K/V access strategy (:mod:`.kv_access`)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor, nn

from ...cache.dense import DenseKVCache
from ...cache.paged import PagedDecodeStep, PagedKVCache, PagedKVPool
from ...errors import ConfigError, SpecdecTypeError, VerifyError
from ...protocols import ArgmaxCapture, HiddenCapture, KVCache, LogitsMask
from ...verify.attention import Backend, FlexFallback, attend
from ..fused import StepKV, batch_kv, pool_kv, run_step, single_kv
from ..quant import Numeric, QuantizedLinears
from .config import LlamaConfig
from .inputs import causal_mask, check_step_inputs
from .kv_access import KVAccess, OneCache, PoolRows, batch_access
from .layers import Backbone, _norm, _rope, rope_cos_sin
from .plans import LinearPlans, _Fused, _Groups, _kernel_threads, _pointwise

__all__ = ["LlamaModel"]


class LlamaModel(LinearPlans):
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
    captures_argmax = True
    masks_logits = True

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

    # -- target protocol -----------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def max_positions(self) -> int:
        return self.config.max_position_embeddings

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
        argmax: ArgmaxCapture | None = None,
        allowed: LogitsMask | None = None,
    ) -> Tensor:
        """Tokens ``[T]`` at positions ``[T]`` attending to the cache's committed prefix plus
        this step's tokens under ``mask`` ``[T, committed + T]`` (bool, True = visible;
        ``None`` = causal). Returns logits ``[T, vocab]``; the step stays pending in
        ``cache``. ``hidden``: hidden states to keep from this forward (its ``states``
        ``[T, width]`` after the call); ``argmax``: the logits rows' argmax (its ``tokens``
        ``[T]`` after the call; the fused step computes them, the torch path leaves
        ``None``); ``allowed``: a grammar's mask of the logits rows (the fused step applies
        it, ``applied``; the torch path leaves it to the caller)."""
        return self._step(
            input_ids,
            position_ids,
            cache,
            mask,
            packed=self.packed_linear,
            last=False,
            hidden=hidden,
            argmax=argmax,
            allowed=allowed,
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
        argmax: ArgmaxCapture | None = None,
        allowed: LogitsMask | None = None,
    ) -> Tensor:
        c = self.config
        check_step_inputs(self, input_ids, position_ids, mask, cache)
        if argmax is not None:
            argmax.tokens = None
        if allowed is not None:
            allowed.applied = False
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
            return self._run(
                input_ids, position_ids, cache, mask, packed, last, hidden, argmax, allowed
            )
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
        argmax: ArgmaxCapture | None,
        allowed: LogitsMask | None = None,
    ) -> torch.Tensor:
        """``mask`` None: causal."""
        t_new = ids.shape[0]
        plan = self._linear_plan(pk, t_new)  # None: plain F.linear calls
        stack = self._fused_stack(plan, pos)
        kv = None if stack is None else single_kv(cache, t_new)
        if stack is not None and kv is not None:
            out = run_step(
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
                argmax=argmax is not None,
                allowed=None if allowed is None else allowed.bitmask,
            )
            if hidden is not None:
                hidden.states = out.states
            if argmax is not None:
                argmax.tokens = out.argmax
            if allowed is not None:
                allowed.applied = True
            return out.logits
        if mask is None and t_new > 1:
            mask = causal_mask(cache.committed_len, t_new, self.device)
        with _kernel_threads(plan, self.kernel_torch_threads):
            return self._layers(ids[None], pos[None], OneCache(cache, mask), plan, last, hidden)

    def _layers(
        self,
        ids: Tensor,
        pos: Tensor,
        kv: KVAccess,
        plan: _Groups | None,
        last: bool,
        hidden: HiddenCapture | None,
    ) -> Tensor:
        """The torch step (layer by layer) on ``ids`` / ``pos`` ``[R, T]``: R rows of T
        tokens whose K/V ``kv`` writes and reads. Returns logits ``[R * T, vocab]`` (``last``:
        each row's last token only, ``[R, vocab]``); ``hidden.states`` ``[R * T, width]``.
        Rows stay flattened (``[R * T, hidden]``) except around attention: the products
        see one 2-D input."""
        c = self.config
        hd = c.head_dim or 0
        r, t = ids.shape
        x = self.model.embed_tokens(ids.reshape(-1).long())
        cos, sin = self._rope_tables(pos, x.dtype)
        cos, sin = cos[:, None], sin[:, None]  # broadcast over heads: [R * T, 1, D]
        kept: list[Tensor] = []
        silu, keep = nn.functional.silu, () if hidden is None else hidden.layers
        hq, hkv = c.num_attention_heads, c.num_key_value_heads
        nqk = hq + hkv
        backend, inter, numeric = self.backend, c.intermediate_size, self.numeric
        for i, layer in enumerate(self.model.decoder_layers()):
            a, m = layer.self_attn, layer.mlp
            h = _norm(x, layer.input_layernorm)
            # One [R * T, Hq + 2 Hkv, D] projection; RoPE on the q and k heads in one go.
            if plan is None:
                qkv = self._lin(h, a.q_proj, a.k_proj, a.v_proj, packed=False, cat=True)[0]
            else:  # the packed q/k/v come out concatenated
                qkv = _pointwise(h, plan[4 * i], numeric)
            qkv = qkv.view(r * t, nqk + hkv, hd)
            qk = _rope(qkv[:, :nqk], cos, sin)
            q = qk[:, :hq].view(r, t, hq, hd).transpose(1, 2)  # [R, Hq, T, D]
            outs = [
                attend(
                    q if read.rows is None else q[read.rows],
                    read.k,
                    read.v,
                    read.mask,
                    backend=backend,
                    checked=i > 0,
                    fallback=self._flex,
                )
                for read in kv.write_and_read(i, qk[:, hq:], qkv[:, nqk:])
            ]
            o = outs[0] if len(outs) == 1 else torch.cat(outs)
            o = o.transpose(1, 2).reshape(r * t, hq * hd)
            if plan is None:
                x = x + self._lin(o, a.o_proj, packed=False)[0]
                h = _norm(x, layer.post_attention_layernorm)
                g, u = self._lin(h, m.gate_proj, m.up_proj, packed=False)
                x = x + self._lin(silu(g) * u, m.down_proj, packed=False)[0]
            else:
                x = x + _pointwise(o, plan[4 * i + 1], numeric)
                gu = _pointwise(_norm(x, layer.post_attention_layernorm), plan[4 * i + 2], numeric)
                g, u = gu.narrow(-1, 0, inter), gu.narrow(-1, inter, inter)  # cheaper than split
                x = x + _pointwise(silu(g) * u, plan[4 * i + 3], numeric)
            if i in keep:
                kept.append(x)
        x = _norm(x, self.model.norm)
        self._keep_hidden(hidden, kept, x)
        return self._head(x.view(r, t, -1)[:, -1] if last else x, plan)

    @torch.no_grad()
    def forward_batch(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        caches: Sequence[KVCache],
        mask: torch.Tensor,
        *,
        hidden: HiddenCapture | None = None,
        argmax: ArgmaxCapture | None = None,
        allowed: LogitsMask | None = None,
    ) -> torch.Tensor:
        """R sequences (one cache each) in one forward: ``input_ids``/``position_ids``
        ``[R, T]`` and ``mask`` ``[R, T, P_max + T]`` laid out as
        :func:`specdec.tree.batch_tree_inputs` does (row r's prefix in columns
        ``[0, committed_r)``, then the step's T tokens). Returns logits ``[R, T, vocab]``;
        each cache's step stays pending. ``hidden``, ``argmax``, ``allowed``: as in
        :meth:`forward` (``states`` ``[R, T, width]``, ``tokens`` ``[R, T]``, ``bitmask``
        rows ``R * T``)."""
        if hidden is not None:
            self.check_capture(hidden)
        if argmax is not None:
            argmax.tokens = None
        if allowed is not None:
            allowed.applied = False
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
            return self._run_batch(
                input_ids, position_ids, caches, mask, p_max, hidden, argmax, allowed
            )
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
        argmax: ArgmaxCapture | None,
        allowed: LogitsMask | None = None,
    ) -> torch.Tensor:
        plan = self._linear_plan(self.packed_linear, ids.numel())  # None: F.linear calls
        stack = self._fused_stack(plan, pos)
        r, t_new = ids.shape
        kv = None if stack is None else batch_kv(caches, t_new, p_max)
        if stack is not None and kv is not None:
            out = run_step(
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
                argmax=argmax is not None,
                allowed=None if allowed is None else allowed.bitmask,
            )
            if hidden is not None:
                hidden.states = None if out.states is None else out.states.view(r, t_new, -1)
            if argmax is not None and out.argmax is not None:
                argmax.tokens = out.argmax.view(r, t_new)
            if allowed is not None:
                allowed.applied = True
            return out.logits.view(r, t_new, -1)
        c = self.config
        heads = (c.num_hidden_layers, c.num_key_value_heads, c.head_dim or 0)
        access = batch_access(caches, mask, p_max, heads)
        with _kernel_threads(plan, self.kernel_torch_threads):
            logits = self._layers(ids, pos, access, plan, False, hidden)
        if hidden is not None and hidden.states is not None:
            hidden.states = hidden.states.view(r, t_new, -1)
        return logits.view(r, t_new, -1)

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
            return run_step(
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
            ).logits
        with _kernel_threads(plan, self.kernel_torch_threads):
            return self._layers(
                ids[:, None], pos[:, None], PoolRows.decode(pool, step), plan, False, None
            )

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
