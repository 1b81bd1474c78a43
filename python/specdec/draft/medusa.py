"""Medusa heads: K residual heads over the target's last hidden state, one per depth.

Head k maps the final-norm hidden state ``h`` of the last committed position to
``h + SiLU(W_k h)`` and reads it with the target's LM head (shared, frozen): the logits of the
token k places after the next one (the next one, the tree's root, is the target's own bonus
token). Cheap to train (K square matrices), and the same tree builders consume them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._arrays import check_int
from ..errors import CheckpointError, ConfigError, DraftError
from ..protocols import DraftRequest
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

__all__ = ["MedusaDrafter", "MedusaConfig"]

KIND = "medusa"


@dataclass(frozen=True)
class MedusaConfig:
    """The heads' count and the target they were made for."""

    target_hidden_size: int
    vocab_size: int
    target_num_layers: int
    num_heads: int = 4

    def __post_init__(self) -> None:
        for name in ("target_hidden_size", "vocab_size", "target_num_layers", "num_heads"):
            check_int(getattr(self, name), name, 1, ConfigError)

    @property
    def facts(self) -> TargetFacts:
        return TargetFacts(self.target_hidden_size, self.vocab_size, self.target_num_layers)


class MedusaDrafter(SharedHead, nn.Module):
    """A :class:`~specdec.protocols.Drafter`: ``draft(requests, depth) -> [R, depth, V]``
    with ``depth <= num_heads``, from each request's last hidden state."""

    hidden_layers: tuple[int, ...] = ()
    hidden_final = True  # the final-norm state the LM head reads

    def __init__(self, config: MedusaConfig, head: torch.Tensor) -> None:
        super().__init__()
        self.config = config
        h, v = config.target_hidden_size, config.vocab_size
        if tuple(head.shape) != (v, h):
            raise ConfigError(
                f"the shared LM head is {tuple(head.shape)}, the heads' config needs "
                f"[vocab, hidden] = {[v, h]}"
            )
        # Zero-initialised: every head starts as the target's own next-token head.
        self.heads = nn.ModuleList(nn.Linear(h, h) for _ in range(config.num_heads))
        for lin in self._linears():
            nn.init.zeros_(lin.weight)
            nn.init.zeros_(lin.bias)
        self._head = head.detach()  # shared and frozen: not in state_dict()
        self._head_src = (head,)  # its own tensor (keys the target's packed head)
        # The heads (one packed call for all) and the shared head on oneDNN packed weights
        # where that applies (CPU float32, no autograd), as the target's decode steps.
        self.packed_linear = True

    @classmethod
    def for_target(cls, target: Any, *, num_heads: int = 4) -> MedusaDrafter:
        """Untrained heads for ``target`` (a :class:`~specdec.models.LlamaModel`)."""
        f = target_facts(target)
        cfg = MedusaConfig(f.hidden_size, f.vocab_size, f.num_layers, num_heads)
        return cls(cfg, target_weights(target)[1]).to(target.dtype)

    @classmethod
    def load(
        cls,
        path: str | Path,
        target: Any,
        *,
        draft_vocab: VocabChoice = "auto",
        bf16: bool | None = None,
    ) -> MedusaDrafter:
        """A checkpoint directory (``config.json`` + ``model.safetensors``) for ``target``;
        ``draft_vocab`` and ``bf16`` as in
        :meth:`BlockDrafter.load <specdec.draft.BlockDrafter.load>`."""
        raw, state = load_dir(path, KIND)
        fields = {k: v for k, v in raw.items() if k not in ("drafter", "note")}
        try:
            cfg = MedusaConfig(**fields)
        except TypeError as e:
            raise CheckpointError(f"{Path(path) / 'config.json'}: {e}") from e
        cfg.facts.check(target_facts(target), f"the Medusa heads at {path}")
        d = cls(cfg, target_weights(target)[1])
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
    ) -> MedusaDrafter:
        """The weights shipped with specdec (trained for SmolLM2-135M-Instruct by
        ``python -m specdec.train medusa``), checked against ``target``; ``draft_vocab`` as
        in :meth:`load`, and ``bf16``."""
        return cls.load(shipped_path(KIND), target, draft_vocab=draft_vocab, bf16=bf16)

    def save(self, path: str | Path, note: str | None = None) -> Path:
        """Write the checkpoint directory (float16 weights; ``note``: kept in the config;
        the draft vocabulary when the heads have one)."""
        return self._save(path, {"drafter": KIND, **asdict(self.config)}, note)

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    def check_target(self, target: Any) -> None:
        self.config.facts.check(target_facts(target), "the Medusa heads")

    def _linears(self) -> list[nn.Linear]:
        return [m for m in self.heads if isinstance(m, nn.Linear)]

    def head_hidden(self, hidden: torch.Tensor, depth: int | None = None) -> torch.Tensor:
        """``[N, H]`` final-norm hidden states -> ``[N, depth, H]`` (one row per head)."""
        heads = self._linears()[: depth or len(self.heads)]
        x = hidden.to(heads[0].weight.dtype)
        ws, bs = [lin.weight for lin in heads], [lin.bias for lin in heads]
        y = self._run_linears(x, ws, bs, cat=True)[0]  # [N, depth * H]
        return x[:, None] + nn.functional.silu(y.view(x.shape[0], len(heads), x.shape[1]))

    def warm_up(self) -> None:
        """Drafts from a dummy hidden state at every depth, so the heads' packed copies
        (oneDNN, made on first use, one per depth: a draft runs its first ``depth`` heads
        as one product) are made now, at load, not in a request's first drafts (15 ms on
        SmolLM2 with two cores)."""
        w = self._linears()[0].weight
        hidden = torch.zeros(1, self.config.target_hidden_size, device=w.device, dtype=w.dtype)
        for depth in range(1, self.config.num_heads + 1):
            self.draft([DraftRequest([0], hidden)], depth)

    @torch.no_grad()
    def draft(self, requests: Sequence[DraftRequest], depth: int) -> torch.Tensor:
        """``[R, depth, V]`` from each request's last committed hidden state (a request with
        none yet, a one-token prompt, gets flat logits: every tree then verifies as a miss)."""
        depth = check_int(depth, "depth", 1, DraftError)
        if depth > self.config.num_heads:
            raise DraftError(f"depth {depth} is more than the {self.config.num_heads} Medusa heads")
        check_requests(requests)
        h = self.config.target_hidden_size
        rows = []
        for r in requests:
            hs = r.hidden_states
            if hs is None:
                raise DraftError(
                    "Medusa heads read the target's hidden states: DraftRequest.hidden_states "
                    "is None (run them in a SpeculativeGenerator over a LlamaModel)"
                )
            if hs.dim() != 2 or hs.shape[1] != h:
                raise DraftError(
                    f"hidden states must be [m, {h}] (the final-norm state), got {tuple(hs.shape)}"
                )
            if hs.shape[0] == 0:
                rows.append(torch.zeros(depth, self.config.vocab_size, device=hs.device))
            else:
                rows.append(self.logits(self.head_hidden(hs[-1:], depth)[0]).float())
        return torch.stack(rows)
