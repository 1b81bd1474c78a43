"""SmolLM2-135M-Instruct's linear layers through its GGUF blocks (``QuantMatrix``) beside the
float32 paths the same weights take otherwise, same process: oneDNN on packed weights (what
``LlamaModel`` used before) and plain ``F.linear`` (transformers'). Two tables: the 121
products of one forward (30 layers of q/k/v, o, gate/up, down, then the tied LM head) at the
row counts of a decode step (1: a plain step; 5 / 9 / 17 / 33 / 65: draft trees of budget
4 / 8 / 16 / 32 / 64 plus the root), and the whole model forward at those rows with the
blocks on and off. Each figure is the fastest of ``--repeats`` rounds, the paths interleaved
in every round. Run: ``python benches/bench_linear.py [--threads 2] [--repeats 5]``;
``--smoke``: a tiny Q4_1 model written here, two row counts (a test that the script works,
not a measurement).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from specdec._core import QuantMatrix
from specdec.models import smollm2
from specdec.models.gguf import LoadedModel
from specdec.models.quant import quant_matmul, torch_threads


def fastest(fn: Callable[[], object], reps: int) -> float:
    fn()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def _tiny_gguf() -> LoadedModel:
    """A tiny random model, written as a Q4_1 GGUF file and loaded back (for ``--smoke``)."""
    import tempfile

    from specdec.models import LlamaConfig, LlamaModel, load_gguf
    from specdec.testing import write_gguf

    c = LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, rope_theta=10000.0,
        rms_norm_eps=2.0**-17, max_position_embeddings=512, tie_word_embeddings=True,
    )  # fmt: skip
    path = tempfile.mkdtemp() + "/tiny.gguf"
    write_gguf(path, LlamaModel(c).init_random(seed=0).float(), "Q4_1")
    return load_gguf(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rows", default="1,5,9,17,33,65")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.smoke:
        args.rows, args.repeats = "1,5", 1
        lm = _tiny_gguf()
    else:
        lm = smollm2()
    model = lm.model
    if model.quantized is None:
        raise SystemExit("the GGUF blocks are not in use here (no AVX-512, or another format)")
    quant = [m for m, _ in model.quantized.plan]
    groups = [torch.cat(ws) for ws, _ in model._linear_groups()]
    with torch.no_grad():
        packed = [torch.ops.mkldnn._reorder_linear_weight(w) for w in groups]
    rows = [int(r) for r in args.rows.split(",")]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(
        "\n| rows | GGUF blocks ms | oneDNN packed ms | F.linear ms | oneDNN / blocks "
        "| F.linear / blocks |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    for m in rows:
        xs = [torch.randn(m, w.shape[1]) for w in groups]

        def blocks(xs: list[torch.Tensor] = xs) -> None:
            with torch_threads(1):  # as the model's forward runs them
                for q, x in zip(quant, xs, strict=True):
                    quant_matmul(x, q) if isinstance(q, QuantMatrix) else F.linear(x, q)

        def onednn(xs: list[torch.Tensor] = xs) -> None:
            for p, x in zip(packed, xs, strict=True):
                torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], "")

        def plain(xs: list[torch.Tensor] = xs) -> None:
            for w, x in zip(groups, xs, strict=True):
                torch.nn.functional.linear(x, w)

        t = {"b": float("inf"), "o": float("inf"), "p": float("inf")}
        for _ in range(args.repeats):  # interleaved rounds
            t["b"] = min(t["b"], fastest(blocks, 1))
            t["o"] = min(t["o"], fastest(onednn, 1))
            t["p"] = min(t["p"], fastest(plain, 1))
        print(
            f"| {m} | {t['b'] * 1e3:.1f} | {t['o'] * 1e3:.1f} | {t['p'] * 1e3:.1f} | "
            f"{t['o'] / t['b']:.2f}x | {t['p'] / t['b']:.2f}x |"
        )
    # A 200-token prefix, then steps of m tokens (the ids do not change the cost).
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (256,), generator=gen)
    cache = model.new_cache(1024)
    with torch.no_grad():
        model.forward(ids[:200], torch.arange(200), cache)
    cache.commit(list(range(200)))
    print("\n| rows | forward, blocks ms | forward, oneDNN ms | oneDNN / blocks |")
    print("|---:|---:|---:|---:|")
    model.quant_max_rows = max(rows)
    for m in rows:

        def step(on: bool, m: int = m) -> None:
            model.quant_linear = on
            n = cache.committed_len
            model.forward(ids[:m], torch.arange(n, n + m), cache)
            cache.rollback()

        tb = to = float("inf")
        for _ in range(args.repeats):
            tb = min(tb, fastest(lambda: step(True), 3))
            to = min(to, fastest(lambda: step(False), 3))
        print(f"| {m} | {tb * 1e3:.1f} | {to * 1e3:.1f} | {to / tb:.2f}x |")


if __name__ == "__main__":
    main()
