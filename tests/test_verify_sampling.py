"""Lossless speculative sampling: with a V=8 model, the joint distribution of the first 3
generated tokens under tree speculative sampling matches autoregressive sampling and the
exact distribution computed from the model (chi-square, 20k samples each, fixed seeds)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np
import pytest
import torch
from scipy import stats

from specdec.cache import KVCache
from specdec.decode import SpeculativeGenerator, autoregressive_generate
from specdec.draft import ModelDrafter, SequenceDrafter
from specdec.models import LlamaConfig, LlamaModel
from specdec.testing import BanningDrafter
from specdec.verify import Sampling

# Tiny tensors: extra intra-op threads only contend.

V, PROMPT, N_SAMPLES = 8, [3, 5], 20_000


class TrackingCache(KVCache):
    """Delegates to a real cache and records the committed token ids (for the replay key)."""

    def __init__(self, inner: KVCache) -> None:
        self.inner = inner
        self.num_layers, self.num_kv_heads, self.head_dim = (
            inner.num_layers,
            inner.num_kv_heads,
            inner.head_dim,
        )
        self.tokens: list[int] = []
        self.step_ids: list[int] = []
        self.record = False
        self.appended: list[tuple[torch.Tensor, torch.Tensor]] = []

    committed_len = property(lambda self: self.inner.committed_len)
    pending = property(lambda self: self.inner.pending)

    def begin(self, num_new: int) -> None:
        self.inner.begin(num_new)
        self.appended = []

    def append(self, layer, k, v):  # type: ignore[no-untyped-def]
        if self.record:
            self.appended.append((k.clone(), v.clone()))
        return self.inner.append(layer, k, v)

    def commit(self, keep) -> None:  # type: ignore[no-untyped-def]
        idx = torch.as_tensor(keep, dtype=torch.long).tolist()
        self.inner.commit(keep)
        self.tokens += [self.step_ids[i] for i in idx]

    def rollback(self) -> None:
        self.inner.rollback()

    def committed_kv(self, layer):  # type: ignore[no-untyped-def]
        return self.inner.committed_kv(layer)


class ReplayTarget:
    """The real model; a step already computed for the same committed tokens, inputs,
    positions and mask is replayed (same K/V appended through the cache protocol, same
    logits) instead of recomputed. Exact because the forward is deterministic; it only saves
    time over 80k sampled generations. Verifier, rule, walk and commit run for real."""

    def __init__(self, model: LlamaModel) -> None:
        self.model = model
        self.vocab_size, self.max_positions, self.device = (
            model.vocab_size,
            model.max_positions,
            model.device,
        )
        self.memo: dict[tuple, tuple[torch.Tensor, list]] = {}
        self.hits = 0

    def new_cache(self, max_len: int | None = None) -> TrackingCache:
        return TrackingCache(self.model.new_cache(max_len or 16))

    def __call__(self, ids, pos, cache, mask=None):  # type: ignore[no-untyped-def]
        key = (
            tuple(cache.tokens),
            tuple(ids.tolist()),
            tuple(pos.tolist()),
            None if mask is None else mask.numpy().tobytes(),
        )
        cache.step_ids = ids.tolist()
        hit = self.memo.get(key)
        if hit is None:
            cache.record = True
            try:
                logits = self.model(ids, pos, cache, mask)
            finally:
                cache.record = False
            self.memo[key] = (logits, list(cache.appended))
            return logits
        self.hits += 1
        logits, appended = hit
        cache.begin(len(ids))
        for layer, (k, v) in enumerate(appended):
            cache.append(layer, k, v)
        return logits


class HashDrafter(SequenceDrafter):
    """The target's own greedy-rollout logits plus noise seeded by the context: deterministic
    per context, independent of the verifier's random draws, accepted often but not always."""

    def __init__(self, target: ReplayTarget) -> None:
        self.inner = ModelDrafter(target)
        self.memo: dict[tuple[int, ...], torch.Tensor] = {}

    def draft_one(self, context: Sequence[int], depth: int) -> torch.Tensor:
        key = (*context, -depth)
        if key not in self.memo:
            g = torch.Generator().manual_seed(hash(tuple(context)) % (2**31))
            noise = torch.randn(depth, V, generator=g)
            self.memo[key] = self.inner.draft_one(context, depth) + noise
        return self.memo[key]


@pytest.fixture(scope="module")
def model() -> LlamaModel:
    cfg = LlamaConfig(
        vocab_size=V,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=16,
    )
    return LlamaModel(cfg, backend="sdpa").double().init_random(5)


def exact_distribution(model: LlamaModel, rule: Sampling) -> dict[tuple[int, ...], float]:
    """P(t1, t2, t3) = prod of the rule's processed distributions, by full enumeration with
    plain causal forwards."""

    def probs(seq: list[int]) -> np.ndarray:
        logits = model(torch.tensor(seq), torch.arange(len(seq)), model.new_cache(16), None)
        return rule.probs(logits[-1:])[0].numpy()

    out: dict[tuple[int, ...], float] = {}
    p1 = probs(PROMPT)
    for a in range(V):
        if p1[a] == 0:
            continue
        p2 = probs(PROMPT + [a])
        for b in range(V):
            if p2[b] == 0:
                continue
            p3 = probs(PROMPT + [a, b])
            for c in range(V):
                if p3[c] > 0:
                    out[(a, b, c)] = float(p1[a] * p2[b] * p3[c])
    return out


def merged(counts: Counter, exact: dict, n: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Observed and expected counts, cells with expected < 5 pooled into one; and the number
    of samples outside the rule's support (impossible for a correct sampler)."""
    keys = sorted(exact)
    big = [k for k in keys if exact[k] * n >= 5]
    small = [k for k in keys if exact[k] * n < 5]
    obs = [counts.get(k, 0) for k in big]
    exp = [exact[k] * n for k in big]
    if small:
        obs.append(sum(counts.get(k, 0) for k in small))
        exp.append(sum(exact[k] * n for k in small))
    outside = sum(counts.values()) - int(sum(obs))
    return np.array(obs, float), np.array(exp, float), outside


@pytest.mark.parametrize(
    "rule,seed,padded",
    [
        (Sampling(temperature=0.7, top_p=0.9), 11, False),
        (Sampling(temperature=1.0, top_k=4), 12, False),
        (Sampling(temperature=1.0, top_k=4), 13, True),
    ],
    ids=["t0.7-top_p0.9", "t1.0-top_k4", "t1.0-top_k4-padded"],
)
def test_tree_sampling_matches_autoregressive(
    model: LlamaModel, rule: Sampling, seed: int, padded: bool
) -> None:
    exact = exact_distribution(model, rule)
    assert len(exact) > 20  # a real distribution, not a near-deterministic one
    target = ReplayTarget(model)

    gen = torch.Generator().manual_seed(seed)
    drafter: SequenceDrafter = HashDrafter(target)
    if padded:
        # Banned (-inf) tokens shrink some trees below the budget: they are padded to it.
        drafter = BanningDrafter(drafter, lambda c: 1 + len(c) % 2)
    spec = SpeculativeGenerator(
        target,
        drafter,
        rule=rule,
        generator=gen,
        strategy="ddtree",
        budget=10,
        max_depth=3,
        pad_to_budget=padded,
    )
    if padded:
        tree = spec.draft_tree(PROMPT)
        assert tree.num_real < tree.num_nodes == 11  # padding really happens
    spec_counts: Counter = Counter()
    accepted, steps, multi = 0, 0, 0
    for _ in range(N_SAMPLES):
        # One token more than the distribution covers: trees never reach past what a request
        # still needs, so a 3-token request's last steps would be short. Lossless means the
        # first three tokens' distribution is the AR one however many follow.
        res = spec.generate(PROMPT, max_new_tokens=4)
        spec_counts[tuple(res.tokens[:3])] += 1
        accepted += sum(res.accepted)
        steps += res.steps
        multi += any(a >= 2 for a in res.accepted)
    # The walk really accepts drafted tokens, often several per step.
    assert accepted / steps > 0.2 and multi > N_SAMPLES // 20

    gen_ar = torch.Generator().manual_seed(seed + 100)
    ar_counts: Counter = Counter()
    for _ in range(N_SAMPLES):
        res = autoregressive_generate(target, PROMPT, max_new_tokens=3, rule=rule, generator=gen_ar)
        ar_counts[tuple(res.tokens)] += 1
    assert target.hits > 0

    obs_s, exp_s, out_s = merged(spec_counts, exact, N_SAMPLES)
    obs_a, exp_a, out_a = merged(ar_counts, exact, N_SAMPLES)
    assert out_s == 0 and out_a == 0
    p_spec = stats.chisquare(obs_s, exp_s).pvalue
    p_ar = stats.chisquare(obs_a, exp_a).pvalue
    p_two = stats.chi2_contingency(np.stack([obs_s, obs_a])).pvalue
    print(
        f"{rule}: p(spec vs exact)={p_spec:.3g} p(AR vs exact)={p_ar:.3g} "
        f"p(spec vs AR)={p_two:.3g} cells={len(obs_s)} accepted/step={accepted / steps:.2f}"
    )
    assert p_spec > 1e-3 and p_ar > 1e-3 and p_two > 1e-3, (p_spec, p_ar, p_two)


def test_chi_square_detects_a_broken_verifier(model: LlamaModel) -> None:
    """The same check with sibling leakage (causal mask over the packed order instead of the
    tree mask) rejects: the test above can fail."""
    rule = Sampling(temperature=1.0, top_k=4)
    exact = exact_distribution(model, rule)

    class Leaky(ReplayTarget):
        def __call__(self, ids, pos, cache, mask=None):  # type: ignore[no-untyped-def]
            return super().__call__(ids, pos, cache, None)

    gen = torch.Generator().manual_seed(5)
    spec = SpeculativeGenerator(
        Leaky(model),
        HashDrafter(ReplayTarget(model)),
        rule=rule,
        generator=gen,
        strategy="ddtree",
        budget=10,
        max_depth=3,
    )
    counts: Counter = Counter(
        tuple(spec.generate(PROMPT, max_new_tokens=3).tokens) for _ in range(5_000)
    )
    obs, exp, outside = merged(counts, exact, 5_000)
    assert outside > 0 or stats.chisquare(obs, exp).pvalue < 1e-6


def test_sample_rows_draws_the_row_distributions() -> None:
    """The rule's sampler (two-level inverse CDF in float64) draws each row's distribution:
    chi-square against the exact probabilities over a vocabulary that is not a multiple of
    its block size, with zeros that are never drawn, mass at block edges and rows of one
    certain token."""
    from specdec.verify.rules.sampling import sample_rows

    g = torch.Generator().manual_seed(11)
    q = torch.zeros(600, dtype=torch.float32)
    support = [0, 5, 255, 256, 511, 599]
    q[support] = torch.tensor([0.1, 0.2, 0.05, 0.3, 0.15, 0.2])
    n = 100_000
    s = sample_rows(q.expand(n, 600).contiguous(), g)
    counts = torch.bincount(s, minlength=600)
    assert int(counts[q == 0].sum()) == 0
    obs = counts[support].double().numpy()
    exp = np.array([0.1, 0.2, 0.05, 0.3, 0.15, 0.2]) * n
    assert stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue > 1e-3
    sure = torch.zeros(4, 300, dtype=torch.float64)
    sure[0, 299] = sure[1, 0] = sure[2, 256] = sure[3, 255] = 1.0
    assert sample_rows(sure, g).tolist() == [299, 0, 256, 255]
