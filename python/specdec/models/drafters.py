"""Drafters for tests and benchmarks. Each returns per-depth logits ``[depth, V]`` for the
tokens after ``context`` (what a DFlash-style block drafter produces).

- :class:`RandomDrafter`: random logits (low acceptance).
- :class:`OracleDrafter`: peaks at the target's own greedy continuation, optionally wrong at
  each depth with probability ``miss`` (full or partial acceptance).
- :class:`AdversarialDrafter`: puts the target's greedy token LAST at every depth, so a greedy
  verifier never accepts anything (every step is a bonus-only step).
- :class:`ModelDrafter`: a small LM run greedily for ``depth`` tokens; its logits per depth.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..verify import Target

__all__ = ["RandomDrafter", "OracleDrafter", "AdversarialDrafter", "ModelDrafter", "greedy_rollout"]


def greedy_rollout(
    model: Target, context: Sequence[int], depth: int
) -> tuple[list[int], torch.Tensor]:
    """The model's greedy continuation of ``context`` (``depth`` tokens) and the logits it
    was chosen from ``[depth, V]``, with a fresh cache."""
    dev = torch.device(model.device)
    cache = model.new_cache(len(context) + depth)
    feed = torch.tensor(list(context), dtype=torch.long, device=dev)
    toks: list[int] = []
    rows = []
    for _ in range(depth):
        start = cache.committed_len
        logits = model(feed, torch.arange(start, start + feed.numel(), device=dev), cache, None)
        cache.commit(torch.arange(feed.numel()))
        row = logits[-1]
        rows.append(row)
        toks.append(int(row.argmax()))
        feed = torch.tensor([toks[-1]], dtype=torch.long, device=dev)
    return toks, torch.stack(rows)


class RandomDrafter:
    def __init__(self, vocab_size: int, *, seed: int = 0, scale: float = 3.0) -> None:
        self.vocab_size = vocab_size
        self.scale = scale
        self.gen = torch.Generator().manual_seed(seed)

    def draft(self, context: Sequence[int], depth: int) -> torch.Tensor:
        return self.scale * torch.randn(depth, self.vocab_size, generator=self.gen)


class OracleDrafter:
    """Knows the target's greedy continuation; with ``miss > 0`` each depth's peak moves to a
    random wrong token with that probability."""

    def __init__(self, target: Target, *, miss: float = 0.0, seed: int = 0) -> None:
        self.target = target
        self.miss = miss
        self.gen = torch.Generator().manual_seed(seed)

    def draft(self, context: Sequence[int], depth: int) -> torch.Tensor:
        toks, _ = greedy_rollout(self.target, context, depth)
        v = self.target.vocab_size
        logits = torch.randn(depth, v, generator=self.gen)
        for d, t in enumerate(toks):
            if self.miss and float(torch.rand((), generator=self.gen)) < self.miss:
                t = (t + 1 + int(torch.randint(v - 1, (), generator=self.gen))) % v
            logits[d, t] = 10.0
        return logits


class AdversarialDrafter:
    """Ranks the target's greedy next token last (-inf at depth 1, so no tree contains it):
    a greedy verifier accepts nothing and every step emits only its bonus token."""

    def __init__(self, target: Target, *, seed: int = 0) -> None:
        self.target = target
        self.gen = torch.Generator().manual_seed(seed)

    def draft(self, context: Sequence[int], depth: int) -> torch.Tensor:
        toks, _ = greedy_rollout(self.target, context, 1)
        logits = torch.randn(depth, self.target.vocab_size, generator=self.gen)
        logits[0, toks[0]] = -torch.inf
        return logits


class ModelDrafter:
    """A (smaller) causal LM as drafter: greedy rollout, logits of each depth."""

    def __init__(self, model: Target) -> None:
        self.model = model

    def draft(self, context: Sequence[int], depth: int) -> torch.Tensor:
        return greedy_rollout(self.model, context, depth)[1].float()
