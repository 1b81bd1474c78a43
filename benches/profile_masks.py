"""Where specdec's slow JSON Schema masks come from: every MaskBench schema compiled and
masked along its valid instances in a forked child (as ``bench_maskbench.py`` does, warm-up
schema included), each mask timed with its wall and thread CPU time and the page faults it
took; then the percentiles, the masks over the p99 sorted by where in the document they fall,
and how time follows page faults.

    python benches/profile_masks.py --data DIR [--vocab smollm2|tekken] [--step K] [--cold-child]

``--step K``: every K-th schema file. Only specdec (no peers: see ``bench_maskbench.py`` for
the side-by-side run). A forked child's write to memory it shares with its parent costs a
copy-on-write page fault (about 2 µs here), a first touch of fresh memory about 0.4 µs, so
the fault count is printed beside the time.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pickle
import resource
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("RAYON_NUM_THREADS", "1")

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_maskbench import WARM_UP_SCHEMA, Tokens  # noqa: E402
from specdec import Vocabulary  # noqa: E402
from specdec.constrain.grammar import CfgGrammar  # noqa: E402
from specdec.constrain.numpy import allocate_token_bitmask  # noqa: E402

Mask = tuple[float, float, int, int, int]  # wall s, cpu s, faults, instance, token index


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _child(vocab: Vocabulary, schema: str, instances: list[list[int]], warm: bool) -> Any:
    bm = allocate_token_bitmask(1, vocab.vocab_size)
    if warm:
        CfgGrammar.from_json_schema(vocab, WARM_UP_SCHEMA).matcher().fill_next_token_bitmask(bm)
    t0 = time.perf_counter()
    try:
        g = CfgGrammar.from_json_schema(vocab, schema)
    except Exception:
        return None, []
    compile_s = time.perf_counter() - t0
    masks: list[Mask] = []
    for k, ids in enumerate(instances):
        m = g.matcher()
        for i, t in enumerate([*ids, None]):
            f0 = _faults()
            a, c = time.perf_counter(), time.thread_time()
            m.fill_next_token_bitmask(bm)
            masks.append((time.perf_counter() - a, time.thread_time() - c, _faults() - f0, k, i))
            if t is None or not m.accept_token(t):
                break
    return compile_s, masks


def _in_child(fn: Any) -> Any:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.write(w, pickle.dumps(fn()))
        os._exit(0)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 1 << 16):
        chunks.append(chunk)
    os.close(r)
    os.waitpid(pid, 0)
    return pickle.loads(b"".join(chunks))


def _where(prefix: bytes, i: int) -> str:
    """Where in the document a mask falls, by the text before it."""
    if i == 0:
        return "document start"
    if prefix.endswith(b':"'):
        return 'string value start (after :")'
    if prefix.endswith((b',"', b'{"')):
        return 'property name start (after {" or ,")'
    if prefix.endswith(b":"):
        return "value start (after :)"
    if prefix.endswith((b",", b"[", b"{")):
        return "after , [ {"
    return "inside a value or name"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="the MaskBench data directory")
    ap.add_argument("--vocab", choices=["tekken", "smollm2"], default="smollm2")
    ap.add_argument("--step", type=int, default=1, help="every K-th schema file")
    ap.add_argument("--cold-child", action="store_true", help="no warm-up schema first")
    args = ap.parse_args()
    if args.vocab == "tekken":
        vocab = Vocabulary.from_tekken()
    else:
        from specdec.models import smollm2

        vocab = smollm2().vocabulary()
    tok = Tokens(vocab)
    files = sorted(Path(args.data).glob("*.json"))[:: args.step]
    compiles: list[float] = []
    masks: list[tuple[Mask, bytes]] = []
    for f in files:
        case = json.loads(f.read_text())
        schema = json.dumps(case["schema"])
        instances = [
            tok.encode(json.dumps(t["data"], separators=(",", ":"), ensure_ascii=False).encode())
            for t in case["tests"]
            if t["valid"]
        ]
        job = (vocab, schema, instances, not args.cold_child)
        compile_s, got = _in_child(lambda job=job: _child(*job))
        if compile_s is None:
            continue
        compiles.append(compile_s)
        for m in got:
            ids = instances[m[3]][: m[4]]
            masks.append((m, b"".join(tok.bytes[t] or b"" for t in ids[-8:])))
    wall = np.array([m[0][0] for m in masks]) * 1e6
    cpu = np.array([m[0][1] for m in masks]) * 1e6
    faults = np.array([m[0][2] for m in masks])
    p99 = float(np.percentile(wall, 99))
    print(
        f"{args.vocab}: {len(compiles)} schemas compiled of {len(files)}, compile p50 "
        f"{np.percentile(compiles, 50) * 1e3:.2f} ms; {len(wall)} masks: wall p50 "
        f"{np.percentile(wall, 50):.1f} µs, p99 {p99:.1f} µs (cpu p99 "
        f"{np.percentile(cpu, 99):.1f}); page faults per mask {faults.mean():.2f}"
    )
    slow = [(m, pre) for m, pre in masks if m[0] * 1e6 >= p99]
    kinds: collections.Counter[str] = collections.Counter()
    spent: collections.defaultdict[str, float] = collections.defaultdict(float)
    for m, pre in slow:
        kind = _where(pre, m[4])
        kinds[kind] += 1
        spent[kind] += m[0] * 1e6
    print(f"\nmasks over the p99 ({len(slow)}), by place:")
    for kind, n in kinds.most_common():
        print(f"  {n:5d}  mean {spent[kind] / n:6.0f} µs  {kind}")
    print("\nmasks by page faults taken:")
    for lo, hi in [(0, 1), (1, 5), (5, 10), (10, 20), (20, 50), (50, None)]:
        sel = wall[(faults >= lo) & (faults < (hi if hi is not None else 1 << 30))]
        if len(sel):
            label = f"{lo}-{hi - 1}" if hi is not None else f">= {lo}"
            print(
                f"  {label:>6} faults: {len(sel):6d} masks, median {np.median(sel):6.1f} µs, "
                f"p90 {np.percentile(sel, 90):6.1f} µs"
            )


if __name__ == "__main__":
    main()
