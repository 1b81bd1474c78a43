"""The suffix drafter's per-request state and its shared corpus: requests keyed by id and
freed when removed, one corpus partition per cache salt, a token bound kept in least recently
used order (against a plain Python LRU model), id-keyed proposals equal to the one-off path
and to the brute-force reference, and the binding's classes shared between threads."""

from __future__ import annotations

import random
import threading
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np
import pytest
import torch

from specdec import _core
from specdec.draft import CombinedDrafter, SuffixDrafter
from specdec.errors import DraftError, SpecdecTypeError, TreeError
from specdec.protocols import DraftRequest, RequestLifecycle
from specdec.testing import reference_suffix_proposal
from specdec.tree import DraftTree

Salt = bytes | None


def paths(tree: DraftTree) -> list[tuple[list[int], float]]:
    """The drafted paths of a tree in node order, with their log-probs."""
    tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
    out: list[list[int]] = [[]]
    for i in range(1, len(tokens)):
        out.append([*out[parents[i]], tokens[i]])
    return list(zip(out[1:], tree.logprobs.tolist()[1:], strict=True))


def ask(d: SuffixDrafter, context: Sequence[int], rid: int | None, budget: int = 8) -> DraftTree:
    return d.propose([DraftRequest(list(context), request_id=rid)], budget)[0]


class LruModel:
    """Which corpus sequences a bounded LRU keeps: a plain ordered dict, least recently used
    first; a proposal uses the sequences holding the longest suffix of the context that
    occurs (in them or in the request's own tokens) with a token after it."""

    def __init__(self, bound: int, max_match: int) -> None:
        self.bound, self.max_match = bound, max_match
        self.seqs: OrderedDict[int, tuple[Salt, list[int]]] = OrderedDict()
        self.next_id = 0

    def tokens(self) -> int:
        return sum(len(t) for _, t in self.seqs.values())

    def add(self, salt: Salt, toks: list[int]) -> None:
        while self.tokens() + len(toks) > self.bound:
            self.seqs.popitem(last=False)
        self.seqs[self.next_id] = (salt, toks)
        self.next_id += 1

    def propose(self, own: list[int], context: list[int], salt: Salt) -> None:
        def occurs(seq: list[int], suffix: list[int]) -> bool:
            m = len(suffix)
            return any(seq[end - m : end] == suffix for end in range(m, len(seq)))

        for m in range(min(self.max_match, len(context)), 0, -1):
            suffix = context[-m:]
            hit = [i for i, (s, t) in self.seqs.items() if s == salt and occurs(t, suffix)]
            if hit or occurs(own, suffix):
                for i in sorted(hit):
                    self.seqs.move_to_end(i)
                return


def test_no_state_outlives_its_request() -> None:
    rng = random.Random(0)
    bound = 120
    d = SuffixDrafter(
        max_match=3, max_depth=4, remember_outputs=True, corpus_tokens=bound, min_match=1
    )
    assert isinstance(d, RequestLifecycle)
    live: dict[int, list[int]] = {}
    for rid in range(400):
        live[rid] = [rng.randrange(6) for _ in range(rng.randrange(1, 10))]
        d.add_request(rid, live[rid], cache_salt=rng.choice([None, "a", b"b"]))
        for r in rng.sample(sorted(live), min(3, len(live))):
            live[r] += [rng.randrange(6) for _ in range(rng.randrange(1, 4))]
            ask(d, live[r], r)
        if len(live) > 5 or rid == 399:
            for r in rng.sample(sorted(live), len(live) - 2 if rid < 399 else len(live)):
                ctx = live.pop(r)
                d.remove_request(r, output=ctx[2:] if rng.random() < 0.8 else None)
        assert d.num_requests == len(live)
        assert d.num_corpus_tokens <= bound
    assert d.num_requests == 0 and d.num_corpus > 0
    assert d.corpus.num_partitions <= 3
    # Removing every corpus sequence leaves no partition behind.
    for cid in d.corpus.ids_by_use():
        d.remove_corpus(cid)
    assert d.num_corpus == 0 and d.num_corpus_tokens == 0 and d.corpus.num_partitions == 0


def test_tenants_never_draft_from_each_other() -> None:
    d = SuffixDrafter(max_match=4, max_depth=4, remember_outputs=True, min_match=1)
    text = [40, 41, 42, 43, 44, 45]
    d.add_request(1, [1, 2, 3], cache_salt="tenant-a")
    d.remove_request(1, output=text)
    context = [7, 8, 40, 41]  # its suffix occurs only in tenant A's output
    d.add_request(2, context, cache_salt="tenant-b")
    d.add_request(3, context, cache_salt="tenant-a")
    d.add_request(4, context, cache_salt=b"tenant-a")  # the same salt as bytes
    d.add_request(5, context)  # no salt: a partition of its own
    trees = d.propose([DraftRequest(context, request_id=r) for r in (2, 3, 4, 5)], budget=8)
    assert [t.num_drafted for t in trees] == [0, 4, 4, 0]
    assert trees[1].tokens.tolist() == [41, 42, 43, 44, 45]
    assert d.propose_tree(context, 8).num_drafted == 0  # the one-off path: no salt
    # The prompt of tenant A's request was not remembered: only its output.
    assert d.num_corpus == 1 and d.num_corpus_tokens == len(text)


def test_corpus_bound_keeps_the_least_recently_used() -> None:
    rng = random.Random(1)
    for case in range(40):
        bound, max_match = rng.randrange(8, 40), rng.randrange(1, 4)
        d = SuffixDrafter(
            max_match=max_match,
            max_depth=3,
            remember_outputs=True,
            corpus_tokens=bound,
            min_match=1,
        )
        model = LruModel(bound, max_match)
        live: dict[int, tuple[Salt, list[int]]] = {}
        for step in range(60):
            kind = rng.random()
            salt = rng.choice([None, b"x", b"y"])
            toks = [rng.randrange(5) for _ in range(rng.randrange(1, 9))]
            if kind < 0.25:
                d.add_request(step, toks, cache_salt=salt)
                live[step] = (salt, toks)
            elif kind < 0.55 and live:
                rid = rng.choice(sorted(live))
                salt, ctx = live[rid]
                ctx += toks[:2]
                ask(d, ctx, rid)
                model.propose(ctx, ctx, salt)
            elif kind < 0.8 and live:
                rid = rng.choice(sorted(live))
                salt, _ = live.pop(rid)
                d.remove_request(rid, output=toks)
                model.add(salt, toks)
            elif kind < 0.9:
                d.add_corpus(toks, cache_salt=salt)
                model.add(salt, toks)
            else:  # a one-off proposal: the corpus of no salt
                ask(d, toks, None)
                model.propose(toks, toks, None)
            assert d.corpus.ids_by_use() == list(model.seqs), (case, step)
            assert d.num_corpus_tokens == model.tokens() <= bound


def test_id_keyed_proposals_equal_the_one_off_path() -> None:
    rng = random.Random(2)
    for case in range(60):
        vocab, max_match = rng.choice([2, 3, 5]), rng.randrange(1, 5)
        d = SuffixDrafter(max_match=max_match, max_depth=rng.randrange(1, 6), min_match=1)
        corpus = [[rng.randrange(vocab) for _ in range(rng.randrange(12))] for _ in range(3)]
        for c in corpus:
            d.add_corpus(c)
        d.add_corpus([rng.randrange(vocab) for _ in range(8)], cache_salt="other")
        context = [rng.randrange(vocab) for _ in range(rng.randrange(1, 6))]
        d.add_request(case, context)
        for _ in range(5):
            context += [rng.randrange(vocab) for _ in range(rng.randrange(0, 4))]
            budget = rng.randrange(1, 14)
            keyed = ask(d, context, case, budget)
            once = ask(d, context, None, budget)
            want = reference_suffix_proposal(
                [*(c for c in corpus if c), context],
                context,
                max_match=max_match,
                max_depth=d.max_depth,
                budget=budget,
            )
            for got in (keyed, once):
                assert [p for p, _ in paths(got)] == [p for p, _ in want], case
                np.testing.assert_allclose(
                    [lp for _, lp in paths(got)], [lp for _, lp in want], atol=1e-12
                )
        d.remove_request(case)


def test_lifecycle_errors_are_clear() -> None:
    d = SuffixDrafter(corpus_tokens=4, remember_outputs=True)
    d.add_request(1, [1, 2, 3])
    with pytest.raises(DraftError, match="already added"):
        d.add_request(1, [4])
    with pytest.raises(DraftError, match="add_request"):
        ask(d, [1, 2], 9)
    with pytest.raises(DraftError, match="does not extend"):
        ask(d, [1, 2, 4, 5], 1)
    with pytest.raises(DraftError, match="more than once"):
        d.propose([DraftRequest([1, 2, 3], request_id=1)] * 2, 4)
    with pytest.raises(SpecdecTypeError):
        d.add_request(2, [1], cache_salt=5)  # type: ignore[arg-type]
    with pytest.raises(SpecdecTypeError):
        d.add_request(2, [1.5])  # type: ignore[list-item]
    with pytest.raises(TreeError):
        d.add_request(2, [-1])
    with pytest.raises(TreeError):
        d.remove_request(1, output=[2**40])
    assert d.num_requests == 1  # refused calls changed nothing
    d.remove_request(1, output=[5, 6, 7, 8, 9])  # longer than the bound: not kept
    assert d.num_requests == 0 and d.num_corpus == 0
    with pytest.raises(DraftError, match="no request"):
        d.remove_request(1)
    with pytest.raises(DraftError):
        d.add_corpus([1, 2, 3, 4, 5])
    with pytest.raises(DraftError):
        SuffixDrafter(corpus_tokens=-1)


class _ModelWithState:
    """A model drafter with per-request state (records the calls)."""

    def __init__(self, fail_add: bool = False) -> None:
        self.calls: list[tuple[str, int]] = []
        self.fail_add = fail_add

    def draft(self, requests: Sequence[DraftRequest], depth: int) -> torch.Tensor:
        return torch.zeros(len(requests), depth, 16)

    def add_request(
        self, request_id: int, prompt: Sequence[int], *, cache_salt: bytes | str | None = None
    ) -> None:
        if self.fail_add:
            raise DraftError("full")
        self.calls.append(("add", request_id))

    def remove_request(self, request_id: int, output: Sequence[int] | None = None) -> None:
        self.calls.append(("remove", request_id))


class _ModelWithoutState:
    def draft(self, requests: Sequence[DraftRequest], depth: int) -> torch.Tensor:
        return torch.zeros(len(requests), depth, 16)


def test_combined_drafter_forwards_the_lifecycle() -> None:
    model = _ModelWithState()
    c = CombinedDrafter(model, SuffixDrafter(remember_outputs=True, min_match=1), max_depth=2)
    assert isinstance(c, RequestLifecycle)
    c.add_request(3, [1, 2, 3], cache_salt="t")
    assert c.num_requests == 1 and model.calls == [("add", 3)]
    trees = c.propose([DraftRequest([1, 2, 3, 1, 2], request_id=3)], budget=4)
    assert len(trees) == 1
    c.remove_request(3, output=[4, 5])
    assert c.num_requests == 0 and model.calls == [("add", 3), ("remove", 3)]
    assert c.suffix.num_corpus == 1
    # A model without state: the suffix drafter's alone.
    c = CombinedDrafter(_ModelWithoutState(), max_depth=2)
    c.add_request(1, [1])
    assert c.num_requests == 1
    c.remove_request(1)
    assert c.num_requests == 0
    # A model that refuses the request: neither holds it.
    c = CombinedDrafter(_ModelWithState(fail_add=True), max_depth=2)
    with pytest.raises(DraftError, match="full"):
        c.add_request(1, [1])
    assert c.num_requests == 0


def test_threads_share_an_index_and_a_corpus() -> None:
    """Proposals (the GIL released, long: a two-token vocabulary matches everywhere) while
    other threads extend the same index and add to and remove from the same corpus: every
    call waits for the lock instead of failing, and no update is lost."""
    rng = random.Random(3)
    index, corpus = _core.SuffixIndex(4), _core.SuffixCorpus(4, 4000)
    index.extend([rng.randrange(2) for _ in range(3000)])
    errors: list[BaseException] = []
    added: list[int] = []
    start = threading.Barrier(4)

    def run(work: int) -> None:
        try:
            start.wait()
            r = random.Random(work)
            for i in range(60):
                if work == 0:
                    index.propose([0, 1, 1, 0], 16, 64, 0.0, corpus, None)
                elif work == 1:
                    index.extend([r.randrange(2) for _ in range(5)])
                elif work == 2:
                    corpus.add([r.randrange(2) for _ in range(50)])
                    if i % 3 == 0 and len(corpus):
                        corpus.remove(corpus.ids_by_use()[0])
                else:
                    added.append(len(index) + corpus.num_tokens)
                    index.propose([1, 0], 16, 64, 0.0, corpus, "s")
        except BaseException as e:  # noqa: BLE001 - every failure is reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(index) == 3000 + 60 * 5
    assert corpus.num_tokens <= 4000 and len(added) == 60
