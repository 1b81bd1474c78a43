"""Drafters that need no model: the suffix index (Rust) against a plain-Python reference,
prompt lookup, and lossless greedy generation with both on a tiny random Llama."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from specdec import _core
from specdec.decode import SpeculativeGenerator, autoregressive_generate
from specdec.draft import NgramDrafter, SuffixDrafter
from specdec.errors import ConfigError, DraftError, SpecdecError, SpecdecTypeError, TreeError
from specdec.models import LlamaConfig, LlamaModel
from specdec.protocols import Drafter, DraftRequest, RequestLifecycle, TreeDrafter
from specdec.testing import reference_suffix_proposal


def paths(arrays: _core.TreeArrays) -> list[tuple[list[int], float]]:
    """The drafted paths of a tree in node order, with their log-probs."""
    tokens, parents = arrays.tokens.tolist(), arrays.parents.tolist()
    out: list[list[int]] = [[]]
    for i in range(1, len(tokens)):
        out.append([*out[parents[i]], tokens[i]])
    return list(zip(out[1:], arrays.logprobs.tolist()[1:], strict=True))


def test_suffix_index_matches_the_reference() -> None:
    rng = random.Random(0)
    for case in range(300):
        vocab = rng.choice([2, 3, 5])
        corpus = [[rng.randrange(vocab) for _ in range(rng.randrange(12))] for _ in range(3)]
        live = [rng.randrange(vocab) for _ in range(rng.randrange(1, 16))]
        max_match, depth = rng.randrange(1, 5), rng.randrange(0, 6)
        budget, min_prob = rng.randrange(1, 14), rng.choice([0.0, 0.2, 0.5])
        min_match = rng.choice([1, 1, 2, 3])
        factor = rng.choice([None, None, 0.5, 1.0, 1.5, 2.0])
        index, shared = _core.SuffixIndex(max_match), _core.SuffixCorpus(max_match)
        salts = [rng.choice([None, b"a"]) for _ in corpus]
        for c, s in zip(corpus, salts, strict=True):
            shared.add(c, s)
        index.extend(live[: len(live) // 2])
        index.extend(live[len(live) // 2 :])
        context = live if case % 2 else [rng.randrange(vocab) for _ in range(3)]
        salt = rng.choice([None, "a", b"b"])  # "a" is b"a"; b"b" holds nothing
        got = paths(
            index.propose(context, depth, budget, min_prob, shared, salt, min_match, factor)
        )
        mine = [c for c, s in zip(corpus, salts, strict=True) if s == _bytes(salt)]
        want = reference_suffix_proposal(
            [*mine, live],
            context,
            max_match=max_match,
            max_depth=depth,
            budget=budget,
            min_prob=min_prob,
            min_match=min_match,
            depth_factor=factor,
        )
        assert [p for p, _ in got] == [p for p, _ in want], case
        np.testing.assert_allclose([lp for _, lp in got], [lp for _, lp in want], atol=1e-12)


def _bytes(salt: str | bytes | None) -> bytes | None:
    return salt.encode() if isinstance(salt, str) else salt


def test_suffix_index_updates_and_corpus() -> None:
    index, corpus = _core.SuffixIndex(2), _core.SuffixCorpus(2, 100)
    index.extend([5, 6])
    assert len(index.propose([5, 6], 3, 4).tokens) == 1  # nothing followed "5 6" yet
    index.extend([7, 5, 6])
    assert index.propose([5, 6], 3, 4).tokens.tolist() == [6, 7, 5, 6]
    cid = corpus.add([5, 6, 9])
    tree = index.propose([5, 6], 1, 4, corpus=corpus)
    assert tree.tokens.tolist() == [6, 9, 7] and len(corpus) == 1  # the corpus's first
    assert np.allclose(np.exp(tree.logprobs[1:]), [0.5, 0.5])
    corpus.remove(cid)
    assert index.propose([5, 6], 1, 4, corpus=corpus).tokens.tolist() == [6, 7]
    assert len(index) == 5 and index.max_match == 2 and corpus.num_tokens == 0


def test_suffix_drafter_follows_the_context() -> None:
    d = SuffixDrafter(max_match=4, max_depth=3, min_match=1)
    assert isinstance(d, TreeDrafter) and isinstance(d, RequestLifecycle)
    tree = d.propose_tree([1, 2, 3, 4, 1, 2], budget=4)
    assert tree.tokens.tolist() == [2, 3, 4, 1]
    # A request's index appends each step's new tokens, as the one-off path reindexes.
    d.add_request(5, [1, 2, 3, 4])
    for ctx in ([1, 2, 3, 4, 1, 2], [1, 2, 3, 4, 1, 2, 3, 4, 1]):
        tree = d.propose([DraftRequest(ctx, request_id=5)], budget=2)[0]
        assert tree.tokens.tolist() == d.propose_tree(ctx, budget=2).tokens.tolist()
    assert tree.tokens.tolist() == [1, 2, 3]
    d.remove_request(5)
    # A corpus output is matched by every request, old and new.
    cid = d.add_corpus([7, 8, 9])
    assert d.propose_tree([0, 7], budget=2).tokens.tolist() == [7, 8, 9]
    d.remove_corpus(cid)
    assert d.propose_tree([0, 7], budget=2).num_drafted == 0
    with pytest.raises(DraftError):
        d.remove_corpus(cid)


def test_suffix_drafter_remembers_outputs() -> None:
    d = SuffixDrafter(remember_outputs=True, min_match=1)
    d.add_request(0, [3, 4])
    d.propose([DraftRequest([3, 4, 5], request_id=0)], budget=4)
    d.remove_request(0, output=[5, 6])
    # A different request: the first one's output (not its prompt) joined the corpus.
    assert d.propose_tree([9, 5], budget=2).tokens.tolist() == [5, 6]
    assert d.propose_tree([9, 3], budget=2).num_drafted == 0
    assert d.num_corpus == 1 and d.num_corpus_tokens == 2 and d.num_requests == 0


def test_short_matches_draft_nothing_by_default() -> None:
    # A suffix of one or two tokens is not a match unless asked for: 3 tokens by default.
    ctx2 = [5, 6, 7, 8, 1, 5, 6]  # "5 6" recurs, no 3-token suffix does
    ctx3 = [4, 5, 6, 7, 8, 1, 4, 5, 6]  # "4 5 6" recurs
    assert SuffixDrafter().propose_tree(ctx2, budget=4).num_drafted == 0
    assert SuffixDrafter(min_match=2).propose_tree(ctx2, budget=4).tokens.tolist() == [
        6,
        7,
        8,
        1,
        5,
    ]
    assert SuffixDrafter().propose_tree(ctx3, budget=4).tokens.tolist() == [6, 7, 8, 1, 4]
    assert NgramDrafter(16).lookup(ctx2) == []
    assert NgramDrafter(16, min_n=2).lookup(ctx2) == [7, 8, 1, 5, 6]
    assert NgramDrafter(16).lookup(ctx3) == [7, 8, 1, 4, 5, 6]
    # The default never exceeds max_n.
    assert NgramDrafter(16, max_n=2).min_n == 2


def test_ngram_lookup() -> None:
    d = NgramDrafter(16, max_n=3, min_n=1, max_depth=3)
    assert isinstance(d, Drafter) and isinstance(d, TreeDrafter)
    # "2 3" recurs: the most recent earlier occurrence is followed by 9 2 3.
    assert d.lookup([1, 2, 3, 4, 2, 3, 9, 2, 3]) == [9, 2, 3]
    assert d.lookup([1, 2, 5]) == []
    tree = d.propose([DraftRequest([1, 2, 3, 1, 2])], budget=2)[0]
    assert tree.tokens.tolist() == [2, 3, 1] and tree.parents.tolist() == [-1, 0, 1]
    assert d.propose([DraftRequest([1, 2])], budget=2)[0].num_drafted == 0
    logits = d.draft([DraftRequest([1, 2, 3, 1, 2])], 4)[0]
    assert logits.argmax(-1)[:3].tolist() == [3, 1, 2]
    assert torch.isinf(logits[0]).sum() == 15 and (logits[3] == 0).all()


def test_bad_input_raises_specdec_errors() -> None:
    index, corpus = _core.SuffixIndex(2), _core.SuffixCorpus(2, 4)
    cases = [
        (lambda: _core.SuffixIndex(0), DraftError),
        (lambda: index.propose([1], 2, 0), TreeError),
        (lambda: index.propose([1, -1], 2, 1), TreeError),
        (lambda: index.propose([], 2, 1), DraftError),
        (lambda: index.propose([1], 2, 1, 1.5), DraftError),
        (lambda: index.propose([1], 2, 1, float("nan")), DraftError),
        (lambda: index.extend([-3]), TreeError),
        (lambda: index.extend("ab"), SpecdecTypeError),
        (lambda: corpus.add([2**40]), TreeError),
        (lambda: corpus.add([1, 2, 3, 4, 5]), DraftError),  # longer than the bound
        (lambda: corpus.add([1], cache_salt=3), SpecdecTypeError),  # type: ignore[arg-type]
        (lambda: corpus.remove(7), DraftError),
        (lambda: corpus.remove(-1), DraftError),
        (lambda: _core.SuffixCorpus(0), DraftError),
        (lambda: index.propose([1], 2, 1, 0.0, _core.SuffixCorpus(3)), DraftError),
        (lambda: SuffixDrafter(max_match=0), DraftError),
        (lambda: SuffixDrafter(min_prob=2.0), DraftError),
        (lambda: SuffixDrafter(min_match=0), DraftError),
        (lambda: SuffixDrafter(depth_factor=0.0), DraftError),
        (lambda: SuffixDrafter(depth_factor=float("inf")), DraftError),
        (lambda: index.propose([1], 2, 1, 0.0, None, None, 0), DraftError),
        (lambda: index.propose([1], 2, 1, 0.0, None, None, 1, -1.0), DraftError),
        (lambda: SuffixDrafter().propose_tree([1, 2], 0), DraftError),
        (lambda: SuffixDrafter().propose_tree([], 2), ConfigError),
        (lambda: SuffixDrafter().propose_tree([1, -2], 2), TreeError),
        (lambda: SuffixDrafter().add_corpus([-1]), TreeError),
        (lambda: SuffixDrafter().propose([object()], 2), SpecdecTypeError),  # type: ignore[list-item]
        (lambda: NgramDrafter(8, min_n=3, max_n=2), DraftError),
        (lambda: NgramDrafter(8).propose([DraftRequest([1])], 0), DraftError),
        (lambda: NgramDrafter(4).draft_one([9, 9, 9, 9], 2), DraftError),
    ]
    for i, (call, cls) in enumerate(cases):
        with pytest.raises(cls) as info:
            call()
        assert isinstance(info.value, SpecdecError), i
    assert len(index) == 0 and len(corpus) == 0  # refused calls changed nothing


@pytest.fixture(scope="module")
def target() -> LlamaModel:
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    return LlamaModel(cfg).double().init_random(0)


PROMPTS = [
    [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3],
    [7, 8, 9, 7, 8, 9, 7, 8, 9, 10, 7, 8],
]


@pytest.mark.parametrize("name", ["suffix", "ngram", "ngram-marginals"])
def test_lossless_greedy(target: LlamaModel, name: str) -> None:
    accepted = 0
    for prompt in PROMPTS:
        ref = autoregressive_generate(target, prompt, max_new_tokens=40).tokens
        if name == "suffix":
            gen = SpeculativeGenerator(target, SuffixDrafter(max_depth=6), budget=8)
        elif name == "ngram":
            gen = SpeculativeGenerator(target, NgramDrafter(64, max_depth=6), budget=6)
        else:  # the one-hot marginals through a chain shape (a plain Drafter)
            gen = SpeculativeGenerator(
                target, _OnlyMarginals(NgramDrafter(64, max_depth=6)), strategy="chain", max_depth=6
            )
        out = gen.generate(prompt, max_new_tokens=40)
        assert out.tokens == ref
        accepted += sum(out.accepted)
    assert accepted > 0


class _OnlyMarginals:
    """An n-gram drafter seen only through the marginals protocol."""

    def __init__(self, inner: NgramDrafter) -> None:
        self.inner = inner

    def draft(self, requests: list[DraftRequest], depth: int) -> torch.Tensor:
        return self.inner.draft(requests, depth)
