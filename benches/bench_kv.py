"""Paged-KV bookkeeping: specdec's Rust ``BlockManager`` vs a faithful Python re-implementation
of vLLM v1's block pool (refcounted ``KVCacheBlock``s, a doubly linked free queue with O(1)
remove, a hash -> block map for prefix caching), run side by side on the same workloads.

1. Mixed workload at 10k blocks / 256 sequences: allocate, append, fork (copy-on-write of a
   shared partial tail, as vLLM v0's block manager did), free, tree reserve + commit.
   Measured twice: one Python call per operation for both, and grouped into scheduler steps
   (every live sequence appends or runs a tree; a tenth of the ids are freed, allocated,
   forked) where Rust takes one batched call per kind of operation.
2. Per-step bookkeeping for 256 sequences: reserve a 32-node draft tree per sequence,
   then commit 1..6 accepted nodes (moves + releasing the rest). Rust: one batched call
   each; Python peer: its loop.

Run: ``python benches/bench_kv.py`` (prints a markdown table); ``--smoke`` runs every workload
at tiny sizes (a test that the script works, not a measurement).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from specdec.cache import BlockManager

# ---- the peer: vLLM v1's block pool, in Python -----------------------------------------------


class KVCacheBlock:
    __slots__ = ("block_id", "ref_cnt", "block_hash", "prev_free_block", "next_free_block")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: int | None = None
        self.prev_free_block: KVCacheBlock | None = None
        self.next_free_block: KVCacheBlock | None = None


class FreeKVCacheBlockQueue:
    """Doubly linked list of free blocks, LRU order; fake head/tail sentinels."""

    def __init__(self, blocks: list[KVCacheBlock]) -> None:
        self.num_free_blocks = len(blocks)
        self.head, self.tail = KVCacheBlock(-1), KVCacheBlock(-1)
        for i in range(len(blocks)):
            if i > 0:
                blocks[i].prev_free_block = blocks[i - 1]
            if i < len(blocks) - 1:
                blocks[i].next_free_block = blocks[i + 1]
        if blocks:
            self.head.next_free_block, blocks[0].prev_free_block = blocks[0], self.head
            self.tail.prev_free_block, blocks[-1].next_free_block = blocks[-1], self.tail
        else:
            self.head.next_free_block, self.tail.prev_free_block = self.tail, self.head

    def popleft(self) -> KVCacheBlock:
        b = self.head.next_free_block
        if b is self.tail or b is None:
            raise ValueError("no free blocks")
        self.remove(b)
        return b

    def remove(self, b: KVCacheBlock) -> None:
        b.prev_free_block.next_free_block = b.next_free_block  # type: ignore[union-attr]
        b.next_free_block.prev_free_block = b.prev_free_block  # type: ignore[union-attr]
        b.prev_free_block = b.next_free_block = None
        self.num_free_blocks -= 1

    def append(self, b: KVCacheBlock) -> None:
        last = self.tail.prev_free_block
        last.next_free_block, b.prev_free_block = b, last  # type: ignore[union-attr]
        b.next_free_block, self.tail.prev_free_block = self.tail, b
        self.num_free_blocks += 1


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        self.cached_block_hash_to_block: dict[int, dict[int, KVCacheBlock]] = {}

    def get_new_blocks(self, n: int) -> list[KVCacheBlock]:
        if n > self.free_block_queue.num_free_blocks:
            raise ValueError("out of blocks")
        out = []
        for _ in range(n):
            b = self.free_block_queue.popleft()
            self._maybe_evict_cached_block(b)
            b.ref_cnt += 1
            out.append(b)
        return out

    def _maybe_evict_cached_block(self, b: KVCacheBlock) -> None:
        h = b.block_hash
        if h is not None and h in self.cached_block_hash_to_block:
            self.cached_block_hash_to_block[h].pop(b.block_id, None)
            if not self.cached_block_hash_to_block[h]:
                del self.cached_block_hash_to_block[h]
            b.block_hash = None

    def touch(self, blocks: list[KVCacheBlock]) -> None:
        for b in blocks:
            if b.ref_cnt == 0:
                self.free_block_queue.remove(b)
            b.ref_cnt += 1

    def free_blocks(self, ordered: list[KVCacheBlock]) -> None:
        for b in ordered:
            b.ref_cnt -= 1
            if b.ref_cnt == 0:
                self.free_block_queue.append(b)

    def get_num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks


@dataclass
class Req:
    blocks: list[KVCacheBlock]
    num_tokens: int
    pending: int = 0


class PyManager:
    """A request table over ``BlockPool`` with the operations the benchmark needs (fork and
    copy-on-write as in vLLM v0; tree reserve/commit as specdec defines them)."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.pool = BlockPool(num_blocks)
        self.bs = block_size
        self.reqs: dict[int, Req] = {}

    def allocate(self, rid: int, n: int) -> None:
        if rid in self.reqs:
            raise KeyError(rid)
        self.reqs[rid] = Req(self.pool.get_new_blocks(-(-n // self.bs)), n)

    def _grow(self, r: Req, n: int) -> tuple[list[int], tuple[int, int] | None]:
        total = r.num_tokens + r.pending
        cow = None
        need = -(-(total + n) // self.bs) - len(r.blocks)
        shared_tail = n > 0 and total % self.bs != 0 and r.blocks[-1].ref_cnt > 1
        if need + shared_tail > self.pool.get_num_free_blocks():
            raise ValueError("out of blocks")
        if shared_tail:
            (new,) = self.pool.get_new_blocks(1)
            old = r.blocks[-1]
            self.pool.free_blocks([old])
            r.blocks[-1] = new
            cow = (old.block_id, new.block_id)
        if need:
            r.blocks.extend(self.pool.get_new_blocks(need))
        bs = self.bs
        slots = [r.blocks[p // bs].block_id * bs + p % bs for p in range(total, total + n)]
        return slots, cow

    def append_slots(self, rid: int, n: int) -> tuple[list[int], tuple[int, int] | None]:
        r = self.reqs[rid]
        out = self._grow(r, n)
        r.num_tokens += n
        return out

    def fork(self, parent: int, child: int) -> None:
        p = self.reqs[parent]
        if child in self.reqs:
            raise KeyError(child)
        self.pool.touch(p.blocks)
        self.reqs[child] = Req(list(p.blocks), p.num_tokens)

    def free(self, rid: int) -> None:
        r = self.reqs.pop(rid)
        self.pool.free_blocks(list(reversed(r.blocks)))

    def reserve_tree(self, rid: int, n: int) -> tuple[list[int], tuple[int, int] | None]:
        r = self.reqs[rid]
        out = self._grow(r, n)
        r.pending = n
        return out

    def commit(self, rid: int, accepted: list[int]) -> list[tuple[int, int]]:
        r = self.reqs[rid]
        bs, base = self.bs, r.num_tokens
        moves = []
        for j, i in enumerate(accepted):
            if i != j:
                s, d = base + i, base + j
                moves.append(
                    (
                        r.blocks[s // bs].block_id * bs + s % bs,
                        r.blocks[d // bs].block_id * bs + d % bs,
                    )
                )
        r.num_tokens += len(accepted)
        r.pending = 0
        keep = -(-r.num_tokens // bs)
        extra = r.blocks[keep:]
        del r.blocks[keep:]
        self.pool.free_blocks(list(reversed(extra)))
        return moves


# ---- workloads -----------------------------------------------------------------------------


def make_ops(n_ops: int, n_seqs: int, seed: int) -> list[tuple[Any, ...]]:
    """A mixed op list valid for both managers (the generator tracks liveness)."""
    rng = np.random.default_rng(seed)
    live: set[int] = set()
    dead = list(range(n_seqs))
    ops: list[tuple[Any, ...]] = []
    for _ in range(n_ops):
        r = rng.random()
        if dead and (r < 0.1 or not live):
            s = dead.pop(int(rng.integers(len(dead))))
            ops.append(("alloc", s, int(rng.integers(32, 512))))
            live.add(s)
        elif r < 0.2 and dead:
            s = dead.pop(int(rng.integers(len(dead))))
            p = int(rng.choice(list(live)))
            ops.append(("fork", p, s))
            live.add(s)
        elif r < 0.3 and len(live) > n_seqs // 2:
            s = int(rng.choice(list(live)))
            live.remove(s)
            dead.append(s)
            ops.append(("free", s))
        elif r < 0.65:
            ops.append(("append", int(rng.choice(list(live))), int(rng.integers(1, 5))))
        else:
            n = int(rng.integers(8, 65))
            k = int(rng.integers(1, 7))
            acc = [0] + sorted(rng.choice(np.arange(1, n), size=k - 1, replace=False).tolist())
            ops.append(("tree", int(rng.choice(list(live))), n, np.array(acc, dtype=np.int64)))
    return ops


def run_rust(ops: list[tuple[Any, ...]], nb: int, bs: int) -> float:
    m = BlockManager(nb, bs)
    t = time.perf_counter()
    for op in ops:
        kind = op[0]
        if kind == "append":
            m.append_slots(op[1], op[2])
        elif kind == "tree":
            m.reserve_tree(op[1], op[2])
            m.commit(op[1], op[3])
        elif kind == "alloc":
            m.allocate(op[1], op[2])
        elif kind == "fork":
            m.fork(op[1], op[2])
        else:
            m.free(op[1])
    return time.perf_counter() - t


def run_py(ops: list[tuple[Any, ...]], nb: int, bs: int) -> float:
    m = PyManager(nb, bs)
    ops = [op if op[0] != "tree" else (*op[:3], op[3].tolist()) for op in ops]
    t = time.perf_counter()
    for op in ops:
        kind = op[0]
        if kind == "append":
            m.append_slots(op[1], op[2])
        elif kind == "tree":
            m.reserve_tree(op[1], op[2])
            m.commit(op[1], op[3])
        elif kind == "alloc":
            m.allocate(op[1], op[2])
        elif kind == "fork":
            m.fork(op[1], op[2])
        else:
            m.free(op[1])
    return time.perf_counter() - t


@dataclass
class Step:
    free: np.ndarray
    alloc: np.ndarray
    alloc_n: np.ndarray
    fork_p: np.ndarray
    fork_c: np.ndarray
    app: np.ndarray
    app_n: np.ndarray
    tree: np.ndarray
    tree_n: np.ndarray
    acc: list[list[int]]
    acc_flat: np.ndarray
    acc_off: np.ndarray

    @property
    def ops(self) -> int:
        return len(self.free) + len(self.alloc) + len(self.fork_c) + len(self.app) + len(self.tree)


def make_steps(n_ops: int, n_seqs: int, seed: int) -> list[Step]:
    """Scheduler steps: every live sequence does one decode operation (half append 1..4
    tokens, half a tree reserve + commit), and ``n_seqs // 10`` each of frees (while more than
    half are live), allocations and forks, i.e. about the same mix as ``make_ops``."""
    rng = np.random.default_rng(seed)
    live: list[int] = []
    dead = list(range(n_seqs))
    steps: list[Step] = []
    total = 0
    u64 = np.uint64
    k_life = max(1, n_seqs // 10)
    while total < n_ops:
        rng.shuffle(dead)
        k = max(0, min(len(live) - n_seqs // 2, k_life))
        freed = [live.pop(int(rng.integers(len(live)))) for _ in range(k)]
        alloc = [dead.pop() for _ in range(min(k_life, len(dead)))]
        parents = [int(rng.choice(live)) for _ in range(min(k_life, len(dead)))] if live else []
        children = [dead.pop() for _ in parents]
        dead += freed
        live += alloc + children
        order = rng.permutation(live)
        app, tree = order[: len(order) // 2], order[len(order) // 2 :]
        tree_n = rng.integers(8, 65, size=len(tree))
        acc = []
        for n in tree_n:
            k = int(rng.integers(1, 7))
            acc.append([0] + sorted(rng.choice(np.arange(1, n), k - 1, replace=False).tolist()))
        st = Step(
            np.array(freed, dtype=u64),
            np.array(alloc, dtype=u64),
            rng.integers(32, 512, size=len(alloc)).astype(np.int64),
            np.array(parents, dtype=u64),
            np.array(children, dtype=u64),
            app.astype(u64),
            rng.integers(1, 5, size=len(app)).astype(np.int64),
            tree.astype(u64),
            tree_n.astype(np.int64),
            acc,
            np.array([i for a in acc for i in a], dtype=np.int64),
            np.cumsum([0] + [len(a) for a in acc]).astype(np.int64),
        )
        steps.append(st)
        total += st.ops
    return steps


def steps_rust(steps: list[Step], nb: int, bs: int) -> float:
    m = BlockManager(nb, bs)
    t = time.perf_counter()
    for st in steps:
        m.free_batch(st.free)
        m.allocate_batch(st.alloc, st.alloc_n)
        m.fork_batch(st.fork_p, st.fork_c)
        m.append_slots_batch(st.app, st.app_n)
        m.reserve_tree_batch(st.tree, st.tree_n)
        m.commit_batch(st.tree, st.acc_flat, st.acc_off)
    return time.perf_counter() - t


def steps_py(steps: list[Step], nb: int, bs: int) -> float:
    m = PyManager(nb, bs)
    plain = [
        (
            st.free.tolist(),
            list(zip(st.alloc.tolist(), st.alloc_n.tolist(), strict=True)),
            list(zip(st.fork_p.tolist(), st.fork_c.tolist(), strict=True)),
            list(zip(st.app.tolist(), st.app_n.tolist(), strict=True)),
            list(zip(st.tree.tolist(), st.tree_n.tolist(), st.acc, strict=True)),
        )
        for st in steps
    ]
    t = time.perf_counter()
    for free, alloc, fork, app, tree in plain:
        for s in free:
            m.free(s)
        for s, n in alloc:
            m.allocate(s, n)
        for p, c in fork:
            m.fork(p, c)
        for s, n in app:
            m.append_slots(s, n)
        for s, n, _ in tree:
            m.reserve_tree(s, n)
        for s, _, acc in tree:
            m.commit(s, acc)
    return time.perf_counter() - t


def step_inputs(n_seqs: int, steps: int, nodes: int, seed: int) -> list[tuple[Any, ...]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        accs = []
        for _ in range(n_seqs):
            k = int(rng.integers(1, 7))
            accs.append(
                [0] + sorted(rng.choice(np.arange(1, nodes), k - 1, replace=False).tolist())
            )
        flat = np.array([i for a in accs for i in a], dtype=np.int64)
        offsets = np.cumsum([0] + [len(a) for a in accs]).astype(np.int64)
        out.append((accs, flat, offsets))
    return out


def step_rust(n_seqs: int, steps: list[tuple[Any, ...]], nb: int, bs: int, nodes: int) -> float:
    m = BlockManager(nb, bs)
    for s in range(n_seqs):
        m.allocate(s, 100 + s % 50)
    seqs = np.arange(n_seqs, dtype=np.uint64)
    counts = np.full(n_seqs, nodes, dtype=np.int64)
    t = time.perf_counter()
    for _, flat, offsets in steps:
        m.reserve_tree_batch(seqs, counts)
        m.commit_batch(seqs, flat, offsets)
    return (time.perf_counter() - t) / len(steps)


def step_rust_loop(
    n_seqs: int, steps: list[tuple[Any, ...]], nb: int, bs: int, nodes: int
) -> float:
    m = BlockManager(nb, bs)
    for s in range(n_seqs):
        m.allocate(s, 100 + s % 50)
    arrs = [[np.array(a, dtype=np.int64) for a in accs] for accs, _, _ in steps]
    t = time.perf_counter()
    for accs in arrs:
        for s in range(n_seqs):
            m.reserve_tree(s, nodes)
        for s, a in enumerate(accs):
            m.commit(s, a)
    return (time.perf_counter() - t) / len(steps)


def step_py(n_seqs: int, steps: list[tuple[Any, ...]], nb: int, bs: int, nodes: int) -> float:
    m = PyManager(nb, bs)
    for s in range(n_seqs):
        m.allocate(s, 100 + s % 50)
    t = time.perf_counter()
    for accs, _, _ in steps:
        for s in range(n_seqs):
            m.reserve_tree(s, nodes)
        for s, a in enumerate(accs):
            m.commit(s, a)
    return (time.perf_counter() - t) / len(steps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--ops", type=int, default=100_000)
    ap.add_argument("--blocks", type=int, default=10_000)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--seqs", type=int, default=256)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--nodes", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--smoke", action="store_true", help="every workload at tiny sizes (explicit flags win)"
    )
    a = ap.parse_args()
    if a.smoke:
        ap.set_defaults(ops=1000, blocks=1000, seqs=16, steps=2, nodes=16, repeats=1)
        a = ap.parse_args()
    ops = make_ops(a.ops, a.seqs, 0)
    n_calls = sum(2 if op[0] == "tree" else 1 for op in ops)
    rust = min(run_rust(ops, a.blocks, a.block_size) for _ in range(a.repeats))
    py = min(run_py(ops, a.blocks, a.block_size) for _ in range(a.repeats))
    msteps = make_steps(a.ops, a.seqs, 2)
    m_ops = sum(st.ops for st in msteps)
    mr = min(steps_rust(msteps, a.blocks, a.block_size) for _ in range(a.repeats))
    mp = min(steps_py(msteps, a.blocks, a.block_size) for _ in range(a.repeats))
    steps = step_inputs(a.seqs, a.steps, a.nodes, 1)
    sr = min(step_rust(a.seqs, steps, a.blocks, a.block_size, a.nodes) for _ in range(a.repeats))
    sl = min(
        step_rust_loop(a.seqs, steps, a.blocks, a.block_size, a.nodes) for _ in range(a.repeats)
    )
    sp = min(step_py(a.seqs, steps, a.blocks, a.block_size, a.nodes) for _ in range(a.repeats))
    print(
        f"{a.ops} mixed ops ({n_calls} calls), {a.blocks} blocks of {a.block_size}, "
        f"{a.seqs} sequences; step = reserve {a.nodes}-node tree + commit 1..6 nodes for "
        f"{a.seqs} sequences; best of {a.repeats}\n"
    )
    print("| workload | specdec (Rust) | vLLM-v1-style pool (Python) | ratio |")
    print("|---|---|---|---|")
    print(
        f"| mixed ops, one call per op | {a.ops / rust / 1e6:.2f} M ops/s | "
        f"{a.ops / py / 1e6:.3f} M ops/s | {py / rust:.1f}x |"
    )
    print(
        f"| mixed ops in scheduler steps (Rust: 6 batched calls per step) | "
        f"{m_ops / mr / 1e6:.2f} M ops/s | {m_ops / mp / 1e6:.3f} M ops/s | {mp / mr:.1f}x |"
    )
    print(
        f"| step bookkeeping, {a.seqs} seqs (Rust batched: 2 calls) | {sr * 1e6:.1f} us | "
        f"{sp * 1e6:.0f} us | {sp / sr:.1f}x |"
    )
    print(
        f"| step bookkeeping, {a.seqs} seqs (Rust: one call per seq and op) | {sl * 1e6:.1f} us | "
        f"{sp * 1e6:.0f} us | {sp / sl:.1f}x |"
    )


if __name__ == "__main__":
    main()
