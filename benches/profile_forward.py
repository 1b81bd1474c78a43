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
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

import torch

from specdec.models import smollm2


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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prefix", type=int, default=200, help="committed tokens before the step")
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 5, 9])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--generate", type=int, default=0, help="AR tokens/s over N tokens")
    ap.add_argument("--profile", action="store_true", help="torch.profiler table (1 token)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
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
