"""The fused decode step (``LlamaModel.fused_step``: the whole stack in one Rust call over
the GGUF blocks and the caches' K/V) against the torch path, layer by layer, as the
reference: SmolLM2-135M-Instruct and tiny random GGUF models; one token, a chain, a
branching tree (ancestor mask, positions by depth), dense and paged caches (shared prefix
blocks), ``forward_batch`` with unequal prefixes, ``forward_paged`` beams, hidden-state
capture; greedy speculation identical to autoregressive decoding; the fallbacks; bad input.

Bound: both paths run the same float32 products (the same kernel); norms, softmax and SiLU
sum and round in another order. Logits agree within ``ATOL = 1e-4`` absolute (SmolLM2's
logits reach ~30: about 3e-6 of their scale), the K/V written and the hidden states
within the same bound relative to their scale."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import torch

from specdec import _core
from specdec.cache import DenseKVCache, PagedKVPool
from specdec.decode import SpeculativeGenerator, autoregressive_generate
from specdec.errors import ConfigError, KVCacheError, SpecdecError, VerifyError
from specdec.models import LlamaConfig, LlamaModel, load_gguf, smollm2
from specdec.models.llama import model as llama_mod  # the module whose steps call run_step
from specdec.models.quant import kernel_available
from specdec.protocols import ArgmaxCapture, HiddenCapture, KVCache, LogitsMask
from specdec.testing import OracleDrafter, reference_tree_mask
from specdec.testing import write_gguf as write_tiny
from specdec.verify import Greedy, Sampling

pytestmark = pytest.mark.skipif(not kernel_available(), reason="no AVX-512 on this CPU")

ATOL = 1e-4
PARENTS = [-1, 0, 0, 1, 1, 2, 4, 0]  # a branching tree: depths 0 1 1 2 2 2 3 1


def depths(parents: list[int]) -> list[int]:
    d: list[int] = []
    for p in parents:
        d.append(0 if p < 0 else d[p] + 1)
    return d


@pytest.fixture(scope="module")
def lm() -> Any:
    return smollm2()


@pytest.fixture(scope="module")
def prompt(lm: Any) -> list[int]:
    text = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) +"
    ids: list[int] = lm.tokenizer.encode(text).ids
    return ids


@pytest.fixture
def fused_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Counts the model's fused steps (``run_step`` calls)."""
    calls: list[int] = []
    real = llama_mod.run_step

    def spy(*a: Any, **k: Any) -> Any:
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(llama_mod, "run_step", spy)
    yield calls


def both(model: LlamaModel, run: Callable[[], Any]) -> tuple[Any, Any]:
    """``run()`` on the torch path, then fused (fresh caches each time: ``run`` makes them)."""
    was = model.fused_step
    try:
        model.fused_step = False
        ref = run()
        model.fused_step = True
        got = run()
    finally:
        model.fused_step = was
    return ref, got


def close(ref: Any, got: Any, atol: float = ATOL) -> None:
    if isinstance(ref, torch.Tensor):
        assert isinstance(got, torch.Tensor) and got.shape == ref.shape
        worst = float((ref - got).abs().max())
        assert worst <= atol, worst
        return
    assert len(ref) == len(got)
    for a, b in zip(ref, got, strict=True):
        close(a, b, atol)


def scaled(t: torch.Tensor) -> float:
    """An absolute bound for a tensor of ``t``'s scale (K/V, hidden states)."""
    return ATOL * max(1.0, float(t.abs().max()) / 30.0)


def prefilled(model: LlamaModel, ids: list[int], cache: Any) -> torch.Tensor:
    t = torch.tensor(ids)
    out = model.forward_last(t, torch.arange(len(ids)), cache)
    cache.commit(list(range(len(ids))))
    return out


def test_one_token_chain_and_prefill_on_a_dense_cache(
    lm: Any, prompt: list[int], fused_calls: list[int]
) -> None:
    m: LlamaModel = lm.model
    n = len(prompt)

    def run() -> tuple[torch.Tensor, ...]:
        cache = m.new_cache(n + 16)
        first = prefilled(m, prompt[:-6], cache)
        one = m(torch.tensor(prompt[-6:-5]), torch.tensor([n - 6]), cache)
        cache.commit([0])
        chain = m(torch.tensor(prompt[-5:]), torch.arange(n - 5, n), cache)  # causal
        cache.commit(list(range(5)))
        return first, one, chain, cache.k[:, :, :n], cache.v[:, :, :n]

    ref, got = both(m, run)
    assert len(fused_calls) == 3
    close(ref[:3], got[:3])
    close(ref[3], got[3], scaled(ref[3]))  # the K/V the fused step wrote, in their slots
    close(ref[4], got[4], scaled(ref[4]))


def test_profiled_steps_count_their_phases_and_give_the_same_logits(
    lm: Any, prompt: list[int]
) -> None:
    # The stack's clock: off as built, on it splits each step's wall time into phases that
    # sum to no more than it, without changing a bit of the logits; reset clears it.
    m: LlamaModel = lm.model
    n = len(prompt)
    cache = m.new_cache(n + 4)
    prefilled(m, prompt[:-3], cache)
    step, pos = torch.tensor(prompt[-3:]), torch.arange(n - 3, n)
    plain = m(step, pos, cache)
    cache.rollback()
    assert m._fused is not None
    stack = m._fused.stack
    assert not stack.profiling
    stack.reset_profile()
    stack.profiling = True
    try:
        profiled = m(step, pos, cache)
        cache.rollback()
        m(step, pos, cache)
        cache.rollback()
    finally:
        stack.profiling = False
    assert torch.equal(plain, profiled)
    p = stack.profile()
    assert p.calls == 2
    assert min(p.matmul_ns, p.attention_ns, p.other_ns) > 0
    assert p.matmul_ns + p.attention_ns + p.other_ns <= p.wall_ns
    m(step, pos, cache)  # off: not counted
    cache.rollback()
    assert stack.profile().calls == 2
    stack.reset_profile()
    q = stack.profile()
    assert (q.calls, q.wall_ns, q.matmul_ns, q.attention_ns, q.other_ns) == (0, 0, 0, 0, 0)


def test_tree_step_on_dense_and_paged_caches(
    lm: Any, prompt: list[int], fused_calls: list[int]
) -> None:
    m: LlamaModel = lm.model
    p, tree_tokens = len(prompt), [prompt[-1], 11, 263, 314, 42, 7, 1000, 5]
    mask = reference_tree_mask(PARENTS, p)
    pos = torch.tensor([p + d for d in depths(PARENTS)])

    def dense() -> torch.Tensor:
        cache = m.new_cache(p + 16)
        prefilled(m, prompt, cache)
        return m(torch.tensor(tree_tokens), pos, cache, mask)

    def paged() -> torch.Tensor:
        # The second sequence reuses the first one's full prefix blocks (prefix caching).
        pool = PagedKVPool(30, 3, 64, 16, 8, prefix_caching=True)
        a = pool.sequence(prompt)
        m.forward_last(torch.tensor(prompt), torch.arange(p), a)
        a.commit_fed(torch.tensor(prompt))
        b = pool.sequence(prompt)
        assert 0 < b.committed_len < p
        rest = prompt[b.committed_len :]
        m(torch.tensor(rest), torch.arange(b.committed_len, p), b)
        b.commit_fed(torch.tensor(rest))
        assert a.block_table()[0] == b.block_table()[0]
        return m(torch.tensor(tree_tokens), pos, b, mask)

    close(*both(m, dense))
    close(*both(m, paged))
    assert len(fused_calls) == 2 + 3  # prefill and tree; the paged prefill, rest, tree
    # The tree's logits equal those of each root-to-node path run alone (no sibling leaks).
    got = dense()
    for i in (3, 6):
        path = [i]
        while PARENTS[path[-1]] > 0:
            path.append(PARENTS[path[-1]])
        path = [0, *reversed(path)]
        cache = m.new_cache(p + 16)
        prefilled(m, prompt, cache)
        alone = m(
            torch.tensor([tree_tokens[j] for j in path]), torch.arange(p, p + len(path)), cache
        )
        close(alone[-1], got[i])


def test_the_stacks_argmax_is_the_argmax_of_its_logits(lm: Any, prompt: list[int]) -> None:
    """``argmax=`` on the fused step: each logits row's argmax, exactly (one tree step, a
    batch); a stale value is replaced; the torch path leaves ``None``."""
    m: LlamaModel = lm.model
    p, tree_tokens = len(prompt), [prompt[-1], 11, 263, 314, 42, 7, 1000, 5]
    mask = reference_tree_mask(PARENTS, p)
    pos = torch.tensor([p + d for d in depths(PARENTS)])
    cache = m.new_cache(p + 16)
    prefilled(m, prompt, cache)
    top = ArgmaxCapture(tokens=torch.zeros(8, dtype=torch.int64))
    logits = m(torch.tensor(tree_tokens), pos, cache, mask, argmax=top)
    cache.rollback()
    assert top.tokens is not None and torch.equal(top.tokens, logits.argmax(-1))
    assert len(set(top.tokens.tolist())) > 1  # rows of their own
    ids, bpos, caches, bmask = tree_batch(m, prompt)
    batch = ArgmaxCapture()
    out = m.forward_batch(ids, bpos, caches, bmask, argmax=batch)
    assert batch.tokens is not None and batch.tokens.shape == (3, 5)
    assert torch.equal(batch.tokens, out.argmax(-1))
    m.fused_step = False
    try:
        m(torch.tensor(tree_tokens), pos, cache, mask, argmax=top)
        cache.rollback()
    finally:
        m.fused_step = True
    assert top.tokens is None


def test_greedy_steps_read_the_stacks_argmax(
    lm: Any, monkeypatch: pytest.MonkeyPatch, fused_calls: list[int]
) -> None:
    """Plain greedy steps (autoregressive and speculative) take the fused step's argmax and
    never scan the logits; a rule of another type, or a constraint, takes the rule's path;
    the tokens are the same."""
    m: LlamaModel = lm.model
    ids = lm.encode_chat([{"role": "user", "content": "List three fruits."}])
    chose: list[int] = []
    real = Greedy.choose

    def spy(self: Greedy, logits: torch.Tensor, *a: Any, **k: Any) -> torch.Tensor:
        chose.append(logits.shape[0])
        return real(self, logits, *a, **k)

    monkeypatch.setattr(Greedy, "choose", spy)

    class SameGreedy(Greedy):
        """Greedy by another type: the verifier cannot assume it picks the argmax."""

    ar = autoregressive_generate(m, ids, max_new_tokens=16)
    gen = SpeculativeGenerator(m, OracleDrafter(m, miss=0.3, seed=1), budget=6, max_depth=3)
    spec = gen.generate(ids, max_new_tokens=16)
    assert len(ids) <= m.quant_max_rows  # the prompt's step runs fused too
    assert fused_calls and chose == []
    chose.clear()
    ar_rule = autoregressive_generate(m, ids, max_new_tokens=16, rule=SameGreedy())
    gen = SpeculativeGenerator(
        m, OracleDrafter(m, miss=0.3, seed=1), budget=6, max_depth=3, rule=SameGreedy()
    )
    spec_rule = gen.generate(ids, max_new_tokens=16)
    assert len(chose) >= ar_rule.steps + spec_rule.steps
    assert ar.tokens == ar_rule.tokens == spec.tokens == spec_rule.tokens


def tree_batch(
    m: LlamaModel, prompt: list[int]
) -> tuple[torch.Tensor, torch.Tensor, list[Any], torch.Tensor]:
    """A 3-row batch of one 5-node tree after prefixes of 7, all and 12 prompt tokens, each
    prefilled into a dense cache: ids, positions, caches and ``forward_batch``'s mask."""
    lens, parents = [7, len(prompt), 12], PARENTS[:5]
    ids = torch.tensor([[prompt[n - 1], 11, 263, 314, 42] for n in lens])
    bpos = torch.tensor([[n + d for d in depths(parents)] for n in lens])
    caches: list[Any] = []
    for n in lens:
        caches.append(m.new_cache(64))
        prefilled(m, prompt[:n], caches[-1])
    return ids, bpos, caches, batch_mask(lens, parents)


def batch_mask(lens: list[int], parents: list[int]) -> torch.Tensor:
    """forward_batch's layout: prefix columns, padding to the longest, then the tree."""
    p_max, t = max(lens), len(parents)
    tree = reference_tree_mask(parents, 0)
    mask = torch.zeros(len(lens), t, p_max + t, dtype=torch.bool)
    for r, n in enumerate(lens):
        mask[r, :, :n] = True
        mask[r, :, p_max:] = tree
    return mask


@pytest.mark.parametrize("kind", ["dense", "paged"])
def test_forward_batch_with_unequal_prefixes(
    lm: Any, prompt: list[int], kind: str, fused_calls: list[int]
) -> None:
    m: LlamaModel = lm.model
    lens = [7, len(prompt), 12]
    parents = PARENTS[:5]
    t = len(parents)
    ids = torch.tensor([[prompt[n - 1], 11, 263, 314, 42][:t] for n in lens])
    pos = torch.tensor([[n + d for d in depths(parents)] for n in lens])
    mask = batch_mask(lens, parents)

    def run() -> tuple[torch.Tensor, torch.Tensor]:
        pool = PagedKVPool(30, 3, 64, 32, 8)
        caches: list[Any] = []
        for n in lens:
            c = m.new_cache(64) if kind == "dense" else pool.sequence()
            prefilled(m, prompt[:n], c)
            caches.append(c)
        hidden = HiddenCapture(layers=(3, 17), final=True)
        logits = m.forward_batch(ids, pos, caches, mask, hidden=hidden)
        assert hidden.states is not None
        return logits, hidden.states

    (ref, ref_h), (got, got_h) = both(m, run)
    assert len(fused_calls) == 4
    assert got.shape == (3, t, m.vocab_size) and got_h.shape == (3, t, 3 * 576)
    close(ref, got)
    close(ref_h, got_h, scaled(ref_h))


def test_forward_paged_beams_sharing_blocks(
    lm: Any, prompt: list[int], fused_calls: list[int]
) -> None:
    m: LlamaModel = lm.model

    def run() -> torch.Tensor:
        pool = PagedKVPool(30, 3, 64, 32, 8)
        a = pool.sequence()
        prefilled(m, prompt, a)
        b = a.fork()  # shares a's blocks, its partial tail copied on write
        c = pool.sequence()
        prefilled(m, prompt[:9], c)
        n = len(prompt)
        out = m.forward_paged(torch.tensor([5, 77, 1000]), torch.tensor([n, n, 9]), [a, b, c])
        pool.commit_decode([a, b, c])
        return out

    ref, got = both(m, run)
    assert len(fused_calls) == 3  # two prefills and the paged step
    close(ref, got)


def test_greedy_speculation_is_autoregressive_decoding(lm: Any, fused_calls: list[int]) -> None:
    m: LlamaModel = lm.model
    ids = lm.encode_chat([{"role": "user", "content": "List three fruits."}])
    ar = autoregressive_generate(m, ids, max_new_tokens=20, eos_token_id=lm.eos_token_id)
    drafter = OracleDrafter(m, miss=0.3, seed=1)
    gen = SpeculativeGenerator(m, drafter, budget=8, max_depth=4)
    res = gen.generate(ids, max_new_tokens=20, eos_token_id=lm.eos_token_id)
    assert res.tokens == ar.tokens
    assert res.steps < len(ar.tokens)
    assert fused_calls  # both ran fused
    m.fused_step = False
    try:
        torch_ar = autoregressive_generate(m, ids, max_new_tokens=20, eos_token_id=lm.eos_token_id)
    finally:
        m.fused_step = True
    assert torch_ar.tokens == ar.tokens


def tiny(tied: bool) -> LlamaModel:
    cfg = LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=2.0**-17,
        max_position_embeddings=64,
        tie_word_embeddings=tied,
    )
    return LlamaModel(cfg).init_random(seed=5).float()


@pytest.mark.parametrize(("qtype", "tied"), [("Q4_1", False), ("Q8_0", True)])
def test_tiny_gguf_models(tmp_path: Any, qtype: str, tied: bool, fused_calls: list[int]) -> None:
    write_tiny(tmp_path / "t.gguf", tiny(tied), qtype)
    m = load_gguf(tmp_path / "t.gguf").model
    assert m.quantized is not None
    prompt = [5, 9, 77, 3, 100, 42, 17]
    mask = reference_tree_mask(PARENTS, len(prompt))
    pos = torch.tensor([len(prompt) + d for d in depths(PARENTS)])

    def run() -> tuple[torch.Tensor, torch.Tensor]:
        cache = m.new_cache(32)
        first = prefilled(m, prompt, cache)
        tree = m(torch.tensor([42, 1, 2, 3, 4, 5, 6, 7]), pos, cache, mask)
        return first, tree

    ref, got = both(m, run)
    assert len(fused_calls) == 2
    scale = max(1.0, float(ref[1].abs().max()))
    close(ref, got, ATOL * scale / 30)


class Delegating(KVCache):
    """A KV cache the fused step does not know (a dense cache behind the protocol)."""

    def __init__(self, inner: DenseKVCache) -> None:
        self.inner = inner
        self.num_layers, self.num_kv_heads = inner.num_layers, inner.num_kv_heads
        self.head_dim = inner.head_dim

    @property
    def committed_len(self) -> int:
        return self.inner.committed_len

    @property
    def pending(self) -> int:
        return self.inner.pending

    def begin(self, num_new: int) -> None:
        self.inner.begin(num_new)

    def append(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inner.append(layer, k, v)

    def commit(self, keep: Any) -> None:
        self.inner.commit(keep)

    def rollback(self) -> None:
        self.inner.rollback()

    def committed_kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inner.committed_kv(layer)


def test_the_torch_path_where_the_fused_step_does_not_apply(
    lm: Any, prompt: list[int], fused_calls: list[int]
) -> None:
    m: LlamaModel = lm.model
    ids, pos = torch.tensor(prompt), torch.arange(len(prompt))
    # A cache of another kind (here a dense one behind the protocol): the torch path.
    inner = m.new_cache(8)
    other = Delegating(inner)
    ref = m(ids[:2], pos[:2], other)
    close(ref, m(ids[:2], pos[:2], m.new_cache(8)))  # fused
    fused_calls.clear()
    other.rollback()
    close(ref, m(ids[:2], pos[:2], other), 0.0)
    was = m.quant_max_rows
    m.quant_max_rows = 4  # too many rows for the blocks
    try:
        m(ids[:6], pos[:6], m.new_cache(8))
    finally:
        m.quant_max_rows = was
    m.fused_step = False
    try:
        m(ids[:1], pos[:1], m.new_cache(8))
    finally:
        m.fused_step = True
    assert not fused_calls


def test_a_norm_weight_changed_in_place_is_read_again(tmp_path: Any) -> None:
    write_tiny(tmp_path / "t.gguf", tiny(False), "Q8_0")
    m = load_gguf(tmp_path / "t.gguf").model
    ids = torch.tensor([5, 9, 77])

    def run() -> torch.Tensor:
        return m(ids, torch.arange(3), m.new_cache(8))

    before = run()
    with torch.no_grad():
        m.model.layers[1].post_attention_layernorm.weight.mul_(1.5)
    ref, got = both(m, run)
    close(ref, got, 1e-5 * max(1.0, float(ref.abs().max())))
    assert not torch.allclose(before, got)
    m.model.norm.weight = torch.nn.Parameter(torch.ones(64))  # replaced
    ref, got = both(m, run)
    close(ref, got, 1e-5 * max(1.0, float(ref.abs().max())))


def test_an_error_inside_the_step_rolls_the_cache_back(
    lm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    m: LlamaModel = lm.model

    def boom(*a: Any, **k: Any) -> Any:
        raise KVCacheError("injected")

    monkeypatch.setattr(llama_mod, "run_step", boom)
    cache = m.new_cache(8)
    with pytest.raises(KVCacheError):
        m(torch.tensor([1, 2]), torch.arange(2), cache)
    assert cache.pending == 0 and cache.committed_len == 0


def test_bad_step_input_raises_specdec_errors(lm: Any) -> None:
    m: LlamaModel = lm.model
    with torch.no_grad():
        m(torch.tensor([1]), torch.tensor([0]), m.new_cache(4))  # builds the stack
    stack = m._fused.stack if m._fused is not None else None
    assert stack is not None
    k = np.zeros((30, 3, 16, 64), dtype=np.float32)
    v = np.zeros_like(k)
    x = np.zeros((2, 576), dtype=np.float32)
    logits = np.zeros((2, m.vocab_size), dtype=np.float32)
    ok: dict[str, Any] = dict(
        x=x,
        positions=np.array([0, 1]),
        kv=[(k, v, False)],
        buffers=np.array([0]),
        slots=np.array([[0, 1]]),
        new_slots=np.array([[0, 1]]),
        mask=None,
        logits=logits,
        last=False,
        capture_layers=[],
        capture_final=False,
        hidden=None,
    )
    stack.step(**ok)
    table = m.model.embed_tokens.weight.detach().numpy()
    bad: list[tuple[dict[str, Any], type[SpecdecError]]] = [
        ({"new_slots": np.array([[0, 16]])}, KVCacheError),
        ({"slots": np.array([[-1, 1]])}, KVCacheError),
        ({"buffers": np.array([1])}, KVCacheError),
        ({"kv": [(k[:, :2], v[:, :2], False)]}, KVCacheError),
        ({"kv": [(k, v, True)]}, KVCacheError),  # not a pool's layout
        ({"positions": np.array([0, 10**6])}, VerifyError),
        ({"x": x[:1]}, VerifyError),
        ({"logits": logits[:1]}, VerifyError),
        ({"mask": np.ones((1, 2, 3), dtype=bool)}, VerifyError),
        ({"capture_layers": [30], "hidden": np.zeros((2, 576), dtype=np.float32)}, ConfigError),
        ({"capture_final": True}, ConfigError),
        ({"x": "nope"}, SpecdecError),
        ({"argmax": np.zeros(3, dtype=np.int64)}, VerifyError),
        ({"x": None}, ConfigError),
        ({"ids": np.array([0, 1]), "embed": table}, ConfigError),  # x given too
        ({"x": None, "ids": np.array([0, m.vocab_size]), "embed": table}, VerifyError),
        ({"x": None, "ids": np.array([0, 1]), "embed": table[:, :64]}, VerifyError),
    ]
    k[:] = 0.0
    for change, err in bad:
        with pytest.raises(err):
            stack.step(**{**ok, **change})
    assert not k.any() and not v.any()  # a refused step writes nothing
    q = m.quantized
    assert q is not None
    with pytest.raises(ConfigError, match="linear"):
        _core.LlamaStack(
            (576, 1536, 30, 9, 3, 64, 49152),
            1e-5,
            [mm for mm, _ in q.plan][:-1],  # type: ignore[misc]
            [None] * 120,
            [np.ones(576, dtype=np.float32)] * 61,
            np.ones((8, 64), dtype=np.float32),
            np.ones((8, 64), dtype=np.float32),
        )


def test_threads_stepping_sequences_of_one_pool_wait_for_each_other(lm: Any) -> None:
    """Steps on sequences of one pool from several threads at once: each thread's logits equal
    a single-threaded run's (the oracle), none fails on the shared K/V arrays."""
    import threading

    m: LlamaModel = lm.model
    pool = PagedKVPool(30, 3, 64, 64, 4)

    def work(seed: int) -> list[torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        seq = pool.sequence()
        out = []
        for _ in range(6):
            n = int(torch.randint(1, 4, (1,), generator=g))
            ids = torch.randint(0, 49152, (n,), generator=g)
            at = seq.committed_len
            out.append(m(ids, torch.arange(at, at + n), seq))
            seq.commit_fed(ids)
        seq.free()
        return out

    want = [work(s) for s in range(4)]
    got: dict[int, list[torch.Tensor]] = {}
    errors: list[BaseException] = []

    def run(s: int) -> None:
        try:
            got[s] = work(s)
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for s in range(4):
        close(want[s], got[s], 0.0)


def test_rope_tables_grow_with_the_positions(lm: Any, fused_calls: list[int]) -> None:
    m: LlamaModel = lm.model

    def run() -> torch.Tensor:
        cache = m.new_cache(8)
        m(torch.tensor([1, 2]), torch.tensor([0, 1]), cache)
        cache.commit([0, 1])
        return m(torch.tensor([3, 4]), torch.tensor([700, 5000]), cache)  # past the tables

    ref, got = both(m, run)
    assert len(fused_calls) == 2
    close(ref, got)
    assert m._fused is not None and m._fused.stack.rope_positions >= 5001


def grammar_rows(n: int, vocab: int, seed: int) -> np.ndarray:
    """``n`` token bitmask rows: a few tokens, most tokens, every token, in turn."""
    rng = np.random.default_rng(seed)
    words = (vocab + 31) // 32
    bits = np.zeros((n, words * 32), dtype=bool)
    for i in range(n):
        kind = i % 3
        if kind == 0:
            bits[i, rng.choice(vocab, size=5, replace=False)] = True
        elif kind == 1:
            bits[i, :vocab] = rng.random(vocab) < 0.8
        else:
            bits[i, :vocab] = True
    packed = np.packbits(bits, axis=1, bitorder="little").view("<u4").astype(np.uint32)
    return packed.view(np.int32).copy()


def masked(logits: torch.Tensor, rows: np.ndarray) -> torch.Tensor:
    """The plain reference: every token a row does not allow set to -inf."""
    v = logits.shape[-1]
    bits = np.unpackbits(rows.view(np.uint8), axis=1, bitorder="little")[:, :v].astype(bool)
    out = logits.reshape(-1, v).clone()
    out[~torch.from_numpy(bits)] = float("-inf")
    return out.view(logits.shape)


@pytest.mark.parametrize("numeric", ["exact", "int8"])
def test_a_grammar_mask_on_the_step_masks_the_logits_exactly(
    lm: Any, prompt: list[int], numeric: str
) -> None:
    """``allowed=``: the logits of the same step without it, each row masked by its
    bitmask row, bit for bit, and the captured argmax the masked argmax (a tree step, a
    batch); the torch path leaves the mask to the caller (``applied`` False)."""
    m: LlamaModel = lm.model
    m.numeric = numeric  # type: ignore[assignment]
    try:
        p, tree_tokens = len(prompt), [prompt[-1], 11, 263, 314, 42, 7, 1000, 5]
        mask = reference_tree_mask(PARENTS, p)
        pos = torch.tensor([p + d for d in depths(PARENTS)])
        cache = m.new_cache(p + 16)
        prefilled(m, prompt, cache)
        plain = m(torch.tensor(tree_tokens), pos, cache, mask)
        cache.rollback()
        rows = grammar_rows(8, m.vocab_size, 1)
        allowed, top = LogitsMask(rows), ArgmaxCapture()
        got = m(torch.tensor(tree_tokens), pos, cache, mask, argmax=top, allowed=allowed)
        cache.rollback()
        assert allowed.applied
        want = masked(plain, rows)
        assert torch.equal(got, want)
        assert top.tokens is not None and torch.equal(top.tokens, want.argmax(-1))
        ids, bpos, caches, bmask = tree_batch(m, prompt)
        plain_b = m.forward_batch(ids, bpos, caches, bmask)
        for c in caches:
            c.rollback()
        rows_b = grammar_rows(15, m.vocab_size, 2)
        allowed_b = LogitsMask(rows_b)
        got_b = m.forward_batch(ids, bpos, caches, bmask, allowed=allowed_b)
        assert allowed_b.applied and torch.equal(got_b, masked(plain_b, rows_b))
    finally:
        m.numeric = "exact"
    m.fused_step = False
    try:
        torch_path = LogitsMask(rows)
        out = m(torch.tensor(tree_tokens), pos, cache, mask, allowed=torch_path)
        cache.rollback()
    finally:
        m.fused_step = True
    assert not torch_path.applied and torch.isfinite(out).all()


@pytest.mark.parametrize("mode", ["greedy", "seeded"])
def test_constrained_decoding_masks_in_the_head_and_decodes_the_same(
    lm: Any, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """A constrained request's steps hand the fused step its grammar mask (autoregressive,
    speculative, batched); the tokens are those of the same requests masked after the
    forward (``masks_logits`` off), greedy and seeded sampling."""
    m: LlamaModel = lm.model
    vocab = lm.vocabulary()
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    }
    grammar = vocab.json_schema(schema, whitespace=False)
    ids = lm.encode_chat([{"role": "user", "content": "A person as JSON."}])
    stop = set(vocab.eos_ids)
    rule = None if mode == "greedy" else Sampling(temperature=1.0)
    seed = None if mode == "greedy" else 3
    passed: list[bool] = []
    real = llama_mod.run_step

    def spy(*a: Any, **k: Any) -> Any:
        passed.append(k.get("allowed") is not None)
        return real(*a, **k)

    monkeypatch.setattr(llama_mod, "run_step", spy)

    def run() -> list[list[int]]:
        kw: dict[str, Any] = {"max_new_tokens": 24, "constraint": grammar, "stop_tokens": stop}
        ar = autoregressive_generate(m, ids, rule=rule, seed=seed, **kw)
        gen = SpeculativeGenerator(
            m, OracleDrafter(m, miss=0.3, seed=1), budget=6, max_depth=3, rule=rule
        )
        spec = gen.generate(ids, seed=seed, **kw)
        batch = gen.generate([ids, ids[:-2]], seed=seed, **kw)
        return [ar.tokens, spec.tokens, *(r.tokens for r in batch)]

    got = run()
    assert any(passed)
    passed.clear()
    monkeypatch.setattr(m, "masks_logits", False, raising=False)
    want = run()
    assert not any(passed)
    assert got == want
    assert got[0] == got[1]
