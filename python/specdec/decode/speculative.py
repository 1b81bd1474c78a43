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

Cache invariant between steps: a request's cache holds every token of its context except the
last one (the root of its next tree, fed with it).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from .._arrays import check_int
from ..draft.combined import CombinedDrafter
from ..errors import ConfigError, KVCacheError, SpecdecTypeError, VerifyError
from ..protocols import Constraint, Drafter, DraftRequest, KVCache, Target, TreeDrafter, TreeShape
from ..tree import DDTreeShape, DraftTree, tree_shape
from ..verify import STAGES, DecodingRule, StepResult, Verifier
from .budget import AdaptiveBudget, CostModel
from .common import (
    GenerationResult,
    RequestOutput,
    check_max_new_tokens,
    emit,
    prompt_ids,
    stop_set,
)
from .progress import ProgressBar

__all__ = ["SpeculativeGenerator", "Strategy"]

Strategy = Literal["ddtree", "chain", "ar"]
StepCallback = Callable[[list[int], KVCache, StepResult], None]


@dataclass
class _Request:
    """A running or waiting request: its context, cache, grammar state and result."""

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
    blocks: int = 0  # paged blocks set aside for it at admission
    hidden: torch.Tensor | None = None  # the target's hidden states of the last commit
    seed: int | None = None  # seeded sampling keyed by position (None: the shared generator)

    @property
    def context(self) -> list[int]:
        return self.prompt + self.result.tokens


class SpeculativeGenerator:
    """Draft -> build tree -> verify (mask, forward, rule, walk, commit), repeated, for a
    batch of requests in one target forward per step.

    ``drafter``: a :class:`~specdec.protocols.TreeDrafter` (suffix, n-gram lookup: proposes
    whole trees) or a :class:`~specdec.protocols.Drafter` (per-depth logits, e.g. a block
    drafter); ``None`` = :class:`~specdec.draft.SuffixDrafter` (needs no model).
    ``strategy``: ``"ddtree"`` (best-first tree of ``budget`` drafted nodes; a TreeDrafter's
    own tree), ``"chain"`` (one path of ``max_depth`` tokens: the drafter's argmax path, or a
    scored tree's likeliest path), ``"ar"`` (no drafting: one token per step, the same code
    path), or any :class:`~specdec.protocols.TreeShape`.
    ``budget``: most drafted nodes per tree, or ``"auto"``: per step the size that maximises
    expected tokens/s under a cost model of this target on this machine (``cost_model``, else
    measured at the first step), up to ``max_budget``.
    ``cache``: ``"dense"`` (one contiguous cache per request) or ``"paged"`` (one block pool,
    ``kv_tokens`` tokens of ``block_size``, with prefix caching: a request starts from its
    longest cached prefix); requests wait until the pool can hold their whole generation.
    ``constraint``: a grammar (``vocab.regex(...)``) or matcher every request follows (each
    gets its own matcher; :meth:`submit` takes one per request too).
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
        # A drafter that reads the target's hidden states (block drafter, Medusa heads) says
        # which (``hidden_layers``, ``hidden_final``); the target keeps them from each forward.
        self.reads_hidden = strategy != "ar" and hasattr(drafter, "hidden_layers")
        if self.reads_hidden:
            capture = getattr(target, "capture_hidden", None)
            if capture is None:
                raise ConfigError(
                    f"{type(drafter).__name__} reads the target's hidden states; "
                    f"{type(target).__name__} exposes none (it needs capture_hidden)"
                )
            check = getattr(drafter, "check_target", None)
            if callable(check):
                check(target)
        self._capture = (
            tuple(getattr(drafter, "hidden_layers", ())) if self.reads_hidden else (),
            bool(getattr(drafter, "hidden_final", False)) if self.reads_hidden else False,
        )
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
        self.verifier = Verifier(target, rule, generator=generator)
        self.seed = None if seed is None else check_int(seed, "seed", None, ConfigError)
        self.pad_to_budget = bool(pad_to_budget)
        self._ids = itertools.count()
        self._waiting: list[_Request] = []
        self._running: list[_Request] = []
        self._finished: dict[int, GenerationResult] = {}
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
        return self._pad(self._trees([list(context)], [None], candidates=False)[0][0])

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

    # -- serving loop ------------------------------------------------------------------------
    def submit(
        self,
        prompt: Sequence[int] | torch.Tensor,
        max_new_tokens: int,
        *,
        stop_tokens: Collection[int] | int | None = None,
        cache: KVCache | None = None,
        cache_salt: bytes | str | None = None,
        constraint: Any = None,
        on_step: StepCallback | None = None,
        seed: int | None = None,
    ) -> int:
        """Queue a request; returns its id. It joins the running batch at the next
        :meth:`step` with room (``cache``: run it in this cache, which may already hold a
        prefix of the prompt; ``cache_salt``: its prefix-cache namespace in a paged pool;
        ``constraint``: its grammar, else the generator's; ``seed``: its sampling seed, else
        the generator's ``seed``)."""
        ids = prompt_ids(prompt)
        max_new = check_max_new_tokens(max_new_tokens)
        if len(ids) + max_new > self.target.max_positions:
            raise VerifyError(
                f"the prompt ({len(ids)} tokens) and max_new_tokens ({max_new}) do not fit the "
                f"model's maximum of {self.target.max_positions} positions"
            )
        vocab = self.target.vocab_size
        if min(ids) < 0 or max(ids) >= vocab:
            raise VerifyError(
                f"prompt token ids must be in [0, {vocab}), got {min(ids)}..{max(ids)}"
            )
        stop = stop_set(stop_tokens, vocab_size=vocab)
        seed = self.seed if seed is None else check_int(seed, "seed", None, ConfigError)
        if cache is not None:
            if not isinstance(cache, KVCache):
                raise SpecdecTypeError(f"cache must be a KVCache, got {type(cache).__name__}")
            if cache.committed_len > len(ids) - 1 or cache.pending:
                raise VerifyError(
                    f"the cache holds {cache.committed_len} tokens: a request's cache may hold "
                    f"at most the prompt minus its last token ({len(ids) - 1})"
                )
        rid = next(self._ids)
        req = _Request(
            rid,
            ids,
            max_new,
            stop,
            GenerationResult([], request_id=rid, prompt_len=len(ids)),
            time.perf_counter(),
            cache=cache,
            own_cache=cache is None,
            matcher=self._matcher(constraint if constraint is not None else self.constraint),
            cache_salt=cache_salt,
            on_step=on_step,
            seed=seed,
        )
        req.result.timings = dict.fromkeys(("prefill", "draft", *STAGES), 0.0)
        if max_new == 0:
            req.result.finish_reason = "length"
            self._finished[rid] = req.result
        else:
            self._waiting.append(req)
        return rid

    def cancel(self, request_id: int) -> GenerationResult:
        """Stop a request (waiting or running); returns what it generated so far."""
        for queue in (self._waiting, self._running):
            for req in queue:
                if req.rid == request_id:
                    queue.remove(req)
                    self._release(req, "cancelled")
                    return self._finished.pop(request_id)
        raise ConfigError(f"no waiting or running request with id {request_id}")

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    def has_unfinished(self) -> bool:
        return bool(self._waiting or self._running)

    def step(self) -> list[RequestOutput]:
        """Admit waiting requests, then one speculative step for every running request (one
        target forward). Returns what each request committed in it; a finished request's
        output carries its result."""
        self._sync_capture()
        outputs = self._admit()
        if not self._running:
            return outputs
        reqs = list(self._running)
        timings = dict.fromkeys(("draft", *STAGES), 0.0)
        t0 = time.perf_counter()
        contexts = [r.context for r in reqs]
        # The adaptive budget skips the drafter while its trees have not been paying.
        drafting = not self.auto or self._adaptive().draft_now(len(reqs))
        if drafting:
            cands = self._trees(contexts, [r.hidden for r in reqs])
        else:
            self._adaptive().skip()
            cands = _root_trees(contexts)
        t1 = time.perf_counter()
        # No node deeper than the request still needs (accepted + bonus <= what is left).
        cands = [
            [t.pruned(self.max_budget, r.max_new - len(r.result.tokens) - 1) for t in ts]
            for ts, r in zip(cands, reqs, strict=True)
        ]
        if self.auto and drafting:
            choice = self._adaptive().choose_among(cands)
            trees = [ts[p].pruned(choice.nodes) for ts, p in zip(cands, choice.picks, strict=True)]
            if isinstance(self.tree_drafter, CombinedDrafter):
                for p in choice.picks:  # its candidates are (model tree, suffix tree)
                    self.tree_drafter.record(p == 1)
        else:
            trees = [ts[0] for ts in cands]
        most = max(t.num_nodes for t in trees) - 1
        pad = self.budget if self.pad_to_budget else most
        trees = [t.padded(pad) if t.num_nodes < pad + 1 else t for t in trees]
        self.last_trees = trees
        t2 = time.perf_counter()
        timings["draft"], timings["build"] = t1 - t0, t2 - t1
        caches = [r.cache for r in reqs]
        matchers = [r.matcher for r in reqs]
        if len(reqs) == 1 or not hasattr(self.target, "forward_batch"):
            steps = []
            for r, t, c, m in zip(reqs, trees, caches, matchers, strict=True):
                steps.append(self.verifier.step(t, c, constraint=m, seed=r.seed))  # type: ignore[arg-type]
                r.hidden = self._next_hidden(r, self._hidden_rows(steps[-1].kept_nodes()), drafting)
            for s in steps[1:]:  # separate forwards: sum their stage times
                for k, v in s.timings.items():
                    steps[0].timings[k] += v
        else:
            seeds = [r.seed for r in reqs]
            steps = self.verifier.step_batch(trees, caches, matchers, seeds)  # type: ignore[arg-type]
            if self.reads_hidden:
                rows = self._hidden_rows(None)
                for i, (r, s) in enumerate(zip(reqs, steps, strict=True)):
                    new = None if rows is None else rows[i][torch.from_numpy(s.kept_nodes())]
                    r.hidden = self._next_hidden(r, new, drafting)
        timings.update({k: v for k, v in steps[0].timings.items() if k != "build"})
        if self.adaptive is not None:
            host = sum(timings.values()) - timings["forward"]
            accepted = [s.accepted for s in steps]
            fwd = timings["forward"]
            self.adaptive.observe(
                trees,
                accepted,
                host,
                draft=timings["draft"],
                drafted=drafting,
                forward=fwd if fwd > 0.0 else None,  # a clock too coarse to time it: skip
                learn=not (self.auto and drafting),  # the candidates, whole, below
            )
            if self.auto and drafting:
                # The rule's choices along the committed path decide the candidates' nodes,
                # verified or not.
                for ts, s in zip(cands, steps, strict=True):
                    self.adaptive.learn(ts, s.tokens)
        for req, tree, s in zip(reqs, trees, steps, strict=True):
            outputs.append(self._advance(req, tree, s, timings))
        return outputs

    def stream(
        self,
        prompts: Sequence[Sequence[int] | torch.Tensor],
        max_new_tokens: int,
        *,
        stop_tokens: Collection[int] | int | None = None,
    ) -> Iterator[RequestOutput]:
        """Submit ``prompts`` and yield every :class:`RequestOutput` until all are done
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
        generator's; ``cache``: for one prompt, the cache to run in; ``progress``: a progress
        bar on stderr (default: when the batch asks for more than 1024 tokens); ``seed``:
        every request's sampling seed (see :meth:`submit`)."""
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
        done = 0
        while any(rid not in self._finished for rid in rids):
            for o in self.step():
                done += len(o.new_tokens)
            bar.update(done, len(self._running))
        bar.close(done)
        results = [self._finished.pop(rid) for rid in rids]
        return results[0] if single else results

    # -- internals ---------------------------------------------------------------------------
    def _submit_all(self, prompts: Sequence[Any], max_new_tokens: int, **kw: Any) -> list[int]:
        """Submit every prompt or none: a bad one withdraws those queued before it."""
        rids: list[int] = []
        try:
            for p in prompts:
                rids.append(self.submit(p, max_new_tokens, **kw))
        except BaseException:
            for rid in rids:
                if rid in self._finished:
                    del self._finished[rid]
                else:
                    self.cancel(rid)
            raise
        return rids

    def _matcher(self, constraint: Any) -> Constraint | None:
        if constraint is None:
            return None
        if isinstance(constraint, Constraint):
            return constraint.fork()
        make = getattr(constraint, "matcher", None)
        if callable(make):
            m = make()
            if isinstance(m, Constraint):
                return m
        raise SpecdecTypeError(
            "constraint must be a grammar (with .matcher()) or a matcher, got "
            f"{type(constraint).__name__}"
        )

    def _sync_capture(self) -> None:
        """The target keeps the hidden states this generator's drafter reads, and none
        otherwise (another generator over the same target may have changed the setting)."""
        capture = getattr(self.target, "capture_hidden", None)
        layers, final = self._capture
        have = (
            tuple(getattr(self.target, "hidden_layers", ())),
            bool(getattr(self.target, "hidden_final", False)),
        )
        if capture is not None and have != self._capture:
            capture(layers, final=final)

    @staticmethod
    def _next_hidden(req: _Request, new: torch.Tensor | None, drafted: bool) -> torch.Tensor | None:
        """The hidden states the request's next draft reads: this step's, after those of
        the steps since its last draft (a drafter that keeps context K/V needs every
        committed position once)."""
        if drafted or new is None or req.hidden is None:
            return new
        return torch.cat((req.hidden, new))

    def _hidden_rows(self, rows: Any) -> torch.Tensor | None:
        """The target's hidden states of its last forward (``rows`` of them, or all), when
        the drafter reads them."""
        if not self.reads_hidden:
            return None
        hs: torch.Tensor | None = getattr(self.target, "last_hidden_states", None)
        if hs is None or rows is None:
            return hs
        return hs[torch.as_tensor(rows, device=hs.device)]

    def _trees(
        self,
        contexts: list[list[int]],
        hidden: Sequence[torch.Tensor | None],
        *,
        candidates: bool | None = None,
    ) -> list[list[DraftTree]]:
        """Per context its unpadded candidate trees, by the strategy (``hidden``: each
        request's hidden states of its last commit, for drafters that read them): one,
        or with ``candidates`` (default: under the adaptive budget) a combined drafter's
        two, the model's and the suffix index's, for the budget to choose between."""
        if candidates is None:
            candidates = self.auto
        if self.drafter is None or self.shape is None:
            return _root_trees(contexts)
        requests = [DraftRequest(c, h) for c, h in zip(contexts, hidden, strict=True)]
        # A best-first tree of B drafted nodes is at most B deep: deeper marginals (their LM
        # head rows above all) would go unread; the adaptive budget cuts deeper still.
        depth, size, shape = self.max_depth, self.max_budget, self.shape
        if self.auto:
            # No tree bigger than the budget can pick this step (the same first nodes).
            size = self._adaptive().size_bound()
            if isinstance(shape, DDTreeShape):
                shape = DDTreeShape(size, shape.min_prob)
        if isinstance(shape, DDTreeShape):
            depth = min(depth, shape.budget)
        if self.auto:
            depth = self._adaptive().draft_depth(depth)
        if self.tree_drafter is not None:
            td = self.tree_drafter
            if isinstance(td, CombinedDrafter) and candidates and self.strategy == "ddtree":
                pairs = td.candidates(requests, size, max_depth=depth)
                return [list(p) for p in pairs]
            if isinstance(td, CombinedDrafter):
                trees = td.propose(requests, size, max_depth=depth)
            else:
                trees = td.propose(requests, size)
            if self.strategy == "chain":
                trees = [t.best_path().pruned(self.max_depth) for t in trees]
            return [[t] for t in trees]
        assert isinstance(self.drafter, Drafter)
        logits = self.drafter.draft(requests, depth)
        want = (len(contexts), depth, self.target.vocab_size)
        if not isinstance(logits, torch.Tensor) or tuple(logits.shape) != want:
            from ..errors import DraftError

            got = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits)
            raise DraftError(f"the drafter returned {got}, expected [R, depth, V] = {list(want)}")
        return [[shape.build(lg, c[-1])] for lg, c in zip(logits, contexts, strict=True)]

    def _adaptive(self) -> AdaptiveBudget:
        if self.adaptive is None:
            cost = self._cost_model or CostModel.calibrate(
                self.target, sizes=CostModel.ladder(self.max_budget + 1)
            )
            self.adaptive = AdaptiveBudget(cost, self.max_budget)
        return self.adaptive

    def _pool_for(self) -> Any:
        if self._pool is None:
            from ..cache.paged import PagedKVPool

            t = self.target
            c = t.new_cache(1)  # the layout of this target's K/V
            # Default: room for the batch at 1024 tokens each, at most the model's context.
            tokens = self.kv_tokens or self.max_batch * min(t.max_positions, 1024)
            self._pool = PagedKVPool(
                c.num_layers,
                c.num_kv_heads,
                c.head_dim,
                -(-tokens // self.block_size),
                self.block_size,
                prefix_caching=True,
                dtype=getattr(t, "dtype", torch.float32),
                device=t.device,
            )
        return self._pool

    def _admit(self) -> list[RequestOutput]:
        """Move waiting requests into the batch while there is room, and prefill them."""
        while self._waiting and len(self._running) < self.max_batch:
            req = self._waiting[0]
            need = len(req.prompt) + req.max_new + self.budget + 1
            if req.cache is None:
                if self.cache_kind == "dense":
                    req.cache = self.target.new_cache(need)
                else:
                    pool = self._pool_for()
                    blocks = -(-need // self.block_size) + 1  # +1: a copy-on-write
                    if blocks > pool.num_blocks:
                        self._waiting.pop(0)
                        raise KVCacheError(
                            f"request {req.rid} needs {blocks} blocks, the pool has "
                            f"{pool.num_blocks}: raise kv_tokens"
                        )
                    if blocks > pool.num_blocks - sum(r.blocks for r in self._running):
                        break  # waits for a running request to finish
                    req.blocks = blocks
                    req.cache = pool.sequence(req.prompt, cache_salt=req.cache_salt)
            self._waiting.pop(0)
            self._running.append(req)
            t0 = time.perf_counter()
            cache = req.cache
            hit = cache.committed_len
            req.result.prefix_hit = hit
            if len(req.prompt) - 1 > hit:
                try:
                    self.verifier.prefill(req.prompt[hit:-1], cache)
                except BaseException:
                    self._running.remove(req)
                    self._release(req, "cancelled")
                    raise
                req.hidden = self._hidden_rows(None)
            elif self.reads_hidden:  # nothing fed: no hidden states yet
                width = int(getattr(self.target, "hidden_width", 0))
                req.hidden = torch.zeros(0, width, device=self.target.device)
            req.result.timings["prefill"] += time.perf_counter() - t0
        return []

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
        if req.matcher is not None:
            for t in new:
                req.matcher.accept_token(t)
            done = done or req.matcher.is_terminated()
        if req.on_step is not None:
            assert req.cache is not None
            req.on_step(req.context, req.cache, s)
        if done:
            self._running.remove(req)
            stopped = (new and new[-1] in req.stop) or (
                req.matcher is not None and req.matcher.is_terminated()
            )
            self._release(req, "stop" if stopped else "length")
            return RequestOutput(req.rid, new, True, self._finished[req.rid])
        return RequestOutput(req.rid, new)

    def _release(self, req: _Request, reason: str) -> None:
        res = req.result
        res.finish_reason = reason  # type: ignore[assignment]
        res.seconds = time.perf_counter() - req.t_submit
        if req.own_cache and req.cache is not None and hasattr(req.cache, "free"):
            req.cache.free()
        req.cache = None if req.own_cache else req.cache
        self._finished[req.rid] = res


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


def _root_trees(contexts: list[list[int]]) -> list[list[DraftTree]]:
    """Per context one tree of its root alone (a plain step: nothing drafted)."""
    return [[DraftTree([c[-1]], [-1])] for c in contexts]
