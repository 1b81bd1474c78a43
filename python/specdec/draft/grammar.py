"""Grammar drafts: what a request's constraint already decides, as draft-tree nodes.

A grammar knows much of a structured answer before the model does: keys, quotes, colons,
commas, closing brackets, the rest of an enum value once it is chosen. From the matcher's
state, the Rust core gives every way the text can go as bytes
(:meth:`~specdec.constrain.Matcher.forced_paths`: the forced bytes, then at each choice
point of a few options each option with its own forced tail, cached per parser state).
Here each path becomes the tokens the tokenizer itself would write it as
(:meth:`~specdec.constrain.Vocabulary.canonical_tokens`: a model mostly writes text the way
its tokenizer does), and the paths become

* ``forced``: the tokens every path starts with. They go first in the step's tree as
  probability-1 nodes, and the drafter's tree (model or suffix) continues from their end
  (:attr:`~specdec.protocols.DraftRequest.prefix`);
* ``branches``: the grammar's choices after them as a tree of their own, rooted at the last
  forced token, each choice weighted ``1 / options``: one more candidate for the step's
  continuation, beside the drafters' trees.

Lossless by construction: the target verifies every drafted node under the grammar's mask,
so a path the model would write otherwise (another tokenization, a different choice) is
only a rejected draft.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._arrays import check_int
from ..errors import DraftError
from ..tree import DraftTree

__all__ = ["GrammarDraft", "GrammarDrafts"]


@dataclass(frozen=True)
class GrammarDraft:
    """What a grammar decides from one matcher state.

    ``forced``: tokens every valid continuation starts with (in its canonical
    tokenization), ending with EOS when the text must end there. ``branches``: the choices
    after ``forced`` as a tree rooted at its last token (``-1``: unknown, set by
    :meth:`DraftTree.with_root`), node log-probabilities the log of the choices' summed
    weights; ``None`` when the grammar offers no small choice there. ``ends``: ``forced``
    ends with EOS (nothing can follow it)."""

    forced: tuple[int, ...]
    branches: DraftTree | None
    ends: bool

    @property
    def num_forced(self) -> int:
        return len(self.forced)


_EMPTY = GrammarDraft((), None, False)


class GrammarDrafts:
    """Grammar drafts for the requests of a generator (:meth:`draft`, per matcher).

    ``max_bytes``, ``max_branches``, ``levels``, ``max_paths``: how far the byte paths go
    (:meth:`~specdec.constrain.Matcher.forced_paths`); ``max_forced``: forced tokens drafted
    at most per step. Drafts are cached per set of byte paths (a grammar's states recur:
    every member of an array, every object of a schema)."""

    def __init__(
        self,
        *,
        max_bytes: int = 64,
        max_branches: int = 4,
        levels: int = 2,
        max_paths: int = 16,
        max_forced: int = 32,
    ) -> None:
        self.max_bytes = check_int(max_bytes, "max_bytes", 1, DraftError)
        self.max_branches = check_int(max_branches, "max_branches", 1, DraftError)
        self.levels = check_int(levels, "levels", 0, DraftError)
        self.max_paths = check_int(max_paths, "max_paths", 1, DraftError)
        self.max_forced = check_int(max_forced, "max_forced", 1, DraftError)
        self._cache: dict[tuple[Any, ...], GrammarDraft] = {}
        # Forced tokens a generator drafted with these settings so far (verified or not).
        self.forced_tokens = 0
        # Per position in the forced chain: times verified with every token before it
        # accepted, and times accepted (a model forced to write a key it was not shown
        # splits it its own way, and the chain stops paying after its first tokens).
        self._tried = [0.0] * self.max_forced
        self._taken = [0.0] * self.max_forced

    #: The chain is cut where the chance of reaching a position falls below this.
    min_reach = 0.25

    #: Each chain observed weighs the earlier ones by this: positions past a cut are tried
    #: again once their record has faded (a server's next requests may differ).
    decay = 0.98

    def observe(self, drafted: int, accepted: int) -> None:
        """Learn from one verified chain: ``drafted`` forced tokens, the first ``accepted``
        of them accepted."""
        if drafted <= 0:
            return
        self._tried = [x * self.decay for x in self._tried]
        self._taken = [x * self.decay for x in self._taken]
        for i in range(min(drafted, accepted + 1, self.max_forced)):
            self._tried[i] += 1.0
            self._taken[i] += float(i < accepted)

    def chain_limit(self) -> int:
        """Forced tokens worth drafting: up to where the chance of every token so far being
        accepted (per position, accepted over tried, with two accepted tries as prior)
        falls below :attr:`min_reach`."""
        reach = 1.0
        for i in range(self.max_forced):
            reach *= (self._taken[i] + 2.0) / (self._tried[i] + 2.0)
            if reach < self.min_reach:
                return max(i, 1)
        return self.max_forced

    def draft(self, matcher: Any) -> GrammarDraft:
        """The grammar's draft from ``matcher``'s state (a :class:`specdec.Matcher`; any
        other constraint, or a terminated matcher, drafts nothing)."""
        paths_of = getattr(matcher, "forced_paths", None)
        if paths_of is None or matcher.is_terminated():
            return _EMPTY
        paths = paths_of(
            max_bytes=self.max_bytes,
            max_branches=self.max_branches,
            levels=self.levels,
            max_paths=self.max_paths,
        )
        if not paths:
            return _EMPTY
        # Keyed by the vocabulary object (held, so its id is never another's) and the paths:
        # a draft depends on nothing else.
        vocab = matcher.grammar.vocab
        key = (vocab, *((p.bytes, p.eos, p.weight) for p in paths))
        hit = self._cache.get(key)
        if hit is None:
            hit = self._build(vocab, paths)
            if len(self._cache) >= 4096:
                self._cache.clear()
            self._cache[key] = hit
        return hit

    @staticmethod
    def respell(vocab: Any, forced: Sequence[int], written: Sequence[int]) -> tuple[int, ...]:
        """``forced`` spelled the way ``written`` spells the same bytes, where it does: a
        model forced to write text it did not expect (a key it was not shown) splits it its
        own way, and writes it that way again when the text repeats, which the suffix
        index's best path (``written``) shows. The tokens of ``written`` that spell the
        forced bytes from their start are kept, the rest of the bytes canonical; ``forced``
        itself when ``written`` agrees with it or spells none of it."""
        eos = forced[-1] if forced and vocab.token_bytes(forced[-1]) is None else None
        body = list(forced[:-1] if eos is not None else forced)
        data = b"".join(vocab.token_bytes(t) or b"" for t in body)
        out: list[int] = []
        off = 0
        for t in written:
            b = vocab.token_bytes(t)
            if off == len(data) or not b or data[off : off + len(b)] != b:
                break
            out.append(int(t))
            off += len(b)
        if not out or out == body[: len(out)]:
            return tuple(forced)
        rest = vocab.canonical_tokens(data[off:])
        if off + sum(len(vocab.token_bytes(t) or b"") for t in rest) != len(data):
            return tuple(forced)  # (the canonical tail left bytes out: keep the trunk's end)
        return (*out, *rest, *(() if eos is None else (eos,)))

    def _build(self, vocab: Any, paths: list[Any]) -> GrammarDraft:
        eos = vocab.eos_ids[0] if vocab.eos_ids else None
        seqs: list[tuple[tuple[int, ...], float]] = []
        for p in paths:
            toks = vocab.canonical_tokens(p.bytes)
            spelled = sum(len(vocab.token_bytes(t) or b"") for t in toks)
            if p.eos and eos is not None and spelled == len(p.bytes):
                toks = (*toks, eos)
            elif p.eos and eos is None:
                # The text must end, and nothing can end it: its last token is left to the
                # step's bonus token, so the tokens before it commit before the dead end.
                toks = toks[:-1]
            elif toks and not p.eos and (vocab.token_bytes(toks[-1]) or b"x").isspace():
                # The path stops at a choice after whitespace: byte-level BPE writes a space
                # with what follows it (": " then '"' as ': ', ' "'), so it is left to the
                # model and the drafters.
                toks = toks[:-1]
            seqs.append((toks, float(p.weight)))
        # The forced tokens: what every path's tokens start with.
        first = seqs[0][0]
        n = len(first)
        for toks, _ in seqs[1:]:
            n = min(n, len(toks))
            for i in range(n):
                if toks[i] != first[i]:
                    n = i
                    break
        n = min(n, self.max_forced)
        forced = first[:n]
        ends = bool(forced) and eos is not None and forced[-1] == eos
        return GrammarDraft(forced, None if ends else _branch_tree(seqs, n), ends)


def _branch_tree(seqs: list[tuple[tuple[int, ...], float]], skip: int) -> DraftTree | None:
    """The paths' tokens after the first ``skip`` as one tree (shared prefixes once), each
    node's probability its paths' summed weight, in best-first order; None if empty."""
    children: dict[tuple[int, int], int] = {}  # (parent node, token) -> node
    tokens, parents, depths, probs = [-1], [-1], [0], [1.0]
    for toks, w in seqs:
        node = 0
        for t in toks[skip:]:
            nxt = children.get((node, t))
            if nxt is None:
                nxt = len(tokens)
                children[(node, t)] = nxt
                tokens.append(t)
                parents.append(node)
                depths.append(depths[node] + 1)
                probs.append(0.0)
            probs[nxt] += w
            node = nxt
    if len(tokens) == 1:
        return None
    # Best first: a child's weight never exceeds its parent's, so (-weight, depth) keeps
    # every parent before its children.
    order = sorted(range(1, len(tokens)), key=lambda i: (-probs[i], depths[i], i))
    pos = {0: 0}
    for k, i in enumerate(order, 1):
        pos[i] = k
    idx = [0, *order]
    return DraftTree(
        np.array([tokens[i] for i in idx], dtype=np.int64),
        np.array([-1] + [pos[parents[i]] for i in order], dtype=np.int32),
        np.array([depths[i] for i in idx], dtype=np.int32),
        np.array([0.0] + [math.log(min(probs[i], 1.0)) for i in order], dtype=np.float64),
    )
