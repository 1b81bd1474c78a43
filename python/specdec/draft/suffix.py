"""Suffix drafting: a drafter that needs no model. A suffix index (Rust,
:class:`specdec._core.SuffixIndex`) over the request's own tokens and a corpus of earlier
outputs proposes the continuations of the context's longest recurring suffix as a scored
tree: the ``budget`` prefixes of highest empirical path probability, chosen best-first."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .. import _core
from .._arrays import check_float, check_int
from ..errors import DraftError
from ..protocols import DraftRequest
from ..tree import DraftTree
from .base import check_requests

__all__ = ["SuffixDrafter"]


@dataclass
class _Request:
    """The index of one request: its tokens so far, and its corpus ids by drafter corpus id."""

    index: _core.SuffixIndex
    seen: list[int] = field(default_factory=list)
    corpus_ids: dict[int, int] = field(default_factory=dict)


class SuffixDrafter:
    """A :class:`~specdec.protocols.TreeDrafter` over suffix indices.

    ``max_match``: longest context suffix looked up; ``max_depth``: deepest drafted node;
    ``min_prob``: smallest path probability drafted. Each request's index follows its context
    (a context that extends the tokens seen so far appends the new ones; any other starts a
    new request). Requests absent from a :meth:`propose` call are dropped; with
    ``remember_outputs`` their tokens join the corpus that later requests match against."""

    def __init__(
        self,
        *,
        max_match: int = 8,
        max_depth: int = 8,
        min_prob: float = 0.0,
        remember_outputs: bool = False,
    ) -> None:
        self.max_match = check_int(max_match, "max_match", 1, DraftError)
        self.max_depth = check_int(max_depth, "max_depth", 1, DraftError)
        self.min_prob = check_float(min_prob, "min_prob", DraftError)
        if not 0.0 <= self.min_prob <= 1.0:
            raise DraftError(f"min_prob must be in [0, 1], got {self.min_prob}")
        self.remember_outputs = bool(remember_outputs)
        self._corpus: dict[int, list[int]] = {}
        self._next_id = 0
        self._requests: list[_Request] = []

    # -- corpus ------------------------------------------------------------------------------
    def add_corpus(self, tokens: Sequence[int]) -> int:
        """Add an earlier output that every request matches against; returns its id."""
        toks = [int(t) for t in tokens]
        _core.SuffixIndex(1).add_corpus(toks)  # check the tokens before keeping them
        cid = self._next_id
        self._next_id += 1
        self._corpus[cid] = toks
        for r in self._requests:
            r.corpus_ids[cid] = r.index.add_corpus(toks)
        return cid

    def remove_corpus(self, cid: int) -> None:
        """Drop a corpus sequence added by :meth:`add_corpus`."""
        if cid not in self._corpus:
            raise DraftError(f"no corpus sequence with id {cid}")
        del self._corpus[cid]
        for r in self._requests:
            r.index.remove_corpus(r.corpus_ids.pop(cid))

    @property
    def num_corpus(self) -> int:
        return len(self._corpus)

    # -- proposals ---------------------------------------------------------------------------
    def propose_tree(self, context: Sequence[int], budget: int) -> DraftTree:
        """The tree of at most ``budget`` drafted nodes after ``context`` (one request)."""
        return self.propose([DraftRequest(context)], budget)[0]

    def propose(self, requests: Sequence[DraftRequest], budget: int) -> list[DraftTree]:
        """One tree per request (root: its last context token; the root alone on no match)."""
        budget = check_int(budget, "budget", 1, DraftError)
        check_requests(requests)
        used: list[_Request] = []
        for r in requests:
            used.append(self._follow([int(t) for t in r.context], taken=used))
        dropped = [old for old in self._requests if all(old is not u for u in used)]
        self._requests = used
        if self.remember_outputs:
            for old in dropped:
                self.add_corpus(old.seen)
        return [
            DraftTree._from_core(u.index.propose(u.seen, self.max_depth, budget, self.min_prob))
            for u in used
        ]

    def _follow(self, context: list[int], taken: list[_Request]) -> _Request:
        """The request whose tokens ``context`` extends (one not ``taken`` by an earlier
        request of the batch), brought up to date, or a new one."""
        for r in self._requests:
            if any(r is t for t in taken):
                continue
            n = len(r.seen)
            if n <= len(context) and context[:n] == r.seen:
                r.index.extend(context[n:])
                r.seen.extend(context[n:])
                return r
        r = _Request(_core.SuffixIndex(self.max_match))
        for cid, toks in self._corpus.items():
            r.corpus_ids[cid] = r.index.add_corpus(toks)
        r.index.extend(context)
        r.seen.extend(context)
        return r
