"""Benchmarks run by ``specdec bench``: the Rust DDTree builder beside a plain-Python
implementation of the same algorithm (``heapq`` over rank tuples plus a numpy visibility
matrix, as the public DDTree reference does it), timed in the same process."""

from __future__ import annotations

import heapq
import statistics
import time
from collections.abc import Callable

import numpy as np

from .tree import DraftTree, build_ddtree, build_ddtree_batch

#: Logit scales of the synthetic drafters: mean top-1 probability about 0.19 ("flat", wide
#: shallow trees) and about 0.53 ("peaked", closer to a trained drafter, deeper trees).
SCALES = {"flat": 3.0, "peaked": 6.0}


def synthetic_marginals(
    depth: int,
    k: int,
    vocab: int = 8192,
    seed: int = 0,
    batch: int | None = None,
    scale: float = SCALES["flat"],
) -> tuple[np.ndarray, np.ndarray]:
    """Drafter-like marginals: log-softmax of random logits, top ``k`` per depth, sorted."""
    rng = np.random.default_rng(seed)
    shape = (depth, vocab) if batch is None else (batch, depth, vocab)
    logits = rng.normal(0.0, scale, size=shape).astype(np.float32)
    logits -= logits.max(-1, keepdims=True)
    lp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    ids = np.argsort(-lp, axis=-1, kind="stable")[..., :k]
    vals = np.take_along_axis(lp, ids, -1).astype(np.float32)
    return np.ascontiguousarray(vals), np.ascontiguousarray(ids.astype(np.int64))


def python_ddtree(
    logprobs: np.ndarray, token_ids: np.ndarray, budget: int, prefix_len: int = 0
) -> tuple[list[int], list[int], np.ndarray, np.ndarray]:
    """Plain-Python DDTree: heapq over rank tuples, then the visibility matrix and positions."""
    depth = logprobs.shape[0]
    k = min(budget, logprobs.shape[1])
    lp = logprobs[:, :k].tolist()
    ids = token_ids[:, :k].tolist()
    tokens, parents, depths = [-1], [-1], [0]
    counter = 0
    heap = [(-lp[0][0], counter, 0.0, (0,), 0)]
    while heap and len(tokens) <= budget:
        neg, _, base, ranks, parent = heapq.heappop(heap)
        score = -neg
        d = len(ranks) - 1
        node = len(tokens)
        tokens.append(ids[d][ranks[-1]])
        parents.append(parent)
        depths.append(d + 1)
        r = ranks[-1] + 1
        if r < k and lp[d][r] != float("-inf"):
            counter += 1
            heapq.heappush(heap, (-(base + lp[d][r]), counter, base, ranks[:-1] + (r,), parent))
        if d + 1 < depth and lp[d + 1][0] != float("-inf"):
            counter += 1
            heapq.heappush(heap, (-(score + lp[d + 1][0]), counter, score, ranks + (0,), node))
    n = len(tokens)
    visible = np.zeros((n, n), dtype=bool)
    for i in range(n):
        if parents[i] >= 0:
            visible[i] = visible[parents[i]]
        visible[i, i] = True
    positions = np.asarray(depths, dtype=np.int64) + prefix_len
    return tokens, parents, visible, positions


def _time_us(fn: Callable[[], object], min_time: float = 0.3, repeats: int = 5) -> float:
    """Median per-call time in microseconds over ``repeats`` batches of calls."""
    fn()
    n, t = 1, 0.0
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t = time.perf_counter() - t0
        if t >= min_time / repeats:
            break
        n *= 2
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        samples.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(samples)


def _reads(t: DraftTree, prefix: int, extra: str) -> None:
    """What a verifier reads each step: tokens, the bit-packed mask and positions; with
    ``extra`` also the walk's child links ("links") or a dense bool mask ("dense")."""
    t.tokens, t.ancestor_bits(), t.position_ids(prefix)
    if extra == "links":
        _ = t.first_child, t.next_sibling
    elif extra == "dense":
        t.attention_mask(prefix)


def _row(dist: str, case: str, tr: float, tl: float, td: float, tp: float) -> str:
    return (
        f"| {dist} | {case} | {tr:.1f} | {tl:.1f} | {td:.1f} | {tp:.1f} | {tp / tr:.0f}x "
        f"| {tp / td:.0f}x |"
    )


def bench_tree(quick: bool = False) -> str:
    """Markdown table: Rust vs Python DDTree build at L=16 over B, and a batch of 32."""
    min_time = 0.1 if quick else 0.5
    rows = [
        "| marginals | case | Rust tree+bits+positions (us) | + child links (us) | "
        "+ dense bool mask (us) | plain Python heapq+numpy (us) | speed-up (bits) | "
        "speed-up (dense) |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    prefix = 512
    for dist, b in [(d, b) for d in SCALES for b in (16, 64, 256, 1024)]:
        lp, ids = synthetic_marginals(16, b, seed=b, scale=SCALES[dist])
        ours = build_ddtree(lp, ids, b)
        ref_tokens, ref_parents, _, _ = python_ddtree(lp, ids, b)
        assert ours.tokens[1:].tolist() == ref_tokens[1:] and ours.parents.tolist() == ref_parents

        t_ours = [
            _time_us(
                lambda lp=lp, ids=ids, b=b, x=x: _reads(build_ddtree(lp, ids, b), prefix, x),
                min_time,
            )
            for x in ("", "links", "dense")
        ]
        tp = _time_us(lambda lp=lp, ids=ids, b=b: python_ddtree(lp, ids, b, prefix), min_time)
        rows.append(_row(dist, f"L=16, B={b}", *t_ours, tp))
    r, b = 32, 256
    lp, ids = synthetic_marginals(16, b, seed=7, batch=r, scale=SCALES["peaked"])
    budgets = np.full(r, b, dtype=np.int64)

    def rust_batch(extra: str) -> None:
        for t in build_ddtree_batch(lp, ids, budgets):
            _reads(t, prefix, extra)

    t_ours = [_time_us(lambda x=x: rust_batch(x), min_time) for x in ("", "links", "dense")]
    tp = _time_us(lambda: [python_ddtree(lp[i], ids[i], b, prefix) for i in range(r)], min_time)
    rows.append(_row("peaked", "R=32 x B=256 batch", *t_ours, tp))
    return "\n".join(rows)
