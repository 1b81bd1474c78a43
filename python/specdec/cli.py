"""The ``specdec`` console script."""

from __future__ import annotations

import argparse
import platform
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specdec", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("bench", help="time the Rust builder beside the plain-Python version")
    b.add_argument("--quick", action="store_true", help="shorter timing loops")
    d = sub.add_parser("demo", help="run the speculative serving loop on a small random model")
    d.add_argument("--budget", type=int, default=16, help="drafted nodes per tree")
    d.add_argument("--tokens", type=int, default=64, help="tokens to generate")
    d.add_argument("--miss", type=float, default=0.3, help="oracle drafter's miss rate")
    args = parser.parse_args(argv)
    if args.command == "demo":
        return _demo(args.budget, args.tokens, args.miss)
    if args.command == "bench":
        import numpy as np

        from . import __version__
        from .benchmarks import bench_tree

        print(
            f"specdec {__version__}, python {platform.python_version()}, numpy {np.__version__}, "
            f"{platform.machine()}"
        )
        print("DDTree build, L=16 depths, prefix_len=512 (median per call):\n")
        print(bench_tree(quick=args.quick))
    return 0


def _demo(budget: int, tokens: int, miss: float) -> int:
    """Tree speculation vs autoregressive greedy decoding on a random Llama-style target."""
    import time

    import torch

    from .decode import SpeculativeGenerator, autoregressive_generate
    from .models import LlamaConfig, LlamaModel
    from .testing import OracleDrafter
    from .verify import Greedy

    torch.manual_seed(0)
    target = LlamaModel(
        LlamaConfig(vocab_size=1024, hidden_size=128, num_hidden_layers=4, intermediate_size=256)
    ).init_random(0)
    drafter = OracleDrafter(target, miss=miss)
    prompt = list(range(1, 17))
    t0 = time.perf_counter()
    ar = autoregressive_generate(target, prompt, tokens)
    t_ar = time.perf_counter() - t0
    gen = SpeculativeGenerator(target, drafter, rule=Greedy(), budget=budget, depth=8)
    t0 = time.perf_counter()
    out = gen.generate(prompt, tokens)
    t_sp = time.perf_counter() - t0
    same = out.tokens == ar.tokens
    # The oracle drafter runs the target itself to know the answer: leave its time out.
    t_sp -= out.timings.get("draft", 0.0)
    print(f"target: 4-layer Llama-style, vocab 1024 (random weights); drafter miss rate {miss}")
    print(f"autoregressive: {tokens} tokens in {ar.steps} forwards, {t_ar * 1e3:.1f} ms")
    print(
        f"DDTree B={budget}: {len(out.tokens)} tokens in {out.steps} steps "
        f"({out.tokens_per_step:.2f} tokens/step), {t_sp * 1e3:.1f} ms without drafting; "
        f"identical output: {same}"
    )
    print(
        "per-stage totals (ms): " + ", ".join(f"{k} {v * 1e3:.2f}" for k, v in out.timings.items())
    )
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
