"""Suffix decoding in vLLM: a ``custom_class`` speculative proposer over specdec's suffix
indices (:class:`~specdec.draft.SuffixDrafter`).

::

    LLM(model, speculative_config={
        "method": "custom_class",
        "model": "specdec.integrations.vllm.SuffixProposer",
        "num_speculative_tokens": 8,          # the longest draft
        "suffix_decoding_min_token_prob": 0.1,  # the least path probability drafted
        "suffix_decoding_max_spec_factor": 2.0,  # drafts <= 2 x the matched suffix
    })

Each running request has its own suffix index of its prompt and output; the outputs of
finished requests join a shared corpus (least recently used out past
``corpus_tokens``), so a continuation seen in any earlier output is drafted too. Each step
a request gets the most probable chain of the tree its context's longest recurring suffix
proposes: at most ``num_speculative_tokens`` tokens, each prefix's empirical probability at
least ``suffix_decoding_min_token_prob``, and at most ``suffix_decoding_max_spec_factor``
times as long as the context suffix it matched (vLLM's settings of the same names for its
own suffix decoding; a one-token match is weak evidence however often it recurred). The
chain is then cut where its calibrated chance of acceptance (learnt from every chain's
outcome) falls below what a verified token costs against what the steps yield
(:class:`StepCosts`, from the steps' own timings: at batch 8 on two CPU cores a token must
be likelier than at batch 1, on a GPU almost any token pays). So a draft is long where the
context repeats itself and short or empty where no continuation is likely.

vLLM passes a proposer only the batch's token arrays; which request each row holds
(``input_batch.req_ids``) and which requests are still alive (finished ones leave
``requests``; preempted ones stay there while out of the batch) are read from the model
runner that owns the proposer, found when it calls :meth:`SuffixProposer.load_model`.
"""

from __future__ import annotations

import math
import sys
import time
from collections import deque
from collections.abc import Container, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from ...decode import AdaptiveBudget, CostModel
from ...draft.suffix import DEFAULT_CORPUS_TOKENS, SuffixDrafter
from ...errors import ConfigError, DraftError
from ...protocols import DraftRequest
from ...tree import DraftTree

__all__ = [
    "SuffixProposer",
    "SuffixChains",
    "StepCosts",
    "StepLine",
    "ProposeStats",
    "best_chain",
]


def best_chain(tree: DraftTree, limit: int) -> list[int]:
    """The tokens of ``tree``'s most probable path from the root (at each node the child of
    highest path log-prob, the first on ties), at most ``limit`` of them."""
    return _best_path(tree, limit)[0]


def _best_path(tree: DraftTree, limit: int) -> tuple[list[int], list[float]]:
    """:func:`best_chain` with each token's path log-prob."""
    n = tree.num_real
    if n <= 1 or limit <= 0:
        return [], []
    parents = tree.parents[:n].tolist()
    logprobs = tree.logprobs[:n].tolist()
    tokens = tree.tokens[:n].tolist()
    best: dict[int, int] = {}
    for i in range(1, n):
        p = parents[i]
        j = best.get(p)
        if j is None or logprobs[i] > logprobs[j]:
            best[p] = i
    chain: list[int] = []
    lps: list[float] = []
    node = best.get(0)
    while node is not None and len(chain) < limit:
        chain.append(tokens[node])
        lps.append(logprobs[node])
        node = best.get(node)
    return chain, lps


def _chain_tree(root: int, chain: list[int], logprobs: list[float]) -> DraftTree:
    n = len(chain)
    return DraftTree([root, *chain], list(range(-1, n)), list(range(n + 1)), [0.0, *logprobs])


@dataclass
class _Request:
    """A tracked request: its drafter id, prompt length, and the context last drafted from
    (its output joins the corpus when the request finishes)."""

    rid: int
    prompt_len: int
    context: list[int]
    last: DraftTree | None = None  # the whole chain last drafted, until its outcome is learnt


class SuffixChains:
    """Chains drafted per request from suffix indices, requests keyed by any hashable id
    (vLLM's request ids); the engine-independent part of :class:`SuffixProposer`.

    ``max_tokens``: the longest chain; ``min_prob``: the least path probability drafted;
    ``max_match``: the longest context suffix looked up; ``corpus_tokens``: the bound of the
    shared corpus of finished outputs; ``min_match`` and ``depth_factor``: see
    :class:`~specdec.draft.SuffixDrafter`.

    A suffix index's probabilities are counts: a continuation seen once has probability 1.
    So each chain token is also valued by its calibrated acceptance (an
    :class:`~specdec.decode.AdaptiveBudget`'s node values: the path probability with each
    step's conditional probability scaled by how often tokens of that probability were
    accepted so far, learnt from every chain's outcome, :meth:`learn`), scaled by what the
    request's own chains realised against those values
    (:meth:`~specdec.decode.AdaptiveBudget.request_factor`: a question among repeated texts
    keeps its chains short while the repeats keep theirs long), and :meth:`draft` cuts the
    chain where that falls below its ``threshold``."""

    def __init__(
        self,
        *,
        max_tokens: int,
        min_prob: float,
        max_match: int = 8,
        corpus_tokens: int = DEFAULT_CORPUS_TOKENS,
        min_match: int = 1,
        depth_factor: float | None = None,
    ) -> None:
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise ConfigError(f"max_tokens must be an int >= 1, got {max_tokens!r}")
        self.drafter = SuffixDrafter(
            max_match=max_match,
            max_depth=max_tokens,
            min_prob=min_prob,
            remember_outputs=True,
            corpus_tokens=corpus_tokens,
            min_match=min_match,
            depth_factor=depth_factor,
        )
        self.max_tokens = max_tokens
        # Every node of path probability >= p lies within the best depth / p of a best-first
        # tree, so this budget holds the whole best chain when min_prob >= 1/8.
        p = self.drafter.min_prob
        per_depth = 8 if p <= 0 else min(8, math.ceil(1 / p))
        self.budget = max_tokens * per_depth
        self._requests: dict[Any, _Request] = {}
        self._next_id = 0
        # Used for its calibration only (node_values, learn): no cost model is consulted.
        self.calibration = AdaptiveBudget(CostModel([1], [1.0]), max_tokens)

    @property
    def num_requests(self) -> int:
        """Requests tracked (running or preempted)."""
        return len(self._requests)

    def _add(self, key: Any, context: list[int], prompt_len: int) -> _Request:
        rid = self._next_id
        self._next_id += 1
        prompt_len = max(0, min(prompt_len, len(context)))
        self.drafter.add_request(rid, context[:prompt_len])
        req = _Request(rid, prompt_len, context[:prompt_len])
        self._requests[key] = req
        return req

    def draft(
        self,
        key: Any,
        context: list[int],
        prompt_len: int,
        limit: int,
        threshold: float = 0.0,
    ) -> list[int]:
        """The chain after ``context`` (prompt and output so far) for request ``key``, at most
        ``limit`` tokens, cut before the first token whose calibrated acceptance is below
        ``threshold``; a request not seen before starts with its first ``prompt_len`` tokens
        as its prompt. A context that does not extend the one last drafted from (the same id
        reused for another request) starts the request afresh."""
        req = self._requests.get(key) or self._add(key, context, prompt_len)
        try:
            tree = self.drafter.propose([DraftRequest(context, request_id=req.rid)], self.budget)
        except DraftError:
            self.drop(key)
            req = self._add(key, context, prompt_len)
            tree = self.drafter.propose([DraftRequest(context, request_id=req.rid)], self.budget)
        req.context = context
        chain, logprobs = _best_path(tree[0], min(limit, self.max_tokens))
        if not chain:
            req.last = None
            return []
        req.last = _chain_tree(context[-1], chain, logprobs)
        if threshold <= 0.0:
            return chain
        values = self.calibration.node_values(req.last, sized=False)
        values = values * self.calibration.request_factor(req.rid)
        keep = 0
        while keep < len(chain) and values[keep] >= threshold:
            keep += 1
        return chain[:keep]

    def learn(self, key: Any, committed: Sequence[int]) -> None:
        """The step after :meth:`draft` committed ``committed`` for request ``key`` (the
        accepted draft tokens, then the bonus one): the calibration learns from its whole
        last chain, verified or cut."""
        req = self._requests.get(key)
        if req is None or req.last is None or not committed:
            return
        self.calibration.learn([req.last], [int(t) for t in committed], req.rid)
        req.last = None

    def finish(self, key: Any) -> None:
        """Request ``key`` ended: its output joins the corpus and its index is freed."""
        req = self._requests.pop(key, None)
        if req is not None:
            self.drafter.remove_request(req.rid, req.context[req.prompt_len :])
            self.calibration.forget(req.rid)

    def drop(self, key: Any) -> None:
        """Forget request ``key`` without keeping its output."""
        req = self._requests.pop(key, None)
        if req is not None:
            self.drafter.remove_request(req.rid, None)
            self.calibration.forget(req.rid)

    def retain(self, alive: Container[Any]) -> None:
        """Finish every tracked request that is not in ``alive``."""
        for key in [k for k in self._requests if k not in alive]:
            self.finish(key)


@dataclass
class ProposeStats:
    """What the proposer did: ``propose`` calls, requests drafted for, tokens drafted, and
    the seconds spent in ``propose`` (drafting and bookkeeping)."""

    calls: int = 0
    requests: int = 0
    drafted: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class StepLine:
    """A step's seconds as a line in the tokens it verifies: ``step_s`` + ``token_s`` x
    tokens (least squares over :class:`StepCosts`' window)."""

    step_s: float
    token_s: float


class StepCosts:
    """What a verified token costs, from the steps themselves: over the last ``window``
    steps, seconds against tokens verified (least squares: seconds per extra token), and
    over the last ``recent`` steps, output tokens per second. A draft token pays when its
    chance of being accepted is above :meth:`threshold`, their product: on two CPU cores
    each token verified at batch 8 costs a few percent of a step, at batch 1 far less, on a
    GPU next to nothing. The rate follows only recent steps because it moves with the batch
    (a batch of 8 after one request alone outputs several times faster per second, so its
    tokens must be likelier), while the slope is the same line at every batch size."""

    def __init__(self, window: int = 64, least: int = 8, recent: int = 16) -> None:
        self.window = window
        self.least = least
        self.recent = recent
        self._steps: deque[tuple[int, float, int]] = deque()
        # Running sums over the window: fed, seconds, fed^2, fed x seconds.
        self._sums = [0.0, 0.0, 0.0, 0.0]
        self._recent: deque[tuple[float, int]] = deque()
        self._recent_sums = [0.0, 0.0]  # seconds, output tokens

    def _count(self, step: tuple[int, float, int], sign: float) -> None:
        f, t, _ = step
        for i, x in enumerate((f, t, f * f, f * t)):
            self._sums[i] += sign * x

    def add(self, fed: int, seconds: float, out: int) -> None:
        """A step verified ``fed`` tokens (every request's draft and bonus position) in
        ``seconds`` and committed ``out`` tokens."""
        step = (fed, seconds, out)
        self._steps.append(step)
        self._count(step, 1.0)
        if len(self._steps) > self.window:
            self._count(self._steps.popleft(), -1.0)
        self._recent.append((seconds, out))
        self._recent_sums[0] += seconds
        self._recent_sums[1] += out
        if len(self._recent) > self.recent:
            t, o = self._recent.popleft()
            self._recent_sums[0] -= t
            self._recent_sums[1] -= o

    def line(self) -> StepLine | None:
        """The window's step times against tokens verified; None until ``least`` steps with
        different token counts are seen (the slope is unknown), the slope at least 0."""
        n = len(self._steps)
        if n < self.least:
            return None
        sf, st, sff, sft = self._sums
        var = sff - sf * sf / n
        if var <= 1e-9 * max(sff, 1.0):  # one token count only
            return None
        per_token = max((sft - sf * st / n) / var, 0.0)
        return StepLine((st - per_token * sf) / n, per_token)

    def threshold(self) -> float:
        """Seconds per verified token x output tokens per second (0 while :meth:`line` is
        None), at most 0.9."""
        line = self.line()
        if line is None:
            return 0.0
        rate = self._recent_sums[1] / max(self._recent_sums[0], 1e-9)
        return min(line.token_s * rate, 0.9)


def _find_runner(proposer: object) -> Any:
    """The vLLM model runner that owns ``proposer`` (its ``drafter``), looked up on the call
    stack: vLLM's proposer interface passes no request ids, its runner holds them."""
    frame = sys._getframe(1)
    for _ in range(16):
        if frame is None:
            break
        obj = frame.f_locals.get("self")
        if (
            obj is not None
            and getattr(obj, "drafter", None) is proposer
            and hasattr(obj, "input_batch")
            and hasattr(obj, "requests")
        ):
            return obj
        frame = frame.f_back  # type: ignore[assignment]
    return None


class SuffixProposer:
    """A vLLM ``custom_class`` proposer (see the module docstring). Subclass it to change
    the class settings (``max_match``, ``min_match``, ``corpus_tokens``; ``min_prob`` and
    ``depth_factor`` override the speculative config's ``suffix_decoding_min_token_prob``
    and ``suffix_decoding_max_spec_factor``) and name the subclass's path instead."""

    max_match: ClassVar[int] = 8
    min_match: ClassVar[int] = 1
    corpus_tokens: ClassVar[int] = DEFAULT_CORPUS_TOKENS
    min_prob: ClassVar[float | None] = None
    depth_factor: ClassVar[float | None] = None

    def __init__(self, vllm_config: Any) -> None:
        spec = getattr(vllm_config, "speculative_config", None)
        k = getattr(spec, "num_speculative_tokens", None)
        if not isinstance(k, int) or k < 1:
            raise ConfigError(
                "SuffixProposer needs speculative_config.num_speculative_tokens >= 1 (the "
                f"longest draft), got {k!r}"
            )
        min_prob = self.min_prob
        if min_prob is None:
            min_prob = float(getattr(spec, "suffix_decoding_min_token_prob", 0.1))
        factor = self.depth_factor
        if factor is None:
            factor = float(getattr(spec, "suffix_decoding_max_spec_factor", 1.0))
        self.chains = SuffixChains(
            max_tokens=k,
            min_prob=min_prob,
            max_match=self.max_match,
            corpus_tokens=self.corpus_tokens,
            min_match=self.min_match,
            depth_factor=factor,
        )
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        self.stats = ProposeStats()
        self.costs = StepCosts()
        self._runner: Any = None
        # The last step: its rows' request ids, tokens it verifies, and when drafting ended.
        self._last_ids: list[str] = []
        self._fed = 0
        self._t_end: float | None = None

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """No model to load; finds the runner that calls it (see the module docstring)."""
        self._runner = _find_runner(self)

    def _the_runner(self) -> Any:
        if self._runner is None:
            self._runner = _find_runner(self)
        if self._runner is None:
            raise ConfigError(
                "SuffixProposer cannot see vLLM's request ids: no model runner with this "
                "proposer as its drafter called load_model or propose (an unsupported vLLM "
                "version?)"
            )
        return self._runner

    def propose(
        self,
        sampled_token_ids: Sequence[Sequence[int]],
        num_tokens_no_spec: Any,
        token_ids_cpu: Any,
        slot_mappings: Any = None,
        **kwargs: Any,
    ) -> list[list[int]]:
        """One draft per batch row: empty for a row that sampled nothing this step (a prefill
        chunk) or has no room left before ``max_model_len``."""
        t0 = time.perf_counter()
        runner = self._the_runner()
        batch = runner.input_batch
        req_ids = list(batch.req_ids)
        # The step since the last call verified the drafts then made: learn its cost when it
        # held the same requests, none of them in a prefill.
        if (
            self._t_end is not None
            and req_ids == self._last_ids
            and all(len(s) > 0 for s in sampled_token_ids)
        ):
            out_tokens = sum(len(s) for s in sampled_token_ids)
            self.costs.add(self._fed, t0 - self._t_end, out_tokens)
        # Finished requests leave runner.requests; preempted ones stay there.
        self.chains.retain(runner.requests)
        threshold = self.costs.threshold()
        out: list[list[int]] = []
        drafted = 0
        for i, sampled in enumerate(sampled_token_ids):
            n = int(num_tokens_no_spec[i])
            room = self.max_model_len - n - 1
            if sampled:
                self.chains.learn(req_ids[i], sampled)
            if not sampled or room <= 0:
                out.append([])
                continue
            context = token_ids_cpu[i, :n].tolist()
            chain = self.chains.draft(
                req_ids[i], context, int(batch.num_prompt_tokens[i]), room, threshold
            )
            drafted += 1
            out.append(chain)
        self._last_ids = req_ids
        self._fed = sum(1 + len(c) for c in out)
        self.stats.calls += 1
        self.stats.requests += drafted
        self.stats.drafted += sum(len(c) for c in out)
        self._t_end = time.perf_counter()
        self.stats.seconds += self._t_end - t0
        return out
