"""Where a width-w beam step's time goes on SmolLM2-135M (CPU, one thread): the matmul floor
(the step's linear layers alone, as plain ``F.linear`` and as specdec's packed oneDNN
calls), a memory-bandwidth bound (reading the same weights), specdec's ``forward_paged``
step and its beam bookkeeping, and transformers' forward and ``generate`` per step.

Times are per step, the fastest of ``--repeats`` (wall and thread CPU time: on a shared
machine the CPU time is the steadier of the two). Run: ``python benches/profile_beam_step.py
--prompt chat --width 4``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from bench_beam import run_hf, run_ours, smollm2_pair
from specdec.decode.beam import _Beams, _check_config


def best(fn: Callable[[], Any], repeats: int) -> tuple[float, float]:
    """Fastest (wall ms, thread CPU ms) of ``repeats`` calls."""
    wall, cpu = [], []
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.thread_time()
        fn()
        wall.append(time.perf_counter() - w0)
        cpu.append(time.thread_time() - c0)
    return min(wall) * 1e3, min(cpu) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompt", default="chat")
    ap.add_argument("--width", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model, hf, ids, eos = smollm2_pair(args.prompt)
    w, reps = args.width, args.repeats
    rows: list[tuple[str, float, float]] = []

    # -- the floor: the same linear layers on w rows, nothing else ---------------------------
    layers = model.model.decoder_layers()
    head = model.model.embed_tokens.weight
    x, x2 = torch.randn(w, 576), torch.randn(w, model.config.intermediate_size)
    weights = [(m.weight, m is L.mlp.down_proj) for L in layers for m in (
        L.self_attn.q_proj, L.self_attn.k_proj, L.self_attn.v_proj, L.self_attn.o_proj,
        L.mlp.gate_proj, L.mlp.up_proj, L.mlp.down_proj)]  # fmt: skip
    allw = [t for t, _ in weights] + [head]
    nbytes = sum(t.numel() * t.element_size() for t in allw)

    def blas() -> None:
        for t, down in weights:
            F.linear(x2 if down else x, t)
        F.linear(x, head)

    with torch.no_grad():
        plan = model._decode_plan()
    assert plan is not None

    def packed() -> None:
        for i in range(len(layers)):
            for j in range(4):
                p, b = plan[4 * i + j]
                torch.ops.mkldnn._linear_pointwise(x2 if j == 3 else x, p, b, "none", [], "")
        torch.ops.mkldnn._linear_pointwise(x, plan[-1][0], None, "none", [], "")

    rows.append(("floor: F.linear (BLAS), 211 calls", *best(blas, reps)))
    rows.append(("floor: packed oneDNN, 121 calls (fused qkv, gate/up)", *best(packed, reps)))
    rows.append((f"bandwidth: one pass over the {nbytes / 2**20:.0f} MiB of weights",
                 *best(lambda: [t.sum() for t in allw], reps)))  # fmt: skip

    # -- specdec: one forward_paged step in mid-generation -----------------------------------
    cfg = _check_config(model, w, 32, eos, None, 1.0, False, 1)
    beams = _Beams(model, [ids], cfg, 16, True)
    beams.prefill([ids])
    for t in range(16):
        beams.reorder([min(i, 1) for i in range(w)])
        beams.forward(torch.full((w,), 100 + t), torch.full((w,), len(ids) + t))
    tok, pos = torch.full((w,), 7), torch.full((w,), len(ids) + 16)

    def step() -> None:
        model.forward_paged(tok, pos, beams.caches)
        beams.pool.rollback_decode(beams.caches)

    step()
    rows.append(("specdec forward_paged (packed)", *best(step, reps)))
    model.packed_linear = False
    rows.append(("specdec forward_paged (F.linear)", *best(step, reps)))
    model.packed_linear = True
    beams.free()

    # -- whole searches: forward vs the rest, per step ---------------------------------------
    def timed(obj: Any, name: str, log: list[tuple[float, float]]) -> Callable[[], None]:
        orig = getattr(obj, name)

        def wrapper(*a: Any, **k: Any) -> Any:
            w0, c0 = time.perf_counter(), time.thread_time()
            out = orig(*a, **k)
            log.append(((time.perf_counter() - w0) * 1e3, (time.thread_time() - c0) * 1e3))
            return out

        setattr(obj, name, wrapper)
        return lambda: obj.__dict__.pop(name)

    run_ours(model, ids, 2, 2, eos, True)
    run_hf(hf, ids, 2, 2, eos)
    ours_best: tuple[float, ...] | None = None
    hf_best: tuple[float, ...] | None = None
    for _ in range(3):
        fw: list[tuple[float, float]] = []
        pre: list[tuple[float, float]] = []
        undo = [timed(model, "forward_paged", fw), timed(model, "forward_last", pre)]
        c0 = time.thread_time()
        r, sec = run_ours(model, ids, w, 32, eos, True)
        cpu = (time.thread_time() - c0) * 1e3
        for u in undo:
            u()
        n = len(fw)
        fwd = (sum(a for a, _ in fw) / n, sum(b for _, b in fw) / n)
        rest = ((sec * 1e3 - pre[0][0] - n * fwd[0]) / r.steps,
                (cpu - pre[0][1] - n * fwd[1]) / r.steps)  # fmt: skip
        cand = (sec * 1e3, cpu, pre[0][0], pre[0][1], *fwd, *rest, r.steps)
        if ours_best is None or cand[0] < ours_best[0]:
            ours_best = cand
        hw: list[tuple[float, float]] = []
        st: dict[str, tuple[float, float]] = {}

        def pre_hook(*_: Any, st: dict[str, tuple[float, float]] = st) -> None:
            st["t"] = (time.perf_counter(), time.thread_time())

        def post_hook(*_: Any, st: dict[str, tuple[float, float]] = st,
                      hw: list[tuple[float, float]] = hw) -> None:  # fmt: skip
            hw.append(((time.perf_counter() - st["t"][0]) * 1e3,
                       (time.thread_time() - st["t"][1]) * 1e3))  # fmt: skip

        h1, h2 = hf.register_forward_pre_hook(pre_hook), hf.register_forward_hook(post_hook)
        c0 = time.thread_time()
        _, hsec, calls = run_hf(hf, ids, w, 32, eos)
        hcpu = (time.thread_time() - c0) * 1e3
        h1.remove()
        h2.remove()
        dec = hw[1:]
        hfwd = (sum(a for a, _ in dec) / len(dec), sum(b for _, b in dec) / len(dec))
        hrest = (
            (hsec * 1e3 - sum(a for a, _ in hw)) / calls,
            (hcpu - sum(b for _, b in hw)) / calls,
        )
        hcand = (hsec * 1e3, hcpu, hw[0][0], hw[0][1], *hfwd, *hrest, calls)
        if hf_best is None or hcand[0] < hf_best[0]:
            hf_best = hcand
    assert ours_best is not None and hf_best is not None
    print(f"SmolLM2-135M float32, prompt {args.prompt} ({len(ids)} tokens), width {w}, "
          f"1 thread; ms, fastest of {reps} (floor, step) / 3 (searches)\n")  # fmt: skip
    print("| what | wall ms | CPU ms |\n|---|---|---|")
    for name, a, b in rows:
        print(f"| {name} | {a:.1f} | {b:.1f} |")
    for who, v in (("specdec beam_search", ours_best), ("transformers generate", hf_best)):
        print(f"| {who}: whole search ({v[8]:.0f} steps) | {v[0]:.0f} | {v[1]:.0f} |")
        print(f"| {who}: prefill | {v[2]:.1f} | {v[3]:.1f} |")
        print(f"| {who}: forward per decode step (mean) | {v[4]:.1f} | {v[5]:.1f} |")
        print(
            f"| {who}: rest per step (selection, reorder, bookkeeping) | {v[6]:.2f} | {v[7]:.2f} |"
        )


if __name__ == "__main__":
    main()
