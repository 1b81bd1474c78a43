"""A/B of the adaptive budget's cost learning, in one process (one cost model, the same
machine state): per cell, the fixed budgets 4 and 8 and the chain, then ``budget="auto"``
with ``cost_weight=inf`` (the start-up cost model only) and with the default
``cost_weight`` (the steps' own forwards refine it). Tokens/s summed over the cell's two
prompts, each the fastest of ``--repeats`` runs; auto against the best fixed one.

Run: ``python benches/ab_cost_weight.py --cells bs:code:greedy,suffix:code:t1`` (drafter:
block, medusa, suffix, bs = block + suffix; prompts: code, edit, qa; mode: greedy, t1).
"""

from __future__ import annotations

import argparse
import math
import time
from collections import defaultdict
from typing import Any

import torch

from specdec.decode import AdaptiveBudget, CostModel, SpeculativeGenerator
from specdec.demo_prompts import PROMPTS
from specdec.draft import BlockDrafter, CombinedDrafter, MedusaDrafter, SuffixDrafter
from specdec.models import smollm2
from specdec.verify.rules import Sampling


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cells", default="bs:code:greedy,suffix:code:t1")
    ap.add_argument("--weight", type=float, default=AdaptiveBudget.cost_weight)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    lm = smollm2()
    target, eos = lm.model, lm.eos_token_id
    block, medusa = BlockDrafter.shipped(target), MedusaDrafter.shipped(target)
    cost = CostModel.calibrate(target, sizes=CostModel.ladder(65))
    drafters: dict[str, Any] = {
        "block": lambda: block,
        "medusa": lambda: medusa,
        "suffix": lambda: SuffixDrafter(max_depth=16),
        "bs": lambda: CombinedDrafter(block, SuffixDrafter(max_depth=16), max_depth=8),
    }
    weights = {"auto, cost_weight=inf": math.inf, f"auto, cost_weight={args.weight:g}": args.weight}
    print("| cell | best fixed | tok/s | " + " | ".join(weights) + " |")
    print("|---|---|---:|" + "---:|" * len(weights))
    for cell in args.cells.split(","):
        name, kind, mode = cell.split(":")
        rule = Sampling(temperature=1.0) if mode == "t1" else None
        depth = {"medusa": medusa.config.num_heads, "suffix": 8}.get(name, 8)
        auto = {"budget": "auto", "max_budget": 64, "cost_model": cost}
        configs: dict[str, dict[str, Any]] = {
            "chain": {"strategy": "chain"},
            "B=4": {"budget": 4},
            "B=8": {"budget": 8},
            **{k: auto for k in weights},
        }
        total: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        for text in PROMPTS[kind][:2]:
            ids = lm.encode_chat([{"role": "user", "content": text}])
            best: dict[str, tuple[float, int]] = {}
            for _ in range(args.repeats):  # rounds over every configuration
                for c, kw in configs.items():
                    d = drafters[name]()
                    gen = SpeculativeGenerator(target, d, max_depth=depth, rule=rule, **kw)
                    if c in weights:
                        gen.adaptive = AdaptiveBudget(cost, 64, cost_weight=weights[c])
                    t0 = time.perf_counter()
                    seed = 0 if rule else None
                    out = gen.generate(ids, max_new_tokens=args.tokens, stop_tokens=eos, seed=seed)
                    dt = time.perf_counter() - t0
                    if c not in best or dt < best[c][0]:
                        best[c] = (dt, len(out.tokens))
            for c, (dt, n) in best.items():
                total[c][0] += n
                total[c][1] += dt
        rate = {c: n / s for c, (n, s) in total.items()}
        fixed = max(("chain", "B=4", "B=8"), key=lambda c: rate[c])
        ratios = " | ".join(f"{rate[w] / rate[fixed]:.3f}" for w in weights)
        print(f"| {cell} | {fixed} | {rate[fixed]:.1f} | {ratios} |", flush=True)


if __name__ == "__main__":
    main()
