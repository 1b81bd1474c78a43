"""The speculative generator: a batched, continuous serving loop. Each step reads as the
pipeline it is, for every running request at once::

    trees  = drafter.propose(requests, budget)                  # draft + build (TreeDrafter)
    # or:    logits = drafter.draft(requests, depth)            # draft: marginals [R, L, V]
    #        trees  = [shape.build(l, root) for l in logits]    # build (DDTree or chain)
    trees  = [t.pruned(budget.choose(trees).nodes) ...]        # adaptive budget (with a
                                                                # combined drafter: which tree)
    steps  = verifier.step_batch(trees, caches, matchers)   # mask, 1 forward, rule, walk, commit
    out   += step.tokens                                        # accepted tokens + bonus token

Requests join (:meth:`SpeculativeGenerator.submit`) and leave between steps; a paged cache
starts each from its longest cached prefix. Only committed tokens are streamed.

Threads: one thread owns the loop and calls :meth:`~SpeculativeGenerator.step` (the first
thread that does; any other gets a ``ConfigError``). :meth:`~SpeculativeGenerator.submit`
and :meth:`~SpeculativeGenerator.cancel` are safe from any thread: they queue commands that
the owner applies at the start of its next step, so nothing a step is using changes under
it.

Every request ends in exactly one :class:`RequestOutput` with ``finished=True``, whatever
ended it (a stop token, its length, a cancel, a refusal or a failure of its own), and the
generator forgets it once that output is handed over. A failure (its grammar allows no
token, its drafter raised, its prefill failed) ends that request alone with
``finish_reason="error"``; the rest of the batch goes on.

Cache invariant between steps: a request's cache holds every token of its context except the
last one (the root of its next tree, fed with it).
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import numpy as np
import torch

from .._arrays import check_int
from ..draft.base import hidden_capture
from ..draft.combined import CombinedDrafter
from ..draft.grammar import GrammarDraft, GrammarDrafts
from ..draft.suffix import SuffixDrafter
from ..errors import ConfigError, KVCacheError, SpecdecTypeError, VerifyError
from ..protocols import (
    Constraint,
    Drafter,
    DraftRequest,
    HiddenCapture,
    KVCache,
    RequestLifecycle,
    Target,
    TreeDrafter,
    TreeShape,
)
from ..tree import DDTreeShape, DraftTree, tree_shape
from ..verify import STAGES, DecodingRule, StepResult, Verifier
from .budget import AdaptiveBudget, CostModel
from .common import (
    FinishReason,
    GenerationResult,
    RequestOutput,
    check_fits,
    check_max_new_tokens,
    emit,
    new_matcher,
    prompt_ids,
    stop_set,
)
from .progress import ProgressBar

__all__ = ["KVUsage", "SpeculativeGenerator", "Strategy"]

Strategy = Literal["ddtree", "chain", "ar"]
StepCallback = Callable[[list[int], KVCache, StepResult], None]
_T = TypeVar("_T")

#: The most hidden-state rows a request keeps for its drafter while drafts are left out
#: (plain steps, or a combined drafter's suffix index alone). A block drafter's next draft
#: turns every kept row into context K/V (0.065 ms a row for SmolLM2's on two cores), so a
#: probe of a drafter that stopped paying costs its draft plus that: with 64 rows kept, a
#: probe cost more than a plain step and the block drafter's probes alone took 2-3% of a
#: question's time. Past this, its context starts again from the last rows (drafts may get
#: worse; output never changes).
HELD_ROWS = 16


@dataclass(frozen=True)
class KVUsage:
    """The paged KV pool's blocks: ``used`` by live sequences, ``cached`` (full blocks in
    the prefix cache, held or evictable), of ``total``. Evictable cached blocks are not
    ``used``: a new request may take them."""

    used: int
    cached: int
    total: int
    block_size: int


@dataclass(eq=False)
class _Request:
    """A waiting or running request: its context, cache, grammar state and result."""

    rid: int
    prompt: list[int]
    max_new: int
    stop: frozenset[int]
    result: GenerationResult
    t_submit: float
    cache: KVCache | None = None
    own_cache: bool = True  # created here: freed when the request leaves
    matcher: Constraint | None = None
    cache_salt: bytes | str | None = None
    on_step: StepCallback | None = None
    hidden: torch.Tensor | None = None  # the target's hidden states of the last commit
    # Those of the steps since the drafter last ran, oldest first: concatenated once, at
    # its next draft (growing one tensor per skipped step copied the whole run each step,
    # and the allocator churn slowed the next forward by a fifth on two cores).
    held: list[torch.Tensor] = field(default_factory=list)
    held_rows: int = 0  # rows in ``held``
    seed: int | None = None  # seeded sampling keyed by position (None: the shared generator)
    rule: DecodingRule | None = None  # its own decoding rule (None: the generator's)
    in_drafter: bool = False  # the drafter holds state for it (add_request was called)
    admitted: bool = False  # it has run (its prefix hit is recorded)

    @property
    def context(self) -> list[int]:
        return self.prompt + self.result.tokens


class SpeculativeGenerator:
    """Draft -> build tree -> verify (mask, forward, rule, walk, commit), repeated, for a
    batch of requests in one target forward per step.

    ``drafter``: a :class:`~specdec.protocols.TreeDrafter` (suffix, n-gram lookup: proposes
    whole trees) or a :class:`~specdec.protocols.Drafter` (per-depth logits, e.g. a block
    drafter); ``None`` = :class:`~specdec.draft.SuffixDrafter` (needs no model). A drafter
    with per-request state (:class:`~specdec.protocols.RequestLifecycle`) is told when each
    request joins and ends.
    ``strategy``: ``"ddtree"`` (best-first tree of ``budget`` drafted nodes; a TreeDrafter's
    own tree), ``"chain"`` (one path of ``max_depth`` tokens: the drafter's argmax path, or a
    scored tree's likeliest path), ``"ar"`` (no drafting: one token per step, the same code
    path), or any :class:`~specdec.protocols.TreeShape`.
    ``budget``: most drafted nodes per tree, or ``"auto"``: per step the size that maximises
    expected tokens/s under a cost model of this target on this machine (``cost_model``, else
    measured at the first step), up to ``max_budget``.
    ``cache``: ``"dense"`` (one contiguous cache per request) or ``"paged"`` (one block pool,
    ``kv_tokens`` tokens of ``block_size``, with prefix caching: a request starts from its
    longest cached prefix). A paged request is admitted when the pool holds its context and
    one step; when the running requests outgrow the pool, the latest admitted is preempted
    (its blocks freed, it waits at the head of the queue and resumes from its committed
    tokens, mostly from the prefix cache). A request that could not fit the whole pool alone
    is refused by :meth:`submit`.
    ``constraint``: a grammar (``vocab.regex(...)``) or matcher every request follows (each
    gets its own matcher; :meth:`submit` takes one per request too).
    ``grammar_drafts``: a constrained request's trees start with what its grammar forces
    (probability-1 nodes; the drafter's tree continues from their end) and its small
    choices are one more candidate continuation (:mod:`specdec.draft.grammar`); ``True``
    (default) with the default :class:`~specdec.draft.GrammarDrafts`, ``False`` off, or a
    configured one. The forced nodes count within ``budget`` (``max_budget``); under
    ``budget="auto"`` each is valued as one sure token, apart from the drafters' statistics.
    ``max_batch``: most requests verified together. ``pad_to_budget``: every tree padded to
    ``budget`` drafted nodes (fixed shapes for CUDA graphs).
    ``generator``: the torch RNG a sampling rule draws from; ``seed``: instead, seeded
    sampling keyed by position for every request that :meth:`submit` gives no seed of its
    own: the token at each position is drawn with a number fixed by (seed, position), so a
    seeded request samples the same text as :func:`autoregressive_generate` with that seed,
    whatever the drafter, budget or batch.
    """

    def __init__(
        self,
        target: Target,
        drafter: Drafter | TreeDrafter | None = None,
        *,
        strategy: Strategy | TreeShape = "ddtree",
        budget: int | Literal["auto"] = 16,
        max_depth: int = 8,
        rule: DecodingRule | None = None,
        cache: Literal["dense", "paged"] = "dense",
        constraint: Any = None,
        generator: torch.Generator | None = None,
        seed: int | None = None,
        pad_to_budget: bool = False,
        max_batch: int = 8,
        max_budget: int = 64,
        cost_model: CostModel | None = None,
        kv_tokens: int | None = None,
        block_size: int = 16,
        grammar_drafts: bool | GrammarDrafts = True,
    ) -> None:
        if not callable(target) or not hasattr(target, "new_cache"):
            raise SpecdecTypeError(f"target must follow specdec.protocols.Target, got {target!r}")
        self.target = target
        self.max_depth = check_int(max_depth, "max_depth", 1, ConfigError)
        self.max_batch = check_int(max_batch, "max_batch", 1, ConfigError)
        if strategy == "ar":
            drafter = None
        elif drafter is None:
            from ..draft import SuffixDrafter

            drafter = SuffixDrafter(max_depth=self.max_depth)
        self.strategy = strategy
        self.drafter = drafter
        self.tree_drafter = drafter if isinstance(drafter, TreeDrafter) else None
        if drafter is not None and self.tree_drafter is None and not isinstance(drafter, Drafter):
            raise SpecdecTypeError(
                "drafter must follow specdec.protocols.Drafter or TreeDrafter, got "
                f"{type(drafter).__name__}"
            )
        self._lifecycle = drafter if isinstance(drafter, RequestLifecycle) else None
        # A drafter that reads the target's hidden states (block drafter, Medusa heads) says
        # which (``hidden_layers``, ``hidden_final``); every forward of this generator keeps
        # them in its own capture (the model keeps nothing: it may serve other generators).
        self.reads_hidden = strategy != "ar" and hasattr(drafter, "hidden_layers")
        self._capture: HiddenCapture | None = None
        if self.reads_hidden:
            if not getattr(target, "captures_hidden", False):
                raise ConfigError(
                    f"{type(drafter).__name__} reads the target's hidden states; "
                    f"{type(target).__name__} keeps none (it needs captures_hidden)"
                )
            self._capture = hidden_capture(drafter)
            assert self._capture is not None
            target.check_capture(self._capture)  # type: ignore[attr-defined]
            check = getattr(drafter, "check_target", None)
            if callable(check):
                check(target)
        vocab = getattr(drafter, "vocab_size", None)
        if isinstance(vocab, int) and vocab != target.vocab_size:
            raise ConfigError(
                f"the drafter's vocabulary has {vocab} tokens, the target's {target.vocab_size}:"
                " they must be the same vocabulary"
            )
        if budget == "auto":
            self.max_budget = check_int(max_budget, "max_budget", 1, ConfigError)
            self.adaptive: AdaptiveBudget | None = None  # made at the first step
            self._cost_model = cost_model
        else:
            self.max_budget = check_int(budget, "budget", 1, ConfigError)
            self.adaptive = None
            self._cost_model = None
        self.auto = budget == "auto" and strategy != "ar"
        if strategy == "ar":
            self.shape: TreeShape | None = None
            self.budget = 0
        else:
            shape = tree_shape(strategy, budget=self.max_budget, depth=self.max_depth)
            if not isinstance(shape, TreeShape):
                raise SpecdecTypeError(f"strategy must be a name or a TreeShape, got {strategy!r}")
            self.shape = shape
            self.budget = (
                self.max_budget
                if self.tree_drafter is not None and strategy == "ddtree"
                else shape.max_drafted
            )
        if cache not in ("dense", "paged"):
            raise ConfigError(f"cache must be 'dense' or 'paged', got {cache!r}")
        self.cache_kind = cache
        self.block_size = check_int(block_size, "block_size", 1, ConfigError)
        self.kv_tokens = None if kv_tokens is None else check_int(kv_tokens, "kv_tokens", 1)
        self._pool: Any = None
        self.constraint = constraint
        # What a request's grammar forces goes first in its trees (strategy "ar" drafts
        # nothing, not even that).
        if isinstance(grammar_drafts, GrammarDrafts):
            self.grammar_drafts: GrammarDrafts | None = grammar_drafts
        elif grammar_drafts is True or grammar_drafts is False:
            self.grammar_drafts = GrammarDrafts() if grammar_drafts else None
        else:
            raise SpecdecTypeError(
                f"grammar_drafts must be a bool or a GrammarDrafts, got {grammar_drafts!r}"
            )
        if strategy == "ar":
            self.grammar_drafts = None
        self._gd_of: dict[int, _GrammarStep] = {}
        self.verifier = Verifier(target, rule, generator=generator)
        self.seed = None if seed is None else check_int(seed, "seed", None, ConfigError)
        self.pad_to_budget = bool(pad_to_budget)
        # Commands from any thread (submit, cancel), applied by the owner between steps.
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._incoming: deque[_Request] = deque()
        self._cancels: list[int] = []
        self._live: set[int] = set()  # submitted, final output not yet produced
        self._owner: int | None = None  # the thread that runs step()
        # The owner's state.
        self._waiting: deque[_Request] = deque()
        self._running: list[_Request] = []
        self._stash: list[RequestOutput] = []  # other requests' outputs seen by generate()
        self.last_trees: list[DraftTree] = []  # what the last step verified, batch order

    @property
    def rule(self) -> DecodingRule:
        return self.verifier.rule

    # -- one sequence: the pipeline's stages, callable on their own -----------------------------
    def draft(self, context: Sequence[int]) -> torch.Tensor:
        """The drafter's per-depth logits ``[max_depth, V]`` for the tokens after
        ``context``."""
        if self.drafter is None or self.tree_drafter is not None:
            raise ConfigError("only a Drafter (per-depth logits) drafts logits: use draft_tree")
        assert isinstance(self.drafter, Drafter)
        return self.drafter.draft([DraftRequest(context)], self.max_depth)[0]

    def propose(self, context: Sequence[int]) -> DraftTree:
        """A TreeDrafter's tree for the tokens after ``context``."""
        return self._pad(self._trees([list(context)], [None], [None], candidates=False)[0][0])

    def build(self, logits: torch.Tensor, root_token: int) -> DraftTree:
        """The tree from one request's draft logits (padded when ``pad_to_budget``)."""
        assert self.shape is not None
        return self._pad(self.shape.build(logits, root_token))

    def draft_tree(self, context: Sequence[int]) -> DraftTree:
        """Draft and build the tree for the tokens after ``context`` (root = its last token)."""
        if self.tree_drafter is not None or self.drafter is None:
            return self.propose(context)
        return self.build(self.draft(context), context[-1])

    def _pad(self, tree: DraftTree) -> DraftTree:
        if self.pad_to_budget and tree.num_nodes < self.budget + 1:
            return tree.padded(self.budget)
        return tree

    # -- commands: safe from any thread ----------------------------------------------------
    def submit(
        self,
        prompt: Sequence[int] | torch.Tensor,
        *,
        max_new_tokens: int,
        stop_tokens: Collection[int] | int | None = None,
        cache: KVCache | None = None,
        cache_salt: bytes | str | None = None,
        constraint: Any = None,
        on_step: StepCallback | None = None,
        seed: int | None = None,
        rule: DecodingRule | None = None,
    ) -> int:
        """Queue a request; returns its id. It joins the running batch at a later
        :meth:`step` with room (``cache``: run it in this cache, which may already hold a
        prefix of the prompt; ``cache_salt``: its prefix-cache and drafter-corpus
        namespace; ``constraint``: its grammar, else the generator's; ``seed``: its sampling
        seed, else the generator's ``seed``; ``rule``: its decoding rule, e.g. its own
        :class:`~specdec.verify.Sampling` settings, else the generator's; requests with
        different rules share each step's forward). Safe from any thread. A request that can
        never run (past the model's positions, or larger than the whole KV pool) is refused
        here, with nothing queued."""
        ids = prompt_ids(prompt)
        max_new = check_max_new_tokens(max_new_tokens)
        check_fits(self.target, ids, max_new)
        vocab = self.target.vocab_size
        stop = stop_set(stop_tokens, vocab_size=vocab)
        seed = self.seed if seed is None else check_int(seed, "seed", None, ConfigError)
        if rule is not None and not isinstance(rule, DecodingRule):
            raise SpecdecTypeError(f"rule must be a DecodingRule, got {type(rule).__name__}")
        if cache is not None:
            if not isinstance(cache, KVCache):
                raise SpecdecTypeError(f"cache must be a KVCache, got {type(cache).__name__}")
            if cache.committed_len > len(ids) - 1 or cache.pending:
                raise VerifyError(
                    f"the cache holds {cache.committed_len} tokens: a request's cache may hold "
                    f"at most the prompt minus its last token ({len(ids) - 1})"
                )
        elif self.cache_kind == "paged":
            blocks = self._blocks(len(ids) + max_new + self.budget + 1)
            if blocks > self._pool_blocks():
                raise KVCacheError(
                    f"the request needs {blocks} KV blocks of {self.block_size} tokens (prompt "
                    f"{len(ids)} + max_new_tokens {max_new} + one tree), the pool has "
                    f"{self._pool_blocks()}: raise kv_tokens"
                )
        matcher = new_matcher(constraint if constraint is not None else self.constraint)
        result = GenerationResult([], prompt_len=len(ids))
        result.timings = dict.fromkeys(("prefill", "draft", *STAGES), 0.0)
        with self._lock:
            rid = next(self._ids)
            result.request_id = rid
            req = _Request(
                rid,
                ids,
                max_new,
                stop,
                result,
                time.perf_counter(),
                cache=cache,
                own_cache=cache is None,
                matcher=matcher,
                cache_salt=cache_salt,
                on_step=on_step,
                seed=seed,
                rule=rule,
            )
            self._live.add(rid)
            self._incoming.append(req)
        return rid

    def cancel(self, request_id: int) -> bool:
        """Cancel a request, from any thread. True when it had not ended yet: it then ends
        at the start of the next :meth:`step`, whose outputs report it with
        ``finish_reason="cancelled"`` and what it generated so far (unless the step running
        meanwhile finishes it first: it then ends as that step says). False for an id that
        already ended or was never submitted: nothing to do."""
        rid = check_int(request_id, "request_id", None, ConfigError)
        with self._lock:
            if rid not in self._live:
                return False
            self._cancels.append(rid)
            return True

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        with self._lock:
            return len(self._waiting) + len(self._incoming)

    def max_new_tokens_for(self, prompt_len: int) -> int:
        """The most new tokens :meth:`submit` accepts after a prompt of ``prompt_len``
        tokens: the model's positions left, and for a paged cache what the whole pool holds
        besides the prompt and one tree (0: the prompt alone does not fit)."""
        n = check_int(prompt_len, "prompt_len", 1, ConfigError)
        room = self.target.max_positions - n
        if self.cache_kind == "paged":
            slots = (self._pool_blocks() - 1) * self.block_size
            room = min(room, slots - n - self.budget - 1)
        return max(room, 0)

    def kv_usage(self) -> KVUsage:
        """The paged pool's blocks now (safe from any thread; all zero before the first
        paged request, and for dense caches)."""
        pool = self._pool
        if pool is None:
            return KVUsage(0, 0, 0, self.block_size)
        m = pool.manager
        total = int(m.num_blocks)
        return KVUsage(total - m.num_free_blocks(), m.num_cached_blocks(), total, self.block_size)

    def has_unfinished(self) -> bool:
        """Whether any request has not been reported finished yet (safe from any thread)."""
        with self._lock:
            return bool(self._live) or bool(self._stash)

    # -- the loop: one owner thread ---------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Apply the queued commands, admit waiting requests, then one speculative step for
        every running request (one target forward). Returns what each request committed in
        it; every request that ended in it (finished, stopped, cancelled, failed) has one
        output with ``finished=True`` and its result, handed over once. Only the thread
        that first called it may call it."""
        self._claim()
        outputs, self._stash = self._stash, []
        self._apply_commands(outputs)
        self._admit(outputs)
        if not self._running:
            return outputs
        self._make_room()
        reqs = list(self._running)
        timings = dict.fromkeys(("draft", *STAGES), 0.0)
        t0 = time.perf_counter()
        # What each constrained request's grammar forces: its trees start with it.
        reqs = self._grammar_step(reqs, outputs)
        if not reqs:
            return outputs
        gds = self._gd_of
        # The adaptive budget runs the drafter, a combined drafter's suffix index alone, or
        # no draft, by what each has delivered lately.
        combined = isinstance(self.tree_drafter, CombinedDrafter) and self.strategy == "ddtree"
        arm = self._adaptive().arm(len(reqs), lite=combined) if self.auto else "full"
        model = arm == "full"  # the drafter runs whole (and reads the hidden states)
        drafting = arm != "plain"
        if drafting:
            reqs, cands = self._isolated(
                reqs,
                lambda rs: self._trees(
                    [r.context for r in rs],
                    [_draft_hidden(r) if model else None for r in rs],
                    rs,
                    model=model,
                ),
                outputs,
            )
            if not reqs:
                return outputs
        else:
            cands = _root_trees([[*r.context, *_forced(gds, r.rid)] for r in reqs])
        # A grammar's small choices: one more candidate continuation.
        cands = [
            [*ts, g.branches] if (g := gds.get(r.rid)) and g.branches is not None else ts
            for ts, r in zip(cands, reqs, strict=True)
        ]
        forced = [len(_forced(gds, r.rid)) for r in reqs]
        t1 = time.perf_counter()
        # No node deeper than the request still needs (accepted + bonus <= what is left),
        # the forced nodes within the budget.
        cands = [
            [t.pruned(self.max_budget - k, r.max_new - len(r.result.tokens) - 1 - k) for t in ts]
            for ts, r, k in zip(cands, reqs, forced, strict=True)
        ]
        # Whether a drafter's model tree is verified this step (None: no such choice).
        model_verified: bool | None = None
        if self.auto and drafting:
            choice = self._adaptive().choose_among(cands, forced=forced, rids=[r.rid for r in reqs])
            picks = list(choice.picks)
            conts = [ts[p].pruned(choice.nodes) for ts, p in zip(cands, picks, strict=True)]
            if isinstance(self.tree_drafter, CombinedDrafter):
                for p in picks:  # its candidates: (model tree, suffix tree, grammar's)
                    if p < 2:
                        self.tree_drafter.record(p == 1)
                if model:
                    model_verified = choice.nodes > 0 and 0 in picks
        else:
            picks = [_best(ts) for ts in cands]
            conts = [ts[p] for ts, p in zip(cands, picks, strict=True)]
        trees = [
            c.with_prefix(gds[r.rid].forced, r.context[-1]) if k else c
            for c, r, k in zip(conts, reqs, forced, strict=True)
        ]
        most = max(t.num_nodes for t in trees) - 1
        pad = self.budget if self.pad_to_budget else most
        trees = [t.padded(pad) if t.num_nodes < pad + 1 else t for t in trees]
        t2 = time.perf_counter()
        timings["draft"], timings["build"] = t1 - t0, t2 - t1
        tree_of = {r.rid: t for r, t in zip(reqs, trees, strict=True)}
        cand_of = {r.rid: c for r, c in zip(reqs, cands, strict=True)}
        cont_of = {r.rid: (c, p) for r, c, p in zip(reqs, conts, picks, strict=True)}
        if len(reqs) > 1 and hasattr(self.target, "forward_batch"):
            reqs, steps = self._isolated(
                reqs,
                lambda rs: self._verify_batch(rs, [tree_of[r.rid] for r in rs], model),
                outputs,
                one=lambda r: self._verify_one(r, tree_of[r.rid], model),
            )
        else:  # one forward per request: each stands alone
            reqs, steps = self._each(
                reqs, lambda r: self._verify_one(r, tree_of[r.rid], model), outputs
            )
            for s in steps[1:]:  # separate forwards: sum their stage times
                for k, v in s.timings.items():
                    steps[0].timings[k] += v
        if not reqs:
            return outputs
        trees = [tree_of[r.rid] for r in reqs]
        self.last_trees = trees
        timings.update({k: v for k, v in steps[0].timings.items() if k != "build"})
        # Per request: the continuation (its tree after the forced nodes) and what the
        # step accepted of it; None where the forced nodes were not all accepted.
        after: list[tuple[DraftTree, np.ndarray] | None] = []
        for r, s in zip(reqs, steps, strict=True):
            nf = len(_forced(gds, r.rid))
            acc = np.asarray(s.accepted, dtype=np.int64)
            took = int(np.count_nonzero(acc <= nf))  # the chain's nodes are 1..k
            cont, pick = cont_of[r.rid]
            if nf:
                r.result.grammar_tokens += took
                if self.grammar_drafts is not None:
                    self.grammar_drafts.observe(nf, took)
            if (g := gds.get(r.rid)) is not None and self.grammar_drafts is not None:
                vocab = r.matcher.grammar.vocab  # type: ignore[union-attr]
                self.grammar_drafts.learn(vocab, g.draft, s.tokens)
            if took < nf:
                after.append(None)
                continue
            rest = acc[acc > nf] - nf
            g = gds.get(r.rid)
            if g is not None and g.branches is not None and pick == len(cand_of[r.rid]) - 1:
                r.result.grammar_tokens += len(rest)
            after.append((cont, rest))
        if self.adaptive is not None:
            host = sum(timings.values()) - timings["forward"]
            fwd = timings["forward"]
            seen = [x for x in after if x is not None]
            seen_rids = [r.rid for r, x in zip(reqs, after, strict=True) if x is not None]
            self.adaptive.observe(
                [t for t, _ in seen],
                [a for _, a in seen],
                host,
                draft=timings["draft"],
                drafted=drafting,
                forward=fwd if fwd > 0.0 else None,  # a clock too coarse to time it: skip
                fed=sum(t.num_nodes for t in trees),
                learn=not (self.auto and drafting),  # the candidates, whole, below
                arm=arm if self.auto else None,
                committed=sum(len(x.tokens) for x in steps),
                rids=seen_rids,
                model_verified=model_verified,
            )
            if self.auto and drafting:
                # The rule's choices along the committed path decide the candidates' nodes,
                # verified or not (the continuations: after the forced nodes, when taken).
                for r, s, x in zip(reqs, steps, after, strict=True):
                    if x is not None:
                        nf = len(_forced(gds, r.rid))
                        self.adaptive.learn(cand_of[r.rid], s.tokens[nf:], r.rid)
        for req, tree, s in zip(reqs, trees, steps, strict=True):
            outputs.append(self._advance(req, tree, s, timings))
        return outputs

    def stream(
        self,
        prompts: Sequence[Sequence[int] | torch.Tensor],
        *,
        max_new_tokens: int,
        stop_tokens: Collection[int] | int | None = None,
    ) -> Iterator[RequestOutput]:
        """Submit ``prompts`` and yield every :class:`RequestOutput` until none is left
        (other requests submitted meanwhile run too)."""
        self._submit_all(prompts, max_new_tokens, stop_tokens=stop_tokens)
        while self.has_unfinished():
            yield from self.step()

    def generate(
        self,
        prompts: Any,
        *,
        max_new_tokens: int,
        stop_tokens: Collection[int] | int | None = None,
        eos_token_id: Collection[int] | int | None = None,
        constraint: Any = None,
        cache: KVCache | None = None,
        on_step: StepCallback | None = None,
        progress: bool | None = None,
        seed: int | None = None,
    ) -> Any:
        """Generate for one prompt (token ids: returns its :class:`GenerationResult`) or a
        batch of prompts (a list of them, or a 2-D tensor: returns a list, in order).
        ``stop_tokens`` (and ``eos_token_id``, one more stop token) end a request, included
        in its tokens; ``constraint``: every request's grammar or matcher, else the
        generator's; ``cache``: for one
        prompt, the cache to run in; ``progress``: a progress bar on stderr (default: when
        the batch asks for more than 1024 tokens); ``seed``: every request's sampling seed
        (see :meth:`submit`). Runs the loop on this thread until its requests end (other
        requests' outputs wait for the next :meth:`step`). When one of them failed, its
        error is raised once all have ended, with every result in ``error.results``."""
        single = _is_single_prompt(prompts)
        batch = [prompts] if single else list(prompts)
        if not single and cache is not None:
            raise ConfigError("cache= is for one prompt; a batch gets caches from the generator")
        stops = stop_set(stop_tokens, eos_token_id, self.target.vocab_size)
        rids = self._submit_all(
            batch,
            max_new_tokens,
            stop_tokens=stops,
            cache=cache,
            constraint=constraint,
            on_step=on_step,
            seed=seed,
        )
        total = max_new_tokens * len(rids)
        bar = ProgressBar(total, enabled=total > 1024 if progress is None else progress)
        mine = set(rids)
        done: dict[int, GenerationResult] = {}
        streamed = 0
        while len(done) < len(rids):
            others = []
            for o in self.step():
                if o.request_id not in mine:
                    others.append(o)
                    continue
                streamed += len(o.new_tokens)
                if o.finished:
                    assert o.result is not None
                    done[o.request_id] = o.result
            self._stash.extend(others)
            bar.update(streamed, len(self._running))
        bar.close(streamed)
        results = [done[rid] for rid in rids]
        failed = [r.error for r in results if r.error is not None]
        if failed:
            err = failed[0]
            err.results = results  # type: ignore[attr-defined]
            raise err
        return results[0] if single else results

    # -- internals ---------------------------------------------------------------------------
    def _claim(self) -> None:
        me = threading.get_ident()
        with self._lock:
            if self._owner is None:
                self._owner = me
            elif self._owner != me:
                raise ConfigError(
                    f"step() runs on one thread: thread {self._owner} owns this generator, "
                    f"thread {me} called it (submit() and cancel() are safe from any thread)"
                )

    def _apply_commands(self, outputs: list[RequestOutput]) -> None:
        """New requests join the queue (a zero-token one ends at once) and cancels end
        their requests, wherever they are."""
        with self._lock:
            incoming, self._incoming = list(self._incoming), deque()
            cancels, self._cancels = self._cancels, []
        for req in incoming:
            if req.max_new == 0:
                outputs.append(self._end(req, "length"))
            else:
                self._waiting.append(req)
        for rid in cancels:
            for queue in (self._waiting, self._running):
                found = next((r for r in queue if r.rid == rid), None)
                if found is not None:
                    queue.remove(found)
                    outputs.append(self._end(found, "cancelled"))
                    break

    def _end(
        self,
        req: _Request,
        reason: FinishReason,
        error: BaseException | None = None,
        new: Sequence[int] = (),
    ) -> RequestOutput:
        """Release what the request holds and make its final output."""
        res = req.result
        res.finish_reason = reason
        res.error = error
        res.seconds = time.perf_counter() - req.t_submit
        self._free(req)
        with self._lock:
            self._live.discard(req.rid)
        return RequestOutput(req.rid, list(new), True, res)

    def _free(self, req: _Request) -> None:
        """Its cache (when made here) and its drafter state."""
        cache = req.cache
        if cache is not None and cache.pending:
            cache.rollback()
        if req.own_cache and cache is not None and hasattr(cache, "free"):
            cache.free()
        if req.own_cache:
            req.cache = None
        req.hidden, req.held, req.held_rows = None, [], 0
        if self.adaptive is not None:
            self.adaptive.forget(req.rid)
        if req.in_drafter and self._lifecycle is not None:
            req.in_drafter = False
            done = req.result.finish_reason in ("stop", "length")
            self._lifecycle.remove_request(req.rid, req.result.tokens if done else None)

    def _grammar_step(self, reqs: list[_Request], outputs: list[RequestOutput]) -> list[_Request]:
        """Each constrained request's grammar draft for this step (``self._gd_of``): its
        forced tokens (within the budget and what the request still needs) and its
        grammar branches rooted at their end. A request whose grammar fails here (past a
        limit of its own) ends alone."""
        self._gd_of = {}
        drafts = self.grammar_drafts
        if drafts is None:
            return reqs

        def one(r: _Request) -> None:
            if r.matcher is None:
                return
            g = drafts.draft(r.matcher)
            if not g.forced and g.branches is None:
                return
            full = g.forced
            suffix = self._suffix_index()
            if full and suffix is not None and r.in_drafter:
                # The request's own text may have written these bytes before, its own way.
                written = suffix.propose([DraftRequest(r.context, None, r.rid)], 16)[0]
                vocab = r.matcher.grammar.vocab  # type: ignore[attr-defined]
                full = drafts.respell(vocab, full, written.best_path().tokens[1:].tolist())
            room = min(self.max_budget, r.max_new - len(r.result.tokens) - 1)
            forced = full[: max(min(room, drafts.chain_limit()), 0)]
            branches = g.branches if len(forced) == len(full) else None
            if branches is not None:
                branches = branches.with_root(forced[-1] if forced else r.context[-1])
            if forced or branches is not None:
                self._gd_of[r.rid] = _GrammarStep(tuple(forced), branches, g)
                drafts.forced_tokens += len(forced)

        kept, _ = self._each(reqs, one, outputs)
        return kept

    def _suffix_index(self) -> SuffixDrafter | None:
        """The drafter's suffix index (a suffix drafter's, or a combined drafter's)."""
        td = self.tree_drafter
        if isinstance(td, SuffixDrafter):
            return td
        if isinstance(td, CombinedDrafter):
            return td.suffix
        return None

    def _isolated(
        self,
        reqs: list[_Request],
        run_all: Callable[[list[_Request]], list[_T]],
        outputs: list[RequestOutput],
        one: Callable[[_Request], _T] | None = None,
    ) -> tuple[list[_Request], list[_T]]:
        """Run a batched stage (all or nothing); when it raises, run each request alone,
        so only the requests that fail alone end (with ``finish_reason="error"``)."""
        try:
            return reqs, run_all(reqs)
        except Exception as e:
            if len(reqs) == 1:
                self._running.remove(reqs[0])
                outputs.append(self._end(reqs[0], "error", e))
                return [], []
        return self._each(reqs, one or (lambda r: run_all([r])[0]), outputs)

    def _each(
        self, reqs: list[_Request], run: Callable[[_Request], _T], outputs: list[RequestOutput]
    ) -> tuple[list[_Request], list[_T]]:
        kept: list[_Request] = []
        values: list[_T] = []
        for r in reqs:
            try:
                values.append(run(r))
            except Exception as e:
                self._running.remove(r)
                outputs.append(self._end(r, "error", e))
                continue
            kept.append(r)
        return kept, values

    def _verify_batch(
        self, reqs: list[_Request], trees: list[DraftTree], drafting: bool
    ) -> list[StepResult]:
        steps = self.verifier.step_batch(
            trees,
            [r.cache for r in reqs],  # type: ignore[misc]
            [r.matcher for r in reqs],
            [r.seed for r in reqs],
            hidden=self._capture,
            rules=[r.rule for r in reqs],
        )
        if self._capture is not None:
            rows = self._capture.states
            for i, (r, s) in enumerate(zip(reqs, steps, strict=True)):
                new = None if rows is None else rows[i][torch.from_numpy(s.kept_nodes())]
                r.hidden = self._next_hidden(r, new, drafting)
        return steps

    def _verify_one(self, r: _Request, tree: DraftTree, drafting: bool) -> StepResult:
        assert r.cache is not None
        s = self.verifier.step(
            tree, r.cache, constraint=r.matcher, seed=r.seed, hidden=self._capture, rule=r.rule
        )
        if self._capture is not None:
            rows = self._capture.states
            new = None if rows is None else rows[torch.from_numpy(s.kept_nodes())]
            r.hidden = self._next_hidden(r, new, drafting)
        return s

    def _submit_all(self, prompts: Sequence[Any], max_new_tokens: int, **kw: Any) -> list[int]:
        """Submit every prompt or none: a bad one withdraws those queued before it."""
        rids: list[int] = []
        try:
            for p in prompts:
                rids.append(self.submit(p, max_new_tokens=max_new_tokens, **kw))
        except BaseException:
            with self._lock:
                gone = set(rids)
                self._incoming = deque(r for r in self._incoming if r.rid not in gone)
                self._live -= gone
            raise
        return rids

    @staticmethod
    def _next_hidden(req: _Request, new: torch.Tensor | None, drafted: bool) -> torch.Tensor | None:
        """The hidden states the request's next draft reads: this step's, after those of
        the steps since its last draft, the last :data:`HELD_ROWS` of them (a drafter that
        keeps context K/V needs each committed position once; one that finds a gap before
        them starts its context again from them)."""
        if drafted or new is None or req.hidden is None:
            req.held, req.held_rows = [], 0
            return new
        req.held.append(req.hidden)
        req.held_rows += req.hidden.shape[0]
        while req.held_rows - req.held[0].shape[0] >= HELD_ROWS:
            req.held_rows -= req.held.pop(0).shape[0]
        if req.held_rows > HELD_ROWS:
            cut = req.held_rows - HELD_ROWS
            req.held[0], req.held_rows = req.held[0][cut:], HELD_ROWS
        return new

    def _trees(
        self,
        contexts: list[list[int]],
        hidden: Sequence[torch.Tensor | None],
        reqs: Sequence[_Request | None],
        *,
        candidates: bool | None = None,
        model: bool = True,
    ) -> list[list[DraftTree]]:
        """Per context its unpadded candidate trees, by the strategy (``hidden``: each
        request's hidden states of its last commit, for drafters that read them; ``reqs``:
        the requests, whose ids a drafter with per-request state keys by, None for a
        one-off draft): one,
        or with ``candidates`` (default: under the adaptive budget) a combined drafter's
        two, the model's and the suffix index's, for the budget to choose between
        (``model=False``: the model's drafts nothing, a root alone)."""
        if candidates is None:
            candidates = self.auto
        if self.drafter is None or self.shape is None:
            return _root_trees(contexts)
        # Request ids only for a drafter that was told of the requests (RequestLifecycle);
        # any other drafter serves each context as it comes.
        rids = [r.rid if r is not None and r.in_drafter else None for r in reqs]
        # A grammar's forced tokens: the drafter drafts what follows them.
        prefixes = [
            self._gd_of[r.rid].forced if r is not None and r.rid in self._gd_of else ()
            for r in reqs
        ]
        requests = [
            DraftRequest(c, h, rid, p)
            for c, h, rid, p in zip(contexts, hidden, rids, prefixes, strict=True)
        ]
        # A best-first tree of B drafted nodes is at most B deep: deeper marginals (their LM
        # head rows above all) would go unread; the adaptive budget cuts deeper still.
        depth, size, shape = self.max_depth, self.max_budget, self.shape
        # The requests' own trust regions (None: a one-off draft, the generator's).
        known = [r.rid for r in reqs if r is not None]
        named = known if len(known) == len(reqs) else None
        if self.auto:
            # No tree bigger than the budget can pick this step (the same first nodes).
            size = self._adaptive().size_bound(named)
            if isinstance(shape, DDTreeShape):
                shape = DDTreeShape(size, shape.min_prob)
        if isinstance(shape, DDTreeShape):
            depth = min(depth, shape.budget)
        if self.auto:
            depth = self._adaptive().draft_depth(depth, named)
        if self.tree_drafter is not None:
            td = self.tree_drafter
            if any(prefixes) and not getattr(td, "accepts_prefix", False):
                # Its trees would start at the context, not after the forced tokens: only
                # the requests without a prefix get them.
                return self._trees_without_prefix(contexts, hidden, reqs, prefixes, candidates)
            if isinstance(td, CombinedDrafter) and candidates and self.strategy == "ddtree":
                pairs = td.candidates(requests, size, max_depth=depth, model=model)
                return [list(p) for p in pairs]
            if isinstance(td, CombinedDrafter):
                trees = td.propose(requests, size, max_depth=depth)
            else:
                trees = td.propose(requests, size)
            if self.strategy == "chain":
                trees = [t.best_path().pruned(self.max_depth) for t in trees]
            return [[t] for t in trees]
        assert isinstance(self.drafter, Drafter)
        # A prefix takes a per-depth drafter's first depths: each tree starts after it.
        skip = [len(p) for p in prefixes]
        drafted = min(self.max_depth, depth + max(skip)) if any(skip) else depth
        logits = self.drafter.draft(requests, drafted)
        want = (len(contexts), drafted, self.target.vocab_size)
        if not isinstance(logits, torch.Tensor) or tuple(logits.shape) != want:
            from ..errors import DraftError

            got = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits)
            raise DraftError(f"the drafter returned {got}, expected [R, depth, V] = {list(want)}")
        out = []
        for lg, c, p in zip(logits, contexts, prefixes, strict=True):
            root = p[-1] if p else c[-1]
            rows = lg[len(p) : len(p) + depth]
            out.append(
                [shape.build(rows, root) if len(rows) else DraftTree.root_only(root, scored=True)]
            )
        return out

    def _trees_without_prefix(
        self,
        contexts: list[list[int]],
        hidden: Sequence[torch.Tensor | None],
        reqs: Sequence[_Request | None],
        prefixes: list[tuple[int, ...]],
        candidates: bool | None,
    ) -> list[list[DraftTree]]:
        """:meth:`_trees` for a drafter that ignores prefixes: the requests without one get
        its trees, those with one the root alone (after their forced tokens)."""
        plain = [i for i, p in enumerate(prefixes) if not p]
        out = [[DraftTree.root_only(p[-1], scored=True)] if p else [] for p in prefixes]
        if plain:
            saved, self._gd_of = self._gd_of, {}
            try:
                got = self._trees(
                    [contexts[i] for i in plain],
                    [hidden[i] for i in plain],
                    [reqs[i] for i in plain],
                    candidates=candidates,
                )
            finally:
                self._gd_of = saved
            for i, ts in zip(plain, got, strict=True):
                out[i] = ts
        return out

    def _adaptive(self) -> AdaptiveBudget:
        if self.adaptive is None:
            cost = self._cost_model or CostModel.calibrate(
                self.target, sizes=CostModel.ladder(self.max_budget + 1)
            )
            self.adaptive = AdaptiveBudget(cost, self.max_budget)
        return self.adaptive

    # -- the paged pool: admission and preemption --------------------------------------------
    @staticmethod
    def default_kv_tokens(max_batch: int, max_positions: int) -> int:
        """The paged pool's size without ``kv_tokens``: room for ``max_batch`` requests of
        1,024 tokens each (of ``max_positions`` at most)."""
        return max_batch * min(max_positions, 1024)

    def _pool_blocks(self) -> int:
        tokens = self.kv_tokens or self.default_kv_tokens(self.max_batch, self.target.max_positions)
        return -(-tokens // self.block_size)

    def _blocks(self, tokens: int) -> int:
        """Blocks a sequence of ``tokens`` may hold mid-step (+1: a copy-on-write)."""
        return -(-tokens // self.block_size) + 1

    def _pool_for(self) -> Any:
        if self._pool is None:
            from ..cache.paged import PagedKVPool

            t = self.target
            c = t.new_cache(1)  # the layout of this target's K/V
            self._pool = PagedKVPool(
                c.num_layers,
                c.num_kv_heads,
                c.head_dim,
                self._pool_blocks(),
                self.block_size,
                prefix_caching=True,
                dtype=getattr(t, "dtype", torch.float32),
                device=t.device,
            )
        return self._pool

    def _pooled(self, req: _Request) -> bool:
        """Whether the request's cache is a sequence of this generator's pool."""
        return self.cache_kind == "paged" and req.own_cache

    def _growth(self, req: _Request) -> int:
        """Blocks the request's next step may add (its context and a whole tree)."""
        assert req.cache is not None
        held = len(req.cache.block_table())  # type: ignore[attr-defined]
        return max(0, self._blocks(req.cache.committed_len + self.budget + 1) - held)

    def _admit(self, outputs: list[RequestOutput]) -> None:
        """Move waiting requests into the batch while there is room, and prefill them. A
        paged request waits (first come, first served) until the pool holds its context and
        one step besides the running requests' next step."""
        while self._waiting and len(self._running) < self.max_batch:
            req = self._waiting[0]
            if req.cache is None and self.cache_kind == "dense":
                req.cache = self.target.new_cache(len(req.prompt) + req.max_new + self.budget + 1)
            elif req.cache is None:
                pool = self._pool_for()
                ctx = req.context
                room = pool.manager.num_free_blocks() - sum(
                    self._growth(r) for r in self._running if self._pooled(r)
                )
                if self._blocks(len(ctx) + self.budget + 1) > room:
                    break  # waits for running requests to finish or for their blocks
                req.cache = pool.sequence(ctx, cache_salt=req.cache_salt)
            self._waiting.popleft()
            self._running.append(req)
            try:
                self._start(req)
            except Exception as e:
                self._running.remove(req)
                outputs.append(self._end(req, "error", e))

    def _start(self, req: _Request) -> None:
        """The drafter learns of the request; the cache gets its context minus the root."""
        cache = req.cache
        assert cache is not None
        ctx = req.context
        if self._lifecycle is not None:
            self._lifecycle.add_request(req.rid, ctx, cache_salt=req.cache_salt)
            req.in_drafter = True
        t0 = time.perf_counter()
        hit = cache.committed_len
        if not req.admitted:
            req.result.prefix_hit = hit
            req.admitted = True
        req.held, req.held_rows = [], 0
        if len(ctx) - 1 > hit:
            self.verifier.prefill(ctx[hit:-1], cache, hidden=self._capture)
            req.hidden = None if self._capture is None else self._capture.states
        elif self._capture is not None:  # nothing fed: no hidden states yet
            width = self._capture.width(int(self.target.config.hidden_size))  # type: ignore[attr-defined]
            req.hidden = torch.zeros(0, width, device=self.target.device)
        req.result.timings["prefill"] += time.perf_counter() - t0

    def _make_room(self) -> None:
        """Preempt the latest admitted requests until the pool holds every running
        request's next step. A preempted request frees its blocks (full ones stay in the
        prefix cache) and waits at the head of the queue; it resumes from its context."""
        if self._pool is None:
            return
        pooled = [r for r in self._running if self._pooled(r)]
        need = sum(self._growth(r) for r in pooled)
        while len(pooled) > 1 and need > self._pool.manager.num_free_blocks():
            victim = pooled.pop()
            self._running.remove(victim)
            self._free(victim)
            victim.result.preemptions += 1
            self._waiting.appendleft(victim)
            need = sum(self._growth(r) for r in pooled)

    def _advance(
        self, req: _Request, tree: DraftTree, s: StepResult, timings: dict[str, float]
    ) -> RequestOutput:
        res = req.result
        res.steps += 1
        res.accepted.append(s.num_accepted)
        res.tree_sizes.append(tree.num_drafted)
        for k, v in timings.items():
            res.timings[k] = res.timings.get(k, 0.0) + v
        before = len(res.tokens)
        done = emit(res.tokens, s.tokens, req.max_new, req.stop)
        new = res.tokens[before:]
        if new and res.first_token_seconds is None:
            res.first_token_seconds = time.perf_counter() - req.t_submit
        try:
            if req.matcher is not None:
                for i, t in enumerate(new):
                    if not req.matcher.accept_token(t):
                        raise VerifyError(f"the grammar refused committed token {t}")
                    if req.matcher.is_terminated():
                        # The grammar ended the request (a terminated matcher still allows
                        # its end token, so the step may have accepted more of them).
                        del res.tokens[before + i + 1 :]
                        new = new[: i + 1]
                        done = True
                        break
            if req.on_step is not None:
                assert req.cache is not None
                req.on_step(req.context, req.cache, s)
        except Exception as e:
            self._running.remove(req)
            return self._end(req, "error", e, new)
        if done:
            self._running.remove(req)
            stopped = (new and new[-1] in req.stop) or (
                req.matcher is not None and req.matcher.is_terminated()
            )
            return self._end(req, "stop" if stopped else "length", None, new)
        return RequestOutput(req.rid, new)


def _is_single_prompt(prompts: Any) -> bool:
    """A 1-D tensor or a flat sequence of ints is one prompt; a 2-D tensor or a sequence of
    sequences is a batch."""
    if isinstance(prompts, torch.Tensor):
        return prompts.dim() != 2
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
        return True  # prompt_ids raises a clear error
    return len(prompts) == 0 or not all(
        isinstance(p, (Sequence, torch.Tensor)) and not isinstance(p, (str, bytes)) for p in prompts
    )


def _draft_hidden(req: _Request) -> torch.Tensor | None:
    """The hidden states the request's draft reads: those of the steps since its last
    draft (up to :data:`HELD_ROWS` before this one's), in order."""
    if req.held and req.hidden is not None:
        req.hidden, req.held, req.held_rows = torch.cat((*req.held, req.hidden)), [], 0
    return req.hidden


def _root_trees(contexts: list[list[int]]) -> list[list[DraftTree]]:
    """Per context one tree of its root alone (a plain step: nothing drafted)."""
    return [[DraftTree.root_only(c[-1])] for c in contexts]


def _forced(gds: dict[int, _GrammarStep], rid: int) -> tuple[int, ...]:
    """Request ``rid``'s forced tokens this step (none without a grammar draft)."""
    g = gds.get(rid)
    return () if g is None else g.forced


def _best(trees: Sequence[DraftTree]) -> int:
    """The candidate its drafter expects to accept most (the first on ties; a tree without
    probabilities, as its drafter's only word, counts as expecting half its nodes)."""
    if len(trees) == 1:
        return 0

    def value(t: DraftTree) -> float:
        e = t.expected_acceptance if t.num_drafted else 0.0
        return 0.5 * t.num_drafted if math.isnan(e) else e

    vals = [value(t) for t in trees]
    return vals.index(max(vals))


@dataclass(frozen=True)
class _GrammarStep:
    """A request's grammar draft for one step: ``forced`` tokens (its trees start with
    them) and its grammar ``branches`` rooted at their end (a candidate continuation)."""

    forced: tuple[int, ...]
    branches: DraftTree | None
    draft: GrammarDraft  # what they came from (the model's spelling is learnt on it)
