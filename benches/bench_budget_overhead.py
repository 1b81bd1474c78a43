"""What ``budget="auto"`` costs per step besides the target forward, in the real loop:
SmolLM2-135M-Instruct with the shipped drafters, one held-out prompt, greedy, each
configuration at a fixed budget beside the adaptive one in the same process. Per step, the
host time (everything but the forward: draft, tree build and the budget's choice, mask,
rule, walk, commit and the loop's own Python) and, under auto, the in-loop median of the
budget's calls (``choose_among``, ``observe``) and of the tree cuts (``DraftTree.pruned``).
In the loop these run right after a target forward has evicted the caches, so they cost
several times what a microbenchmark of them says (``cargo bench --bench budget``).

Run: ``python benches/bench_budget_overhead.py`` (block, suffix and block + suffix on
code#0, 128 tokens, fastest of three; ~3 min on two cores). ``--drafters``, ``--prompt
KIND#I``, ``--tokens``, ``--budget`` (the fixed one, default 4), ``--repeats``;
``--smoke``: a tiny random model (a test that the script works, not a measurement).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch

from specdec.decode import AdaptiveBudget, CostModel, SpeculativeGenerator
from specdec.draft import BlockDrafter, CombinedDrafter, SuffixDrafter
from specdec.tree import DraftTree

TIMED = [(AdaptiveBudget, "choose_among"), (AdaptiveBudget, "observe"), (DraftTree, "pruned")]


def timing(calls: dict[str, list[float]]) -> Callable[[], None]:
    """Wrap the methods of ``TIMED`` to append each call's seconds; returns the undo."""
    saved = []
    for cls, name in TIMED:
        f = getattr(cls, name)
        saved.append((cls, name, f))

        def timed(*a: Any, _f: Any = f, _n: str = name, **k: Any) -> Any:
            t0 = time.perf_counter()
            out = _f(*a, **k)
            calls[_n].append(time.perf_counter() - t0)
            return out

        setattr(cls, name, timed)

    def undo() -> None:
        for cls, name, f in saved:
            setattr(cls, name, f)

    return undo


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--drafters", default="block,suffix,block+suffix")
    ap.add_argument("--prompt", default="code#0")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--budget", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.smoke:
        from specdec.testing import smoke_target

        target = smoke_target()
        block = BlockDrafter.for_target(target, block_size=6)
        ids, eos, args.tokens, args.repeats = [1, 2, 3, 4, 1, 2, 3], None, 12, 1
    else:
        from specdec.demo_prompts import PROMPTS
        from specdec.models import smollm2

        lm = smollm2()
        target, eos = lm.model, lm.eos_token_id
        block = BlockDrafter.shipped(target)
        kind, _, i = args.prompt.partition("#")
        ids = lm.encode_chat([{"role": "user", "content": PROMPTS[kind][int(i or 0)]}])
    el = block.config.block_size
    cost = CostModel.calibrate(target, sizes=CostModel.ladder(65))
    drafters: dict[str, Callable[[], Any]] = {
        "block": lambda: block,
        "suffix": lambda: SuffixDrafter(max_depth=16),
        "block+suffix": lambda: CombinedDrafter(block, SuffixDrafter(max_depth=16), max_depth=el),
    }
    print(
        "| drafter | budget | ms/step | host ms/step | choose_among us | observe us "
        "| pruned us/step | tokens/step |\n|---|---|---:|---:|---:|---:|---:|---:|"
    )
    for name in args.drafters.split(","):
        for budget in (args.budget, "auto"):
            best: tuple[float, ...] | None = None
            for _ in range(args.repeats):
                calls: dict[str, list[float]] = defaultdict(list)
                kw: dict[str, Any] = {"budget": budget}
                if budget == "auto":
                    kw.update(max_budget=64, cost_model=cost)
                gen = SpeculativeGenerator(target, drafters[name](), max_depth=el, **kw)
                fwd: list[float] = []
                step = gen.verifier.step

                def verify(*a: Any, _s: Any = step, _f: list[float] = fwd, **k: Any) -> Any:
                    out = _s(*a, **k)
                    _f.append(out.timings["forward"])
                    return out

                gen.verifier.step = verify  # type: ignore[method-assign]
                undo = timing(calls)
                try:
                    t0 = time.perf_counter()
                    res = gen.generate(
                        ids, max_new_tokens=args.tokens, stop_tokens=[eos] if eos else None
                    )
                    wall = time.perf_counter() - t0
                finally:
                    undo()
                n = len(fwd)
                med = {k: statistics.median(v) * 1e6 for k, v in calls.items() if v}
                row = (
                    wall,
                    wall / n * 1e3,
                    (wall - sum(fwd)) / n * 1e3,
                    med.get("choose_among", 0.0),
                    med.get("observe", 0.0),
                    sum(calls["pruned"]) / n * 1e6,
                    len(res.tokens) / n,
                )
                best = row if best is None or row[0] < best[0] else best
            assert best is not None
            auto = budget == "auto"
            print(
                f"| {name} | {budget} | {best[1]:.2f} | {best[2]:.2f} | "
                f"{f'{best[3]:.0f}' if auto else '-'} | {f'{best[4]:.0f}' if auto else '-'} | "
                f"{best[5]:.0f} | {best[6]:.2f} |"
            )


if __name__ == "__main__":
    main()
