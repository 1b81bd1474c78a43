"""specdec inside vLLM (CPU backend, SmolLM2-135M-Instruct float32).

Speculation: vLLM plain, with its n-gram proposer (``ngram``: the documented 4-gram lookup;
``ngram2-5``: 2- to 5-grams, with ``--configs``), and with specdec's ``SuffixProposer``
(``suffix_decoding_max_spec_factor`` 2), the longest draft 8 tokens for both, on the demo's
prompt kinds (``specdec.demo_prompts``: code, edit, qa), greedy, one request at a time and
in batches of 8 (a kind's prompts cycled to 8 requests). A fresh engine per proposer and
batch size, warmed up with one unmeasured prompt that is not measured later. So ``suffix``
starts with an empty corpus; ``suffix-warm`` is the same proposer after the engine has
answered ``CORPUS_PROMPTS`` (40 other prompts of the same kinds, unmeasured, in batches of
8): a server that has been up for a while. The n-gram proposer keeps nothing between
requests. Figures: output tokens/s (tokens over the wall time of
``generate``), acceptance (accepted / drafted tokens, vLLM's own counters), whether every
output equals vLLM's plain one, and the proposer's own cost per request per step.

Grammars: JSON-schema requests (four schemas, two prompts each) through vLLM's structured
outputs with its xgrammar and guidance backends (compact JSON: ``disable_any_whitespace``)
and through specdec's ``GrammarLogitsProcessor``, one at a time and in a batch of 8: tokens/s
and the mask time per step (vLLM: filling the bitmasks and advancing the matchers in the
scheduler plus applying them in the worker; specdec: the processor's ``update_state`` and
``apply``), and how many outputs validate (jsonschema). Each schema is compiled in an
unmeasured warm-up first.

Every engine runs in a child process of its own (vLLM's CPU platform fails to set up a
second engine in a process once its n-gram proposer has loaded numba), ``--repeats`` times
in alternating order; each cell keeps its fastest repeat (a shared machine's bursts of load
land on different configs each time; every repeat's figure is in the JSON).

Run it with vLLM's venv (``make test-vllm`` makes one)::

    .venv-vllm/bin/python benches/bench_vllm.py [--max-tokens 128] [--repeats 2] [--json F]

It re-executes itself with LD_PRELOAD set to tcmalloc and libiomp5 when present (vLLM's CPU
backend expects them); the engines run in-process in their child (so the proposer's and the
processor's own figures can be read).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from specdec.demo_prompts import CORPUS_PROMPTS, PROMPTS

WARMUP = "Explain in two sentences what a hash map is."
K = 8  # the longest draft of both proposers

SCHEMAS: list[tuple[str, dict[str, Any], list[str]]] = [
    (
        "person",
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 30},
                "age": {"type": "integer", "minimum": 0, "maximum": 120},
                "city": {"type": "string", "maxLength": 30},
            },
            "required": ["name", "age", "city"],
            "additionalProperties": False,
        },
        ["Describe a fictional person as JSON.", "Give a JSON record for Ann, 31, from Oslo."],
    ),
    (
        "order",
        {
            "type": "object",
            "properties": {
                "id": {"type": "integer"},
                "items": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"},
                            "qty": {"type": "integer", "minimum": 1, "maximum": 99},
                        },
                        "required": ["sku", "qty"],
                        "additionalProperties": False,
                    },
                    "minItems": 1,
                    "maxItems": 4,
                },
                "paid": {"type": "boolean"},
            },
            "required": ["id", "items", "paid"],
            "additionalProperties": False,
        },
        ["Write a shop order as JSON.", "An order of two books and a pen, as JSON."],
    ),
    (
        "event",
        {
            "type": "object",
            "properties": {
                "title": {"type": "string", "maxLength": 40},
                "date": {"type": "string", "pattern": "^20[0-9]{2}-[01][0-9]-[0-3][0-9]$"},
                "kind": {"enum": ["meeting", "party", "talk", "trip"]},
                "attendees": {
                    "type": "array",
                    "items": {"type": "string", "maxLength": 20},
                    "maxItems": 4,
                },
            },
            "required": ["title", "date", "kind", "attendees"],
            "additionalProperties": False,
        },
        ["Describe a team meeting as JSON.", "A birthday party next spring, as JSON."],
    ),
    (
        "review",
        {
            "type": "object",
            "properties": {
                "product": {"type": "string", "maxLength": 30},
                "stars": {"type": "integer", "minimum": 1, "maximum": 5},
                "pros": {
                    "type": "array",
                    "items": {"type": "string", "maxLength": 30},
                    "maxItems": 3,
                },
                "summary": {"type": "string", "maxLength": 80},
            },
            "required": ["product", "stars", "pros", "summary"],
            "additionalProperties": False,
        },
        ["Review a pair of headphones as JSON.", "A short JSON review of a coffee machine."],
    ),
]


def vllm_env(threads: int, kv_gib: int) -> dict[str, str]:
    """What vLLM's CPU backend reads: the platform, KV cache GiB, threads without pinning;
    the engine in this process (so the bench can read the proposer's and the processor's
    state and time the scheduler's grammar work)."""
    return {
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_CPU_KVCACHE_SPACE": str(kv_gib),
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "OMP_NUM_THREADS": str(threads),
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_NO_USAGE_STATS": "1",
    }


def preload() -> str:
    """tcmalloc (Debian's libtcmalloc-minimal4) and Intel's OpenMP (in the venv), those
    present."""
    found = [
        p
        for p in (
            Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"),
            Path(sys.prefix) / "lib" / "libiomp5.so",
        )
        if p.exists()
    ]
    return ":".join(str(p) for p in found)


def model_dir(arg: Path | None) -> Path:
    if arg is not None:
        return arg
    from specdec.integrations.vllm import export_smollm2

    out = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "specdec" / "smollm2-hf"
    return out if (out / "config.json").exists() else export_smollm2(out)


class Engine:
    """One vLLM engine, closed on exit."""

    def __init__(self, model: Path, **kwargs: Any) -> None:
        from vllm import LLM

        self.llm = LLM(
            model=str(model),
            dtype="float32",
            enforce_eager=True,
            max_model_len=2048,
            max_num_seqs=8,
            seed=0,
            disable_log_stats=False,
            **kwargs,
        )
        self.tokenizer = self.llm.get_tokenizer()

    def chat(self, message: str) -> str:
        """``message`` as the model's chat prompt."""
        text = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": message}], tokenize=False, add_generation_prompt=True
        )
        return str(text)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.llm.llm_engine.engine_core.shutdown()
        del self.llm
        import gc

        gc.collect()

    def counter(self, name: str) -> float:
        return sum(float(m.value) for m in self.llm.get_metrics() if m.name == name)

    def runner(self) -> Any:
        return self.llm.collective_rpc(lambda worker: worker.model_runner)[0]

    def generate(self, messages: list[str], params: Any) -> tuple[float, list[Any]]:
        """Wall seconds and outputs of one ``generate`` call over ``messages``."""
        prompts = [self.chat(m) for m in messages]
        params_list = params if isinstance(params, list) else [params] * len(prompts)
        t0 = time.perf_counter()
        outs = self.llm.generate(prompts, params_list, use_tqdm=False)
        return time.perf_counter() - t0, outs


def greedy(max_tokens: int) -> Any:
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=max_tokens)


def batches(kind: str, batch: int) -> list[list[str]]:
    """The measured calls of one kind: each prompt alone, or the kind's prompts cycled to
    one batch of ``batch``."""
    prompts = PROMPTS[kind]
    if batch == 1:
        return [[p] for p in prompts]
    return [[prompts[i % len(prompts)] for i in range(batch)]]


SUFFIX = {
    "method": "custom_class",
    "model": "specdec.integrations.vllm.SuffixProposer",
    "num_speculative_tokens": K,
    "suffix_decoding_max_spec_factor": 2.0,
}
CONFIGS: dict[str, dict[str, Any] | None] = {
    "plain": None,
    # vLLM's documented n-gram set-up (4-gram lookup), with the same longest draft.
    "ngram": {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": 4},
    # A looser lookup (2- to 5-grams): more drafts, less acceptance.
    "ngram2-5": {
        "method": "ngram",
        "num_speculative_tokens": K,
        "prompt_lookup_min": 2,
        "prompt_lookup_max": 5,
    },
    "suffix": SUFFIX,
    # The same proposer, its corpus warm from CORPUS_PROMPTS' outputs.
    "suffix-warm": SUFFIX,
}
WARM_CORPUS = {"suffix-warm"}


def answer_corpus(eng: Engine, max_tokens: int) -> list[list[int]]:
    """``CORPUS_PROMPTS`` through ``eng`` in batches of 8, unmeasured: their outputs' ids."""
    earlier = [m for ms in CORPUS_PROMPTS.values() for m in ms]
    outs: list[list[int]] = []
    for i in range(0, len(earlier), 8):
        outs += [
            list(o.outputs[0].token_ids)
            for o in eng.generate(earlier[i : i + 8], greedy(max_tokens))[1]
        ]
    return outs


def speculation_unit(
    model: Path, max_tokens: int, batch: int, name: str, spec: dict[str, Any] | None
) -> list[dict[str, Any]]:
    """One engine (``spec``: its speculative config, None for plain) at one batch size: a
    row per prompt kind, its outputs' token ids included, and the proposer's own cost. Plain
    decoding one request at a time also gives a ``replay`` row for ``bench_vllm_bound.py``: every
    prompt's and output's token ids, the warm-up's, and (answered after the measured
    prompts) ``CORPUS_PROMPTS``'."""
    rows: list[dict[str, Any]] = []
    kwargs = {} if spec is None else {"speculative_config": spec}
    replay = spec is None and batch == 1
    with Engine(model, **kwargs) as eng:
        _, warm = eng.generate([WARMUP], greedy(max_tokens))
        requests: list[dict[str, Any]] = []
        if name in WARM_CORPUS:
            answer_corpus(eng, max_tokens)
        for kind in PROMPTS:
            d0 = eng.counter("vllm:spec_decode_num_draft_tokens")
            a0 = eng.counter("vllm:spec_decode_num_accepted_tokens")
            s0 = eng.counter("vllm:spec_decode_num_drafts")
            secs, tokens, outs = 0.0, 0, []
            for msgs in batches(kind, batch):
                dt, got = eng.generate(msgs, greedy(max_tokens))
                secs += dt
                tokens += sum(len(o.outputs[0].token_ids) for o in got)
                for o in got:
                    outs.append(list(o.outputs[0].token_ids))
                    requests.append(
                        {"kind": kind, "prompt": list(o.prompt_token_ids), "output": outs[-1]}
                    )
            drafted = eng.counter("vllm:spec_decode_num_draft_tokens") - d0
            accepted = eng.counter("vllm:spec_decode_num_accepted_tokens") - a0
            drafts = eng.counter("vllm:spec_decode_num_drafts") - s0
            rows.append(
                {
                    "batch": batch,
                    "config": name,
                    "kind": kind,
                    "tokens": tokens,
                    "seconds": secs,
                    "tok_s": tokens / secs,
                    "drafted": drafted,
                    "accepted": accepted,
                    "acceptance": accepted / drafted if drafted else None,
                    "per_step": 1 + accepted / drafts if drafts else None,
                    "outputs": outs,
                }
            )
        if replay:
            rows.append(
                {
                    "batch": batch,
                    "config": name,
                    "kind": "replay",
                    "warmup": list(warm[0].outputs[0].token_ids),
                    "requests": requests,
                    "corpus": answer_corpus(eng, max_tokens),
                }
            )
        drafter = getattr(eng.runner(), "drafter", None)
        st = getattr(drafter, "stats", None)
        if st is not None and st.requests:
            costs = getattr(drafter, "costs")  # noqa: B009
            line = costs.line()
            rows.append(
                {
                    "batch": batch,
                    "config": name,
                    "kind": "proposer cost",
                    "us_per_request_step": 1e6 * st.seconds / st.requests,
                    # The acceptance a draft token needed at the end (StepCosts), and the
                    # line it came from: a step's ms against the tokens it verified.
                    "threshold": costs.threshold(),
                    "step_ms": None if line is None else 1e3 * line.step_s,
                    "token_ms": None if line is None else 1e3 * line.token_s,
                }
            )
    return rows


def run_speculation(
    model: Path,
    max_tokens: int,
    sizes: list[int],
    configs: dict[str, dict[str, Any] | None],
    repeats: int,
) -> list[dict[str, Any]]:
    """Every config at every batch size, each engine in a child process, ``repeats`` times
    in alternating order (a burst of load on a shared machine then slows different configs
    each time); each cell keeps its fastest repeat. Marks each row whose outputs equal
    plain vLLM's (when plain is among the configs)."""
    runs: dict[tuple[int, str, str], list[dict[str, Any]]] = {}
    for r in range(repeats):
        for batch in sizes:
            names = list(configs) if r % 2 == 0 else list(reversed(configs))
            for name in names:
                for row in child(model, ["speculation", str(max_tokens), str(batch), name]):
                    runs.setdefault((batch, name, row["kind"]), []).append(row)
                    if row["kind"] != "replay":
                        shown = {k: v for k, v in row.items() if k != "outputs"}
                        print(json.dumps(shown), flush=True)
    plain = {
        (batch, kind): cell[0]["outputs"]
        for (batch, name, kind), cell in runs.items()
        if name == "plain" and kind in PROMPTS
    }
    rows: list[dict[str, Any]] = []
    for (batch, _, kind), cell in runs.items():
        if kind == "replay":
            rows.append(cell[0])
            continue
        if kind == "proposer cost":
            rows.append(min(cell, key=lambda x: x["us_per_request_step"]))
            continue
        best = {k: v for k, v in max(cell, key=lambda x: x["tok_s"]).items() if k != "outputs"}
        want = plain.get((batch, kind))
        if want is not None:
            best["same_as_plain"] = all(c["outputs"] == want for c in cell)
        best["repeats_tok_s"] = [round(c["tok_s"], 1) for c in cell]
        rows.append(best)
    return rows


def child(model: Path, unit: list[str]) -> list[dict[str, Any]]:
    """Run one engine's measurements in a fresh process (vLLM's CPU platform does not
    set up a second engine in a process once its n-gram proposer has loaded numba) and
    return its rows."""
    argv = [sys.executable, __file__, "--model", str(model), "--child", json.dumps(unit)]
    out = subprocess.run(argv, capture_output=True, text=True)
    rows = [
        json.loads(line[len(RESULT) :])
        for line in out.stdout.splitlines()
        if line.startswith(RESULT)
    ]
    if out.returncode != 0 or not rows:
        sys.exit(f"{unit} failed (exit {out.returncode}):\n{out.stderr[-4000:]}")
    result: list[dict[str, Any]] = rows[0]
    return result


RESULT = "RESULT "


class Timer:
    """Seconds spent in wrapped functions, and calls that did mask work."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.steps = 0

    def wrap(self, fn: Callable[..., Any], counts_step: bool = False) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            self.seconds += time.perf_counter() - t0
            if counts_step and out is not None:
                self.steps += 1
            return out

        return timed


@contextmanager
def timed_structured_outputs() -> Iterator[Timer]:
    """vLLM's structured-output work per step, timed: the scheduler's bitmask fill
    (``grammar_bitmask``, a step when it returns one), its matchers' advance
    (``accept_tokens``) and the worker's ``apply_grammar_bitmask``."""
    import vllm.v1.worker.gpu_model_runner as runner_mod
    from vllm.v1.structured_output import StructuredOutputManager

    timer = Timer()
    saved = (
        StructuredOutputManager.grammar_bitmask,
        StructuredOutputManager.accept_tokens,
        runner_mod.apply_grammar_bitmask,
    )
    StructuredOutputManager.grammar_bitmask = timer.wrap(saved[0], counts_step=True)
    StructuredOutputManager.accept_tokens = timer.wrap(saved[1])
    runner_mod.apply_grammar_bitmask = timer.wrap(saved[2])
    try:
        yield timer
    finally:
        (
            StructuredOutputManager.grammar_bitmask,
            StructuredOutputManager.accept_tokens,
            runner_mod.apply_grammar_bitmask,
        ) = saved


def grammar_unit(
    model: Path, max_tokens: int, sizes: list[int], backend: str
) -> list[dict[str, Any]]:
    """One grammar backend's engine: a row per batch size."""
    import jsonschema  # type: ignore[import-untyped]
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    from specdec.integrations.vllm import GrammarLogitsProcessor

    requests = [(s, p) for _, s, prompts in SCHEMAS for p in prompts]

    def params(backend: str, schema: dict[str, Any]) -> Any:
        if backend == "specdec":
            return SamplingParams(
                temperature=0.0,
                max_tokens=max_tokens,
                extra_args={"specdec": {"json_schema": schema}},
            )
        return SamplingParams(
            temperature=0.0,
            max_tokens=max_tokens,
            structured_outputs=StructuredOutputsParams(json=schema),
        )

    rows: list[dict[str, Any]] = []
    if backend == "specdec":
        kwargs: dict[str, Any] = {"logits_processors": [GrammarLogitsProcessor]}
    else:
        kwargs = {"structured_outputs_config": {"backend": backend, "disable_any_whitespace": True}}
    with timed_structured_outputs() as timer, Engine(model, **kwargs) as eng:
        # Every schema compiled once, unmeasured.
        eng.generate(
            ["Say hi as JSON."] * len(SCHEMAS), [params(backend, s) for _, s, _ in SCHEMAS]
        )
        proc = None
        if backend == "specdec":
            (proc,) = [
                p
                for p in eng.runner().input_batch.logitsprocs.all
                if isinstance(p, GrammarLogitsProcessor)
            ]
        for batch in sizes:
            timer.seconds, timer.steps = 0.0, 0
            if proc is not None:
                proc.stats.seconds, proc.stats.steps = 0.0, 0
            calls = [[r] for r in requests] if batch == 1 else [requests[:batch]]
            secs, tokens, valid, total = 0.0, 0, 0, 0
            invalid: list[str] = []
            for call in calls:
                dt, outs = eng.generate([p for _, p in call], [params(backend, s) for s, _ in call])
                secs += dt
                for (schema, _), o in zip(call, outs, strict=True):
                    tokens += len(o.outputs[0].token_ids)
                    total += 1
                    try:
                        jsonschema.validate(json.loads(o.outputs[0].text), schema)
                        valid += 1
                    except (ValueError, jsonschema.ValidationError):
                        invalid.append(o.outputs[0].text[-120:])
            mask_s, steps = (
                (proc.stats.seconds, proc.stats.steps)
                if proc is not None
                else (timer.seconds, timer.steps)
            )
            row = {
                "batch": batch,
                "backend": backend,
                "tokens": tokens,
                "tok_s": tokens / secs,
                "mask_ms_per_step": 1e3 * mask_s / steps if steps else None,
                "steps": steps,
                "valid": f"{valid}/{total}",
                "invalid_tails": invalid,
            }
            rows.append(row)
    return rows


BACKENDS = ("xgrammar", "guidance", "specdec")


def run_grammars(
    model: Path,
    max_tokens: int,
    sizes: list[int],
    repeats: int,
    backends: list[str],
) -> list[dict[str, Any]]:
    """Each backend's engine in a child process, ``repeats`` times in alternating order;
    each cell keeps its fastest repeat's tokens/s and its least mask time per step, and
    every repeat's validity."""
    runs: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for r in range(repeats):
        for backend in backends if r % 2 == 0 else list(reversed(backends)):
            unit = ["grammar", str(max_tokens), ",".join(map(str, sizes)), backend]
            for row in child(model, unit):
                runs.setdefault((row["batch"], backend), []).append(row)
                print(json.dumps(row), flush=True)
    rows: list[dict[str, Any]] = []
    for (batch, backend), cell in sorted(runs.items()):
        masks = [c["mask_ms_per_step"] for c in cell if c["mask_ms_per_step"] is not None]
        valid = sum(int(c["valid"].split("/")[0]) for c in cell)
        total = sum(int(c["valid"].split("/")[1]) for c in cell)
        rows.append(
            {
                "batch": batch,
                "backend": backend,
                "tok_s": max(c["tok_s"] for c in cell),
                "mask_ms_per_step": min(masks) if masks else None,
                "repeats_mask_ms": [round(m, 3) for m in masks],
                "valid": f"{valid}/{total}",
                "invalid_tails": [t for c in cell for t in c["invalid_tails"]],
            }
        )
    return rows


def table(spec_rows: list[dict[str, Any]], grammar_rows: list[dict[str, Any]]) -> str:
    lines: list[str] = []
    configs = list(dict.fromkeys(r["config"] for r in spec_rows if r["kind"] in PROMPTS))
    ngrams = [c for c in configs if c.startswith("ngram")]
    pairs = [(s, n) for s in configs if s.startswith("suffix") for n in ngrams]
    if spec_rows:
        head = [f"{c} tok/s (acc.)" for c in configs] + [f"{s} / {n}" for s, n in pairs]
        lines.append(f"| batch | kind | {' | '.join(head)} | same output |")
        lines.append("|---:|---|" + "---:|" * (len(configs) + len(pairs)) + "---|")
    for batch in sorted({r["batch"] for r in spec_rows}):
        by = {(r["config"], r["kind"]): r for r in spec_rows if r["batch"] == batch}
        for kind in [*PROMPTS, "mix"]:
            cells: dict[str, dict[str, Any]] = {}
            for c in configs:
                rs = [by[c, k] for k in PROMPTS] if kind == "mix" else [by[c, kind]]
                drafted = sum(r["drafted"] for r in rs)
                cells[c] = {
                    "tok_s": sum(r["tokens"] for r in rs) / sum(r["seconds"] for r in rs),
                    "acc": sum(r["accepted"] for r in rs) / drafted if drafted else None,
                    # None: plain decoding was not run, nothing to compare with.
                    "same": None
                    if any("same_as_plain" not in r for r in rs)
                    else all(r["same_as_plain"] for r in rs),
                }
            shown = [
                f"{cells[c]['tok_s']:.1f}"
                + ("" if cells[c]["acc"] is None else f" ({cells[c]['acc']:.0%})")
                for c in configs
            ]
            shown += [f"{cells[s]['tok_s'] / cells[n]['tok_s']:.2f}x" for s, n in pairs]
            known = [v["same"] for v in cells.values() if v["same"] is not None]
            same = "-" if not known else "yes" if all(known) else "NO"
            name = "**mix**" if kind == "mix" else kind
            lines.append(f"| {batch} | {name} | {' | '.join(shown)} | {same} |")
    for r in spec_rows:
        if r["kind"] == "proposer cost":
            lines.append(
                f"\n{r['config']} proposer, batch {r['batch']}: "
                f"{r['us_per_request_step']:.0f} µs per request per step (threshold at the "
                f"end: {r.get('threshold', 0.0):.2f})"
            )
    if grammar_rows:
        lines.append("\n| batch | backend | tok/s | mask ms/step | valid |")
        lines.append("|---:|---|---:|---:|---|")
    for r in grammar_rows:
        mask = "-" if r["mask_ms_per_step"] is None else f"{r['mask_ms_per_step']:.3f}"
        lines.append(
            f"| {r['batch']} | {r['backend']} | {r['tok_s']:.1f} | {mask} | {r['valid']} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=None, help="HF model dir (default: SmolLM2)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--grammar-max-tokens", type=int, default=160)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kv-gib", type=int, default=2)
    ap.add_argument(
        "--configs",
        default="plain,ngram,suffix,suffix-warm",
        help=f"speculation configs to run, of {', '.join(CONFIGS)}",
    )
    ap.add_argument("--parts", default="speculation,grammar")
    ap.add_argument("--repeats", type=int, default=2, help="runs per cell, the fastest kept")
    ap.add_argument("--backends", default=",".join(BACKENDS), help="grammar backends to run")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="8 tokens, batch 1, one repeat, plain and suffix, specdec's grammars (the suite)",
    )
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.smoke:
        args.max_tokens, args.grammar_max_tokens, args.batches = 8, 8, "1"
        args.repeats, args.configs, args.backends = 1, "plain,suffix", "specdec"
    env = vllm_env(args.threads, args.kv_gib)
    libs = preload()
    if libs and "LD_PRELOAD" not in os.environ:
        os.execve(
            sys.executable, [sys.executable, *sys.argv], {**os.environ, **env, "LD_PRELOAD": libs}
        )
    os.environ.update({k: v for k, v in env.items() if k not in os.environ})
    model = model_dir(args.model)
    if args.child is not None:
        part, max_tokens, arg, name = json.loads(args.child)
        if part == "speculation":
            rows = speculation_unit(model, int(max_tokens), int(arg), name, CONFIGS[name])
        else:
            rows = grammar_unit(model, int(max_tokens), [int(b) for b in arg.split(",")], name)
        print(RESULT + json.dumps(rows), flush=True)
        return
    sizes = [int(b) for b in args.batches.split(",")]
    parts = set(args.parts.split(","))
    t0 = time.perf_counter()
    configs = {c: CONFIGS[c] for c in args.configs.split(",")}
    spec_rows = (
        run_speculation(model, args.max_tokens, sizes, configs, args.repeats)
        if "speculation" in parts
        else []
    )
    grammar_rows = (
        run_grammars(model, args.grammar_max_tokens, sizes, args.repeats, args.backends.split(","))
        if "grammar" in parts
        else []
    )
    print(f"\nwall time {time.perf_counter() - t0:.0f} s; threads {args.threads}")
    print(table(spec_rows, grammar_rows))
    if args.json is not None:
        args.json.write_text(
            json.dumps({"speculation": spec_rows, "grammar": grammar_rows}, indent=1)
        )


if __name__ == "__main__":
    main()
