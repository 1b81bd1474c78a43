"""Tree (or chain) speculation. A step reads as the pipeline it is::

    logits = drafter.draft([DraftRequest(context)], depth)[0]  # draft: marginals [L, V]
    tree   = shape.build(logits, root_token=context[-1])      # DDTree (best-first) or chain
    # or, for a TreeDrafter (suffix, n-gram lookup), both at once:
    tree   = drafter.propose([DraftRequest(context)], budget)[0]
    result = verifier.step(tree, cache)                        # mask, forward, rule, walk, commit
    context += result.tokens                                   # accepted tokens + bonus token

Cache invariant between steps: the cache holds every token of ``context`` except the last one
(the root of the next tree, fed with it).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Literal

import torch

from .._arrays import check_int
from ..errors import ConfigError, SpecdecTypeError, VerifyError
from ..protocols import Drafter, DraftRequest, KVCache, Target, TreeDrafter, TreeShape
from ..tree import DraftTree, tree_shape
from ..verify import STAGES, DecodingRule, StepResult, Verifier
from .common import GenerationResult, emit, prompt_ids

__all__ = ["SpeculativeGenerator"]


class SpeculativeGenerator:
    """Draft -> build tree -> verify (mask, forward, rule, walk, commit), repeated.

    ``drafter``: a :class:`~specdec.protocols.Drafter` asked for ``depth`` drafted positions,
    or a :class:`~specdec.protocols.TreeDrafter` asked for trees of ``budget`` drafted nodes
    (used in preference when a drafter is both; ``tree`` is then not used);
    ``tree``: a :class:`~specdec.protocols.TreeShape`, or ``"ddtree"`` (the best-first tree of
    ``budget`` drafted nodes) or ``"chain"`` (the drafter's argmax path of ``depth`` tokens,
    DFlash-style single path). ``pad_to_budget`` pads every tree to the shape's most nodes
    (fixed shapes for CUDA graphs)."""

    def __init__(
        self,
        target: Target,
        drafter: Drafter | TreeDrafter,
        *,
        rule: DecodingRule | None = None,
        tree: Literal["ddtree", "chain"] | TreeShape = "ddtree",
        budget: int = 16,
        depth: int = 8,
        generator: torch.Generator | None = None,
        pad_to_budget: bool = False,
    ) -> None:
        self.depth = check_int(depth, "depth", 1, ConfigError)
        self.shape = tree_shape(tree, budget=budget, depth=self.depth)
        if not isinstance(self.shape, TreeShape):
            raise SpecdecTypeError(f"tree must be a TreeShape, got {type(tree).__name__}")
        self.tree_drafter = drafter if isinstance(drafter, TreeDrafter) else None
        if self.tree_drafter is None and not isinstance(drafter, Drafter):
            raise SpecdecTypeError(
                "drafter must follow specdec.protocols.Drafter or TreeDrafter, got "
                f"{type(drafter).__name__}"
            )
        self.target = target
        self.drafter = drafter
        self.verifier = Verifier(target, rule, generator=generator)
        self.budget = (
            self.shape.max_drafted
            if self.tree_drafter is None
            else check_int(budget, "budget", 1, ConfigError)
        )
        self.pad_to_budget = pad_to_budget

    @property
    def rule(self) -> DecodingRule:
        return self.verifier.rule

    def draft(self, context: Sequence[int]) -> torch.Tensor:
        """The drafter's per-depth logits ``[depth, V]`` for the tokens after ``context``."""
        if self.tree_drafter is not None or not isinstance(self.drafter, Drafter):
            raise ConfigError("a TreeDrafter proposes trees, not logits: use draft_tree")
        return self.drafter.draft([DraftRequest(context)], self.depth)[0]

    def propose(self, context: Sequence[int]) -> DraftTree:
        """A TreeDrafter's tree for the tokens after ``context`` (padded when
        ``pad_to_budget``)."""
        assert self.tree_drafter is not None
        tree = self.tree_drafter.propose([DraftRequest(context)], self.budget)[0]
        if self.pad_to_budget and tree.num_drafted < self.budget:
            tree = tree.padded(self.budget)
        return tree

    def build(self, logits: torch.Tensor, root_token: int) -> DraftTree:
        """The tree from draft logits (padded to the budget when ``pad_to_budget``)."""
        tree = self.shape.build(logits, root_token)
        if self.pad_to_budget and tree.num_drafted < self.budget:
            tree = tree.padded(self.budget)
        return tree

    def draft_tree(self, context: Sequence[int]) -> DraftTree:
        """Draft and build the tree for the tokens after ``context`` (root = its last token)."""
        if self.tree_drafter is not None:
            return self.propose(context)
        return self.build(self.draft(context), context[-1])

    def step(self, context: Sequence[int], cache: KVCache) -> StepResult:
        """One speculative step after ``context`` (cache = context minus its last token)."""
        if cache.committed_len != len(context) - 1:
            raise VerifyError(
                f"the cache holds {cache.committed_len} tokens; it must hold the context "
                f"minus its last token ({len(context) - 1})"
            )
        t0 = time.perf_counter()
        if self.tree_drafter is not None:  # draft and build in one call, timed as draft
            tree = self.propose(context)
            t1 = t2 = time.perf_counter()
        else:
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
        ids = prompt_ids(prompt)
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
            done = emit(out, step.tokens, max_new_tokens, eos_token_id)
            if on_step is not None:
                on_step(ids + out, cache, step)
            if done:
                return res
