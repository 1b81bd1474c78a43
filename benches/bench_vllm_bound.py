"""What drafting could reach on ``bench_vllm.py``'s own outputs: an offline replay.

Greedy outputs do not depend on the drafts, so a proposer can be replayed without the model:
at each step it drafts from the known context, the draft is checked against the known
output, the request moves on by the accepted tokens plus one, and the step's time is the line
``bench_vllm.py`` fitted to vLLM's steps (a step's ms against the tokens it verified, read
from ``SuffixProposer``'s own timings at each batch size). The measured prefill and other
per-call time (plain decoding's measured seconds less its replayed steps) is added to every
proposer alike. Requests run as the bench runs them: one at a time, or a kind's prompts
cycled to a batch of 8 whose rows step together until each ends.

Proposers replayed:

- ``ngram``: vLLM's n-gram proposer as the bench configures it (the earliest earlier
  occurrence of the last 4 tokens, the 8 tokens after it);
- ``suffix``: specdec's :class:`~specdec.integrations.vllm.SuffixChains` with the bench's
  settings, its threshold from a :class:`~specdec.integrations.vllm.proposer.StepCosts` fed
  the replayed step times, as ``SuffixProposer`` runs it;
- ``bound``: a drafter that copies earlier text and always picks right. At each step it
  looks at every earlier occurrence of the context's last token (in the request's prompt
  and output, the warm-up's output and every finished output) and drafts exactly the
  longest continuation that agrees with the true output, at most 8 tokens. No drafter that
  copies earlier text (suffix decoding, n-gram or prompt lookup) accepts more or wastes
  less, so its figure bounds theirs (the replay exits 1 if a replayed drafter beats it).

Each is replayed with the corpus empty (``cold``) and warm from ``CORPUS_PROMPTS``' outputs
(``warm``). The printed figures are modelled tokens/s and their ratio to ``ngram``'s; the
measured ``ngram`` and ``suffix`` figures of the same JSON are printed beside them to show
how close the model is. Run (no vLLM needed)::

    .venv-vllm/bin/python benches/bench_vllm.py --parts speculation --json vllm.json
    python benches/bench_vllm_bound.py vllm.json
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specdec.integrations.vllm.proposer import StepCosts, SuffixChains

K = 8  # the longest draft, as in bench_vllm.py


def ngram_draft(ctx: Sequence[int], n: int = 4, k: int = K) -> list[int]:
    """vLLM's n-gram proposer with prompt_lookup_min = max = ``n``: the ``k`` tokens after
    the earliest earlier occurrence of the last ``n`` tokens."""
    if len(ctx) <= n:
        return []
    arr = np.asarray(ctx)
    suffix = arr[-n:]
    windows = np.lib.stride_tricks.sliding_window_view(arr[:-1], n)
    hits = np.nonzero((windows == suffix).all(axis=1))[0]
    if len(hits) == 0:
        return []
    start = int(hits[0]) + n
    return [int(t) for t in arr[start : start + k]]


class Proposer:
    """A replayed proposer: drafts for a request, learns what it committed, sees it end."""

    def draft(self, key: int, ctx: list[int], prompt_len: int, truth: list[int]) -> list[int]:
        return []

    def learn(self, key: int, committed: list[int]) -> None:
        pass

    def finish(self, key: int, output: list[int]) -> None:
        pass

    def step(self, fed: int, seconds: float, out: int) -> None:
        pass


class Ngram(Proposer):
    def draft(self, key: int, ctx: list[int], prompt_len: int, truth: list[int]) -> list[int]:
        return ngram_draft(ctx)


class Suffix(Proposer):
    def __init__(self, corpus: Sequence[list[int]]) -> None:
        # bench_vllm.py's SUFFIX settings and SuffixProposer's class defaults.
        self.chains = SuffixChains(max_tokens=K, min_prob=0.1, depth_factor=2.0)
        for seq in corpus:
            self.chains.drafter.add_corpus(seq)
        self.costs = StepCosts()

    def draft(self, key: int, ctx: list[int], prompt_len: int, truth: list[int]) -> list[int]:
        return self.chains.draft(key, ctx, prompt_len, K, self.costs.threshold())

    def learn(self, key: int, committed: list[int]) -> None:
        self.chains.learn(key, committed)

    def finish(self, key: int, output: list[int]) -> None:
        self.chains.finish(key)

    def step(self, fed: int, seconds: float, out: int) -> None:
        self.costs.add(fed, seconds, out)


class Bound(Proposer):
    def __init__(self, corpus: Sequence[list[int]]) -> None:
        self.corpus = [list(c) for c in corpus]
        self._flat = self._flatten()

    def _flatten(self) -> np.ndarray:
        parts: list[int] = []
        for c in self.corpus:
            parts += [-1, *c]
        return np.asarray([*parts, -1], dtype=np.int64)

    def draft(self, key: int, ctx: list[int], prompt_len: int, truth: list[int]) -> list[int]:
        if not truth:
            return []
        # The corpus, then the context, then padding: a continuation never runs past its own
        # text into another (-1 separates them), and one from inside the context may run on
        # into its last tokens, as a suffix index's does. The last token is not its own
        # earlier occurrence.
        arr = np.concatenate([self._flat, np.asarray(ctx, dtype=np.int64), [-1] * (K + 1)])
        cand = np.nonzero(arr[: len(self._flat) + len(ctx) - 1] == ctx[-1])[0]
        best = 0
        for j, want in enumerate(truth[:K]):
            cand = cand[arr[cand + 1 + j] == want]
            if len(cand) == 0:
                break
            best = j + 1
        return truth[:best]

    def finish(self, key: int, output: list[int]) -> None:
        self.corpus.append(list(output))
        self._flat = self._flatten()


@dataclass
class Cell:
    """One proposer on one kind at one batch size: tokens, modelled decode seconds, accepted
    and drafted tokens, steps."""

    tokens: int = 0
    seconds: float = 0.0
    accepted: int = 0
    drafted: int = 0
    steps: int = 0


@dataclass
class Replay:
    """A replay's inputs: the bench's requests (kind, prompt ids, output ids), the warm-up's
    output, CORPUS_PROMPTS' outputs and the fitted step line (ms) per batch size."""

    requests: list[tuple[str, list[int], list[int]]]
    warmup: list[int]
    corpus: list[list[int]]
    lines: dict[int, tuple[float, float]]
    kinds: list[str]


def batches(rp: Replay, batch: int) -> list[tuple[str, list[tuple[list[int], list[int]]]]]:
    """As bench_vllm.py runs them: each request alone, or a kind's cycled to ``batch``."""
    out: list[tuple[str, list[tuple[list[int], list[int]]]]] = []
    for kind in rp.kinds:
        items = [(p, o) for k, p, o in rp.requests if k == kind]
        if batch == 1:
            out += [(kind, [it]) for it in items]
        else:
            out.append((kind, [items[i % len(items)] for i in range(batch)]))
    return out


@dataclass
class _Row:
    key: int
    ctx: list[int]
    pos: int
    out: list[int]
    plen: int


def run_batch(
    prop: Proposer,
    items: list[tuple[list[int], list[int]]],
    line: tuple[float, float],
    key0: int,
    cell: Cell,
) -> None:
    """Rows step together: each drafts, verifies, commits; the step costs the line at the
    tokens verified; a row leaves when its output is done."""
    step_ms, token_ms = line
    rows = [_Row(key0 + j, [*p, o[0]], 1, o, len(p)) for j, (p, o) in enumerate(items)]
    live = [r for r in rows if r.pos < len(r.out)]
    while live:
        fed = committed = 0
        for r in live:
            out, pos = r.out, r.pos
            chain = prop.draft(r.key, r.ctx, r.plen, out[pos : pos + K])
            acc = 0
            while acc < len(chain) and pos + acc < len(out) and chain[acc] == out[pos + acc]:
                acc += 1
            took = out[pos : pos + acc + 1]
            prop.learn(r.key, took)
            r.ctx += took
            r.pos += len(took)
            fed += 1 + len(chain)
            committed += len(took)
            cell.accepted += acc
            cell.drafted += len(chain)
            if r.pos >= len(out):
                prop.finish(r.key, out)
        seconds = (step_ms + token_ms * fed) / 1e3
        prop.step(fed, seconds, committed)
        cell.seconds += seconds
        cell.steps += 1
        live = [r for r in live if r.pos < len(r.out)]
    cell.tokens += sum(len(o) for _, o in items)


def replay(rp: Replay, make: Callable[[], Proposer], batch: int) -> dict[str, Cell]:
    """One proposer over the bench's requests at ``batch``: the warm-up first (its output
    joins the corpus, as in the engine), then each kind in order."""
    prop = make()
    line = rp.lines[batch]
    run_batch(prop, [([], rp.warmup)], line, 0, Cell())
    cells: dict[str, Cell] = {}
    key = 1
    for kind, items in batches(rp, batch):
        run_batch(prop, items, line, key, cells.setdefault(kind, Cell()))
        key += len(items)
    return cells


def load(path: Path) -> tuple[Replay, list[dict[str, Any]]]:
    rows: list[dict[str, Any]] = json.loads(path.read_text())["speculation"]
    rec = next((r for r in rows if r["kind"] == "replay"), None)
    if rec is None:
        raise SystemExit(f"{path}: no replay row (run bench_vllm.py with plain at batch 1)")
    lines: dict[int, list[tuple[float, float]]] = {}
    for r in rows:
        if r["kind"] == "proposer cost" and r.get("token_ms") is not None:
            lines.setdefault(r["batch"], []).append((r["step_ms"], r["token_ms"]))
    if not lines:
        raise SystemExit(f"{path}: no fitted step line (run bench_vllm.py with suffix)")
    kinds = list(dict.fromkeys(q["kind"] for q in rec["requests"]))
    rp = Replay(
        [(q["kind"], q["prompt"], q["output"]) for q in rec["requests"]],
        rec["warmup"],
        rec["corpus"],
        {
            b: (float(np.mean([s for s, _ in v])), float(np.mean([t for _, t in v])))
            for b, v in lines.items()
        },
        kinds,
    )
    return rp, rows


def synthetic() -> tuple[Replay, list[dict[str, Any]]]:
    """A tiny made-up replay (``--smoke``): texts that repeat phrases of a small vocabulary."""
    rng = random.Random(0)
    phrases = [[rng.randrange(50) for _ in range(rng.randrange(2, 6))] for _ in range(12)]

    def text(n: int) -> list[int]:
        out: list[int] = []
        while len(out) < n:
            out += rng.choice(phrases) if rng.random() < 0.6 else [rng.randrange(50, 80)]
        return out[:n]

    reqs = [(k, text(12), text(30)) for k in ("a", "b") for _ in range(2)]
    lines = {1: (38.0, 1.4), 8: (38.5, 1.5)}
    return Replay(reqs, text(20), [text(30) for _ in range(4)], lines, ["a", "b"]), []


def rate(cells: dict[str, Cell], kinds: list[str], extra: dict[str, float]) -> float:
    """Tokens/s over ``kinds``: replayed seconds plus the measured time the replay leaves out."""
    return sum(cells[k].tokens for k in kinds) / sum(cells[k].seconds + extra[k] for k in kinds)


def measured(rows: list[dict[str, Any]], config: str, batch: int, kind: str | None) -> str:
    got = [r for r in rows if r["config"] == config and r["batch"] == batch and "tok_s" in r]
    got = [r for r in got if kind is None or r["kind"] == kind]
    if not got:
        return "-"
    return f"{sum(r['tokens'] for r in got) / sum(r['seconds'] for r in got):.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json", type=Path, nargs="?", help="bench_vllm.py --json output")
    ap.add_argument("--smoke", action="store_true", help="a tiny made-up replay")
    args = ap.parse_args()
    if args.smoke:
        rp, rows = synthetic()
    elif args.json is None:
        ap.error("give bench_vllm.py's JSON, or --smoke")
    else:
        rp, rows = load(args.json)
    warm = [rp.warmup]
    hot = [rp.warmup, *rp.corpus]
    makers: dict[str, Callable[[], Proposer]] = {
        "ngram": Ngram,
        "suffix cold": lambda: Suffix(warm),
        "suffix warm": lambda: Suffix(hot),
        "bound cold": lambda: Bound(warm),
        "bound warm": lambda: Bound(hot),
    }
    print(f"step lines (ms + ms per verified token): {rp.lines}")
    names = list(makers)
    print(
        "| batch | kind | plain | "
        + " | ".join(names)
        + " | "
        + " | ".join(f"{n} / ngram" for n in names[1:])
        + " | measured ngram | measured suffix |"
    )
    print("|---:|---|" + "---:|" * (2 * len(names) + 2))
    for batch in sorted(rp.lines):
        plain = replay(rp, Proposer, batch)
        # What the replay leaves out (prefill, per-call work): measured plain less replayed.
        extra: dict[str, float] = {}
        for k, c in plain.items():
            m = measured(rows, "plain", batch, k)
            extra[k] = max(c.tokens / float(m) - c.seconds, 0.0) if m != "-" else 0.0
        cells = {n: replay(rp, make, batch) for n, make in makers.items()}
        for kind in [*rp.kinds, "mix"]:
            ks = rp.kinds if kind == "mix" else [kind]
            figs = [rate(cells[n], ks, extra) for n in names]
            shown = [f"{rate(plain, ks, extra):.1f}", *(f"{f:.1f}" for f in figs)]
            shown += [f"{f / figs[0]:.2f}x" for f in figs[1:]]
            # The bound holds by construction; a replayed drafter above it is a bug here.
            for n, corpus in (("ngram", "cold"), ("suffix cold", "cold"), ("suffix warm", "warm")):
                if rate(cells[n], ks, extra) > rate(cells[f"bound {corpus}"], ks, extra) * 1.0001:
                    raise SystemExit(f"{n} above the bound at batch {batch}, {kind}")
            mk = None if kind == "mix" else kind
            shown += [measured(rows, "ngram", batch, mk), measured(rows, "suffix", batch, mk)]
            print(f"| {batch} | {kind} | " + " | ".join(shown) + " |")


if __name__ == "__main__":
    main()
