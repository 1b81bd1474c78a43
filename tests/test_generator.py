"""The batched, continuous SpeculativeGenerator: every request's output equals the target's
own autoregressive output (greedy), whatever the strategy, drafter, budget, cache, batch
composition or arrival order; streaming, stop tokens, cancellation, prefix-cache starts,
constraints, the adaptive budget against a brute-force choice, and bad input."""

from __future__ import annotations

import itertools
import math
import random
import statistics
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import specdec
from specdec.decode import AdaptiveBudget, CostModel, SpeculativeGenerator, autoregressive_generate
from specdec.decode.budget import CALIBRATION_BINS, rank_bands
from specdec.draft import NgramDrafter, SuffixDrafter
from specdec.errors import ConfigError, KVCacheError, SpecdecTypeError, VerifyError
from specdec.models import LlamaModel
from specdec.testing import OracleDrafter, tiny_config

VOCAB = 32
CFG = tiny_config(VOCAB)


@pytest.fixture(scope="module")
def target() -> LlamaModel:
    return LlamaModel(CFG).double().init_random(3)


def reference(target: LlamaModel, prompt: list[int], n: int, stop: int | None = None) -> list[int]:
    return autoregressive_generate(target, prompt, max_new_tokens=n, eos_token_id=stop).tokens


def prompts(seed: int, count: int) -> list[list[int]]:
    """Prompts with repeats in them, so suffix and n-gram drafters find matches."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        base = [rng.randrange(VOCAB) for _ in range(rng.randrange(1, 6))]
        out.append((base * rng.randrange(1, 4))[: rng.randrange(1, 14)] or [1])
    return out


def drafter_for(name: str, target: LlamaModel) -> object:
    if name == "suffix":
        return SuffixDrafter(max_depth=5)
    if name == "ngram":
        return NgramDrafter(VOCAB, max_depth=5)
    return OracleDrafter(target, miss=0.3, seed=1)


FAST_COST = CostModel([1, 64], [1.0, 1.1])  # a GPU-like target: trees are nearly free
SLOW_COST = CostModel([1, 2, 64], [1.0, 3.0, 200.0])  # every extra token costs double


@pytest.mark.parametrize(
    ("strategy", "drafter", "cache", "budget"),
    [
        ("ddtree", "suffix", "dense", 8),
        ("ddtree", "suffix", "paged", "auto"),
        ("chain", "suffix", "dense", 8),
        ("ddtree", "ngram", "paged", 6),
        ("ddtree", "oracle", "dense", 10),
        ("chain", "oracle", "paged", 10),
        ("ddtree", "oracle", "paged", "auto"),
        ("ar", "suffix", "dense", 8),
    ],
)
def test_batched_generate_is_lossless(target, strategy, drafter, cache, budget) -> None:  # type: ignore[no-untyped-def]
    ps = prompts(len(str(strategy + drafter + cache + str(budget))), 5)
    gen = SpeculativeGenerator(
        target,
        drafter_for(drafter, target),  # type: ignore[arg-type]
        strategy=strategy,
        budget=budget,
        max_depth=5,
        cache=cache,
        max_batch=3,
        cost_model=FAST_COST,
        kv_tokens=1024,
        block_size=4,
    )
    if budget == "auto":  # sizes and arms from FAST_COST alone, not this host's clock
        gen.adaptive = AdaptiveBudget(FAST_COST, gen.max_budget, cost_weight=math.inf)
    results = gen.generate(ps, max_new_tokens=20)
    assert [r.request_id for r in results] == sorted(r.request_id for r in results)
    for p, r in zip(ps, results, strict=True):
        assert r.tokens == reference(target, p, 20), p
        assert r.finish_reason == "length" and r.steps == len(r.accepted) == len(r.tree_sizes)
        assert len(r.tokens) == 20 and r.prompt_len == len(p)
        assert sum(r.accepted) + r.steps >= len(r.tokens)
    if strategy == "ar":
        assert all(sum(r.accepted) == 0 and r.steps == 20 for r in results)
    else:  # the drafters' repeats really get accepted
        assert sum(sum(r.accepted) for r in results) > 0
    if cache == "paged":
        m = gen._pool.manager
        assert not m.sequences()  # every request freed its sequence
        m.check_invariants()


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    seed=st.integers(0, 10_000),
    arrivals=st.lists(st.integers(0, 4), min_size=1, max_size=6),
    max_batch=st.integers(1, 3),
    cancel=st.booleans(),
)
def test_continuous_batching_streams_committed_tokens(
    target: LlamaModel, seed: int, arrivals: list[int], max_batch: int, cancel: bool
) -> None:
    """Requests arrive between steps (``arrivals[i]`` steps after the previous one), the
    batch is capped, one may be cancelled: every finished request equals its AR output, what
    was streamed is exactly its tokens, and the pool ends empty."""
    rng = random.Random(seed)
    gen = SpeculativeGenerator(
        target, SuffixDrafter(max_depth=4), budget=6, cache="paged", max_batch=max_batch,
        kv_tokens=640, block_size=4,
    )  # fmt: skip
    ps = prompts(seed, len(arrivals))
    lengths = [rng.randrange(1, 14) for _ in ps]
    streamed: dict[int, list[int]] = {}
    finished: dict[int, specdec.decode.GenerationResult] = {}
    rids: list[int] = []
    cancelled = None
    pending = list(zip(arrivals, ps, lengths, strict=True))
    wait = pending[0][0] if pending else 0
    while pending or gen.has_unfinished():
        while pending and wait == 0:
            _, p, n = pending.pop(0)
            rids.append(gen.submit(p, max_new_tokens=n))
            wait = pending[0][0] if pending else 0
        wait = max(wait - 1, 0)
        if cancel and cancelled is None and gen.num_running and len(rids) > 1:
            cancelled = rids[0]
            # Cancelling a request that already ended is a no-op.
            assert gen.cancel(cancelled) == (cancelled not in finished)
        for out in gen.step():
            assert out.request_id not in finished
            streamed.setdefault(out.request_id, []).extend(out.new_tokens)
            if out.finished:
                assert out.result is not None
                finished[out.request_id] = out.result
        assert gen.num_running <= max_batch
    for rid, p, n in zip(rids, ps, lengths, strict=True):
        res = finished[rid]
        assert res.tokens == streamed.get(rid, [])
        want = reference(target, p, n)
        if res.finish_reason == "cancelled":
            assert rid == cancelled
            assert res.tokens == want[: len(res.tokens)]
        else:
            assert res.tokens == want
    assert not gen._pool.manager.sequences()
    gen._pool.manager.check_invariants()


def test_stop_tokens_and_zero_tokens(target: LlamaModel) -> None:
    p = [3, 4, 5, 3, 4, 5, 3]
    ref = reference(target, p, 30)
    stop = ref[7]
    gen = SpeculativeGenerator(target, SuffixDrafter(), budget=8)
    res = gen.generate([p, p], max_new_tokens=30, stop_tokens=[stop])
    for r in res:
        assert r.tokens == ref[: ref.index(stop) + 1] and r.finish_reason == "stop"
    assert gen.generate(p, max_new_tokens=0).tokens == []
    assert gen.generate(p, max_new_tokens=0).finish_reason == "length"


def test_prefix_cache_start(target: LlamaModel) -> None:
    """A second request with the same prompt starts from the first one's cached blocks (a
    different cache_salt does not) and still equals the AR output."""
    p = prompts(7, 1)[0] * 3 + [1, 2, 3, 4, 5, 6, 7, 8, 9]
    gen = SpeculativeGenerator(
        target, SuffixDrafter(), budget=6, cache="paged", kv_tokens=512, block_size=4
    )
    first = gen.generate(p, max_new_tokens=10)
    second = gen.generate(p, max_new_tokens=10)
    assert first.prefix_hit == 0 and second.prefix_hit >= (len(p) - 1) // 4 * 4 > 0
    assert first.tokens == second.tokens == reference(target, p, 10)
    rid = gen.submit(p, max_new_tokens=10, cache_salt="tenant-b")
    outs = [o for _ in range(40) for o in gen.step() if o.finished]
    assert [o.request_id for o in outs] == [rid] and not gen.has_unfinished()
    salted = outs[0].result
    assert salted is not None
    assert salted.prefix_hit == 0 and salted.tokens == first.tokens


def test_hf_target_without_forward_batch(target: LlamaModel) -> None:
    """A target without ``forward_batch`` runs the batch's rows one forward each."""
    from specdec.models.hf import HFTarget

    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(cfg).double().eval()
    with torch.no_grad():
        for prm in model.parameters():
            prm.normal_(0.0, 0.3)
    hf = HFTarget(model)
    ps = prompts(11, 3)
    out = SpeculativeGenerator(hf, SuffixDrafter(), budget=6).generate(ps, max_new_tokens=12)
    for p, r in zip(ps, out, strict=True):
        assert r.tokens == autoregressive_generate(hf, p, max_new_tokens=12).tokens


def test_constrained_generation_matches_constrained_greedy(target: LlamaModel) -> None:
    """With a regex constraint every request's output is the greedy decoding of the masked
    target (the reference masks the AR logits token by token with its own matcher)."""
    vocab = specdec.Vocabulary.from_bytes(
        [bytes([c]) for c in b"abcdefghijklmnopqrstuvwxyz01234"] + [None], eos_ids=[VOCAB - 1]
    )
    grammar = vocab.regex(r"(ab|cd|[0-4])+x?")
    stop = VOCAB - 1

    def constrained_greedy(prompt: list[int], n: int) -> list[int]:
        m = grammar.matcher()
        cache = target.new_cache(200)
        ver = specdec.Verifier(target)
        out: list[int] = []
        if len(prompt) > 1:
            ver.prefill(prompt[:-1], cache)
        last = prompt[-1]
        while len(out) < n:
            tree = specdec.DraftTree([last], [-1])
            step = ver.step(tree, cache, constraint=m)
            last = step.bonus_token
            out.append(last)
            m.accept_token(last)
            if last == stop or m.is_terminated():
                break
        return out

    ps = prompts(5, 4)
    for strategy, drafter in (("ddtree", OracleDrafter(target, miss=0.3)), ("ddtree", None)):
        gen = SpeculativeGenerator(
            target,
            drafter,
            strategy=strategy,
            budget=8,
            max_depth=4,
            constraint=grammar,  # type: ignore[arg-type]
        )
        res = gen.generate(ps, max_new_tokens=16, stop_tokens=[stop])
        for p, r in zip(ps, res, strict=True):
            want = constrained_greedy(p, 16)
            assert r.tokens == want
            m = grammar.matcher()
            assert all(m.accept_token(t) for t in r.tokens)  # every token obeys the grammar


def test_constraint_with_no_allowed_token_is_an_error(target: LlamaModel) -> None:
    vocab = specdec.Vocabulary.from_bytes([bytes([97 + i]) for i in range(VOCAB)], eos_ids=[])
    gen = SpeculativeGenerator(target, strategy="ar", constraint=vocab.regex("ab"))
    with pytest.raises(specdec.NoAllowedTokens, match="allows no token"):
        gen.generate([1, 2], max_new_tokens=5)


# -- the adaptive budget --------------------------------------------------------------------
def brute_force_choice(cost: CostModel, values: list[np.ndarray], max_b: int) -> int:
    best, best_rate = 0, -1.0
    for b in range(max_b + 1):
        tokens = sum(1 + float(v[:b].sum()) for v in values)
        rate = tokens / cost(len(values) * (b + 1))
        if rate > best_rate + 1e-12:
            best, best_rate = b, rate
    return best


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    rows=st.integers(1, 4),
    max_b=st.integers(1, 24),
    steep=st.floats(0.0, 2.0),
)
def test_adaptive_choice_is_the_brute_force_optimum(
    seed: int, rows: int, max_b: int, steep: float
) -> None:
    rng = np.random.default_rng(seed)
    cost = CostModel([1, 8, 32, 128], [1.0, 1.0 + 7 * steep, 1.0 + 31 * steep, 1.0 + 127 * steep])
    trees, values = [], []
    for _ in range(rows):
        lp = -np.sort(rng.exponential(1.0, size=(5, 6)), axis=1).astype(np.float32)
        tree = specdec.build_ddtree(lp, np.tile(np.arange(6), (5, 1)), int(rng.integers(1, 30)))
        trees.append(tree)
        values.append(np.exp(tree.logprobs[1:]))
    choice = AdaptiveBudget(cost, max_b, prior=1.0, probe=False, growth=None).choose(trees)
    assert choice.nodes == brute_force_choice(cost, values, max_b)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), rows=st.integers(1, 3), max_b=st.integers(1, 16))
def test_adaptive_choice_among_candidates_is_the_brute_force_optimum(
    seed: int, rows: int, max_b: int
) -> None:
    """Several candidate trees per request (a combined drafter's model and suffix trees):
    the chosen size and picks give the best rate over every size and every combination of
    picks."""
    import itertools

    rng = np.random.default_rng(seed)
    cost = CostModel([1, 8, 32], [1.0, 1.0 + 7 * rng.uniform(0, 1), 1.0 + 31 * rng.uniform(0, 1)])
    cands = []
    for _ in range(rows):
        trees = []
        for _ in range(int(rng.integers(1, 4))):
            lp = -np.sort(rng.exponential(rng.uniform(0.2, 2.0), size=(5, 6)), axis=1)
            tree = specdec.build_ddtree(
                lp.astype(np.float32), np.tile(np.arange(6), (5, 1)), int(rng.integers(1, 20))
            )
            trees.append(tree)
        cands.append(trees)
    ab = AdaptiveBudget(cost, max_b, probe=False, growth=None)
    choice = ab.choose_among(cands)
    best = 0.0
    for b in range(max_b + 1):
        for picks in itertools.product(*[range(len(c)) for c in cands]):
            pairs = zip(cands, picks, strict=True)
            tokens = sum(1 + float(np.exp(c[p].logprobs[1:])[:b].sum()) for c, p in pairs)
            best = max(best, tokens / cost(rows * (b + 1)))
    got = sum(
        1 + float(np.exp(c[p].logprobs[1:])[: choice.nodes].sum())
        for c, p in zip(cands, choice.picks, strict=True)
    )
    assert len(choice.picks) == rows
    assert got / cost(rows * (choice.nodes + 1)) == pytest.approx(best, rel=1e-9)


def test_adaptive_budget_follows_the_hardware() -> None:
    lp = np.log(np.full((6, 4), 0.9, dtype=np.float32))
    lp[:, 1:] = np.log(0.03)
    tree = specdec.build_ddtree(lp, np.tile(np.arange(4), (6, 1)), 32)
    # GPU-like: the chain and more, once the trust region has seen acceptance that pays.
    assert AdaptiveBudget(FAST_COST, 32, growth=None).choose([tree]).nodes >= 6
    fast = AdaptiveBudget(FAST_COST, 32)
    g = fast.growth
    assert g is not None
    assert fast.choose([tree]).nodes == g  # growth x 1 before any step
    fast.observe([tree.pruned(g)], [g], 0.0)  # then growth x (1 + g)
    assert fast.choose([tree]).nodes >= 6
    assert AdaptiveBudget(SLOW_COST, 32).choose([tree]).nodes == 0  # no tree pays
    # Unscored trees (explicit branches) use the measured per-depth acceptance.
    chain = specdec.tree_from_branches([[1, 2, 3, 4]], root_token=0)
    ab = AdaptiveBudget(CostModel([1, 5], [1.0, 1.2]), 4)
    for _ in range(20):
        ab.observe([chain], [0], 0.0)  # never accepted
    assert ab.choose([chain]).nodes == 0
    for _ in range(200):
        ab.observe([chain], [4], 0.0)  # always accepted
    assert ab.choose([chain]).nodes == 4


def test_adaptive_budget_probes_a_drafter_it_gave_up_on() -> None:
    """Unscored trees start pessimistic on a slow target: after ``probe_after`` skipped steps
    one tree is verified anyway; a probe that pays re-opens speculation, one that does not
    doubles the wait."""
    chain = specdec.tree_from_branches([[1, 2, 3, 4]], root_token=0)
    ab = AdaptiveBudget(CostModel([1, 2, 5], [1.0, 2.0, 2.2]), 4)
    picks = [ab.choose([chain]).nodes for _ in range(8)]
    assert picks[:7] == [0] * 7 and picks[7] > 0
    ab.observe([chain.pruned(picks[7])], [0], 0.0)  # the probe accepted nothing
    assert ab.probe_after == 16
    picks = [ab.choose([chain]).nodes for _ in range(16)]
    assert picks[:15] == [0] * 15 and picks[15] > 0
    for _ in range(30):  # it pays every time from now on
        ab.observe([chain], [4], 0.0)
    assert ab.choose([chain]).nodes == 4 and ab.probe_after == 8


def _arm_runs(
    ab: AdaptiveBudget, steps: int, speed: dict[str, float], lite: bool = False
) -> list[str]:
    """``steps`` steps of an arm loop where arm ``a`` commits ``speed[a]`` tokens a second
    (one step: one second, draft 0.3 s for the full arm, 0.05 for the lite one)."""
    chain = specdec.tree_from_branches([[1, 2, 3, 4]], root_token=0)
    draft = {"full": 0.3, "lite": 0.05, "plain": 0.0}
    arms = []
    for _ in range(steps):
        arm = ab.arm(lite=lite)
        arms.append(arm)
        ab.observe(
            [chain.pruned(0)], [0], 0.5, draft=draft[arm], drafted=arm != "plain",
            forward=0.5, fed=1, arm=arm, committed=max(1, round(speed[arm])),
        )  # fmt: skip
    return arms


def test_adaptive_budget_runs_the_arm_that_delivers() -> None:
    """The drafter runs while its steps commit more tokens a second than plain steps
    (or, for a combined drafter, than its suffix index alone); otherwise the fastest arm
    runs and the drafter is probed, less often while probes do not pay and more often
    once they do; the full arm first gathers ``arm_min`` steps; a cheap draft always
    runs."""
    cost = CostModel([1, 2, 5], [1.0, 2.0, 2.2])
    # The drafter delivers more: it runs, and plain steps are probed ever more rarely.
    ab = AdaptiveBudget(cost, 4)
    arms = _arm_runs(ab, 200, {"full": 3, "plain": 1})
    probes = [i for i, a in enumerate(arms) if a == "plain"]
    assert 2 <= len(probes) <= 5 and ab.probe_wait("plain") >= 32
    assert (np.diff(np.diff(probes)) >= 0).all()  # the wait doubles
    # It delivers less than plain steps: plain steps, with probes that grow rarer.
    ab = AdaptiveBudget(cost, 4)
    arms = _arm_runs(ab, 200, {"full": 1, "plain": 2})
    assert arms[: ab.arm_min] == ["full"] * ab.arm_min
    probes = [i for i, a in enumerate(arms) if a == "full" and i >= ab.arm_min]
    assert 2 <= len(probes) <= 6 and ab.probe_wait("full") >= 32
    gaps = np.diff(probes)
    assert (gaps[1:] >= gaps[:-1]).all()  # the wait doubles
    # Plain steps measured slow (a burst of load) while the drafter was probed: once
    # the load is gone, a plain probe shows it and plain steps run again.
    ab = AdaptiveBudget(cost, 4)
    _arm_runs(ab, 40, {"full": 1, "plain": 2})
    ab._arm_runs["plain"] = [(1, 10.0, 0.0, 0.1)] * ab.arm_window  # judged under load
    ab._summarize("plain")
    arms = _arm_runs(ab, 60, {"full": 1, "plain": 2})
    assert arms[-30:].count("plain") >= 28  # (the drafter still probed)
    # A combined drafter's full probe that verified only its suffix index's trees says
    # nothing for its model, however many tokens it committed: the wait still doubles.
    ab = AdaptiveBudget(cost, 4)
    _arm_runs(ab, 60, {"full": 1, "lite": 3, "plain": 1}, lite=True)
    while ab.arm(lite=True) != "full":
        ab.observe([], [], 0.5, draft=0.05, forward=0.5, fed=1, arm="lite", committed=3)
    wait, lite_runs = ab.probe_wait("full"), len(ab._arm_runs["lite"])
    ab.observe([], [], 0.5, draft=0.3, forward=0.5, fed=1, arm="full", committed=9,
               model_verified=False)  # fmt: skip
    assert ab.probe_wait("full") == 2 * wait and len(ab._arm_runs["lite"]) == lite_runs
    # The drafter starts to pay (text that repeats): the probes see it and it runs again.
    arms = _arm_runs(ab, 600, {"full": 4, "plain": 2})
    assert arms[-100:].count("full") >= 98  # (plain steps probed ever more rarely)
    # A combined drafter: the lite arm is measured and runs when it beats both others.
    ab = AdaptiveBudget(cost, 4)
    arms = _arm_runs(ab, 120, {"full": 2, "lite": 3, "plain": 1}, lite=True)
    assert arms[ab.arm_min : 2 * ab.arm_min] == ["lite"] * ab.arm_min
    assert arms[-60:].count("lite") >= 55 and arms.count("plain") <= 3  # probes
    # A draft cheaper than skip_share of a plain step is never left out: the full arm
    # runs, and the budget verifies its trees only where they pay.
    ab = AdaptiveBudget(cost, 4, skip_share=0.5)
    assert set(_arm_runs(ab, 60, {"full": 1, "plain": 2})) == {"full"}
    # Plain steps are estimated before any ran: the full arm's host time less its draft,
    # and the forward by the cost model as the steps' forwards refined it (0.5 s).
    ab = AdaptiveBudget(cost, 4)
    _arm_runs(ab, ab.arm_min, {"full": 1, "plain": 1})
    assert ab._plain_seconds(1) == pytest.approx(0.5 + (0.5 - 0.3))
    with pytest.raises(ConfigError, match="arm"):
        ab.observe([], [], 0.1, arm="half", committed=1)
    with pytest.raises(ConfigError, match="arm_min"):
        AdaptiveBudget(cost, 4, arm_min=20, arm_window=12)


def _auto_block() -> tuple[LlamaModel, Any, SpeculativeGenerator]:
    """A tiny target, an untrained block drafter for it, and an adaptive-budget generator
    over both (trees nearly free: the arms alone decide what runs)."""
    from specdec.draft import BlockDrafter

    t = LlamaModel(CFG).init_random(5)
    drafter = BlockDrafter.for_target(t, block_size=4, seed=2)
    gen = SpeculativeGenerator(t, drafter, max_depth=4, budget="auto", max_budget=8,
                               cost_model=CostModel([1, 9], [1.0, 1.01]))  # fmt: skip
    return t, drafter, gen


def _states_at_removal(drafter: Any) -> list[Any]:
    """The block drafter's per-request states as their requests end (the generator then
    frees them), in order."""
    states: list[Any] = []
    remove = drafter.remove_request

    def removing(rid: int, out: Any = None) -> None:
        states.append(drafter._by_id[rid])
        remove(rid, out)

    drafter.remove_request = removing
    return states


def test_skipped_drafts_keep_a_block_drafters_context_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While the adaptive budget skips the drafter, the hidden states of the plain steps
    are kept and handed over at the next draft: the block drafter's context K/V covers
    every committed position once, and the output is the target's greedy one (within the
    cap on kept rows, which the next test passes)."""
    from specdec.decode import speculative

    monkeypatch.setattr(speculative, "HELD_ROWS", 64)
    t, drafter, gen = _auto_block()
    prompt = [5, 9, 2, 7, 7, 1]
    ab = gen._adaptive()
    # Plain steps delivered more than drafted ones lately: skip the drafter until a probe.
    ab._arm_runs["full"] = [(1, 1.0, 0.5, 0.6)] * ab.arm_min
    ab._arm_runs["plain"] = [(1, 0.1, 0.0, 0.05)] * ab.arm_min
    ab._summarize("full"), ab._summarize("plain")
    skips = []
    arm = ab.arm
    ab.arm = lambda *a, **k: (x := arm(*a, **k), skips.append(x == "plain"))[0]  # type: ignore[method-assign]
    states = _states_at_removal(drafter)
    got = gen.generate(prompt, max_new_tokens=30)
    # plain steps without a draft, then a probe drafted
    assert sum(skips) >= 7 and not all(skips)
    assert got.tokens == reference(t, prompt, 30) and len(got.tokens) == 30
    assert len(states) == 1 and drafter.num_requests == 0
    st = states[0]
    # The last draft saw the context up to its root: positions [0, root) once each.
    assert st.start == 0 and st.end == len(st.seen) - 1


def test_skipped_drafts_keep_at_most_held_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past ``HELD_ROWS`` rows kept for a drafter that is left out, the oldest go: its next
    draft starts its context again from the rows kept (positions up to its root, no gap
    inside), and the output is still the target's greedy one."""
    from specdec.decode import speculative

    monkeypatch.setattr(speculative, "HELD_ROWS", 5)
    t, drafter, gen = _auto_block()
    prompt = [5, 9, 2, 7, 7, 1]
    ab = gen._adaptive()
    arms = iter(["full"] + ["plain"] * 12 + ["full"] * 40)
    ab.arm = lambda *a, **k: next(arms)  # type: ignore[method-assign]
    seen: list[int] = []
    draft = drafter.draft
    drafter.draft = lambda rs, d: (  # type: ignore[method-assign]
        seen.append(0 if rs[0].hidden_states is None else rs[0].hidden_states.shape[0]),
        draft(rs, d),
    )[1]
    states = _states_at_removal(drafter)
    got = gen.generate(prompt, max_new_tokens=30)
    assert got.tokens == reference(t, prompt, 30)
    # The draft after 12 plain steps read 5 kept rows and this step's own.
    assert seen[0] == len(prompt) - 1 and 5 < seen[1] <= 5 + 5
    st = states[0]
    assert st.start > 0 and st.end == len(st.seen) - 1


def test_a_combined_drafters_lite_steps_keep_its_model_whole() -> None:
    """The lite arm runs a combined drafter's suffix index without its model: the model's
    hidden states of those steps are handed over at its next draft (its context K/V covers
    every committed position once), and the output is the target's greedy one."""
    from specdec.draft import BlockDrafter, CombinedDrafter

    t = LlamaModel(CFG).init_random(5)
    block = BlockDrafter.for_target(t, block_size=4, seed=2)
    drafter = CombinedDrafter(block, SuffixDrafter(max_depth=8), max_depth=4)
    prompt = [5, 9, 2, 7, 7, 1, 5, 9, 2, 7]
    gen = SpeculativeGenerator(t, drafter, max_depth=4, budget="auto", max_budget=8,
                               cost_model=CostModel([1, 9], [1.0, 1.01]))  # fmt: skip
    ab = gen._adaptive()
    arms = itertools.cycle(["full", "lite", "lite", "plain", "lite"])
    seen: list[tuple[str, bool]] = []
    ab.arm = lambda *a, **k: (x := next(arms), seen.append((x, k["lite"])))[0]  # type: ignore[method-assign]
    drafts = []
    draft = block.draft
    block.draft = lambda rs, d: (drafts.append(1), draft(rs, d))[1]  # type: ignore[method-assign]
    states = _states_at_removal(block)
    got = gen.generate(prompt, max_new_tokens=30)
    assert got.tokens == reference(t, prompt, 30)
    assert all(lite for _, lite in seen)  # a combined drafter has a lite arm
    assert len(drafts) == sum(a == "full" for a, _ in seen) < len(seen)
    st = states[0]
    assert st.start == 0 and st.end == len(st.seen) - 1


def test_adaptive_calibration_keeps_sources_apart() -> None:
    """An over-confident chain (a suffix match: conditional probabilities of 1) that keeps
    failing loses its value, geometrically along the chain, without dragging down a model
    tree whose marginals are calibrated (another probability range); the tree's values stay
    its path probabilities."""
    sure = np.tile(np.array([0.0, -30.0], dtype=np.float32), (8, 1))
    chain = specdec.build_ddtree(sure, np.tile(np.arange(2), (8, 1)), 8, root_token=0)
    assert chain.depths.tolist() == list(range(9))
    lp = np.log(np.tile(np.array([0.3, 0.2, 0.1], dtype=np.float32), (4, 1)))
    model = specdec.build_ddtree(lp, np.tile(np.arange(3), (4, 1)), 8, root_token=0)
    ab = AdaptiveBudget(SLOW_COST, 8)
    before = ab.node_values(model)
    np.testing.assert_allclose(before, np.exp(model.logprobs[1:]), rtol=1e-6)
    for _ in range(6):
        ab.observe([chain], [np.zeros(0, dtype=np.int32)], 0.0)  # the chain fails at once
    v = ab.node_values(chain)
    assert v[0] < 0.3 and all(v[1:] < v[:-1]) and v.sum() < 0.5
    # The model's probability bins are untouched: only the size calibration, shared by
    # every source and learnt per rank band, scales its values.
    bands = rank_bands(np.arange(1, len(before) + 1))
    shared = ab.band_factors(int(bands[-1]) + 1)[bands]
    np.testing.assert_allclose(ab.node_values(model), before * shared, rtol=1e-6)
    # A count instead of the accepted nodes: the likeliest path's first nodes.
    ab.observe([chain], [8], 0.0)
    assert ab.node_values(chain)[0] > v[0]


def test_adaptive_trust_region_grows_with_acceptance() -> None:
    """Before any step at most ``growth`` nodes however sure the drafter claims to be; then
    at most ``growth`` x (1 + the longest acceptance of the window), and the brute-force
    optimum within that cap."""
    sure = np.tile(np.array([0.0, -30.0], dtype=np.float32), (40, 1))
    chain = specdec.build_ddtree(sure, np.tile(np.arange(2), (40, 1)), 40, root_token=0)
    ab = AdaptiveBudget(FAST_COST, 40, growth=3, depth_window=4)
    assert ab.choose([chain]).nodes == 3
    gots = []
    for acc, cap in [(3, 12), (9, 30), (0, 30), (20, 40)]:
        ab.observe([chain.pruned(ab.choose([chain]).nodes)], [acc], 0.0)
        gots.append(ab.choose([chain]).nodes)
        # The values as the budget prices them: scaled by what its chosen trees accepted
        # over what they promised.
        values = [ab.node_values(chain) * ab.choice_factor]
        assert gots[-1] == brute_force_choice(FAST_COST, values, cap)
    # The cap binds while acceptance keeps up (after the failed step the size calibration
    # sees the tail of the 30-node chain fail, and the optimum stops short of the cap).
    assert gots[0] == 12 and gots[1] == 30 and gots[2] <= 30 and gots[3] == 40
    for _ in range(4):  # the long acceptances leave the window
        ab.observe([chain.pruned(3)], [0], 0.0)
    assert ab.choose([chain]).nodes <= 3


def test_adaptive_trust_region_and_values_are_per_request() -> None:
    """Named requests (``rids``) grow their trees from their own acceptance and have their
    values scaled by what their own candidates realised: a request after one that accepted
    long chains starts at ``growth`` nodes, and one whose candidates fail is priced down
    while another's are not. A finished request's windows are dropped."""
    sure = np.tile(np.array([0.0, -30.0], dtype=np.float32), (40, 1))
    chain = specdec.build_ddtree(sure, np.tile(np.arange(2), (40, 1)), 40, root_token=0)
    ab = AdaptiveBudget(FAST_COST, 40, growth=2)
    assert ab.size_bound([1]) == ab.size_bound([2]) == 2  # nothing seen yet
    sizes = []
    for _ in range(3):  # every node accepted: 2, then 2 x 3, then 2 x 7 nodes
        sizes.append(ab.choose_among([[chain]], rids=[1]).nodes)
        ab.observe([chain.pruned(sizes[-1])], [sizes[-1]], 0.0, rids=[1])
    assert sizes == [2, 6, 14]
    assert ab.size_bound([1]) == 2 * (1 + 14)  # its own longest acceptance
    assert ab.size_bound([2]) == 2  # a new request: its own window is empty
    assert ab.size_bound([1, 2]) == ab.size_bound([1])  # a batch: its longest
    assert ab.size_bound() == ab.size_bound([1])  # unnamed: every step's
    assert ab.draft_depth(32, [2]) == 32 and ab.draft_depth(32, [1]) == 16
    # Request 3's candidates fail at their first token; request 1's hold for 6 tokens.
    for _ in range(4):
        ab.learn([chain], [1, 0], rid=3)
        ab.learn([chain], [0] * 6 + [1], rid=1)
    assert ab.request_factor(3) < 0.3 < 0.9 < ab.request_factor(1)
    assert ab.request_factor(2) == 1.0  # nothing of its own yet
    # The price of a size: each request's values times its own factor (at most 1 a node).
    g = ab.choose_among([[chain], [chain]], rids=[1, 3])
    v = ab.node_values(chain)[: g.nodes]
    own = sum(np.minimum(v * ab.request_factor(x), 1.0).sum() for x in (1, 3))
    assert g.expected_tokens == pytest.approx(2 + ab.choice_factor * own, rel=1e-9)
    assert g.expected_tokens < ab.choose_among([[chain], [chain]], rids=[1, 1]).expected_tokens
    ab.forget(3)
    assert ab.request_factor(3) == 1.0 and ab.size_bound([3]) == 2
    with pytest.raises(ConfigError, match="rids has 1 entries for 2"):
        ab.choose_among([[chain], [chain]], rids=[1])


def test_adaptive_calibration_splits_first_and_deeper_nodes() -> None:
    """A repeat-style source: its first drafted token is usually wrong, but once it holds,
    the rest follow. The deeper nodes keep a high ratio of their own, so a chain is worth
    more than its first node's value times a geometric tail; with no deeper evidence
    they take the pooled ratio (a failing chain still shrinks geometrically)."""
    sure = np.tile(np.array([0.0, -30.0], dtype=np.float32), (6, 1))
    chain = specdec.build_ddtree(sure, np.tile(np.arange(2), (6, 1)), 6, root_token=0)
    ab = AdaptiveBudget(SLOW_COST, 6)
    for i in range(40):  # 1 in 4 chains holds, and then all the way
        ab.observe([chain], [6 if i % 4 == 0 else 0], 0.0)
    cal = ab.calibration
    top = len(CALIBRATION_BINS) - 1
    assert cal[0, top] < 0.4 and cal[1, top] > 0.9
    v = ab.node_values(chain)
    bands = rank_bands(np.arange(1, 7))
    shared = ab.band_factors(int(bands[-1]) + 1)[bands]  # the size calibration's part
    path = cal[0, top] * cal[1, top] ** np.arange(6)
    # A chain node is worth at most its parent (it is accepted only after it).
    np.testing.assert_allclose(v, np.minimum.accumulate(np.minimum(path * shared, 1.0)), rtol=1e-9)
    assert v[-1] > 0.8 * v[0]  # the repeat holds once it starts


@given(st.lists(st.integers(1, 1 << 40), min_size=1, max_size=20))
def test_rank_bands_are_powers_of_two(ranks: list[int]) -> None:
    """Band k holds ranks 2^(k-1) + 1 .. 2^k: band of r is the bit length of r - 1."""
    assert rank_bands(np.array(ranks)).tolist() == [(r - 1).bit_length() for r in ranks]


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), budget=st.integers(1, 24))
def test_a_step_shows_the_acceptance_of_every_smaller_tree(seed: int, budget: int) -> None:
    """What the size calibration rests on: the walk on a best-first tree cut to its first
    b nodes accepts exactly the full tree's accepted nodes among those b, for every b (the
    verifier's token at a node does not depend on which other nodes were drafted)."""
    rng = np.random.default_rng(seed)
    lp = -np.sort(rng.exponential(1.0, size=(6, 4)), axis=1).astype(np.float32)
    toks = np.stack([rng.permutation(4) for _ in range(6)])
    tree = specdec.build_ddtree(lp, toks, budget, root_token=0)
    chosen = rng.integers(0, 4, size=tree.num_nodes)  # the verifier's token at each node
    full = specdec.walk(tree, chosen).accepted.tolist()
    for b in range(tree.num_nodes):
        cut = tree.pruned(b)
        assert specdec.walk(cut, chosen[: cut.num_nodes]).accepted.tolist() == [
            i for i in full if i <= b
        ]


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), small=st.integers(1, 12), extra=st.integers(0, 20))
def test_a_smaller_budget_drafts_the_first_nodes_of_a_bigger_tree(
    seed: int, small: int, extra: int
) -> None:
    """What lets the adaptive budget ask drafters for no more than it can pick this step
    (``size_bound``): a DDTree (from logits) or suffix tree of budget b is the budget-B
    tree cut to its first b nodes, node for node."""
    rng = np.random.default_rng(seed)
    big = small + extra
    logits = torch.from_numpy(rng.normal(0.0, 2.0, size=(6, 9)).astype(np.float32))
    ctx = rng.integers(0, 4, size=60).tolist()
    sd = SuffixDrafter(max_depth=5)
    pairs = [
        (specdec.ddtree_from_logits(logits, b, root_tokens=1) for b in (small, big)),
        (sd.propose_tree(ctx, b) for b in (small, big)),
    ]
    for lo_t, hi_t in pairs:
        assert isinstance(lo_t, specdec.DraftTree) and isinstance(hi_t, specdec.DraftTree)
        cut = hi_t.pruned(small)
        for name in ("tokens", "parents", "depths", "logprobs"):
            np.testing.assert_array_equal(getattr(lo_t, name), getattr(cut, name), err_msg=name)


def test_adaptive_size_calibration_learns_what_ranks_deliver() -> None:
    """A drafter whose later nodes look worth verifying but are never accepted (only the
    main path's first two nodes are): once steps show it, the budget stops paying for
    them. The rank bands' factors follow accepted over predicted; bands never verified
    take the last measured band's mean, with no optimism bonus."""
    lp = np.log(np.tile(np.array([0.8, 0.12, 0.05], dtype=np.float32), (8, 1)))
    tree = specdec.build_ddtree(lp, np.tile(np.arange(3), (8, 1)), 8, root_token=0)
    par, tok = tree.parents, tree.tokens

    def child(node: int) -> int:  # the main path: token 0 at every depth
        return next(i for i in range(1, tree.num_nodes) if par[i] == node and tok[i] == 0)

    main = [child(0), child(child(0))]
    cost = CostModel([1, 5, 9], [1.0, 1.0, 1.15])  # 4 nodes free, 8 cost 15% more
    # With the exploration bonus (for callers that learn from verified cuts only).
    ab = AdaptiveBudget(cost, 8, growth=None, probe=False, band_optimism=1.0)
    assert ab.choose([tree]).nodes == 8  # the drafter's word: nodes 5-8 worth the 15%
    for _ in range(100):
        ab.observe([tree], [np.array(main, dtype=np.int64)], 0.0)
    f = ab.band_factors(6)
    # Bands 0 and 1 hold the accepted nodes; ranks 3-8 delivered nothing (their values
    # are small already: the probability bins learnt it too, so each band stays near
    # its prior, the band before it, only as far as its few predicted tokens allow).
    assert f[0] > 1.0 and f[1] > 1.0 and f[2] < 0.3 and f[3] < 0.3
    assert ab.choose([tree]).nodes <= 4
    assert f[4] == f[5] and f[4] < f[3]  # ranks 9+: band 3's mean, no bonus


def test_adaptive_draft_depth_follows_the_accepted_lengths() -> None:
    """Per-depth drafters are asked for two depths beyond the longest acceptance lately
    (all of them before any step)."""
    ab = AdaptiveBudget(SLOW_COST, 16, depth_window=4)
    assert ab.draft_depth(8) == 8
    chain = specdec.tree_from_branches([[1, 2, 3, 4, 5, 6]], root_token=0)
    ab.observe([chain], [1], 0.0)
    assert ab.draft_depth(8) == 3
    ab.observe([chain], [5], 0.0)
    assert ab.draft_depth(8) == 7 and ab.draft_depth(4) == 4
    for _ in range(4):  # the long acceptance leaves the window
        ab.observe([chain], [0], 0.0)
    assert ab.draft_depth(8) == 2


def test_cost_model_calibrates_on_the_target(target: LlamaModel) -> None:
    cm = CostModel.calibrate(target, sizes=[1, 4, 16], prefix=16, repeats=1)
    assert cm.tokens == [1, 4, 16] and all(s > 0 for s in cm.seconds)
    assert cm.seconds == sorted(cm.seconds)  # monotone by construction
    assert math.isclose(cm(1), cm.seconds[0]) and cm(32) >= cm(16)


@given(st.lists(st.floats(0.001, 100.0), min_size=1, max_size=30))
def test_cost_model_is_the_nearest_monotone_curve(seconds: list[float]) -> None:
    """Measured seconds become the least-squares non-decreasing fit, against the min-max
    formula of isotonic regression: at i, the max over j <= i of the min over k >= i of
    the mean of seconds[j..k]."""
    cm = CostModel(list(range(1, len(seconds) + 1)), seconds)
    n = len(seconds)
    want = [
        max(min(statistics.fmean(seconds[j : k + 1]) for k in range(i, n)) for j in range(i + 1))
        for i in range(n)
    ]
    np.testing.assert_allclose(cm.seconds, want, rtol=1e-9)
    assert cm.seconds == sorted(cm.seconds)
    if seconds == sorted(seconds):
        assert cm.seconds == seconds  # a monotone measurement is kept as it is


@given(st.integers(1, 300), st.integers(1, 40))
def test_cost_ladder_covers_every_small_size(most: int, dense: int) -> None:
    """Every size up to ``dense`` (a CPU forward's time is a staircase there), every power
    of two, ``most`` itself, nothing past it, and past ``dense`` no gap wider than half
    the size before it (interpolation stays local) in few points."""
    sizes = CostModel.ladder(most, dense)
    assert sizes == sorted(set(sizes)) and sizes[0] == 1 and sizes[-1] == most
    assert set(range(1, min(dense, most) + 1)) <= set(sizes)
    assert {1 << k for k in range(most.bit_length()) if 1 << k <= most} <= set(sizes)
    assert all(b - a <= max(1, a // 2) for a, b in itertools.pairwise(sizes))
    assert len(sizes) <= dense + 2 * most.bit_length() + 1


def test_cost_ladder_refuses_bad_sizes() -> None:
    for bad in (0, -3, 2.5, "8"):
        with pytest.raises(specdec.SpecdecError, match="most"):
            CostModel.ladder(bad)  # type: ignore[arg-type]


def test_cost_model_calibrates_the_default_ladder(target: LlamaModel) -> None:
    cm = CostModel.calibrate(target, prefix=8, repeats=1)
    assert cm.tokens == CostModel.ladder(65)
    assert cm.seconds == sorted(cm.seconds) and all(s > 0 for s in cm.seconds)


def test_auto_budget_with_measured_costs_is_lossless(target: LlamaModel) -> None:
    ps = prompts(3, 3)
    gen = SpeculativeGenerator(target, SuffixDrafter(), budget="auto", max_budget=12)
    res = gen.generate(ps, max_new_tokens=12)
    assert gen.adaptive is not None and len(gen.adaptive.cost.tokens) > 2
    for p, r in zip(ps, res, strict=True):
        assert r.tokens == reference(target, p, 12)
        assert max(r.tree_sizes) <= 12


def test_adaptive_budget_learns_from_the_nodes_it_did_not_verify(target: LlamaModel) -> None:
    """Trees that never pay (every extra token costs ten plain steps): every step is plain,
    nothing drafted is verified, yet each step's commit decides the drafted trees' depth-1
    nodes (the walk would have accepted the one holding the committed token), and the
    budget learns from them: its tried-node sums are the candidates' depth-1 probabilities
    and matches, counted here one by one. Lossless throughout."""
    cost = CostModel([1, 2, 64], [1.0, 10.0, 100.0])
    gen = SpeculativeGenerator(
        target,
        OracleDrafter(target, miss=0.3, seed=3),
        budget="auto",
        max_budget=6,
        cost_model=cost,
    )
    gen.adaptive = AdaptiveBudget(cost, 6, probe=False, cost_weight=math.inf)
    drafted: list[specdec.DraftTree] = []
    trees = gen._trees

    def spy(*a, **k):  # type: ignore[no-untyped-def]
        out = trees(*a, **k)
        drafted.append(out[0][0])
        return out

    gen._trees = spy  # type: ignore[method-assign]
    p = prompts(1, 5)[0]
    res = gen.generate(p, max_new_tokens=10)
    assert res.tokens == reference(target, p, 10)
    assert res.tree_sizes == [0] * len(res.tokens) and len(drafted) == len(res.tokens)
    predicted = accepted = 0.0
    for k, (whole, token) in enumerate(zip(drafted, res.tokens, strict=True)):
        tree = whole.pruned(6, 10 - k - 1)  # what the step weighed: no deeper than needed
        first = [i for i in range(1, tree.num_real) if tree.depths[i] == 1]
        predicted += sum(math.exp(tree.logprobs[i]) for i in first)
        accepted += sum(int(tree.tokens[i]) == token for i in first)
    st = gen.adaptive.stats
    assert accepted > 0
    np.testing.assert_allclose(st.predicted[0].sum(), predicted, rtol=1e-9)
    assert st.realised[0].sum() == accepted and st.realised[1].sum() == 0.0


# -- bad input ---------------------------------------------------------------------------------
def test_bad_input(target: LlamaModel) -> None:
    gen = SpeculativeGenerator(target, SuffixDrafter(), budget=4)
    cases = [
        (lambda: gen.generate([], max_new_tokens=4), VerifyError, "at least one token"),
        (lambda: gen.generate([[1, 2], []], max_new_tokens=4), VerifyError, "at least one token"),
        (lambda: gen.generate([1] * 150, max_new_tokens=20), VerifyError, "do not fit"),
        (lambda: gen.generate([1, VOCAB], max_new_tokens=4), VerifyError, "token ids"),
        (lambda: SpeculativeGenerator(target, budget=0), ConfigError, "budget"),
        (lambda: SpeculativeGenerator(target, strategy="beam"), ConfigError, "beam"),  # type: ignore[arg-type]
        (lambda: SpeculativeGenerator(target, cache="disk"), ConfigError, "cache"),  # type: ignore[arg-type]
        (
            lambda: SpeculativeGenerator(target, NgramDrafter(VOCAB + 1)),
            ConfigError,
            "vocabulary",
        ),
        (lambda: SpeculativeGenerator(target, object()), SpecdecTypeError, "drafter"),  # type: ignore[arg-type]
        (lambda: gen.cancel("x"), SpecdecTypeError, "request_id"),  # type: ignore[arg-type]
        (
            lambda: gen.generate([1, 2], max_new_tokens=4, stop_tokens="x"),
            SpecdecTypeError,
            "stop_tokens",
        ),  # type: ignore[arg-type]
    ]
    for call, exc, words in cases:
        with pytest.raises(exc, match=words):
            call()
    with pytest.raises(SpecdecTypeError, match="constraint"):
        SpeculativeGenerator(target, constraint=3).generate([1, 2], max_new_tokens=2)
    assert not gen.has_unfinished()  # refused requests were never queued
    assert gen.cancel(12345) is False  # never submitted: nothing to cancel
    tiny = SpeculativeGenerator(
        target, SuffixDrafter(), budget=4, cache="paged", kv_tokens=32, block_size=4
    )
    with pytest.raises(KVCacheError, match="kv_tokens"):
        tiny.generate([1, 2, 3], max_new_tokens=60)
    assert not tiny.has_unfinished()


def test_stream_and_progress_bar(target: LlamaModel) -> None:
    import io

    from specdec.decode.progress import ProgressBar

    ps = prompts(9, 3)
    gen = SpeculativeGenerator(target, SuffixDrafter(), budget=6, max_batch=2)
    got: dict[int, list[int]] = {}
    finished = []
    for out in gen.stream(ps, max_new_tokens=9):
        got.setdefault(out.request_id, []).extend(out.new_tokens)
        if out.finished:
            finished.append(out.request_id)
    assert sorted(finished) == sorted(got) and len(got) == 3
    for rid, p in zip(sorted(got), ps, strict=True):
        assert got[rid] == reference(target, p, 9)
    buf = io.StringIO()
    bar = ProgressBar(100, stream=buf, interval=0.0)
    bar.update(40, 2)
    bar.close(100)
    assert "40/100 tokens, 2 running" in buf.getvalue() and buf.getvalue().endswith("\n")
    quiet = io.StringIO()
    ProgressBar(100, enabled=False, stream=quiet).close(5)
    assert quiet.getvalue() == ""


@pytest.mark.parametrize(
    ("kw", "name"),
    [
        ({"max_budget": 0}, "max_budget"),
        ({"prior": 0.0}, "prior"),
        ({"prior_weight": 0.0}, "prior_weight"),
        ({"growth": 0}, "growth"),
        ({"band_optimism": -1.0}, "band_optimism"),
        ({"arm_window": 1}, "arm_window"),
        ({"arm_min": 0}, "arm_min"),
        ({"arm_probe_after": 0}, "arm_probe_after"),
        ({"choice_window": 0}, "choice_window"),
        ({"skip_share": float("nan")}, "skip_share"),
        ({"depth_window": 0}, "depth_window"),
        ({"cost_weight": 0.0}, "cost_weight"),
        ({"cost_weight": float("nan")}, "cost_weight"),
    ],
)
def test_adaptive_budget_rejects_bad_settings(kw: dict[str, float], name: str) -> None:
    args: dict[str, object] = {"cost": CostModel([1, 2], [1.0, 2.0]), "max_budget": 4, **kw}
    with pytest.raises(ConfigError, match=name):
        AdaptiveBudget(**args)  # type: ignore[arg-type]


def test_forward_costs_follow_the_steps_own_forwards() -> None:
    """Per token count fed, measured over modelled (its forwards' median) weighed against
    the recent level (median ratio of the last 32 forwards) worth ``cost_weight``;
    interpolated between counts fed, the nearest one's beyond them."""
    cost = CostModel([1, 9], [1.0, 1.8])
    ab = AdaptiveBudget(cost, 8, cost_weight=4.0)
    np.testing.assert_allclose(ab.forward_costs(1, 8), cost.many(np.arange(1, 10)))
    chain = specdec.DraftTree(
        [0, 1, 2, 3, 4], [-1, 0, 1, 2, 3], logprobs=[0.0, -1.0, -2.0, -3.0, -4.0]
    )
    rng = np.random.default_rng(0)
    fed5 = rng.uniform(2.0, 2.4, size=20).tolist()
    fed1 = rng.uniform(1.1, 1.2, size=10).tolist()
    for f in fed5:
        ab.observe([chain], [0], 0.0, forward=f)  # 5 tokens: the chain's nodes
    for f in fed1:
        ab.observe([chain.pruned(0)], [0], 0.0, forward=f, fed=1)
    level = statistics.median(([f / cost(5) for f in fed5] + [f / cost(1) for f in fed1])[-32:])
    ratio = {}
    for tokens, times in ((1, fed1), (5, fed5[-16:])):
        n, measured = len(times), statistics.median(times) / cost(tokens)
        ratio[tokens] = (4.0 * level + n * measured) / (4.0 + n)
    want = []
    for tokens in range(1, 10):
        if tokens >= 5:
            r = ratio[5]
        else:  # between the counts fed, linearly in the count
            r = ratio[1] + (ratio[5] - ratio[1]) * (tokens - 1) / 4
        want.append(cost(tokens) * r)
    np.testing.assert_allclose(ab.forward_costs(1, 8), want, rtol=1e-12)
    # Two rows: the same ratios read at 2 (b + 1) tokens.
    np.testing.assert_allclose(ab.forward_costs(2, 1), [want[1], want[3]], rtol=1e-12)
    frozen = AdaptiveBudget(cost, 8, cost_weight=math.inf)
    frozen.observe([chain], [0], 0.0, forward=5.0)
    np.testing.assert_allclose(frozen.forward_costs(1, 8), cost.many(np.arange(1, 10)))
    with pytest.raises(ConfigError, match="seconds"):
        ab.observe([chain], [0], 0.0, forward=-1.0)


def test_adaptive_budget_learns_that_trees_cost_more_than_the_model_said() -> None:
    """A cost model that calls every size free, and forwards that pay 50% per extra token:
    once steps have timed its trees and a few plain steps the budget verifies small trees,
    while one that keeps the model's figures (``cost_weight=inf``) keeps verifying all 8
    nodes."""
    lp = np.log(np.tile(np.array([0.5, 0.3, 0.2], dtype=np.float32), (8, 1)))
    tree = specdec.build_ddtree(lp, np.tile(np.arange(3), (8, 1)), 8, root_token=0)
    free = CostModel([1, 9], [1.0, 1.0])
    chosen = {}
    for weight in (4.0, math.inf):
        ab = AdaptiveBudget(free, 8, growth=None, probe=False, cost_weight=weight)
        sizes = []
        for step in range(60):
            b = ab.choose([tree]).nodes
            ab.observe([tree.pruned(b)], [0], 0.0, forward=1.0 + 0.5 * b)
            sizes.append(b)
            if step % 10 == 0:  # now and then a plain step (another request's, a skip)
                ab.observe([tree.pruned(0)], [0], 0.0, forward=1.0)
        chosen[weight] = sizes[-10:]
    assert chosen[math.inf] == [8] * 10
    assert max(chosen[4.0]) <= 2, chosen[4.0]
