"""Model level: the Llama-style target and the tree verifier run on ``PagedKVCache`` exactly as
on ``DenseKVCache`` (same tokens, same committed K/V), and forked beams share their prompt's
blocks (counted) while copying only their partial tail on write."""

from __future__ import annotations

import copy

import pytest
import torch

from specdec.cache import DenseKVCache, KVCache, PagedKVCache, PagedKVPool
from specdec.decode import SpeculativeGenerator, autoregressive_generate
from specdec.models import LlamaConfig, LlamaModel
from specdec.testing import OracleDrafter, RandomDrafter
from specdec.tree import tree_from_branches
from specdec.verify import Verifier

CFG = LlamaConfig(
    vocab_size=97,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)
PROMPT = [3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26, 43, 38, 32, 79, 50, 28, 84, 19, 71]


@pytest.fixture(scope="module")
def model() -> LlamaModel:
    return LlamaModel(CFG).init_random(seed=1)


def paged(pool: PagedKVPool | None = None, block_size: int = 4) -> PagedKVCache:
    if pool is None:
        pool = PagedKVPool(
            CFG.num_hidden_layers, CFG.num_key_value_heads, CFG.head_dim or 0, 128, block_size
        )
    return pool.sequence()


def assert_same_kv(a: KVCache, b: KVCache) -> None:
    assert a.committed_len == b.committed_len
    for layer in range(CFG.num_hidden_layers):
        for x, y in zip(a.committed_kv(layer), b.committed_kv(layer), strict=True):
            assert torch.equal(x, y)


@pytest.mark.parametrize("block_size", [1, 4, 16])
@pytest.mark.parametrize("drafter", ["oracle", "random"])
def test_tree_generation_paged_equals_dense(
    model: LlamaModel, block_size: int, drafter: str
) -> None:
    def gen(cache: KVCache) -> list[int]:
        d = (
            OracleDrafter(model, miss=0.3, seed=5)
            if drafter == "oracle"
            else RandomDrafter(CFG.vocab_size, seed=5)
        )
        g = SpeculativeGenerator(model, d, budget=12, max_depth=5)
        return g.generate(PROMPT, max_new_tokens=24, cache=cache).tokens

    dense = DenseKVCache(CFG.num_hidden_layers, CFG.num_key_value_heads, CFG.head_dim or 0, 128)
    pg = paged(block_size=block_size)
    out_d, out_p = gen(dense), gen(pg)
    assert out_p == out_d
    assert_same_kv(pg, dense)
    # And both equal plain one-token-per-step decoding.
    ar = autoregressive_generate(
        model, PROMPT, max_new_tokens=24, cache=paged(block_size=block_size)
    ).tokens
    assert out_p[: len(ar)] == ar[: len(out_p)]


def test_verifier_step_on_paged_tree(model: LlamaModel) -> None:
    """One explicit tree (several branches) verified and committed on both caches."""
    v = Verifier(model)
    dense = DenseKVCache(CFG.num_hidden_layers, CFG.num_key_value_heads, CFG.head_dim or 0, 128)
    pg = paged(block_size=4)
    for c in (dense, pg):
        v.prefill(PROMPT[:-1], c)
    greedy = autoregressive_generate(model, PROMPT, max_new_tokens=3).tokens
    branches = [[1, 2, 3], greedy[:2] + [5], greedy[:3], [greedy[0], 7]]
    tree = tree_from_branches(branches, root_token=PROMPT[-1])
    rd, rp = v.step(tree, dense), v.step(tree, pg)
    assert rd.tokens == rp.tokens and rd.accepted.tolist() == rp.accepted.tolist()
    assert rp.num_accepted == 3
    assert_same_kv(pg, dense)


def test_forked_beams_share_prompt_blocks(model: LlamaModel) -> None:
    bs = 4
    pool = PagedKVPool(CFG.num_hidden_layers, CFG.num_key_value_heads, CFG.head_dim or 0, 64, bs)
    root = pool.sequence()
    v = Verifier(model)
    dense_root = DenseKVCache(CFG.num_hidden_layers, CFG.num_key_value_heads, CFG.head_dim or 0, 64)
    for c in (root, dense_root):
        v.prefill(PROMPT, c)  # 21 tokens: 5 full blocks + 1 token in a 6th
    used = lambda: pool.num_blocks - pool.manager.num_free_blocks()  # noqa: E731
    assert used() == 6
    beams = [root] + [root.fork() for _ in range(3)]
    dense = [dense_root] + [copy.deepcopy(dense_root) for _ in range(3)]
    assert used() == 6, "forking copies no block"
    refc = pool.manager.refcounts()
    assert [int(refc[b]) for b in root.block_table()] == [4] * 6
    # Each beam continues with a different token: all but the last writer copy the tail.
    for j, (b, d) in enumerate(zip(beams, dense, strict=True)):
        for c in (b, d):
            v.prefill([10 + j], c)
    assert used() == 6 + 3
    refc = pool.manager.refcounts()
    for b in beams:
        assert b.block_table()[:5].tolist() == beams[0].block_table()[:5].tolist()
        assert [int(refc[x]) for x in b.block_table()[:5]] == [4] * 5
        assert int(refc[b.block_table()[5]]) == 1
    for b, d in zip(beams, dense, strict=True):
        assert_same_kv(b, d)
    # Beam search reorder: beam 2 continues twice, beam 0 and 1 die.
    parents = [2, 2, 3, 3]
    pool.reorder(beams, parents)
    dense = [copy.deepcopy(dense[p]) for p in parents]
    assert used() == 5 + 2
    for j, (b, d) in enumerate(zip(beams, dense, strict=True)):
        for c in (b, d):
            v.prefill([40 + j, 41], c)  # and a tree step keeps the K/V equal
        assert_same_kv(b, d)
    for b in beams:
        b.free()
    assert pool.manager.num_free_blocks() == pool.num_blocks


def test_prefix_cache_hit_through_the_model(model: LlamaModel) -> None:
    """A second prompt sharing 18 tokens reuses 4 full blocks of K/V computed for the first
    (after the first sequence was freed), and prefilling only its rest gives the logits and
    K/V of a full dense prefill."""
    bs = 4
    pool = PagedKVPool(
        CFG.num_hidden_layers,
        CFG.num_key_value_heads,
        CFG.head_dim or 0,
        32,
        bs,
        prefix_caching=True,
    )
    v = Verifier(model)
    a = pool.sequence(PROMPT)
    assert a.committed_len == 0
    v.prefill(PROMPT, a)  # registers A's 5 full blocks (the prompt was declared)
    a_kv = [a.committed_kv(layer) for layer in range(CFG.num_hidden_layers)]
    a.free()
    other = PROMPT[:18] + [7, 8, 9]
    b = pool.sequence(other)
    assert b.committed_len == 16, "4 full blocks hit"
    logits_b = v.prefill(other[16:], b)
    dense = DenseKVCache(CFG.num_hidden_layers, CFG.num_key_value_heads, CFG.head_dim or 0, 64)
    logits_d = v.prefill(other, dense)
    torch.testing.assert_close(logits_b, logits_d[16:], rtol=1e-5, atol=1e-5)
    assert logits_b.argmax(-1).tolist() == logits_d[16:].argmax(-1).tolist()
    for layer in range(CFG.num_hidden_layers):
        for x, y, z in zip(
            b.committed_kv(layer), dense.committed_kv(layer), a_kv[layer], strict=True
        ):
            assert torch.equal(x[:, :16], z[:, :16]), "a hit is the very K/V computed for A"
            torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)


def test_speculative_steps_register_generated_blocks(model: LlamaModel) -> None:
    """Tree steps commit with the kept tokens' ids, so a later request that repeats the
    prompt and the generated text hits the generated tokens' full blocks too, with the K/V a
    dense prefill of the same text gives."""
    bs = 4
    pool = PagedKVPool(
        CFG.num_hidden_layers, CFG.num_key_value_heads, CFG.head_dim or 0, 64, bs,
        prefix_caching=True,
    )  # fmt: skip
    gen = SpeculativeGenerator(model, OracleDrafter(model, miss=0.3, seed=2), budget=6, max_depth=4)
    first = pool.sequence(PROMPT)
    out = gen.generate(PROMPT, max_new_tokens=24, cache=first).tokens
    text = PROMPT + out
    # The cache holds the text but its last token (the next root): full blocks of it can hit.
    held = first.committed_len
    assert held == len(text) - 1
    first.free()
    again = pool.sequence(text + [1])
    hit = again.committed_len
    assert hit > len(PROMPT) - len(PROMPT) % bs, "generated blocks were registered"
    assert hit == (held // bs) * bs
    dense = DenseKVCache(CFG.num_hidden_layers, CFG.num_key_value_heads, CFG.head_dim or 0, 128)
    Verifier(model).prefill(text, dense)
    for layer in range(CFG.num_hidden_layers):
        for x, y in zip(again.committed_kv(layer), dense.committed_kv(layer), strict=True):
            torch.testing.assert_close(x, y[:, :hit], rtol=1e-5, atol=1e-5)
