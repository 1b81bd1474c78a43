"""Grammar drafts in process, and what any grammar drafter could reach: SmolLM2 answers
MaskBench JSON-Schema requests (the requests of ``bench_serve.py --maskbench``: the schema
in the grammar, the prompt asking for an example of what it describes), greedy, compact
separators, each configuration one generator serving the requests in turn, as a server does:

* ``plain``: constrained plain decoding (the reference: every other output must equal it);
* ``suffix``: the suffix drafter under ``budget="auto"``, no grammar drafts;
* ``tokenizer``: grammar drafts in the tokenizer's own spelling (``spellings=0``);
* ``learnt``: grammar drafts as shipped (the model's spelling, learnt as it serves);
* ``known-spelling``: a grammar drafter that knows how the model spells what the grammar
  forces (the bytes every path starts with), not which option it picks at a choice;
* ``bound``: a grammar drafter that knows the answer. Each step it drafts, as forced tokens,
  the model's own next tokens as far as they spell one of the grammar's byte paths from
  that state (the same paths the others see), so it never drafts a wrong spelling or a
  wrong choice. No drafter that reads the grammar can draft more of it, so its speed-up
  over ``suffix`` bounds what grammar drafts can add on these requests.

    python benches/bench_grammar_drafts.py --maskbench DIR [--limit 12] [--rounds 3]

``--mask-after`` adds ``plain``, ``suffix`` and ``learnt`` once more with the grammar's mask
applied after the forward (the target's ``masks_logits`` off), not in the LM head: what the
head's mask gives, in the same run.

Each round starts every configuration afresh (a new server); a configuration's time is its
fastest round's, over all requests (prefill and the grammar's masks included; the grammars
are compiled before). Prints a markdown table; ``--json PATH`` writes every figure.
``--smoke`` runs two small schemas for a few tokens (a test that the script works).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serve import SCHEMA_OF, maskbench_requests  # noqa: E402
from specdec.decode import CostModel, SpeculativeGenerator  # noqa: E402
from specdec.draft import SuffixDrafter  # noqa: E402
from specdec.draft.grammar import GrammarDraft, GrammarDrafts  # noqa: E402

CONFIGS = ("plain", "suffix", "tokenizer", "learnt", "known-spelling", "bound")

SMOKE_SCHEMAS = {
    "smoke-person": {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    },
    "smoke-flag": {
        "type": "object",
        "properties": {"kind": {"enum": ["alpha", "beta"]}, "ok": {"type": "boolean"}},
        "required": ["kind", "ok"],
    },
}


class KnownAnswer(GrammarDrafts):
    """The bounds' grammar drafter: knows the model's answer (``answer``, set per request)
    and drafts its next tokens as far as they spell one of the grammar's byte paths, or,
    with ``choices=False``, the bytes every path starts with (the model's spelling known,
    its choices not)."""

    def __init__(self, choices: bool = True) -> None:
        super().__init__()
        self.choices = choices
        self.answer: list[int] = []

    def draft(self, matcher: Any) -> GrammarDraft:
        if matcher.is_terminated():
            return GrammarDraft((), None, False)
        vocab = matcher.grammar.vocab
        pos = matcher.num_accepted
        paths = [
            (p.bytes, p.eos)
            for p in matcher.forced_paths(
                max_bytes=self.max_bytes,
                max_branches=self.max_branches,
                levels=self.levels,
                max_paths=self.max_paths,
            )
        ]
        if not self.choices and len(paths) > 1:
            paths = [(os.path.commonprefix([data for data, _ in paths]), False)]
        best: list[int] = []
        for data, eos in paths:
            off, out = 0, []
            for t in self.answer[pos:]:
                b = vocab.token_bytes(t)
                if b is None:  # EOS: where the path ends the text
                    if eos and off == len(data):
                        out.append(t)
                    break
                if data[off : off + len(b)] != b:
                    break
                out.append(t)
                off += len(b)
            best = max(best, out, key=len)
        best = best[: self.max_forced]
        ends = bool(best) and vocab.token_bytes(best[-1]) is None
        return GrammarDraft(tuple(best), None, ends)

    @staticmethod
    def respell(vocab: Any, forced: Sequence[int], written: Sequence[int]) -> tuple[int, ...]:
        return tuple(forced)  # already the model's own spelling


@dataclass
class Request:
    name: str
    prompt: list[int]
    grammar: Any


def requests(args: argparse.Namespace, lm: Any) -> list[Request]:
    vocab = lm.vocabulary()
    if args.smoke:
        named = [
            (n, s, f"Reply with a JSON document only. Write an example {n[6:]}.")
            for n, s in SMOKE_SCHEMAS.items()
        ]
    else:
        named = []
        for r in maskbench_requests(args.maskbench, args.limit):
            named.append((r.name, SCHEMA_OF[r.name], r.messages[0]["content"]))
    out = []
    for name, schema, text in named:
        grammar = vocab.json_schema(
            schema, whitespace=False, additional_properties=False, property_order="declared"
        )
        prompt = lm.encode_chat([{"role": "user", "content": text}])
        out.append(Request(name, prompt, grammar))
    return out


AFTER = " (mask after)"


def make(config: str, target: Any, cost: CostModel) -> tuple[SpeculativeGenerator, Any]:
    config = config.removesuffix(AFTER)
    if config == "plain":
        return SpeculativeGenerator(target, strategy="ar"), None
    drafts: GrammarDrafts | bool = False  # suffix: none
    if config == "tokenizer":
        drafts = GrammarDrafts(spellings=0)
    elif config == "learnt":
        drafts = True
    elif config == "known-spelling":
        drafts = KnownAnswer(choices=False)
    elif config == "bound":
        drafts = KnownAnswer()
    gen = SpeculativeGenerator(
        target,
        SuffixDrafter(max_depth=32),
        budget="auto",
        max_depth=8,
        grammar_drafts=drafts,
        cost_model=cost,
    )
    return gen, drafts


def run(args: argparse.Namespace) -> dict[str, Any]:
    from specdec.models import smollm2

    torch.set_num_threads(args.threads)
    lm = smollm2()
    target = lm.model
    reqs = requests(args, lm)
    cost = CostModel.calibrate(target, sizes=CostModel.ladder(33))
    stop = set(lm.vocabulary().eos_ids)
    # Warm-up: first-call allocations, and each grammar's masks along its answer (every
    # configuration then finds them cached, as a server does after its first such request).
    answers = []
    for r in reqs:
        gen, _ = make("plain", target, cost)
        res = gen.generate(
            r.prompt, max_new_tokens=args.max_tokens, constraint=r.grammar, stop_tokens=stop
        )
        answers.append(list(res.tokens))
    configs = list(CONFIGS)
    if args.mask_after:
        configs += [c + AFTER for c in ("plain", "suffix", "learnt")]
    rounds: dict[str, list[dict[str, float]]] = {c: [] for c in configs}
    for rnd in range(args.rounds):
        gens = {c: make(c, target, cost) for c in configs}
        tot = {c: {"seconds": 0.0, "tokens": 0, "steps": 0, "grammar": 0} for c in configs}
        for i, r in enumerate(reqs):
            for c in configs:
                gen, drafts = gens[c]
                if isinstance(drafts, KnownAnswer):
                    drafts.answer = answers[i]
                # An instance attribute over the class's: the verifier masks after the forward.
                target.masks_logits = not c.endswith(AFTER)
                t0 = time.perf_counter()
                try:
                    res = gen.generate(
                        r.prompt,
                        max_new_tokens=args.max_tokens,
                        constraint=r.grammar,
                        stop_tokens=stop,
                    )
                finally:
                    del target.masks_logits
                dt = time.perf_counter() - t0
                if list(res.tokens) != answers[i]:
                    raise SystemExit(f"{c} on {r.name}: output differs from plain decoding")
                t = tot[c]
                t["seconds"] += dt
                t["tokens"] += len(res.tokens)
                t["steps"] += res.steps
                t["grammar"] += res.grammar_tokens
        for c in configs:
            rounds[c].append(tot[c])
        line = "  ".join(f"{c} {tot[c]['tokens'] / tot[c]['seconds']:.1f}" for c in configs)
        print(f"round {rnd + 1}: tok/s {line}", file=sys.stderr, flush=True)
    best = {c: min(rounds[c], key=lambda t: t["seconds"]) for c in configs}
    return {
        "requests": [r.name for r in reqs],
        "answer_tokens": [len(a) for a in answers],
        "threads": torch.get_num_threads(),
        "max_tokens": args.max_tokens,
        "rounds": rounds,
        "best": best,
    }


def markdown(out: dict[str, Any]) -> str:
    best = out["best"]

    def rate(c: str) -> float:
        return float(best[c]["tokens"] / best[c]["seconds"])

    lines = [
        f"{len(out['requests'])} requests, {sum(out['answer_tokens'])} tokens, "
        f"{out['threads']} threads, fastest of {len(out['rounds']['plain'])} rounds",
        "",
        "| configuration | tok/s | tokens per step | drafted by the grammar "
        "| vs plain | vs suffix |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for c in best:
        b = best[c]
        share = b["grammar"] / b["tokens"] if b["tokens"] else math.nan
        lines.append(
            f"| {c} | {rate(c):.1f} | {b['tokens'] / b['steps']:.2f} | {share:.0%} "
            f"| {rate(c) / rate('plain'):.2f}x | {rate(c) / rate('suffix'):.2f}x |"
        )
    spread = {
        c: statistics.pstdev([t["tokens"] / t["seconds"] for t in out["rounds"][c]]) / rate(c)
        for c in best
    }
    lines += [
        "",
        "Spread of tok/s over rounds (stdev / best): "
        + ", ".join(f"{c} {v:.1%}" for c, v in spread.items()),
    ]
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--maskbench", type=Path, help="MaskBench schema files (maskbench/data)")
    ap.add_argument("--limit", type=int, default=12, help="MaskBench schemas taken")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path, help="write every figure here")
    ap.add_argument(
        "--mask-after",
        action="store_true",
        help="plain, suffix and learnt again with the mask applied after the forward",
    )
    ap.add_argument("--smoke", action="store_true", help="two small schemas, a few tokens")
    args = ap.parse_args(argv)
    if args.smoke:
        args.max_tokens, args.rounds, args.mask_after = 24, 1, True
    elif args.maskbench is None:
        ap.error("--maskbench DIR is required (or --smoke)")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    out = run(args)
    print(markdown(out))
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
