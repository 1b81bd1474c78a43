"""Time SmolLM2-135M's decode forward in specdec's ``LlamaModel`` (CPU float32, the GGUF
blocks): one token, and a 5- and a 9-token tree step (a chain's causal mask) after a
prefix, through the fused step (``fused_step``: the whole stack in one Rust call) and the
torch path (layer by layer), side by side: the two alternate call by call, each the
fastest and the median wall time of ``--repeats`` (the step is rolled back after each
call). Each thread count runs in its own process (the kernel's thread pool is sized once,
by ``SPECDEC_LINEAR_THREADS``). ``--generate N``: tokens/s of greedy autoregressive
decoding of N tokens, both paths. With ``--profile``, ``torch.profiler``'s per-op table of
the torch path's 1-token step, to see how much of it is small-op and Python overhead.
Run: ``python benches/profile_forward.py`` (on a quiet machine).

``--rows 1,2,4,5,8,16,32,64``: the decode step profile instead, in one process of
the largest ``--threads``: per row count ``n``, a tree step of ``n`` nodes (a binary tree:
node ``i``'s parent is ``(i - 1) // 2``) after ``--prefix`` tokens, verified as the
generator verifies it (``Verifier.step``: the tree's mask and positions, ``LlamaModel``'s
forward on its real path, greedy rule, walk, commit; the cache is cut back to the prefix
after each). Its time splits into:

* matmul, attention, other kernels (norms, RoPE, K/V writes, residual adds; SwiGLU on the
  torch path, inside the gate/up product on the fused one): on the fused step (``n <=
  quant_max_rows``), the stack's own clock (``LlamaStack.profiling``);
  on the torch path, ``torch.profiler``'s self CPU time per op, by name (``mm``, ``addmm``,
  ``linear``, ``matmul``, ``bmm``, mkldnn's packed linear and the quant op -> matmul;
  ``scaled_dot_product``, ``flash``, ``flex`` -> attention; any other op -> other kernels);
* dispatch: the forward's wall time (measured without the profiler) minus the time inside
  kernels: Python, the input checks, the binding, torch's op overhead (the fused step's
  embedding gather and output allocation count here);
* bookkeeping: the verifier's own stages around the forward (mask, rule, walk, commit).

``--numeric int8``: the same profile in the int8 mode (every row count on the fused step).

``--host N``: host overhead on the real generators, per step averaged over a greedy
generation of ``N`` tokens from a chat prompt (the prefill step left out): a plain
autoregressive step (``autoregressive_generate``, 1 row) and a ``SpeculativeGenerator`` step
with the default suffix drafter and a tree padded to ``--tree-nodes`` nodes. Host overhead
is the step's wall time minus the matmul and attention kernels' time, as a share of the
step, with where the rest goes: the stack's other kernels, the forward's dispatch, and the
generator's stages (draft, build, mask, rule, walk, commit, and the step's untimed rest).
``--json PATH`` writes the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from specdec.models import smollm2
from specdec.models.llama import LlamaModel

MATMUL_OPS = (
    "aten::mm",
    "aten::addmm",
    "aten::linear",
    "aten::matmul",
    "aten::bmm",
    "_linear_pointwise",  # the packed (mkldnn) linear of the decode plan
    "quant",
)
ATTENTION_OPS = ("scaled_dot_product", "flash_attention", "flex_attention")
PHASES = ("matmul", "attention", "other", "dispatch", "bookkeeping")


def measure(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    lm = smollm2()
    model = lm.model
    cache = model.new_cache(args.prefix + 64)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.vocab_size, (args.prefix,), generator=g)
    model.forward_last(ids, torch.arange(args.prefix), cache)
    cache.commit(list(range(args.prefix)))
    out: dict[str, Any] = {"threads": args.threads, "steps": {}}
    for n in args.sizes:
        step = torch.randint(0, model.vocab_size, (n,), generator=g)
        pos = torch.arange(args.prefix, args.prefix + n)
        # A tree step passes its own mask (here a chain): the verify path's call.
        mask = None if n == 1 else torch.ones(n, args.prefix + n, dtype=torch.bool)
        if mask is not None:
            mask[:, args.prefix :] = torch.tril(mask[:, args.prefix :])
        times: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(args.repeats):
            for fused in (True, False):
                model.fused_step = fused
                t0 = time.perf_counter()
                model(step, pos, cache, mask)
                times[fused].append(time.perf_counter() - t0)
                cache.rollback()
        out["steps"][n] = {
            ("fused" if f else "torch"): (min(ts) * 1e3, sorted(ts)[len(ts) // 2] * 1e3)
            for f, ts in times.items()
        }
    if args.generate:
        from specdec.decode import autoregressive_generate

        prompt = lm.encode_chat([{"role": "user", "content": "Write a story about a robot."}])
        gen: dict[str, float] = {}
        for fused in (True, False, True, False):
            model.fused_step = fused
            t0 = time.perf_counter()
            res = autoregressive_generate(model, prompt, max_new_tokens=args.generate)
            rate = len(res.tokens) / (time.perf_counter() - t0)
            key = "fused" if fused else "torch"
            gen[key] = max(gen.get(key, 0.0), rate)
        out["generate"] = gen
    model.fused_step = True
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        model.fused_step = False
        step, pos = ids[:1], torch.tensor([args.prefix])
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(10):
                model(step, pos, cache)
                cache.rollback()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))
    return out


def _stack(model: LlamaModel) -> Any:
    """The model's fused-step stack (built by its first fused step), or None."""
    fused = model._fused
    return None if fused is None else fused.stack


def _binary_tree(n: int, vocab: int, g: torch.Generator) -> Any:
    from specdec.tree import DraftTree

    tokens = torch.randint(0, vocab, (n,), generator=g).tolist()
    return DraftTree(tokens, [-1] + [(i - 1) // 2 for i in range(1, n)])


def _torch_kernels(run: Callable[[], None], repeats: int) -> dict[str, float]:
    """Seconds per call of matmul, attention and other ops: ``torch.profiler``'s self CPU
    time per op, summed by category."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(repeats):
            run()
    out = {"matmul": 0.0, "attention": 0.0, "other": 0.0}
    for e in prof.key_averages():
        name = e.key
        if name.startswith("ProfilerStep"):
            continue
        if any(k in name for k in MATMUL_OPS):
            cat = "matmul"
        elif any(k in name for k in ATTENTION_OPS):
            cat = "attention"
        else:
            cat = "other"
        out[cat] += e.self_cpu_time_total * 1e-6 / repeats
    return out


def step_profile(args: argparse.Namespace) -> dict[str, Any]:
    """Per row count: the verify step's phases, ms per step (means over ``--repeats``)."""
    from specdec.verify import Verifier

    torch.set_num_threads(args.threads)
    model = smollm2().model
    model.numeric = args.numeric
    verifier = Verifier(model)
    g = torch.Generator().manual_seed(0)
    prefix = args.prefix
    cache = model.new_cache(prefix + max(args.rows) + 8)
    ids = torch.randint(0, model.vocab_size, (prefix,), generator=g)
    model.forward_last(ids, torch.arange(prefix), cache)
    cache.commit(list(range(prefix)))
    root = int(ids[-1])
    out: dict[str, Any] = {}
    for n in args.rows:
        tree = _binary_tree(n, model.vocab_size, g)
        fused = n <= model.quant_max_rows or args.numeric == "int8"

        def verify(tree: Any = tree) -> dict[str, float]:
            s = verifier.step(tree, cache, root_token=root)
            cache.truncate(prefix)
            return s.timings

        for _ in range(3):  # warm: the stack, the RoPE tables, torch's allocator
            verify()
        stack = _stack(model) if fused else None
        if stack is not None:
            stack.reset_profile()
            stack.profiling = True
        runs = [verify() for _ in range(args.repeats)]
        # Means: the stack's clock gives totals over the same calls.
        fwd = sum(r["forward"] for r in runs) / len(runs)
        book = sum(v for r in runs for k, v in r.items() if k != "forward") / len(runs)
        phases: dict[str, float] = {"bookkeeping": book}
        if stack is not None:
            stack.profiling = False
            p = stack.profile()
            assert p.calls == args.repeats, p
            per = 1e-9 / p.calls
            phases |= {
                "matmul": p.matmul_ns * per,
                "attention": p.attention_ns * per,
                "other": p.other_ns * per,
            }
        else:
            tt = tree.with_root(root).to(torch.device("cpu"))
            pos, mask = tt.position_ids(prefix), tt.attention_mask(prefix)

            def forward(tt: Any = tt, pos: Any = pos, mask: Any = mask) -> None:
                model(tt.tokens, pos, cache, mask)
                cache.rollback()

            phases |= _torch_kernels(forward, max(3, args.repeats // 3))
        phases["dispatch"] = fwd - phases["matmul"] - phases["attention"] - phases["other"]
        out[str(n)] = {"path": "fused" if stack is not None else "torch"} | {
            k: phases[k] * 1e3 for k in PHASES
        }
    return out


def host_overhead(args: argparse.Namespace) -> dict[str, Any]:
    """Per generator: ms per step (the prefill step left out) and its split."""
    from specdec.decode import SpeculativeGenerator, autoregressive_generate

    torch.set_num_threads(args.threads)
    lm = smollm2()
    model = lm.model
    prompt = lm.encode_chat([{"role": "user", "content": "Write a story about a robot."}])
    autoregressive_generate(model, prompt, max_new_tokens=4)  # builds the stack
    stack = _stack(model)
    assert stack is not None, "the fused step did not run"
    out: dict[str, Any] = {}

    def split(wall: float, steps: int, stages: dict[str, float], fed: int) -> dict[str, Any]:
        p = stack.profile()
        ms = 1e3 / steps
        kernels = (p.matmul_ns + p.attention_ns) * 1e-9
        fwd = stages.pop("forward")
        row: dict[str, Any] = {
            "steps": steps,
            "nodes_per_step": fed / steps,
            "step_ms": wall * ms,
            "matmul_ms": p.matmul_ns * 1e-9 * ms,
            "attention_ms": p.attention_ns * 1e-9 * ms,
            "other_kernels_ms": p.other_ns * 1e-9 * ms,
            "dispatch_ms": (fwd - p.wall_ns * 1e-9) * ms,
        }
        row |= {f"{k}_ms": v * ms for k, v in stages.items()}
        row["untimed_ms"] = (wall - fwd - sum(stages.values())) * ms
        row["host_share"] = 1.0 - kernels / wall
        return row

    # Plain autoregressive: the clock starts at the first step's callback (after prefill).
    mark: list[float] = []

    def on_step(_ctx: list[int], _cache: Any) -> None:
        if not mark:
            stack.reset_profile()
            stack.profiling = True
            mark.append(time.perf_counter())

    res = autoregressive_generate(model, prompt, max_new_tokens=args.host, on_step=on_step)
    wall = time.perf_counter() - mark[0]
    stack.profiling = False
    # The timings of steps 2.. (the first one is the prefill).
    stages = {k: v for k, v in res.timings.items() if k != "prefill"}
    steps = res.steps - 1
    # autoregressive_generate times the first step's mask/rule/commit too: about 1/steps.
    out["ar"] = split(wall, steps, stages, steps)

    gen = SpeculativeGenerator(model, budget=args.tree_nodes - 1, pad_to_budget=True)
    gen.submit(prompt, max_new_tokens=args.host)
    gen.step()  # prefill + the first step
    req = gen._running[0]
    before = dict(req.result.timings)
    stack.reset_profile()
    stack.profiling = True
    steps = fed = 0
    t0 = time.perf_counter()
    last_req = req
    while gen.has_unfinished():
        outs = gen.step()
        steps += 1
        fed += sum(t.num_nodes for t in gen.last_trees)
        for o in outs:
            if o.finished and o.result is not None:
                last_req.result = o.result
    wall = time.perf_counter() - t0
    stack.profiling = False
    after = last_req.result.timings
    stages = {k: after[k] - before.get(k, 0.0) for k in after if k != "prefill"}
    out["tree"] = split(wall, steps, stages, fed)
    out["tree"]["tokens_per_step"] = (len(last_req.result.tokens) - 1) / steps
    return out


def _print_profile(res: dict[str, Any]) -> None:
    print("| rows | path | " + " | ".join(PHASES) + " | step |")
    print("|---:|:---|" + "---:|" * (len(PHASES) + 1))
    for n, r in res.items():
        total = sum(r[k] for k in PHASES)
        cells = " | ".join(f"{r[k]:.2f} ({100 * r[k] / total:.0f}%)" for k in PHASES)
        print(f"| {n} | {r['path']} | {cells} | {total:.2f} |")


def _print_host(res: dict[str, Any]) -> None:
    for name, r in res.items():
        print(
            f"{name}: {r['nodes_per_step']:.1f} nodes/step, {r['step_ms']:.2f} ms/step, "
            f"host overhead {100 * r['host_share']:.1f}%"
        )
        parts = {k: v for k, v in r.items() if k.endswith("_ms") and k != "step_ms"}
        print("  " + ", ".join(f"{k[:-3]} {v:.3f}" for k, v in parts.items()))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prefix", type=int, default=200, help="committed tokens before the step")
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 5, 9])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--generate", type=int, default=0, help="AR tokens/s over N tokens")
    ap.add_argument("--profile", action="store_true", help="torch.profiler table (1 token)")
    ap.add_argument(
        "--rows",
        type=lambda v: [int(x) for x in v.split(",")],
        default=None,
        help="decode step profile at these row counts (e.g. 1,2,4,5,8,16,32,64)",
    )
    ap.add_argument(
        "--numeric",
        default="exact",
        choices=["exact", "int8"],
        help="--rows: the target's numeric mode (int8 runs every row count on the fused step)",
    )
    ap.add_argument("--host", type=int, default=0, help="host overhead over N generated tokens")
    ap.add_argument("--tree-nodes", type=int, default=5, help="--host: nodes per tree")
    ap.add_argument("--json", default=None, help="write the figures here")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rows or args.host:
        if os.environ.get("SPECDEC_LINEAR_THREADS") != str(args.threads[0]):
            env = {**os.environ, "SPECDEC_LINEAR_THREADS": str(max(args.threads))}
            sys.exit(subprocess.run([sys.executable, *sys.argv], env=env).returncode)
        args.threads = max(args.threads)
        report: dict[str, Any] = {"threads": args.threads, "prefix": args.prefix}
        if args.rows:
            report["steps"] = step_profile(args)
            report["numeric"] = args.numeric
            print(
                f"prefix {args.prefix}, {args.threads} threads, numeric {args.numeric}; "
                "ms per step (share)"
            )
            _print_profile(report["steps"])
        if args.host:
            report["host"] = host_overhead(args)
            _print_host(report["host"])
        if args.json:
            with open(args.json, "w") as f:
                json.dump(report, f, indent=1)
        return
    if args.child:
        args.threads = args.threads[0]
        print(json.dumps(measure(args)))
        return
    results = []
    for n in args.threads:
        env = {**os.environ, "SPECDEC_LINEAR_THREADS": str(n)}
        cmd = [sys.executable, __file__, "--child", "--threads", str(n), "--prefix"]
        cmd += [str(args.prefix), "--repeats", str(args.repeats), "--generate"]
        cmd += [str(args.generate), "--sizes", *map(str, args.sizes)]
        if args.profile:
            cmd.append("--profile")
        lines = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
        print(lines.stdout.rsplit("\n", 2)[0] if args.profile else "", end="")
        results.append(json.loads(lines.stdout.strip().splitlines()[-1]))
    print(f"prefix {args.prefix}; ms per step, fastest (median) of {args.repeats}")
    print("| threads | T | torch path | fused step | torch / fused |")
    print("|---:|---:|---:|---:|---:|")
    for res in results:
        for n, s in res["steps"].items():
            (tb, tm), (fb, fm) = s["torch"], s["fused"]
            print(
                f"| {res['threads']} | {n} | {tb:.2f} ({tm:.2f}) | {fb:.2f} ({fm:.2f}) "
                f"| {tb / fb:.2f}x |"
            )
    if args.generate:
        print(f"\ngreedy AR, {args.generate} tokens: tokens/s")
        print("| threads | torch path | fused step | fused / torch |")
        print("|---:|---:|---:|---:|")
        for res in results:
            gt, gf = res["generate"]["torch"], res["generate"]["fused"]
            print(f"| {res['threads']} | {gt:.1f} | {gf:.1f} | {gf / gt:.2f}x |")


if __name__ == "__main__":
    main()
