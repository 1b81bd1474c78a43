"""A (smaller) causal LM as drafter: run greedily for ``depth`` tokens, its logits at each
depth are the marginals."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..protocols import Target
from .base import SequenceDrafter

__all__ = ["ModelDrafter", "greedy_rollout"]


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
        cache.commit_fed(feed)
        row = logits[-1]
        rows.append(row)
        toks.append(int(row.argmax()))
        feed = torch.tensor([toks[-1]], dtype=torch.long, device=dev)
    return toks, torch.stack(rows)


class ModelDrafter(SequenceDrafter):
    """A (smaller) causal LM as drafter: greedy rollout, logits of each depth."""

    def __init__(self, model: Target) -> None:
        self.model = model

    def draft_one(self, context: Sequence[int], depth: int) -> torch.Tensor:
        return greedy_rollout(self.model, context, depth)[1].float()
