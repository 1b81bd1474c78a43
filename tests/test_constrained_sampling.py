"""A grammar combined with sampling, through the speculative generator: the sampled text
follows the target's distribution restricted to what the grammar allows (chi-square against
exact enumeration of the masked, renormalised distributions), and a seeded request samples
exactly the text constrained autoregressive sampling with that seed samples, whatever the
drafter proposed."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

import specdec
from specdec.decode import SpeculativeGenerator, autoregressive_generate
from specdec.draft import SuffixDrafter
from specdec.testing import OracleDrafter, pair_chi_square, tiny_sampling_target
from specdec.verify import Sampling

LETTERS = b"abcdefgh"
# After "a" only d/e, after "b" only a/f, after "c" anything: the mask changes per node.
PATTERN = r"(a[de]|b[af]|c[a-h])[a-h]*"


@pytest.fixture(scope="module")
def target():  # type: ignore[no-untyped-def]
    return tiny_sampling_target(vocab_size=len(LETTERS), seed=7)


@pytest.fixture(scope="module")
def grammar():  # type: ignore[no-untyped-def]
    vocab = specdec.Vocabulary.from_bytes([bytes([c]) for c in LETTERS], eos_ids=[])
    return vocab.regex(PATTERN)


def exact_constrained_pairs(target, grammar, prompt: list[int]) -> dict[tuple[int, int], float]:  # type: ignore[no-untyped-def]
    """P(first two tokens) at temperature 1 under the grammar, by enumeration: each
    position's distribution is the target's softmax over the allowed tokens, renormalised."""

    def probs(seq: list[int], matcher) -> torch.Tensor:  # type: ignore[no-untyped-def]
        lg = target(torch.tensor(seq), torch.arange(len(seq)), target.new_cache(len(seq)), None)
        mask = specdec.allocate_token_bitmask(1, target.vocab_size)
        matcher.fill_next_token_bitmask(mask, 0)
        allowed = torch.tensor(
            [bool(mask[0, t // 32] >> (t % 32) & 1) for t in range(target.vocab_size)]
        )
        p = torch.softmax(lg[-1].masked_fill(~allowed, float("-inf")), -1)
        return p

    out = {}
    m = grammar.matcher()
    p1 = probs(prompt, m)
    for a in range(target.vocab_size):
        if p1[a] == 0:
            continue
        m2 = grammar.matcher()
        assert m2.accept_token(a)
        p2 = probs([*prompt, a], m2)
        for b in range(target.vocab_size):
            if p2[b] > 0:
                out[(a, b)] = float(p1[a] * p2[b])
    return out


@pytest.mark.parametrize("drafter", ["oracle", "suffix"])
def test_constrained_sampling_follows_the_masked_distribution(target, grammar, drafter) -> None:  # type: ignore[no-untyped-def]
    prompt = [0, 3, 2, 3, 2]
    exact = exact_constrained_pairs(target, grammar, prompt)
    assert abs(sum(exact.values()) - 1.0) < 1e-9
    d = OracleDrafter(target, miss=0.5, seed=3) if drafter == "oracle" else SuffixDrafter()
    gen = SpeculativeGenerator(
        target, d, rule=Sampling(), budget=6, max_depth=3, constraint=grammar, max_batch=64
    )
    n = 3000
    rids = [gen.submit(prompt, max_new_tokens=2, seed=s) for s in range(n)]
    counts: Counter[tuple[int, int]] = Counter()
    done = 0
    while gen.has_unfinished():
        for o in gen.step():
            if o.finished:
                assert o.result is not None and o.result.finish_reason == "length"
                counts[(o.result.tokens[0], o.result.tokens[1])] += 1
                done += 1
    assert done == len(rids)
    assert set(counts) <= set(exact), "a sampled pair the grammar forbids"
    assert pair_chi_square(counts, exact) > 1e-3


def test_seeded_constrained_sampling_equals_autoregressive(target, grammar) -> None:  # type: ignore[no-untyped-def]
    """Token for token, the text constrained AR sampling draws with the same seed, for
    drafters that propose allowed and forbidden tokens alike."""
    rule = Sampling(temperature=0.9, top_p=0.95)
    prompts = [[0, 3, 2], [4, 4, 5, 4], [1, 1]]
    seeds = [11, 12, 13]
    want = [
        autoregressive_generate(
            target, p, max_new_tokens=12, rule=rule, seed=s, constraint=grammar
        ).tokens
        for p, s in zip(prompts, seeds, strict=True)
    ]
    for d in (OracleDrafter(target, miss=0.4, seed=1), SuffixDrafter(max_depth=4)):
        gen = SpeculativeGenerator(
            target, d, rule=rule, budget=6, max_depth=3, constraint=grammar, max_batch=3
        )
        rids = [
            gen.submit(p, max_new_tokens=12, seed=s) for p, s in zip(prompts, seeds, strict=True)
        ]
        results = {}
        while gen.has_unfinished():
            for o in gen.step():
                if o.finished:
                    assert o.result is not None
                    results[o.request_id] = o.result.tokens
        assert [results[r] for r in rids] == want
        for toks in want:
            m = grammar.matcher()
            assert all(m.accept_token(t) for t in toks)
