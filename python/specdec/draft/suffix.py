"""Suffix drafting: a drafter that needs no model. Each request's own suffix index (Rust,
:class:`specdec._core.SuffixIndex`) and a corpus of earlier outputs shared by the requests of
its tenant (:class:`specdec._core.SuffixCorpus`) together propose the continuations of the
context's longest recurring suffix as a scored tree: the ``budget`` prefixes of highest
empirical path probability, chosen best-first."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass

from .. import _core
from .._arrays import check_float, check_int
from ..errors import DraftError, SpecdecTypeError
from ..protocols import DraftRequest
from ..tree import DraftTree
from .base import check_requests

__all__ = ["SuffixDrafter", "DEFAULT_CORPUS_TOKENS"]

DEFAULT_CORPUS_TOKENS = 1 << 18
"""The corpus bound when none is given: 262,144 tokens over all tenants. The corpus indexes
every m-gram of its sequences, ``max_match`` of them per token: at the default
``max_match=8`` that costs up to about 1 KB a token (uniformly random tokens, every longer
m-gram new; about 0.3 KB on Zipf-distributed ones), so at most some 250 MB: the last
thousand or so outputs of a serving process, enough for the repeated text suffix drafting
lives on (agent loops, code edits, re-asked questions) without the index outgrowing a
host's memory."""


@dataclass
class _Request:
    """One request's state: its index, the tokens it holds, and its tenant's salt."""

    index: _core.SuffixIndex
    seen: list[int]
    salt: bytes | None


def _tokens(tokens: Sequence[int], what: str) -> list[int]:
    """``tokens`` as a list of ints (numpy and torch integers too; floats are refused)."""
    try:
        return [operator.index(t) for t in tokens]
    except TypeError as e:
        raise SpecdecTypeError(f"{what} must be a sequence of ints: {e}") from None


def _salt(cache_salt: bytes | str | None) -> bytes | None:
    """A cache salt as bytes (a str as its UTF-8, as the paged cache hashes it); ``None`` is
    a partition of its own, apart from ``b""``."""
    if cache_salt is None or isinstance(cache_salt, bytes):
        return cache_salt
    if isinstance(cache_salt, str):
        try:
            return cache_salt.encode("utf-8")
        except UnicodeEncodeError as e:
            raise DraftError(f"cache_salt is not valid UTF-8: {e}") from None
    raise SpecdecTypeError(
        f"cache_salt must be bytes, str or None, got {type(cache_salt).__name__}"
    )


class SuffixDrafter:
    """A :class:`~specdec.protocols.TreeDrafter` over suffix indices, with per-request state
    (:class:`~specdec.protocols.RequestLifecycle`).

    ``max_match``: longest context suffix looked up; ``max_depth``: deepest drafted node;
    ``min_prob``: smallest path probability drafted; ``min_match``: shortest context suffix
    that counts as a match (default 3, at most ``max_match``: a token or two of context
    recur almost anywhere, and on SmolLM2's questions the chains drafted from them were
    rejected at their first token while every step that found one paid for pricing it;
    block + suffix under the adaptive budget, greedy: 0.928-0.945x of plain decoding with 1,
    0.955-0.956x with 3; text edits level); ``depth_factor``: with it, a match of ``m``
    tokens drafts at most ``floor(depth_factor * m)`` tokens deep (a short match is weak
    evidence however often it occurred: suffix decoding's ``max_spec_factor``).

    A request added with :meth:`add_request` gets its own index of its prompt; each
    :class:`~specdec.protocols.DraftRequest` with its ``request_id`` must extend the tokens
    seen so far, and the new ones are appended. :meth:`remove_request` frees it; with
    ``remember_outputs``, the output of a request that finished (not its prompt) joins the
    corpus of its ``cache_salt``, which later requests of that salt match against, and never
    those of another salt. A ``DraftRequest`` without ``request_id`` is served from its
    context alone (and the corpus of no salt).

    The corpus holds at most ``corpus_tokens`` tokens over all salts (default
    :data:`DEFAULT_CORPUS_TOKENS`); past it, the least recently used sequences leave first,
    where a sequence is used when added and when a proposal drafts from it."""

    def __init__(
        self,
        *,
        max_match: int = 8,
        max_depth: int = 8,
        min_prob: float = 0.0,
        remember_outputs: bool = False,
        corpus_tokens: int = DEFAULT_CORPUS_TOKENS,
        min_match: int | None = None,
        depth_factor: float | None = None,
    ) -> None:
        self.max_match = check_int(max_match, "max_match", 1, DraftError)
        self.max_depth = check_int(max_depth, "max_depth", 1, DraftError)
        self.min_prob = check_float(min_prob, "min_prob", DraftError)
        if not 0.0 <= self.min_prob <= 1.0:
            raise DraftError(f"min_prob must be in [0, 1], got {self.min_prob}")
        self.min_match = check_int(
            min(3, self.max_match) if min_match is None else min_match, "min_match", 1, DraftError
        )
        self.depth_factor = (
            None if depth_factor is None else check_float(depth_factor, "depth_factor", DraftError)
        )
        if self.depth_factor is not None and not 0.0 < self.depth_factor < float("inf"):
            raise DraftError(f"depth_factor must be finite and > 0, got {self.depth_factor}")
        self.remember_outputs = bool(remember_outputs)
        self.corpus_tokens = check_int(corpus_tokens, "corpus_tokens", 0, DraftError)
        self._corpus = _core.SuffixCorpus(self.max_match, self.corpus_tokens)
        self._requests: dict[int, _Request] = {}

    # -- corpus ------------------------------------------------------------------------------
    def add_corpus(self, tokens: Sequence[int], *, cache_salt: bytes | str | None = None) -> int:
        """Add an earlier output that the requests of ``cache_salt`` match against (evicting
        least recently used sequences past the bound); returns its id."""
        return self._corpus.add(_tokens(tokens, "tokens"), _salt(cache_salt))

    def remove_corpus(self, cid: int) -> None:
        """Drop a corpus sequence added by :meth:`add_corpus` (``DraftError`` when it is not
        held: never added, removed, or evicted past the bound)."""
        self._corpus.remove(cid)

    @property
    def num_corpus(self) -> int:
        """Corpus sequences held, over all salts."""
        return len(self._corpus)

    @property
    def num_corpus_tokens(self) -> int:
        """Corpus tokens held, over all salts (at most ``corpus_tokens``)."""
        return self._corpus.num_tokens

    @property
    def corpus(self) -> _core.SuffixCorpus:
        """The shared corpus (read it; add and remove through the drafter)."""
        return self._corpus

    # -- requests ----------------------------------------------------------------------------
    def add_request(
        self, request_id: int, prompt: Sequence[int], *, cache_salt: bytes | str | None = None
    ) -> None:
        """Start the state of request ``request_id``: an index of its ``prompt``, drafting
        from the corpus of ``cache_salt``."""
        rid = check_int(request_id, "request_id", None, DraftError)
        if rid in self._requests:
            raise DraftError(f"request {rid} was already added")
        salt = _salt(cache_salt)
        toks = _tokens(prompt, "prompt")
        index = _core.SuffixIndex(self.max_match)
        index.extend(toks)
        self._requests[rid] = _Request(index, toks, salt)

    def remove_request(self, request_id: int, output: Sequence[int] | None = None) -> None:
        """Free the state of request ``request_id``; with ``remember_outputs``, its
        ``output`` (the tokens it generated, ``None`` when it did not finish) joins the corpus
        of its salt. An output longer than the whole corpus bound is not kept."""
        rid = check_int(request_id, "request_id", None, DraftError)
        r = self._requests.get(rid)
        if r is None:
            raise DraftError(f"no request with id {rid} (never added, or already removed)")
        if self.remember_outputs and output is not None:
            toks = _tokens(output, "output")
            if 0 < len(toks) <= self.corpus_tokens:
                self._corpus.add(toks, r.salt)  # refused tokens leave the request held
        del self._requests[rid]

    @property
    def num_requests(self) -> int:
        """Requests added and not yet removed."""
        return len(self._requests)

    # -- proposals ---------------------------------------------------------------------------
    def propose_tree(self, context: Sequence[int], budget: int) -> DraftTree:
        """The tree of at most ``budget`` drafted nodes after ``context`` (one request)."""
        return self.propose([DraftRequest(context)], budget)[0]

    accepts_prefix = True  # DraftRequest.prefix: the lookup continues through it

    def propose(self, requests: Sequence[DraftRequest], budget: int) -> list[DraftTree]:
        """One tree per request (root: its last context token, or its ``prefix``'s last
        token; the root alone on no match)."""
        budget = check_int(budget, "budget", 1, DraftError)
        check_requests(requests)
        # Every request is checked before any index grows.
        ids = [r.request_id for r in requests if r.request_id is not None]
        if len(set(ids)) < len(ids):
            raise DraftError("a request id appears more than once in one propose call")
        plans = [self._plan(r) for r in requests]
        out = []
        for r, (state, new) in zip(requests, plans, strict=True):
            if new:
                state.index.extend(new)
                state.seen.extend(new)
            # A proposal reads no more of the context; the prefix's tokens come after it.
            seen = [*state.seen[-self.max_match :], *r.prefix] if r.prefix else state.seen
            tail = seen[-self.max_match :]
            arrays = state.index.propose(
                tail,
                self.max_depth,
                budget,
                self.min_prob,
                self._corpus,
                state.salt,
                self.min_match,
                self.depth_factor,
            )
            out.append(DraftTree._from_core(arrays))
        return out

    def _plan(self, r: DraftRequest) -> tuple[_Request, list[int]]:
        """The state that serves ``r`` and the context tokens it has yet to index. Only the
        new tokens and the last ``max_match`` seen ones are read: a step's context is the
        whole sequence, and converting and comparing all of it cost more than the lookup
        (a request's index holds what it was given; a lookup reads only its last
        ``max_match`` tokens, which are checked)."""
        if r.request_id is None:  # a one-off call: a temporary index of the context
            context = _tokens(r.context, "context")
            return _Request(_core.SuffixIndex(self.max_match), [], None), context
        rid = check_int(r.request_id, "request_id", None, DraftError)
        state = self._requests.get(rid)
        if state is None:
            raise DraftError(f"no request with id {rid}: call add_request before drafting for it")
        n, ctx = len(state.seen), r.context
        k = min(n, self.max_match)
        if len(ctx) < n or (k and _tokens(ctx[n - k : n], "context") != state.seen[n - k :]):
            raise DraftError(f"the context of request {rid} does not extend its {n} tokens so far")
        return state, _tokens(ctx[n:], "context")
