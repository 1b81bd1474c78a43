"""The adaptive budget: how many drafted nodes a step should verify.

A bigger tree accepts more tokens per step but costs a bigger target forward. The best size
depends on the hardware: on a GPU a forward of 32 tokens costs about what one token costs, on
two CPU cores several times as much. So the choice is measured, not assumed:

* :class:`CostModel` times the actual target forward at a ladder of token counts once, at
  start-up (:meth:`CostModel.calibrate`), and interpolates between them;
* :class:`AdaptiveBudget` picks, per step, the node count that maximises expected tokens per
  second, ``sum_r (1 + E_r(b)) / (cost(R * (b + 1)) + host)``, where ``E_r(b)`` is request
  r's expected acceptance with its tree cut to its ``b`` best nodes: the sum of the nodes'
  path probabilities (a best-first tree's first ``b`` nodes are its best ``b``-node tree).
  Drafters are not perfectly calibrated, so the prediction is scaled by the ratio of accepted
  to predicted tokens seen so far; trees without probabilities (explicit branches, n-gram
  chains) use the acceptance rate measured per depth. ``b = 0`` is a plain one-token step:
  the budget falls back to autoregressive decoding when no tree pays.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from .._arrays import check_int
from ..errors import ConfigError
from ..protocols import Target
from ..tree import DraftTree

__all__ = ["CostModel", "AdaptiveBudget", "BudgetChoice"]


@dataclass
class CostModel:
    """Target forward seconds as a function of the tokens fed in one step (all rows of a
    batch together), piecewise linear between measured points (and linear past the last)."""

    tokens: list[int]
    seconds: list[float]

    def __post_init__(self) -> None:
        if len(self.tokens) == 0 or len(self.tokens) != len(self.seconds):
            raise ConfigError("a cost model needs matching, non-empty tokens and seconds")
        order = np.argsort(self.tokens)
        self.tokens = [int(self.tokens[i]) for i in order]
        # A forward of more tokens never costs less: smooth timing noise into a monotone curve.
        self.seconds = np.maximum.accumulate([float(self.seconds[i]) for i in order]).tolist()

    def __call__(self, num_tokens: int) -> float:
        t, s = self.tokens, self.seconds
        if num_tokens <= t[-1] or len(t) == 1:
            return float(np.interp(num_tokens, t, s))
        slope = (s[-1] - s[-2]) / max(t[-1] - t[-2], 1)
        return s[-1] + slope * (num_tokens - t[-1])

    @classmethod
    def calibrate(
        cls,
        target: Target,
        *,
        sizes: Sequence[int] = (1, 2, 4, 8, 16, 24, 32, 48, 64),
        prefix: int = 128,
        repeats: int = 5,
    ) -> CostModel:
        """Time ``target`` forwards of each size in ``sizes`` after a ``prefix``-token
        context (fastest of ``repeats``, after one warm-up: noise on a shared machine only
        ever adds time), in a scratch cache."""
        sizes = sorted({check_int(s, "calibration size", 1, ConfigError) for s in sizes})
        prefix = min(prefix, target.max_positions - max(sizes) - 1)
        if prefix < 1:
            raise ConfigError("the target's context is too short to calibrate a cost model")
        dev = torch.device(target.device)
        cache = target.new_cache(prefix + max(sizes))
        ids = torch.zeros(prefix, dtype=torch.long, device=dev)
        target(ids, torch.arange(prefix, device=dev), cache, None)
        cache.commit_fed(ids)
        seconds = []
        for n in sizes:
            x = torch.zeros(n, dtype=torch.long, device=dev)
            pos = torch.arange(prefix, prefix + n, device=dev)
            times = []
            for _ in range(repeats + 1):
                t0 = time.perf_counter()
                target(x, pos, cache, None)
                if dev.type == "cuda":
                    torch.cuda.synchronize(dev)
                times.append(time.perf_counter() - t0)
                cache.rollback()
            seconds.append(float(min(times[1:])))
        return cls(list(sizes), seconds)


@dataclass(frozen=True)
class BudgetChoice:
    """One step's decision: drafted nodes per request (``0`` = a plain one-token step) and
    the expected tokens per second that made it."""

    nodes: int
    expected_tokens: float
    expected_seconds: float


@dataclass
class AdaptiveBudget:
    """Chooses each step's drafted-node count from the cost model and the trees' expected
    acceptance (see the module docstring). ``max_budget`` bounds it."""

    cost: CostModel
    max_budget: int
    host_seconds: float = 0.0  # per-step work besides the forward, learnt as the run goes
    # Drafters' own probabilities (suffix frequencies above all) run optimistic, so the
    # calibration starts at ``prior`` (worth two predicted tokens) until steps say otherwise.
    prior: float = 0.5
    # Exploration: after ``probe_after`` steps in a row whose trees were not worth
    # verifying, verify the best non-empty tree once (without it a drafter judged useless
    # early would never be measured again); the wait doubles after a probe that accepted
    # nothing and resets after one that accepted something.
    probe: bool = True
    probe_after: int = 8
    _skipped: int = 0
    _probing: bool = False
    _predicted: float = 2.0
    _realised: float = -1.0  # set from ``prior``
    # Acceptance per depth for trees without probabilities: reached[d] / tried[d].
    _tried: list[float] = field(default_factory=list)
    _reached: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.max_budget = check_int(self.max_budget, "max_budget", 1, ConfigError)
        if not 0.0 < self.prior <= 2.0:
            raise ConfigError(f"prior calibration must be in (0, 2], got {self.prior}")
        if self._realised < 0:
            self._realised = self._predicted * self.prior

    @property
    def calibration(self) -> float:
        """Accepted over predicted tokens so far (``prior`` before any step)."""
        return min(max(self._realised / self._predicted, 0.05), 2.0)

    def node_values(self, tree: DraftTree) -> np.ndarray:
        """Each drafted node's expected contribution to the acceptance length, in node order."""
        n = tree.num_real
        if not math.isnan(tree.expected_acceptance):
            values: np.ndarray = np.exp(tree.logprobs[1:n]) * self.calibration
            return values
        depth = tree.depths[1:n]
        rate = np.array(
            [
                (self._reached[d] + 0.5) / (self._tried[d] + 1.0)
                if d < len(self._tried)
                else 0.5 ** (d + 1)
                for d in range(int(depth.max(initial=0)))
            ]
        )
        return rate[depth - 1] if len(depth) else np.zeros(0)

    def choose(self, trees: Sequence[DraftTree]) -> BudgetChoice:
        """The node count (shared by the batch's rows, which are padded to one size) that
        maximises expected tokens per second."""
        r = len(trees)
        gains = np.zeros(self.max_budget + 1)
        for tree in trees:
            v = self.node_values(tree)[: self.max_budget]
            c = np.cumsum(v)
            gains[1 : len(c) + 1] += c
            gains[len(c) + 1 :] += c[-1] if len(c) else 0.0
        plain = BudgetChoice(0, float(r), self.cost(r) + self.host_seconds)
        best, best_rate = None, -1.0  # the best non-empty tree size
        for b in range(1, self.max_budget + 1):
            tokens = r + float(gains[b])
            secs = self.cost(r * (b + 1)) + self.host_seconds
            if tokens / secs > best_rate:
                best, best_rate = BudgetChoice(b, tokens, secs), tokens / secs
        if best is not None and best_rate > plain.expected_tokens / plain.expected_seconds:
            self._skipped = 0
            return best
        drafted = any(t.num_real > 1 for t in trees)
        if self.probe and drafted and best is not None:
            self._skipped += 1
            if self._skipped >= self.probe_after:
                self._skipped, self._probing = 0, True
                return best
        return plain

    def observe(self, trees: Sequence[DraftTree], accepted: Sequence[int], host: float) -> None:
        """Learn from a finished step: the trees verified, the drafted tokens each accepted,
        and the step's seconds besides the forward."""
        if self._probing:
            self._probing = False
            paid = sum(accepted) > 0
            self.probe_after = 8 if paid else min(2 * self.probe_after, 1024)
        for tree, a in zip(trees, accepted, strict=True):
            n = tree.num_real
            if n > 1 and not math.isnan(tree.expected_acceptance):
                self._predicted += tree.expected_acceptance
                self._realised += a
            if n > 1:
                # Per-depth acceptance: depth d was tried if the tree reached it.
                max_d = int(tree.depths[1:n].max())
                while len(self._tried) < max_d:
                    self._tried.append(0.0)
                    self._reached.append(0.0)
                for d in range(max_d):
                    self._tried[d] += 1.0
                    self._reached[d] += 1.0 if a > d else 0.0
        self.host_seconds = 0.9 * self.host_seconds + 0.1 * host if self.host_seconds else host
