"""Sampling with temperature, top-k and top-p: one independent sample of the target's
processed distribution per node."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..._arrays import check_float, check_int
from ...errors import ConfigError, VerifyError
from .base import DecodingRule

__all__ = ["Sampling"]


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
        return torch.multinomial(p, 1, generator=generator)[:, 0]
