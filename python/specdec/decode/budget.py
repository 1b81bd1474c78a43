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
  with one sample per node). So values are scaled per source (a request's candidate) and
  rank band (1, 2, 3-4, 5-8, ...) by accepted over predicted of that band's observed
  nodes (the size calibration), each band shrunk towards the band before it (a band never
  observed takes the last measured one's factor, not the drafter's word)
  (:meth:`AdaptiveBudget.band_factors`).
* The statistics learn from every candidate tree drafted, whole, not from the verified cut
  alone (:meth:`AdaptiveBudget.learn`): the walk accepts a child when its token is the
  rule's choice at its parent, so the step's committed tokens decide the nodes it did not
  verify too (those below the last committed token count their calibrated expectation).
  Learnt from verified cuts, a size was measured only on the steps the budget already
  chose it at, and a source only where it was picked: on SmolLM2's code prompts (block +
  suffix, greedy) the trees' nodes of ranks 5-8 were valued at half of what they
  accepted, and an exploration bonus on each band was needed to keep sizes in play; no
  selection is left, so the bonus is off by default (``band_optimism``).
* Between a combined drafter's candidate trees, each size takes the one the drafters
  expect to accept most on its first that many nodes (their own surrogate), valued as
  above (:attr:`AdaptiveBudget.pick`).
* A trust region bounds ``b`` by ``growth`` x (1 + the longest acceptance of the last
  steps, each request's own when the caller names them): trees grow as fast as acceptance
  shows they pay, not as fast as an unlearnt calibration claims. A named request's values
  are also scaled by what its own candidates realised against them
  (:meth:`AdaptiveBudget.request_factor`), and a node is never worth more than its parent.
  Drafters are asked for trees of that bound (:meth:`size_bound`), not ``max_budget``: the
  same first nodes, less drafting.
* The drafter's own cost is charged by what steps deliver: a drafter that costs something
  runs only while its steps commit more tokens per second than steps without it (plain
  steps, or a combined drafter's suffix index alone), and is probed now and then while
  they do not (:meth:`AdaptiveBudget.arm`).

The statistics, the node values and the best candidate per size are computed in Rust
(:class:`specdec._core.BudgetStats`, one call each to choose and to observe): they run
right after a target forward has evicted the caches, where the numpy version took 0.45 ms
a step (2% of a SmolLM2 step on two cores); the policy (cost model, trust region, probes,
skipping) stays here.
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch

from .. import _core
from .._arrays import as_array, check_int
from ..errors import ConfigError
from ..protocols import Target
from ..tree import DraftTree

__all__ = ["ARMS", "CostModel", "AdaptiveBudget", "BudgetChoice", "CALIBRATION_BINS", "rank_bands"]

#: The drafting arms of :meth:`AdaptiveBudget.arm`.
ARMS = ("full", "lite", "plain")

# Upper edges of the conditional-probability bins the calibration keeps apart (the Rust
# core's, which bins the nodes).
CALIBRATION_BINS = np.array([*_core.CALIBRATION_BIN_EDGES, np.inf])


def rank_bands(ranks: np.ndarray) -> np.ndarray:
    """The rank band of each node rank (1-based position in a best-first tree): 1 -> 0,
    2 -> 1, 3-4 -> 2, 5-8 -> 3, ... (band ``k`` holds ranks ``2^(k-1) + 1 .. 2^k``)."""
    r = np.maximum(np.asarray(ranks, dtype=np.int64), 1)
    bands: np.ndarray = np.ceil(np.log2(r)).astype(np.int64)  # exact at powers of two
    return bands


def _rate(runs: Sequence[tuple[int, float, float, float]]) -> float:
    """Tokens per second over steps (tokens, seconds, ...): their mean tokens over their
    median seconds. A step's time has outliers (a burst of load, a collection), and in a
    ratio of sums one stalled plain step among twelve made plain decoding look slower
    than a drafter that did not pay, which then ran for whole requests (plain steps no
    longer ran to correct it)."""
    return math.fsum([r[0] for r in runs]) / len(runs) / _median([r[1] for r in runs])


def _median(xs: list[float]) -> float:
    """``statistics.median`` of a non-empty list, without its generic machinery (the
    budget takes several medians of windows of 12 to 32 floats every step)."""
    s = sorted(xs)
    m = len(s) // 2
    return s[m] if len(s) % 2 else (s[m - 1] + s[m]) / 2


def _monotone(y: list[float]) -> list[float]:
    """The non-decreasing sequence nearest ``y`` in least squares (pool adjacent
    violators): a size measured above its neighbours is averaged with them. A running
    maximum carried any one high reading up to every larger size until a reading exceeded
    it: on two cores SmolLM2's 3-token forward measured 19.96 ms and 4, 5 and 6 tokens
    18.57, 19.13 and 19.60 ms, which made 3 to 6 tokens all cost 19.96, so the budget
    verified 6-token trees at no cost in its eyes where 5 were 2.4% cheaper."""
    blocks: list[list[float]] = []  # [mean, count]
    for v in y:
        blocks.append([v, 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, c2 = blocks.pop()
            m1, c1 = blocks[-1]
            blocks[-1] = [(m1 * c1 + m2 * c2) / (c1 + c2), c1 + c2]
    return [m for m, c in blocks for _ in range(int(c))]


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
        self.seconds = _monotone([float(self.seconds[i]) for i in order])

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
    # The chosen trees' expected and accepted drafted tokens (:attr:`choice_factor`).
    choice_window: int = 32
    _choices: list[tuple[float, float]] = field(default_factory=list, repr=False)
    _chosen: float | None = None
    # Per request (for callers that name them, ``rids``) and candidate source: what its
    # candidates' decided nodes were priced at and what they realised (:meth:`learn`), over
    # its last ``request_window`` steps; its factor (:meth:`request_factor`) scales its
    # values. The statistics are shared by every request, and a request whose text is new
    # to the suffix index (a question after a repeated text) drew chains the index had seen
    # once, valued as the repeats had taught: 0.93x of plain decoding on SmolLM2's question
    # after its copy task with the shared statistics alone.
    request_window: int = 16
    _req_tally: dict[int, list[list[tuple[float, float]]]] = field(default_factory=dict, repr=False)
    # Drafting arms (:meth:`arm`): ``"full"`` runs the drafter; ``"lite"`` a combined
    # drafter's suffix index alone, without its model; ``"plain"`` no draft at all. They
    # are judged by what their steps delivered, tokens committed over the steps' whole
    # seconds (draft, forward, walk), over each arm's last ``arm_window`` steps: the
    # expected values price a tree against a plain step once the draft is paid for, and
    # the block drafter's trees on SmolLM2 (1.56 tokens a step on code, its draft 0.4x a
    # plain step) were worth verifying at nearly every step while drafting them ran at
    # 0.74x of plain decoding. An arm leaves out only a draft that costs more than
    # ``skip_share`` of a plain step: a suffix index (0.1-0.3 ms with the step's other
    # drafting work, cold) keeps running, since its
    # matches come in bursts that a skipped draft misses (left out after its first steps
    # found nothing, a suffix drafter ran at 0.85x of plain decoding on code at t=1,
    # against 1.30x drafting every step). The full arm runs until it has ``arm_min``
    # steps, a lite arm then as many to be measured (plain steps are estimated from the
    # cost model until some ran); then the fastest arm runs, and each other arm is probed
    # after ``arm_probe_after`` steps without it (its own wait: halved, to 16 at least,
    # after a probe as fast as the best other arm; doubled after a slower one). Each full
    # step of a drafter that does not pay costs about half a plain step, so a request of a
    # hundred steps affords only a handful: two to judge, then probes at growing
    # intervals. The arms that win are probed too: an arm judged during a burst of load
    # (another process on the cores) kept its slow window while the winner ran, and a
    # block drafter then drafted whole requests at 0.65x of plain decoding.
    arm_window: int = 12
    arm_min: int = 2
    arm_probe_after: int = 16
    skip_share: float = 0.05
    # The host's seconds per drafted step: the median of the last 16 (a request's first
    # step also indexes its prompt or computes the drafter's context K/V, 10-50x a step's
    # draft).
    _hosts: list[float] = field(default_factory=list)
    # Per arm, its last steps: (tokens committed, seconds, draft seconds, host seconds).
    _arm_runs: dict[str, list[tuple[int, float, float, float]]] = field(
        default_factory=lambda: {a: [] for a in ARMS}, repr=False
    )
    # Per arm with steps in its window: its rate (:func:`_rate`), cheapest draft and median
    # host seconds less the draft, kept as its window changes (a step reads them, each a
    # median or a mean over the window, 30 us a step recomputed).
    _arm_summary: dict[str, tuple[float, float, float]] = field(default_factory=dict, repr=False)
    _since: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ARMS, 0), repr=False)
    _probe_after: dict[str, int] = field(default_factory=dict, repr=False)  # per arm
    _arm_probing: str | None = None  # the arm the coming step probes
    # Draft depth (:meth:`draft_depth`): two beyond the longest acceptance of the last
    # ``depth_window`` steps.
    depth_window: int = 16
    # Trust region: at most ``growth`` times (1 + the longest acceptance of the last
    # ``depth_window`` steps) nodes, ``growth`` before any step (None: no cap). Values come
    # from calibration that the first steps have not learnt yet: a suffix drafter's
    # first tree (every count-based probability 1.0) was worth 47 nodes by the prior and
    # cost three steps' time; the cap lets trees grow as fast as acceptance shows they pay.
    # 2 rather than 4: on SmolLM2 (2 CPU cores) the suffix drafter's trees beyond twice
    # their recent acceptance mostly did not pay at t=1 (bench_budget_replay.py: 24 of 24
    # cells within 5% of the best fixed budget, worst 0.971, against 0.965 and 0.938 in two
    # runs at 4; suffix edit t=1 0.964 -> 0.975).
    growth: int | None = 2
    _depths: list[int] = field(default_factory=list)
    # The same windows per request, for callers that name the step's requests (``rids``):
    # a request's trees grow from its own acceptance, not from the request before it. A
    # warm generator that had copied a text 14-18 tokens a step carried that bound into a
    # question whose text was new: its first trees had 14 nodes, and its
    # suffix drafter ran at 0.86x of plain decoding on SmolLM2 (two cores, where a
    # 15-token forward costs 3.3 plain ones). :meth:`forget` drops a finished request's.
    _req_depths: dict[int, list[int]] = field(default_factory=dict, repr=False)
    # The learnt statistics (in Rust, :class:`specdec._core.BudgetStats`): per (depth
    # class, bin of CALIBRATION_BINS), over tried nodes, predicted (conditional
    # probabilities summed) and accepted. Class 0: depth-1 nodes (tried every step); class
    # 1: deeper ones (tried only once their parent was accepted). A suffix match's tokens
    # all say 1.0, but its first token is a guess and, once it holds, the rest of the
    # repeat mostly follows: one ratio for both undervalued the repeat or overvalued the
    # guess. Per source (a request's candidate: a combined drafter's model tree, 0, and
    # suffix tree, 1) and rank band (:func:`rank_bands`), over observed nodes: values
    # predicted by the per-node calibration, and nodes accepted (the size calibration).
    # Per source because the sources err differently by rank: pooled, the suffix chains'
    # failures priced the model's deeper ranks at half of what they accepted (block +
    # suffix on SmolLM2's code prompts). That only works because every candidate is
    # observed whole every step (:meth:`learn`); learnt from the verified cuts alone,
    # each source's bands had only the steps it was picked at, and a suffix source's bands
    # sank. Per depth, for trees without probabilities: trees that reached it, and steps
    # that accepted that deep.
    stats: _core.BudgetStats = field(default_factory=_core.BudgetStats, repr=False)
    # Standard errors added to each rank band's factor (:meth:`band_factors`): an
    # exploration bonus, for callers that observe only verified cuts (a band verified less
    # after a poor start stops being measured). The generator observes every drafted
    # tree whole, whatever size was verified, so there is nothing to explore: with 1.0 the
    # bonus (about 0.2 after 60 steps) kept a suffix drafter's values 25% above what it
    # accepted on SmolLM2's edit prompts at t=1.
    band_optimism: float = 0.0
    # How :meth:`choose_among` ranks a request's candidate trees: ``"drafted"``, by the
    # drafters' own expected acceptance (their path probabilities summed), or
    # ``"calibrated"``, by the calibrated node values. Either way the values price the size.
    # When the calibration learnt from verified trees only, with the calibrated ranking a
    # source was verified only where the calibration already favoured it, so what it
    # learnt fed back into what it got to see; the drafters' ranking did not depend on it
    # (block + suffix on SmolLM2's code prompts, greedy, in ``bench_budget_replay.py``:
    # 0.962 -> 0.996 of the best fixed budget at 128 tokens, 0.949 -> 0.998 at 64;
    # ``benches/ab_pick.py`` compares the two rankings on the same steps). Learning from
    # every candidate now, the drafters' ranking still did better there (0.969 against
    # 0.939; 24 against 23 cells within 5%).
    pick: Literal["drafted", "calibrated"] = "drafted"
    # Target forward seconds per (rows, most): the cost of every size a step weighs.
    _secs: dict[tuple[int, int], np.ndarray] = field(default_factory=dict, repr=False)
    _secs_of: CostModel | None = field(default=None, repr=False)
    # The steps' own forwards refine the cost model (:meth:`forward_costs`): per token count
    # fed, the median of its last 16 forwards, against the start-up figure worth
    # ``cost_weight`` forwards (``math.inf``: the start-up figures only). The start-up
    # ladder is five forwards per size at a fixed context, and its neighbouring sizes come
    # out 1-2% apart either way, as far apart as the values of a tree's 4th and 5th nodes:
    # in the loop SmolLM2's 5- and 6-token forwards took 0.906x and 0.929x of what the
    # ladder said on code#0 (the budget took the 6 as free).
    cost_weight: float = 4.0
    _forwards: dict[int, list[float]] = field(default_factory=dict, repr=False)
    # Measured over modelled seconds of the last 32 forwards: the level of sizes not fed yet.
    _cost_ratios: list[float] = field(default_factory=list, repr=False)
    # Per token count fed: its forwards' median over its modelled seconds, and how many;
    # the learnt seconds per (rows, most), kept until the next forward is learnt (a step
    # asks for them twice, and each ask took 20 us in the loop).
    _fed_ratio: dict[int, tuple[float, int]] = field(default_factory=dict, repr=False)
    _est: dict[tuple[int, int], np.ndarray] = field(default_factory=dict, repr=False)
    _modelled: dict[int, float] = field(default_factory=dict, repr=False)  # cost(fed)
    _curve: tuple[list[int], list[float]] | None = field(default=None, repr=False)
    _level: float | None = field(default=None, repr=False)  # median of _cost_ratios

    def __post_init__(self) -> None:
        self.max_budget = check_int(self.max_budget, "max_budget", 1, ConfigError)
        if not 0.0 < self.prior <= 2.0:
            raise ConfigError(f"prior calibration must be in (0, 2], got {self.prior}")
        if not self.prior_weight > 0.0:
            raise ConfigError(f"prior_weight must be positive, got {self.prior_weight}")
        if self.growth is not None:
            self.growth = check_int(self.growth, "growth", 1, ConfigError)
        self.choice_window = check_int(self.choice_window, "choice_window", 1, ConfigError)
        self.request_window = check_int(self.request_window, "request_window", 1, ConfigError)
        self.arm_window = check_int(self.arm_window, "arm_window", 2, ConfigError)
        self.arm_min = check_int(self.arm_min, "arm_min", 1, ConfigError)
        if self.arm_min > self.arm_window:
            raise ConfigError(f"arm_min {self.arm_min} exceeds arm_window {self.arm_window}")
        self.arm_probe_after = check_int(self.arm_probe_after, "arm_probe_after", 1, ConfigError)
        self.depth_window = check_int(self.depth_window, "depth_window", 1, ConfigError)
        if not 0.0 <= self.skip_share < math.inf:
            raise ConfigError(f"skip_share must be finite and >= 0, got {self.skip_share}")
        if not 0.0 < self.cost_weight <= math.inf:
            raise ConfigError(f"cost_weight must be > 0 (inf: no learning), got {self.cost_weight}")
        if not 0.0 <= self.band_optimism < math.inf:
            raise ConfigError(f"band_optimism must be finite and >= 0, got {self.band_optimism}")
        if self.pick not in ("drafted", "calibrated"):
            raise ConfigError(f"pick must be 'drafted' or 'calibrated', got {self.pick!r}")

    @property
    def _params(self) -> dict[str, float]:
        return {
            "prior": self.prior,
            "prior_weight": self.prior_weight,
            "band_optimism": self.band_optimism,
        }

    @property
    def calibration(self) -> np.ndarray:
        """``[2, bins]``: per depth class (depth 1, deeper) and bin of
        :data:`CALIBRATION_BINS`, accepted over predicted nodes so far, with the other
        class's ratio worth ``prior_weight`` nodes, and ``prior`` worth ``prior_weight``
        nodes of that (``prior`` before any step), clipped to ``[0.02, 1 / the bin's
        typical probability]``. Each class shrinks towards the other's ratio: a class with
        no tried nodes yet, such as the deeper nodes of a drafter whose first tokens all
        failed, takes the other's, so a chain still loses value geometrically with depth; a
        class's own nodes are counted once (a pooled ratio as the prior would count them
        twice and sink a few early failures to a tenth)."""
        cal: np.ndarray = self.stats.calibration(**self._params)
        return cal

    def band_factors(self, bands: int, source: int = 0) -> np.ndarray:
        """``[bands]``: per rank band (:func:`rank_bands`) of ``source``'s trees (a
        request's candidate position), accepted over predicted (per-node calibrated)
        values of the observed nodes so far, shrunk towards the band before it (worth
        ``prior_weight`` predicted tokens; band 0 towards ``prior``), plus
        ``band_optimism`` standard errors (accepted counts taken as Poisson), at least
        0.02."""
        bands = check_int(bands, "bands", 0, ConfigError)
        source = check_int(source, "source", 0, ConfigError)
        f: np.ndarray = self.stats.band_factors(bands, source=source, **self._params)
        return f

    def _recent_depth(self, rids: Sequence[int] | None) -> int | None:
        """The longest acceptance of the last ``depth_window`` steps (of ``rids``' own
        steps when given); None before any such step."""
        if rids is None:
            return max(self._depths) if self._depths else None
        seen = [max(d) for r in rids if (d := self._req_depths.get(r))]
        return max(seen) if seen else None

    def forget(self, rid: int) -> None:
        """Drop request ``rid``'s own windows (it finished)."""
        self._req_depths.pop(rid, None)
        self._req_tally.pop(rid, None)

    def request_factor(self, rid: int, source: int = 0) -> float:
        """Request ``rid``'s factor on its candidate ``source``'s values: what those
        candidates' decided nodes realised over what they were priced at, over its last
        ``request_window`` steps (:meth:`learn`), with 1 worth ``prior_weight`` priced
        tokens, in ``[0.05, 2]``."""
        tallies = self._req_tally.get(rid)
        if not tallies or source >= len(tallies) or not tallies[source]:
            return 1.0
        w = self.prior_weight
        pred = sum(p for p, _ in tallies[source])
        real = sum(r for _, r in tallies[source])
        return min(max((real + w) / (pred + w), 0.05), 2.0)

    def draft_depth(self, limit: int, rids: Sequence[int] | None = None) -> int:
        """How many depths a per-depth drafter should draft this step (at most ``limit``):
        such drafters pay per depth (the block drafter's LM head runs on one row per
        depth), and depths past what gets accepted only widen the choice, so two beyond the
        longest acceptance of the last ``depth_window`` steps (``limit`` before any step).
        An acceptance that reaches the cap raises it the next step; depths that stop paying
        drop out of the window. (Accepted, not verified, depth: a combined drafter's suffix
        chains are verified deep and fail, which says nothing of the model's depths.)
        ``rids``: the step's requests, judged by their own steps (:attr:`_req_depths`)."""
        depth = self._recent_depth(rids)
        if depth is None:
            return limit
        return max(1, min(limit, depth + 2))

    def forward_costs(self, rows: int, most: int) -> np.ndarray:
        """``[most + 1]``: the target forward's seconds for ``rows`` requests of ``b + 1``
        tokens each, ``b = 0..most``: the cost model's figures times a measured-over-modelled
        ratio learnt from the steps' own forwards (``cost_weight``). A token count fed ``n``
        times so far (up to 16) has the ratio of its forwards' median, weighed ``n``
        against the median ratio of the last 32 forwards (the level the loop runs at: its
        context, its load) weighed ``cost_weight``; counts between those fed take the
        interpolated ratio, counts beyond them the nearest one's. (One ratio for every
        count would keep the model's shape, and a budget that only ever fed its big trees
        would never see that small ones are cheaper.)"""
        self._sync_cost()
        est = self._est.get((rows, most))
        if est is not None:
            return est
        model = self._secs.get((rows, most))
        if model is None:
            model = self._secs[(rows, most)] = self.cost.many(rows * np.arange(1, most + 2))
        if not self._cost_ratios:
            return model
        # Per token count fed: measured over modelled, shrunk towards the recent level;
        # between counts fed, interpolated; beyond them, the nearest one's.
        w, level = self.cost_weight, self._level
        if level is None:
            level = self._level = _median(self._cost_ratios)
        own = self._fed_ratio.get(rows) if most == 0 else None
        if own is not None:  # a plain step's, fed before (every step asks): its own ratio
            q, c = own
            est = model * ((w * level + c * q) / (w + c))
            self._est[(rows, most)] = est
            return est
        if self._curve is None:
            fed = sorted(self._fed_ratio)
            ratio = [
                (w * level + c * q) / (w + c) for q, c in map(self._fed_ratio.__getitem__, fed)
            ]
            self._curve = (fed, ratio)
        fed, ratio = self._curve
        if most == 0:  # one point, without numpy's calls
            i = bisect.bisect_left(fed, rows)
            if i == 0 or i == len(fed):
                r = ratio[min(i, len(fed) - 1)]
            else:
                a, b = fed[i - 1], fed[i]
                r = ratio[i - 1] + (ratio[i] - ratio[i - 1]) * (rows - a) / (b - a)
            est = model * r
        else:
            est = model * np.interp(rows * np.arange(1, most + 2), fed, ratio)
        self._est[(rows, most)] = est
        return est

    def size_bound(self, rids: Sequence[int] | None = None) -> int:
        """The most drafted nodes :meth:`choose_among` can pick this step: ``max_budget``
        within the trust region (``growth``). Trees need not be drafted any bigger: a
        best-first tree's first ``b`` nodes are its ``b``-node tree, so a drafter asked for
        this many builds the same candidates for every size the budget weighs, with less
        work (top-k per depth, heap, deeper rows; block + suffix spent 0.5 ms a step more
        drafting at 64 nodes than at 4). ``rids``: the step's requests, whose own
        acceptance bounds their trees (a new request starts at ``growth``)."""
        if self.growth is None:
            return self.max_budget
        return min(self.max_budget, self.growth * (1 + (self._recent_depth(rids) or 0)))

    def node_values(self, tree: DraftTree, *, sized: bool = True, source: int = 0) -> np.ndarray:
        """Each drafted node's expected contribution to the acceptance length, in node
        order: its path probability with each step's conditional probability scaled by
        :attr:`calibration` (capped so no step is surer than certain), times its rank
        band's factor (``source``'s, :meth:`band_factors`; not with ``sized=False``), at
        most 1. A tree without probabilities takes its depths' measured acceptance rates."""
        source = check_int(source, "source", 0, ConfigError)
        v: np.ndarray = self.stats.node_values(
            tree._arrays, sized=sized, source=source, **self._params
        )
        return v

    def choose(self, trees: Sequence[DraftTree]) -> BudgetChoice:
        """The node count (shared by the batch's rows, which are padded to one size) that
        maximises expected tokens per second, within the trust region (``growth``)."""
        return self.choose_among([[t] for t in trees])

    def choose_among(
        self,
        candidates: Sequence[Sequence[DraftTree]],
        *,
        forced: Sequence[int] | None = None,
        rids: Sequence[int] | None = None,
    ) -> BudgetChoice:
        """As :meth:`choose`, with several candidate trees per request (e.g. a model's and
        a suffix index's, :meth:`~specdec.draft.CombinedDrafter.candidates`): for each
        size, each request takes the candidate ranked highest on its first that many nodes
        (:attr:`pick`: by the drafters' expected acceptance, or by the calibrated values),
        so the source is chosen at the size that will be verified; the picked candidates'
        calibrated values price the size. ``picks`` says which.

        ``forced``: per request, nodes its tree carries before the candidate (a grammar's
        forced tokens, :mod:`specdec.draft.grammar`): each is one sure token, fed at every
        size (the rows are padded to the longest chain), and the candidate sizes stop at
        ``max_budget`` nodes in all. ``nodes`` counts the candidate's nodes alone.
        ``rids``: the requests' ids, for their own trust regions (:meth:`size_bound`) and
        factors on their candidates' values (:meth:`request_factor`)."""
        r = len(candidates)
        k = [check_int(x, "forced", 0, ConfigError) for x in forced] if forced else [0] * r
        if len(k) != r:
            raise ConfigError(f"forced has {len(k)} entries for {r} requests")
        chain = max(k, default=0)
        if chain == 0 and all(t.num_nodes == 1 for trees in candidates for t in trees):
            # Nothing drafted (no match in the suffix index): the plain step, unpriced.
            self._chosen = None
            secs0 = float(self.forward_costs(r, 0)[0]) + self.host_seconds
            return BudgetChoice(0, float(r), secs0, (0,) * r)
        most = max(min(self.size_bound(rids), self.max_budget - chain), 0)
        arrays = [[t._arrays for t in trees] for trees in candidates]
        scales = None
        if rids is not None:
            if len(rids) != r:
                raise ConfigError(f"rids has {len(rids)} entries for {r} requests")
            if any(x in self._req_tally for x in rids):
                scales = [
                    [self.request_factor(x, j) for j in range(len(trees))]
                    for x, trees in zip(rids, candidates, strict=True)
                ]
        g = self.stats.choose(arrays, most, pick=self.pick, scales=scales, **self._params)
        gains, which = g.gains * self.choice_factor + sum(k), g.picks
        secs = self.forward_costs(r, most + chain)[chain:] + self.host_seconds
        rate = (r + gains) / secs

        def at(b: int) -> BudgetChoice:
            picks = tuple(int(x) for x in which[:, b])
            return BudgetChoice(b, float(r + gains[b]), float(secs[b]), picks)

        plain = at(0)
        best, best_rate = None, -1.0  # the best non-empty tree size (the first of ties)
        if most >= 1:
            b = 1 + int(np.argmax(rate[1:]))
            best, best_rate = at(b), rate[b]
        if best is not None and best_rate > plain.expected_tokens / plain.expected_seconds:
            self._skipped = 0
            self._chosen = float(g.gains[best.nodes])
            return best
        drafted = any(t.num_real > 1 for trees in candidates for t in trees)
        if self.probe and drafted and best is not None:
            self._skipped += 1
            if self._skipped >= self.probe_after:
                self._skipped, self._probing = 0, True
                self._chosen = float(g.gains[best.nodes])
                return best
        self._chosen = None
        return plain

    @property
    def choice_factor(self) -> float:
        """Accepted over expected drafted tokens of the trees the budget chose to verify,
        over the last ``choice_window`` such steps (worth ``prior_weight`` tokens at 1.0),
        in ``[0.05, 2]``: the values that made a tree win are its estimate's lucky side
        (a size is verified when its values are high), so the chosen trees accept less
        than their values say, and each size's gains are scaled by this before they are
        priced. (The suffix drafter on SmolLM2's questions: its trees accepted 1.1
        tokens a step where their values promised more, and the forwards of the trees
        cost 16% more than plain ones: 0.92x of plain decoding.)"""
        if not self._choices:
            return 1.0
        w = self.prior_weight
        exp = sum(e for e, _ in self._choices)
        acc = sum(a for _, a in self._choices)
        return min(max((acc + w) / (exp + w), 0.05), 2.0)

    def arm(self, rows: int = 1, *, lite: bool = False) -> str:
        """Which arm of :data:`ARMS` the coming step (``rows`` requests) runs: ``"full"``
        (the drafter), ``"lite"`` (only with ``lite``: a combined drafter's suffix index
        alone) or ``"plain"`` (no draft), by the tokens per second each delivered lately
        (see the arms' field comments). :meth:`observe` takes the step's ``arm``."""
        runs, summary = self._arm_runs, self._arm_summary
        if not self.probe or len(runs["full"]) < self.arm_min:
            return "full"
        plain = self._plain_seconds(rows)
        # Only a draft that costs something is worth leaving out: a cheap one (a suffix
        # index) keeps running and the budget verifies its trees only when they pay. Its
        # cost is its cheapest recent draft: a request's first also indexes its prompt,
        # which once made a suffix index look dear enough to leave out, and a combined
        # drafter then ran plain steps through text its index would have copied.
        floor = self.skip_share * plain
        draft = summary["full"][1]
        names = ["full"]
        if lite and draft > floor:
            names.append("lite")
        lite_draft = summary["lite"][1] if "lite" in summary else 0.0
        if (lite_draft if lite else draft) > floor:
            names.append("plain")
        rates: dict[str, float] = {}
        for a in names:
            if len(runs[a]) >= self.arm_min:
                rates[a] = summary[a][0]
            elif a == "plain":
                rates[a] = rows / plain
            else:
                return a  # measure it
        best = max(names, key=rates.__getitem__)  # ties: the first, the fuller draft
        for a in names:
            if a != best and self._since[a] >= self.probe_wait(a):
                self._arm_probing = a
                return a
        return best

    def probe_wait(self, arm: str) -> int:
        """Steps without ``arm`` (of :data:`ARMS`) before it is probed while another arm
        runs (see :meth:`arm`)."""
        return self._probe_after.get(arm, self.arm_probe_after)

    def _plain_seconds(self, rows: int) -> float:
        """A plain step's seconds for ``rows`` requests, without a draft: the forward by
        the cost model (as learnt), the host's work of the full arm's steps less their
        draft."""
        full = self._arm_summary.get("full")
        host = 0.0 if full is None else full[2]
        return float(self.forward_costs(rows, 0)[0]) + max(host, 0.0)

    def observe(
        self,
        trees: Sequence[DraftTree],
        accepted: Sequence[int | np.ndarray],
        host: float,
        *,
        draft: float = 0.0,
        drafted: bool = True,
        forward: float | None = None,
        fed: int | None = None,
        learn: bool = True,
        arm: str | None = None,
        committed: int | None = None,
        rids: Sequence[int] | None = None,
        model_verified: bool | None = None,
    ) -> None:
        """Learn from a finished step: the trees verified, what each accepted (its accepted
        node indices, root excluded, as :attr:`~specdec.tree.WalkResult.accepted`; or just
        their count, taken as the likeliest path's first nodes), the step's seconds
        besides the forward (``host``, the draft's ``draft`` included), and whether it ran
        the drafter (``drafted``; the seconds of a step that did not are not learnt), and
        the target forward's seconds (``forward``) for the ``fed`` tokens of all rows
        (default: every tree's nodes), which refine the cost model.

        The calibrations learn from the verified trees (as source 0), unless ``learn`` is
        False: then the caller feeds them with :meth:`learn` (as the generator does, with
        each request's candidate trees and the tokens the step committed).

        ``arm`` (:meth:`arm`) and ``committed``, the tokens the step committed in all: what
        the arm delivered, over the step's seconds (``host`` plus ``forward``).

        ``rids``: the ids of the requests whose trees ``trees`` are, in order (their own
        trust regions, :meth:`size_bound`). ``model_verified``: for a combined drafter's full
        step, whether its model's tree was verified (False: the step took the suffix
        index's trees, so as a probe it says nothing for the model)."""
        if arm is not None and committed is not None:
            seconds = host + (forward or 0.0)
            self._observe_arm(arm, committed, seconds, draft, host, model_verified)
        counts = [int(a) if isinstance(a, int | np.integer) else len(a) for a in accepted]
        if self._chosen is not None:
            self._choices = [*self._choices, (self._chosen, float(sum(counts)))]
            del self._choices[: -self.choice_window]
            self._chosen = None
        if self._probing:
            self._probing = False
            paid = sum(counts) > 0
            self.probe_after = 8 if paid else min(2 * self.probe_after, 1024)
        self._depths = [*self._depths, max(counts, default=0)][-self.depth_window :]
        if rids is not None:
            if len(rids) != len(counts):
                raise ConfigError(f"rids has {len(rids)} entries for {len(counts)} trees")
            for rid, c in zip(rids, counts, strict=True):
                d = self._req_depths.setdefault(rid, [])
                d.append(c)
                del d[: -self.depth_window]
        if learn:
            for tree, acc, c in zip(trees, accepted, counts, strict=True):
                if tree.num_real == 1 and c == 0:
                    continue  # a root alone (a plain step) teaches nothing
                a = acc if isinstance(acc, int | np.integer) else np.asarray(acc, dtype=np.int64)
                self.stats.observe(tree._arrays, a, source=0, **self._params)
        if forward is not None and self.cost_weight < math.inf:
            self._learn_forward(sum(t.num_nodes for t in trees) if fed is None else fed, forward)
        if drafted:
            self._hosts = [*self._hosts[-15:], host]
            # A plain sort, not numpy: 16 floats, and numpy's median took 40 us a step.
            self.host_seconds = _median(self._hosts)

    def _observe_arm(
        self,
        arm: str,
        committed: int,
        seconds: float,
        draft: float,
        host: float,
        model_verified: bool | None = None,
    ) -> None:
        if arm not in ARMS:
            raise ConfigError(f"arm must be one of {ARMS}, got {arm!r}")
        if committed < 1 or not 0.0 < seconds < math.inf:
            return  # nothing to learn from (a clock too coarse to time the step)
        runs = self._arm_runs[arm]
        if arm == self._arm_probing:
            others = [_rate(r) for a, r in self._arm_runs.items() if a != arm and r]
            paid = not others or committed / seconds >= max(others)
            # A combined drafter's full step that verified only the suffix index's trees
            # delivered the lite arm's tokens by luck of the draw (a repeat's acceptance
            # swings 3 to 15 tokens a step), not by its model: no reason to judge afresh.
            paid = paid and model_verified is not False
            after = self.probe_wait(arm)
            self._probe_after[arm] = max(16, after // 2) if paid else min(2 * after, 1024)
            if paid:
                # Its window is out of date (the text changed: a request that repeats
                # after one that did not; or the load did): judge it afresh, from this
                # probe on, instead of waiting for probes to outvote a window of old steps
                # one at a time. A paid full probe judges both drafting arms afresh.
                runs.clear()
                if arm == "full":
                    self._arm_runs["lite"].clear()
                    self._arm_summary.pop("lite", None)
        self._arm_probing = None
        for a in ARMS:
            self._since[a] = 0 if a == arm else self._since[a] + 1
        runs.append((committed, seconds, draft, host))
        del runs[: -self.arm_window]
        self._summarize(arm)

    def _summarize(self, arm: str) -> None:
        """Refresh ``arm``'s :attr:`_arm_summary` from its window."""
        runs = self._arm_runs[arm]
        if not runs:
            self._arm_summary.pop(arm, None)
            return
        host = _median([r[3] - r[2] for r in runs])
        self._arm_summary[arm] = (_rate(runs), min(r[2] for r in runs), host)

    def learn(
        self,
        candidates: Sequence[DraftTree],
        path: Sequence[int] | np.ndarray,
        rid: int | None = None,
    ) -> None:
        """Learn from one request's candidate trees of a step (as :meth:`choose_among` got
        them, whole: candidate ``j`` is source ``j``), given ``path``, the tokens the step
        committed (the accepted ones, then the bonus): the walk accepts a child when its
        token is the rule's choice at its parent, and the tokens committed are the rule's
        choices along their path, so they decide every node they reach, verified or not;
        nodes below the path's end count their calibrated expectation. Learnt from the
        verified cuts alone, a size was measured only on the steps the budget already
        chose it at, and a source only where it was picked. (Waiting for later steps'
        commits to decide the deeper nodes too left the first steps on the prior for
        longer, and did worse in ``bench_budget_replay.py``: 19 of 24 cells within 5%,
        against 24.) ``rid``: the request's id, for its own factors
        (:meth:`request_factor`)."""
        if all(t.num_real == 1 for t in candidates):
            return  # nothing drafted: nothing to learn (most steps where text is new)
        if len(path) == 0:  # an empty list would read as float64: every node is guessed
            path = np.zeros(0, dtype=np.int64)
        p = np.ascontiguousarray(as_array(path, np.int64, "path", 1, False, ConfigError))
        tallies = None
        if rid is not None:
            tallies = self._req_tally.setdefault(rid, [])
            tallies.extend([] for _ in range(len(candidates) - len(tallies)))
        for j, tree in enumerate(candidates):
            if tree.num_real > 1:  # a root alone teaches nothing
                t = self.stats.observe_path(tree._arrays, p, source=j, **self._params)
                if tallies is not None and t.predicted > 0.0:
                    tallies[j].append((t.predicted, t.realised))
                    del tallies[j][: -self.request_window]

    def _sync_cost(self) -> None:
        """Forget what was derived from an earlier cost model (``cost`` was replaced)."""
        if self._secs_of is not self.cost:
            self._secs, self._secs_of, self._modelled = {}, self.cost, {}
            self._est, self._curve, self._level = {}, None, None
            self._fed_ratio = {
                n: (_median(ts) / self.cost(n), len(ts)) for n, ts in self._forwards.items()
            }

    def _learn_forward(self, fed: int, seconds: float) -> None:
        fed = check_int(fed, "fed", 1, ConfigError)
        if not 0.0 < seconds < math.inf:
            raise ConfigError(f"a forward's seconds must be finite and > 0, got {seconds}")
        self._sync_cost()
        ts = self._forwards[fed] = [*self._forwards.get(fed, []), seconds][-16:]
        modelled = self._modelled.get(fed)
        if modelled is None:
            modelled = self._modelled[fed] = self.cost(fed)
        self._cost_ratios = [*self._cost_ratios, seconds / modelled][-32:]
        self._fed_ratio[fed] = (_median(ts) / modelled, len(ts))
        self._est, self._curve, self._level = {}, None, None
