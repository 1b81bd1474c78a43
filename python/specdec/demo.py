"""``specdec demo``: speculative decoding on a real model, beside transformers.

SmolLM2-135M-Instruct (the GGUF the set-up installs) runs held-out prompts of three kinds
(write code, edit or repeat given text, answer a question) through transformers ``generate``
and through specdec, on the same weights and threads. For each engine it prints the
acceptance length (tokens per target forward), tokens/s and the speed-up over transformers'
autoregressive decoding, and checks that every greedy output is token-identical to
transformers'.

By default (:data:`DEFAULT_ENGINES`) it runs one prompt per kind through the engines that
matter: transformers autoregressive and prompt lookup, specdec autoregressive, the suffix
drafter with the adaptive budget, and the shipped block drafter combined with the suffix
drafter, adaptive budget too. Each engine is one generator that serves the prompts in turn,
as a server's does. ``engines=None`` (``specdec demo --full``) runs the whole
sweep: every prompt; chain, DDTree at several budgets and the adaptive budget, with the
suffix and n-gram drafters, and the shipped block drafter and Medusa heads when present.

With ``--json-schema FILE`` (:func:`run_json_schema_demo`) it runs constrained generation
instead: the schema compiled against SmolLM2's vocabulary masks every drafted tree node, and
specdec autoregressive and DDTree (suffix drafter, and the shipped block drafter when present)
must give the same greedy output, which must parse and validate against the schema.
"""

from __future__ import annotations

import functools
import json
import math
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from .demo_prompts import PROMPTS
from .errors import ConfigError

__all__ = ["DEFAULT_ENGINES", "DemoRun", "JsonSchemaRun", "run_demo", "run_json_schema_demo"]

#: The engines ``specdec demo`` runs by default (``--full``: every engine). transformers AR
#: always runs: its output is the reference.
DEFAULT_ENGINES = (
    "transformers AR",
    "transformers prompt lookup",
    "specdec AR",
    "suffix ddtree auto",
    "block+suffix ddtree auto",
)


@dataclass
class DemoRun:
    """One engine on one prompt."""

    kind: str
    prompt: int
    engine: str
    tokens: int
    seconds: float
    identical: bool
    accept_len: float = 1.0
    budget: int | None = None
    host_share: float | None = None  # host work per step over the target forward
    steps: int = 0
    tokens_per_step: list[int] = field(default_factory=list)
    speedup: float = 1.0

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def linears_label(target: Any) -> str:
    """How ``target``'s linear layers run, in words (for the logs)."""
    if not target.packed_linear:
        return "F.linear"
    if target.quantized is not None and target.quant_linear:
        return f"GGUF blocks (steps of <= {target.quant_max_rows} rows), packed oneDNN above"
    return "packed oneDNN"


def _hf_model(path: Path) -> Any:
    try:
        import transformers
        from transformers import AutoModelForCausalLM
    except ImportError as e:  # the demo extra
        raise ConfigError(
            "specdec demo runs transformers beside specdec: pip install 'specdec[demo]'"
        ) from e
    transformers.utils.logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    transformers.utils.logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    model = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    )
    return model.eval()  # type: ignore[no-untyped-call]


def _engines(
    vocab: int, budgets: Sequence[int], cost: Any
) -> list[tuple[str, int | None, Callable[[Any], Any]]]:
    """(name, budget, factory(target) -> SpeculativeGenerator) for every specdec setting."""
    from .decode import SpeculativeGenerator
    from .draft import NgramDrafter, SuffixDrafter

    out: list[tuple[str, int | None, Callable[[Any], Any]]] = [
        ("specdec AR", None, lambda t: SpeculativeGenerator(t, strategy="ar")),
        (
            "ngram chain 8",
            8,
            lambda t: SpeculativeGenerator(t, NgramDrafter(vocab, max_depth=8), budget=8),
        ),
        (
            "ngram auto",
            None,
            lambda t: SpeculativeGenerator(
                t,
                NgramDrafter(vocab, max_depth=32),
                budget="auto",
                max_budget=32,
                cost_model=cost,
            ),  # fmt: skip
        ),
        (
            "suffix chain 8",
            8,
            lambda t: SpeculativeGenerator(
                t, SuffixDrafter(max_depth=16), strategy="chain", max_depth=8
            ),
        ),
    ]

    def ddtree(b: int) -> Callable[[Any], Any]:
        return lambda t: SpeculativeGenerator(t, SuffixDrafter(max_depth=32), budget=b)

    for b in budgets:
        out.append((f"suffix ddtree B={b}", b, ddtree(b)))
    out.append(
        (
            "suffix ddtree auto",
            None,
            lambda t: SpeculativeGenerator(
                t,
                SuffixDrafter(max_depth=16),
                budget="auto",
                max_budget=max(budgets),
                cost_model=cost,
            ),  # fmt: skip
        )
    )
    return out + _trained_engines(budgets, cost)


def _trained_engines(
    budgets: Sequence[int], cost: Any
) -> list[tuple[str, int | None, Callable[[Any], Any]]]:
    """Chain, DDTree and adaptive engines for each drafter trained for SmolLM2 that this
    install ships (``specdec/draft/weights/``; none when absent)."""
    from .draft import BlockDrafter, MedusaDrafter
    from .draft.checkpoint import shipped_path
    from .errors import CheckpointError

    out: list[tuple[str, int | None, Callable[[Any], Any]]] = []
    for kind, cls in (("block", BlockDrafter), ("medusa", MedusaDrafter)):
        try:
            shipped_path(kind)
        except CheckpointError:
            continue
        loaded: dict[int, Any] = {}  # one drafter per target: it follows its requests
        mk = functools.partial(_trained_generator, cls=cls, loaded=loaded)
        out.append((f"{kind} chain", None, functools.partial(mk, strategy="chain")))
        for b in budgets:
            out.append((f"{kind} ddtree B={b}", b, functools.partial(mk, budget=b)))
        auto = functools.partial(mk, budget="auto", max_budget=max(budgets), cost_model=cost)
        out.append((f"{kind} ddtree auto", None, auto))
        if kind == "block":  # the block drafter's tree or the suffix index's, per step
            combined = functools.partial(
                _trained_generator, cls=cls, loaded=loaded, combined=True, budget="auto",
                max_budget=max(budgets), cost_model=cost,
            )  # fmt: skip
            out.append(("block+suffix ddtree auto", None, combined))
    return out


def _trained_generator(
    t: Any, *, cls: Any, loaded: dict[int, Any], combined: bool = False, **kw: Any
) -> Any:
    from .decode import SpeculativeGenerator
    from .draft import CombinedDrafter, SuffixDrafter

    if id(t) not in loaded:
        loaded[id(t)] = cls.shipped(t)
    d = loaded[id(t)]
    depth = getattr(d.config, "block_size", None) or d.config.num_heads
    if combined:
        d = CombinedDrafter(d, SuffixDrafter(max_depth=16), max_depth=depth)
    return SpeculativeGenerator(t, d, max_depth=depth, **kw)


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_demo(
    *,
    tokens: int = 128,
    prompts_per_kind: int | None = None,
    budgets: Sequence[int] = (4, 8, 16, 32),
    threads: int | None = None,
    repeats: int = 1,
    plot_dir: str | None = None,
    json_path: str | None = None,
    log: Callable[[str], None] = print,
    packed_linear: bool = True,
    engines: Sequence[str] | None = DEFAULT_ENGINES,
    progress: Callable[[str], None] = _stderr,
) -> list[DemoRun]:
    """Run the comparison; returns every run (and prints the tables through ``log``, what
    it is doing through ``progress``: standard error by default). ``engines``: the names
    of the engines to run (default :data:`DEFAULT_ENGINES`; None: every engine, with fixed
    budgets ``budgets``; the adaptive budget goes up to ``max(budgets)``); ``transformers
    AR`` always runs. ``prompts_per_kind``: None runs every prompt. With ``repeats`` > 1
    every engine runs that many times per prompt, interleaved with the others, and its
    fastest run counts (timing noise only ever slows a run down). ``packed_linear``: the
    model's :attr:`~specdec.models.llama.LlamaModel.packed_linear` (False: plain
    ``F.linear``, and not the GGUF blocks either)."""
    from .decode import CostModel, SpeculativeGenerator
    from .models import smollm2
    from .models.gguf import smollm2_path

    if threads is not None:
        torch.set_num_threads(threads)
    progress("loading SmolLM2-135M-Instruct into specdec and transformers")
    lm = smollm2()
    target, eos = lm.model, lm.eos_token_id
    target.packed_linear = packed_linear
    if packed_linear:
        target.release_plain_linears()  # the packed weights only: one copy, not two
    hf = _hf_model(smollm2_path())
    log(
        f"SmolLM2-135M-Instruct (GGUF Q4_1 -> float32), {torch.get_num_threads()} threads, "
        f"{platform.machine()}; {tokens} new tokens per prompt, greedy; specdec linears: "
        + linears_label(target)
    )
    progress("timing the target's forwards (the adaptive budget's cost model)")
    t0 = time.perf_counter()
    # Trees of up to max(budgets) drafted nodes and the root: no larger forward is timed.
    most = max(budgets) + 1
    cost = CostModel.calibrate(target, sizes=CostModel.ladder(most))
    log(
        f"cost model ({time.perf_counter() - t0:.1f} s): forward of n tokens / of 1 token: "
        + ", ".join(
            f"{n}: {cost(n) / cost(1):.2f}" for n in (2, 4, 5, 7, 8, 16, 32, 64) if n <= most
        )
    )
    specdec_engines = [
        e for e in _engines(target.vocab_size, budgets, cost) if engines is None or e[0] in engines
    ]
    lookup = engines is None or "transformers prompt lookup" in engines
    # Warm both sides up (first-call allocations) outside the timings.
    progress("warming up")
    warm = lm.encode_chat([{"role": "user", "content": "Hi"}])
    with torch.no_grad():
        hf.generate(torch.tensor([warm]), max_new_tokens=4, do_sample=False)
    SpeculativeGenerator(target, strategy="ar").generate(warm, max_new_tokens=4)

    runs: list[DemoRun] = []
    # One generator per engine serves every prompt in turn, as a server's does: the
    # adaptive budget keeps what earlier requests taught it (a drafter that does not pay
    # is judged once, not on every request).
    gens: dict[str, Any] = {}
    for kind, texts in PROMPTS.items():
        for i, text in enumerate(texts[:prompts_per_kind]):
            ids = lm.encode_chat([{"role": "user", "content": text}])
            best: dict[str, DemoRun] = {}
            for _ in range(repeats):  # interleaved; each engine's fastest run counts
                ref, hf_runs = _run_hf(hf, ids, tokens, eos, kind, i, lookup, progress)
                fresh = hf_runs
                for name, budget, make in specdec_engines:
                    gen = gens[name] if name in gens else gens.setdefault(name, make(target))
                    r = _run_specdec(gen, ids, tokens, eos, ref, kind, i, name, budget)
                    progress(_progress_line(r))
                    fresh.append(r)
                for r in fresh:
                    old = best.get(r.engine)
                    r.identical = r.identical and (old is None or old.identical)
                    if old is None or r.seconds < old.seconds:
                        best[r.engine] = r
                    elif not r.identical:
                        old.identical = False
            hf_runs = [best["transformers AR"]]
            runs += best.values()
            base = hf_runs[0].tok_s
            for r in runs:
                if r.kind == kind and r.prompt == i:
                    r.speedup = r.tok_s / base if base > 0 else math.nan
            _print_prompt(log, kind, i, text, [r for r in runs if r.kind == kind and r.prompt == i])
    _print_summary(log, runs)
    if json_path:
        Path(json_path).write_text(
            json.dumps(
                {
                    "model": "SmolLM2-135M-Instruct",
                    "threads": torch.get_num_threads(),
                    "new_tokens": tokens,
                    "cost_model": {"tokens": cost.tokens, "seconds": cost.seconds},
                    "runs": [asdict(r) | {"tok_s": r.tok_s} for r in runs],
                },
                indent=1,
            )
        )
        log(f"wrote {json_path}")
    if plot_dir:
        for f in _plot(runs, Path(plot_dir)):
            log(f"wrote {f}")
    return runs


def _run_specdec(
    gen: Any,
    ids: list[int],
    tokens: int,
    eos: int | None,
    ref: list[int],
    kind: str,
    i: int,
    name: str,
    budget: int | None,
) -> DemoRun:
    t0 = time.perf_counter()
    res = gen.generate(ids, max_new_tokens=tokens, eos_token_id=eos)
    dt = time.perf_counter() - t0
    host = sum(v for k, v in res.timings.items() if k not in ("forward", "prefill"))
    return DemoRun(
        kind, i, name, len(res.tokens), dt, res.tokens == ref,
        accept_len=res.acceptance_length, budget=budget,
        host_share=host / max(res.timings.get("forward", 0.0), 1e-12),
        steps=res.steps, tokens_per_step=[a + 1 for a in res.accepted],
    )  # fmt: skip


def _progress_line(r: DemoRun) -> str:
    same = "" if r.identical else ", NOT identical to transformers AR"
    return (
        f"[{r.kind} #{r.prompt}] {r.engine}: {r.tokens} tokens in {r.seconds:.1f} s "
        f"({r.tok_s:.1f} tok/s){same}"
    )


def _run_hf(
    hf: Any,
    ids: list[int],
    tokens: int,
    eos: int | None,
    kind: str,
    i: int,
    lookup: bool = True,
    progress: Callable[[str], None] = _stderr,
) -> tuple[list[int], list[DemoRun]]:
    """transformers greedy AR (the reference output) and, with ``lookup``, prompt lookup."""
    runs = []
    ref: list[int] = []
    settings: list[tuple[str, dict[str, Any]]] = [("transformers AR", {})]
    if lookup:
        settings.append(("transformers prompt lookup", {"prompt_lookup_num_tokens": 8}))
    for name, kw in settings:
        t0 = time.perf_counter()
        with torch.no_grad():
            out = hf.generate(
                torch.tensor([ids]), max_new_tokens=tokens, do_sample=False, eos_token_id=eos,
                pad_token_id=eos, **kw,
            )[0, len(ids):].tolist()  # fmt: skip
        dt = time.perf_counter() - t0
        if not ref:
            ref = out
        runs.append(DemoRun(kind, i, name, len(out), dt, out == ref))
        progress(_progress_line(runs[-1]))
    return ref, runs


def _print_prompt(
    log: Callable[[str], None], kind: str, i: int, text: str, runs: list[DemoRun]
) -> None:
    first = text.splitlines()[0]
    log(f"\n[{kind} #{i}] {first[:70]}{'...' if len(first) > 70 else ''}")
    head = f"{'tokens':>6} {'acc.len':>7} {'tok/s':>7} {'speed-up':>8} {'host':>6}  same"
    log(f"  {'engine':<28} {head}")
    for r in runs:
        host = "" if r.host_share is None else f"{100 * r.host_share:5.1f}%"
        log(
            f"  {r.engine:<28} {r.tokens:>6} {r.accept_len:>7.2f} {r.tok_s:>7.1f} "
            f"{r.speedup:>7.2f}x {host:>6}  {'yes' if r.identical else 'NO'}"
        )


def _geomean(xs: list[float]) -> float:
    xs = [x for x in xs if x > 0 and math.isfinite(x)]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else math.nan


def _print_summary(log: Callable[[str], None], runs: list[DemoRun]) -> None:
    kinds = list(dict.fromkeys(r.kind for r in runs))
    engines = list(dict.fromkeys(r.engine for r in runs))
    log("\nspeed-up over transformers AR (geometric mean over prompts), acceptance length:")
    log(f"  {'engine':<28} " + " ".join(f"{k:>14}" for k in kinds))
    for e in engines:
        cells = []
        for k in kinds:
            rs = [r for r in runs if r.engine == e and r.kind == k]
            acc = sum(r.accept_len for r in rs) / max(len(rs), 1)
            cells.append(f"{_geomean([r.speedup for r in rs]):>6.2f}x ({acc:4.2f})")
        log(f"  {e:<28} " + " ".join(f"{c:>14}" for c in cells))
    mismatched = [f"{r.engine} [{r.kind} #{r.prompt}]" for r in runs if not r.identical]
    log(
        "greedy outputs identical to transformers: "
        + ("all" if not mismatched else f"NOT for {', '.join(mismatched)}")
    )
    host = [r.host_share for r in runs if r.host_share is not None and r.engine != "specdec AR"]
    if host:
        log(
            f"host work per step (draft, build, mask, rule, walk, commit) over the target "
            f"forward: mean {100 * sum(host) / len(host):.2f}%, max {100 * max(host):.2f}%"
        )


def _plot(runs: list[DemoRun], out: Path) -> list[Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ConfigError("--plot needs matplotlib: pip install 'specdec[demo]'") from e
    out.mkdir(parents=True, exist_ok=True)
    files = []
    fig, ax = plt.subplots(figsize=(6, 4))
    for name in dict.fromkeys(r.engine for r in runs if r.tokens_per_step and "suffix" in r.engine):
        tps = [x for r in runs if r.engine == name for x in r.tokens_per_step]
        ax.hist(tps, bins=range(1, max(tps) + 2), alpha=0.4, label=name, density=True)
    ax.set_xlabel("tokens per target forward (acceptance length)")
    ax.set_ylabel("share of steps")
    ax.legend(fontsize=7)
    files.append(out / "acceptance_length.png")
    fig.tight_layout()
    fig.savefig(files[-1], dpi=120)
    plt.close(fig)
    kinds = list(dict.fromkeys(r.kind for r in runs))
    engines = list(dict.fromkeys(r.engine for r in runs))
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / max(len(engines), 1)
    for j, name in enumerate(engines):
        ys = [
            _geomean([r.speedup for r in runs if r.engine == name and r.kind == k]) for k in kinds
        ]
        ax.bar([x + j * width for x in range(len(kinds))], ys, width, label=name)
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(kinds))], kinds)
    ax.set_ylabel("speed-up over transformers AR")
    ax.legend(fontsize=6)
    files.append(out / "speedup.png")
    fig.tight_layout()
    fig.savefig(files[-1], dpi=120)
    plt.close(fig)
    fixed = {r.budget for r in runs if r.engine.startswith("suffix ddtree B=")} - {None}
    if not fixed:  # the default engines: adaptive budgets only
        return files
    fig, ax = plt.subplots(figsize=(6, 4))
    for kind in kinds:
        pts = sorted(
            (
                b,
                _geomean(
                    [
                        r.speedup
                        for r in runs
                        if r.kind == kind
                        and r.budget == b
                        and r.engine.startswith("suffix ddtree B=")
                    ]
                ),
            )
            for b in fixed
            if b is not None
        )
        ax.plot([b for b, _ in pts], [s for _, s in pts], marker="o", label=kind)
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("DDTree budget (drafted nodes), suffix drafter")
    ax.set_ylabel("speed-up over transformers AR")
    ax.legend()
    files.append(out / "speedup_vs_budget.png")
    fig.tight_layout()
    fig.savefig(files[-1], dpi=120)
    plt.close(fig)
    return files


@dataclass
class JsonSchemaRun(DemoRun):
    """One engine's constrained output: its text, and whether it is a complete JSON document
    the schema accepts (``valid``)."""

    text: str = ""
    valid: bool = False
    problem: str = ""
    grammar_tokens: int = 0  # accepted tokens the grammar drafted


def _json_engine(
    target: Any,
    make_drafter: Callable[[], Any],
    budget: int | str,
    max_depth: int,
    grammar: Any,
    grammar_drafts: bool,
    cost: Any,
) -> Any:
    """A constrained speculative generator for the JSON-schema demo."""
    from .decode import SpeculativeGenerator

    return SpeculativeGenerator(
        target,
        make_drafter(),
        budget=budget,  # type: ignore[arg-type]
        max_depth=max_depth,
        constraint=grammar,
        grammar_drafts=grammar_drafts,
        cost_model=cost,
    )


def _schema_problem(text: str, schema: Any, grammar: Any) -> str:
    """Why ``text`` is not a valid instance of ``schema`` ("" when it is): it must parse,
    be in the compiled grammar's language, and pass ``jsonschema`` when that is installed."""
    try:
        instance = json.loads(text)
    except ValueError as e:
        return f"not JSON ({e})"
    if not grammar.matches(text):
        return "outside the schema's grammar"
    try:
        import jsonschema  # type: ignore[import-untyped]
    except ImportError:
        return ""
    errors = list(jsonschema.Draft202012Validator(schema).iter_errors(instance))
    return f"jsonschema: {errors[0].message}" if errors else ""


def run_json_schema_demo(
    schema_path: str,
    *,
    tokens: int = 256,
    budgets: Sequence[int] = (8, 16),
    threads: int | None = None,
    whitespace: bool = False,
    log: Callable[[str], None] = print,
) -> list[JsonSchemaRun]:
    """Constrained greedy generation on SmolLM2 with the JSON Schema in ``schema_path``:
    specdec AR (constrained plain decoding, the reference) and DDTree with the suffix
    drafter and, when shipped, the block + suffix drafters, each under the adaptive budget
    without and with grammar drafts (:mod:`specdec.draft.grammar`), and with grammar drafts
    at each fixed budget of ``budgets``; the grammar masks every tree node. Prints each
    engine's tokens/s, acceptance length, the share of tokens the grammar drafted, whether
    its output equals AR's and whether it validates, and the JSON itself. ``whitespace``:
    let the model place whitespace freely (off: the compact ``", "``/``": "`` layout, which
    keeps a small model from padding forever)."""
    from .decode import CostModel, SpeculativeGenerator
    from .draft import BlockDrafter, CombinedDrafter, SuffixDrafter
    from .draft.checkpoint import shipped_path
    from .errors import CheckpointError
    from .models import smollm2

    try:
        schema = json.loads(Path(schema_path).read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"--json-schema {schema_path}: {e}") from None
    if threads is not None:
        torch.set_num_threads(threads)
    lm = smollm2()
    target, eos = lm.model, lm.eos_token_id
    vocab = lm.vocabulary()
    t0 = time.perf_counter()
    grammar = vocab.json_schema(schema, whitespace=whitespace)
    log(
        f"SmolLM2-135M-Instruct, {torch.get_num_threads()} threads; schema {schema_path} "
        f"compiled in {time.perf_counter() - t0:.2f} s ({grammar.num_rules} rules); "
        f"up to {tokens} new tokens, greedy, masks on every tree node"
    )
    prompt = "Reply with only a JSON document that follows this JSON Schema:\n" + json.dumps(
        schema, indent=1
    )
    ids = lm.encode_chat([{"role": "user", "content": prompt}])
    # One cost model for every adaptive engine (calibrating it is start-up work).
    cost = CostModel.calibrate(target, sizes=CostModel.ladder(33))
    engines: list[tuple[str, int | None, Callable[[], Any]]] = [
        (
            "specdec AR",
            None,
            lambda: SpeculativeGenerator(target, strategy="ar", constraint=grammar),
        ),
    ]
    drafters: list[tuple[str, Callable[[], Any], int]] = [
        ("suffix", lambda: SuffixDrafter(max_depth=32), 8)
    ]
    try:
        shipped_path("block")
        block = BlockDrafter.shipped(target)
        depth = block.config.block_size
        drafters.append(
            (
                "block+suffix",
                lambda: CombinedDrafter(block, SuffixDrafter(max_depth=32), max_depth=depth),
                depth,
            )
        )
    except CheckpointError:
        pass
    for name, make_drafter, max_depth in drafters:
        for gd in (False, True):
            sizes: list[int | str] = ["auto", *budgets] if gd else ["auto"]
            for b in sizes:
                label = f"{name} {'auto' if b == 'auto' else f'B={b}'}"
                engines.append(
                    (
                        label + (" +grammar" if gd else ""),
                        None if b == "auto" else int(b),
                        functools.partial(
                            _json_engine, target, make_drafter, b, max_depth, grammar, gd, cost
                        ),
                    )
                )
    # Warm-up: first-call allocations, and the grammar's masks along the answer (every
    # engine then finds them cached, as a server does after its first such request).
    engines[0][2]().generate(ids, max_new_tokens=tokens)
    stop = set(vocab.eos_ids) | ({eos} if eos is not None else set())
    runs: list[JsonSchemaRun] = []
    ref: list[int] | None = None
    for name, budget, make in engines:
        gen = make()
        t0 = time.perf_counter()
        res = gen.generate(ids, max_new_tokens=tokens, stop_tokens=sorted(stop))
        # Decoding alone: every engine prefills the same prompt the same way.
        dt = time.perf_counter() - t0 - res.timings.get("prefill", 0.0)
        body = [t for t in res.tokens if t not in stop]
        text = b"".join(vocab.token_bytes(t) or b"" for t in body).decode("utf-8", "replace")
        if ref is None:
            ref = res.tokens
        problem = _schema_problem(text, schema, grammar)
        if res.finish_reason == "length" and problem:
            problem = f"token limit reached ({problem})"
        runs.append(
            JsonSchemaRun(
                "json",
                0,
                name,
                len(res.tokens),
                dt,
                res.tokens == ref,
                accept_len=res.acceptance_length,
                budget=budget,
                steps=res.steps,
                tokens_per_step=[a + 1 for a in res.accepted],
                grammar_tokens=res.grammar_tokens,
                text=text,
                valid=not problem,
                problem=problem,
            )  # fmt: skip
        )
    base = runs[0].tok_s
    for r in runs:
        r.speedup = r.tok_s / base if base > 0 else math.nan
    log(
        f"\n{'engine':<28} {'tokens':>6} {'acc.len':>7} {'grammar':>7} {'tok/s':>7} "
        f"{'vs AR':>6}  same  valid"
    )
    for r in runs:
        share = r.grammar_tokens / r.tokens if r.tokens else 0.0
        log(
            f"{r.engine:<28} {r.tokens:>6} {r.accept_len:>7.2f} {share:>7.0%} {r.tok_s:>7.1f} "
            f"{r.speedup:>5.2f}x  {'yes' if r.identical else 'NO':<4}  "
            f"{'yes' if r.valid else 'NO: ' + r.problem}"
        )
    log(
        "(tok/s: decoding, after the prompt's prefill, which is the same for every engine; "
        "grammar: the share of tokens the grammar drafted; +grammar: grammar drafts on)"
    )
    log(f"\noutput (specdec AR):\n{runs[0].text}")
    same = all(r.identical for r in runs)
    log(f"greedy outputs identical to specdec AR: {'all' if same else 'NOT all'}")
    return runs
