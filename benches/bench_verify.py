"""Tree verification on CPU: per-step breakdown (build, mask, forward, rule, walk, commit) of
one speculative step for a small Llama-style model at tree budgets B, and the same B drafted
tokens verified by the obvious alternatives in the same run:

- dense-mask attention (``backend="math"``: matmul + masked softmax) instead of SDPA;
- per-branch verification: every root-to-leaf path of the tree as its own causal forward
  (what a verifier without tree attention does), rolled back after each;
- autoregressive decoding: one forward per token.

Prints markdown tables. Example: ``python benches/bench_verify.py --budgets 16 64 256``;
``--smoke`` runs every table at tiny sizes (a test that the script works, not a measurement).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

from specdec.cache import DenseKVCache
from specdec.models import LlamaConfig, LlamaModel
from specdec.tree import DDTreeShape, DraftTree
from specdec.verify import STAGES, Greedy, Verifier


def make_model(backend: str, args: argparse.Namespace) -> LlamaModel:
    cfg = LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 3,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=args.prefix + 2048,
    )
    return LlamaModel(cfg, backend=backend).init_random(0).eval()  # type: ignore[arg-type]


def step_breakdown(model: LlamaModel, budget: int, args: argparse.Namespace) -> dict[str, float]:
    """Median seconds per stage over ``args.repeats`` steps from the same prefix."""
    g = torch.Generator().manual_seed(budget)
    prefix = torch.randint(0, args.vocab, (args.prefix,), generator=g)
    cache = model.new_cache(args.prefix + budget + 8)
    ver = Verifier(model, Greedy())
    ver.prefill(prefix[:-1], cache)
    # Peaked random draft marginals so the tree is deep, not a star.
    logits = 4.0 * torch.randn(args.depth, args.vocab, generator=g)
    runs: dict[str, list[float]] = {s: [] for s in STAGES}
    for i in range(args.repeats + 1):
        t0 = time.perf_counter()
        tree = DDTreeShape(budget).build(logits, int(prefix[-1]))
        build = time.perf_counter() - t0
        assert tree.num_drafted == budget
        res = ver.step(tree, cache)
        cache.truncate(args.prefix - 1)
        if i == 0:
            continue  # warm-up
        runs["build"].append(build)
        for k, v in res.timings.items():
            runs[k].append(v)
    return {k: statistics.median(v) for k, v in runs.items()}


def compare(
    models: dict[str, LlamaModel], budget: int, args: argparse.Namespace
) -> dict[str, float]:
    """Median seconds to verify the same tree by: one packed forward per backend, and one
    causal forward per root-to-leaf path (``per-branch``). Interleaved repeat by repeat so
    machine noise hits every column alike."""
    g = torch.Generator().manual_seed(budget)
    prefix = torch.randint(0, args.vocab, (args.prefix,), generator=g)
    logits = 4.0 * torch.randn(args.depth, args.vocab, generator=g)
    tree = DDTreeShape(budget).build(logits, int(prefix[-1]))
    tt = tree.to("cpu")
    p = args.prefix - 1
    pos, mask = tt.position_ids(p), tt.attention_mask(p)
    paths = [[int(j) for j in row if j >= 0] for row in tree.retrieve_indices()]
    caches = {}
    for name, m in models.items():
        caches[name] = m.new_cache(args.prefix + budget + 8)
        Verifier(m).prefill(prefix[:-1], caches[name])
    sdpa = models["sdpa"]
    times: dict[str, list[float]] = {k: [] for k in (*models, "per-branch")}
    for i in range(args.repeats + 1):
        for name, m in models.items():
            t0 = time.perf_counter()
            m(tt.tokens, pos, caches[name], mask)
            caches[name].rollback()
            if i:
                times[name].append(time.perf_counter() - t0)
        if i % 4 <= 1:  # per-branch is slow: warm-up, then half the repeats
            t0 = time.perf_counter()
            for path in paths:
                ids = torch.from_numpy(tree.tokens[path])
                sdpa(ids, torch.arange(p, p + len(path)), caches["sdpa"], None)
                caches["sdpa"].rollback()
            if i:
                times["per-branch"].append(time.perf_counter() - t0)
    out = {k: statistics.median(v) for k, v in times.items()}
    out["paths"] = float(len(paths))
    return out


def batched(
    model: LlamaModel, r: int, budget: int, args: argparse.Namespace
) -> tuple[float, float]:
    """Median seconds of one ``step_batch`` over R sequences vs R separate ``step`` calls
    (same trees, prefixes of different lengths around ``args.prefix``), interleaved."""
    g = torch.Generator().manual_seed(r)
    ver = Verifier(model, Greedy())
    lens = [args.prefix - 16 * i for i in range(r)]
    caches_b: list[DenseKVCache] = []
    caches_s: list[DenseKVCache] = []
    trees: list[DraftTree] = []
    for n in lens:
        prefix = torch.randint(0, args.vocab, (n,), generator=g)
        for lst in (caches_b, caches_s):
            lst.append(model.new_cache(n + budget + 8))
            ver.prefill(prefix[:-1], lst[-1])
        logits = 4.0 * torch.randn(args.depth, args.vocab, generator=g)
        trees.append(DDTreeShape(budget).build(logits, int(prefix[-1])))
    tb, ts = [], []
    for i in range(args.repeats + 1):
        t0 = time.perf_counter()
        ver.step_batch(trees, caches_b)
        t1 = time.perf_counter()
        for t, c in zip(trees, caches_s, strict=True):
            ver.step(t, c)
        t2 = time.perf_counter()
        for c, n in zip(caches_b + caches_s, lens + lens, strict=True):
            c.truncate(n - 1)
        if i:
            tb.append(t1 - t0)
            ts.append(t2 - t1)
    return statistics.median(tb), statistics.median(ts)


def ar_token(model: LlamaModel, args: argparse.Namespace) -> float:
    g = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, args.vocab, (args.prefix,), generator=g)
    cache = model.new_cache(args.prefix + 8)
    Verifier(model).prefill(prefix[:-1], cache)
    times = []
    for i in range(args.repeats * 2 + 1):
        t0 = time.perf_counter()
        model(prefix[-1:], torch.tensor([args.prefix - 1]), cache, None)
        cache.rollback()
        if i:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--budgets", type=int, nargs="+", default=[16, 64, 256])
    ap.add_argument("--prefix", type=int, default=512)
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, nargs="*", default=[4, 16])
    ap.add_argument("--batch-budget", type=int, default=16)
    ap.add_argument(
        "--smoke", action="store_true", help="every table at tiny sizes (explicit flags win)"
    )
    args = ap.parse_args()
    if args.smoke:
        ap.set_defaults(
            budgets=[4, 8],
            prefix=40,
            depth=4,
            vocab=128,
            hidden=32,
            layers=1,
            heads=2,
            kv_heads=1,
            repeats=2,
            batch=[2],
            batch_budget=4,
        )
        args = ap.parse_args()
    torch.set_num_threads(args.threads)
    sdpa, dense = make_model("sdpa", args), make_model("math", args)
    dense.load_state_dict(sdpa.state_dict())

    print(
        f"python {platform.python_version()}, torch {torch.__version__}, CPU threads "
        f"{args.threads}; model: {args.layers} layers, hidden {args.hidden}, "
        f"{args.heads} q / {args.kv_heads} kv heads, vocab {args.vocab}, float32; prefix "
        f"{args.prefix}, draft depth {args.depth}; medians of {args.repeats} steps\n"
    )
    print("| B | build | mask | forward | rule | walk | commit | total | forward share |")
    print("|---|---|---|---|---|---|---|---|---|")
    for b in args.budgets:
        t = step_breakdown(sdpa, b, args)
        total = sum(t.values())
        cells = " | ".join(f"{t[s] * 1e3:.3f}" for s in STAGES)
        print(f"| {b} | {cells} | {total * 1e3:.3f} | {t['forward'] / total:.0%} |")
    print("\n(milliseconds per step)\n")

    ar = ar_token(sdpa, args)
    print(
        "| B | tree forward, SDPA | tree forward, dense mask (math) | math / SDPA "
        "| per-branch forwards (paths) | per-branch / tree | AR: B tokens | AR / tree |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for b in args.budgets:
        c = compare({"sdpa": sdpa, "math": dense}, b, args)
        fs, fm, pb, n = c["sdpa"], c["math"], c["per-branch"], int(c["paths"])
        print(
            f"| {b} | {fs * 1e3:.2f} ms | {fm * 1e3:.2f} ms | {fm / fs:.2f}x | "
            f"{pb * 1e3:.1f} ms ({n}) | {pb / fs:.1f}x | {ar * b * 1e3:.1f} ms | "
            f"{ar * b / fs:.1f}x |"
        )
    print(f"\nAR: one token forward {ar * 1e3:.2f} ms (median).\n")

    print("| R sequences x B | step_batch (one forward) | R x step | R x step / step_batch |")
    print("|---|---|---|---|")
    for r in args.batch:
        tb, ts = batched(sdpa, r, args.batch_budget, args)
        rb = f"{r} x {args.batch_budget}"
        print(f"| {rb} | {tb * 1e3:.1f} ms | {ts * 1e3:.1f} ms | {ts / tb:.2f}x |")


if __name__ == "__main__":
    main()
