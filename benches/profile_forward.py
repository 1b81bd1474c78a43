"""Time SmolLM2-135M's decode forward in specdec's ``LlamaModel`` (CPU float32, one thread):
one token, and a 5- and a 9-token tree step (a chain's causal mask) after a prefix, each the
fastest thread CPU time of ``--repeats`` (the step is rolled back after each call). With
``--profile``, ``torch.profiler``'s per-op table of the 1-token step, to see how much of the
forward is small-op and Python overhead. Run: ``python benches/profile_forward.py``.
"""

from __future__ import annotations

import argparse
import time

import torch

from specdec.models import smollm2


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prefix", type=int, default=200, help="committed tokens before the step")
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 5, 9])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--profile", action="store_true", help="torch.profiler table (1 token)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = smollm2().model
    cache = model.new_cache(args.prefix + 64)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.vocab_size, (args.prefix,), generator=g)
    model.forward_last(ids, torch.arange(args.prefix), cache)
    cache.commit(list(range(args.prefix)))
    for n in args.sizes:
        step = torch.randint(0, model.vocab_size, (n,), generator=g)
        pos = torch.arange(args.prefix, args.prefix + n)
        # A tree step passes its own mask (here a chain): the verify path's call.
        mask = None if n == 1 else torch.ones(n, args.prefix + n, dtype=torch.bool)
        if mask is not None:
            mask[:, args.prefix :] = torch.tril(mask[:, args.prefix :])
        times = []
        for _ in range(args.repeats):
            t0 = time.thread_time()
            model(step, pos, cache, mask)
            times.append(time.thread_time() - t0)
            cache.rollback()
        med = sorted(times)[len(times) // 2]
        print(f"T={n:2d}: {min(times) * 1e3:.2f} ms (median {med * 1e3:.2f})")
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        step, pos = ids[:1], torch.tensor([args.prefix])
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(10):
                model(step, pos, cache)
                cache.rollback()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))


if __name__ == "__main__":
    main()
