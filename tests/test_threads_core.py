"""The Rust objects a server shares across threads (``BlockManager``, ``Matcher``,
``BudgetStats``): several threads hammer one object at once, the GIL-releasing calls in the
mix, and every call waits for the others instead of failing. Each thread's results must
equal a single-threaded run of the same calls (the oracle), and no thread may raise anything
but the documented errors its calls expect."""

from __future__ import annotations

import functools
import itertools
import math
import random
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

import specdec
from specdec import (
    BlockManager,
    DoubleFree,
    Matcher,
    RegexGrammar,
    UnknownSequence,
    Vocabulary,
    _core,
    build_ddtree_constrained,
    fill_next_token_bitmask_batch,
    fill_tree_bitmask,
)

THREADS = 8
# A hang (a deadlock) fails the test instead of blocking the suite; no run comes near it.
HANG_S = 300.0


@contextmanager
def frequent_switches() -> Iterator[None]:
    """Threads switch every few microseconds (not every 5 ms), so calls interleave often."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        yield
    finally:
        sys.setswitchinterval(old)


def run_threads(work: list[Callable[[], None]]) -> list[BaseException]:
    """Run each callable in its own thread, all released at once; returns what they raised."""
    errors: list[BaseException] = []
    start = threading.Barrier(len(work))

    def body(fn: Callable[[], None]) -> None:
        try:
            start.wait()
            fn()
        except BaseException as e:  # collected; the caller asserts there are none
            errors.append(e)

    threads = [threading.Thread(target=body, args=(fn,), daemon=True) for fn in work]
    with frequent_switches():
        for t in threads:
            t.start()
        for t in threads:
            t.join(HANG_S)
    assert not any(t.is_alive() for t in threads), "threads hung (a deadlock?)"
    return errors


def u64(xs: list[int]) -> np.ndarray:
    return np.array(xs, dtype=np.uint64)


def i64(xs: list[int]) -> np.ndarray:
    return np.array(xs, dtype=np.int64)


# ---- BlockManager ---------------------------------------------------------------------------
BLOCK = 4
# More blocks than a run allocates: no block is handed out twice (a freed block goes to the
# back of the free queue), so which physical blocks a thread gets depends on the interleaving
# but, renamed by first use, nothing else does.
NUM_BLOCKS = 1 << 16
ROUNDS = 3
BATCH = 32
STEPS_KV = 4


class Canon:
    """One thread's block ids renamed in order of first appearance (slots as (block, offset))."""

    def __init__(self) -> None:
        self.names: dict[int, int] = {}

    def block(self, b: int) -> int:
        return self.names.setdefault(int(b), len(self.names))

    def blocks(self, a: np.ndarray) -> tuple[int, ...]:
        return tuple(self.block(b) for b in a.tolist())

    def slots(self, a: np.ndarray) -> tuple[tuple[int, int], ...]:
        return tuple((self.block(s // BLOCK), s % BLOCK) for s in a.tolist())

    def pairs(self, cow: np.ndarray) -> tuple[tuple[int, int], ...]:
        return tuple((self.block(a), self.block(b)) for a, b in cow.tolist())


def kv_ops(t: int) -> Callable[[BlockManager], list[Any]]:
    """Thread ``t``'s calls (random but fixed per thread) on its own sequences, a batch of
    them at a time (so the GIL-releasing calls take a while); the returned function runs them
    on a manager and returns their results, block ids canonical."""
    rng = random.Random(t)
    prompt = i64([rng.randrange(1000) for _ in range(rng.randrange(9, 30))])
    salt = f"thread-{t}"  # a thread's cached blocks are its own

    def counts(lo: int, hi: int, n: int = BATCH) -> list[int]:
        return [rng.randrange(lo, hi) for _ in range(n)]

    plan: list[dict[str, Any]] = [
        {
            "n0": counts(1, 40),
            "append": rng.randrange(0, 9),
            "appends": [counts(0, 9)] + [counts(0, 3, 2 * BATCH) for _ in range(STEPS_KV)],
            "trees": [counts(1, 12, 2 * BATCH) for _ in range(STEPS_KV)],
            "tree": rng.randrange(1, 12),
            "keep": [[rng.random() for _ in range(2 * BATCH)] for _ in range(STEPS_KV)],
            "keep_tree": rng.random(),
            "batched": rng.random() < 0.5,
        }
        for _ in range(ROUNDS)
    ]

    def accepted(n: int, keep: float) -> list[int]:
        # A path's worth of nodes: a prefix of the step's node indices.
        return list(range(int(n * keep)))

    def run(m: BlockManager) -> list[Any]:
        c, out = Canon(), list[Any]()

        def res(r: Any) -> None:
            out.append((c.slots(r.slots), tuple(r.offsets.tolist()), c.pairs(r.cow)))

        def moves(mv: Any) -> None:
            out.append((c.slots(mv.src), c.slots(mv.dst)))

        def state(seqs: list[int]) -> None:
            for s in seqs:
                ln = m.seq_len(s)
                out.append((c.blocks(m.block_table(s)), ln.committed, ln.tentative))
                out.append(c.slots(m.slot_mapping(s, 0, ln.committed)))

        for r, p in enumerate(plan):
            base = (t << 20) + 1000 * r
            a = [base + i for i in range(BATCH)]
            b = [base + BATCH + i for i in range(BATCH)]
            d = base + 2 * BATCH
            if r % 2:
                out.append(("cached", m.allocate_tokens(a[0], prompt, cache_salt=salt)))
                m.mark_computed(a[0], len(prompt))
                m.allocate_batch(u64(a[1:]), i64(p["n0"][1:]))
            elif p["batched"]:
                m.allocate_batch(u64(a), i64(p["n0"]))
            else:
                for s, n in zip(a, p["n0"], strict=True):
                    m.allocate(s, n)
            state(a)
            res(m.append_slots(a[0], p["append"]))
            res(m.append_slots_batch(u64(a), i64(p["appends"][0])))  # GIL released
            if p["batched"]:
                m.fork_batch(u64(a), u64(b))
            else:
                for x, y in zip(a, b, strict=True):
                    m.fork(x, y)
            for step in range(STEPS_KV):  # decode steps, each call with the GIL released
                trees, keep = p["trees"][step], p["keep"][step]
                res(m.reserve_tree_batch(u64(a + b), i64(trees)))
                acc = [accepted(n, k) for n, k in zip(trees, keep, strict=True)]
                off = i64(np.cumsum([0] + [len(x) for x in acc]).tolist())
                flat = i64([i for x in acc for i in x])
                moves(m.commit_batch(u64(a + b), flat, off))
                # The first step copies the forks' shared tails (copy on write).
                res(m.append_slots_batch(u64(a + b), i64(p["appends"][1 + step])))
            m.fork(b[0], d)
            res(m.reserve_tree(d, p["tree"]))
            if p["batched"]:
                m.rollback(d)
            else:
                moves(m.commit(d, i64(accepted(p["tree"], p["keep_tree"]))))
            state(a + b + [d])
            out.append((a[0] in m, d in m))
            m.free(d)
            m.free_batch(u64(a + b))
            bad: list[tuple[Callable[[int], object], int]] = [(m.free, a[0]), (m.seq_len, d)]
            for call, seq in bad:
                try:  # a documented refusal, the same as the oracle's
                    call(seq)
                    out.append("no error")
                except (DoubleFree, UnknownSequence) as e:
                    out.append(type(e).__name__)
        out.append(("blocks named", len(c.names)))
        return out

    return run


def test_block_manager_shared_by_threads() -> None:
    shared = BlockManager(NUM_BLOCKS, BLOCK, True)
    got: dict[int, list[Any]] = {}
    ended: list[int] = []

    def work(t: int) -> Callable[[], None]:
        def go() -> None:
            try:
                got[t] = kv_ops(t)(shared)
            finally:
                ended.append(t)

        return go

    def watch() -> None:
        # Between any two calls of the others, the manager is whole.
        while len(ended) < THREADS:
            shared.check_invariants()
            assert 0 <= shared.num_free_blocks() <= NUM_BLOCKS

    errors = run_threads([work(t) for t in range(THREADS)] + [watch])
    assert errors == []
    # Everything freed: the pool is whole again (cached blocks are free, evictable).
    shared.check_invariants()
    assert len(shared) == 0 and shared.num_free_blocks() == NUM_BLOCKS
    assert not shared.refcounts().any()
    # The oracle: the same calls one thread after another on a fresh manager.
    alone = BlockManager(NUM_BLOCKS, BLOCK, True)
    for t in range(THREADS):
        want = kv_ops(t)(alone)
        assert got[t] == want, f"thread {t}"
    assert sum(got[t][-1][1] for t in got) < NUM_BLOCKS  # (no block had to serve twice)
    assert shared.num_cached_blocks() == alone.num_cached_blocks()


# ---- Matcher --------------------------------------------------------------------------------
# Every string of 1 to 6 letters over "abc" (a thousand tokens: a mask takes a trie walk
# long enough for other threads to call in meanwhile), "é" in bytes and whole, EOS first.
TOKENS: list[bytes | None] = [None]
TOKENS += ["".join(p).encode() for k in range(1, 7) for p in itertools.product("abc", repeat=k)]
TOKENS += [b"\xc3", b"\xa9", "é".encode()]
EOS = 0
ID = {t: i for i, t in enumerate(TOKENS)}
# The text "abcabcba" then EOS: a mask per prefix, most of them different.
WALK = [ID[t] for t in (b"a", b"bc", b"abc", b"b", b"a")] + [EOS]
STEPS = 600
WORDS = (len(TOKENS) + 31) // 32


def shared_grammar() -> RegexGrammar:
    # No mask cache: every fill walks the trie with the GIL released.
    v = Vocabulary.from_bytes(TOKENS, eos_ids=[EOS])
    return RegexGrammar(v, "abcab(c|é)ba", cache_bytes=0, precompute_ms=0)


def masks_along(g: RegexGrammar) -> list[bytes]:
    """Oracle: the mask after each prefix of WALK, one matcher, one thread."""
    m, out = Matcher(g), []
    for n in range(len(WALK) + 1):
        bm = np.zeros((1, WORDS), dtype=np.int32)
        m.fill_next_token_bitmask(bm)
        out.append(bm.tobytes())
        if n < len(WALK):
            assert m.accept_token(WALK[n])
    return out


def ids(*tokens: bytes) -> list[int]:
    return [ID[t] for t in tokens]


TREE = specdec.DraftTree([0, *ids(b"a", b"ab", b"abc", b"c", b"cab", b"b")], [-1, 0, 0, 0, 1, 1, 2])
LOGPROBS = np.log(np.full((3, 4), 0.25, dtype=np.float32))
IDS = np.array(
    [ids(b"a", b"ab", b"abc", b"b"), ids(b"c", b"ca", b"bc", b"cab"), ids(b"b", b"ba", b"a", b"c")]
)


def buffer(rows: int, view: bool) -> np.ndarray:
    """A bitmask buffer; a view (not owning its memory) is filled with the GIL held."""
    return np.zeros((rows + 1, WORDS), dtype=np.int32)[1:] if view else buffer(rows, True).copy()


def tree_results(m: Matcher, view: bool = False) -> tuple[Any, ...]:
    """The tree calls' results at the matcher's state: node masks, valid nodes, built tree."""
    bm = buffer(TREE.num_nodes, view)
    valid = fill_tree_bitmask(m, TREE, bm)
    built = build_ddtree_constrained(LOGPROBS, IDS, 6, m)
    return bm.tobytes(), tuple(valid.tolist()), tuple(built.tokens), tuple(built.parents)


def test_matcher_shared_by_threads() -> None:
    g = shared_grammar()
    masks = masks_along(g)
    assert len(set(masks)) >= 6  # the states differ: a wrong state shows
    oracle, states = [], []
    for n in range(len(WALK) + 1):
        m = Matcher(g)
        assert m.accept_tokens(WALK[:n]) == n
        oracle.append(tree_results(m))
        states.append((m._m.state, m.is_accepting(), m.is_terminated()))
    shared = Matcher(g)
    seen: list[int] = []

    def mutate() -> None:
        # The only thread that moves the shared matcher: along WALK and back, so its state is
        # always the state after some prefix of WALK.
        rng, n = random.Random(0), 0
        for _ in range(STEPS):
            k = rng.randrange(3)
            if k == 0 and n < len(WALK):
                assert shared.accept_token(WALK[n])
                n += 1
            elif k == 1 and n > 0:
                back = rng.randrange(1, n + 1)
                shared.rollback(back)
                n -= back
            elif n < len(WALK) - 1:
                more = WALK[n : n + rng.randrange(1, len(WALK) - n)]
                assert shared.accept_tokens(more) == len(more)
                n += len(more)
            else:
                shared.reset()
                n = 0
            assert shared.num_accepted == n
            seen.append(n)

    def read(view: bool) -> None:
        bm = buffer(2, view)
        for _ in range(STEPS // 3):
            f = shared.fork()
            n = f.num_accepted
            f.fill_next_token_bitmask(bm, 1)
            assert bm[1:].tobytes() == masks[n]
            # The shared matcher itself: some state along WALK.
            shared.fill_next_token_bitmask(bm, 0)
            assert bm[:1].tobytes() in masks
            fill_next_token_bitmask_batch([f, shared], bm)
            assert bm[:1].tobytes() == masks[n] and bm[1:].tobytes() in masks
            assert tree_results(f, view) == oracle[n]
            # Two calls, each at some state along WALK (the mutator may move in between).
            got = tree_results(shared, view)
            assert any(got[:2] == o[:2] for o in oracle)
            assert any(got[2:] == o[2:] for o in oracle)
            assert (f._m.state, f.is_accepting(), f.is_terminated()) == states[n]
            assert (shared._m.state, shared.is_accepting(), shared.is_terminated()) in states
            # A fork is the reader's own: moving it leaves the shared matcher alone.
            if n < len(WALK) and f.accept_token(WALK[n]):
                f.fill_next_token_bitmask(bm)
                assert bm[:1].tobytes() == masks[n + 1]
                f.rollback(1)
            assert f.num_accepted == n

    readers = [functools.partial(read, t % 2 == 1) for t in range(THREADS - 1)]
    errors = run_threads([mutate, *readers])
    assert errors == []
    assert len(seen) == STEPS and len(set(seen)) == len(WALK) + 1


# ---- BudgetStats ----------------------------------------------------------------------------
KW: dict[str, Any] = {"prior": 1.0, "prior_weight": 2.0, "band_optimism": 1.0}
OBSERVES = 25


class SlowCount:
    """An accepted count whose conversion runs Python (and lets other threads in) in the
    middle of the call: the lock must not be held while it runs."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __index__(self) -> int:
        time.sleep(0)
        return self.n


def random_tree(rng: random.Random) -> specdec.DraftTree:
    parents = [-1] + [rng.randrange(i + 1) for i in range(rng.randrange(1, 20))]
    lp = [0.0]
    for p in parents[1:]:
        lp.append(lp[p] + math.log(rng.uniform(0.01, 1.0)))
    return specdec.DraftTree(list(range(len(parents))), parents, logprobs=lp)


def stats_ops(t: int) -> list[tuple[specdec.DraftTree, Any, int]]:
    """Thread ``t``'s observations: (tree, accepted, source)."""
    rng = random.Random(100 + t)
    ops: list[tuple[specdec.DraftTree, Any, int]] = []
    for _ in range(OBSERVES):
        tree = random_tree(rng)
        kind = rng.randrange(3)
        if kind == 0:
            acc: Any = rng.randrange(0, 6)
        elif kind == 1:
            acc = SlowCount(rng.randrange(0, 6))
        else:
            path, node = [], 0
            kids = [i for i in range(1, tree.num_real) if tree.parents[i] == node]
            while kids and rng.random() < 0.7:
                node = rng.choice(kids)
                path.append(node)
                kids = [i for i in range(1, tree.num_real) if tree.parents[i] == node]
            acc = i64(path)
        ops.append((tree, acc, rng.randrange(3)))
    return ops


def test_budget_stats_shared_by_threads() -> None:
    shared = _core.BudgetStats()
    plans = [stats_ops(t) for t in range(THREADS)]

    def work(ops: list[tuple[specdec.DraftTree, Any, int]]) -> Callable[[], None]:
        def go() -> None:
            for i, (tree, acc, source) in enumerate(ops):
                shared.observe(tree._arrays, acc, source=source, **KW)
                cands = [[tree._arrays, ops[i - 1][0]._arrays]]
                got = shared.choose(cands, 8, pick="calibrated", **KW)
                assert got.gains.shape == (9,) and got.picks.shape == (1, 9)
                assert np.isfinite(got.gains).all() and (got.gains >= 0).all()
                vals = shared.node_values(tree._arrays, source=source, **KW)
                assert vals.shape == (tree.num_real - 1,) and np.isfinite(vals).all()
                assert np.isfinite(shared.calibration(**KW)).all()
                assert shared.band_factors(4, source=source, **KW).shape == (4,)
                if i % 5 == 0:
                    try:  # a documented refusal mid-run
                        shared.observe(tree._arrays, i64([tree.num_real]), **KW)
                        raise AssertionError("an accepted node past the tree was taken")
                    except specdec.errors.ConfigError:
                        pass
                for name in ("predicted", "realised", "band_predicted", "band_realised"):
                    assert np.isfinite(getattr(shared, name)).all()

        return go

    errors = run_threads([work(ops) for ops in plans])
    assert errors == []
    # The oracle: the same observations one thread after another (these sums do not depend
    # on the order; the size calibration's band sums do, and are checked for shape only).
    alone = _core.BudgetStats()
    for ops in plans:
        for tree, acc, source in ops:
            alone.observe(tree._arrays, acc, source=source, **KW)
    np.testing.assert_allclose(shared.predicted, alone.predicted, rtol=1e-12)
    np.testing.assert_allclose(shared.realised, alone.realised, rtol=1e-12)
    np.testing.assert_array_equal(shared.tried, alone.tried)
    np.testing.assert_array_equal(shared.reached, alone.reached)
    assert shared.band_predicted.shape == alone.band_predicted.shape
    # Every tree reached depth 0: the trees counted at depth 0 are all the observations.
    assert shared.tried[0] == THREADS * OBSERVES
