"""The trained drafters on SmolLM2-135M-Instruct: mean acceptance length and tokens/s of chain
versus DDTree at several budgets and the adaptive budget, for the block drafter, the Medusa
heads, the suffix drafter and block + suffix combined, greedy (every output checked
token-identical to transformers' ``generate``) and at temperature 1, on the demo's held-out
prompts; plus the two questions DDTree leaves open: what ``-inf`` marginals (tokens the
drafter bans: all but its top k per depth) do to acceptance, and how acceptance and speed
move with the budget.

Run: ``python benches/bench_drafters.py --json FILE`` (prints markdown tables: every
configuration per prompt kind and mode, then one compact table; needs the shipped weights,
or ``--block DIR`` / ``--medusa DIR``). ``--sample``: also at temperature 1 (transformers
``generate`` with ``do_sample=True, top_k=0, top_p=1``; every engine and budget, specdec's
with seeded sampling keyed by position, seed 0: all of them sample the same text, checked
token-identical to specdec AR's, so the t=1 columns compare speed on one text);
``--repeats N``: times are the fastest of N runs, made in N rounds over all of a prompt's
configurations (transformers': of N before and N after them); every run's seconds go to the
JSON, and the script prints the adaptive budget over the best fixed
configuration per drafter, prompt kind and mode, then the same with each run timed by the
fastest of only k of its rounds, for every k-round subset (how much of a miss the clock
makes: "best fixed" is the largest of several noisy figures), and the adaptive budget over
specdec AR, each configuration by its fastest round and then paired by round (each round's
ratio to the AR run of the same round, the median over the rounds; ``--auto-only`` runs just
that comparison); ``--from-json FILE``: the tables of a saved run; ``--plot DIR``:
acceptance and speed against the budget, one PNG per prompt kind and mode; ``--draft-vocab
full,auto,FILE``: the trained drafters once per draft vocabulary (``auto``: the checkpoint's
``draft_vocab.json`` when it has one, the default; ``full``: the whole vocabulary; a suffix
``@f32`` / ``@bf16`` sets the drafters' packed precision, default where the CPU runs
bfloat16 natively), named ``block[full]`` etc. when there are several.
``--warm``: one generator per configuration for the whole run (a serving process; the
adaptive budget starts each request with what the earlier ones taught it; the first
request of each configuration is cold);
``--min-match N``: the suffix drafters' ``min_match`` and the n-gram drafter's ``min_n``
(default: theirs, 3);
``--smoke``: a tiny random model, two prompts (a test that the script works, not a
measurement).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from itertools import combinations
from typing import Any

import torch

from specdec.decode import SpeculativeGenerator, autoregressive_generate
from specdec.draft import (
    BlockDrafter,
    CombinedDrafter,
    DraftRequest,
    MedusaDrafter,
    NgramDrafter,
    SuffixDrafter,
)
from specdec.verify.rules import Sampling

# The A/A control (--control): specdec's plain decoding run a second time, last in each round.
CONTROL = "plain again (A/A)"


@dataclass
class Row:
    prompt: str
    mode: str  # greedy / t=1
    drafter: str
    engine: str
    budget: str
    tokens: int
    seconds: float
    accept_len: float
    identical: bool | None
    # Every timed run's seconds, in round order (``seconds`` is their minimum): the noise
    # the adaptive-budget table's resampling reads (transformers': its N runs before and N after).
    rounds: list[float] = field(default_factory=list)

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


class Banned:
    """A drafter whose marginals keep only its top ``k`` tokens per depth (the rest -inf)."""

    def __init__(self, inner: Any, k: int) -> None:
        self.inner, self.k = inner, k
        self.hidden_layers = inner.hidden_layers
        self.hidden_final = inner.hidden_final
        self.vocab_size = inner.vocab_size

    def check_target(self, target: Any) -> None:
        self.inner.check_target(target)

    def add_request(
        self, request_id: int, prompt: Sequence[int], *, cache_salt: bytes | str | None = None
    ) -> None:
        self.inner.add_request(request_id, prompt, cache_salt=cache_salt)

    def remove_request(self, request_id: int, output: Sequence[int] | None = None) -> None:
        self.inner.remove_request(request_id, output)

    @property
    def num_requests(self) -> int:
        n: int = self.inner.num_requests
        return n

    def draft(self, requests: Sequence[DraftRequest], depth: int) -> torch.Tensor:
        x: torch.Tensor = self.inner.draft(requests, depth)
        kth = x.topk(self.k, -1).values[..., -1:]
        return x.masked_fill(x < kth, float("-inf"))


Factory = Callable[[Any, Any], SpeculativeGenerator]


def _factory(mk: Callable[[], Any], **kw: Any) -> Factory:
    """A generator factory (target, rule) drafting with a new ``mk()``, configured by ``kw``."""

    def make(target: Any, rule: Any) -> SpeculativeGenerator:
        return SpeculativeGenerator(target, mk(), rule=rule, **kw)

    return make


def engines(
    block: Any,
    medusa: Any,
    budgets: Sequence[int],
    cost: Any,
    *,
    vocab: int = 0,
    auto_only: bool = False,
    min_match: int | None = None,
) -> list[tuple[str, str, str, Factory]]:
    """(drafter, engine, budget label, factory(target, rule)); ``auto_only``: the adaptive
    budget alone per drafter, with the n-gram drafter too (``vocab``: its vocabulary), as
    ``specdec demo --full`` runs them; ``min_match``: the suffix drafters' ``min_match``
    and the n-gram drafter's ``min_n`` (None: their defaults)."""
    out: list[tuple[str, str, str, Factory]] = []

    def suffix() -> SuffixDrafter:
        return SuffixDrafter(max_depth=16, min_match=min_match)

    kinds: list[tuple[str, Callable[[], Any], int]] = [("suffix", suffix, 8)]
    if auto_only and vocab:
        kinds.insert(0, ("ngram", lambda: NgramDrafter(vocab, max_depth=32, min_n=min_match), 32))
    if block is not None:
        kinds.append(("block", lambda: block, block.config.block_size))
    if medusa is not None:
        kinds.append(("medusa", lambda: medusa, medusa.config.num_heads))
    if block is not None:
        el = block.config.block_size
        kinds.append(
            (
                "block+suffix",
                lambda: CombinedDrafter(block, suffix(), max_depth=el),
                el,
            )
        )
    for name, mk, depth in kinds:
        auto = _factory(
            mk, max_depth=depth, budget="auto", max_budget=max(budgets), cost_model=cost
        )
        if auto_only:
            out.append((name, "ddtree auto", "auto", auto))
            continue
        out.append(
            (name, f"chain {depth}", str(depth), _factory(mk, strategy="chain", max_depth=depth))
        )
        if name == "block" and depth > 4:  # the same depth as the Medusa heads
            out.append((name, "chain 4", "4", _factory(mk, strategy="chain", max_depth=4)))
        for b in budgets:
            out.append((name, f"ddtree B={b}", str(b), _factory(mk, max_depth=depth, budget=b)))
        out.append((name, "ddtree auto", "auto", auto))
    return out


def run(args: argparse.Namespace) -> list[Row]:
    torch.set_num_threads(args.threads)
    if args.smoke:
        from specdec.testing import smoke_target

        target = smoke_target()
        block = BlockDrafter.for_target(target, block_size=6)
        medusa = MedusaDrafter.for_target(target, num_heads=3)
        prompts = {"smoke#0": [1, 2, 3, 4], "smoke#1": [5, 6, 5, 6, 5]}
        eos = None
        hf = None
        # Every engine once, at two budgets and a few tokens: the script works, quickly.
        args.budgets, args.tokens = "4,8", min(args.tokens, 12)
    else:
        from specdec.demo import _hf_model
        from specdec.demo_prompts import PROMPTS
        from specdec.models import smollm2
        from specdec.models.gguf import smollm2_path

        lm = smollm2()
        target, eos = lm.model, lm.eos_token_id
        hf = None if args.no_transformers else _hf_model(smollm2_path())
        block = _trained(BlockDrafter, args.block, target, None)
        medusa = _trained(MedusaDrafter, args.medusa, target, None)
        prompts = {
            f"{kind}#{i}": lm.encode_chat([{"role": "user", "content": text}])
            for kind, texts in PROMPTS.items()
            if kind in args.kinds.split(",")
            for i, text in enumerate(texts[: args.prompts])
        }
    from specdec.decode import CostModel

    budgets = [int(b) for b in args.budgets.split(",")]
    sizes = [1, 4, 8, 16] if args.smoke else CostModel.ladder(max(budgets) + 1)
    cost = CostModel.calibrate(target, sizes=sizes)
    choices = args.draft_vocab.split(",")
    table = []
    for i, choice in enumerate(choices):
        # One drafter object per vocabulary (each keeps its own packed sub-head).
        vocab, _, prec = choice.partition("@")
        v = None if vocab == "full" else vocab
        bf16 = {"": None, "bf16": True, "f32": False}[prec]
        bv, mv = block, medusa
        if not args.smoke:
            bv = _trained(BlockDrafter, args.block, target, v, bf16)
            mv = _trained(MedusaDrafter, args.medusa, target, v, bf16)
        part = engines(
            bv,
            mv,
            budgets,
            cost,
            vocab=target.vocab_size,
            auto_only=args.auto_only,
            min_match=args.min_match,
        )
        if args.drafters:
            keep = set(args.drafters.split(","))
            part = [e for e in part if e[0] in keep]
        if len(choices) > 1:
            part = [
                (_label(name, choice), engine, label, make)
                for name, engine, label, make in part
                if name != "suffix" or i == 0  # the suffix drafter has no vocabulary
            ]
        table += part
    if (
        block is not None
        and not args.auto_only
        and (not args.drafters or "block-inf" in args.drafters)
    ):
        for k in (1, 4):
            table.append(
                (
                    f"block top-{k} (rest -inf)",
                    "ddtree B=32",
                    "32",
                    _factory(
                        functools.partial(Banned, block, k),
                        max_depth=block.config.block_size,
                        budget=32,
                    ),
                )
            )
    rows: list[Row] = []
    reps = max(1, args.repeats)

    def timed(fn: Callable[[], Any]) -> tuple[Any, list[float]]:
        """The first run's result and the seconds of each of ``reps`` runs."""
        out, secs = None, []
        for _ in range(reps):
            t0 = time.perf_counter()
            r = fn()
            secs.append(time.perf_counter() - t0)
            out = r if out is None else out
        return out, secs

    n = args.tokens
    stop = [eos] if eos is not None else None
    ref_t1: list[int] = []  # specdec AR's seeded t=1 text (its first configuration)
    warm: dict[tuple[int, bool], Any] = {}  # --warm: each configuration's generator
    for name, ids in prompts.items():
        for mode in ("greedy", "t=1"):
            if mode == "t=1" and not args.sample:
                continue
            if hf is not None:

                def hf_run(mode: str = mode, ids: list[int] = ids) -> list[int]:
                    kw: dict[str, Any] = {"do_sample": False}
                    if mode == "t=1":
                        torch.manual_seed(0)
                        kw = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0}
                    with torch.no_grad():
                        out = hf.generate(
                            torch.tensor([ids]), max_new_tokens=n, eos_token_id=eos,
                            pad_token_id=eos, **kw,
                        )  # fmt: skip
                    return list(out[0, len(ids) :].tolist())

                hf_toks, secs = timed(hf_run)
                if mode == "greedy":
                    ref = hf_toks
                rows.append(
                    Row(name, mode, "transformers", "AR", "-", len(hf_toks), min(secs), 1.0,
                        True if mode == "greedy" else None, secs)
                )  # fmt: skip
                hf_row = rows[-1]
            elif mode == "greedy":
                ref = autoregressive_generate(
                    target, ids, max_new_tokens=n, stop_tokens=stop
                ).tokens
            ar = ("specdec", "AR", "-", lambda t, r: SpeculativeGenerator(t, strategy="ar", rule=r))
            configs = [c for c in [ar, *table] if mode == "greedy" or "-inf" not in c[0]]
            if args.control:  # plain decoding again, last in each round: the A/A control
                again = (
                    CONTROL,
                    "AR",
                    "-",
                    lambda t, r: SpeculativeGenerator(t, strategy="ar", rule=r),
                )
                configs.append(again)
            rule = None if mode == "greedy" else Sampling(temperature=1.0)

            def spec_run(make: Any, rule: Any = rule, ids: list[int] = ids) -> Any:
                key = (id(make), rule is None)
                gen = warm.get(key) or make(target, rule)
                if args.warm:  # a serving process: one generator serves every request
                    warm[key] = gen
                # t=1: seeded sampling keyed by position, so every configuration samples
                # the same text (specdec AR's with seed 0) and only speed differs.
                return gen.generate(
                    ids, max_new_tokens=n, stop_tokens=stop, seed=0 if rule else None
                )

            # Repeats in rounds over all configurations (fastest round counts): a burst of
            # load slows one round of several configurations, not every run of one.
            first: list[Any] = [None] * len(configs)
            per_run: list[list[float]] = [[] for _ in configs]
            for _ in range(reps):
                for i, c in enumerate(configs):
                    t0 = time.perf_counter()
                    res = spec_run(c[3])
                    per_run[i].append(time.perf_counter() - t0)
                    first[i] = res if first[i] is None else first[i]
            for (drafter, engine, budget, _), res, ts in zip(configs, first, per_run, strict=True):
                acc = 1.0 if engine == "AR" else res.acceptance_length
                if mode == "t=1" and drafter == "specdec":
                    ref_t1 = res.tokens
                rows.append(
                    Row(name, mode, drafter, engine, budget, len(res.tokens), min(ts), acc,
                        res.tokens == (ref if mode == "greedy" else ref_t1), ts)
                )  # fmt: skip
                tm = getattr(res, "timings", None) or {}
                split = " ".join(
                    f"{k} {1e3 * v / max(len(res.tokens), 1):.1f}" for k, v in tm.items() if v
                )
                print(
                    f"{name} {mode} {drafter} {engine}: {rows[-1].accept_len:.2f} "
                    f"{rows[-1].tok_s:.1f} tok/s {rows[-1].identical}"
                    + (f"  [ms/token: {split}]" if split else ""),
                    flush=True,
                )
            if hf is not None:
                # The baseline again after the prompt's configurations, its time the fastest
                # of both: a burst of load on the shared machine during its first runs would
                # otherwise inflate every ratio of the prompt (this can only lower them).
                _, after = timed(hf_run)
                print(
                    f"{name} {mode} transformers AR: {hf_row.tokens / hf_row.seconds:.1f} tok/s "
                    f"before, {hf_row.tokens / min(after):.1f} after",
                    flush=True,
                )
                hf_row.seconds = min(hf_row.seconds, *after)
                hf_row.rounds += after
    return rows


def _trained(
    cls: Any, path: str | None, target: Any, vocab: str | None, bf16: bool | None = None
) -> Any:
    """A checkpoint (``path``) or the shipped weights with draft vocabulary ``vocab``."""
    if path:
        return cls.load(path, target, draft_vocab=vocab, bf16=bf16)
    try:
        return cls.shipped(target, draft_vocab=vocab, bf16=bf16)
    except Exception:  # noqa: BLE001 - a kind not shipped is left out of the tables
        return None


def _label(name: str, choice: str) -> str:
    """``block+suffix`` with vocabulary ``choice`` -> ``block[choice]+suffix``."""
    if name == "suffix":
        return name
    vocab, at, prec = choice.partition("@")
    tag = vocab if vocab in ("full", "auto") else vocab.rstrip("/").split("/")[-1]
    tag += at + prec
    head, _, tail = name.partition("+")
    return f"{head}[{tag}]" + (f"+{tail}" if tail else "")


def _kind(r: Row) -> str:
    """The prompt kind of a row (``code#1`` -> ``code``)."""
    return r.prompt.split("#")[0]


def summary(rows: list[Row]) -> str:
    """Markdown: per (prompt kind, mode, drafter, engine) mean acceptance length over prompts
    and tokens/s summed over prompts (total tokens / total seconds), against transformers AR
    of the same kind and mode."""

    keys = list(dict.fromkeys((_kind(r), r.mode, r.drafter, r.engine) for r in rows))
    out = [
        "| prompts | mode | drafter | engine | mean acceptance length | tok/s | "
        "vs transformers AR | identical (greedy: to transformers; t=1: to specdec AR) |",
        "|---|---|---|---|---:|---:|---:|---|",
    ]
    for k, mode, drafter, engine in keys:
        rs = [
            r for r in rows if (_kind(r), r.mode, r.drafter, r.engine) == (k, mode, drafter, engine)
        ]
        ar = [r for r in rows if (_kind(r), r.mode, r.drafter) == (k, mode, "transformers")]
        base = sum(r.tokens for r in ar) / sum(r.seconds for r in ar) if ar else float("nan")
        acc = sum(r.accept_len for r in rs) / len(rs)
        tps = sum(r.tokens for r in rs) / sum(r.seconds for r in rs)
        same = "-" if rs[0].identical is None else ("yes" if all(r.identical for r in rs) else "NO")
        cells = [k, mode, drafter, engine, f"{acc:.2f}", f"{tps:.1f}", f"{tps / base:.2f}x", same]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def pivot(rows: list[Row]) -> str:
    """Markdown, one row per (drafter, engine), one column per (prompt kind, mode): mean
    acceptance length / speed against transformers AR of that kind and mode."""

    cols = list(dict.fromkeys((_kind(r), r.mode) for r in rows))
    keys = list(dict.fromkeys((r.drafter, r.engine) for r in rows))
    out = [
        "| drafter | engine | " + " | ".join(f"{k} {m}" for k, m in cols) + " |",
        "|---|---|" + "---:|" * len(cols),
    ]
    for drafter, engine in keys:
        cells = [drafter, engine]
        for k, m in cols:
            rs = [
                r
                for r in rows
                if (_kind(r), r.mode, r.drafter, r.engine) == (k, m, drafter, engine)
            ]
            ar = [r for r in rows if (_kind(r), r.mode, r.drafter) == (k, m, "transformers")]
            if not rs or not ar:
                cells.append("")
                continue
            base = sum(r.tokens for r in ar) / sum(r.seconds for r in ar)
            acc = sum(r.accept_len for r in rs) / len(rs)
            tps = sum(r.tokens for r in rs) / sum(r.seconds for r in rs)
            cells.append(f"{acc:.2f} / {tps / base:.2f}x")
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


@dataclass(frozen=True)
class VsFixed:
    """One cell of the adaptive-budget table: its tokens/s over ``best``'s, the best
    fixed configuration; ``moved``: either one's t=1 text left specdec AR's."""

    ratio: float
    best: str
    moved: bool


def adaptive_ratios(
    rows: list[Row], keep: Sequence[int] | None = None
) -> dict[tuple[str, str, str], VsFixed]:
    """The adaptive budget per (prompt kind, mode, drafter) against its best
    fixed configuration (chain or DDTree budget; tokens over seconds summed over the
    prompts). ``keep``: time each run by the fastest of only these rounds (default: all)."""

    def secs(r: Row) -> float:
        if keep is None or not r.rounds:
            return r.seconds
        return min(r.rounds[i] for i in keep)

    groups: dict[tuple[str, str, str], dict[str, list[Row]]] = {}
    for r in rows:
        if r.drafter in ("transformers", "specdec", CONTROL) or "-inf" in r.drafter:
            continue
        groups.setdefault((_kind(r), r.mode, r.drafter), {}).setdefault(r.engine, []).append(r)
    out = {}
    for key, engines in groups.items():
        if "ddtree auto" not in engines or len(engines) < 2:
            continue
        speed = {
            e: sum(r.tokens for r in rs) / sum(secs(r) for r in rs) for e, rs in engines.items()
        }
        best = max((e for e in speed if e != "ddtree auto"), key=speed.__getitem__)
        moved = any(r.identical is False for e in (best, "ddtree auto") for r in engines[e])
        out[key] = VsFixed(speed["ddtree auto"] / speed[best], best, moved and key[1] != "greedy")
    return out


def vs_fixed(rows: list[Row], within: float = 0.05) -> str:
    """Markdown, one row per drafter, one column per (prompt kind, mode): the adaptive
    budget over the best fixed configuration (bold: more than ``within`` below it; ``*``:
    a t=1 text left specdec AR's by float rounding), then the count of cells within."""
    ratios = adaptive_ratios(rows)
    if not ratios:
        return ""
    cols = list(dict.fromkeys((k, m) for k, m, _ in ratios))
    drafters = list(dict.fromkeys(d for _, _, d in ratios))
    out = [
        "| drafter | " + " | ".join(f"{k} {m}" for k, m in cols) + " |",
        "|---|" + "---:|" * len(cols),
    ]
    for d in drafters:
        cells = []
        for k, m in cols:
            if (k, m, d) not in ratios:
                cells.append("")
                continue
            v = ratios[(k, m, d)]
            cell = f"{v.ratio:.3f}{'*' if v.moved else ''} ({v.best.removeprefix('ddtree ')})"
            cells.append(f"**{cell}**" if v.ratio < 1 - within else cell)
        out.append(f"| {d} | " + " | ".join(cells) + " |")
    xs = [v.ratio for v in ratios.values()]
    ok = sum(x >= 1 - within for x in xs)
    out.append("")
    out.append(
        f"Adaptive within {within:.0%} of the best fixed configuration: {ok} of {len(xs)} "
        f"cells; worst {min(xs):.3f}, mean {sum(xs) / len(xs):.3f}."
    )
    return "\n".join(out)


def vs_plain(rows: list[Row], floor: float = 0.97, *, paired: bool = False) -> str:
    """Markdown, one row per drafter, one column per (prompt kind, mode): the adaptive
    budget's tokens/s over specdec's own plain decoding (AR) on the same prompts (bold:
    below ``floor``), then the worst cell: speculation must never lose. ``paired``: the
    ratio per round instead (each run over the AR run of the same round, which ran minutes
    apart at most, tokens over seconds summed over the kind's prompts), the median over
    the rounds: the host's speed drifts by more than the gap being measured (one-row
    steps of 6.0 to 7.5 ms within a run), and the fastest round of each configuration
    can come from different phases."""
    plain: dict[tuple[str, str], list[Row]] = {}
    auto: dict[tuple[str, str, str], list[Row]] = {}
    for r in rows:
        if r.drafter == "specdec":
            plain.setdefault((_kind(r), r.mode), []).append(r)
        elif r.engine == "ddtree auto" or r.drafter == CONTROL:
            auto.setdefault((_kind(r), r.mode, r.drafter), []).append(r)
    if not plain or not auto:
        return ""
    n = rounds_run(rows) if paired else 0
    if paired and n < 2:
        return ""

    def speed(rs: list[Row], i: int | None = None) -> float:
        secs = (r.seconds if i is None else r.rounds[i] for r in rs)
        return sum(r.tokens for r in rs) / sum(secs)

    def ratio(a: list[Row], p: list[Row]) -> float:
        if not paired:
            return speed(a) / speed(p)
        per = sorted(speed(a, i) / speed(p, i) for i in range(n))
        return per[n // 2] if n % 2 else (per[n // 2 - 1] + per[n // 2]) / 2

    cols = list(plain)
    drafters = list(dict.fromkeys(d for _, _, d in auto))
    out = [
        "| drafter | " + " | ".join(f"{k} {m}" for k, m in cols) + " |",
        "|---|" + "---:|" * len(cols),
    ]
    xs: list[float] = []
    aa: list[float] = []
    for d in drafters:
        cells = []
        for k, m in cols:
            if (k, m, d) not in auto:
                cells.append("")
                continue
            x = ratio(auto[(k, m, d)], plain[(k, m)])
            (aa if d == CONTROL else xs).append(x)
            cells.append(f"**{x:.3f}**" if x < floor else f"{x:.3f}")
        out.append(f"| {d} | " + " | ".join(cells) + " |")
    out.append("")
    how = f", paired by round (median of {n})" if paired else ""
    if xs:
        out.append(
            f"Adaptive budget over specdec AR{how}: {sum(x >= floor for x in xs)} of {len(xs)} "
            f"cells at or above {floor}; worst {min(xs):.3f}."
        )
    if aa:  # what the clock alone does to a configuration identical to AR
        out.append(
            f"A/A control (plain decoding over itself{how}): {sum(x >= floor for x in aa)} of "
            f"{len(aa)} cells at or above {floor}; range {min(aa):.3f}-{max(aa):.3f}."
        )
    return "\n".join(out)


def rounds_run(rows: list[Row]) -> int:
    """The rounds every configuration ran (transformers' are twice as many)."""
    return min((len(r.rounds) for r in rows if r.drafter != "transformers"), default=0)


def resampled(rows: list[Row], k: int, within: float = 0.05) -> str:
    """How the adaptive-budget table depends on the clock: every run timed by the fastest
    of only ``k`` of its rounds, for every ``k``-round subset of them (the same rounds for
    every configuration of a prompt, as they ran side by side), the count of cells within
    ``within``; and each cell that is not within it under some subset."""
    n = rounds_run(rows)
    if not 0 < k < n:
        return ""
    subsets = list(combinations(range(n), k))
    counts: list[int] = []
    by_cell: dict[tuple[str, str, str], list[float]] = {}
    for keep in subsets:
        ratios = adaptive_ratios(rows, keep)
        counts.append(sum(v.ratio >= 1 - within for v in ratios.values()))
        for key, v in ratios.items():
            by_cell.setdefault(key, []).append(v.ratio)
    total = len(by_cell)
    out = [
        f"Fastest of {k} of the {n} rounds, over all {len(subsets)} such subsets: cells within "
        f"{within:.0%}: min {min(counts)}, median {sorted(counts)[len(counts) // 2]}, max "
        f"{max(counts)} of {total}; all {total} in {sum(c == total for c in counts)} of "
        f"{len(subsets)} subsets.",
    ]
    for (kd, m, d), xs in by_cell.items():
        bad = sum(x < 1 - within for x in xs)
        if bad:
            out.append(
                f"- {d}, {kd} {m}: below in {bad} of {len(xs)} subsets (ratio "
                f"{min(xs):.3f}-{max(xs):.3f})"
            )
    return "\n".join(out)


def plot(rows: list[Row], out: str) -> list[str]:
    """Per (prompt kind, mode) one PNG: mean acceptance length (left) and speed against
    transformers AR (right) against the DDTree budget, one line per drafter; its chain
    (dashed) and adaptive budget (a star at the right edge) beside it; specdec AR in grey."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def cell(rs: list[Row], base: float) -> tuple[float, float]:
        acc = sum(r.accept_len for r in rs) / len(rs)
        return acc, sum(r.tokens for r in rs) / sum(r.seconds for r in rs) / base

    os.makedirs(out, exist_ok=True)
    files = []
    for k, mode in dict.fromkeys((_kind(r), r.mode) for r in rows):
        here = [r for r in rows if (_kind(r), r.mode) == (k, mode)]
        ar = [r for r in here if r.drafter == "transformers"]
        if not ar:
            continue
        base = sum(r.tokens for r in ar) / sum(r.seconds for r in ar)
        budgets = sorted({int(r.budget) for r in here if r.engine.startswith("ddtree B=")})
        if not budgets:
            continue
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        right = budgets[-1] * 1.6
        drafters = [
            r.drafter for r in here if r.drafter not in ("transformers", "specdec", CONTROL)
        ]
        for i, drafter in enumerate(dict.fromkeys(drafters)):
            mine = [r for r in here if r.drafter == drafter]
            have = [b for b in budgets if any(r.engine == f"ddtree B={b}" for r in mine)]
            pts = [cell([r for r in mine if r.engine == f"ddtree B={b}"], base) for b in have]
            if not pts:
                continue
            color = f"C{i}"
            for ax, j in zip(axes, (0, 1), strict=True):
                ax.plot(have, [p[j] for p in pts], "o-", color=color, label=drafter)
                chains = [r for r in mine if r.engine.startswith("chain")]
                if chains:  # the drafter's longest chain
                    longest = max({r.engine for r in chains}, key=lambda e: int(e.split()[1]))
                    y = cell([r for r in chains if r.engine == longest], base)[j]
                    ax.axhline(y, color=color, ls="--", lw=0.8)
                auto = [r for r in mine if r.engine == "ddtree auto"]
                if auto:
                    ax.plot([right], [cell(auto, base)[j]], "*", color=color, ms=11)
        spec = [r for r in here if r.drafter == "specdec"]
        if spec:
            axes[1].axhline(cell(spec, base)[1], color="grey", lw=1.2, label="specdec AR")
        axes[1].axhline(1.0, color="black", lw=0.6)
        for ax, label in zip(
            axes, ("mean acceptance length", "tokens/s vs transformers AR"), strict=True
        ):
            ax.set_xscale("log", base=2)
            ax.set_xticks([*budgets, right], [*map(str, budgets), "auto"])
            ax.set_xlabel("DDTree budget (drafted nodes); dashed: chain")
            ax.set_ylabel(label)
        axes[1].legend(fontsize=7)
        fig.suptitle(f"{k} prompts, {mode}")
        fig.tight_layout()
        files.append(os.path.join(out, f"drafters_{k}_{mode.replace('=', '')}.png"))
        fig.savefig(files[-1], dpi=110)
        plt.close(fig)
    return files


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--budgets", default="4,8,16,32,64")
    ap.add_argument("--kinds", default="code,edit,qa", help="demo prompt kinds")
    ap.add_argument("--prompts", type=int, default=None, help="prompts per kind (default: all)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sample", action="store_true", help="also at temperature 1")
    ap.add_argument("--repeats", type=int, default=1, help="time: the fastest of N runs")
    ap.add_argument("--block", help="block drafter checkpoint directory (default: shipped)")
    ap.add_argument("--medusa", help="Medusa checkpoint directory (default: shipped)")
    ap.add_argument("--json", help="write every row here")
    ap.add_argument("--from-json", help="print the tables of an earlier --json run")
    ap.add_argument(
        "--drafters",
        help="only these drafters (comma list of suffix, block, medusa, block+suffix, "
        "block-inf for the banned-token rows; default: all)",
    )
    ap.add_argument(
        "--draft-vocab",
        default="auto",
        help="comma list: the trained drafters once per draft vocabulary (full, auto, files; "
        "@f32 / @bf16: their packed precision)",
    )
    ap.add_argument("--plot", help="write one PNG per prompt kind and mode into this folder")
    ap.add_argument(
        "--warm",
        action="store_true",
        help="one generator per configuration and mode for the whole run, as a serving "
        "process keeps it (the adaptive budget keeps what earlier requests taught it); "
        "default: a new generator per run",
    )
    ap.add_argument(
        "--auto-only",
        action="store_true",
        help="the adaptive budget alone per drafter (n-gram too), against specdec AR",
    )
    ap.add_argument(
        "--no-transformers",
        action="store_true",
        help="no transformers baseline (greedy outputs are checked against specdec's own AR)",
    )
    ap.add_argument(
        "--min-match",
        type=int,
        help="the suffix drafters' min_match and the n-gram drafter's min_n (default: theirs)",
    )
    ap.add_argument(
        "--control",
        action="store_true",
        help="plain decoding twice per round, first and last (the A/A control: how far the "
        "clock alone moves a ratio to plain; a row of its own in the tables against AR)",
    )
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    if args.from_json:
        with open(args.from_json) as f:
            rows = [Row(**{k: v for k, v in r.items() if k != "tok_s"}) for r in json.load(f)]
    else:
        # The machine's load around the run (the benchmark shares its cores): noise context.
        print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        rows = run(args)
        print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(summary(rows))
    print()
    print(pivot(rows))
    print()
    print(vs_fixed(rows))
    print()
    print(vs_plain(rows))
    if paired := vs_plain(rows, paired=True):
        print()
        print(paired)
    for k in range(1, rounds_run(rows)):
        print(resampled(rows, k))
    if args.plot:
        for path in plot(rows, args.plot):
            print(f"wrote {path}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(r) | {"tok_s": r.tok_s} for r in rows], f, indent=1)


if __name__ == "__main__":
    main()
