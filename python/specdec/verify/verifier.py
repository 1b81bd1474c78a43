"""Tree verification: decoding rules and the verify step.

One step (:meth:`Verifier.step`)::

    mask     tree.attention_mask(prefix), positions prefix + depth      (Rust contract)
    forward  target(root + drafted nodes, positions, cache, mask)      one forward, logits [n, V]
    rule     chosen[i] = argmax or ONE sample of the target's processed distribution at node i
    walk     descend while chosen[node] is a child's token; first miss = bonus token (Rust)
    commit   cache.commit([root] + accepted): accepted K/V contiguous after the prefix

Lossless by construction: every emitted token is the target's own choice (argmax, or a sample
of its own distribution) given exactly the tokens before it, because node i's logits see the
committed prefix and i's ancestors only. Chain verification is the one-branch tree.

Targets are duck-typed (:class:`~specdec.protocols.Target`):
:class:`~specdec.models.llama.LlamaModel` and :class:`~specdec.models.hf.HFTarget` both
qualify. The target's ``forward`` calls ``cache.begin``; the verifier commits or rolls back.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from .._arrays import check_int, token_tensor
from ..errors import NoAllowedTokens, SpecdecTypeError, VerifyError
from ..protocols import (
    ArgmaxCapture,
    Constraint,
    HiddenCapture,
    KVCache,
    LogitsMask,
    Target,
)
from ..tree import DraftTree, WalkResult, batch_tree_inputs, walk, walk_batch
from .rules import DecodingRule, Greedy
from .rules.base import apply_rule
from .rules.sampling import keyed_uniforms

__all__ = ["StepResult", "Verifier", "STAGES", "mask_tree_logits"]

STAGES = ("build", "mask", "forward", "rule", "walk", "commit")


@dataclass(frozen=True)
class TreeMask:
    """A tree step's grammar mask (:func:`tree_mask`): ``bitmask`` int32 ``[n, W]``, each
    masked row the tokens the grammar allows after its node's path, every other row all
    ones; ``masked`` bool ``[n]``, the rows it masks; ``empty`` bool ``[n]``, nodes whose
    state allows no token at all."""

    bitmask: torch.Tensor
    masked: np.ndarray
    empty: np.ndarray


def tree_mask(matcher: Constraint, tree: DraftTree, n: int, vocab: int) -> TreeMask:
    """The grammar's mask of a tree step's ``n`` logits rows of ``vocab`` tokens (the root's
    state is ``matcher``'s). Rows of paths the grammar rejects are left unmasked: the walk
    never reaches them, since a node is only entered through a token its parent's row
    allowed; so are rows that allow no token (``empty``: the walk must not stop there, see
    :func:`check_bonus_allowed`)."""
    from ..constrain import fill_tree_bitmask
    from ..constrain.torch import allocate_token_bitmask

    bitmask = allocate_token_bitmask(n, vocab)
    valid = fill_tree_bitmask(matcher, tree, bitmask)  # type: ignore[arg-type]
    words = bitmask.numpy()
    empty = valid & ~words.any(axis=1)
    masked = valid & ~empty
    words[~masked] = -1
    return TreeMask(bitmask, masked, empty)


def apply_tree_mask(logits: torch.Tensor, tm: TreeMask) -> None:
    """Mask ``logits`` ``[n, V]`` in place by ``tm`` (its masked rows)."""
    from ..constrain.torch import apply_token_bitmask_inplace

    rows = np.flatnonzero(tm.masked)
    if len(rows):
        bm = tm.bitmask[torch.from_numpy(rows)]
        apply_token_bitmask_inplace(logits, bm, indices=rows.tolist())


def mask_tree_logits(logits: torch.Tensor, tree: DraftTree, matcher: Constraint) -> np.ndarray:
    """Constrain a tree step's logits ``[n, V]`` in place by :func:`tree_mask`: each node's
    row keeps only the tokens the grammar allows after the node's path. Returns bool
    ``[n]``, True where a reachable-in-principle node allows no token at all (the walk must
    not stop there: see :func:`check_bonus_allowed`)."""
    n, v = logits.shape
    tm = tree_mask(matcher, tree, n, v)
    apply_tree_mask(logits, tm)
    return tm.empty


def check_bonus_allowed(empty: np.ndarray, last_node: int, row: int = 0) -> None:
    """An empty allowed set where the walk stopped is an error, never a choice among -inf."""
    if empty[last_node]:
        raise NoAllowedTokens(
            f"the grammar allows no token after tree node {last_node} (request row {row}): "
            "the constraint is finished or dead, and no stop token ended the request",
            row=row,
        )


def _node_uniforms(
    trees: Sequence[DraftTree],
    prefix: Sequence[int],
    seeds: Sequence[int | None],
    width: int | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """``[R, width]`` float64: per tree node the uniform its row samples with. A seeded
    request's node at depth ``d`` samples the token at position ``prefix + d + 1`` (the
    root sits at ``prefix``); an unseeded one's rows draw from ``generator``."""
    width = width or max(t.num_nodes for t in trees)
    out = np.zeros((len(trees), width), dtype=np.float64)
    for i, (tree, start, seed) in enumerate(zip(trees, prefix, seeds, strict=True)):
        m = min(tree.num_nodes, width)
        if seed is None:
            out[i] = torch.rand(width, generator=generator, dtype=torch.float64).numpy()
        else:
            out[i, :m] = keyed_uniforms(seed, start + 1 + tree.depths[:m].astype(np.int64))
    return torch.from_numpy(out)


# -- the verify step -----------------------------------------------------------------------
@dataclass(frozen=True)
class StepResult(WalkResult):
    """The walk's result (accepted nodes, their tokens, the bonus token; the cache now holds
    the root and the accepted nodes, and the bonus token is the next step's root), plus
    ``timings`` (seconds per stage) and ``logits`` (the target's logits at every node)."""

    timings: dict[str, float] = field(default_factory=dict)
    logits: torch.Tensor | None = None


def _rule(rule: DecodingRule | None, default: DecodingRule) -> DecodingRule:
    if rule is None:
        return default
    if not isinstance(rule, DecodingRule):
        raise SpecdecTypeError(f"rule must be a DecodingRule, got {type(rule).__name__}")
    return rule


class Verifier:
    """The step API a serving loop calls: ``step(tree, cache) -> StepResult``, or
    ``step_batch(trees, caches)`` for R sequences in one forward (targets with
    ``forward_batch``, e.g. :class:`~specdec.models.llama.LlamaModel`).

    ``target``: a model following :class:`Target`; ``rule``: :class:`Greedy` or
    :class:`Sampling`; ``generator``: the torch RNG for sampling (on the target's device).
    ``sync``: synchronise CUDA around each stage so timings are per stage (default: on CUDA).
    """

    def __init__(
        self,
        target: Target,
        rule: DecodingRule | None = None,
        *,
        generator: torch.Generator | None = None,
        sync: bool | None = None,
    ) -> None:
        if not callable(target) or not hasattr(target, "new_cache"):
            raise SpecdecTypeError(
                f"target must follow specdec.protocols.Target, got {type(target)}"
            )
        self.target = target
        self.rule = rule if rule is not None else Greedy()
        if not isinstance(self.rule, DecodingRule):
            raise SpecdecTypeError(f"rule must be a DecodingRule, got {type(self.rule).__name__}")
        self.generator = generator
        self.device = torch.device(target.device)
        self.sync = self.device.type == "cuda" if sync is None else sync

    def _now(self) -> float:
        if self.sync:
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def prefill(
        self,
        tokens: Sequence[int] | torch.Tensor,
        cache: KVCache,
        *,
        hidden: HiddenCapture | None = None,
    ) -> torch.Tensor:
        """Feed ``tokens`` causally after the committed prefix and commit them all. Returns
        their logits. ``hidden``: hidden states to keep (a target with
        ``captures_hidden``)."""
        ids = token_tensor(tokens, "prefill tokens", self.device)
        if ids.numel() == 0:
            raise VerifyError("prefill needs at least one token")
        start = cache.committed_len
        pos = torch.arange(start, start + ids.numel(), device=self.device)
        logits = self._forward(ids, pos, cache, None, hidden)
        cache.commit_fed(ids)
        return logits

    def _forward(
        self,
        ids: torch.Tensor,
        pos: torch.Tensor,
        cache: KVCache,
        mask: torch.Tensor | None,
        hidden: HiddenCapture | None,
        argmax: ArgmaxCapture | None = None,
        allowed: LogitsMask | None = None,
    ) -> torch.Tensor:
        if hidden is None and argmax is None and allowed is None:
            return self.target(ids, pos, cache, mask)
        kw: dict[str, object] = {}
        if hidden is not None:
            if not getattr(self.target, "captures_hidden", False):
                raise VerifyError(f"{type(self.target).__name__} keeps no hidden states")
            kw["hidden"] = hidden
        if argmax is not None:
            kw["argmax"] = argmax
        if allowed is not None:
            kw["allowed"] = allowed
        out: torch.Tensor = self.target(ids, pos, cache, mask, **kw)
        return out

    def _tree_mask(self, matcher: Constraint, tree: DraftTree, n: int) -> TreeMask | None:
        """The step's grammar mask, made before the forward for a target that masks its
        logits itself (``masks_logits``; its head then skips what no row allows)."""
        if not getattr(self.target, "masks_logits", False):
            return None
        return tree_mask(matcher, tree, n, int(self.target.vocab_size))

    def _argmax_capture(self, rule: DecodingRule) -> ArgmaxCapture | None:
        """A capture for the target's own argmax where ``rule`` is plain :class:`Greedy`
        (not a subclass: it could choose otherwise) and the target computes one; the caller
        leaves it out where a constraint masks the logits first."""
        if type(rule) is Greedy and getattr(self.target, "captures_argmax", False):
            return ArgmaxCapture()
        return None

    def step(
        self,
        tree: DraftTree,
        cache: KVCache,
        *,
        root_token: int | None = None,
        constraint: Constraint | None = None,
        seed: int | None = None,
        hidden: HiddenCapture | None = None,
        rule: DecodingRule | None = None,
    ) -> StepResult:
        """Verify ``tree`` (root = the last emitted token, not yet in ``cache``) in one target
        forward, walk it with the rule's chosen tokens and commit root + accepted path.
        ``constraint``: the sequence's grammar state after the root (a matcher); every
        node's logits are masked to what it allows, so the rule only picks valid tokens (the
        caller advances the matcher with the step's tokens). ``seed``: seeded sampling keyed
        by position (:func:`~specdec.verify.rules.sampling.keyed_uniforms`) instead of the
        verifier's ``generator``. ``hidden``: hidden states to keep from the forward, one
        row per tree node (a target with ``captures_hidden``). ``rule``: this sequence's
        decoding rule instead of the verifier's."""
        if not isinstance(tree, DraftTree):
            raise SpecdecTypeError(f"tree must be a DraftTree, got {type(tree).__name__}")
        if not isinstance(cache, KVCache):
            raise SpecdecTypeError(
                f"cache must be a specdec.cache.KVCache, got {type(cache).__name__}"
            )
        if tree.num_nodes == 0:
            raise VerifyError("empty tree: it needs at least the root")
        if root_token is not None:
            tree = tree.with_root(check_int(root_token, "root_token", 0, VerifyError))
        if int(tree.tokens[0]) < 0:
            raise VerifyError("the tree's root token is unset (-1): pass root_token")
        if (tree.tokens[: tree.num_real] < 0).any():
            raise VerifyError("tree tokens must be >= 0")
        timings: dict[str, float] = {}
        t0 = self._now()
        prefix = cache.committed_len
        # Only the arrays the forward reads (tree.to converts all seven).
        tokens = torch.from_numpy(tree.tokens.astype(np.int64, copy=False))
        positions = torch.from_numpy(tree.depths.astype(np.int64) + prefix)
        if self.device.type != "cpu":
            tokens, positions = tokens.to(self.device), positions.to(self.device)
        # A root alone sees the whole prefix: the causal step, no mask to build or check.
        single = tree.num_nodes == 1
        mask = None if single else torch.from_numpy(tree.attention_mask(prefix)).to(self.device)
        step_rule = _rule(rule, self.rule)
        tm = None if constraint is None else self._tree_mask(constraint, tree, tree.num_nodes)
        allowed = None if tm is None else LogitsMask(tm.bitmask.numpy())
        # A constrained step takes the target's argmax only where the target masked first.
        top = None if constraint is not None and tm is None else self._argmax_capture(step_rule)
        t1 = self._now()
        timings["mask"] = t1 - t0
        logits = self._forward(tokens, positions, cache, mask, hidden, top, allowed)
        t2 = self._now()
        timings["forward"] = t2 - t1
        try:
            n_real = tree.num_real
            empty = None
            if tm is not None:
                empty = tm.empty
                if allowed is not None and not allowed.applied:
                    apply_tree_mask(logits, tm)
            elif constraint is not None:
                empty = mask_tree_logits(logits, tree, constraint)
            if constraint is not None and not (allowed is not None and allowed.applied):
                top = None  # the target's argmax of unmasked logits
            chosen = np.zeros(tree.num_nodes, dtype=np.int64)
            u = None if seed is None else _node_uniforms([tree], [prefix], [seed])[0, :n_real]
            if top is not None and top.tokens is not None:
                chosen[:n_real] = top.tokens.numpy()[:n_real]
            else:
                picked = apply_rule(step_rule, logits[:n_real], self.generator, u)
                chosen[:n_real] = picked.cpu().numpy()
            t3 = self._now()
            timings["rule"] = t3 - t2
            # A root alone accepts nothing: its token is the bonus (the walk's answer).
            w = (
                WalkResult(np.empty(0, dtype=np.int64), int(chosen[0]), [])
                if single
                else walk(tree, chosen)
            )
            t4 = time.perf_counter()
            timings["walk"] = t4 - t3
            kept = w.kept_nodes()
            if empty is not None:
                check_bonus_allowed(empty, int(kept[-1]))
            cache.commit_tree(kept, tree.tokens[kept])
        except BaseException:
            if cache.pending:
                cache.rollback()
            raise
        timings["commit"] = self._now() - t4
        return StepResult(w.accepted, w.bonus_token, w.accepted_tokens, timings, logits)

    def _choose_rows(
        self,
        logits: torch.Tensor,
        uniforms: torch.Tensor | None,
        rules: Sequence[DecodingRule | None] | None,
        top: np.ndarray | None = None,
        masked: Sequence[bool] = (),
    ) -> np.ndarray:
        """Every node's chosen token ``[R, T]``: one rule call per distinct rule, over the
        rows of the sequences that follow it (their uniforms with them). ``top``: the
        target's argmax ``[R, T]``, taken as is for plain :class:`Greedy` rows whose logits
        no constraint masked (``masked[i]``)."""
        r, n, v = logits.shape
        out = np.empty((r, n), dtype=np.int64)
        groups: dict[int, tuple[DecodingRule, list[int]]] = {}
        for i in range(r):
            rule = _rule(None if rules is None else rules[i], self.rule)
            if top is not None and type(rule) is Greedy and not (masked and masked[i]):
                out[i] = top[i]
                continue
            groups.setdefault(id(rule), (rule, []))[1].append(i)
        for rule, rows in groups.values():
            if len(rows) == r:
                lg, u = logits.reshape(r * n, v), uniforms
            else:
                idx = torch.tensor(rows, device=logits.device)
                lg = logits.index_select(0, idx).reshape(len(rows) * n, v)
                u = None if uniforms is None else uniforms.view(r, n)[idx.cpu()].reshape(-1)
            picked = apply_rule(rule, lg, self.generator, u)
            out[rows] = picked.view(len(rows), n).cpu().numpy()
        return out

    def step_batch(
        self,
        trees: Sequence[DraftTree],
        caches: Sequence[KVCache],
        constraints: Sequence[Constraint | None] | None = None,
        seeds: Sequence[int | None] | None = None,
        *,
        hidden: HiddenCapture | None = None,
        rules: Sequence[DecodingRule | None] | None = None,
    ) -> list[StepResult]:
        """Verify R trees of R sequences in ONE target forward (trees padded to the largest,
        prefixes padded to the longest; needs a target with ``forward_batch``), then walk all
        in one Rust call and commit each cache. All or nothing: every cache reserves its step
        and checks its commit before any commits; on an error every cache is rolled back.
        Every result carries the batch's timings. ``constraints``: per sequence a matcher (or
        None), as in :meth:`step`; ``seeds``: per sequence a sampling seed (or None: the
        verifier's ``generator``), as in :meth:`step`; ``hidden``: as in :meth:`step`, ``[R,
        T, width]``; ``rules``: per sequence a decoding rule (or None: the verifier's), so
        requests with their own sampling settings share the forward."""
        fb = getattr(self.target, "forward_batch", None)
        if fb is None:
            raise SpecdecTypeError(f"{type(self.target).__name__} has no forward_batch: use step()")
        if len(trees) == 0 or len(trees) != len(caches):
            raise VerifyError(f"need one cache per tree: {len(trees)} trees, {len(caches)} caches")
        for tree, cache in zip(trees, caches, strict=True):
            if not isinstance(tree, DraftTree):
                raise SpecdecTypeError(f"trees must be DraftTree, got {type(tree).__name__}")
            if not isinstance(cache, KVCache):
                raise SpecdecTypeError(f"caches must be KVCache, got {type(cache).__name__}")
            if tree.num_nodes == 0 or int(tree.tokens[0]) < 0:
                raise VerifyError("every tree needs a root token (set it with with_root)")
        if len({id(c) for c in caches}) != len(caches):
            raise VerifyError("each sequence needs its own cache")
        if constraints is not None and len(constraints) != len(trees):
            raise VerifyError(
                f"need one constraint (or None) per tree: {len(trees)} trees, "
                f"{len(constraints)} constraints"
            )
        if seeds is not None and len(seeds) != len(trees):
            raise VerifyError(
                f"need one seed (or None) per tree: {len(trees)} trees, {len(seeds)} seeds"
            )
        if rules is not None and len(rules) != len(trees):
            raise VerifyError(
                f"need one rule (or None) per tree: {len(trees)} trees, {len(rules)} rules"
            )
        timings: dict[str, float] = {}
        t0 = self._now()
        prefix = [c.committed_len for c in caches]
        batch = batch_tree_inputs(trees, prefix, device=self.device)
        r, n = batch.tokens.shape
        # Each constrained tree's mask before the forward, for a target that masks its
        # logits itself (rows of other trees all ones).
        masks: list[TreeMask | None] = [None] * r
        allowed = None
        if constraints is not None and getattr(self.target, "masks_logits", False):
            vocab = int(self.target.vocab_size)
            words = np.full((r * n, (vocab + 31) // 32), -1, dtype=np.int32)
            for i, m in enumerate(constraints):
                if m is not None:
                    masks[i] = tm = tree_mask(m, trees[i], n, vocab)
                    words[i * n : (i + 1) * n] = tm.bitmask.numpy()
            if any(tm is not None for tm in masks):
                allowed = LogitsMask(words)
        top = None
        if any(
            type(_rule(None if rules is None else rules[i], self.rule)) is Greedy
            and (constraints is None or constraints[i] is None or allowed is not None)
            for i in range(len(trees))
        ):
            top = self._argmax_capture(Greedy())
        t1 = self._now()
        timings["mask"] = t1 - t0
        kw: dict[str, object] = {}
        if hidden is not None:
            kw["hidden"] = hidden
        if top is not None:
            kw["argmax"] = top
        if allowed is not None:
            kw["allowed"] = allowed
        logits = fb(batch.tokens, batch.positions, caches, batch.mask, **kw)
        t2 = self._now()
        timings["forward"] = t2 - t1
        try:
            r, n, v = logits.shape
            applied = allowed is not None and allowed.applied
            empties: list[np.ndarray | None] = []
            for i, m in enumerate(constraints or [None] * r):
                made = masks[i]
                if made is not None:
                    if not applied:
                        apply_tree_mask(logits[i], made)
                    empties.append(made.empty)
                else:
                    empties.append(None if m is None else mask_tree_logits(logits[i], trees[i], m))
            u = None
            if seeds is not None and any(sd is not None for sd in seeds):
                u = _node_uniforms(trees, prefix, seeds, n, self.generator).reshape(-1)
            chosen_np = self._choose_rows(
                logits,
                u,
                rules,
                None if top is None or top.tokens is None else top.tokens.numpy(),
                [m is not None and not applied for m in constraints or ()],
            )
            t3 = self._now()
            timings["rule"] = t3 - t2
            walks = walk_batch(trees, chosen_np)
            t4 = time.perf_counter()
            timings["walk"] = t4 - t3
            keeps = [w.kept_nodes() for w in walks]
            for i, (empty, keep) in enumerate(zip(empties, keeps, strict=True)):
                if empty is not None:
                    check_bonus_allowed(empty, int(keep[-1]), i)
            # All or nothing: every cache checks its commit before any of them commits.
            for cache, keep in zip(caches, keeps, strict=True):
                cache.check_commit(keep)
            for cache, keep, tree in zip(caches, keeps, trees, strict=True):
                cache.commit_tree(keep, tree.tokens[keep])
        except BaseException:
            for cache in caches:
                if cache.pending:
                    cache.rollback()
            raise
        timings["commit"] = self._now() - t4
        return [
            StepResult(w.accepted, w.bonus_token, w.accepted_tokens, dict(timings), logits[i])
            for i, w in enumerate(walks)
        ]
