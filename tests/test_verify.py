"""Verify step: decoding rules against brute force, the step API on a table target whose
logits are a function of exactly the tokens each node sees, and lossless greedy generation
(tree and chain; random, oracle and adversarial drafters) with cache equality."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specdec.cache import DenseKVCache, KVCache
from specdec.decode import SpeculativeGenerator, autoregressive_generate
from specdec.errors import ConfigError, VerifyError
from specdec.models import LlamaConfig, LlamaModel
from specdec.testing import (
    AdversarialDrafter,
    BanningDrafter,
    OracleDrafter,
    RandomDrafter,
    tiny_config,
)
from specdec.tree import ChainShape, DDTreeShape, DraftTree, tree_from_branches, tree_shape
from specdec.verify import Greedy, Sampling, StepResult, Verifier

# Tiny tensors: extra intra-op threads only contend (60x slower on a loaded 2-core box).


# -- rules ---------------------------------------------------------------------------------
def ref_probs(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """Brute force, row by row: scale, keep the k largest, then the smallest most-likely set
    with mass >= top_p, renormalise."""
    out = np.zeros_like(logits)
    for r, row in enumerate(logits / temperature):
        keep = set(range(len(row)))
        if top_k:
            keep = set(np.argsort(-row, kind="stable")[:top_k].tolist())
        z = np.array([np.exp(row[i] - row.max()) if i in keep else 0.0 for i in range(len(row))])
        p = z / z.sum()
        if top_p < 1:
            order = sorted(range(len(p)), key=lambda i: -p[i])
            mass, chosen = 0.0, []
            for i in order:
                chosen.append(i)
                mass += p[i]
                if mass >= top_p:
                    break
            p = np.array([p[i] if i in chosen else 0.0 for i in range(len(p))])
            p /= p.sum()
        out[r] = p
    return out


@pytest.mark.parametrize(
    "t,k,p",
    [(1.0, 0, 1.0), (0.7, 0, 0.9), (1.0, 4, 1.0), (1.3, 3, 0.8), (0.5, 1, 1.0), (2.0, 0, 0.3)],
)
def test_sampling_probs_match_brute_force(t: float, k: int, p: float) -> None:
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(20, 11, generator=g, dtype=torch.float64) * 2
    got = Sampling(temperature=t, top_k=k, top_p=p).probs(logits).numpy()
    np.testing.assert_allclose(got, ref_probs(logits.numpy(), t, k, p), rtol=1e-12, atol=1e-12)


def test_sampling_draws_follow_probs_and_greedy_is_argmax() -> None:
    logits = torch.tensor([[0.0, 1.0, 2.0, -1.0]] * 40_000, dtype=torch.float64)
    rule = Sampling(temperature=0.8, top_k=3)
    draws = rule.choose(logits, torch.Generator().manual_seed(0))
    freq = torch.bincount(draws, minlength=4).double() / len(draws)
    assert freq[3] == 0
    torch.testing.assert_close(freq, rule.probs(logits[:1])[0], atol=0.01, rtol=0)
    assert Greedy().choose(torch.tensor([[0.0, 3.0, 3.0], [5.0, 0.0, 1.0]])).tolist() == [1, 0]


def test_rule_bad_input() -> None:
    for kw in ({"temperature": 0.0}, {"top_k": -1}, {"top_p": 0.0}, {"top_p": 1.5}):
        with pytest.raises(ConfigError):
            Sampling(**kw)
    with pytest.raises(VerifyError, match=r"\[T, V\]"):
        Greedy().choose(torch.zeros(3))
    with pytest.raises(TypeError, match="floating"):
        Sampling().choose(torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(VerifyError, match="NaN"):
        Sampling().choose(torch.full((1, 3), float("nan")))


# -- the step on a table target ------------------------------------------------------------
class TableTarget:
    """A target whose logits at node i are a function of exactly the tokens i attends to
    (committed prefix + visible tree nodes, read back from the mask), and whose K/V store the
    token ids: the cache content is checkable token by token."""

    vocab_size = 16
    max_positions = 64
    device = torch.device("cpu")

    def __init__(self, table: dict[tuple[int, ...], int]) -> None:
        self.table = table

    def new_cache(self, max_len: int | None = None) -> KVCache:
        return DenseKVCache(1, 1, 2, max_len or 64, dtype=torch.float64)

    def next_token(self, seen: tuple[int, ...]) -> int:
        return self.table.get(seen, 15)

    def __call__(self, ids, pos, cache, mask=None):  # type: ignore[no-untyped-def]
        t_new, p = len(ids), cache.committed_len
        if mask is None:
            mask = torch.ones(t_new, p + t_new, dtype=torch.bool).tril(p)
        cache.begin(t_new)
        kv = torch.stack([ids.double(), pos.double()], -1)[None]
        keys, _ = cache.append(0, kv, kv)
        logits = torch.zeros(t_new, self.vocab_size, dtype=torch.float64)
        for i in range(t_new):
            seen = tuple(int(x) for x in keys[0, mask[i], 0])
            logits[i, self.next_token(seen)] = 1.0
        return logits


def cache_tokens(cache: KVCache) -> list[int]:
    return [int(x) for x in cache.committed_kv(0)[0][0, :, 0]]


def test_step_notes_example_commits_accepted_path() -> None:
    # Notes: base [10, 11], branches [4,5,6], [4,7,8], [9,0,1], target path [4, 7, 3].
    target = TableTarget({(10, 11): 4, (10, 11, 4): 7, (10, 11, 4, 7): 3})
    ver = Verifier(target)
    cache = target.new_cache()
    ver.prefill([10], cache)
    tree = tree_from_branches([[4, 5, 6], [4, 7, 8], [9, 0, 1]], root_token=11)
    res = ver.step(tree, cache)
    assert isinstance(res, StepResult)
    assert res.accepted_tokens == [4, 7] and res.bonus_token == 3 and res.tokens == [4, 7, 3]
    assert res.accepted.tolist() == [1, 4]
    assert cache_tokens(cache) == [10, 11, 4, 7]  # the 6 other tree slots are gone
    positions = [int(x) for x in cache.committed_kv(0)[0][0, :, 1]]
    assert positions == [0, 1, 2, 3]
    assert cache.pending == 0
    assert set(res.timings) == {"mask", "forward", "rule", "walk", "commit"}
    assert all(v >= 0 for v in res.timings.values())
    # Next step: the bonus token is the root; nothing accepted -> only the root is kept.
    res2 = ver.step(tree_from_branches([[9]]), cache, root_token=3)
    assert res2.tokens == [15] and cache_tokens(cache) == [10, 11, 4, 7, 3]


def test_step_rejects_at_root_and_full_acceptance() -> None:
    table = {(1,): 2, (1, 2): 3, (1, 2, 3): 4}
    target = TableTarget(table)
    ver = Verifier(target)
    cache = target.new_cache()
    res = ver.step(tree_from_branches([[2, 3], [2, 5], [7]], root_token=1), cache)
    assert res.tokens == [2, 3, 4] and cache_tokens(cache) == [1, 2, 3]
    cache2 = target.new_cache()
    res = ver.step(tree_from_branches([[9, 3]], root_token=1), cache2)
    assert res.tokens == [2] and res.num_accepted == 0 and cache_tokens(cache2) == [1]


def test_step_padded_tree_and_chain_special_case() -> None:
    table = {(1,): 2, (1, 2): 3, (1, 2, 3): 4}
    target = TableTarget(table)
    ver = Verifier(target)
    tree = tree_from_branches([[2, 3, 9]], root_token=1).padded(10)
    cache = target.new_cache()
    assert ver.step(tree, cache).tokens == [2, 3, 4]
    assert cache_tokens(cache) == [1, 2, 3]
    chain = ChainShape(3).build(torch.eye(16)[[2, 3, 9]] * 5, 1)
    assert chain.tokens.tolist() == [1, 2, 3, 9] and chain.parents.tolist() == [-1, 0, 1, 2]


def test_step_bad_input() -> None:
    target = TableTarget({})
    ver = Verifier(target)
    cache = target.new_cache(8)
    with pytest.raises(TypeError, match="DraftTree"):
        ver.step([1, 2, 3], cache)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="KVCache"):
        ver.step(tree_from_branches([[1]], root_token=0), object())  # type: ignore[arg-type]
    with pytest.raises(VerifyError, match="root token"):
        ver.step(tree_from_branches([[1]]), cache)
    with pytest.raises(Exception, match="empty|at least|length|root"):
        ver.step(DraftTree(np.zeros(0, np.int64), np.zeros(0, np.int32)), cache)
    with pytest.raises(VerifyError, match="do not fit"):
        ver.step(tree_from_branches([list(range(9))], root_token=0), cache)
    assert cache.committed_len == 0 and cache.pending == 0
    with pytest.raises(TypeError, match="rule"):
        Verifier(target, "greedy")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Target"):
        Verifier(object())  # type: ignore[arg-type]
    with pytest.raises(VerifyError, match="prefill"):
        ver.prefill([], cache)
    with pytest.raises(ConfigError, match="tree shape"):
        tree_shape("beam", budget=4, depth=4)


# -- lossless greedy on a real model -------------------------------------------------------
VOCAB = 40
N_PROMPTS, N_TOKENS, DEPTH = 20, 64, 5


@pytest.fixture(scope="module")
def target() -> LlamaModel:
    cfg = tiny_config(VOCAB)
    return LlamaModel(cfg, backend="sdpa").double().init_random(3)


@pytest.fixture(scope="module")
def references(target: LlamaModel) -> list[tuple[list[int], list[int], DenseKVCache]]:
    """Per prompt: the autoregressive greedy tokens and the cache after decoding them (a few
    extra tokens so a final overshooting step still has a reference)."""
    rng = np.random.default_rng(0)
    out = []
    for _ in range(N_PROMPTS):
        prompt = rng.integers(0, VOCAB, size=int(rng.integers(1, 9))).tolist()
        cache = target.new_cache()
        res = autoregressive_generate(
            target, prompt, max_new_tokens=N_TOKENS + DEPTH + 1, cache=cache
        )
        assert res.steps == N_TOKENS + DEPTH + 1
        out.append((prompt, res.tokens, cache))
    # The model must not be degenerate (else equality would prove little).
    assert len({t for _, toks, _ in out for t in toks}) > VOCAB // 2
    return out


def drafter_for(name: str, target: LlamaModel, seed: int):  # type: ignore[no-untyped-def]
    if name == "random":
        return RandomDrafter(VOCAB, seed=seed)
    if name == "oracle":
        return OracleDrafter(target, seed=seed)
    if name == "noisy-oracle":
        return OracleDrafter(target, miss=0.3, seed=seed)
    return AdversarialDrafter(target, seed=seed)


@pytest.mark.parametrize("kind", ["ddtree", "chain"])
@pytest.mark.parametrize("drafter", ["random", "oracle", "noisy-oracle", "adversarial"])
def test_lossless_greedy(target, references, kind: str, drafter: str) -> None:  # type: ignore[no-untyped-def]
    total_acc, total_steps = 0, 0
    for i, (prompt, ref_tokens, ref_cache) in enumerate(references):
        gen = SpeculativeGenerator(
            target, drafter_for(drafter, target, i), strategy=kind, budget=12, max_depth=DEPTH
        )
        checked = [0]

        def on_step(
            context: list[int],
            cache: KVCache,
            step: StepResult,
            ref_cache: DenseKVCache = ref_cache,
            checked: list[int] = checked,
        ) -> None:
            # The cache holds the context minus its last token (more if the output was cut).
            n = cache.committed_len
            assert n >= len(context) - 1 and cache.pending == 0
            for layer in range(target.config.num_hidden_layers):
                k, v = cache.committed_kv(layer)
                rk, rv = ref_cache.committed_kv(layer)
                torch.testing.assert_close(k, rk[:, :n], rtol=1e-9, atol=1e-9)
                torch.testing.assert_close(v, rv[:, :n], rtol=1e-9, atol=1e-9)
            checked[0] += 1

        res = gen.generate(prompt, max_new_tokens=N_TOKENS, on_step=on_step)
        assert res.tokens == ref_tokens[:N_TOKENS], f"prompt {i}"
        assert checked[0] == res.steps
        total_acc += sum(res.accepted)
        total_steps += res.steps
    # The drafters do what they claim, so each path of the walk is exercised.
    if drafter == "oracle":
        assert total_acc / total_steps >= DEPTH - 0.5
    elif drafter == "adversarial":
        assert total_acc == 0 and total_steps == N_PROMPTS * N_TOKENS
    elif drafter == "noisy-oracle":
        assert 0.5 < total_acc / total_steps < DEPTH - 0.5


def test_generate_eos_and_limits(target, references) -> None:  # type: ignore[no-untyped-def]
    prompt, ref_tokens, _ = references[0]
    eos = ref_tokens[10]
    first = ref_tokens.index(eos)
    gen = SpeculativeGenerator(target, OracleDrafter(target), budget=8, max_depth=4)
    out = gen.generate(prompt, max_new_tokens=64, eos_token_id=eos)
    assert out.tokens == ref_tokens[: first + 1]
    assert gen.generate(prompt, max_new_tokens=0).tokens == []
    assert autoregressive_generate(target, prompt, max_new_tokens=3).tokens == ref_tokens[:3]
    with pytest.raises(VerifyError, match="prompt"):
        gen.generate([], max_new_tokens=4)
    with pytest.raises(ConfigError, match="budget"):
        SpeculativeGenerator(target, RandomDrafter(VOCAB), budget=0)
    with pytest.raises(VerifyError, match="maximum|fit"):
        gen.generate(prompt, max_new_tokens=400)


def test_lossless_greedy_through_transformers() -> None:
    """The same loop through an unmodified transformers LlamaForCausalLM (HFTarget)."""
    from transformers import LlamaConfig as HFConfig
    from transformers import LlamaForCausalLM

    from specdec.models.hf import HFTarget

    torch.manual_seed(0)
    cfg = HFConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    model = LlamaForCausalLM(cfg).double().eval()
    with torch.no_grad():
        for p in model.parameters():  # the default init is too flat to be a fair test
            p.normal_(0.0, 0.3)
    target = HFTarget(model)
    rng = np.random.default_rng(1)
    for kind in ("ddtree", "chain"):
        for drafter in ("random", "noisy-oracle"):
            prompt = rng.integers(0, VOCAB, size=4).tolist()
            ref_cache = target.new_cache()
            ref = autoregressive_generate(target, prompt, max_new_tokens=30, cache=ref_cache)
            d = (
                RandomDrafter(VOCAB, seed=1)
                if drafter == "random"
                else OracleDrafter(target, miss=0.3, seed=1)
            )
            gen = SpeculativeGenerator(target, d, strategy=kind, budget=10, max_depth=4)
            cache = target.new_cache()
            out = gen.generate(prompt, max_new_tokens=24, cache=cache)
            assert out.tokens == ref.tokens[:24]
            n = cache.committed_len
            for layer in range(cfg.num_hidden_layers):
                for a, b in zip(
                    cache.committed_kv(layer), ref_cache.committed_kv(layer), strict=True
                ):
                    torch.testing.assert_close(a, b[:, :n], rtol=1e-9, atol=1e-9)


def test_lossless_greedy_with_padded_trees(target, references) -> None:  # type: ignore[no-untyped-def]
    # Fixed-shape trees (what a CUDA-graph verifier runs): the drafter bans all but its best
    # token on every other step, so those trees hold DEPTH nodes and are padded to the budget;
    # padding nodes are never accepted.
    padded_steps = 0
    for i in range(3):
        prompt, ref_tokens, _ = references[i]
        drafter = BanningDrafter(OracleDrafter(target, miss=0.4, seed=i), lambda c: 1 + len(c) % 2)
        gen = SpeculativeGenerator(target, drafter, budget=12, max_depth=DEPTH, pad_to_budget=True)
        trees: list[DraftTree] = []
        res = gen.generate(
            prompt, max_new_tokens=40, on_step=lambda *_, g=gen, ts=trees: ts.extend(g.last_trees)
        )
        assert res.tokens == ref_tokens[:40]
        assert len(trees) == res.steps and all(t.num_nodes == 13 for t in trees)
        padded_steps += sum(t.num_real < t.num_nodes for t in trees)
    assert padded_steps >= 5, padded_steps


def test_positions_beyond_model_maximum_leave_cache_unchanged() -> None:
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=16,
    )
    model = LlamaModel(cfg).double().init_random(0)
    cache = model.new_cache(64)  # the cache has room; the model's positions do not
    ver = Verifier(model)
    ver.prefill(list(range(14)), cache)
    with pytest.raises(VerifyError, match="maximum"):
        ver.step(tree_from_branches([[1, 2, 3]], root_token=0), cache)
    assert cache.committed_len == 14 and cache.pending == 0
    assert ver.step(tree_from_branches([[1]], root_token=0), cache).num_accepted in (0, 1)


def test_step_batch_equals_single_steps(target, references) -> None:  # type: ignore[no-untyped-def]
    """R sequences with different prefix lengths and tree sizes in one forward give the same
    tokens and caches as R separate steps, and stay lossless."""
    ver = Verifier(target)
    seqs = [references[i] for i in (0, 1, 2, 5)]
    contexts = [list(p) for p, _, _ in seqs]
    batch_caches = [target.new_cache() for _ in seqs]
    single_caches = [target.new_cache() for _ in seqs]
    for ctx, cb, cs in zip(contexts, batch_caches, single_caches, strict=True):
        if len(ctx) > 1:
            ver.prefill(ctx[:-1], cb)
            ver.prefill(ctx[:-1], cs)
    drafters = [OracleDrafter(target, miss=0.4, seed=i) for i in range(len(seqs))]
    for step in range(8):
        trees = [
            DDTreeShape(4 + 3 * ((i + step) % 4)).build(d.draft_one(ctx, DEPTH), ctx[-1])
            for i, (d, ctx) in enumerate(zip(drafters, contexts, strict=True))
        ]
        batch = ver.step_batch(trees, batch_caches)
        singles = [ver.step(t, c) for t, c in zip(trees, single_caches, strict=True)]
        for b, s, ctx in zip(batch, singles, contexts, strict=True):
            assert b.tokens == s.tokens
            assert b.accepted.tolist() == s.accepted.tolist()
            ctx += b.tokens
        for cb, cs in zip(batch_caches, single_caches, strict=True):
            assert cb.committed_len == cs.committed_len and cb.pending == 0
            for layer in range(target.config.num_hidden_layers):
                for x, y in zip(cb.committed_kv(layer), cs.committed_kv(layer), strict=True):
                    torch.testing.assert_close(x, y, rtol=1e-10, atol=1e-10)
    for (prompt, ref_tokens, _), ctx in zip(seqs, contexts, strict=True):
        gen = ctx[len(prompt) :]
        assert gen == ref_tokens[: len(gen)] and len(gen) >= 8
    with pytest.raises(VerifyError, match="one cache per tree"):
        ver.step_batch(trees, batch_caches[:2])
    with pytest.raises(VerifyError, match="own cache"):
        ver.step_batch(trees[:2], [batch_caches[0], batch_caches[0]])
    with pytest.raises(VerifyError, match="root"):
        ver.step_batch([tree_from_branches([[1]])], batch_caches[:1])
    with pytest.raises(TypeError, match="forward_batch"):
        Verifier(TableTarget({})).step_batch(trees[:1], batch_caches[:1])
    assert all(c.pending == 0 for c in batch_caches)


def test_step_batch_is_all_or_nothing(target, references) -> None:  # type: ignore[no-untyped-def]
    """A commit refused for one sequence leaves every sequence's cache as it was (checked
    before any commit), and the caches still step correctly afterwards."""

    class Refusing(DenseKVCache):
        refuse = True

        def check_commit(self, keep):  # type: ignore[no-untyped-def]
            if self.refuse:
                raise VerifyError("refused for the test")
            super().check_commit(keep)

    ver = Verifier(target)
    seqs = [references[i] for i in (0, 1, 2)]
    c = target.config
    caches = [target.new_cache(), target.new_cache(), Refusing(c.num_hidden_layers,
              c.num_key_value_heads, c.head_dim, 256, dtype=torch.float64)]  # fmt: skip
    contexts = [list(p) for p, _, _ in seqs]
    for ctx, cache in zip(contexts, caches, strict=True):
        ver.prefill(ctx[:-1], cache)
    drafters = [OracleDrafter(target, miss=0.2, seed=i) for i in range(3)]
    trees = [
        DDTreeShape(8).build(d.draft_one(ctx, DEPTH), ctx[-1])
        for d, ctx in zip(drafters, contexts, strict=True)
    ]
    before = [
        (cache.committed_len, [kv.clone() for kv in cache.committed_kv(0)]) for cache in caches
    ]
    with pytest.raises(VerifyError, match="refused"):
        ver.step_batch(trees, caches)
    for cache, (n, kv) in zip(caches, before, strict=True):
        assert cache.committed_len == n and cache.pending == 0
        for a, b in zip(cache.committed_kv(0), kv, strict=True):
            assert torch.equal(a, b)
    caches[2].refuse = False  # type: ignore[attr-defined]
    for ctx, res in zip(contexts, ver.step_batch(trees, caches), strict=True):
        ctx += res.tokens
    for (prompt, ref, _), ctx in zip(seqs, contexts, strict=True):
        assert ctx[len(prompt) :] == ref[: len(ctx) - len(prompt)]  # still lossless
