"""Tree-verify forward on a GPU: flex attention (block mask from the tree) vs SDPA with the
bool tree mask vs a dense-mask matmul/softmax, at tree budgets B, one Llama-style model.
Sized to run in under 5 minutes on one GPU (not yet run on one); ``--device cpu --quick``
is a smoke test.

    python benches/bench_verify_gpu.py                      # cuda, B in {64, 256, 1024}
    python benches/bench_verify_gpu.py --device cpu --quick
    python benches/bench_verify_gpu.py --smoke      # --quick, on CPU when CUDA is absent

Prints a markdown table (median ms per forward over root + B nodes, CUDA-synchronised) and
the max |flex - sdpa| of the logits, so a fallback or a wrong block mask shows.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from typing import Any

import torch

from specdec.models import LlamaConfig, LlamaModel
from specdec.tree import DDTreeShape
from specdec.verify import Verifier
from specdec.verify.attention import flex_available


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--budgets", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--prefix", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="tiny model and sizes (smoke test)")
    ap.add_argument(
        "--smoke", action="store_true", help="--quick, falling back to CPU when CUDA is absent"
    )
    args = ap.parse_args()
    warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
    if args.smoke:
        args.quick = True
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        if not args.smoke:
            print(f"skipped: CUDA is not available (device {args.device}); try --device cpu")
            return
        print("CUDA is not available: smoke test on CPU\n")
        args.device = "cpu"
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    if not cuda:
        torch.set_num_threads(1)  # a smoke test; extra threads only contend on small shapes
    dtype = torch.bfloat16 if cuda else torch.float32
    if args.quick:
        args.budgets, args.prefix, args.repeats = [16, 64], 64, 3
        shape: dict[str, Any] = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2)
        heads: dict[str, Any] = dict(num_attention_heads=4, num_key_value_heads=2)
    else:
        shape = dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=8)
        heads = dict(num_attention_heads=16, num_key_value_heads=4)  # head_dim 128, GQA 4
    cfg = LlamaConfig(
        vocab_size=32000 if not args.quick else 512,
        max_position_embeddings=args.prefix + max(args.budgets) + 8,
        **shape,
        **heads,
    )
    backends = ["sdpa", "math"] + (["flex"] if flex_available() else [])
    base = LlamaModel(cfg, backend="sdpa").init_random(0)
    models = {}
    for b in backends:
        m = LlamaModel(cfg, backend=b)  # type: ignore[arg-type]
        m.load_state_dict(base.state_dict())
        models[b] = m.to(device=dev, dtype=dtype).eval()

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(dev)

    name = torch.cuda.get_device_name(dev) if cuda else "CPU"
    print(
        f"{name}, torch {torch.__version__}, {dtype}, {cfg.num_hidden_layers} layers, "
        f"hidden {cfg.hidden_size}, prefix {args.prefix}, medians of {args.repeats}\n"
    )
    print(
        "| B | "
        + " | ".join(f"{b} (ms)" for b in backends)
        + " | math / sdpa"
        + (" | flex / sdpa | max abs logit diff flex vs sdpa |" if "flex" in models else " |")
    )
    print("|---" * (2 + len(backends) + (2 if "flex" in models else 0)) + "|")
    g = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, cfg.vocab_size, (args.prefix,), generator=g)
    for budget in args.budgets:
        tree = DDTreeShape(budget).build(3.0 * torch.randn(16, cfg.vocab_size, generator=g), 1)
        tt = tree.to(dev)
        p = args.prefix - 1
        pos, mask = tt.position_ids(p), tt.attention_mask(p)
        times: dict[str, list[float]] = {b: [] for b in backends}
        logits = {}
        caches = {}
        for b, m in models.items():
            caches[b] = m.new_cache(args.prefix + budget + 8)
            Verifier(m).prefill(prefix[:-1].to(dev), caches[b])
        for i in range(args.repeats + 2):  # two warm-ups (flex compiles on the first)
            for b, m in models.items():
                sync()
                t0 = time.perf_counter()
                out = m(tt.tokens, pos, caches[b], mask)
                sync()
                if i >= 2:
                    times[b].append(time.perf_counter() - t0)
                logits[b] = out.float()
                caches[b].rollback()
        med = {b: statistics.median(v) * 1e3 for b, v in times.items()}
        row = f"| {budget} | " + " | ".join(f"{med[b]:.2f}" for b in backends)
        row += f" | {med['math'] / med['sdpa']:.2f}x"
        if "flex" in models:
            diff = (logits["flex"] - logits["sdpa"]).abs().max().item()
            row += f" | {med['flex'] / med['sdpa']:.2f}x | {diff:.3g}"
        print(row + " |")


if __name__ == "__main__":
    main()
