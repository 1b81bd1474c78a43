"""The adaptive budget's statistics (Rust, ``specdec._core.BudgetStats``) against a plain
reference: every node's value by walking its path to the root, every choice by trying each
candidate at each size, every update by counting tried and accepted nodes one by one."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import specdec
from specdec import _core
from specdec.decode import AdaptiveBudget, CostModel
from specdec.decode.budget import CALIBRATION_BINS
from specdec.errors import ConfigError

EDGES = CALIBRATION_BINS[:-1]
MID = [0.01, 0.035, 0.075, 0.15, 0.25, 0.375, 0.525, 0.7, 0.875, 0.975]


class SourceRef:
    """The size calibration's sums for one source's trees (a request's candidate)."""

    def __init__(self) -> None:
        self.band_predicted: list[float] = []
        self.band_realised: list[float] = []

    def grow(self, bands: int) -> None:
        while len(self.band_predicted) < bands:
            self.band_predicted.append(0.0)
            self.band_realised.append(0.0)


class Reference:
    """The statistics, written plainly: the per-node calibration and the depth counts
    shared, the size calibration per source."""

    def __init__(self) -> None:
        self.predicted = [[0.0] * 10 for _ in range(2)]
        self.realised = [[0.0] * 10 for _ in range(2)]
        self.sources: list[SourceRef] = []
        self.tried: list[float] = []
        self.reached: list[float] = []

    def src(self, source: int) -> SourceRef:
        while len(self.sources) <= source:
            self.sources.append(SourceRef())
        return self.sources[source]

    def arrays(self) -> dict[str, np.ndarray]:
        """The band sums as the Rust getters give them: ``[sources, bands]``
        (zero-padded)."""
        n = len(self.sources)
        cols = max((len(x.band_predicted) for x in self.sources), default=0)
        out = {"band_predicted": np.zeros((n, cols)), "band_realised": np.zeros((n, cols))}
        for i, x in enumerate(self.sources):
            out["band_predicted"][i, : len(x.band_predicted)] = x.band_predicted
            out["band_realised"][i, : len(x.band_realised)] = x.band_realised
        return out

    def calibration(self, prior: float, w: float) -> list[list[float]]:
        x = self
        out = [[0.0] * 10 for _ in range(2)]
        for c in range(2):
            for b in range(10):
                other = (x.realised[1 - c][b] + w * prior) / (x.predicted[1 - c][b] + w)
                ratio = (x.realised[c][b] + w * other) / (x.predicted[c][b] + w)
                out[c][b] = min(max(ratio, 0.02), 1.0 / MID[b])
        return out

    def band_factors(
        self, bands: int, prior: float, w: float, opt: float, source: int = 0
    ) -> list[float]:
        x = self.src(source)
        out, before = [], prior
        for k in range(bands):
            p = x.band_predicted[k] if k < len(x.band_predicted) else 0.0
            a = x.band_realised[k] if k < len(x.band_realised) else 0.0
            before = (a + w * before) / (p + w)
            out.append(max(before + opt * math.sqrt(before * p) / (p + w), 0.02))
        return out

    def path_values(
        self, tree: specdec.DraftTree, prior: float, w: float, source: int = 0
    ) -> list[float]:
        n, par, dep = tree.num_real, tree.parents, tree.depths
        if scored(tree):
            cal = self.calibration(prior, w)
            out = []
            for i in range(1, n):
                value, node = 1.0, i
                while node > 0:
                    q = cond(tree, node)
                    value *= min(q * cal[int(dep[node] > 1)][bin_of(q)], 1.0)
                    node = int(par[node])
                out.append(value)
            return out
        rates = []
        for i in range(1, n):
            d = int(dep[i]) - 1
            have = d < len(self.tried)
            rates.append(
                (self.reached[d] + 0.5) / (self.tried[d] + 1.0) if have else 0.5 ** (d + 1)
            )
        return rates

    def node_values(
        self, tree: specdec.DraftTree, prior: float, w: float, opt: float, source: int = 0
    ) -> list[float]:
        pv = self.path_values(tree, prior, w, source)
        if not scored(tree) or not pv:
            return pv
        f = self.band_factors(band(len(pv)) + 1, prior, w, opt, source)
        out: list[float] = []
        for r, v in enumerate(pv):  # at most its parent's value (and 1)
            par = int(tree.parents[r + 1])
            out.append(min(v * f[band(r + 1)], 1.0 if par == 0 else out[par - 1]))
        return out

    def observe(
        self,
        tree: specdec.DraftTree,
        acc: int | list[int],
        prior: float,
        w: float,
        source: int = 0,
    ) -> None:
        n, par, lp = tree.num_real, tree.parents, tree.logprobs
        count = acc if isinstance(acc, int) else len(acc)
        if n > 1 and scored(tree):
            x = self.src(source)
            values = self.path_values(tree, prior, w, source)
            hit = [i == 0 for i in range(n)]
            if isinstance(acc, int):
                node = 0
                for _ in range(acc):
                    kids = [i for i in range(1, n) if par[i] == node]
                    if not kids:
                        break
                    node = max(kids, key=lambda i: (lp[i], -i))  # the first of ties
                    hit[node] = True
            else:
                for i in acc:
                    hit[i] = True
            x.grow(band(n - 1) + 1)
            for i in range(1, n):
                if hit[int(par[i])]:
                    q = cond(tree, i)
                    c = int(tree.depths[i] > 1)
                    self.predicted[c][bin_of(q)] += q
                    self.realised[c][bin_of(q)] += float(hit[i])
                x.band_predicted[band(i)] += values[i - 1]
                x.band_realised[band(i)] += float(hit[i])
        if n > 1:
            deepest = int(tree.depths[1:n].max())
            while len(self.tried) < deepest:
                self.tried.append(0.0)
                self.reached.append(0.0)
            for d in range(deepest):
                self.tried[d] += 1.0
                self.reached[d] += float(count > d)

    def observe_path(
        self, tree: specdec.DraftTree, path: list[int], prior: float, w: float, source: int = 0
    ) -> None:
        """A tree the committed ``path`` decides: a node within its length is accepted
        when its tokens from the root are the path's; one below it counts its calibrated
        conditionals multiplied up to its last decided ancestor (times that one's
        outcome)."""
        n, par, dep, tok = tree.num_real, tree.parents, tree.depths, tree.tokens
        if n <= 1:
            return

        def matches(i: int) -> bool:
            while i > 0:
                d = int(dep[i])
                if d > len(path) or path[d - 1] != tok[i]:
                    return False
                i = int(par[i])
            return True

        cal = self.calibration(prior, w) if scored(tree) else None
        values = self.path_values(tree, prior, w, source) if scored(tree) else []
        x = self.src(source)
        if scored(tree):
            x.grow(band(n - 1) + 1)
        max_d = deepest = 0
        for i in range(1, n):
            d = int(dep[i])
            if d <= len(path):
                max_d = max(max_d, d)
                p = int(par[i])
                if matches(p):
                    deepest = max(deepest, d if matches(i) else 0)
                    if cal is not None:
                        q, c = cond(tree, i), int(d > 1)
                        self.predicted[c][bin_of(q)] += q
                        self.realised[c][bin_of(q)] += float(matches(i))
            if cal is not None:
                e, node = 1.0, i
                while int(dep[node]) > len(path):
                    q = cond(tree, node)
                    e *= min(q * cal[int(dep[node] > 1)][bin_of(q)], 1.0)
                    node = int(par[node])
                x.band_predicted[band(i)] += values[i - 1]
                x.band_realised[band(i)] += e * float(matches(node))
        while len(self.tried) < max_d:
            self.tried.append(0.0)
            self.reached.append(0.0)
        for d in range(max_d):
            self.tried[d] += 1.0
            self.reached[d] += float(deepest > d)


def scored(tree: specdec.DraftTree) -> bool:
    return not math.isnan(tree.expected_acceptance)


def cond(tree: specdec.DraftTree, i: int) -> float:
    lp, p = tree.logprobs, int(tree.parents[i])
    return 0.0 if lp[p] == -math.inf else math.exp(lp[i] - lp[p])


def bin_of(q: float) -> int:
    return sum(1 for e in EDGES if e <= q)


def band(rank: int) -> int:
    return (rank - 1).bit_length()


@st.composite
def trees(draw: st.DrawFn) -> specdec.DraftTree:
    links = draw(st.lists(st.integers(0, 1 << 20), max_size=30))
    parents = [-1] + [x % (i + 1) for i, x in enumerate(links)]
    if draw(st.booleans()) and len(parents) > 1:
        return specdec.DraftTree(list(range(len(parents))), parents)  # no probabilities
    q = draw(
        st.lists(
            st.one_of(st.just(0.0), st.just(1.0), st.just(0.05), st.floats(1e-4, 1.0)),
            min_size=len(links),
            max_size=len(links),
        )
    )
    lp = [0.0]
    for p, qi in zip(parents[1:], q, strict=True):
        lp.append(lp[p] + (math.log(qi) if qi > 0 else -math.inf))
    return specdec.DraftTree(list(range(len(parents))), parents, logprobs=lp)


@st.composite
def accepted(draw: st.DrawFn, tree: specdec.DraftTree) -> int | list[int]:
    """A count, or a path of node indices from the root (what a walk accepts)."""
    if draw(st.booleans()):
        return draw(st.integers(0, 8))
    path, node = [], 0
    while draw(st.booleans()):
        kids = [i for i in range(1, tree.num_real) if tree.parents[i] == node]
        if not kids:
            break
        node = draw(st.sampled_from(kids))
        path.append(node)
    return path


settings_ = {"prior": st.floats(0.1, 2.0), "w": st.floats(0.5, 5.0), "opt": st.floats(0.0, 3.0)}


@settings(max_examples=60, deadline=None)
@given(data=st.data(), prior=settings_["prior"], w=settings_["w"], opt=settings_["opt"])
def test_stats_follow_the_reference(
    data: st.DataObject, prior: float, w: float, opt: float
) -> None:
    """Steps of choosing among random candidates and observing one: values, choices,
    calibration and band factors agree with the plain reference after every step."""
    kw = {"prior": prior, "prior_weight": w, "band_optimism": opt}
    rust, ref = _core.BudgetStats(), Reference()
    for _ in range(data.draw(st.integers(1, 6))):
        reqs = data.draw(
            st.lists(st.lists(trees(), min_size=1, max_size=3), min_size=1, max_size=3)
        )
        most = data.draw(st.integers(0, 40))
        how = data.draw(st.sampled_from(["drafted", "calibrated"]))
        got = rust.choose([[t._arrays for t in ts] for ts in reqs], most, pick=how, **kw)
        assert got.gains.shape == (most + 1,) and got.picks.shape == (len(reqs), most + 1)
        for b in range(most + 1):
            total = 0.0
            for r, ts in enumerate(reqs):
                # Candidate j is valued with source j's calibrations.
                sums = [sum(ref.node_values(t, prior, w, opt, j)[:b]) for j, t in enumerate(ts)]
                # Ranked by the drafter's path probabilities (scored trees, "drafted") or
                # by the values.
                ranks = [
                    sum(math.exp(x) for x in t.logprobs[1 : min(b + 1, t.num_real)])
                    if how == "drafted" and scored(t)
                    else v
                    for t, v in zip(ts, sums, strict=True)
                ]
                best = max(ranks)
                pick = int(got.picks[r, b])
                assert ranks[pick] >= best - 1e-9 and all(s < best + 1e-9 for s in ranks[:pick])
                total += sums[pick]
            assert got.gains[b] == pytest.approx(total, rel=1e-9, abs=1e-12)
        for ts in reqs:
            for j, t in enumerate(ts):
                want = ref.node_values(t, prior, w, opt, j)
                have = rust.node_values(t._arrays, source=j, **kw)
                np.testing.assert_allclose(have, want, rtol=1e-9)
                want = ref.path_values(t, prior, w, j)
                have = rust.node_values(t._arrays, sized=False, source=j, **kw)
                np.testing.assert_allclose(have, want, rtol=1e-9)
        ts = data.draw(st.sampled_from(reqs))
        source = data.draw(st.integers(0, len(ts) - 1))
        tree = ts[source]
        acc = data.draw(accepted(tree))
        if data.draw(st.booleans()):
            # The committed path (accepted tokens, then a bonus) decides the whole tree.
            nodes = [] if isinstance(acc, int) else acc
            bonus = data.draw(st.integers(0, tree.num_real + 2))
            path = [int(tree.tokens[i]) for i in nodes] + [bonus]
            rust.observe_path(tree._arrays, np.array(path, dtype=np.int64), source=source, **kw)
            ref.observe_path(tree, path, prior, w, source)
        else:
            arg = acc if isinstance(acc, int) else np.array(acc, dtype=np.int64)
            rust.observe(tree._arrays, arg, source=source, **kw)
            ref.observe(tree, acc, prior, w, source)
        sums = ref.arrays()
        np.testing.assert_allclose(rust.predicted, ref.predicted, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(rust.realised, ref.realised, rtol=1e-12, atol=1e-12)
        for name in ("band_predicted", "band_realised"):
            have = getattr(rust, name)
            want = sums[name][: have.shape[0]]  # the reference's sources read but not fed
            assert not sums[name][have.shape[0] :].any()
            np.testing.assert_allclose(have, want, rtol=1e-9, atol=1e-12, err_msg=name)
        np.testing.assert_array_equal(rust.tried, ref.tried)
        np.testing.assert_array_equal(rust.reached, ref.reached)
        np.testing.assert_allclose(rust.calibration(**kw), ref.calibration(prior, w), rtol=1e-12)
        for j in range(3):
            want = ref.band_factors(6, prior, w, opt, j)
            np.testing.assert_allclose(rust.band_factors(6, source=j, **kw), want, rtol=1e-12)


def test_adaptive_budget_reads_its_settings_at_each_call() -> None:
    """A setting changed after construction takes effect (it is passed with each call)."""
    ab = AdaptiveBudget(CostModel([1, 9], [1.0, 1.2]), 8)
    tree = specdec.DraftTree([0, 1, 2], [-1, 0, 1], logprobs=[0.0, -0.1, -0.2])
    ab.observe([tree], [np.array([1], dtype=np.int64)], 0.0)
    before = ab.calibration.copy()
    ab.prior = 0.5
    assert (ab.calibration <= before).all() and (ab.calibration < before).any()


def test_bad_input_is_a_config_error() -> None:
    stats = _core.BudgetStats()
    kw = {"prior": 1.0, "prior_weight": 2.0, "band_optimism": 1.0}
    tree = specdec.DraftTree([0, 1, 2], [-1, 0, 1], logprobs=[0.0, -0.1, -0.2])
    with pytest.raises(ConfigError, match="accepted node 3"):
        stats.observe(tree._arrays, np.array([1, 3], dtype=np.int64), **kw)
    with pytest.raises(ConfigError, match="accepted node 0"):
        stats.observe(tree._arrays, np.array([0], dtype=np.int64), **kw)
    with pytest.raises(ConfigError):
        stats.observe(tree._arrays, -1, **kw)
    with pytest.raises(specdec.errors.SpecdecTypeError):
        stats.observe(tree._arrays, "two", **kw)
    with pytest.raises(ConfigError, match="prior"):
        stats.choose([[tree._arrays]], 4, prior=0.0, prior_weight=2.0, band_optimism=1.0)
    with pytest.raises(ConfigError, match="band_optimism"):
        stats.calibration(prior=1.0, prior_weight=2.0, band_optimism=math.nan)
    with pytest.raises(ConfigError, match="pick must be"):
        stats.choose([[tree._arrays]], 4, pick="raw", **kw)
    with pytest.raises(ConfigError, match="pick must be"):
        AdaptiveBudget(CostModel([1, 9], [1.0, 1.2]), 8, pick="best")
    ab = AdaptiveBudget(CostModel([1, 9], [1.0, 1.2]), 8)
    with pytest.raises(ConfigError, match="path"):
        ab.learn([tree], [[1, 2]])  # not one token per depth
    with pytest.raises(specdec.errors.SpecdecTypeError, match="path"):
        ab.learn([tree], np.array([1.5]))
    with pytest.raises(ConfigError, match="source"):
        ab.band_factors(3, source=-1)
    # Arrays edited behind the tree's back: an error, not a crash.
    tree.parents[2] = 2
    with pytest.raises(ConfigError, match="parent"):
        stats.choose([[tree._arrays]], 4, **kw)
    nothing = _core.BudgetStats()
    np.testing.assert_array_equal(stats.predicted, nothing.predicted)  # nothing learnt
