"""Sampling with temperature, top-k and top-p: one independent sample of the target's
processed distribution per node.

Seeded sampling keyed by position (:func:`keyed_uniforms`): a request with a seed draws the
token at sequence position ``p`` with the uniform ``hash(seed, p)``, the same number
whichever tree node, step or batch row samples it. Since a tree node's row is the target's
distribution given exactly the node's path, the token emitted at ``p`` is the one plain
autoregressive sampling with the same seed emits there: the sampled text does not depend on
the drafter, the budget, the batch or the step boundaries. (A shared stream such as a
``torch.Generator`` hands each configuration different numbers, so the same seed gives each
configuration its own, equally distributed, text.)"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..._arrays import check_float, check_int
from ...errors import ConfigError, VerifyError
from .base import DecodingRule

__all__ = ["Sampling", "keyed_uniforms", "sample_rows"]


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
        self,
        logits: torch.Tensor,
        generator: torch.Generator | None = None,
        *,
        uniforms: torch.Tensor | None = None,
    ) -> torch.Tensor:
        p = self.probs(logits)
        if torch.isnan(p).any():
            raise VerifyError("logits contain NaN")
        return sample_rows(p, generator, uniforms=uniforms)


_BLOCK = 256


_MASK64 = (1 << 64) - 1


def _mix64(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser (uint64 arrays wrap silently): a bijection whose outputs for
    nearby inputs look independent."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    out: np.ndarray = z ^ (z >> np.uint64(31))
    return out


def keyed_uniforms(seed: int, positions: np.ndarray | Sequence[int]) -> np.ndarray:
    """The float64 uniforms in [0, 1) that seeded sampling uses for the tokens at sequence
    ``positions`` of a request seeded ``seed``: a counter-based hash of (seed, position),
    53 random bits each, so every position's number is fixed by the pair alone."""
    seed = check_int(seed, "seed", None, ConfigError)
    pos = np.asarray(positions, dtype=np.int64)
    if pos.size and pos.min() < 0:
        raise ConfigError("sampling positions must be >= 0")
    key = _mix64(np.array([seed & _MASK64], dtype=np.uint64))
    z = _mix64(key + pos.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15))
    u: np.ndarray = (z >> np.uint64(11)).astype(np.float64) * 2.0**-53
    return u


def sample_rows(
    p: torch.Tensor,
    generator: torch.Generator | None = None,
    *,
    uniforms: torch.Tensor | None = None,
) -> torch.Tensor:
    """One index per row of ``p`` ``[R, V]`` (non-negative, each row's sum positive), drawn
    with probability ``p / row sum``: the inverse CDF of one float64 uniform per row (from
    ``generator``, or ``uniforms`` ``[R]`` when given), in two
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
    if uniforms is None:
        u = torch.rand(r, 1, generator=generator, dtype=torch.float64, device=p.device)
    else:
        if tuple(uniforms.shape) != (r,):
            raise VerifyError(f"need one uniform per row ({r}), got {tuple(uniforms.shape)}")
        u = uniforms.to(device=p.device, dtype=torch.float64).view(r, 1)
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
