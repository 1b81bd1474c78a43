"""Sampling with temperature, top-k and top-p: one independent sample of the target's
processed distribution per node."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..._arrays import check_float, check_int
from ...errors import ConfigError, VerifyError
from .base import DecodingRule

__all__ = ["Sampling", "sample_rows"]


@dataclass(frozen=True)
class Sampling(DecodingRule):
    """Temperature, then top-k (0 = off), then top-p (1.0 = off) on the target's logits; one
    independent sample per row."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        temperature = check_float(self.temperature, "temperature", ConfigError)
        if not temperature > 0 or temperature == float("inf"):
            raise ConfigError(f"temperature must be finite and > 0, got {self.temperature}")
        check_int(self.top_k, "top_k", 0, ConfigError)
        if not 0.0 < check_float(self.top_p, "top_p", ConfigError) <= 1.0:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """The processed distribution ``[T, V]`` (float32 or wider) sampled from."""
        self._check(logits)
        x = logits.to(torch.promote_types(logits.dtype, torch.float32)) / self.temperature
        if self.top_k and self.top_k < x.shape[-1]:
            # Ties with the k-th value are kept (as transformers does).
            kth = torch.topk(x, self.top_k, dim=-1).values[:, -1:]
            x = x.masked_fill(x < kth, -torch.inf)
        p = torch.softmax(x, dim=-1)
        if self.top_p < 1.0:
            sp, order = torch.sort(p, dim=-1, descending=True)
            before = torch.cumsum(sp, dim=-1) - sp  # mass of strictly more likely tokens
            drop_sorted = before >= self.top_p  # the first token is always kept
            drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
            p = p.masked_fill(drop, 0.0)
            p = p / p.sum(dim=-1, keepdim=True)
        return p

    def choose(
        self, logits: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        p = self.probs(logits)
        if torch.isnan(p).any():
            raise VerifyError("logits contain NaN")
        return sample_rows(p, generator)


_BLOCK = 256


def sample_rows(p: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One index per row of ``p`` ``[R, V]`` (non-negative, each row's sum positive), drawn
    with probability ``p / row sum``: the inverse CDF of one float64 uniform per row, in two
    levels (sums of blocks of 256, then the chosen block's entries), all accumulated in
    float64, so a zero-probability index is never drawn. ``torch.multinomial`` draws the
    same distribution but costs ~0.75 ms per row of a 49152-token vocabulary on one CPU
    thread (an exponential variate per entry), 13 ms for a 16-node tree's 17 rows; this
    costs about a tenth of that."""
    r, v = p.shape
    pad = (-v) % _BLOCK
    if pad:
        p = torch.nn.functional.pad(p, (0, pad))
    blocks = p.view(r, -1, _BLOCK)
    csum = blocks.sum(-1, dtype=torch.float64).cumsum(-1)  # [R, blocks]
    u = torch.rand(r, 1, generator=generator, dtype=torch.float64, device=p.device)
    u = u * csum[:, -1:]
    # The first block whose cumulative sum passes u (never past the last non-empty one).
    last_b = (csum < csum[:, -1:]).sum(-1, keepdim=True)
    b = torch.minimum(torch.searchsorted(csum, u, right=True), last_b)
    before = torch.where(b > 0, csum.gather(1, (b - 1).clamp(min=0)), 0.0)
    within = blocks.gather(1, b[:, :, None].expand(r, 1, _BLOCK))[:, 0]
    wsum = within.to(torch.float64).cumsum(-1)  # [R, 256]
    last_w = (wsum < wsum[:, -1:]).sum(-1, keepdim=True)
    w = torch.minimum(torch.searchsorted(wsum, u - before, right=True), last_w)
    return (b * _BLOCK + w)[:, 0]
