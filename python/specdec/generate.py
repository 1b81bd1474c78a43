"""Generation loops: the autoregressive baseline and tree/chain speculation.

A speculative step reads as the pipeline it is::

    logits = drafter.draft(context, depth)          # draft: per-depth marginals [L, V]
    tree   = build_tree(logits, root=context[-1])   # DDTree (best-first) or one chain
    result = verifier.step(tree, cache)             # mask -> forward -> rule -> walk -> commit
    context += result.tokens                        # accepted tokens + bonus token

Cache invariant between steps: the cache holds every token of ``context`` except the last one
(the root of the next tree, fed with it).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

import torch

from .cache import KVCache
from .errors import VerifyError
from .tree import DraftTree, ddtree_from_logits, tree_from_branches
from .verify import STAGES, DecodingRule, Greedy, StepResult, Target, Verifier

__all__ = [
    "Drafter",
    "GenerationResult",
    "SpeculativeGenerator",
    "autoregressive_generate",
    "build_tree",
]


class Drafter(Protocol):
    """Proposes per-depth logits ``[depth, V]`` for the tokens after ``context``."""

    def draft(self, context: Sequence[int], depth: int) -> torch.Tensor: ...


@dataclass
class GenerationResult:
    """``tokens``: generated tokens (prompt excluded); ``accepted``: drafted tokens accepted
    per step; ``timings``: total seconds per stage."""

    tokens: list[int]
    steps: int = 0
    accepted: list[int] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def tokens_per_step(self) -> float:
        return len(self.tokens) / max(self.steps, 1)


def build_tree(
    logits: torch.Tensor,
    root_token: int,
    *,
    kind: Literal["ddtree", "chain"] = "ddtree",
    budget: int = 16,
) -> DraftTree:
    """Draft logits ``[L, V]`` -> a tree rooted at ``root_token``: the best-first DDTree of
    ``budget`` nodes, or the drafter's argmax chain (first ``budget`` depths)."""
    if kind == "ddtree":
        tree = ddtree_from_logits(logits, budget, root_tokens=int(root_token))
        assert isinstance(tree, DraftTree)
        return tree
    if kind == "chain":
        chain = logits[:budget].argmax(dim=-1).tolist()
        return tree_from_branches([chain], root_token=int(root_token))
    raise VerifyError(f"tree kind must be 'ddtree' or 'chain', got {kind!r}")


def _emit(out: list[int], new: Sequence[int], limit: int, eos: int | None) -> bool:
    """Append ``new`` to ``out`` up to ``limit`` tokens or the first EOS; True when done."""
    for t in new:
        out.append(int(t))
        if len(out) >= limit or (eos is not None and t == eos):
            return True
    return False


def _prompt_ids(prompt: Sequence[int] | torch.Tensor) -> list[int]:
    ids = torch.as_tensor(prompt).reshape(-1).tolist()
    if not ids:
        raise VerifyError("the prompt needs at least one token")
    return [int(t) for t in ids]


def autoregressive_generate(
    target: Target,
    prompt: Sequence[int] | torch.Tensor,
    max_new_tokens: int,
    *,
    rule: DecodingRule | None = None,
    generator: torch.Generator | None = None,
    cache: KVCache | None = None,
    eos_token_id: int | None = None,
    on_step: Callable[[list[int], KVCache], None] | None = None,
) -> GenerationResult:
    """The baseline: one token per target forward, same model code, same rule."""
    rule = rule if rule is not None else Greedy()
    ids = _prompt_ids(prompt)
    if cache is None:  # room for the whole generation, not the model's maximum
        cache = target.new_cache(min(len(ids) + max(max_new_tokens, 0), target.max_positions))
    dev = torch.device(target.device)
    out: list[int] = []
    res = GenerationResult(out, timings=dict.fromkeys(("forward", "rule", "commit"), 0.0))
    if max_new_tokens <= 0:
        return res
    feed = torch.tensor(ids, dtype=torch.long, device=dev)  # first step: the whole prompt
    while True:
        t0 = time.perf_counter()
        start = cache.committed_len
        pos = torch.arange(start, start + feed.numel(), device=dev)
        logits = target(feed, pos, cache, None)
        t1 = time.perf_counter()
        tok = int(rule.choose(logits[-1:], generator)[0])
        t2 = time.perf_counter()
        cache.commit(torch.arange(feed.numel()))
        res.timings["forward"] += t1 - t0
        res.timings["rule"] += t2 - t1
        res.timings["commit"] += time.perf_counter() - t2
        res.steps += 1
        done = _emit(out, [tok], max_new_tokens, eos_token_id)
        if on_step is not None:
            on_step(ids + out, cache)
        if done:
            return res
        feed = torch.tensor([tok], dtype=torch.long, device=dev)


class SpeculativeGenerator:
    """Draft -> build tree -> verify (mask, forward, rule, walk, commit), repeated.

    ``tree="ddtree"``: the best-first tree of ``budget`` drafted nodes over ``depth`` drafted
    positions; ``tree="chain"``: the drafter's argmax path of ``depth`` tokens (DFlash-style
    single path). ``pad_to_budget`` pads every tree to ``budget`` nodes (fixed shapes)."""

    def __init__(
        self,
        target: Target,
        drafter: Drafter,
        *,
        rule: DecodingRule | None = None,
        tree: Literal["ddtree", "chain"] = "ddtree",
        budget: int = 16,
        depth: int = 8,
        generator: torch.Generator | None = None,
        pad_to_budget: bool = False,
    ) -> None:
        if tree not in ("ddtree", "chain"):
            raise VerifyError(f"tree must be 'ddtree' or 'chain', got {tree!r}")
        if budget < 1 or depth < 1:
            raise VerifyError(f"budget and depth must be >= 1, got {budget}, {depth}")
        self.target = target
        self.drafter = drafter
        self.verifier = Verifier(target, rule, generator=generator)
        self.kind = tree
        self.budget = budget if tree == "ddtree" else depth
        self.depth = depth
        self.pad_to_budget = pad_to_budget

    @property
    def rule(self) -> DecodingRule:
        return self.verifier.rule

    def draft(self, context: Sequence[int]) -> torch.Tensor:
        """The drafter's per-depth logits ``[depth, V]`` for the tokens after ``context``."""
        return self.drafter.draft(context, self.depth)

    def build(self, logits: torch.Tensor, root_token: int) -> DraftTree:
        """The tree from draft logits (padded to the budget when ``pad_to_budget``)."""
        tree = build_tree(logits, root_token, kind=self.kind, budget=self.budget)
        if self.pad_to_budget and tree.num_drafted < self.budget:
            tree = tree.padded(self.budget)
        return tree

    def draft_tree(self, context: Sequence[int]) -> DraftTree:
        """Draft and build the tree for the tokens after ``context`` (root = its last token)."""
        return self.build(self.draft(context), context[-1])

    def step(self, context: Sequence[int], cache: KVCache) -> StepResult:
        """One speculative step after ``context`` (cache = context minus its last token)."""
        if cache.committed_len != len(context) - 1:
            raise VerifyError(
                f"the cache holds {cache.committed_len} tokens; it must hold the context "
                f"minus its last token ({len(context) - 1})"
            )
        t0 = time.perf_counter()
        logits = self.draft(context)
        t1 = time.perf_counter()
        tree = self.build(logits, context[-1])
        t2 = time.perf_counter()
        res = self.verifier.step(tree, cache)
        res.timings["draft"] = t1 - t0
        res.timings["build"] = t2 - t1
        return res

    def generate(
        self,
        prompt: Sequence[int] | torch.Tensor,
        max_new_tokens: int,
        *,
        cache: KVCache | None = None,
        eos_token_id: int | None = None,
        on_step: Callable[[list[int], KVCache, StepResult], None] | None = None,
    ) -> GenerationResult:
        ids = _prompt_ids(prompt)
        if cache is None:  # the last step feeds a whole tree past the generated tokens
            need = len(ids) + max(max_new_tokens, 0) + self.budget + 1
            cache = self.target.new_cache(min(need, self.target.max_positions))
        out: list[int] = []
        res = GenerationResult(out, timings=dict.fromkeys(("draft", *STAGES), 0.0))
        if max_new_tokens <= 0:
            return res
        if len(ids) > 1:
            self.verifier.prefill(ids[:-1], cache)
        while True:
            context = ids + out
            step = self.step(context, cache)
            res.steps += 1
            res.accepted.append(step.num_accepted)
            for k, v in step.timings.items():
                res.timings[k] = res.timings.get(k, 0.0) + v
            done = _emit(out, step.tokens, max_new_tokens, eos_token_id)
            if on_step is not None:
                on_step(ids + out, cache, step)
            if done:
                return res
