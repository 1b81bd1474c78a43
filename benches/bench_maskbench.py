"""MaskBench: JSON Schema compile success, valid-instance acceptance, invalid-instance
rejection, mask and compile times, specdec vs llguidance vs xgrammar in one run.

    python benches/bench_maskbench.py --data DIR [--limit N] [--vocab tekken|smollm2|both]
    python benches/bench_maskbench.py --smoke

``DIR`` is the JSONSchemaBench MaskBench data directory (public: guidance-ai/jsonschemabench,
``maskbench/data``; one JSON file per schema with ``schema`` and ``tests``). ``--limit N``
takes N files evenly spread over the sorted names (every source sampled).

Every engine gets the same vocabulary (token bytes from :class:`specdec.Vocabulary`; Tekken
or SmolLM2), the same instances and the same tokenization: each instance as compact JSON
(``separators=(",", ":")``), tokenized byte-greedily (longest vocabulary token first) so all
three vocabularies agree whatever each peer's own tokenizer would do. Engines run one at a
time, single-threaded, interleaved (each schema through every engine in turn, so a machine
whose load changes weighs on all alike), each (engine, schema) in a forked child with
``--timeout`` seconds:
a hang is killed and counted, a crash (the child dying) too. Peers: flexible whitespace, no
strict mode (additional properties allowed unless the schema says otherwise), as specdec's
defaults; ``oneOf`` read as ``anyOf`` by all three (llguidance's ``coerce_one_of``; specdec and
xgrammar do so by default). Each engine's row is printed when it finishes.

After the table: the wrong verdicts (valid instances rejected plus invalid ones accepted) of
each engine on the schemas every engine compiles.

Per schema: compile (fresh, caches off), then along each valid instance one mask per token
(timed call by call, including the EOS step) while accepting the tokens; invalid instances
are fed without masks and must be rejected at some token or at EOS. Each child first
compiles and masks a one-property schema, untimed (``--cold-child``: not), as a serving
process that has compiled before: a forked child's first calls otherwise pay page faults on
memory shared with the parent and lazy set-up, once per process in a server, which would
be charged to whichever schema comes first.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

for var in ("RAYON_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, "1")

import numpy as np  # noqa: E402

import specdec  # noqa: E402
from specdec import Vocabulary  # noqa: E402
from specdec.constrain.grammar import CfgGrammar  # noqa: E402
from specdec.constrain.numpy import allocate_token_bitmask  # noqa: E402
from specdec.errors import SpecdecError  # noqa: E402

ENGINES = ("specdec", "llguidance", "xgrammar")


class Tokens:
    """A vocabulary's token bytes, with a byte-greedy tokenizer over its normal tokens."""

    def __init__(self, vocab: Vocabulary) -> None:
        self.vocab = vocab
        self.n = vocab.vocab_size
        self.eos = vocab.eos_ids[0]
        self.bytes: list[bytes | None] = [vocab.token_bytes(i) for i in range(self.n)]
        self.index: dict[bytes, int] = {}
        for i, b in enumerate(self.bytes):
            if b and b not in self.index:
                self.index[b] = i
        self.longest = max(len(b) for b in self.index)

    def encode(self, text: bytes) -> list[int]:
        out, i = [], 0
        while i < len(text):
            for k in range(min(self.longest, len(text) - i), 0, -1):
                t = self.index.get(text[i : i + k])
                if t is not None:
                    out.append(t)
                    i += k
                    break
            else:
                raise ValueError(f"byte {text[i]} has no token")
        return out


class _Engine:
    """compile(schema text) -> grammar; run(grammar, tokens, timed) -> (accepted, mask µs)."""

    def compile(self, schema: str) -> Any:
        raise NotImplementedError

    def run(self, g: Any, ids: list[int], timed: bool) -> tuple[bool, list[float]]:
        raise NotImplementedError


class Specdec(_Engine):
    def __init__(self, tok: Tokens) -> None:
        self.tok = tok

    def compile(self, schema: str) -> Any:
        return CfgGrammar.from_json_schema(self.tok.vocab, schema)

    def run(self, g: Any, ids: list[int], timed: bool) -> tuple[bool, list[float]]:
        m = g.matcher()
        bm = allocate_token_bitmask(1, self.tok.n)
        times = []
        for t in ids:
            if timed:
                t0 = time.perf_counter()
                m.fill_next_token_bitmask(bm)
                times.append(time.perf_counter() - t0)
            if not m.accept_token(t):
                return False, times
        if timed:
            t0 = time.perf_counter()
            m.fill_next_token_bitmask(bm)
            times.append(time.perf_counter() - t0)
        return m.is_accepting(), times


class LLGuidance(_Engine):
    def __init__(self, tok: Tokens) -> None:
        import llguidance

        self.ll = llguidance
        names = [b if b is not None else b"\xff<special_%d>" % i for i, b in enumerate(tok.bytes)]

        class _Wrapped:
            eos_token_id = tok.eos
            bos_token_id = None
            tokens = names
            special_token_ids = [i for i, b in enumerate(tok.bytes) if b is None]

            def __call__(self, s: bytes) -> list[int]:
                return tok.encode(s)

        self.lltok = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Wrapped()))
        self.n = tok.n

    def compile(self, schema: str) -> Any:
        grammar = self.ll.LLMatcher.grammar_from_json_schema(
            schema, defaults={"whitespace_flexible": True, "coerce_one_of": True}
        )
        m = self.ll.LLMatcher(self.lltok, grammar, log_level=0)
        if m.is_error():
            raise ValueError(m.get_error())
        return m

    def run(self, g: Any, ids: list[int], timed: bool) -> tuple[bool, list[float]]:
        from llguidance.numpy import allocate_token_bitmask as alloc
        from llguidance.numpy import fill_next_token_bitmask

        m = g.deep_copy()
        bm = alloc(1, self.n)
        times = []
        for t in ids:
            if timed:
                t0 = time.perf_counter()
                fill_next_token_bitmask(m, bm, 0)
                times.append(time.perf_counter() - t0)
            if not m.consume_token(t) or m.is_error():
                return False, times
        if timed:
            t0 = time.perf_counter()
            fill_next_token_bitmask(m, bm, 0)
            times.append(time.perf_counter() - t0)
        return m.is_accepting() and not m.is_error(), times


class XGrammar(_Engine):
    def __init__(self, tok: Tokens) -> None:
        import xgrammar

        self.xg = xgrammar
        vocab = [b if b is not None else b"" for b in tok.bytes]
        self.info = xgrammar.TokenizerInfo(vocab, vocab_size=tok.n, stop_token_ids=[tok.eos])
        self.eos = tok.eos
        self.compiler: Any = None

    def compile(self, schema: str) -> Any:
        if self.compiler is None:
            self.compiler = self.xg.GrammarCompiler(self.info, max_threads=1, cache_enabled=False)
        return self.compiler.compile_json_schema(schema, any_whitespace=True, strict_mode=False)

    def run(self, g: Any, ids: list[int], timed: bool) -> tuple[bool, list[float]]:
        m = self.xg.GrammarMatcher(g)
        bm = self.xg.allocate_token_bitmask(1, self.info.vocab_size)
        times = []
        for t in ids:
            if timed:
                t0 = time.perf_counter()
                m.fill_next_token_bitmask(bm)
                times.append(time.perf_counter() - t0)
            if not m.accept_token(t):
                return False, times
        if timed:
            t0 = time.perf_counter()
            m.fill_next_token_bitmask(bm)
            times.append(time.perf_counter() - t0)
        return m.accept_token(self.eos), times


# Compiled and masked (untimed) first in each child unless --cold-child: a forked process's
# first compile and mask pay for touching memory it shares with its parent and for lazy
# set-up (imports, first-use tables), costs a serving process pays once, not per schema.
WARM_UP_SCHEMA = '{"type": "object", "properties": {"a": {"type": "integer"}}}'


def _job(engine: _Engine, case: dict[str, Any], tok: Tokens, conn: Any, warm: bool = True) -> None:
    """In the child: compile, then every instance; the result goes back through `conn`."""
    schema = json.dumps(case["schema"])
    if warm:
        try:
            engine.run(engine.compile(WARM_UP_SCHEMA), tok.encode(b'{"a":1}'), timed=True)
        except Exception:
            pass
    t0 = time.perf_counter()
    try:
        g = engine.compile(schema)
    except Exception as e:
        conn.send({"compiled": False, "error": f"{type(e).__name__}: {e}"[:200]})
        return
    out: dict[str, Any] = {"compiled": True, "compile_s": time.perf_counter() - t0}
    masks: list[float] = []
    ok_valid = bad_valid = ok_invalid = bad_invalid = 0
    for test in case["tests"]:
        text = json.dumps(test["data"], separators=(",", ":"), ensure_ascii=False).encode()
        accepted, times = engine.run(g, tok.encode(text), timed=test["valid"])
        masks += times
        if test["valid"]:
            ok_valid += accepted
            bad_valid += not accepted
        else:
            ok_invalid += not accepted
            bad_invalid += accepted
    out.update(
        masks=masks,
        valid_ok=ok_valid,
        valid_bad=bad_valid,
        invalid_ok=ok_invalid,
        invalid_bad=bad_invalid,
    )
    conn.send(out)


def run_one(
    engine: _Engine, case: dict[str, Any], tok: Tokens, timeout: float, warm: bool = True
) -> dict[str, Any]:
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_job, args=(engine, case, tok, child, warm))
    p.start()
    child.close()
    result: dict[str, Any] | None = None
    if parent.poll(timeout):
        try:
            result = parent.recv()
        except EOFError:
            result = None
    p.join(1.0 if result is not None else 0.0)
    if p.is_alive():
        p.kill()
        p.join()
        if result is None:
            return {"status": "timeout"}
    if result is None:
        return {"status": "crash", "exitcode": p.exitcode}
    result["status"] = "compiled" if result["compiled"] else "refused"
    return result


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.array(xs), q)) if xs else float("nan")


def bench(vocab_name: str, tok: Tokens, cases: list[dict[str, Any]], args: Any) -> None:
    makers: dict[str, Callable[[Tokens], _Engine]] = {
        "specdec": Specdec,
        "llguidance": LLGuidance,
        "xgrammar": XGrammar,
    }
    print(f"\n{vocab_name} ({tok.n} ids), {len(cases)} schemas, timeout {args.timeout:g} s:\n")
    print(
        "| engine | compiled | timeouts | crashes | valid accepted | invalid rejected "
        "| compile p50 ms | compile p99 ms | mask p50 µs | mask p99 µs | masks |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
    engines: dict[str, _Engine] = {}
    for name in args.engines.split(","):
        try:
            engines[name] = makers[name](tok)
        except ImportError as e:
            print(f"  {name} skipped: {e}", file=sys.stderr)
    # Interleaved (each schema through every engine in turn), so that a machine whose load
    # changes during the run weighs on all engines alike.
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in engines}
    for k, c in enumerate(cases):
        for name, engine in engines.items():
            results[name].append(run_one(engine, c, tok, args.timeout, not args.cold_child))
        if (k + 1) % 100 == 0:
            print(f"  {k + 1}/{len(cases)} schemas", file=sys.stderr, flush=True)
    for name, res in results.items():
        ok = [r for r in res if r["status"] == "compiled"]
        compiles = [r["compile_s"] * 1e3 for r in ok]
        masks = [t * 1e6 for r in ok for t in r["masks"]]

        def total(k: str, ok: list[dict[str, Any]] = ok) -> int:
            return sum(r[k] for r in ok)

        row = (
            name,
            f"{len(ok)}/{len(res)}",
            sum(r["status"] == "timeout" for r in res),
            sum(r["status"] == "crash" for r in res),
            f"{total('valid_ok')}/{total('valid_ok') + total('valid_bad')}",
            f"{total('invalid_ok')}/{total('invalid_ok') + total('invalid_bad')}",
            f"{_pct(compiles, 50):.2f}",
            f"{_pct(compiles, 99):.1f}",
            f"{_pct(masks, 50):.1f}",
            f"{_pct(masks, 99):.0f}",
            len(masks),
        )
        print("| " + " | ".join(str(x) for x in row) + " |", flush=True)
    # Wrong verdicts (valid rejected + invalid accepted) on the schemas every engine compiles.
    common = [
        k for k in range(len(cases)) if all(r[k]["status"] == "compiled" for r in results.values())
    ]
    wrong = {
        name: sum(res[k]["valid_bad"] + res[k]["invalid_bad"] for k in common)
        for name, res in results.items()
    }
    print(
        f"\nwrong verdicts on the {len(common)} schemas every engine compiles: "
        + ", ".join(f"{name} {n}" for name, n in wrong.items()),
        flush=True,
    )


# A test that the script runs (--smoke), not a measurement.
SMOKE: list[dict[str, Any]] = [
    {
        "schema": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
        "tests": [
            {"data": {"a": 1}, "valid": True},
            {"data": {"b": 1}, "valid": False},
        ],
    },
    {
        "schema": {"type": "array", "items": {"enum": ["x", "y"]}, "maxItems": 2},
        "tests": [{"data": ["x"], "valid": True}, {"data": ["x", "y", "x"], "valid": False}],
    },
    {
        "schema": {"type": "string", "format": "date"},
        "tests": [{"data": "2024-01-31", "valid": True}],
    },
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", help="the MaskBench data directory")
    ap.add_argument("--smoke", action="store_true", help="three inline schemas, Tekken only")
    ap.add_argument("--limit", type=int, default=None, help="N schema files, evenly spread")
    ap.add_argument("--vocab", choices=["tekken", "smollm2", "both"], default="both")
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds per engine and schema")
    ap.add_argument(
        "--cold-child",
        action="store_true",
        help="time each child's first compile and masks (no untimed warm-up schema first)",
    )
    args = ap.parse_args()
    if args.smoke:
        cases, args.vocab = SMOKE, "tekken"
    elif args.data is None:
        ap.error("--data DIR is required (or --smoke)")
    else:
        files = sorted(Path(args.data).glob("*.json"))
        if args.limit is not None and args.limit < len(files):
            # Evenly spread over the sorted names, so every source is sampled.
            files = [files[i * len(files) // args.limit] for i in range(args.limit)]
        cases = [json.loads(f.read_text()) for f in files]
    print(
        f"specdec {specdec.__version__}, Python {platform.python_version()}, "
        f"{platform.machine()}, {os.cpu_count()} CPUs (one thread per engine)"
    )
    vocabs: dict[str, Callable[[], Vocabulary]] = {"tekken": Vocabulary.from_tekken}
    if args.vocab in ("smollm2", "both"):
        from specdec.models import smollm2

        vocabs["smollm2"] = lambda: smollm2().vocabulary()
    for name, make in vocabs.items():
        if args.vocab not in (name, "both"):
            continue
        bench(name, Tokens(make()), cases, args)


if __name__ == "__main__":
    try:
        main()
    except SpecdecError as e:
        sys.exit(f"error: {e}")
