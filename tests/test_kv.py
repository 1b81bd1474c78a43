"""Stateful property test of the Rust ``BlockManager`` (hypothesis RuleBasedStateMachine).

A plain model keeps, per sequence, the K/V "content" every committed position must hold (a
function of the whole token prefix, as in a real model). A fake slot storage executes the
manager's copy-on-write pairs and commit moves as the tensor layer does. After every rule:
refcounts equal the number of block tables holding each block, free + used == total, no
free block is referenced, the free queue is exactly the refcount-0 blocks, and every
sequence reads its model content through its slot mapping. Refused operations raise the
right exception and change nothing.

Writes may lag allocation (a scheduler allocates a step's sequences before its forward): a
prompt's K/V can stay unwritten until a later rule, and ``mark_computed`` reports only the
written prefix. A prefix hit must read exactly the model's K/V, so a block registered before
its K/V exists fails the machine; the cache salt enters the model's content, so a hit across
salts fails it too.
"""

from __future__ import annotations

import hashlib
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from specdec import KVCacheError, OutOfBlocks, UnknownSequence
from specdec._core import block_hash
from specdec.cache import BlockManager
from specdec.errors import DoubleFree, SlotNotReserved, SpecdecTypeError

SEQ = st.integers(0, 7)
MASK = (1 << 62) - 1


def content(prev: int, token: int, extra: object) -> int:
    return (hash((prev, token, extra)) & MASK) | 1  # never 0: 0 marks "never written"


def _lens(m: BlockManager, s: int) -> tuple[int, int]:
    n = m.seq_len(s)
    return n.committed, n.tentative


def snapshot(m: BlockManager) -> tuple:
    tables = tuple((s, tuple(m.block_table(s)), _lens(m, s)) for s in m.sequences())
    return tuple(m.refcounts()), tuple(m.free_queue()), tables, m.num_cached_blocks()


class Model:
    def __init__(self, extra: object) -> None:
        self.extra = extra
        self.values: list[int] = []
        self.tokens: list[int] = []
        self.written: list[bool] = []  # position i's K/V is in the storage

    def push(self, token: int) -> int:
        self.tokens.append(token)
        self.values.append(content(self.values[-1] if self.values else 7, token, self.extra))
        self.written.append(True)
        return self.values[-1]

    def written_prefix(self) -> int:
        return next((i for i, w in enumerate(self.written) if not w), len(self.written))

    def copy(self) -> Model:
        m = Model(self.extra)
        m.values = list(self.values)
        m.tokens = list(self.tokens)
        m.written = list(self.written)
        return m


class BlockManagerMachine(RuleBasedStateMachine):
    ops = 0
    cows = 0
    hits = 0
    refusals: dict[str, int] = {}

    @initialize(num_blocks=st.integers(4, 40), block_size=st.integers(1, 4), caching=st.booleans())
    def setup(self, num_blocks: int, block_size: int, caching: bool) -> None:
        self.m = BlockManager(num_blocks, block_size, caching)
        self.bs = block_size
        self.storage = np.zeros(num_blocks * block_size, dtype=np.int64)
        self.model: dict[int, Model] = {}

    # ---- helpers -------------------------------------------------------------------------
    def refuse(self, exc: type[Exception], fn, *args) -> None:  # type: ignore[no-untyped-def]
        before = snapshot(self.m)
        with pytest.raises(exc):
            fn(*args)
        assert snapshot(self.m) == before, "a refused operation changed the manager"
        BlockManagerMachine.refusals[exc.__name__] = (
            BlockManagerMachine.refusals.get(exc.__name__, 0) + 1
        )

    def live(self, i: int) -> int:
        """Mostly a live sequence (so most operations are accepted), sometimes any id."""
        live = sorted(self.model)
        return live[i % len(live)] if live and i < 6 else i

    def expect_cow(self, seq: int) -> bool:
        n, pending = _lens(self.m, seq)
        table = self.m.block_table(seq)
        if (n + pending) % self.bs == 0:
            return False
        tail = int(table[-1])
        return self.m.refcounts()[tail] > 1 or self.m.is_cached(tail)  # cached: immutable

    def run_cow(self, cow: np.ndarray) -> None:
        for src, dst in cow:
            self.storage[dst * self.bs : (dst + 1) * self.bs] = self.storage[
                src * self.bs : (src + 1) * self.bs
            ]
            BlockManagerMachine.cows += 1

    def write_pending(self, seq: int) -> None:
        """The caller's late writes: every unwritten position of ``seq`` gets its K/V."""
        mod = self.model[seq]
        slots = self.m.slot_mapping(seq, 0, len(mod.values))
        for i, w in enumerate(mod.written):
            if not w:
                self.storage[slots[i]] = mod.values[i]
        mod.written = [True] * len(mod.values)

    def blocks_needed(self, seq: int, n: int) -> int:
        ln, pending = _lens(self.m, seq)
        table = self.m.block_table(seq)
        new = -(-(ln + pending + n) // self.bs) - len(table)
        return new + (1 if n and self.expect_cow(seq) else 0)

    # ---- rules ---------------------------------------------------------------------------
    @rule(
        seq=SEQ,
        # Few distinct prompts and keys, so that prefix hits happen often.
        tokens=st.sampled_from([[0] * 12, [0, 1] * 6, [1] * 9]).flatmap(
            lambda p: st.integers(0, len(p)).map(lambda n: p[:n])
        )
        | st.lists(st.integers(0, 1), max_size=12),
        extra=st.sampled_from([0, 0, 0, 1]),
        salt=st.sampled_from([None, None, None, b"", b"t1", "t1", b"t2"]),
        prefix_only=st.booleans(),
        late=st.booleans(),
    )
    def allocate_tokens(
        self,
        seq: int,
        tokens: list[int],
        extra: int,
        salt: bytes | str | None,
        prefix_only: bool,
        late: bool,
    ) -> None:
        self.allocate(seq, tokens, extra, salt, prefix_only, late)

    @rule(src=SEQ, dst=SEQ, prefix_only=st.booleans(), late=st.booleans())
    def allocate_seen_prompt(self, src: int, dst: int, prefix_only: bool, late: bool) -> None:
        """A new request with a live sequence's exact tokens and key: the common prefix hit
        (a chat turn resent, ``n`` choices of one prompt); keeps hits frequent in every run."""
        src = self.live(src)
        if src not in self.model or dst in self.model:
            return
        mod = self.model[src]
        extra, salt = mod.extra
        self.allocate(dst, list(mod.tokens), extra, salt, prefix_only, late)

    # ---- the allocation both allocate rules share ----------------------------------------
    def allocate(
        self,
        seq: int,
        tokens: list[int],
        extra: int,
        salt: bytes | str | None,
        prefix_only: bool,
        late: bool,
    ) -> None:
        arr = np.array(tokens, dtype=np.int64)
        if seq in self.m:
            return self.refuse(KVCacheError, self.m.allocate_tokens, seq, arr, extra, salt)
        try:
            fn = self.m.allocate_cached_prefix if prefix_only else self.m.allocate_tokens
            cached = fn(seq, arr, extra, salt)
        except OutOfBlocks:
            return self.refuse(OutOfBlocks, fn, seq, arr, extra, salt)
        # None is no salt (as b""); a str salt is its UTF-8.
        key = (extra, salt.encode() if isinstance(salt, str) else salt or b"")
        model = Model(key)
        n = cached if prefix_only else len(tokens)
        for t in tokens[:n]:
            model.push(t)
        slots = self.m.slot_mapping(seq, 0, n)
        # A prefix hit must already hold exactly these tokens' K/V.
        assert self.storage[slots[:cached]].tolist() == model.values[:cached]
        assert cached == 0 or self.m.prefix_caching
        BlockManagerMachine.hits += cached
        if late:  # written by a later rule, as when its forward comes after more allocations
            model.written[cached:] = [False] * (n - cached)
        else:
            self.storage[slots[cached:]] = model.values[cached:]
            self.m.mark_computed(seq, n)
        self.model[seq] = model
        BlockManagerMachine.ops += 1

    @rule(seq=SEQ, tokens=st.lists(st.integers(0, 1), max_size=6))
    def append(self, seq: int, tokens: list[int]) -> None:
        seq = self.live(seq)
        arr = np.array(tokens, dtype=np.int64)
        if seq not in self.model:
            return self.refuse(UnknownSequence, self.m.append_slots, seq, len(tokens), arr)
        if self.blocks_needed(seq, len(tokens)) > self.m.num_free_blocks():
            return self.refuse(OutOfBlocks, self.m.append_slots, seq, len(tokens), arr)
        want_cow = bool(tokens) and self.expect_cow(seq)
        res = self.m.append_slots(seq, len(tokens), arr)
        slots, cow = res.slots, res.cow
        assert res.offsets.tolist() == [0, len(tokens)]
        assert (len(cow) == 1) == want_cow, "copy-on-write iff growing a shared partial tail"
        self.run_cow(cow)
        self.storage[slots] = [self.model[seq].push(t) for t in tokens]
        self.m.mark_computed(seq, self.model[seq].written_prefix())
        BlockManagerMachine.ops += 1

    @rule(seq=SEQ, cut=st.integers(0, 20))
    def finish_writes(self, seq: int, cut: int) -> None:
        """The late K/V is written; ``cut`` leading tokens are reported computed."""
        seq = self.live(seq)
        if seq not in self.model:
            return self.refuse(UnknownSequence, self.m.mark_computed, seq, 0)
        if cut > len(self.model[seq].values):
            return self.refuse(KVCacheError, self.m.mark_computed, seq, cut)
        self.write_pending(seq)
        self.m.mark_computed(seq, cut)
        BlockManagerMachine.ops += 1

    @rule(parent=SEQ, child=SEQ)
    def fork(self, parent: int, child: int) -> None:
        parent = self.live(parent)
        if parent not in self.model:
            return self.refuse(UnknownSequence, self.m.fork, parent, child)
        if child in self.model:
            return self.refuse(KVCacheError, self.m.fork, parent, child)
        free_before = self.m.num_free_blocks()
        self.m.fork(parent, child)
        assert self.m.num_free_blocks() == free_before, "fork copies no block"
        assert self.m.block_table(child).tolist() == self.m.block_table(parent).tolist()
        self.model[child] = self.model[parent].copy()
        BlockManagerMachine.ops += 1

    @rule(seq=SEQ)
    def free(self, seq: int) -> None:
        seq = self.live(seq)
        if seq not in self.model:
            return self.refuse(UnknownSequence, self.m.free, seq)
        self.m.free(seq)
        del self.model[seq]
        # Freeing twice (or forking the freed sequence) is a double free.
        self.refuse(DoubleFree, self.m.free, seq)
        self.refuse(DoubleFree, self.m.fork, seq, 100)
        BlockManagerMachine.ops += 1

    @rule(
        seq=SEQ,
        tokens=st.lists(st.integers(0, 1), min_size=1, max_size=9),
        accept=st.integers(0, 511),
        rollback=st.booleans(),
        bad=st.integers(-3, 12),
    )
    def tree_step(self, seq: int, tokens: list[int], accept: int, rollback: bool, bad: int) -> None:
        n = len(tokens)
        seq = self.live(seq)
        if seq not in self.model:
            return self.refuse(UnknownSequence, self.m.reserve_tree, seq, n)
        self.write_pending(seq)  # the step's forward reads the whole prefix
        self.refuse(KVCacheError, self.m.commit, seq, np.array([0]))  # outside a step
        if self.blocks_needed(seq, n) > self.m.num_free_blocks():
            return self.refuse(OutOfBlocks, self.m.reserve_tree, seq, n)
        want_cow = self.expect_cow(seq)
        res = self.m.reserve_tree(seq, n)
        slots, cow = res.slots, res.cow
        assert (len(cow) == 1) == want_cow
        self.run_cow(cow)
        accepted = [i for i in range(n) if accept >> i & 1]
        model = self.model[seq].copy()
        vals = [0xDEAD0000 + i for i in range(n)]  # rejected nodes hold garbage
        for i in accepted:
            vals[i] = model.push(tokens[i])
        self.storage[slots] = vals
        if not 0 <= bad < n:  # never reserved -> refused, the step stays open
            self.refuse(SlotNotReserved, self.m.commit, seq, np.array([bad], dtype=np.int64))
        if rollback:
            self.m.rollback(seq)
            return
        acc = np.array(accepted, dtype=np.int64)
        moves = self.m.commit(seq, acc, np.array([tokens[i] for i in accepted], dtype=np.int64))
        self.storage[moves.dst] = self.storage[moves.src].copy()  # gather, then scatter
        self.model[seq] = model
        BlockManagerMachine.ops += 1

    @rule(seq=SEQ, cut=st.integers(0, 20))
    def truncate(self, seq: int, cut: int) -> None:
        seq = self.live(seq)
        if seq not in self.model:
            return self.refuse(UnknownSequence, self.m.truncate, seq, 0)
        n = len(self.model[seq].values)
        if cut > n:
            return self.refuse(KVCacheError, self.m.truncate, seq, cut)
        self.m.truncate(seq, cut)
        del self.model[seq].values[cut:]
        del self.model[seq].tokens[cut:]
        del self.model[seq].written[cut:]
        BlockManagerMachine.ops += 1

    @rule(data=st.data())
    def reorder(self, data: st.DataObject) -> None:
        live = sorted(self.model)
        if not live:
            return
        beams = data.draw(st.lists(st.sampled_from(live), min_size=1, unique=True))
        parents = data.draw(
            st.lists(st.integers(0, len(beams) - 1), min_size=len(beams), max_size=len(beams))
        )
        self.m.reorder(beams, parents)
        new = [self.model[beams[p]].copy() for p in parents]
        for b, mod in zip(beams, new, strict=True):
            self.model[b] = mod
        BlockManagerMachine.ops += 1

    @precondition(lambda self: self.m.num_free_blocks() < self.m.num_blocks)
    @rule(seq=st.integers(8, 9))
    def out_of_blocks(self, seq: int) -> None:
        too_many = (self.m.num_free_blocks() + 1) * self.bs
        self.refuse(OutOfBlocks, self.m.allocate, seq, too_many)

    # ---- invariants ----------------------------------------------------------------------
    @invariant()
    def consistent(self) -> None:
        m = self.m
        count = np.zeros(m.num_blocks, dtype=np.int64)
        for s in m.sequences():
            np.add.at(count, m.block_table(s).astype(np.int64), 1)
        assert count.tolist() == m.refcounts().tolist(), "refcount != tables holding the block"
        free = m.free_queue()
        assert len(free) == m.num_free_blocks() == len(set(free.tolist()))
        assert not count[free].any(), "a free block is referenced"
        assert int((count > 0).sum()) + len(free) == m.num_blocks, "free + used != total"
        assert sorted(m.sequences()) == sorted(self.model)
        for s, mod in self.model.items():
            ln, pending = _lens(m, s)
            assert pending == 0 and ln == len(mod.values)
            got = self.storage[m.slot_mapping(s, 0, ln)].tolist()
            assert [g for g, w in zip(got, mod.written, strict=True) if w] == [
                v for v, w in zip(mod.values, mod.written, strict=True) if w
            ]
        m.check_invariants()

    def teardown(self) -> None:
        if not hasattr(self, "m"):
            return
        for s in self.m.sequences():
            self.m.free(s)
        assert self.m.num_free_blocks() == self.m.num_blocks, "free != total after freeing all"
        assert not self.m.refcounts().any()


BlockManagerMachine.TestCase.settings = settings(
    max_examples=250,
    stateful_step_count=100,
    deadline=None,
    derandomize=True,  # test_zz_machine_exercised_everything counts what this run did
    suppress_health_check=[HealthCheck.too_slow],
)
TestBlockManager = BlockManagerMachine.TestCase


def test_zz_machine_exercised_everything() -> None:
    """Runs after the machine (file order): the operations were not vacuous."""
    m = BlockManagerMachine
    if m.ops == 0:
        pytest.skip("needs TestBlockManager to run first in the same session")
    print(
        f"\nkv machine: {m.ops} accepted ops, {m.cows} cows, {m.hits} cached tokens hit, "
        f"refusals {m.refusals}"
    )
    assert m.ops > 1000 and m.cows > 10 and m.hits > 10
    for name in ("UnknownSequence", "DoubleFree", "OutOfBlocks", "SlotNotReserved"):
        assert m.refusals.get(name, 0) > 0, name


def test_bad_input_types() -> None:
    with pytest.raises(KVCacheError):
        BlockManager(0, 4)
    m = BlockManager(4, 4)
    m.allocate(0, 3)
    with pytest.raises(KVCacheError, match=">= 0"):
        m.allocate(-1, 1)
    with pytest.raises(KVCacheError):
        m.slot_mapping(0, 2, 5)
    with pytest.raises(KVCacheError):
        m.reorder([0], [3])
    with pytest.raises(KVCacheError):
        m.reserve_tree_batch(np.array([0], dtype=np.uint64), np.array([-1]))


def test_batched_calls_equal_single_calls() -> None:
    """The batched forms give what the per-sequence calls give, on twin managers."""
    rng = np.random.default_rng(0)
    a, b = BlockManager(400, 4), BlockManager(400, 4)
    ids = np.arange(12, dtype=np.uint64)
    lens = rng.integers(0, 30, size=12)
    a.allocate_batch(ids, lens)
    for s, n in zip(ids, lens, strict=True):
        b.allocate(int(s), int(n))
    a.fork_batch(ids[:4], ids[:4] + 100)
    for s in ids[:4]:
        b.fork(int(s), int(s) + 100)
    seqs = np.concatenate([ids, ids[:4] + 100])
    for _ in range(5):
        counts = rng.integers(1, 10, size=len(seqs))
        res = a.reserve_tree_batch(seqs, counts)
        single = [b.reserve_tree(int(s), int(n)) for s, n in zip(seqs, counts, strict=True)]
        assert res.slots.tolist() == [x for one in single for x in one.slots.tolist()]
        assert res.cow.tolist() == [p for one in single for p in one.cow.tolist()]
        assert res.offsets.tolist() == np.cumsum([0, *counts]).tolist()
        acc = [sorted(rng.choice(n, rng.integers(0, n + 1), replace=False)) for n in counts]
        flat = np.array([i for x in acc for i in x], dtype=np.int64)
        off = np.cumsum([0] + [len(x) for x in acc]).astype(np.int64)
        batch = a.commit_batch(seqs, flat, off)
        moves = [
            b.commit(int(s), np.array(x, dtype=np.int64)) for s, x in zip(seqs, acc, strict=True)
        ]
        assert batch.src.tolist() == [m for mv in moves for m in mv.src.tolist()]
        assert batch.dst.tolist() == [m for mv in moves for m in mv.dst.tolist()]
        app = rng.integers(0, 5, size=len(seqs))
        res = a.append_slots_batch(seqs, app)
        single = [b.append_slots(int(s), int(n)) for s, n in zip(seqs, app, strict=True)]
        assert res.slots.tolist() == [x for one in single for x in one.slots.tolist()]
    a.free_batch(seqs)
    for s in seqs:
        b.free(int(s))
    assert a.refcounts().tolist() == b.refcounts().tolist()
    assert a.free_queue().tolist() == b.free_queue().tolist()
    with pytest.raises(DoubleFree):
        a.free_batch(seqs[:1])


def test_same_prompt_in_one_step_misses() -> None:
    """Two sequences with one prompt started back to back, before any K/V is written: the
    second must not reuse the first's unwritten blocks (it got 8 cached tokens when blocks
    were registered at allocation)."""
    m = BlockManager(16, 4, True)
    p = np.arange(10, dtype=np.int64)
    assert m.allocate_tokens(0, p) == 0
    assert m.allocate_tokens(1, p) == 0, "a hit on K/V nobody wrote yet"
    assert m.num_cached_blocks() == 0
    q = np.arange(100, 108, dtype=np.int64)  # appended slots are written after the call
    m.allocate_tokens(2, q[:0])
    m.append_slots(2, 8, q)
    assert m.allocate_tokens(3, q) == 0, "a hit on appended K/V nobody wrote yet"
    m.mark_computed(0, 10)
    m.mark_computed(2, 8)
    assert m.allocate_tokens(4, p) == 8
    assert m.allocate_tokens(5, q) == 4
    with pytest.raises(KVCacheError, match="only 10 are committed"):
        m.mark_computed(0, 11)
    m.check_invariants()


def test_cache_salt_separates_equal_prompts() -> None:
    m = BlockManager(64, 4, True)
    p = np.arange(13, dtype=np.int64)
    salts: list[bytes | str | None] = [b"tenant-a", "tenant-b", None, "tenant-\u00e9"]
    for seq, salt in enumerate(salts):
        assert m.allocate_tokens(seq, p, 0, salt) == 0
        m.mark_computed(seq, 13)
    tables = [set(m.block_table(s).tolist()) for s in range(len(salts))]
    for i in range(len(tables)):
        for j in range(i):
            assert not tables[i] & tables[j], f"salts {salts[i]!r} and {salts[j]!r} share"
    assert m.allocate_tokens(10, p, 0, b"tenant-b") == 12, "a str salt is its UTF-8"
    assert m.allocate_tokens(11, p, 0, b"") == 12, "None is the empty salt"
    assert m.allocate_tokens(12, p, 1, b"tenant-a") == 0, "the extra key separates too"
    assert m.allocate_cached_prefix(13, p, 0, "tenant-\u00e9".encode()) == 12
    for bad in (3, ["a"], bytearray(b"a"), 1.5):
        with pytest.raises(SpecdecTypeError, match="cache_salt"):
            m.allocate_tokens(20, p, 0, bad)  # type: ignore[arg-type]
    with pytest.raises(KVCacheError, match="UTF-8"):
        m.allocate_tokens(20, p, 0, "\ud800")
    assert 20 not in m


def reference_block_hash(
    parent: bytes | None, tokens: list[int], cache_salt: bytes, extra_key: int
) -> bytes:
    """The encoding documented in ``specdec.cache.paged``, with hashlib."""
    data = b"specdec/kv-block/v1"
    data += b"\x00" if parent is None else b"\x01" + parent
    data += struct.pack("<QQ", extra_key, len(cache_salt)) + cache_salt
    data += struct.pack(f"<Q{len(tokens)}q", len(tokens), *tokens)
    return hashlib.sha256(data).digest()


def test_block_hash_is_documented_sha256() -> None:
    h0 = block_hash(None, np.array([1, 2, 3, -1]), b"tenant-a", 7)
    assert h0.hex() == "83a17bb1fb1538ad7f18f5c606f19ad83a8f9ecf6de4710e6c053deadd42d075"
    rng = np.random.default_rng(1)
    parent = None
    for i in range(20):
        toks = rng.integers(-(2**63), 2**63 - 1, size=int(rng.integers(0, 9))).tolist()
        salt = bytes(rng.integers(0, 256, size=i % 5, dtype=np.uint8))
        extra = int(rng.integers(0, 2**63)) * (i % 2)
        got = block_hash(parent, np.array(toks, dtype=np.int64), salt, extra)
        assert got == reference_block_hash(parent, toks, salt, extra)
        parent = got
    assert block_hash(None, np.array([5]), "é") == block_hash(None, np.array([5]), "é".encode())
    with pytest.raises(KVCacheError, match="32-byte"):
        block_hash(b"short", np.array([1]))
    with pytest.raises(SpecdecTypeError):
        block_hash("not bytes", np.array([1]))  # type: ignore[arg-type]
