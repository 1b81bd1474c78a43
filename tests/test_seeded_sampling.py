"""Seeded sampling keyed by position: a seeded request's text is the text plain
autoregressive sampling with the same seed draws (the oracle), token for token, whatever the
drafter, tree shape, budget, batch or cache; the keyed uniforms are uniform and independent
across positions and seeds; and the seeded text still follows the target's distribution
(chi-square against exact enumeration)."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import stats

from specdec.decode import SpeculativeGenerator, autoregressive_generate
from specdec.draft import BlockDrafter, CombinedDrafter, SuffixDrafter
from specdec.errors import ConfigError, SpecdecTypeError, VerifyError
from specdec.models import LlamaModel
from specdec.testing import (
    OracleDrafter,
    RandomDrafter,
    exact_pair_distribution,
    pair_chi_square,
    tiny_config,
    tiny_sampling_target,
)
from specdec.verify import Sampling
from specdec.verify.rules.sampling import keyed_uniforms, sample_rows

VOCAB = 24
CFG = tiny_config(VOCAB)


@pytest.fixture(scope="module")
def target() -> LlamaModel:
    # Peaked enough that drafts get accepted, not so peaked that sampling is greedy.
    return LlamaModel(CFG).double().init_random(9, std=0.5)


def prompts(seed: int, count: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(VOCAB) for _ in range(rng.randrange(2, 10))] for _ in range(count)]


def reference(target: LlamaModel, ps: list[list[int]], n: int, rule: Sampling, seeds: list[int]):  # type: ignore[no-untyped-def]
    return [
        autoregressive_generate(target, p, max_new_tokens=n, rule=rule, seed=s).tokens
        for p, s in zip(ps, seeds, strict=True)
    ]


def test_keyed_uniforms_are_uniform_and_keyed() -> None:
    pos = np.arange(200_000)
    u = keyed_uniforms(7, pos)
    assert u.dtype == np.float64 and ((u >= 0) & (u < 1)).all()
    assert stats.kstest(u, "uniform").pvalue > 1e-3
    # Neighbouring positions and neighbouring seeds are uncorrelated.
    assert abs(np.corrcoef(u[:-1], u[1:])[0, 1]) < 0.01
    assert abs(np.corrcoef(u, keyed_uniforms(8, pos))[0, 1]) < 0.01
    # Fixed by (seed, position) alone, in any order or batch.
    idx = np.array([5, 199_999, 0, 5])
    assert (keyed_uniforms(7, idx) == u[idx]).all()
    assert keyed_uniforms(-1, [3])[0] != keyed_uniforms(1, [3])[0]
    with pytest.raises(ConfigError, match="positions"):
        keyed_uniforms(1, [-1])
    with pytest.raises(SpecdecTypeError, match="seed"):
        keyed_uniforms(1.5, [1])  # type: ignore[arg-type]


def test_sample_rows_with_given_uniforms_is_the_inverse_cdf() -> None:
    p = torch.tensor([[0.5, 0.0, 0.25, 0.25], [0.0, 0.0, 0.0, 2.0]], dtype=torch.float64)
    for u, want in [(0.0, [0, 3]), (0.49, [0, 3]), (0.5, [2, 3]), (0.76, [3, 3])]:
        got = sample_rows(p, uniforms=torch.tensor([u, u], dtype=torch.float64))
        assert got.tolist() == want, u
    with pytest.raises(VerifyError, match="one uniform per row"):
        sample_rows(p, uniforms=torch.zeros(3, dtype=torch.float64))


@pytest.mark.parametrize(
    "rule",
    [Sampling(temperature=1.0), Sampling(temperature=0.8, top_k=6, top_p=0.9)],
    ids=["t1", "t0.8-topk6-topp0.9"],
)
@pytest.mark.parametrize(
    "make",
    [
        ("ar", lambda t: SpeculativeGenerator(t, strategy="ar")),
        ("oracle-chain", lambda t: SpeculativeGenerator(t, OracleDrafter(t), strategy="chain")),
        ("oracle-ddtree-16", lambda t: SpeculativeGenerator(t, OracleDrafter(t), budget=16)),
        ("random-ddtree-4", lambda t: SpeculativeGenerator(t, RandomDrafter(VOCAB), budget=4)),
        (
            "block-auto-paged",
            lambda t: SpeculativeGenerator(
                t,
                BlockDrafter.for_target(t, block_size=5, target_layers=(0, 1), seed=1),
                budget="auto",
                max_budget=12,
                max_depth=5,
                cache="paged",
            ),
        ),
        (
            "block+suffix-ddtree-8",
            lambda t: SpeculativeGenerator(
                t,
                CombinedDrafter(
                    BlockDrafter.for_target(t, block_size=5, target_layers=(0, 1), seed=1),
                    SuffixDrafter(max_depth=6),
                    max_depth=5,
                ),
                budget=8,
                max_depth=5,
            ),
        ),
    ],
    ids=lambda m: m[0],
)
def test_seeded_text_equals_autoregressive(target, rule, make) -> None:  # type: ignore[no-untyped-def]
    """Batched (3 at a time, requests joining as others finish) and alone."""
    ps = prompts(3, 5)
    seeds = [0, 1, 2, 2**40 + 3, -7]
    ref = reference(target, ps, 20, rule, seeds)
    assert len({tuple(r) for r in ref}) == len(ref)  # the seeds really differ
    gen = make[1](target)
    gen.verifier.rule = rule
    gen.max_batch = 3
    rids = [gen.submit(p, max_new_tokens=20, seed=s) for p, s in zip(ps, seeds, strict=True)]
    out: dict[int, list[int]] = {}
    steps = 0
    while gen.has_unfinished():
        for o in gen.step():
            if o.finished:
                out[o.request_id] = o.result.tokens
                steps += o.result.steps
    assert [out[r] for r in rids] == ref
    assert gen.generate(ps[1], max_new_tokens=20, seed=seeds[1]).tokens == ref[1]
    if make[0].startswith("oracle"):  # drafts really were accepted
        assert steps < 5 * 20


def test_generator_seed_is_the_default_and_unseeded_requests_use_the_stream(target) -> None:  # type: ignore[no-untyped-def]
    rule = Sampling(temperature=1.0)
    ps = prompts(8, 2)
    ref = reference(target, ps, 16, rule, [11, 11])
    gen = SpeculativeGenerator(target, OracleDrafter(target), rule=rule, seed=11, budget=6)
    assert [r.tokens for r in gen.generate(ps, max_new_tokens=16)] == ref
    # A request's own seed wins over the generator's.
    assert (
        gen.generate(ps[0], max_new_tokens=16, seed=12).tokens
        == reference(target, ps[:1], 16, rule, [12])[0]
    )
    # A batch that mixes a seeded and an unseeded request: the seeded one keeps its text.
    mixed = SpeculativeGenerator(
        target, OracleDrafter(target), rule=rule, budget=6, generator=torch.Generator()
    )
    a = mixed.submit(ps[0], max_new_tokens=16, seed=11)
    b = mixed.submit(ps[1], max_new_tokens=16)
    done = {}
    while mixed.has_unfinished():
        for o in mixed.step():
            if o.finished:
                done[o.request_id] = o.result.tokens
    assert done[a] == ref[0] and len(done[b]) == 16
    with pytest.raises(SpecdecTypeError, match="seed"):
        gen.submit(ps[0], max_new_tokens=4, seed="1")  # type: ignore[arg-type]


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    seed=st.integers(-(2**63), 2**63 - 1),
    budget=st.integers(1, 20),
    temperature=st.floats(0.3, 2.0),
    miss=st.floats(0.0, 0.8),
)
def test_seeded_text_equals_autoregressive_property(  # type: ignore[no-untyped-def]
    target, seed, budget, temperature, miss
) -> None:
    rule = Sampling(temperature=temperature)
    p = prompts(seed % 1000, 1)[0]
    ref = autoregressive_generate(target, p, max_new_tokens=12, rule=rule, seed=seed).tokens
    gen = SpeculativeGenerator(
        target, OracleDrafter(target, miss=miss, seed=1), rule=rule, budget=budget, max_depth=6
    )
    assert gen.generate(p, max_new_tokens=12, seed=seed).tokens == ref


def test_seeded_sampling_follows_the_target_distribution() -> None:
    """Over many seeds, the first two seeded tokens of a speculative run follow the exact
    distribution (enumerated with plain forwards), and each equals the seeded AR run."""
    t = tiny_sampling_target()
    prompt = [1, 2, 3]
    exact = exact_pair_distribution(t, prompt)
    rule = Sampling(temperature=1.0)
    gen = SpeculativeGenerator(t, OracleDrafter(t, miss=0.3), rule=rule, budget=6, max_depth=3)
    n = 1500
    counts: Counter = Counter()
    accepted = 0
    for s in range(n):
        res = gen.generate(prompt, max_new_tokens=3, seed=s)
        counts[tuple(res.tokens[:2])] += 1
        accepted += sum(res.accepted)
        if s % 50 == 0:
            assert (
                res.tokens
                == autoregressive_generate(t, prompt, max_new_tokens=3, rule=rule, seed=s).tokens
            )
    assert accepted > n // 4
    assert pair_chi_square(counts, exact) > 1e-3


def test_a_rule_without_uniforms_works_unseeded_and_is_refused_seeded(target) -> None:  # type: ignore[no-untyped-def]
    """A custom rule written before seeded sampling (``choose(logits, generator)``) keeps
    working; asked to sample seeded, the generator says what is missing."""
    from specdec.verify import DecodingRule

    class OldArgmax(DecodingRule):
        def choose(self, logits, generator=None):  # type: ignore[no-untyped-def,override]
            return logits.argmax(-1)

    p = prompts(5, 1)[0]
    gen = SpeculativeGenerator(target, OracleDrafter(target), rule=OldArgmax(), budget=4)
    assert (
        gen.generate(p, max_new_tokens=8).tokens
        == autoregressive_generate(target, p, max_new_tokens=8).tokens
    )
    with pytest.raises(SpecdecTypeError, match="OldArgmax.choose takes no uniforms"):
        gen.generate(p, max_new_tokens=8, seed=1)


def test_requests_with_their_own_rules_share_a_batch(target: LlamaModel) -> None:
    """Per-request decoding rules (a server's per-request temperature / top-k / top-p): a
    batch that mixes greedy and seeded sampling at three settings gives each request the
    text its own rule gives alone (the oracle: plain autoregressive decoding with that rule
    and seed)."""
    from specdec.verify import Greedy

    ps = prompts(21, 8)
    rules = [
        Greedy(),
        Sampling(0.7),
        Sampling(1.3, top_k=5),
        Sampling(1.0, top_p=0.8),
    ]
    gen = SpeculativeGenerator(target, SuffixDrafter(max_depth=4), budget=6, max_batch=8)
    rids = {}
    for i, p in enumerate(ps):
        rule = rules[i % 4]
        rids[gen.submit(p, max_new_tokens=12, rule=rule, seed=100 + i)] = (p, rule, 100 + i)
    got: dict[int, list[int]] = {}
    while gen.has_unfinished():
        for o in gen.step():
            if o.finished:
                assert o.result is not None
                got[o.request_id] = o.result.tokens
    for rid, (p, rule, seed) in rids.items():
        want = autoregressive_generate(target, p, max_new_tokens=12, rule=rule, seed=seed)
        assert got[rid] == want.tokens, (rule, seed)
    with pytest.raises(SpecdecTypeError, match="rule"):
        gen.submit(ps[0], max_new_tokens=2, rule="greedy")  # type: ignore[arg-type]
