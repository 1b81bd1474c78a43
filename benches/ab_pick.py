"""How the adaptive budget should choose between a combined drafter's two candidate trees
(the block drafter's DDTree, the suffix index's tree): by the calibrated node values
(``AdaptiveBudget(pick="calibrated")``) or by the drafters' own expected acceptance, their
path probabilities summed (``pick="drafted"``, the default). Counterfactual, so free of the
clock: one generation per prompt with the adaptive budget records every step's candidates
and the values the budget put on them; the text it commits then says what any candidate
would have accepted at that step, since the verifier's token at a node depends only on the
node's path (greedy: the argmax; seeded sampling: the sample keyed by position), and a walk
accepts a candidate's nodes along the committed tokens (exact up to the committed length,
which covers every node a walk could have accepted but the last). Per cell: tokens the
steps would accept with every candidate cut to ``b`` nodes, picked by each rule, by always
the model or (when it has a tree) always the suffix index, and by an oracle.

Run: ``python benches/ab_pick.py`` (block + suffix on the demo's code, edit and qa prompts,
greedy and t=1, two prompts each, 128 tokens; ~3 min on two cores). ``--pick calibrated``
runs the generations with the other rule (the steps, and so the counts, move a little).
"""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Any

import numpy as np
import torch

from specdec import DraftTree
from specdec.decode import AdaptiveBudget, CostModel, SpeculativeGenerator
from specdec.demo_prompts import PROMPTS
from specdec.draft import BlockDrafter, CombinedDrafter, SuffixDrafter
from specdec.models import smollm2
from specdec.tree import walk
from specdec.verify.rules import Sampling

RULES = ("calibrated", "drafted", "model", "suffix", "oracle")


def accepts(tree: DraftTree, text: list[int], b: int) -> int:
    """How many of ``text``'s tokens the verifier walk accepts on ``tree`` cut to ``b``
    drafted nodes: the verifier's token at a node of depth ``d`` is ``text[d]`` (beyond the
    text, none)."""
    cut = tree.pruned(b)
    d = cut.depths[: cut.num_real]
    chosen = np.full(cut.num_real, -1, dtype=np.int64)
    known = d < len(text)
    chosen[known] = np.asarray(text, dtype=np.int64)[d[known]]
    return walk(cut, chosen).num_accepted


Step = tuple[int, list[DraftTree], list[np.ndarray], int]


def counts(steps: list[Step], text: list[int], size: int | None) -> Counter[str]:
    """Per rule, the tokens the recorded steps accept at ``size`` nodes a step (``None``:
    the size the budget chose at each step)."""
    out: Counter[str] = Counter()
    for pos, trees, values, chosen in steps:
        b = chosen if size is None else size
        got = [accepts(t, text[pos:], b) for t in trees]
        has_suffix = len(trees) > 1 and trees[1].num_real > 1
        by_value = [float(v[:b].sum()) for v in values]
        by_draft = [float(np.exp(t.logprobs[1 : min(b + 1, t.num_real)]).sum()) for t in trees]
        pick = {
            "calibrated": int(np.argmax(by_value)),  # the first of ties, as the budget
            "drafted": int(np.argmax(by_draft)),
            "model": 0,
            "suffix": 1 if has_suffix else 0,
            "oracle": int(np.argmax(got)),
        }
        for rule, j in pick.items():
            out[rule] += got[j]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kinds", default="code,edit,qa")
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--sizes", default="chosen,4,8", help="'chosen': the budget's size")
    ap.add_argument("--pick", default="drafted", choices=["drafted", "calibrated"])
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    lm = smollm2()
    target, eos = lm.model, lm.eos_token_id
    block = BlockDrafter.shipped(target)
    cost = CostModel.calibrate(target, sizes=CostModel.ladder(65))
    sizes = [None if b == "chosen" else int(b) for b in args.sizes.split(",")]
    labels = ["chosen" if b is None else str(b) for b in sizes]
    head = " | ".join(f"{r} @{b}" for b in labels for r in RULES)
    print(f"generations with pick={args.pick}\n\n| cell | steps | {head} |")
    print("|---|---:|" + "---:|" * (len(sizes) * len(RULES)))
    for kind in args.kinds.split(","):
        for mode in ("greedy", "t1"):
            rule = Sampling(temperature=1.0) if mode == "t1" else None
            total: Counter[str] = Counter()
            nsteps = 0
            for text in PROMPTS[kind][: args.prompts]:
                ids = lm.encode_chat([{"role": "user", "content": text}])
                comb = CombinedDrafter(block, SuffixDrafter(max_depth=16), max_depth=8)
                gen = SpeculativeGenerator(target, comb, max_depth=8, rule=rule, budget="auto",
                                           max_budget=64, cost_model=cost)  # fmt: skip
                ab = gen.adaptive = AdaptiveBudget(cost, 64, pick=args.pick)
                steps: list[Step] = []
                emitted: list[int] = []
                choose = ab.choose_among

                def record(cands: Any, ab: Any = ab, steps: Any = steps, em: Any = emitted,
                           choose: Any = choose) -> Any:  # fmt: skip
                    values = [ab.node_values(t) for t in cands[0]]
                    choice = choose(cands)
                    steps.append((len(em), list(cands[0]), values, choice.nodes))
                    return choice

                ab.choose_among = record  # type: ignore[method-assign,assignment]
                seed = 0 if rule else None
                gen.submit(ids, max_new_tokens=args.tokens, stop_tokens=eos, seed=seed)
                while gen.has_unfinished():
                    for out in gen.step():
                        emitted.extend(out.new_tokens)
                for b, label in zip(sizes, labels, strict=True):
                    for r, n in counts(steps, emitted, b).items():
                        total[f"{r} @{label}"] += n
                nsteps += len(steps)
            cells = " | ".join(str(total[f"{r} @{b}"]) for b in labels for r in RULES)
            print(f"| bs:{kind}:{mode} | {nsteps} | {cells} |", flush=True)


if __name__ == "__main__":
    main()
