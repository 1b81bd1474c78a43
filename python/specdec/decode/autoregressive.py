"""The baseline: one token per target forward, same model code, same rule."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

from ..protocols import KVCache, Target
from ..verify import DecodingRule, Greedy
from ..verify.rules.base import apply_rule
from ..verify.rules.sampling import keyed_uniforms
from .common import GenerationResult, emit, prompt_ids

__all__ = ["autoregressive_generate"]


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
    seed: int | None = None,
) -> GenerationResult:
    """The baseline: one token per target forward, same model code, same rule. ``seed``:
    seeded sampling keyed by position (the text a speculative generator given the same
    seed samples, whatever its drafter and budget), instead of ``generator``."""
    rule = rule if rule is not None else Greedy()
    ids = prompt_ids(prompt)
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
        u = None
        if seed is not None:  # the token sampled here lands at position start + len(feed)
            u = torch.from_numpy(keyed_uniforms(seed, [start + feed.numel()]))
        tok = int(apply_rule(rule, logits[-1:], generator, u)[0])
        t2 = time.perf_counter()
        cache.commit_fed(feed)
        res.timings["forward"] += t1 - t0
        res.timings["rule"] += t2 - t1
        res.timings["commit"] += time.perf_counter() - t2
        res.steps += 1
        done = emit(out, [tok], max_new_tokens, eos_token_id)
        if on_step is not None:
            on_step(ids + out, cache)
        if done:
            return res
        feed = torch.tensor([tok], dtype=torch.long, device=dev)
