"""specdec's decode step beside llama.cpp's on the same GGUF file (SmolLM2-135M-Instruct,
Q4_1), in one run: ``llama-bench``'s ``tg`` test (``-p 0 -n N``: N one-token decode steps,
tokens/s) against specdec's ``LlamaModel`` decoding N tokens one at a time
(``autoregressive_generate``, greedy, from a one-token prompt: N one-token steps, each from
its input to the chosen token and its commit), for each engine configuration:

- ``torch``: the PyTorch layer loop with the linears on the GGUF blocks (``fused_step`` off);
- ``fused exact``: the whole step in one Rust call, float32 products (the default);
- ``fused int8``: the same with 8-bit activations and integer dot products
  (``numeric="int8"``).

Each cell is the best of ``--repeats`` runs, the configurations alternating (a shared
machine's bursts land on different ones). llama.cpp comes from ``$SPECDEC_PEERS``
(``benches/peers/llama_cpp.sh`` builds it) or ``--llama-bench``.

Run: ``python benches/bench_llama_cpp.py [--tokens 128] [--threads 2] [--repeats 3]``;
``--smoke``: 8 tokens, one round, llama.cpp only where it is found.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import torch

from specdec.decode import autoregressive_generate
from specdec.models import smollm2
from specdec.models.gguf import smollm2_path
from specdec.models.llama import LlamaModel

CONFIGS: dict[str, dict[str, Any]] = {
    "torch": {"fused_step": False, "numeric": "exact"},
    "fused exact": {"fused_step": True, "numeric": "exact"},
    "fused int8": {"fused_step": True, "numeric": "int8"},
}


def llama_bench_path(arg: str | None) -> str | None:
    if arg:
        return arg
    peers = os.environ.get("SPECDEC_PEERS")
    if peers:
        for sub in ("llama.cpp/bin/llama-bench", "llama.cpp/build/bin/llama-bench"):
            p = Path(peers) / sub
            if p.is_file():
                return str(p)
    return shutil.which("llama-bench")


def llama_tg(binary: str, model: Path, tokens: int, threads: int) -> float:
    """llama-bench's tg tokens/s (one run of ``-r 1``: the repeats alternate here)."""
    out = subprocess.run(
        [binary, "-m", str(model), "-p", "0", "-n", str(tokens), "-t", str(threads)]
        + ["-r", "1", "-o", "json"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    rows = [r for r in json.loads(out) if r.get("n_gen", 0) == tokens]
    return float(rows[0]["avg_ts"])


def specdec_tg(model: LlamaModel, tokens: int) -> float:
    """Tokens/s of ``tokens`` greedy one-token steps from a one-token prompt, as a user's
    loop runs them (``autoregressive_generate``: each step's forward, the greedy choice,
    the commit; the fused step hands over its own argmax)."""
    t0 = time.perf_counter()
    res = autoregressive_generate(model, [1], max_new_tokens=tokens)
    secs = time.perf_counter() - t0
    assert len(res.tokens) == tokens
    return tokens / secs


def configure(model: LlamaModel, cfg: dict[str, Any]) -> None:
    for k, v in cfg.items():
        setattr(model, k, v)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--llama-bench", default=None)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--smoke", action="store_true", help="8 tokens, one round")
    args = ap.parse_args()
    if args.smoke:
        args.tokens, args.repeats = 8, 1
    torch.set_num_threads(args.threads)
    os.environ.setdefault("SPECDEC_LINEAR_THREADS", str(args.threads))
    binary = llama_bench_path(args.llama_bench)
    if binary is None and not args.smoke:
        raise SystemExit("llama-bench not found: set SPECDEC_PEERS or pass --llama-bench")
    model = smollm2().model
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    for c in configs:  # warm-up: packing, the int8 layout, the RoPE tables
        configure(model, CONFIGS[c])
        specdec_tg(model, 8)
    best: dict[str, float] = {}
    for _ in range(args.repeats):
        if binary is not None:
            best["llama.cpp"] = max(
                best.get("llama.cpp", 0.0),
                llama_tg(binary, smollm2_path(), args.tokens, args.threads),
            )
        for c in configs:
            configure(model, CONFIGS[c])
            best[c] = max(best.get(c, 0.0), specdec_tg(model, args.tokens))
    ref = best.get("llama.cpp")
    print(f"tg{args.tokens}, {args.threads} threads, best of {args.repeats}")
    print("| engine | tokens/s | ms/token | vs llama.cpp |")
    print("|---|---:|---:|---:|")
    for name, ts in best.items():
        ratio = "-" if ref is None else f"{ts / ref:.2f}x"
        print(f"| {name} | {ts:.1f} | {1e3 / ts:.2f} | {ratio} |")
    if args.json:
        args.json.write_text(json.dumps(best, indent=1))


if __name__ == "__main__":
    main()
