"""Benchmarks run by ``specdec bench``: the Rust DDTree builder beside a plain-Python
implementation of the same algorithm (``heapq`` over rank tuples plus a numpy visibility
matrix, as the public DDTree reference does it), timed in the same process."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from functools import partial

import numpy as np

from .testing import SCALES, python_ddtree, synthetic_marginals
from .tree import DraftTree, build_ddtree, build_ddtree_batch


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


def _build_and_read(lp: np.ndarray, ids: np.ndarray, b: int, prefix: int, extra: str) -> None:
    _reads(build_ddtree(lp, ids, b), prefix, extra)


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

        tr, tl, td = (
            _time_us(partial(_build_and_read, lp, ids, b, prefix, x), min_time)
            for x in ("", "links", "dense")
        )
        tp = _time_us(partial(python_ddtree, lp, ids, b, prefix), min_time)
        rows.append(_row(dist, f"L=16, B={b}", tr, tl, td, tp))
    r, b = 32, 256
    lp, ids = synthetic_marginals(16, b, seed=7, batch=r, scale=SCALES["peaked"])
    budgets = np.full(r, b, dtype=np.int64)

    def rust_batch(extra: str) -> None:
        for t in build_ddtree_batch(lp, ids, budgets):
            _reads(t, prefix, extra)

    tr, tl, td = (_time_us(partial(rust_batch, x), min_time) for x in ("", "links", "dense"))

    def python_batch() -> None:
        for i in range(r):
            python_ddtree(lp[i], ids[i], b, prefix)

    tp = _time_us(python_batch, min_time)
    rows.append(_row("peaked", "R=32 x B=256 batch", tr, tl, td, tp))
    return "\n".join(rows)
