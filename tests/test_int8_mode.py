"""The int8 numeric mode (``LlamaModel.numeric = "int8"``) on SmolLM2-135M-Instruct: the
fused step against the torch path of the same mode, the mode against the float reference,
and speculation lossless against the same mode's own plain decoding (greedy and seeded
sampling, trees larger than ``quant_max_rows``). The products themselves are checked bit
for bit against a plain reference of the integer arithmetic in ``test_quant_linear.py``
and in the Rust core's ``linear_props``.

Bound (fused vs torch path, same mode): the two paths' norms, softmax and SiLU round in
another order (~1e-6), and an activation that lands on the other side of a quantization
step moves by a whole step (``amax / 127`` of its block); through 30 layers such flips
move the logits as much as the int8 rounding itself does (about 1 on SmolLM2's logits of
~30, measured: the two int8 paths 0.8-1.4 apart, either int8 path 0.8-1.3 from the
exact one). So the paths agree within ``INT8_ATOL = 2.0`` absolute, and each is checked
to differ from the exact mode (the int8 products ran). The exactness of the mode is in
its products (bit for bit, above); the paths' agreement is statistical.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from specdec.decode import SpeculativeGenerator, autoregressive_generate
from specdec.errors import ConfigError
from specdec.models import LlamaConfig, LlamaModel, smollm2
from specdec.models.quant import kernel_available
from specdec.testing import OracleDrafter
from specdec.verify import Sampling

pytestmark = pytest.mark.skipif(not kernel_available(), reason="no AVX-512 on this CPU")

INT8_ATOL = 2.0


@pytest.fixture(scope="module")
def lm() -> Any:
    return smollm2()


@pytest.fixture
def int8(lm: Any) -> Any:
    m: LlamaModel = lm.model
    m.numeric = "int8"
    yield m
    m.numeric = "exact"


def chat(lm: Any, text: str) -> list[int]:
    ids: list[int] = lm.encode_chat([{"role": "user", "content": text}])
    return ids


def steps(m: LlamaModel, ids: list[int]) -> tuple[torch.Tensor, ...]:
    """A prefill, a one-token step and a branching tree step, on a fresh cache."""
    n = len(ids)
    cache = m.new_cache(n + 16)
    first = m.forward_last(torch.tensor(ids[:-4]), torch.arange(n - 4), cache)
    cache.commit(list(range(n - 4)))
    one = m(torch.tensor(ids[-4:-3]), torch.tensor([n - 4]), cache)
    cache.commit([0])
    # root, two children, a grandchild under the first: positions by depth
    parents = [-1, 0, 0, 1]
    depth = [0, 1, 1, 2]
    mask = torch.ones(4, n - 3 + 4, dtype=torch.bool)
    tree = torch.zeros(4, 4, dtype=torch.bool)
    for i, p in enumerate(parents):
        tree[i, i] = True
        while p >= 0:
            tree[i, p] = True
            p = parents[p]
    mask[:, n - 3 :] = tree
    pos = torch.tensor([n - 3 + d for d in depth])
    branch = m(torch.tensor(ids[-3:] + [ids[-1]]), pos, cache, mask)
    return first, one, branch


def test_fused_and_torch_paths_agree_in_int8(lm: Any, int8: LlamaModel) -> None:
    ids = chat(lm, "Write a haiku about the sea.")
    out: dict[tuple[str, bool], tuple[torch.Tensor, ...]] = {}
    for mode in ("exact", "int8"):
        int8.numeric = mode
        for fused in (False, True):
            int8.fused_step = fused
            out[mode, fused] = steps(int8, ids)
    int8.numeric, int8.fused_step = "int8", True
    for a, b in zip(out["int8", False], out["int8", True], strict=True):
        assert a.shape == b.shape
        assert float((a - b).abs().max()) <= INT8_ATOL
    for fused in (False, True):
        for a, b in zip(out["int8", fused], out["exact", fused], strict=True):
            assert float((a - b).abs().max()) > 1e-3  # int8 ran on this path


def test_int8_tracks_the_float_model(lm: Any) -> None:
    """Teacher-forced over a chat and its greedy reply: the int8 logits stay near the exact
    ones and pick the reply's next token at most of its positions."""
    m: LlamaModel = lm.model
    ids = chat(lm, "Explain what a hash map is in two sentences.")
    reply = autoregressive_generate(m, ids, max_new_tokens=40).tokens
    seq = torch.tensor(ids + reply)
    pos = torch.arange(len(seq))
    exact = m(seq, pos, m.new_cache(len(seq)))
    m.numeric = "int8"
    try:
        fast = m(seq, pos, m.new_cache(len(seq)))
    finally:
        m.numeric = "exact"
    # The reply's positions (the prompt's next tokens are guesses with thin margins).
    at = slice(len(ids) - 1, len(seq) - 1)
    agree = float((exact[at].argmax(-1) == fast[at].argmax(-1)).float().mean())
    rel = float((exact - fast).abs().max() / exact.abs().max())
    print(f"int8 vs exact: top-1 agreement {agree:.3f}, max |diff| {rel:.4f} of the scale")
    # Measured: 0.925 and 0.072. A wrong scale or layout would agree nowhere.
    assert agree >= 0.85, agree
    assert 0.0 < rel <= 0.15, rel  # not the float model (0 would mean int8 never ran)


@pytest.mark.parametrize("budget", [8, 63])  # 64 rows: past quant_max_rows (48)
def test_greedy_speculation_is_int8_autoregressive_decoding(
    lm: Any, int8: LlamaModel, budget: int
) -> None:
    ids = chat(lm, "List five colours, one per line.")
    ar = autoregressive_generate(int8, ids, max_new_tokens=32, eos_token_id=lm.eos_token_id)
    drafter = OracleDrafter(int8, miss=0.3, seed=2)
    gen = SpeculativeGenerator(int8, drafter, budget=budget, max_depth=6)
    res = gen.generate(ids, max_new_tokens=32, eos_token_id=lm.eos_token_id)
    assert res.tokens == ar.tokens
    assert res.steps < len(ar.tokens)


def test_seeded_sampling_speculation_is_int8_sampling(lm: Any, int8: LlamaModel) -> None:
    ids = chat(lm, "Tell me a short story about a cat.")
    rule = Sampling(temperature=1.0)
    ar = autoregressive_generate(int8, ids, max_new_tokens=24, rule=rule, seed=5)
    gen = SpeculativeGenerator(int8, OracleDrafter(int8, miss=0.2, seed=3), rule=rule, budget=6)
    assert gen.generate(ids, max_new_tokens=24, seed=5).tokens == ar.tokens


def test_numeric_refuses_what_it_cannot_do(lm: Any) -> None:
    m: LlamaModel = lm.model
    with pytest.raises(ConfigError, match="numeric must be 'exact' or 'int8'"):
        m.numeric = "fp8"
    assert m.numeric == "exact"
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
    )
    plain = LlamaModel(cfg).init_random(0)  # float weights only: no blocks
    with pytest.raises(ConfigError, match="has none"):
        plain.numeric = "int8"
