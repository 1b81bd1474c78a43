"""The baseline: one token per target forward, same model code, same rule."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

import torch

from ..protocols import ArgmaxCapture, KVCache, LogitsMask, Target
from ..tree import DraftTree
from ..verify import DecodingRule, Greedy
from ..verify.rules.base import apply_rule
from ..verify.rules.sampling import keyed_uniforms
from ..verify.verifier import apply_tree_mask, check_bonus_allowed, mask_tree_logits, tree_mask
from .common import (
    GenerationResult,
    check_fits,
    check_max_new_tokens,
    emit,
    new_matcher,
    prompt_ids,
    stop_set,
)

__all__ = ["autoregressive_generate"]

# Each call is one request: its id is unique in the process.
_request_ids = itertools.count()


def autoregressive_generate(
    target: Target,
    prompt: Sequence[int] | torch.Tensor,
    *,
    max_new_tokens: int,
    eos_token_id: Collection[int] | int | None = None,
    stop_tokens: Collection[int] | int | None = None,
    constraint: Any = None,
    rule: DecodingRule | None = None,
    generator: torch.Generator | None = None,
    cache: KVCache | None = None,
    on_step: Callable[[list[int], KVCache], None] | None = None,
    seed: int | None = None,
) -> GenerationResult:
    """The baseline: one token per target forward, same model code, same rule.

    ``stop_tokens`` (and ``eos_token_id``, one more stop token) end the request, included in
    its tokens; ``constraint``: a grammar (with ``.matcher()``) or a matcher whose state the
    request starts from: each step's logits are masked to the tokens it allows, as the
    speculative generator masks them (:class:`~specdec.NoAllowedTokens` when it allows none),
    and the request stops when the matcher is terminated; ``cache``: the cache to run in;
    ``seed``: seeded sampling keyed by position (the text a speculative generator given the
    same seed samples, whatever its drafter and budget), instead of ``generator``. The first
    forward feeds the whole prompt: its time is ``timings["prefill"]``."""
    t_start = time.perf_counter()
    ids = prompt_ids(prompt)
    max_new = check_max_new_tokens(max_new_tokens)
    check_fits(target, ids, max_new)
    vocab = target.vocab_size
    stops = stop_set(stop_tokens, eos_token_id, vocab)
    matcher = new_matcher(constraint)
    rule = rule if rule is not None else Greedy()
    out: list[int] = []
    res = GenerationResult(
        out,
        timings=dict.fromkeys(("prefill", "mask", "forward", "rule", "commit"), 0.0),
        request_id=next(_request_ids),
        prompt_len=len(ids),
    )
    if max_new == 0:
        res.finish_reason = "length"
        res.seconds = time.perf_counter() - t_start
        return res
    if cache is None:  # room for the whole generation, not the model's maximum
        cache = target.new_cache(len(ids) + max_new)
    dev = torch.device(target.device)
    feed = torch.tensor(ids, dtype=torch.long, device=dev)  # first step: the whole prompt
    last = ids[-1]
    # A plain greedy step takes the target's own argmax, where it computes one (as the
    # verifier does): no scan of the logits after the forward.
    # A target that masks its logits itself (``masks_logits``) gets a constrained step's
    # mask before the forward: its head skips what the grammar does not allow, and its
    # argmax is then the grammar's choice.
    masks = matcher is not None and getattr(target, "masks_logits", False)
    top = None
    if (
        type(rule) is Greedy
        and (matcher is None or masks)
        and getattr(target, "captures_argmax", False)
    ):
        top = ArgmaxCapture()
    while True:
        t0 = time.perf_counter()
        start = cache.committed_len
        pos = torch.arange(start, start + feed.numel(), device=dev)
        kw: dict[str, Any] = {}
        tm = allowed = None
        if matcher is not None and masks and feed.numel() == 1:
            tm = tree_mask(matcher, DraftTree([last], [-1]), 1, int(target.vocab_size))
            kw["allowed"] = allowed = LogitsMask(tm.bitmask.numpy())
        if top is not None:
            kw["argmax"] = top
        logits = target(feed, pos, cache, None, **kw)[-1:]
        t1 = time.perf_counter()
        if matcher is not None:  # the one-node tree of a plain step, masked as a tree step is
            if tm is not None:
                if allowed is None or not allowed.applied:
                    apply_tree_mask(logits, tm)
                empty = tm.empty
            else:
                empty = mask_tree_logits(logits, DraftTree([last], [-1]), matcher)
            check_bonus_allowed(empty, 0)
        t2 = time.perf_counter()
        u = None
        if seed is not None:  # the token sampled here lands at position start + len(feed)
            u = torch.from_numpy(keyed_uniforms(seed, [start + feed.numel()]))
        if (
            top is not None
            and top.tokens is not None
            and (matcher is None or (allowed is not None and allowed.applied))
        ):
            tok = int(top.tokens.numpy()[-1])
        else:
            tok = int(apply_rule(rule, logits, generator, u)[0])
        t3 = time.perf_counter()
        cache.commit_fed(feed)
        res.timings["prefill" if res.steps == 0 else "forward"] += t1 - t0
        res.timings["mask"] += t2 - t1
        res.timings["rule"] += t3 - t2
        res.timings["commit"] += time.perf_counter() - t3
        res.steps += 1
        done = emit(out, [tok], max_new, stops)
        if res.first_token_seconds is None:
            res.first_token_seconds = time.perf_counter() - t_start
        if matcher is not None:
            matcher.accept_token(tok)
            done = done or matcher.is_terminated()
        if on_step is not None:
            on_step(ids + out, cache)
        if done:
            stopped = tok in stops or (matcher is not None and matcher.is_terminated())
            res.finish_reason = "stop" if stopped else "length"
            res.seconds = time.perf_counter() - t_start
            return res
        feed = torch.tensor([tok], dtype=torch.long, device=dev)
        last = tok
