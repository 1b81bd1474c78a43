"""``PagedKVCache`` against ``DenseKVCache``: the same random steps (begin, append on every
layer, commit of a random increasing subset or rollback), forks and beam reorders give
identical ``append`` outputs and ``committed_kv``, while the paged sequences share blocks.
Prefix hits give the same K/V as computing the prompt from scratch."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from specdec import KVCacheError, OutOfBlocks, VerifyError
from specdec.cache import DenseKVCache, KVCache, PagedKVCache, PagedKVPool
from specdec.errors import DoubleFree, SpecdecTypeError

L, H, D, MAX = 2, 2, 3, 64


def dense_copy(c: DenseKVCache) -> DenseKVCache:
    return copy.deepcopy(c)


def step(
    caches: list[KVCache], n: int, keep: list[int] | None, seed: int
) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """One step with the same random K/V on every cache; returns each cache's outputs."""
    g = torch.Generator().manual_seed(seed)
    kv = [(torch.randn(H, n, D, generator=g), torch.randn(H, n, D, generator=g)) for _ in range(L)]
    outs = []
    for c in caches:
        c.begin(n)
        # Clone: the dense cache returns views that its commit overwrites.
        outs.append([tuple(t.clone() for t in c.append(j, k, v)) for j, (k, v) in enumerate(kv)])
        if keep is None:
            c.rollback()
        else:
            c.commit(keep)
    return outs


class PagedVsDense(RuleBasedStateMachine):
    forks = 0
    steps = 0

    @initialize(block_size=st.integers(1, 5))
    def setup(self, block_size: int) -> None:
        self.pool = PagedKVPool(L, H, D, num_blocks=200, block_size=block_size)
        first = self.pool.sequence()
        self.pairs: list[tuple[PagedKVCache, DenseKVCache]] = [(first, DenseKVCache(L, H, D, MAX))]

    @rule(
        i=st.integers(0, 7),
        n=st.integers(1, 7),
        mask=st.integers(0, 127),
        seed=st.integers(0, 2**32),
    )
    def tree_step(self, i: int, n: int, mask: int, seed: int) -> None:
        p, d = self.pairs[i % len(self.pairs)]
        if d.committed_len + n > MAX:
            return
        keep = None if mask == 127 else [j for j in range(n) if mask >> j & 1]
        a, b = step([p, d], n, keep, seed)
        for (pk, pv), (dk, dv) in zip(a, b, strict=True):
            assert torch.equal(pk, dk) and torch.equal(pv, dv)
        PagedVsDense.steps += 1

    @rule(i=st.integers(0, 7))
    def fork(self, i: int) -> None:
        if len(self.pairs) >= 6:
            return
        p, d = self.pairs[i % len(self.pairs)]
        free = self.pool.manager.num_free_blocks()
        child = p.fork()
        assert self.pool.manager.num_free_blocks() == free
        assert child.block_table().tolist() == p.block_table().tolist()
        self.pairs.append((child, dense_copy(d)))
        PagedVsDense.forks += 1

    @rule(i=st.integers(0, 7))
    def free(self, i: int) -> None:
        if len(self.pairs) > 1:
            p, _ = self.pairs.pop(i % len(self.pairs))
            p.free()
            with pytest.raises(DoubleFree):
                p.free()

    @rule(i=st.integers(0, 7), cut=st.integers(0, 64))
    def truncate(self, i: int, cut: int) -> None:
        p, d = self.pairs[i % len(self.pairs)]
        cut = min(cut, d.committed_len)
        p.truncate(cut)
        d.truncate(cut)

    @rule(data=st.data())
    def beams(self, data: st.DataObject) -> None:
        k = len(self.pairs)
        parents = data.draw(st.lists(st.integers(0, k - 1), min_size=k, max_size=k))
        self.pool.reorder([p for p, _ in self.pairs], parents)
        dense = [dense_copy(self.pairs[j][1]) for j in parents]
        self.pairs = [(p, d) for (p, _), d in zip(self.pairs, dense, strict=True)]

    @invariant()
    def same_committed_kv(self) -> None:
        for p, d in self.pairs:
            assert p.committed_len == d.committed_len and p.pending == 0
            for layer in range(L):
                pk, pv = p.committed_kv(layer)
                dk, dv = d.committed_kv(layer)
                assert torch.equal(pk, dk) and torch.equal(pv, dv)
        self.pool.manager.check_invariants()


PagedVsDense.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestPagedVsDense = PagedVsDense.TestCase


def test_forks_share_prompt_blocks_and_copy_tail_on_write() -> None:
    pool = PagedKVPool(L, H, D, num_blocks=32, block_size=4)
    root = pool.sequence()
    step([root], 10, list(range(10)), 0)  # 2 full blocks + a partial one
    used = pool.num_blocks - pool.manager.num_free_blocks()
    beams = [root] + [root.fork() for _ in range(3)]
    assert pool.num_blocks - pool.manager.num_free_blocks() == used == 3
    refc = pool.manager.refcounts()
    assert all(refc[b] == 4 for b in root.block_table())
    # Each beam appends one token: every beam but the last holder copies the partial tail.
    for j, b in enumerate(beams):
        step([b], 1, [0], 100 + j)
    assert pool.num_blocks - pool.manager.num_free_blocks() == 3 + 3
    for b in beams:
        assert b.block_table()[:2].tolist() == root.block_table()[:2].tolist()
        k, _ = b.committed_kv(0)
        rk, _ = beams[0].committed_kv(0)
        assert torch.equal(k[:, :10], rk[:, :10])


def causal_kv(tokens: list[int], layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K/V of a toy causal model: position t depends on every token up to t."""
    emb = torch.tensor(tokens, dtype=torch.float32)[:, None] * torch.arange(1, H * D + 1)
    k = torch.cumsum(torch.sin(emb + layer), 0).reshape(len(tokens), H, D).transpose(0, 1)
    return k.contiguous(), (k * 2 + 1).contiguous()


def run_prompt(c: KVCache, tokens: list[int]) -> None:
    """Compute the uncached rest of the prompt as one step and commit it."""
    done = c.committed_len
    rest = len(tokens) - done
    c.begin(rest)
    for layer in range(L):
        k, v = causal_kv(tokens, layer)
        c.append(layer, k[:, done:], v[:, done:])
    if isinstance(c, PagedKVCache):
        c.commit(list(range(rest)), tokens=tokens[done:])
    else:
        c.commit(list(range(rest)))


@pytest.mark.parametrize("block_size", [1, 3, 4])
def test_prefix_hit_yields_identical_kv(block_size: int) -> None:
    pool = PagedKVPool(L, H, D, num_blocks=40, block_size=block_size, prefix_caching=True)
    prompt = [5, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]
    a = pool.sequence(prompt)
    assert a.committed_len == 0
    run_prompt(a, prompt)
    a.free()  # cached blocks stay hittable after free
    b = pool.sequence(prompt[:9] + [7, 7])
    assert b.committed_len == (9 // block_size) * block_size > 0  # 9 shared tokens
    run_prompt(b, prompt[:9] + [7, 7])
    dense = DenseKVCache(L, H, D, MAX)
    run_prompt(dense, prompt[:9] + [7, 7])
    for layer in range(L):
        assert torch.equal(b.committed_kv(layer)[0], dense.committed_kv(layer)[0])
        assert torch.equal(b.committed_kv(layer)[1], dense.committed_kv(layer)[1])
    other = pool.sequence(prompt, extra_key=3)
    assert other.committed_len == 0, "another extra key never hits"


def test_errors_and_unchanged_state() -> None:
    pool = PagedKVPool(L, H, D, num_blocks=3, block_size=2)
    c = pool.sequence()
    with pytest.raises(VerifyError):
        c.begin(0)
    step([c], 3, [0, 1, 2], 1)
    before = (pool.manager.refcounts().tolist(), c.block_table().tolist(), c.committed_len)
    with pytest.raises(OutOfBlocks):
        c.begin(5)
    assert (pool.manager.refcounts().tolist(), c.block_table().tolist(), c.committed_len) == before
    c.begin(2)
    with pytest.raises(VerifyError):
        c.commit([2])  # never reserved (checked before the manager)
    with pytest.raises(KVCacheError):
        c.fork()
    c.rollback()
    assert c.block_table().tolist() == before[1]
    c.free()
    with pytest.raises(DoubleFree):
        c.fork()
    assert pool.manager.num_free_blocks() == 3


def test_standalone_matches_dense_shape() -> None:
    p = PagedKVCache.standalone(L, H, D, 20, block_size=8)
    d = DenseKVCache(L, H, D, 20)
    out_p, out_d = step([p, d], 20, [0, 5, 19], 3)
    assert out_p[0][0].shape == out_d[0][0].shape == (H, 20, D)
    assert torch.equal(p.committed_kv(1)[1], d.committed_kv(1)[1])
    np.testing.assert_array_equal(p.block_table(), [0])


def feed(c: PagedKVCache, context: list[int], new: list[int]) -> None:
    """One causal step feeding ``new`` after ``context`` (the committed tokens), left
    pending; K/V as the toy causal model computes it."""
    c.begin(len(new))
    for layer in range(L):
        k, v = causal_kv(context + new, layer)
        c.append(layer, k[:, len(context) :], v[:, len(context) :])


def test_partial_prefill_then_chain_step_registers_no_prompt_block() -> None:
    """Prefill 3 tokens of a declared 8-token prompt, then a speculative chain step of
    generated tokens whose commit keeps ``0..m-1``, shaped exactly like a prefill. The
    generated K/V must not be cached under the prompt's ids (it was, through the declared
    prompt shortcut: a later request for the prompt got 6 cached tokens of wrong K/V)."""
    bs = 2
    pool = PagedKVPool(L, H, D, num_blocks=20, block_size=bs, prefix_caching=True)
    prompt = [11, 12, 13, 14, 15, 16, 17, 18]
    a = pool.sequence(prompt)
    feed(a, [], prompt[:3])
    a.commit([0, 1, 2], tokens=prompt[:3])
    generated = [90, 91, 92]
    feed(a, prompt[:3], generated)
    a.commit(torch.arange(3))  # a chain tree: every node accepted
    b = pool.sequence(prompt)
    assert b.committed_len == 2, "only the prefilled prompt block may hit"
    run_prompt(b, prompt)
    dense = DenseKVCache(L, H, D, MAX)
    run_prompt(dense, prompt)
    for layer in range(L):
        assert torch.equal(b.committed_kv(layer)[0], dense.committed_kv(layer)[0])


def test_commit_fed_registers_exactly_the_fed_tokens() -> None:
    pool = PagedKVPool(L, H, D, num_blocks=20, block_size=2, prefix_caching=True)
    prompt = [3, 1, 4, 1, 5]
    a = pool.sequence(prompt)
    feed(a, [], prompt)
    a.commit_fed(torch.tensor(prompt))
    assert pool.sequence(prompt).committed_len == 4
    assert pool.sequence(prompt, cache_salt="other tenant").committed_len == 0


def test_equal_prompts_under_different_salts_share_no_block() -> None:
    pool = PagedKVPool(L, H, D, num_blocks=40, block_size=2, prefix_caching=True)
    prompt = [5, 1, 4, 1, 5, 9, 2]
    caches = []
    for salt in (b"a", b"b", None, "a\u00e9"):
        c = pool.sequence(prompt, cache_salt=salt)
        assert c.committed_len == 0
        run_prompt(c, prompt)
        caches.append(c)
    tables = [set(c.block_table().tolist()) for c in caches]
    assert all(not tables[i] & tables[j] for i in range(4) for j in range(i))
    again = pool.sequence(prompt, cache_salt=b"b")
    assert again.committed_len == 6
    assert again.block_table()[:3].tolist() == caches[1].block_table()[:3].tolist()
    with pytest.raises(SpecdecTypeError):
        pool.sequence(prompt, cache_salt=7)  # type: ignore[arg-type]
