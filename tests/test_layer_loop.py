"""The torch layer loop's K/V strategies against the one-sequence ``forward`` as the oracle:
each row of a ``forward_batch`` step with ragged prefixes (dense caches, sequences of one
paged pool, a mix) and of a ``forward_paged`` step gives the logits and hidden states of the
same request's own forward, and each cache holds the same K/V afterwards."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
import torch

from specdec.cache import DenseKVCache, PagedKVPool
from specdec.models import LlamaConfig, LlamaModel
from specdec.protocols import HiddenCapture, KVCache
from specdec.testing import reference_tree_mask

TOL = dict(rtol=1e-5, atol=1e-5)
PREFIXES = [3, 11, 0, 7]
PARENTS = [-1, 0, 0, 1, 2]  # a small tree: 0 -> {1, 2}, 1 -> 3, 2 -> 4


@pytest.fixture(scope="module", params=[True, False], ids=["packed", "plain"])
def model(request: pytest.FixtureRequest) -> LlamaModel:
    cfg = LlamaConfig(
        vocab_size=96,
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=3,
        num_attention_heads=6,
        num_key_value_heads=2,
    )
    m = LlamaModel(cfg).init_random(5)
    m.fused_step = False  # the torch loop (a random model has no GGUF blocks anyway)
    m.packed_linear = bool(request.param)
    return m


def prefilled(model: LlamaModel, make: Callable[[], KVCache], n: int, seed: int) -> KVCache:
    cache = make()
    if n:
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, model.vocab_size, (n,), generator=g)
        model(ids, torch.arange(n), cache)
        cache.commit(list(range(n)))
    return cache


def depths() -> list[int]:
    d: list[int] = []
    for p in PARENTS:
        d.append(0 if p < 0 else d[p] + 1)
    return d


def tree_inputs(model: LlamaModel, lens: Sequence[int]) -> tuple[torch.Tensor, ...]:
    """A tree step per row (tokens differ by row) in ``forward_batch``'s layout: row r's
    prefix in columns ``[0, lens[r])``, the tree in the last ``T``."""
    g = torch.Generator().manual_seed(11)
    t, p_max = len(PARENTS), max(lens)
    ids = torch.randint(0, model.vocab_size, (len(lens), t), generator=g)
    pos = torch.tensor([[n + d for d in depths()] for n in lens])
    mask = torch.zeros(len(lens), t, p_max + t, dtype=torch.bool)
    for r, n in enumerate(lens):
        own = reference_tree_mask(PARENTS, n)
        mask[r, :, :n], mask[r, :, p_max:] = own[:, :n], own[:, n:]
    return ids, pos, mask


def own_forwards(
    model: LlamaModel, ids: torch.Tensor, pos: torch.Tensor, layers: tuple[int, ...]
) -> list[tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]]:
    """Per row, the row's own forward on a dense cache: logits, hidden states, and every
    layer's K/V once the whole step is committed."""
    out = []
    for r, n in enumerate(PREFIXES):
        cache = prefilled(model, lambda: dense(model), n, r)
        mask = reference_tree_mask(PARENTS, n)
        hidden = HiddenCapture(layers=layers, final=True)
        logits = model(ids[r], pos[r], cache, mask, hidden=hidden)
        assert hidden.states is not None
        cache.commit(list(range(len(PARENTS))))
        out.append((logits, hidden.states, committed(cache)))
    return out


def committed(cache: KVCache) -> list[torch.Tensor]:
    return [torch.cat(cache.committed_kv(i), -1) for i in range(cache.num_layers)]


def dense(model: LlamaModel) -> DenseKVCache:
    return model.new_cache(32)


@pytest.mark.parametrize("kind", ["dense", "paged", "mixed"])
def test_forward_batch_rows_equal_their_own_forward(model: LlamaModel, kind: str) -> None:
    pool = PagedKVPool(3, 2, 8, 64, block_size=4)
    makers: list[Callable[[], KVCache]] = {
        "dense": [lambda: dense(model)] * 4,
        "paged": [pool.sequence] * 4,
        "mixed": [pool.sequence, lambda: dense(model)] * 2,
    }[kind]
    caches = [
        prefilled(model, mk, n, r) for r, (mk, n) in enumerate(zip(makers, PREFIXES, strict=True))
    ]
    ids, pos, mask = tree_inputs(model, PREFIXES)
    hidden = HiddenCapture(layers=(0, 2), final=True)
    got = model.forward_batch(ids, pos, caches, mask, hidden=hidden)
    assert hidden.states is not None and hidden.states.shape[:2] == ids.shape
    t = len(PARENTS)
    refs = own_forwards(model, ids, pos, (0, 2))
    for r, (cache, (logits, states, kv)) in enumerate(zip(caches, refs, strict=True)):
        torch.testing.assert_close(got[r], logits, **TOL)
        torch.testing.assert_close(hidden.states[r], states, **TOL)
        assert cache.pending == t
        cache.commit(list(range(t)))  # the step's K/V went to the row's own cache
        for mine, want in zip(committed(cache), kv, strict=True):
            torch.testing.assert_close(mine, want, **TOL)


def test_padding_columns_stay_hidden(model: LlamaModel) -> None:
    """Columns between a row's prefix and its step are padding, whatever the mask says."""
    pool = PagedKVPool(3, 2, 8, 64, block_size=4)
    ids, pos, mask = tree_inputs(model, PREFIXES)
    noisy = mask.clone()
    p_max = max(PREFIXES)
    for r, n in enumerate(PREFIXES):
        noisy[r, :, n:p_max] = True
    for make in (pool.sequence, lambda: dense(model)):
        outs = []
        for m in (mask, noisy):
            caches = [prefilled(model, make, n, r) for r, n in enumerate(PREFIXES)]
            outs.append(model.forward_batch(ids, pos, caches, m))
            for c in caches:
                c.rollback()
        torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)


def test_forward_paged_rows_equal_dense_forwards(model: LlamaModel) -> None:
    """Beams sharing a prefix and independent sequences of ragged lengths in one pool."""
    pool = PagedKVPool(3, 2, 8, 64, block_size=4)
    g = torch.Generator().manual_seed(2)
    ctx = [torch.randint(0, model.vocab_size, (n,), generator=g) for n in (9, 1, 6)]
    seqs = []
    for ids in ctx:
        s = pool.sequence()
        model(ids, torch.arange(len(ids)), s)
        s.commit_fed(ids)
        seqs.append(s)
    seqs.append(seqs[0].fork())  # shares row 0's blocks, partial tail included
    ctx.append(ctx[0])
    toks = torch.randint(0, model.vocab_size, (len(seqs),), generator=g)
    pos = torch.tensor([len(c) for c in ctx])
    got = model.forward_paged(toks, pos, seqs)
    pool.commit_decode(seqs)
    for r, c in enumerate(ctx):
        full = torch.cat((c, toks[r : r + 1]))
        want = model(full, torch.arange(len(full)), dense(model))[-1]
        torch.testing.assert_close(got[r], want, **TOL)
    pool.manager.check_invariants()
