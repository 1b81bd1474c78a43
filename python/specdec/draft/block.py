"""A DFlash-style block drafter: one forward drafts a whole block.

The target's hidden states at chosen layers, concatenated per committed position, are
projected to one feature vector and normalised (``fc``, ``hidden_norm``); in every draft layer
these context features give extra keys and values. The block ``[last token, MASK x (L-1)]``
(MASK: a learned embedding) attends to those and to itself without a causal mask, and block
position ``j`` predicts the token ``j + 1`` places after the last one: L per-depth marginals
from one forward, which DDTree turns into a tree. The target's token embedding and LM head
are shared and frozen (not part of the checkpoint).

The generator hands each request's new hidden states over in ``DraftRequest.hidden_states``
(the positions the last verify step committed), so drafting costs no extra target pass; the
drafter keeps each request's context K/V and follows requests by their tokens, as
:class:`~specdec.draft.SuffixDrafter` does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._arrays import check_int
from ..errors import CheckpointError, ConfigError, DraftError
from ..models.llama import (
    DecoderLayer,
    LlamaConfig,
    RMSNorm,
    _rotate_half,
    rope_cos_sin,
)
from ..protocols import DraftRequest
from ..verify.attention import attend
from .base import check_requests
from .checkpoint import (
    SharedHead,
    TargetFacts,
    VocabChoice,
    bf16_supported,
    check_state,
    load_dir,
    resolve_vocab,
    shipped_path,
    target_facts,
    target_weights,
)

__all__ = ["BlockDrafter", "BlockDrafterConfig", "default_layers"]

KIND = "block"


def default_layers(num_layers: int, count: int = 3) -> tuple[int, ...]:
    """``count`` target layers spread from shallow to the last (DFlash reads several)."""
    if num_layers <= count:
        return tuple(range(num_layers))
    step = (num_layers - 2) / (count - 1)
    return tuple(sorted({1 + round(i * step) for i in range(count - 1)} | {num_layers - 1}))


@dataclass(frozen=True)
class BlockDrafterConfig:
    """The drafter's shape and the target it was made for."""

    target_hidden_size: int
    vocab_size: int
    target_num_layers: int
    target_layers: tuple[int, ...]
    block_size: int = 8
    num_layers: int = 1
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    intermediate_size: int = 512
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "target_layers", tuple(int(i) for i in self.target_layers))
        check_int(self.block_size, "block_size", 1, ConfigError)
        for name in ("target_hidden_size", "vocab_size", "target_num_layers", "num_layers"):
            check_int(getattr(self, name), name, 1, ConfigError)
        if not self.target_layers:
            raise ConfigError("target_layers must name at least one target layer")
        bad = [i for i in self.target_layers if not 0 <= i < self.target_num_layers]
        if bad or list(self.target_layers) != sorted(set(self.target_layers)):
            raise ConfigError(
                f"target_layers {list(self.target_layers)} must be increasing layer ids in "
                f"[0, {self.target_num_layers})"
            )

    @property
    def facts(self) -> TargetFacts:
        return TargetFacts(self.target_hidden_size, self.vocab_size, self.target_num_layers)

    def layer_config(self) -> LlamaConfig:
        return LlamaConfig(
            vocab_size=self.vocab_size,
            hidden_size=self.target_hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads,
            num_key_value_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            rms_norm_eps=self.rms_norm_eps,
            rope_theta=self.rope_theta,
        )

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["target_layers"] = list(self.target_layers)
        # DFlash's config names, so its readers find the same facts.
        return {"drafter": KIND, "dflash_config": {"target_layer_ids": d.pop("target_layers")}, **d}

    @classmethod
    def from_json(cls, cfg: dict[str, Any], where: str | Path = "config") -> BlockDrafterConfig:
        d = {k: v for k, v in cfg.items() if k not in ("drafter", "dflash_config", "note")}
        d["target_layers"] = (cfg.get("dflash_config") or {}).get("target_layer_ids")
        if d["target_layers"] is None:
            raise CheckpointError(f"{where}: no dflash_config.target_layer_ids")
        try:
            return cls(**d)
        except TypeError as e:
            raise CheckpointError(f"{where}: {e}") from e


@dataclass
class _Request:
    """One request's tokens so far and its context K/V per draft layer for the positions
    ``[start, start + n)``."""

    seen: list[int]
    start: int = 0
    kv: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)

    @property
    def end(self) -> int:
        return self.start + (self.kv[0][0].shape[1] if self.kv else 0)


class BlockDrafter(SharedHead, nn.Module):
    """A :class:`~specdec.protocols.Drafter`: ``draft(requests, depth) -> [R, depth, V]``
    with ``depth <= block_size``. Make one with :meth:`for_target` (untrained) or
    :meth:`load` (a checkpoint directory, checked against the target)."""

    hidden_final = False  # reads decoder-layer outputs, not the final-norm state

    def __init__(self, config: BlockDrafterConfig, embed: torch.Tensor, head: torch.Tensor):
        super().__init__()
        self.config = config
        h, v = config.target_hidden_size, config.vocab_size
        for name, w in (("embedding", embed), ("LM head", head)):
            if tuple(w.shape) != (v, h):
                raise ConfigError(
                    f"the shared {name} is {tuple(w.shape)}, the drafter's config needs "
                    f"[vocab, hidden] = {[v, h]}"
                )
        self.fc = nn.Linear(len(config.target_layers) * h, h, bias=False)
        self.hidden_norm = RMSNorm(h, config.rms_norm_eps)
        lc = config.layer_config()
        self.layers = nn.ModuleList(DecoderLayer(lc) for _ in range(config.num_layers))
        self.norm = RMSNorm(h, config.rms_norm_eps)
        self.mask_embedding = nn.Parameter(torch.zeros(h))
        # Shared with the target and frozen: plain attributes, so not in state_dict(). The
        # head's own tensor (in a tuple: not registered) keys the target's packed copy.
        self._embed = embed.detach()
        self._head = head.detach()
        self._head_src = (head,)
        # Linear layers (and the shared head) on oneDNN packed weights where that applies
        # (CPU float32, no autograd), as the target's decode steps; False: plain F.linear.
        self.packed_linear = True
        self._requests: list[_Request] = []  # one-off calls (no request id), by context
        self._by_id: dict[int, _Request] = {}  # RequestLifecycle: by request id

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def for_target(
        cls,
        target: Any,
        *,
        block_size: int = 8,
        target_layers: Sequence[int] | None = None,
        num_layers: int = 1,
        num_heads: int | None = None,
        intermediate_size: int | None = None,
        seed: int = 0,
        init_from: int | None = None,
    ) -> BlockDrafter:
        """An untrained drafter for ``target`` (a :class:`~specdec.models.LlamaModel`):
        attention shaped like the target's, weights random (deterministic per ``seed``).

        ``init_from``: start every draft layer as a copy of target layer ``init_from``
        (MLP width: the target's), the final norm as the target's, ``hidden_norm`` as that
        layer's input norm and ``fc`` as the identity on the captured layer nearest to the
        one before it (so the context keys and values start as that layer's own), instead
        of random. ``intermediate_size`` defaults to 512 (random) or the target's (copied).
        """
        f = target_facts(target)
        tc = target.config
        if init_from is not None:
            check_int(init_from, "init_from", 0, ConfigError)
            if init_from >= f.num_layers:
                raise ConfigError(
                    f"init_from {init_from} is not a target layer (it has {f.num_layers})"
                )
            if intermediate_size not in (None, tc.intermediate_size):
                raise ConfigError(
                    f"init_from copies the target's MLP: intermediate_size must be "
                    f"{tc.intermediate_size}, got {intermediate_size}"
                )
            if num_heads not in (None, tc.num_attention_heads):
                raise ConfigError(
                    f"init_from copies the target's attention: num_heads must be "
                    f"{tc.num_attention_heads}, got {num_heads}"
                )
            intermediate_size = tc.intermediate_size
        if intermediate_size is None:
            intermediate_size = 512
        heads = num_heads or tc.num_attention_heads
        kv = min(tc.num_key_value_heads, heads)
        while heads % kv:
            kv -= 1
        cfg = BlockDrafterConfig(
            f.hidden_size,
            f.vocab_size,
            f.num_layers,
            tuple(target_layers) if target_layers is not None else default_layers(f.num_layers),
            block_size=block_size,
            num_layers=num_layers,
            num_heads=heads,
            num_kv_heads=kv,
            head_dim=tc.head_dim or f.hidden_size // heads,
            intermediate_size=intermediate_size,
            rms_norm_eps=tc.rms_norm_eps,
            rope_theta=tc.rope_theta,
        )
        d = cls(cfg, *target_weights(target)).to(target.dtype)
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in d.named_parameters():
                if name.endswith("norm.weight"):
                    p.fill_(1.0)
                elif name == "mask_embedding":
                    p.copy_(0.02 * torch.randn(p.shape, generator=g))
                else:
                    p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
            if init_from is not None:
                d._copy_target_layer(target, init_from)
        return d

    def _copy_target_layer(self, target: Any, i: int) -> None:
        """The ``init_from`` start of :meth:`for_target` (under no_grad)."""
        src = target.model.layers[i]
        for layer in self._layers():
            layer.load_state_dict(src.state_dict())
        self.norm.weight.copy_(target.model.norm.weight)
        self.hidden_norm.weight.copy_(src.input_layernorm.weight)
        layers = self.config.target_layers
        j = min(range(len(layers)), key=lambda k: abs(layers[k] - (i - 1)))
        h = self.config.target_hidden_size
        self.fc.weight.zero_()
        self.fc.weight[:, j * h : (j + 1) * h] = torch.eye(h, dtype=self.fc.weight.dtype)

    @classmethod
    def load(
        cls,
        path: str | Path,
        target: Any,
        *,
        draft_vocab: VocabChoice = "auto",
        bf16: bool | None = None,
    ) -> BlockDrafter:
        """A checkpoint directory (``config.json`` + ``model.safetensors``) for ``target``;
        CheckpointError / ConfigError naming what is missing or differs. ``draft_vocab``:
        ``"auto"`` drafts from the directory's ``draft_vocab.json`` when it has one (see
        :class:`~specdec.draft.DraftVocab`), None from the full vocabulary, or a file /
        DraftVocab. ``bf16``: the drafter's own linear layers and draft-vocabulary head on
        bfloat16 packed copies (:attr:`packed_bf16`; None: where this CPU runs bfloat16
        natively); drafts move by rounding, verified output never does."""
        raw, state = load_dir(path, KIND)
        cfg = BlockDrafterConfig.from_json(raw, Path(path) / "config.json")
        cfg.facts.check(target_facts(target), f"the block drafter at {path}")
        d = cls(cfg, *target_weights(target))
        check_state(path, state, d.state_dict())
        d.load_state_dict(state)
        d.set_draft_vocab(resolve_vocab(draft_vocab, path, cfg.vocab_size))
        d.packed_bf16 = bf16_supported() if bf16 is None else bool(bf16)
        d = d.to(target.dtype).eval()
        d.warm_up()
        return d

    @classmethod
    def shipped(
        cls, target: Any, *, draft_vocab: VocabChoice = "auto", bf16: bool | None = None
    ) -> BlockDrafter:
        """The weights shipped with specdec (trained for SmolLM2-135M-Instruct by
        ``python -m specdec.train block``), checked against ``target``; ``draft_vocab`` as
        in :meth:`load`, and ``bf16``."""
        return cls.load(shipped_path(KIND), target, draft_vocab=draft_vocab, bf16=bf16)

    def save(self, path: str | Path, note: str | None = None) -> Path:
        """Write the checkpoint directory (float16 weights; ``note``: kept in the config;
        the draft vocabulary when the drafter has one)."""
        return self._save(path, self.config.to_json(), note)

    # -- what the generator reads ------------------------------------------------------------
    @property
    def hidden_layers(self) -> tuple[int, ...]:
        return self.config.target_layers

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    def check_target(self, target: Any) -> None:
        self.config.facts.check(target_facts(target), "the block drafter")

    # -- the forward -------------------------------------------------------------------------
    def context_kv(
        self, hidden: torch.Tensor, positions: torch.Tensor
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per draft layer, the context K/V ``[kv_heads, C, head_dim]`` of hidden states
        ``[C, layers * H]`` at ``positions`` ``[C]``."""
        c = self.config
        want = len(c.target_layers) * c.target_hidden_size
        if hidden.dim() != 2 or hidden.shape[1] != want:
            raise DraftError(
                f"hidden states must be [m, {want}] (target layers {list(c.target_layers)} x "
                f"hidden size {c.target_hidden_size}), got {tuple(hidden.shape)}"
            )
        f = self.hidden_norm(self._lin(hidden.to(self.fc.weight.dtype), self.fc)[0])
        cos, sin = rope_cos_sin(positions, c.head_dim, c.rope_theta, f.dtype)
        out = []
        for layer in self._layers():
            a = layer.self_attn
            k, v = self._lin(f, a.k_proj, a.v_proj)
            k = k.view(-1, a.hkv, a.hd).transpose(0, 1)
            v = v.view(-1, a.hkv, a.hd).transpose(0, 1)
            out.append((k * cos[None] + _rotate_half(k) * sin[None], v))
        return out

    def _lin(self, x: torch.Tensor, *mods: nn.Linear) -> tuple[torch.Tensor, ...]:
        """The linear layers ``mods`` on ``x`` (one packed call for several, see
        :attr:`packed_linear`, :attr:`packed_bf16`)."""
        return self._run_linears(x, [m.weight for m in mods], [m.bias for m in mods])

    def block_hidden(
        self,
        roots: torch.Tensor,
        starts: torch.Tensor,
        ctx_kv: Sequence[tuple[torch.Tensor, torch.Tensor]],
        visible: torch.Tensor,
    ) -> torch.Tensor:
        """The final-norm hidden states ``[B, L, H]`` of B blocks ``[root, MASK...]`` whose
        roots ``[B]`` sit at positions ``starts`` ``[B]``; block b sees the context
        positions where ``visible[b]`` (``[B, C]`` bool) and its own block, both ways."""
        c = self.config
        b, el, h = roots.shape[0], c.block_size, c.target_hidden_size
        dev = self.fc.weight.device
        x = torch.cat(
            (
                self._embed[roots.long()].to(self.fc.weight.dtype)[:, None],
                self.mask_embedding.expand(b, el - 1, h),
            ),
            1,
        ).reshape(b * el, h)
        pos = (starts[:, None] + torch.arange(el, device=dev)[None]).reshape(-1)
        cos, sin = rope_cos_sin(pos, c.head_dim, c.rope_theta, x.dtype)
        same = torch.arange(b, device=dev).repeat_interleave(el)
        mask = torch.cat(
            (visible.repeat_interleave(el, 0), same[:, None] == same[None]), 1
        )  # [B*L, C + B*L]
        n = b * el
        for layer, (kc, vc) in zip(self._layers(), ctx_kv, strict=True):
            a = layer.self_attn
            m = layer.mlp
            q, k, v = self._lin(layer.input_layernorm(x), a.q_proj, a.k_proj, a.v_proj)
            q = q.view(n, a.h, a.hd).transpose(0, 1)
            k = k.view(n, a.hkv, a.hd).transpose(0, 1)
            v = v.view(n, a.hkv, a.hd).transpose(0, 1)
            q = q * cos[None] + _rotate_half(q) * sin[None]
            k = k * cos[None] + _rotate_half(k) * sin[None]
            kk, vv = torch.cat((kc, k), 1), torch.cat((vc, v), 1)
            o = attend(q[None], kk[None], vv[None], mask, backend="sdpa", checked=True)[0]
            x = x + self._lin(o.transpose(0, 1).reshape(n, a.h * a.hd), a.o_proj)[0]
            g, u = self._lin(layer.post_attention_layernorm(x), m.gate_proj, m.up_proj)
            x = x + self._lin(nn.functional.silu(g) * u, m.down_proj)[0]
        out: torch.Tensor = self.norm(x).view(b, el, h)
        return out

    def _layers(self) -> list[DecoderLayer]:
        return [layer for layer in self.layers if isinstance(layer, DecoderLayer)]

    # -- the Drafter protocol ----------------------------------------------------------------
    @torch.no_grad()
    def draft(self, requests: Sequence[DraftRequest], depth: int) -> torch.Tensor:
        """``[R, depth, V]``: one block forward per request over its context K/V."""
        depth = check_int(depth, "depth", 1, DraftError)
        if depth > self.config.block_size:
            raise DraftError(
                f"depth {depth} is more than the block drafter's block_size "
                f"{self.config.block_size}"
            )
        check_requests(requests)
        used: list[_Request] = []
        for r in requests:
            used.append(self._follow(r, used) if r.request_id is None else self._keyed(r))
        self._requests = [u for u in used if all(u is not k for k in self._by_id.values())]
        dev = self.fc.weight.device
        rows = []
        for r, st in zip(requests, used, strict=True):
            root = torch.tensor([int(r.context[-1])], device=dev)
            start = torch.tensor([len(r.context) - 1], device=dev)
            if not st.kv:  # no hidden states yet (one-token prompt): the block alone
                st.kv = self.context_kv(
                    torch.zeros(0, self.fc.in_features, device=dev, dtype=self.fc.weight.dtype),
                    torch.zeros(0, dtype=torch.long, device=dev),
                )
            vis = torch.ones(1, st.kv[0][0].shape[1], dtype=torch.bool, device=dev)
            h = self.block_hidden(root, start, st.kv, vis)[0, :depth]
            rows.append(self.logits(h).float())
        return torch.stack(rows)

    def warm_up(self) -> None:
        """One draft over a dummy context, so the linear layers' packed copies (oneDNN,
        made on first use) are made now, at load, not in a request's first draft (25 ms on
        SmolLM2 with two cores: 4% of a 128-token request). Holds no state after."""
        dev, dt = self.fc.weight.device, self.fc.weight.dtype
        hidden = torch.zeros(1, self.fc.in_features, device=dev, dtype=dt)
        self.draft([DraftRequest([0, 0], hidden)], self.config.block_size)
        self._requests = []

    # -- RequestLifecycle: per-request context K/V, freed when the request ends -------------
    def add_request(
        self, request_id: int, prompt: Sequence[int], *, cache_salt: bytes | str | None = None
    ) -> None:
        """Start holding state for ``request_id`` (its context K/V, built from the hidden
        states its DraftRequests bring)."""
        rid = check_int(request_id, "request_id", None, DraftError)
        if rid in self._by_id:
            raise DraftError(f"request {rid} was already added")
        self._by_id[rid] = _Request([int(t) for t in prompt])

    def remove_request(self, request_id: int, output: Sequence[int] | None = None) -> None:
        """Free ``request_id``'s state."""
        if self._by_id.pop(int(request_id), None) is None:
            raise DraftError(f"no request {request_id} (never added, or already removed)")

    @property
    def num_requests(self) -> int:
        """Requests whose state is held (by id, and one-off contexts of the last call)."""
        return len(self._by_id) + len(self._requests)

    def _keyed(self, r: DraftRequest) -> _Request:
        st = self._by_id.get(int(r.request_id))  # type: ignore[arg-type]
        if st is None:
            raise DraftError(f"no request {r.request_id}: add_request first")
        return self._extend(st, r)

    def _follow(self, r: DraftRequest, taken: list[_Request]) -> _Request:
        """The state of the request whose tokens ``r.context`` extends, with ``r``'s new
        hidden states (the positions just before the root) added."""
        ctx = [int(t) for t in r.context]
        st = None
        for old in self._requests:
            n = len(old.seen)
            if all(old is not t for t in taken) and n <= len(ctx) and ctx[:n] == old.seen:
                st = old
                break
        return self._extend(st, r)

    def _extend(self, st: _Request | None, r: DraftRequest) -> _Request:
        """``st`` (None: a new state) brought up to ``r``: its context and new hidden
        states."""
        ctx = [int(t) for t in r.context]
        if r.hidden_states is None:
            if st is None:
                raise DraftError(
                    "the block drafter reads the target's hidden states: DraftRequest."
                    "hidden_states is None (run it in a SpeculativeGenerator over a LlamaModel)"
                )
            st.seen = ctx
            return st
        st = st or _Request(ctx)
        st.seen = ctx
        m = r.hidden_states.shape[0]
        end = len(ctx) - 1  # the root's position: every position before it is committed
        if m:
            s = end - m
            pos = torch.arange(s, end, device=self.fc.weight.device)
            new = self.context_kv(r.hidden_states, pos)
            if not st.kv or s > st.end or s < st.start:  # a gap: start again from these
                st.start, st.kv = s, new
            else:
                keep = s - st.start  # rows after s were replaced (a redraft): drop them
                st.kv = [
                    (torch.cat((k[:, :keep], nk), 1), torch.cat((v[:, :keep], nv), 1))
                    for (k, v), (nk, nv) in zip(st.kv, new, strict=True)
                ]
        return st
