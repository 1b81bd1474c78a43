"""Grammar drafts: what a request's constraint already decides, as draft-tree nodes.

A grammar knows much of a structured answer before the model does: keys, quotes, colons,
commas, closing brackets, the rest of an enum value once it is chosen. From the matcher's
state, the Rust core gives every way the text can go as bytes
(:meth:`~specdec.constrain.Matcher.forced_paths`: the forced bytes, then at each choice
point of a few options each option with its own forced tail, cached per parser state).
Here the paths become tokens the way the model writes them (:class:`Spelling`: its
tokenizer's way, :meth:`~specdec.constrain.Vocabulary.canonical_tokens`, until what it
commits shows otherwise; a model forced to write a key it was not shown writes it in short
pieces of its own, ``"m" "ap" "_" "service"`` for ``"map" "_" "service"``), and become

* ``forced``: the tokens the model surely writes next, its likeliest spelling's sure
  start. They go first in the step's tree as probability-1 nodes, and the drafter's tree
  (model or suffix) continues from their end (:attr:`~specdec.protocols.DraftRequest.prefix`);
* ``branches``: the rest as a tree of its own, rooted at the last forced token: the bytes'
  other spellings and the grammar's choices after them, each node weighted by the chance
  of the model writing its path (a choice of ``n`` options ``1 / n``): one more candidate
  for the step's continuation, beside the drafters' trees.

Lossless by construction: the target verifies every drafted node under the grammar's mask,
so a path the model would write otherwise (another tokenization, a different choice) is
only a rejected draft.
"""

from __future__ import annotations

import heapq
import itertools
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._arrays import check_int
from ..errors import DraftError
from ..tree import DraftTree

__all__ = ["GrammarDraft", "GrammarDrafts", "Spelling"]


@dataclass(frozen=True)
class GrammarDraft:
    """What a grammar decides from one matcher state.

    ``forced``: tokens every valid continuation starts with (the sure start of the
    model's likeliest spelling of them, :class:`Spelling`), ending with EOS when the text
    must end there. ``branches``: what may follow ``forced`` as a tree rooted at its last
    token (``-1``: unknown, set by :meth:`DraftTree.with_root`): the forced bytes' other
    spellings, where ``forced`` does not spell them all, then the grammar's choices; node
    log-probabilities the log of their summed weights; ``None`` when there is neither.
    ``ends``: ``forced`` ends with EOS (nothing can follow it). ``data``: the bytes every
    valid continuation starts with, as far as the draft spells them."""

    forced: tuple[int, ...]
    branches: DraftTree | None
    ends: bool
    data: bytes = b""  # the bytes every path starts with (what the model's spelling is learnt on)

    @property
    def num_forced(self) -> int:
        return len(self.forced)


_EMPTY = GrammarDraft((), None, False)


class Spelling:
    """How the model writes bytes its grammar forces, learnt from what it commits
    (:meth:`learn`). At each point of a forced span the model takes one of the tokens that
    spell the span's next bytes (:meth:`~specdec.constrain.Vocabulary.prefix_tokens`), or
    one that runs past the span. Each such candidate's chance is its own record beside the
    tokenizer's choice there (the pair (canonical token, candidate): ``{`` for ``{"``,
    ``"`` for ``":``, recur in every JSON answer), backed off to its kind's (the canonical
    token, or the n-th longest of so many) until the pair has been seen.

    A model shown a key writes it as its tokenizer does; one forced to write a key it was
    not shown mostly takes short pieces (SmolLM2: ``"l" "au" "n" "c" "her"`` for
    ``"la" "un" "cher"``), and so do the chances learnt here."""

    #: A record's tries are halved past this (the model's habits on new text may change).
    cap = 256.0

    #: Records kept at most: past this, the half tried most is kept (a server runs for
    #: weeks, and the pairs it meets have no end).
    max_records = 1 << 16

    def __init__(self) -> None:
        self._taken: dict[tuple[Any, ...], float] = {}
        self._tried: dict[tuple[Any, ...], float] = {}
        # Choices learnt so far: a draft built this many learnt choices ago is stale.
        self.version = 0

    @staticmethod
    def _keys(canonical: int, cands: Sequence[int], i: int) -> tuple[tuple[Any, ...], ...]:
        kind = "canonical" if cands[i] == canonical else min(i, 3)
        return (kind, min(len(cands), 4)), (canonical, cands[i])

    def _chance(self, key: tuple[Any, ...], prior: float, weight: float) -> float:
        return (self._taken.get(key, 0.0) + prior * weight) / (self._tried.get(key, 0.0) + weight)

    def choices(self, vocab: Any, data: bytes) -> list[tuple[int, float]]:
        """The tokens that can begin ``data``, longest first, each with its chance of being
        the model's next token where it must write ``data`` (summing to 1; a token that
        runs past the end of ``data`` is not among them, and lowers their learnt records
        alike)."""
        cands = vocab.prefix_tokens(data)
        if not cands:
            return []
        canon = vocab.canonical_tokens(data)
        c0 = canon[0] if canon else -1
        out = []
        for i, t in enumerate(cands):
            kind, pair = self._keys(c0, cands, i)
            # Unlearnt, the tokenizer's choice is the likely one.
            base = self._chance(kind, 0.9 if t == c0 else 0.05, 2.0)
            out.append((t, self._chance(pair, base, 2.0)))
        total = sum(p for _, p in out)
        return [(t, p / total) for t, p in out]

    def learn(self, vocab: Any, data: bytes, tokens: Sequence[int]) -> None:
        """Learn from ``tokens``, committed from where ``data`` was forced: each choice among
        the tokens that could begin the rest of ``data``, up to the first token that does
        not spell it (which still counts against every candidate it beat)."""
        off = 0
        for t in tokens:
            rest = data[off:]
            cands = vocab.prefix_tokens(rest) if rest else ()
            if not cands:
                break
            canon = vocab.canonical_tokens(rest)
            c0 = canon[0] if canon else -1
            b = vocab.token_bytes(int(t))
            for i, u in enumerate(cands):
                for key in self._keys(c0, cands, i):
                    tried = self._tried.get(key, 0.0) + 1.0
                    taken = self._taken.get(key, 0.0) + float(vocab.token_bytes(u) == b)
                    if tried > self.cap:
                        tried, taken = tried / 2, taken / 2
                    self._tried[key], self._taken[key] = tried, taken
            self.version += 1
            if not b or not rest.startswith(b):
                break
            off += len(b)
        if len(self._tried) > self.max_records:
            keep = sorted(self._tried, key=self._tried.__getitem__)[-(self.max_records // 2) :]
            self._tried = {k: self._tried[k] for k in keep}
            self._taken = {k: self._taken[k] for k in keep}

    def tree(
        self, vocab: Any, ways: Sequence[tuple[bytes, float, bool]], eos: int | None, nodes: int
    ) -> list[_Node]:
        """The likeliest spellings of ``ways`` (each: bytes, weight, and whether the text
        ends after them, with ``eos``) as a tree of at most ``nodes`` nodes besides its
        root, best first (a node's first child its likeliest). A token's chance is the
        weighted mean over the ways it spells on of the model writing it there."""
        total = sum(w for _, w, _ in ways) or 1.0
        out = [_Node(-1, -1, 1.0, 0, tuple(range(len(ways))))]
        heap: list[tuple[float, int, _Node]] = []
        order = itertools.count()  # ties: the first pushed
        memo: dict[bytes, list[tuple[int, float]]] = {}

        def expand(at: int) -> None:
            node = out[at]
            if node.off < 0:
                return  # EOS: nothing follows
            share = sum(ways[i][1] for i in node.live) or total
            chance: dict[int, float] = {}
            live: dict[int, list[int]] = {}
            for i in node.live:
                data, w, ends = ways[i]
                rest = data[node.off :]
                if not rest:
                    if ends and eos is not None:
                        chance[eos] = chance.get(eos, 0.0) + w / share
                        live.setdefault(eos, []).append(i)
                    continue
                # (the first bytes decide the choices: ways that differ later share them)
                key = rest[:24]
                got = memo.get(key)
                if got is None:
                    got = memo[key] = self.choices(vocab, rest)
                for t, q in got:
                    if rest.startswith(vocab.token_bytes(t)):
                        chance[t] = chance.get(t, 0.0) + q * w / share
                        live.setdefault(t, []).append(i)
            for t, q in chance.items():
                spelt = vocab.token_bytes(t)
                off = node.off + len(spelt) if spelt else -1  # (-1: EOS)
                p = node.chance * min(q, 1.0)
                heapq.heappush(heap, (-p, next(order), _Node(t, at, p, off, tuple(live[t]))))

        expand(0)
        while heap and len(out) <= nodes:
            _, _, node = heapq.heappop(heap)
            out.append(node)
            expand(len(out) - 1)
        return out


@dataclass(frozen=True)
class _Node:
    """A node of a :meth:`Spelling.tree`: its token, parent, chance of the model writing
    the path to it, bytes its path spells (-1: EOS), and the ways it is on."""

    token: int
    parent: int
    chance: float
    off: int
    live: tuple[int, ...]


class GrammarDrafts:
    """Grammar drafts for the requests of a generator (:meth:`draft`, per matcher).

    ``max_bytes``, ``max_branches``, ``levels``, ``max_paths``: how far the byte paths go
    (:meth:`~specdec.constrain.Matcher.forced_paths`); ``max_forced``: forced tokens drafted
    at most per step; ``spellings``: nodes of the forced bytes' other spellings drafted at
    most (0: only the tokenizer's spelling); ``sure``: a spelling's token is forced while
    the chance of the model writing it is at least this. Drafts are cached per set of byte
    paths (a grammar's states recur: every member of an array, every object of a schema),
    and rebuilt as the spelling learns."""

    def __init__(
        self,
        *,
        max_bytes: int = 64,
        max_branches: int = 4,
        levels: int = 2,
        max_paths: int = 16,
        max_forced: int = 32,
        spellings: int = 16,
        sure: float = 0.9,
    ) -> None:
        self.max_bytes = check_int(max_bytes, "max_bytes", 1, DraftError)
        self.max_branches = check_int(max_branches, "max_branches", 1, DraftError)
        self.levels = check_int(levels, "levels", 0, DraftError)
        self.max_paths = check_int(max_paths, "max_paths", 1, DraftError)
        self.max_forced = check_int(max_forced, "max_forced", 1, DraftError)
        self.spellings = check_int(spellings, "spellings", 0, DraftError)
        if not 0.0 < sure <= 1.0:
            raise DraftError(f"sure must be in (0, 1], got {sure}")
        self.sure = float(sure)
        self.spelling = Spelling()
        # Per set of byte paths: its draft and the spelling's version it was built at.
        self._cache: dict[tuple[Any, ...], tuple[GrammarDraft, int]] = {}
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
        now = self.spelling.version
        # Rebuilt once the spelling has learnt an eighth more since (every step at first).
        if hit is None or (now - hit[1]) * 8 > hit[1]:
            hit = (self._build(vocab, paths), now)
            if len(self._cache) >= 4096:
                self._cache.clear()
            self._cache[key] = hit
        return hit[0]

    def learn(self, vocab: Any, draft: GrammarDraft, tokens: Sequence[int]) -> None:
        """Learn the model's spelling from ``tokens``, committed by a step from the state
        ``draft`` was drafted at (:class:`Spelling`)."""
        if draft.data and self.spellings:
            self.spelling.learn(vocab, draft.data, tokens)

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
        if not self.spellings:
            return self._build_canonical(vocab, paths)
        eos = vocab.eos_ids[0] if vocab.eos_ids else None
        ways = []
        for p in paths:
            data, ends = p.bytes, p.eos
            if ends and eos is None:
                # The text must end, and nothing can end it: its last token is left to the
                # step's bonus token, so the tokens before it commit before the dead end.
                data, ends = data[:-1], False
            elif not ends:
                # A choice after whitespace: byte-level BPE writes a space with what
                # follows it (": " then '"' as ': ', ' "'), so it is left to the model.
                data = data.rstrip(b" \t\r\n")
            ways.append((data, float(p.weight), ends))
        common = os.path.commonprefix([data for data, _, _ in ways])
        nodes = self.spelling.tree(vocab, ways, eos, self.spellings)
        kids: dict[int, list[int]] = {}
        for i, node in enumerate(nodes[1:], 1):
            kids.setdefault(node.parent, []).append(i)
        # The forced tokens: the likeliest child while the model surely writes it.
        spine: list[int] = []
        at = 0
        while (
            len(spine) < self.max_forced
            and (k := kids.get(at))
            and nodes[k[0]].chance >= self.sure * nodes[at].chance
        ):
            at = k[0]
            spine.append(nodes[at].token)
        ends = nodes[at].off < 0
        tree = None if ends else _subtree(nodes, kids, at)
        return GrammarDraft(tuple(spine), tree, ends, common)

    def _build_canonical(self, vocab: Any, paths: list[Any]) -> GrammarDraft:
        """The draft in the tokenizer's own spelling (``spellings=0``)."""
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


def _subtree(nodes: list[_Node], kids: dict[int, list[int]], at: int) -> DraftTree | None:
    """The nodes below ``at`` of a :meth:`Spelling.tree` as a tree rooted there (root token
    unknown), their chances relative to its own; None if it has no children."""
    if at not in kids:
        return None
    tokens, parents, probs = [-1], [-1], [1.0]
    index = {at: 0}
    stack = [at]
    while stack:
        i = stack.pop()
        for k in kids.get(i, ()):
            index[k] = len(tokens)
            tokens.append(nodes[k].token)
            parents.append(index[i])
            probs.append(nodes[k].chance / nodes[at].chance)
            stack.append(k)
    return _ordered(tokens, parents, probs)


def _branch_tree(seqs: list[tuple[tuple[int, ...], float]], skip: int) -> DraftTree | None:
    """The paths' tokens after the first ``skip`` as one tree (shared prefixes once), each
    node's probability its paths' summed weight, in best-first order; None if empty."""
    children: dict[tuple[int, int], int] = {}  # (parent node, token) -> node
    tokens, parents, probs = [-1], [-1], [1.0]
    for toks, w in seqs:
        node = 0
        for t in toks[skip:]:
            nxt = children.get((node, t))
            if nxt is None:
                nxt = len(tokens)
                children[(node, t)] = nxt
                tokens.append(t)
                parents.append(node)
                probs.append(0.0)
            probs[nxt] += w
            node = nxt
    return None if len(tokens) == 1 else _ordered(tokens, parents, probs)


def _ordered(tokens: list[int], parents: list[int], probs: list[float]) -> DraftTree:
    """A tree from nodes in any order whose parents come first (node 0 the root), put in
    best-first order: a child's weight never exceeds its parent's, so (-weight, depth)
    keeps every parent before its children."""
    depths = [0] * len(tokens)
    for i in range(1, len(tokens)):
        depths[i] = depths[parents[i]] + 1
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
