"""Constrained decoding benchmark on the Tekken 131k vocabulary: regex compile time and
per-step mask time along real tokenizations, specdec vs xgrammar, llguidance and
outlines-core in one run; plus tree masks (N = 64 and 256 nodes), and batch fills of one
JSON Schema's matchers, row by row against one parallel batch call (cold state masks).

    python benches/bench_grammar.py [--quick | --smoke | --batch-only]

Each regex is compiled fresh (peers' caches off where they have one) and walked once along
the Tekken tokenization of a matching string: one mask per step (including the final EOS
step), timed call by call, cold states included. Prints markdown tables. ``--smoke`` runs
every table at tiny sizes (a test that the script works, not a measurement).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import time
from collections.abc import Callable
from typing import Any

import mistral_common
import numpy as np
import torch

import specdec
from specdec import CfgGrammar, Matcher, RegexGrammar, Vocabulary

DATA = os.path.join(os.path.dirname(mistral_common.__file__), "data")
TEKKEN = os.path.join(DATA, "tekken_240911.json")

COUNTRIES = (
    "Afghanistan|Albania|Algeria|Andorra|Angola|Argentina|Armenia|Australia|Austria|"
    "Azerbaijan|Bahamas|Bahrain|Bangladesh|Barbados|Belarus|Belgium|Belize|Benin|Bhutan|"
    "Bolivia|Botswana|Brazil|Brunei|Bulgaria|Burundi|Cambodia|Cameroon|Canada|Chad|Chile|"
    "China|Colombia|Comoros|Croatia|Cuba|Cyprus|Denmark|Djibouti|Dominica|Ecuador|Egypt|"
    "Eritrea|Estonia|Ethiopia|Fiji|Finland|France|Gabon|Gambia|Georgia|Germany|Ghana|Greece|"
    "Grenada|Guatemala|Guinea|Guyana|Haiti|Honduras|Hungary|Iceland|India|Indonesia|Iran|"
    "Iraq|Ireland|Israel|Italy|Jamaica|Japan|Jordan|Kazakhstan|Kenya|Kiribati|Kuwait|Laos|"
    "Latvia|Lebanon|Lesotho|Liberia|Libya|Lithuania|Luxembourg|Madagascar|Malawi|Malaysia|"
    "Maldives|Mali|Malta|Mexico|Moldova|Monaco|Mongolia|Morocco|Mozambique|Namibia|Nepal|"
    "Netherlands|Nicaragua|Niger|Nigeria|Norway|Oman|Pakistan|Palau|Panama|Paraguay|Peru|"
    "Philippines|Poland|Portugal|Qatar|Romania|Russia|Rwanda|Samoa|Senegal|Serbia|Singapore|"
    "Slovakia|Slovenia|Somalia|Spain|Sudan|Suriname|Sweden|Switzerland|Syria|Tajikistan|"
    "Tanzania|Thailand|Togo|Tonga|Tunisia|Turkey|Uganda|Ukraine|Uruguay|Uzbekistan|Vanuatu|"
    "Venezuela|Vietnam|Yemen|Zambia|Zimbabwe"
)
OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"

# (name, regex, a matching string). ASCII classes: every engine reads them the same way.
CASES: list[tuple[str, str, str]] = [
    ("date", r"[0-9]{4}-[0-9]{2}-[0-9]{2}", "2024-03-15"),
    (
        "iso datetime",
        r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?(Z|[+-][0-9]{2}:[0-9]{2})",
        "2024-03-15T12:34:56.789+02:00",
    ),
    ("time", r"([01][0-9]|2[0-3]):[0-5][0-9]", "23:59"),
    ("email", r"[a-zA-Z0-9._%+-]+@[a-zA-Z0-9.-]+\.[a-zA-Z]{2,}", "john.doe+news@mail.example.org"),
    ("identifier", r"[A-Za-z_][A-Za-z0-9_]*", "my_variable_name42"),
    ("integer", r"-?(0|[1-9][0-9]*)", "-1234567"),
    ("float", r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?", "3.14159e-10"),
    ("quoted string", r'"([^"\\]|\\.)*"', '"Hello, world! \\"quoted\\" text, ünïcödé 😀."'),
    ("enum", r"(red|green|blue|yellow|orange|purple)", "purple"),
    ("long alternation", f"({COUNTRIES})", "Switzerland"),
    ("phone", r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}", "(555) 123-4567"),
    ("ipv4", rf"({OCTET}\.){{3}}{OCTET}", "192.168.0.254"),
    ("url", r"https?://[a-z0-9.-]+(/[A-Za-z0-9._~-]*)*", "https://example.com/path/to/page.html"),
    (
        "uuid",
        r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
        "123e4567-e89b-12d3-a456-426614174000",
    ),
    ("hex color", r"#[0-9a-fA-F]{6}", "#1a2B3c"),
    (
        "semver",
        r"(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?",
        "1.24.3-beta.1",
    ),
    ("sentence", r"[A-Z][a-z]+( [a-z]+)*\.", "The quick brown fox jumps over the lazy dog."),
    ("word list", r"[a-z]+(, [a-z]+)*", "alpha, beta, gamma, delta, epsilon"),
    (
        "json object",
        r'\{"name": "[^"]{1,20}", "age": [0-9]{1,3}, "city": "[A-Za-z ]+"\}',
        '{"name": "Alice Smith", "age": 30, "city": "New York"}',
    ),
    ("bool/null", r"(true|false|null)", "false"),
    ("zip", r"[0-9]{5}(-[0-9]{4})?", "12345-6789"),
    ("csv row", r"[A-Za-z]+(,[0-9]+){3}", "widget,12,400,7"),
    ("money", r"\$[0-9]{1,3}(,[0-9]{3})*\.[0-9]{2}", "$1,234,567.89"),
    ("free text", r"[^\n]{1,80}", "Free text up to eighty characters, any symbol: ü, 中文, 😀!"),
]


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q)) if xs else float("nan")


class Engine:
    name = "?"
    available = True
    reason = ""

    def compile(self, pattern: str) -> Any:
        raise NotImplementedError

    def matcher(self, compiled: Any) -> Any:
        raise NotImplementedError

    def fill(self, m: Any, buf: Any) -> None:
        raise NotImplementedError

    def accept(self, m: Any, tok: int) -> bool:
        raise NotImplementedError

    def buffer(self, vocab_size: int) -> Any:
        raise NotImplementedError

    def as_numpy(self, buf: Any) -> np.ndarray:
        return buf if isinstance(buf, np.ndarray) else buf.numpy()


class Specdec(Engine):
    name = "specdec"

    def __init__(self, vocab: Vocabulary, torch_buffer: bool = False) -> None:
        self.v = vocab
        self.torch_buffer = torch_buffer
        if torch_buffer:
            self.name = "specdec (torch buffer)"

    def compile(self, pattern: str) -> Any:
        return RegexGrammar(self.v, pattern)

    def matcher(self, compiled: Any) -> Any:
        return Matcher(compiled)

    def buffer(self, vocab_size: int) -> Any:
        bm = specdec.allocate_token_bitmask(1, vocab_size)
        return torch.from_numpy(bm) if self.torch_buffer else bm

    def fill(self, m: Any, buf: Any) -> None:
        m.fill_next_token_bitmask(buf, 0)

    def accept(self, m: Any, tok: int) -> bool:
        return bool(m.accept_token(tok))


class XGrammar(Engine):
    name = "xgrammar"

    def __init__(self, tokens: list[bytes | None], eos: int) -> None:
        import xgrammar as xgr

        self.xgr = xgr
        enc = [b"" if t is None else t for t in tokens]
        info = xgr.TokenizerInfo(
            enc, xgr.VocabType.RAW, vocab_size=len(tokens), stop_token_ids=[eos]
        )
        self.compiler = xgr.GrammarCompiler(info, max_threads=2, cache_enabled=False)
        self.name = f"xgrammar {getattr(xgr, '__version__', '')}".strip()

    def compile(self, pattern: str) -> Any:
        return self.compiler.compile_regex(pattern)

    def matcher(self, compiled: Any) -> Any:
        return self.xgr.GrammarMatcher(compiled)

    def buffer(self, vocab_size: int) -> Any:
        return self.xgr.allocate_token_bitmask(1, vocab_size)

    def fill(self, m: Any, buf: Any) -> None:
        m.fill_next_token_bitmask(buf, 0)

    def accept(self, m: Any, tok: int) -> bool:
        return bool(m.accept_token(tok))


class LLGuidance(Engine):
    name = "llguidance"

    def __init__(
        self, tokens: list[bytes | None], eos: int, encode: Callable[[str], list[int]]
    ) -> None:
        import llguidance
        import llguidance.numpy as lnp

        class Tok:
            eos_token_id = eos
            bos_token_id = 1
            special_token_ids = [i for i, t in enumerate(tokens) if t is None]

            def __init__(self) -> None:
                self.tokens = [
                    b"<SPECIAL_%d>" % i if t is None else t for i, t in enumerate(tokens)
                ]

            def __call__(self, s: Any) -> list[int]:
                return encode(s.decode() if isinstance(s, bytes) else s)

        self.ll, self.lnp = llguidance, lnp
        self.tok = llguidance.LLTokenizer(llguidance.TokenizerWrapper(Tok()))
        self.name = (
            f"llguidance {llguidance.get_version()}"
            if hasattr(llguidance, "get_version")
            else "llguidance"
        )

    def compile(self, pattern: str) -> Any:
        # llguidance builds its lexer lazily: the matcher's creation is its compile step.
        g = self.ll.LLMatcher.grammar_from_regex(pattern)
        m = self.ll.LLMatcher(self.tok, g)
        if m.is_error():
            raise RuntimeError(m.get_error())
        return (g, m)

    def matcher(self, compiled: Any) -> Any:
        return compiled[1].deep_copy()

    def buffer(self, vocab_size: int) -> Any:
        return np.zeros((1, (vocab_size + 31) // 32), dtype=np.int32)

    def fill(self, m: Any, buf: Any) -> None:
        self.lnp.fill_next_token_bitmask(m, buf, 0)

    def accept(self, m: Any, tok: int) -> bool:
        return bool(m.consume_token(tok))


class OutlinesCore(Engine):
    name = "outlines-core"

    def __init__(self, tokens: list[bytes | None], eos: int) -> None:
        import outlines_core

        self.oc = outlines_core
        groups: dict[bytes, list[int]] = {}
        for i, t in enumerate(tokens):
            if t is not None and i != eos:
                groups.setdefault(t, []).append(i)
        self.vocab = outlines_core.Vocabulary(eos, groups)
        self.eos = eos
        self.name = "outlines-core"

    def compile(self, pattern: str) -> Any:
        return self.oc.Index(pattern, self.vocab)

    def matcher(self, compiled: Any) -> Any:
        return self.oc.Guide(compiled)

    def buffer(self, vocab_size: int) -> Any:
        return np.zeros((1, (vocab_size + 31) // 32), dtype=np.int32)

    def fill(self, m: Any, buf: Any) -> None:
        m.write_mask_into(buf.ctypes.data, buf.size, 4)

    def accept(self, m: Any, tok: int) -> bool:
        if tok == self.eos and m.is_finished():
            return True  # outlines has no transition for EOS; being finished is accepting
        try:
            m.advance(tok)
        except ValueError:
            return False
        return True


def run_engine(
    eng: Engine,
    cases: list[tuple[str, str, str]],
    token_ids: dict[str, list[int]],
    vocab_size: int,
    eos: int,
) -> dict[str, Any]:
    compile_ms: dict[str, float] = {}
    masks: list[float] = []
    masks_warm: list[float] = []
    failures: list[str] = []
    snapshots: dict[str, list[np.ndarray]] = {}
    per_case: dict[str, list[float]] = {}
    # Warm up the call path (first-call costs of the bindings are not per-mask costs).
    warm = eng.matcher(eng.compile("warmup"))
    wbuf = eng.buffer(vocab_size)
    for _ in range(3):
        eng.fill(warm, wbuf)
    for name, pattern, _text in cases:
        try:
            t0 = time.perf_counter()
            comp = eng.compile(pattern)
            compile_ms[name] = (time.perf_counter() - t0) * 1e3
        except Exception as e:  # a peer that does not support a regex: say so
            failures.append(f"{name}: {type(e).__name__}: {str(e)[:80]}")
            continue
        buf = eng.buffer(vocab_size)
        snaps = []
        for rep, sink in ((0, masks), (1, masks_warm)):
            # Warm pass: a new matcher on the same compiled grammar (caches filled).
            m = eng.matcher(comp)
            for tok in [*token_ids[name], eos]:
                t0 = time.perf_counter_ns()
                eng.fill(m, buf)
                dt = (time.perf_counter_ns() - t0) / 1e3
                sink.append(dt)
                if rep == 0:
                    per_case.setdefault(name, []).append(dt)
                if rep == 0:
                    snaps.append(eng.as_numpy(buf)[0].copy())
                if not eng.accept(m, tok):
                    failures.append(f"{name}: token {tok} rejected")
                    break
        snapshots[name] = snaps
    return {
        "compile": compile_ms,
        "masks": masks,
        "masks_warm": masks_warm,
        "failures": failures,
        "snapshots": snapshots,
        "per_case": per_case,
    }


def tree_bench(
    vocab: Vocabulary,
    encode: Callable[[str], list[int]],
    reps: int,
    sizes: tuple[int, ...] = (64, 256),
) -> list[str]:
    rows = []
    rng = random.Random(0)
    for name, pattern, _text in [CASES[7], CASES[16], CASES[1]]:
        g = RegexGrammar(vocab, pattern)
        for n_nodes in sizes:
            # A tree of grammar-valid tokens grown breadth first (up to 4 children each).
            m = Matcher(g)
            tokens, parents, frontier = [2], [-1], [(0, m)]
            while len(tokens) < n_nodes and frontier:
                node, mm = frontier.pop(0)
                ids = mm.allowed_tokens().tolist()
                ids = [t for t in ids if t not in vocab.eos_ids]
                for t in rng.sample(ids, min(4, len(ids))):
                    if len(tokens) == n_nodes:
                        break
                    f = mm.fork()
                    f.accept_token(t)
                    tokens.append(t)
                    parents.append(node)
                    frontier.append((len(tokens) - 1, f))
            tree = specdec.DraftTree(tokens, parents)
            bm = specdec.allocate_token_bitmask(tree.num_nodes, vocab.vocab_size)
            specdec.fill_tree_bitmask(Matcher(g), tree, bm)  # fills the cache once
            best = []
            root = Matcher(g)
            for _ in range(reps):
                t0 = time.perf_counter_ns()
                specdec.fill_tree_bitmask(root, tree, bm)
                best.append((time.perf_counter_ns() - t0) / 1e3)
            # Reference: one matcher per node advanced along the path, one fill each.
            t0 = time.perf_counter_ns()
            one = specdec.allocate_token_bitmask(1, vocab.vocab_size)
            for i in range(tree.num_nodes):
                path = []
                j = i
                while j > 0:
                    path.append(int(tree.tokens[j]))
                    j = int(tree.parents[j])
                f = Matcher(g)
                f.accept_tokens(reversed(path))
                f.fill_next_token_bitmask(one)
            per_node = (time.perf_counter_ns() - t0) / 1e3
            rows.append(
                f"| {name} | {tree.num_nodes} | {np.median(best):.1f} | "
                f"{np.median(best) / tree.num_nodes:.2f} | {per_node:.0f} | "
                f"{per_node / np.median(best):.0f}x |"
            )
    return rows


def batch_schema(rep: int) -> dict[str, Any]:
    """One schema, several documents: a batch of requests decoding the same structure. Its
    string bounds and patterns change with ``rep`` (the documents match every version), so
    each compile has lexemes of its own, whose trie walks no earlier compile has cached."""
    email = f"^[a-z.]+@[a-z]{{1,{20 + rep}}}\\.[a-z]{{2,3}}$"
    return {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 60 + rep},
            "age": {"type": "integer", "minimum": 0},
            "email": {"type": "string", "pattern": email},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 30 + rep}},
            "address": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "zip": {"type": "string", "pattern": f"^[0-9]{{{1 + rep % 4},5}}$"},
                },
                "required": ["city"],
            },
            "score": {"type": "number"},
        },
        "required": ["name", "age"],
    }


BATCH_DOCS = [
    {"name": "Alice Smith", "age": 31, "email": "alice@example.org", "tags": ["admin", "ops"]},
    {"name": "Bob", "age": 4, "address": {"city": "Paris", "zip": "75001"}, "score": 0.5},
    {"name": "Chloé Martin", "age": 57, "tags": [], "score": -12.25e3},
    {"name": "Dmitri", "age": 0, "email": "d.k@mail.ru", "address": {"city": "Omsk"}},
]


def batch_bench(vocab: Vocabulary, encode: Callable[[str], list[int]], reps: int) -> list[str]:
    """Mask fills of one schema's matchers, each step: rows one by one vs one batch call (in
    parallel across threads), on a fresh compile per repeat (cold masks: see
    :func:`batch_schema`)."""
    docs = [encode(json.dumps(d, ensure_ascii=False)) for d in BATCH_DOCS]
    eos = vocab.eos_ids[0]
    rows = []
    for batch in (2, len(docs)):
        times: dict[str, list[float]] = {"row by row": [], "batch": []}
        for rep in range(reps):
            for k, (mode, sink) in enumerate(times.items()):
                g = CfgGrammar.from_json_schema(vocab, batch_schema(2 * rep + k))
                ms = [g.matcher() for _ in range(batch)]
                ids = docs[:batch]
                bm = specdec.allocate_token_bitmask(batch, vocab.vocab_size)
                spent = 0
                for step in range(max(len(t) for t in ids) + 1):
                    live = [i for i in range(batch) if step <= len(ids[i])]
                    t0 = time.perf_counter_ns()
                    if mode == "batch":
                        specdec.fill_next_token_bitmask_batch([ms[i] for i in live], bm, live)
                    else:
                        for i in live:
                            ms[i].fill_next_token_bitmask(bm, i)
                    spent += time.perf_counter_ns() - t0
                    for i in live:
                        tok = ids[i][step] if step < len(ids[i]) else eos
                        if not ms[i].accept_token(tok):
                            raise AssertionError(f"document {i}: token {tok} rejected")
                sink.append(spent / 1e6)
        one, par = float(np.median(times["row by row"])), float(np.median(times["batch"]))
        steps = sum(len(t) + 1 for t in docs[:batch])
        rows.append(f"| {batch} | {steps} | {one:.1f} | {par:.1f} | {one / par:.2f}x |")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="first 6 regexes only")
    ap.add_argument(
        "--repeats", type=int, default=3, help="passes per engine (fresh compiles), pooled"
    )
    ap.add_argument(
        "--batch-only", action="store_true", help="only the batch-fill table of one schema"
    )
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="3 regexes, 2 passes, small trees: every table at tiny sizes",
    )
    args = ap.parse_args()
    if args.smoke:
        ap.set_defaults(repeats=2)  # two passes, so the pooling across passes runs too
        args = ap.parse_args()
        # A fixed-length, a non-ASCII and an alternation regex.
        cases = [CASES[0], CASES[7], CASES[8]]
    else:
        cases = CASES[:6] if args.quick else CASES
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    tk = Tekkenizer.from_file(TEKKEN)

    def encode(s: str) -> list[int]:
        return tk.encode(s, bos=False, eos=False)

    t0 = time.perf_counter()
    vocab = Vocabulary.from_tekken(TEKKEN)
    vocab_ms = (time.perf_counter() - t0) * 1e3
    if args.batch_only:
        print("| matchers | mask steps | row by row ms | one batch call ms | speed-up |")
        print("|---|---|---|---|---|")
        for row in batch_bench(vocab, encode, reps=args.repeats * 3):
            print(row)
        return
    n = vocab.vocab_size
    eos = vocab.eos_ids[0]
    tokens = [vocab.token_bytes(i) for i in range(n)]
    token_ids = {name: encode(text) for name, _p, text in cases}
    for name, pattern, text in cases:
        assert RegexGrammar(vocab, pattern).matches(text), name

    engines: list[Engine] = [Specdec(vocab), Specdec(vocab, torch_buffer=True)]
    missing = []
    for make in (
        lambda: XGrammar(tokens, eos),
        lambda: LLGuidance(tokens, eos, encode),
        lambda: OutlinesCore(tokens, eos),
    ):
        try:
            engines.append(make())
        except Exception as e:
            missing.append(f"{type(e).__name__}: {e}")

    results: dict[str, dict[str, Any]] = {}
    # Engines interleaved per repeat so machine noise hits all of them alike; samples pooled
    # (per-regex figures: median over repeats).
    for rep in range(args.repeats):
        for eng in engines:
            r = run_engine(eng, cases, token_ids, n, eos)
            if rep == 0:
                results[eng.name] = r
                r["compile_all"] = {k: [v] for k, v in r["compile"].items()}
                r["slowest_all"] = {k: [max(v)] for k, v in r["per_case"].items()}
                continue
            acc = results[eng.name]
            acc["masks"] += r["masks"]
            acc["masks_warm"] += r["masks_warm"]
            for k, v in r["compile"].items():
                acc["compile_all"].setdefault(k, []).append(v)
            for k, v in r["per_case"].items():
                acc["slowest_all"].setdefault(k, []).append(max(v))
    for r in results.values():
        r["compile"] = {k: float(np.median(v)) for k, v in r["compile_all"].items()}
        r["per_case"] = {k: [float(np.median(v))] for k, v in r["slowest_all"].items()}

    print(f"Tekken vocabulary: {n} tokens, {vocab_ms:.0f} ms to load (specdec); ")
    steps = sum(len(v) + 1 for v in token_ids.values())
    print(f"{len(cases)} regexes, {steps} mask steps per pass, {args.repeats} passes pooled;")
    print(
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"torch {torch.__version__}\n"
    )
    for m in missing:
        print(f"- peer unavailable: {m}")
    print(
        "| engine | compile p50 ms | compile max ms | mask p50 us (cold pass) | mask p99 us | "
        "mask max us | mask p50 us (warm) | mask p99 us (warm) | failures |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    ref = results["specdec"]
    for name, r in results.items():
        comp = list(r["compile"].values())
        print(
            f"| {name} | {pct(comp, 50):.2f} | {max(comp, default=float('nan')):.2f} | "
            f"{pct(r['masks'], 50):.2f} | {pct(r['masks'], 99):.1f} | "
            f"{max(r['masks'], default=float('nan')):.0f} | {pct(r['masks_warm'], 50):.2f} | "
            f"{pct(r['masks_warm'], 99):.1f} | {len(r['failures'])} |"
        )
    print()
    # Ratios against each peer, and whether the masks agree bit for bit.
    print(
        "| peer | compile p50 ratio (peer/specdec) | mask p50 ratio | mask p99 ratio | "
        "identical masks |"
    )
    print("|---|---|---|---|---|")
    for name, r in results.items():
        if name == "specdec":
            continue
        comp_r = pct(list(r["compile"].values()), 50) / pct(list(ref["compile"].values()), 50)
        same = total = 0
        for case, snaps in r["snapshots"].items():
            for a, b in zip(snaps, ref["snapshots"].get(case, []), strict=False):
                total += 1
                same += int(np.array_equal(a, b))
        print(
            f"| {name} | {comp_r:.1f}x | {pct(r['masks'], 50) / pct(ref['masks'], 50):.2f}x | "
            f"{pct(r['masks'], 99) / pct(ref['masks'], 99):.2f}x | {same}/{total} |"
        )
    print()
    print("Per regex (median over passes): compile ms / slowest mask of the cold pass us:\n")
    print("| regex | steps | " + " | ".join(results) + " |")
    print("|---|---|" + "---|" * len(results))
    for name, _p, _t in cases:
        cells = [
            f"{r['compile'].get(name, float('nan')):.2f} / "
            f"{max(r['per_case'].get(name, [float('nan')])):.0f}"
            for r in results.values()
        ]
        print(f"| {name} | {len(token_ids[name]) + 1} | " + " | ".join(cells) + " |")
    ok = [
        name
        for name, _p, _t in cases
        if max(ref["per_case"][name]) <= 30 and ref["compile"][name] <= 10
    ]
    print(
        f"\nspecdec: {len(ok)}/{len(cases)} regexes with compile <= 10 ms and every mask <= 30 us"
    )
    for name, r in results.items():
        for f in r["failures"]:
            print(f"- {name}: {f}")
    print()
    print("Tree masks (fill_tree_bitmask, warm cache) vs one matcher per node:\n")
    print("| regex | nodes | tree fill us | us/node | per-node matchers us | speed-up |")
    print("|---|---|---|---|---|---|")
    tree_args = {"reps": 3, "sizes": (16,)} if args.smoke else {"reps": 50}
    for row in tree_bench(vocab, encode, **tree_args):
        print(row)
    print()
    print(
        f"Batch fills of one JSON Schema (cold state masks, {os.cpu_count()} CPUs), masks "
        "of every step, median over repeats:\n"
    )
    print("| matchers | mask steps | row by row ms | one batch call ms | speed-up |")
    print("|---|---|---|---|---|")
    for row in batch_bench(vocab, encode, reps=2 if args.smoke else 7):
        print(row)


if __name__ == "__main__":
    main()
