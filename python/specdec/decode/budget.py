"""The adaptive budget: how many drafted nodes a step should verify.

A bigger tree accepts more tokens per step but costs a bigger target forward. The best size
depends on the hardware: on a GPU a forward of 32 tokens costs about what one token costs, on
two CPU cores several times as much. So the choice is measured, not assumed:

* :class:`CostModel` times the actual target forward at a ladder of token counts once, at
  start-up (:meth:`CostModel.calibrate`; every count up to 16, where the time is a
  staircase on a CPU), and interpolates between them;
* :class:`AdaptiveBudget` picks, per step, the node count that maximises expected tokens per
  second, ``sum_r (1 + E_r(b)) / (cost(R * (b + 1)) + host)``, where ``E_r(b)`` is request
  r's expected acceptance with its tree cut to its ``b`` best nodes: the sum of the nodes'
  path probabilities (a best-first tree's first ``b`` nodes are its best ``b``-node tree).
  Drafters are not perfectly calibrated, so each step of a node's path (its probability
  given its parent) is scaled by the ratio of accepted to predicted seen so far among tried
  nodes (parent accepted) of about the same conditional probability: a reliability curve
  over :data:`CALIBRATION_BINS`, applied along the path, so a chain's deep nodes shrink
  geometrically. Not one ratio for all nodes' path probabilities: a combined drafter's trees
  come from sources calibrated very differently (suffix chains whose empirical
  probabilities are 1 after one sighting, a model's marginals), and one shared ratio let
  the over-confident source talk the budget out of the calibrated one; nor flat along a
  path (a failing 16-node chain then still looked worth 16 times its first node). The
  curve is kept apart for depth-1 nodes and deeper ones (each shrunk towards the other
  class's ratio of the bin): a repeat's first token is a guess, its later tokens mostly
  follow once it holds. Trees without probabilities (explicit branches, n-gram chains) use the
  acceptance rate measured per depth. ``b = 0`` is a plain one-token step: the budget
  falls back to autoregressive decoding when no tree pays.
* Per-node calibration by conditional probability still leaves the values of a tree's
  first ``b`` nodes biased as a whole (block + suffix on SmolLM2's code prompts: rank-1
  nodes accepted 0.66x their calibrated value, nodes 5-8 0.26x; a bin pools nodes of
  different ranks, trees and sources). A step shows the truth for every size it covers:
  a best-first tree's nodes are prefix-closed in order, and the walk accepts, on the tree
  cut to its first ``b`` nodes, exactly the accepted nodes among them (greedy, or sampling
  with one sample per node). So values are scaled per rank band (1, 2, 3-4, 5-8, ...) by
  accepted over predicted of that band's verified nodes (the size calibration), each band
  shrunk towards the band before it (a band never verified takes the last measured one's
  factor, not the drafter's word), plus a standard error of optimism so a band that looked
  poor early is still tried (:meth:`AdaptiveBudget.band_factors`).
* A trust region bounds ``b`` by ``growth`` x (1 + the longest acceptance of the last
  steps): trees grow as fast as acceptance shows they pay, not as fast as an unlearnt
  calibration claims. Drafters are asked for trees of that bound (:meth:`size_bound`),
  not ``max_budget``: the same first nodes, less drafting.
* A plain step needs no draft: while the budget keeps choosing plain steps, a drafter
  that costs something is not run, but for the probes (:meth:`AdaptiveBudget.draft_now`).
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

__all__ = ["CostModel", "AdaptiveBudget", "BudgetChoice", "CALIBRATION_BINS", "rank_bands"]

# Upper edges of the conditional-probability bins the calibration keeps apart, and a
# typical probability of each (where its prior pseudo-nodes sit).
CALIBRATION_BINS = np.array([0.02, 0.05, 0.1, 0.2, 0.3, 0.45, 0.6, 0.8, 0.95, np.inf])
_BIN_MID = np.array([0.01, 0.035, 0.075, 0.15, 0.25, 0.375, 0.525, 0.7, 0.875, 0.975])


def rank_bands(ranks: np.ndarray) -> np.ndarray:
    """The rank band of each node rank (1-based position in a best-first tree): 1 -> 0,
    2 -> 1, 3-4 -> 2, 5-8 -> 3, ... (band ``k`` holds ranks ``2^(k-1) + 1 .. 2^k``)."""
    r = np.maximum(np.asarray(ranks, dtype=np.int64), 1)
    bands: np.ndarray = np.ceil(np.log2(r)).astype(np.int64)  # exact at powers of two
    return bands


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
        return float(self.many(np.array([num_tokens]))[0])

    def many(self, num_tokens: np.ndarray) -> np.ndarray:
        """The cost of each token count in ``num_tokens`` (one call for a whole ladder)."""
        t, s = self.tokens, self.seconds
        out: np.ndarray = np.interp(num_tokens, t, s)
        if len(t) > 1:
            slope = (s[-1] - s[-2]) / max(t[-1] - t[-2], 1)
            past = num_tokens > t[-1]
            out[past] = s[-1] + slope * (num_tokens[past] - t[-1])
        return out

    @staticmethod
    def ladder(most: int, dense: int = 16) -> list[int]:
        """Calibration sizes up to ``most`` tokens: every size up to ``dense``, then powers
        of two and their midpoints. Every size where trees are usually chosen: a CPU
        forward's time is a staircase in the token count (matmul tiles), not a line (on two
        cores SmolLM2's forward of 3 to 6 tokens costs the same and 7 costs 10% more), and
        interpolating between powers of two put the steps in the wrong places."""
        most = check_int(most, "most", 1, ConfigError)
        sizes = set(range(1, min(dense, most) + 1)) | {most}
        p = 1
        while p < most:
            sizes.update({p, min(p + p // 2, most)})
            p *= 2
        return sorted(s for s in sizes if s <= most)

    @classmethod
    def calibrate(
        cls,
        target: Target,
        *,
        sizes: Sequence[int] | None = None,
        prefix: int = 128,
        repeats: int = 5,
    ) -> CostModel:
        """Time ``target`` forwards of each size in ``sizes`` (default
        :meth:`ladder` ``(65)``) after a ``prefix``-token
        context (fastest of ``repeats``, after one warm-up: noise on a shared machine only
        ever adds time), in a scratch cache. The sizes take turns, one forward each per
        round, so a burst of load inflates one repeat of several sizes rather than every
        repeat of one size (whose inflated time the monotone curve would then carry up to
        all larger sizes)."""
        if sizes is None:
            sizes = cls.ladder(65)
        sizes = sorted({check_int(s, "calibration size", 1, ConfigError) for s in sizes})
        prefix = min(prefix, target.max_positions - max(sizes) - 1)
        if prefix < 1:
            raise ConfigError("the target's context is too short to calibrate a cost model")
        dev = torch.device(target.device)
        cache = target.new_cache(prefix + max(sizes))
        ids = torch.zeros(prefix, dtype=torch.long, device=dev)
        target(ids, torch.arange(prefix, device=dev), cache, None)
        cache.commit_fed(ids)
        times: list[list[float]] = [[] for _ in sizes]
        for _ in range(repeats + 1):
            for n, ts in zip(sizes, times, strict=True):
                x = torch.zeros(n, dtype=torch.long, device=dev)
                pos = torch.arange(prefix, prefix + n, device=dev)
                t0 = time.perf_counter()
                target(x, pos, cache, None)
                if dev.type == "cuda":
                    torch.cuda.synchronize(dev)
                ts.append(time.perf_counter() - t0)
                cache.rollback()
        return cls(list(sizes), [float(min(ts[1:])) for ts in times])


def _conditionals(tree: DraftTree) -> tuple[np.ndarray, np.ndarray]:
    """Each drafted node's log-probability given its parent ``[N]`` (float64) and the real
    nodes' parents ``[N + 1]``."""
    n = tree.num_real
    lp = tree.logprobs[:n].astype(np.float64)
    par = tree.parents[:n].astype(np.int64)
    return lp[1:] - lp[par[1:]], par


def _path_sums(log_r: np.ndarray, parents: np.ndarray) -> np.ndarray:
    """``[N]``: per drafted node the sum of ``log_r`` (one per drafted node) over its path
    from the root, by pointer jumping: log2(depth) rounds of whole-array work instead of
    one per depth."""
    s = np.concatenate(([0.0], log_r))
    up = parents.astype(np.int64)
    up[0] = 0  # the root adds its 0 from then on
    reach = 1  # s[i] sums the ``reach`` nearest nodes of i's path
    while reach < len(s) and (up[1:] != 0).any():
        s = s + s[up]
        up = up[up]
        reach *= 2
    out: np.ndarray = s[1:]
    return out


_BANDS = rank_bands(np.arange(1, 1026))


def _bands(n: int) -> np.ndarray:
    """The rank bands of ranks ``1..n``."""
    return _BANDS[:n] if n <= len(_BANDS) else rank_bands(np.arange(1, n + 1))


@dataclass
class _Seen:
    """A candidate tree as :meth:`AdaptiveBudget.choose_among` valued it: its
    :func:`_conditionals` (None without probabilities) and path values."""

    tree: DraftTree
    conditionals: tuple[np.ndarray, np.ndarray] | None
    path_values: np.ndarray

    def prefix(self, tree: DraftTree) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """(conditionals, parents, path values) of ``tree`` when it is this tree's first
        nodes (a best-first tree cut to the chosen size), else None."""
        n, t = tree.num_real, self.tree
        if self.conditionals is None or n > t.num_real:
            return None
        same = np.array_equal(tree.tokens[:n], t.tokens[:n])
        if not (same and np.array_equal(tree.parents[:n], t.parents[:n])):
            return None
        cond, par = self.conditionals
        return cond[: n - 1], par[:n], self.path_values[: n - 1]


@dataclass(frozen=True)
class BudgetChoice:
    """One step's decision: drafted nodes per request (``0`` = a plain one-token step) and
    the expected tokens per second that made it."""

    nodes: int
    expected_tokens: float
    expected_seconds: float
    # Per request, which of its candidate trees (:meth:`AdaptiveBudget.choose_among`) to
    # verify; all 0 for :meth:`AdaptiveBudget.choose`.
    picks: tuple[int, ...] = ()


@dataclass
class AdaptiveBudget:
    """Chooses each step's drafted-node count from the cost model and the trees' expected
    acceptance (see the module docstring). ``max_budget`` bounds it."""

    cost: CostModel
    max_budget: int
    host_seconds: float = 0.0  # per-step work besides the forward (draft included), learnt
    # Each bin's calibration starts at ``prior`` (worth ``prior_weight`` predicted tokens)
    # until steps say otherwise: a suffix chain's empirical probabilities of 1 that fail
    # drag their own bin down within a step or two, while a model's marginals (the block
    # drafter's are close to calibrated on SmolLM2) keep their value; a low bin needs many
    # tried nodes to move, so one lucky hit among them does not inflate it. (With one ratio
    # for all nodes the prior had to be pessimistic, 0.5, for the suffix chains' sake, which
    # halved the model's values.)
    prior: float = 1.0
    prior_weight: float = 2.0
    # Exploration: after ``probe_after`` steps in a row whose trees were not worth
    # verifying, verify the best non-empty tree once (without it a drafter judged useless
    # early would never be measured again); the wait doubles after a probe that accepted
    # nothing and resets after one that accepted something.
    probe: bool = True
    probe_after: int = 8
    _skipped: int = 0
    _probing: bool = False
    # Skipping the drafter (:meth:`draft_now`): a plain step needs no draft, and a model
    # drafter's forward costs 6-14% of a plain step on two cores (Medusa, block). So when
    # the budget chose the plain step at ``skip_after`` or more of the last
    # ``skip_window`` steps that drafted, the drafter is not run, but for the probes; a
    # probe that accepts something starts drafting again. (Medusa on SmolLM2's qa
    # prompts, where no tree pays: drafting at every step ran at 0.87x / 0.90x of plain
    # decoding, greedy / t=1, skipping at 0.91x / 0.94x.) A drafter cheaper than
    # ``skip_share`` of a plain step (a suffix index, 0.1 ms) is always run: skipping it
    # saves nothing and misses its matches.
    skip_window: int = 32
    skip_after: float = 0.75
    skip_share: float = 0.02
    # The drafter's and the host's seconds per drafted step: medians of the last 16 (a
    # request's first step also indexes its prompt or computes the drafter's context K/V,
    # 10-50x a step's draft).
    draft_seconds: float = 0.0
    _drafts: list[float] = field(default_factory=list)
    _hosts: list[float] = field(default_factory=list)
    _plain: list[bool] = field(default_factory=list)  # per drafted step: chose plain
    # Draft depth (:meth:`draft_depth`): two beyond the longest acceptance of the last
    # ``depth_window`` steps.
    depth_window: int = 16
    # Trust region: at most ``growth`` times (1 + the longest acceptance of the last
    # ``depth_window`` steps) nodes, ``growth`` before any step (None: no cap). Values come
    # from calibration that the first steps have not learnt yet: a suffix drafter's
    # first tree (every count-based probability 1.0) was worth 47 nodes by the prior and
    # cost three steps' time; the cap lets trees grow as fast as acceptance shows they pay.
    growth: int | None = 4
    _depths: list[int] = field(default_factory=list)
    # Per (depth class, bin of CALIBRATION_BINS), over tried nodes: predicted (conditional
    # probabilities summed) and accepted. Class 0: depth-1 nodes (tried every step); class
    # 1: deeper ones (tried only once their parent was accepted). A suffix match's tokens
    # all say 1.0, but its first token is a guess and, once it holds, the rest of the
    # repeat mostly follows: one ratio for both undervalued the repeat or overvalued the
    # guess.
    _predicted: np.ndarray = field(default_factory=lambda: np.zeros((2, len(CALIBRATION_BINS))))
    _realised: np.ndarray = field(default_factory=lambda: np.zeros((2, len(CALIBRATION_BINS))))
    # Standard errors added to each rank band's factor (:meth:`band_factors`).
    band_optimism: float = 1.0
    # Per rank band (:func:`rank_bands`), over verified nodes: values predicted by the
    # per-node calibration, and nodes accepted (the size calibration). One for all sources
    # of a combined drafter: the per-node calibration keeps them apart, and kept per source
    # (tried) each band had half the data and a suffix source's bands sank (block + suffix
    # on edit at t=1: 0.92 of the best fixed budget in the replay, 0.99 pooled).
    _band_predicted: np.ndarray = field(default_factory=lambda: np.zeros(1))
    _band_realised: np.ndarray = field(default_factory=lambda: np.zeros(1))
    # Acceptance per depth for trees without probabilities: reached[d] / tried[d].
    _tried: list[float] = field(default_factory=list)
    _reached: list[float] = field(default_factory=list)
    # The last choice's verified candidates as valued (for :meth:`observe`).
    _seen: list[_Seen] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.max_budget = check_int(self.max_budget, "max_budget", 1, ConfigError)
        if not 0.0 < self.prior <= 2.0:
            raise ConfigError(f"prior calibration must be in (0, 2], got {self.prior}")
        if not self.prior_weight > 0.0:
            raise ConfigError(f"prior_weight must be positive, got {self.prior_weight}")
        if self.growth is not None:
            self.growth = check_int(self.growth, "growth", 1, ConfigError)
        self.skip_window = check_int(self.skip_window, "skip_window", 1, ConfigError)
        self.depth_window = check_int(self.depth_window, "depth_window", 1, ConfigError)
        if not 0.0 < self.skip_after <= 1.0:
            raise ConfigError(f"skip_after must be in (0, 1], got {self.skip_after}")
        if not 0.0 <= self.skip_share < math.inf:
            raise ConfigError(f"skip_share must be finite and >= 0, got {self.skip_share}")
        if not 0.0 <= self.band_optimism < math.inf:
            raise ConfigError(f"band_optimism must be finite and >= 0, got {self.band_optimism}")

    @property
    def calibration(self) -> np.ndarray:
        """``[2, bins]``: per depth class (depth 1, deeper) and bin of
        :data:`CALIBRATION_BINS`, accepted over predicted nodes so far, with the other
        class's ratio worth ``prior_weight`` nodes, and ``prior`` worth ``prior_weight``
        nodes of that (``prior`` before any step)."""
        w = self.prior_weight
        # Each class shrinks towards the other class's ratio of the bin (itself shrunk
        # towards ``prior``): a class with no tried nodes yet, such as the deeper nodes of a
        # drafter whose first tokens all failed, takes the other's ratio, so a chain still
        # loses value geometrically with depth; a class's own nodes are counted once (a
        # pooled ratio as the prior would count them twice and sink a few early failures
        # to a tenth).
        other = (self._realised[::-1] + w * self.prior) / (self._predicted[::-1] + w)
        ratio: np.ndarray = (self._realised + w * other) / (self._predicted + w)
        return np.clip(ratio, 0.02, 1.0 / _BIN_MID)

    def band_factors(self, bands: int) -> np.ndarray:
        """``[bands]``: per rank band (:func:`rank_bands`), accepted over predicted
        (per-node calibrated) values of the verified nodes so far, shrunk towards the band
        before it (worth ``prior_weight`` predicted tokens; band 0 towards ``prior``), plus
        ``band_optimism`` standard errors. The bonus keeps a band that looked poor early
        in play: it is verified less often after that, so without it its estimate stops
        improving and trees shrink step after step (block + suffix at t=1 on edit prompts
        fell to 0.87 of the best fixed budget that way in ``bench_budget_replay.py``)."""
        w = self.prior_weight
        out = np.empty(bands)
        before = self.prior
        for k in range(bands):
            p = self._band_predicted[k] if k < len(self._band_predicted) else 0.0
            a = self._band_realised[k] if k < len(self._band_realised) else 0.0
            before = (a + w * before) / (p + w)
            # Accepted counts are about Poisson: the ratio's standard error is
            # sqrt(ratio * predicted) / (predicted + w), none before any data.
            out[k] = before + self.band_optimism * math.sqrt(before * p) / (p + w)
        return np.maximum(out, 0.02)

    def draft_depth(self, limit: int) -> int:
        """How many depths a per-depth drafter should draft this step (at most ``limit``):
        such drafters pay per depth (the block drafter's LM head runs on one row per
        depth), and depths past what gets accepted only widen the choice, so two beyond the
        longest acceptance of the last ``depth_window`` steps (``limit`` before any step).
        An acceptance that reaches the cap raises it the next step; depths that stop paying
        drop out of the window. (Accepted, not verified, depth: a combined drafter's suffix
        chains are verified deep and fail, which says nothing of the model's depths.)"""
        if not self._depths:
            return limit
        return max(1, min(limit, max(self._depths) + 2))

    def size_bound(self) -> int:
        """The most drafted nodes :meth:`choose_among` can pick this step: ``max_budget``
        within the trust region (``growth``). Trees need not be drafted any bigger: a
        best-first tree's first ``b`` nodes are its ``b``-node tree, so a drafter asked for
        this many builds the same candidates for every size the budget weighs, with less
        work (top-k per depth, heap, deeper rows; block + suffix spent 0.5 ms a step more
        drafting at 64 nodes than at 4)."""
        if self.growth is None:
            return self.max_budget
        return min(self.max_budget, self.growth * (1 + max(self._depths, default=0)))

    def node_values(self, tree: DraftTree) -> np.ndarray:
        """Each drafted node's expected contribution to the acceptance length, in node order."""
        return self._values(tree, self._path_values(tree))

    def _values(self, tree: DraftTree, path_values: np.ndarray) -> np.ndarray:
        """:meth:`node_values` from the tree's :meth:`_path_values`."""
        if not len(path_values) or math.isnan(tree.expected_acceptance):
            return path_values
        bands = _bands(len(path_values))
        # No node is accepted more than always (a factor above 1 on a sure node).
        out: np.ndarray = np.minimum(
            path_values * self.band_factors(int(bands[-1]) + 1)[bands], 1.0
        )
        return out

    def _path_values(
        self,
        tree: DraftTree,
        conditionals: tuple[np.ndarray, np.ndarray] | None = None,
        calibration: np.ndarray | None = None,
    ) -> np.ndarray:
        """As :meth:`node_values`, before the size calibration (per rank band);
        ``conditionals``: the tree's :func:`_conditionals`, ``calibration``: this step's
        :attr:`calibration`, when the caller has them."""
        n = tree.num_real
        if not math.isnan(tree.expected_acceptance):
            # Path probability times, along the path, each node's calibration ratio for
            # its conditional probability (capped so no step is surer than certain).
            cond, par = conditionals if conditionals is not None else _conditionals(tree)
            cal = self.calibration if calibration is None else calibration
            depths = tree.depths[:n]
            bins = np.searchsorted(CALIBRATION_BINS, np.exp(cond), "right")
            log_r = np.minimum(np.log(cal[(depths[1:] > 1).astype(np.int64), bins]), -cond)
            values: np.ndarray = np.exp(tree.logprobs[1:n] + _path_sums(log_r, par))
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
        maximises expected tokens per second, within the trust region (``growth``)."""
        return self.choose_among([[t] for t in trees])

    def choose_among(self, candidates: Sequence[Sequence[DraftTree]]) -> BudgetChoice:
        """As :meth:`choose`, with several candidate trees per request (e.g. a model's and
        a suffix index's, :meth:`~specdec.draft.CombinedDrafter.candidates`): for each
        size, each request takes the candidate its calibrated values rate highest at that
        size, so the source is chosen at the size that will be verified and by what the
        sources have been seen to deliver, not by their own claims. ``picks`` says which."""
        r = len(candidates)
        most = self.size_bound()
        gains = np.zeros(most + 1)
        which = np.zeros((r, most + 1), dtype=np.int64)
        cal = self.calibration  # one step: the same for every tree
        seen: list[list[_Seen]] = []
        for i, trees in enumerate(candidates):
            cums = np.zeros((len(trees), most + 1))
            seen.append([])
            for j, tree in enumerate(trees):
                cp = _conditionals(tree) if not math.isnan(tree.expected_acceptance) else None
                pv = self._path_values(tree, cp, cal)
                seen[i].append(_Seen(tree, cp, pv))
                c = np.cumsum(self._values(tree, pv)[:most])
                cums[j, 1 : len(c) + 1] = c
                cums[j, len(c) + 1 :] = c[-1] if len(c) else 0.0
            which[i] = np.argmax(cums, axis=0)  # ties: the first candidate
            gains += cums.max(axis=0)
        secs = self.cost.many(r * np.arange(1, most + 2)) + self.host_seconds  # b = 0..most
        rate = (r + gains) / secs

        def at(b: int) -> BudgetChoice:
            picks = tuple(int(x) for x in which[:, b])
            # What :meth:`observe` would compute again for the verified trees.
            self._seen = [ss[p] for ss, p in zip(seen, picks, strict=True)]
            return BudgetChoice(b, float(r + gains[b]), float(secs[b]), picks)

        plain = at(0)
        best, best_rate = None, -1.0  # the best non-empty tree size (the first of ties)
        if most >= 1:
            b = 1 + int(np.argmax(rate[1:]))
            best, best_rate = at(b), rate[b]
        if best is not None and best_rate > plain.expected_tokens / plain.expected_seconds:
            self._skipped = 0
            self._plain = [*self._plain, False][-self.skip_window :]
            return best
        drafted = any(t.num_real > 1 for trees in candidates for t in trees)
        if self.probe and drafted and best is not None:
            self._skipped += 1
            if self._skipped >= self.probe_after:
                self._skipped, self._probing = 0, True
                return best
        self._plain = [*self._plain, True][-self.skip_window :]
        return plain

    def draft_now(self, rows: int = 1) -> bool:
        """Whether the coming step (``rows`` requests) should run the drafter: not while
        the budget chose the plain step at ``skip_after`` of the last ``skip_window``
        drafted steps and the draft costs more than ``skip_share`` of a plain step,
        unless a probe is due. A step without a draft is a plain one: call :meth:`skip`
        for it."""
        if not self.probe or self._skipped >= self.probe_after:
            return True
        # The window is full only once skip_window drafted steps have been seen.
        if len(self._plain) < self.skip_window:
            return True
        if sum(self._plain) < self.skip_after * self.skip_window:
            return True
        plain = float(self.cost(rows)) + max(self.host_seconds - self.draft_seconds, 0.0)
        return self.draft_seconds <= self.skip_share * plain

    def skip(self) -> None:
        """Count a plain step that ran no drafter (towards the next probe)."""
        self._skipped += 1

    def observe(
        self,
        trees: Sequence[DraftTree],
        accepted: Sequence[int | np.ndarray],
        host: float,
        *,
        draft: float = 0.0,
        drafted: bool = True,
    ) -> None:
        """Learn from a finished step: the trees verified, what each accepted (its accepted
        node indices, root excluded, as :attr:`~specdec.tree.WalkResult.accepted`; or just
        their count, taken as the likeliest path's first nodes), the step's seconds
        besides the forward (``host``, the draft's ``draft`` included), and whether it ran
        the drafter (``drafted``; the seconds of a step that did not are not learnt)."""
        counts = [int(a) if isinstance(a, int | np.integer) else len(a) for a in accepted]
        if self._probing:
            self._probing = False
            paid = sum(counts) > 0
            self.probe_after = 8 if paid else min(2 * self.probe_after, 1024)
            if paid:
                self._plain = []  # draft again, and judge afresh
        self._depths = [*self._depths, max(counts, default=0)][-self.depth_window :]
        seen = self._seen if len(self._seen) == len(trees) else [None] * len(trees)
        self._seen = []
        for tree, a, acc, sn in zip(trees, counts, accepted, seen, strict=True):
            n = tree.num_real
            if n > 1 and not math.isnan(tree.expected_acceptance):
                # The values as predicted, before this step updates the calibration (as
                # :meth:`choose_among` computed them, when this tree is its pick cut short).
                got = sn.prefix(tree) if sn is not None else None
                if got is None:
                    cp = _conditionals(tree)
                    got = (*cp, self._path_values(tree, cp))
                cond, par, values = got
                hit = np.zeros(n, dtype=bool)
                hit[0] = True  # the root: its children are always tried
                if isinstance(acc, int | np.integer):
                    node = 0
                    for _ in range(int(acc)):  # the likeliest child, depth by depth
                        ch = np.flatnonzero(par == node)
                        if len(ch) == 0:
                            break
                        node = int(ch[int(np.argmax(tree.logprobs[ch]))])
                        hit[node] = True
                else:
                    idx = np.asarray(acc, dtype=np.int64)
                    hit[idx[(idx > 0) & (idx < n)]] = True
                # A node was tried when its parent was accepted (or is the root).
                tried = hit[par[1:]]
                q = np.exp(cond[tried])
                b = np.searchsorted(CALIBRATION_BINS, q, side="right")
                deep = (tree.depths[1:n][tried] > 1).astype(np.int64)
                np.add.at(self._predicted, (deep, b), q)
                np.add.at(self._realised, (deep, b), hit[1:][tried].astype(np.float64))
                # The size calibration: every verified node, by its rank band.
                bands = _bands(n - 1)
                grow = int(bands[-1]) + 1 - len(self._band_predicted)
                if grow > 0:
                    self._band_predicted = np.concatenate([self._band_predicted, np.zeros(grow)])
                    self._band_realised = np.concatenate([self._band_realised, np.zeros(grow)])
                np.add.at(self._band_predicted, bands, values)
                np.add.at(self._band_realised, bands, hit[1:].astype(np.float64))
            if n > 1:
                # Per-depth acceptance: depth d was tried if the tree reached it.
                max_d = int(tree.depths[1:n].max())
                while len(self._tried) < max_d:
                    self._tried.append(0.0)
                    self._reached.append(0.0)
                for d in range(max_d):
                    self._tried[d] += 1.0
                    self._reached[d] += 1.0 if a > d else 0.0
        if drafted:
            self._hosts, self._drafts = [*self._hosts[-15:], host], [*self._drafts[-15:], draft]
            self.host_seconds = float(np.median(self._hosts))
            self.draft_seconds = float(np.median(self._drafts))
