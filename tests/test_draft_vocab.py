"""The draft vocabulary subset (FR-Spec style): the trained drafters' LM head restricted to a
token list. Oracles: the plain product of the hidden states with the shared head's weight
(the kept rows' logits equal it, every other token is -inf), a token count done here by hand
(the frequency ranking), the target's own greedy output (unchanged by any subset) and
transformers' ``generate`` on SmolLM2."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from specdec.decode import SpeculativeGenerator, autoregressive_generate
from specdec.draft import (
    BlockDrafter,
    CombinedDrafter,
    DraftRequest,
    DraftVocab,
    MedusaDrafter,
    SuffixDrafter,
)
from specdec.draft.base import hidden_capture
from specdec.draft.checkpoint import VOCAB as VOCAB_FILE
from specdec.draft.checkpoint import bf16_supported, drafter_linears
from specdec.errors import CheckpointError, ConfigError, SpecdecError, SpecdecTypeError
from specdec.models import LlamaConfig, LlamaModel
from specdec.train.vocab import frequent_vocab

V = 40
CFG = LlamaConfig(
    vocab_size=V,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=200,
)
KEEP = (7, 3, 0, 21, 39, 12, 5, 30)  # most frequent first, not sorted


def make(kind: str, dtype: torch.dtype = torch.float32) -> tuple[LlamaModel, Any]:
    t = LlamaModel(CFG).init_random(3).to(dtype)
    if kind == "block":
        d: Any = BlockDrafter.for_target(t, block_size=5, target_layers=(0, 2), seed=1)
    else:
        d = MedusaDrafter.for_target(t, num_heads=4)
        with torch.no_grad():
            g = torch.Generator().manual_seed(5)
            for p in d.parameters():
                p.copy_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return t, d.to(dtype).eval()


@pytest.mark.parametrize("kind", ["block", "medusa"])
@pytest.mark.parametrize("packed", [True, False])
def test_subset_head_equals_full_head_on_kept_rows(kind, packed) -> None:  # type: ignore[no-untyped-def]
    t, d = make(kind)
    d.packed_linear = packed
    w = t.model.embed_tokens.weight if t.lm_head is None else t.lm_head.weight
    h = torch.randn(6, CFG.hidden_size, generator=torch.Generator().manual_seed(0))
    ref = h.double() @ w.detach().double().T  # the oracle: the plain product, in float64
    d.set_draft_vocab(DraftVocab(KEEP, V))
    with torch.no_grad():
        out = d.logits(h)
    assert out.shape == (6, V)
    keep = torch.tensor(KEEP)
    rest = torch.tensor([i for i in range(V) if i not in KEEP])
    assert torch.allclose(out[:, keep].double(), ref[:, keep], rtol=1e-5, atol=1e-5)
    assert torch.isneginf(out[:, rest]).all()
    d.set_draft_vocab(None)  # the full vocabulary again
    with torch.no_grad():
        full = d.logits(h)
    assert torch.isfinite(full).all()
    assert torch.allclose(full.double(), ref, rtol=1e-5, atol=1e-5)


def test_subset_drafts_only_kept_tokens_and_gradients_flow() -> None:
    """``draft`` marginals are finite only on the subset; in autograd mode (training) the
    subset head is the plain product and passes gradients to the drafter, not the head."""
    t, d = make("block", torch.float64)
    d.set_draft_vocab(DraftVocab(KEEP, V))
    p = [1, 2, 3, 4, 5, 6]
    cap = hidden_capture(d)
    assert cap is not None
    cache = t.new_cache(len(p))
    t(torch.tensor(p), torch.arange(len(p)), cache, None, hidden=cap)
    hs = cap.states
    assert hs is not None
    x = d.draft([DraftRequest(p, hs[:-1])], 4)[0]
    finite = torch.isfinite(x).any(0).nonzero().flatten().tolist()
    assert sorted(finite) == sorted(KEEP)
    h = torch.randn(2, CFG.hidden_size, dtype=torch.float64, requires_grad=True)
    d.logits(h)[:, list(KEEP)].sum().backward()
    assert h.grad is not None and torch.isfinite(h.grad).all()


@pytest.mark.parametrize("kind", ["block", "medusa", "block+suffix"])
@pytest.mark.parametrize("strategy", ["chain", "ddtree"])
def test_greedy_with_subset_equals_autoregressive(kind, strategy) -> None:  # type: ignore[no-untyped-def]
    t, d = make(kind.split("+")[0], torch.float64)
    d.set_draft_vocab(DraftVocab(KEEP, V))
    ps = [[1, 2, 3], [7, 3, 7, 3, 7], [39], [5, 12, 30, 21, 0, 8, 9]]
    ref = [autoregressive_generate(t, p, max_new_tokens=20).tokens for p in ps]
    if kind == "block+suffix":
        d = CombinedDrafter(d, SuffixDrafter(max_depth=8), max_depth=4)
    gen = SpeculativeGenerator(t, d, strategy=strategy, max_depth=4, budget=6, max_batch=2)
    assert [r.tokens for r in gen.generate(ps, max_new_tokens=20)] == ref


def write_checkpoint(t: LlamaModel, d: Any, path: Path, vocab: Any = None) -> Path:
    d.save(path)
    if vocab is not None:
        (path / VOCAB_FILE).write_text(json.dumps(vocab))
    return path


@pytest.mark.parametrize("kind", ["block", "medusa"])
def test_checkpoint_loads_its_vocab_when_present(kind, tmp_path) -> None:  # type: ignore[no-untyped-def]
    t, d = make(kind)
    cls = type(d)
    bare = write_checkpoint(t, d, tmp_path / "bare")
    assert cls.load(bare, t).draft_vocab is None
    path = write_checkpoint(t, d, tmp_path / "with")
    DraftVocab(KEEP, V, source="test").write(path)
    assert cls.load(path, t).draft_vocab == DraftVocab(KEEP, V)
    assert cls.load(path, t, draft_vocab=None).draft_vocab is None  # turned off
    other = DraftVocab((1, 2, 3), V).write(tmp_path / "other.json")
    assert cls.load(path, t, draft_vocab=other).draft_vocab == DraftVocab((1, 2, 3), V)
    assert cls.load(bare, t, draft_vocab=DraftVocab((4,), V)).draft_vocab == DraftVocab((4,), V)
    # save() keeps the subset: a drafter with one round-trips it, one without writes none.
    sub = cls.load(path, t)
    again = sub.save(tmp_path / "again")
    assert cls.load(again, t).draft_vocab == DraftVocab(KEEP, V)
    assert not (cls.load(bare, t).save(tmp_path / "plain") / VOCAB_FILE).exists()


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ({"vocab_size": V, "token_ids": [1, 2, V]}, "outside the vocabulary"),
        ({"vocab_size": V, "token_ids": [-1, 2]}, "outside the vocabulary"),
        ({"vocab_size": V, "token_ids": [1, 2, 1]}, "twice"),
        ({"vocab_size": V, "token_ids": []}, "at least one"),
        ({"vocab_size": V, "token_ids": [1, 2.5]}, "integers"),
        ({"vocab_size": V}, "no token_ids"),
        ({"vocab_size": V + 1, "token_ids": [1]}, "vocabulary of 41 tokens"),
        ("not json", "not JSON"),
    ],
)
def test_bad_vocab_file_is_refused_naming_the_problem(content, words, tmp_path) -> None:  # type: ignore[no-untyped-def]
    t, d = make("block")
    path = write_checkpoint(t, d, tmp_path / "ckpt")
    f = path / VOCAB_FILE
    f.write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(CheckpointError, match=words) as e:
        BlockDrafter.load(path, t)
    assert isinstance(e.value, SpecdecError)
    assert str(f) in str(e.value)
    assert BlockDrafter.load(path, t, draft_vocab=None).draft_vocab is None  # off: loads


def test_bad_vocab_arguments(tmp_path) -> None:  # type: ignore[no-untyped-def]
    t, d = make("block")
    path = write_checkpoint(t, d, tmp_path / "ckpt")
    with pytest.raises(CheckpointError, match="outside"):
        DraftVocab((0, V), V)
    with pytest.raises(SpecdecTypeError):
        d.set_draft_vocab([1, 2, 3])
    with pytest.raises(CheckpointError, match="cannot read"):
        BlockDrafter.load(path, t, draft_vocab=tmp_path / "missing.json")
    with pytest.raises(CheckpointError, match="41"):
        BlockDrafter.load(path, t, draft_vocab=DraftVocab((1,), V + 1))
    with pytest.raises(SpecdecTypeError):
        BlockDrafter.load(path, t, draft_vocab=3)  # type: ignore[arg-type]


def test_frequent_vocab_ranks_by_count(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Against a hand count: most frequent first, ties by the smaller id, unseen ids fill a
    subset larger than what was seen; coverage is the kept share of the counted tokens."""
    texts = ["a b c a a", "b a d", "e"]
    files = []
    for i, s in enumerate(texts):
        p = tmp_path / f"f{i}.py"
        p.write_text(s)
        files.append(p)
    (tmp_path / "bad.py").write_bytes(b"\xff\xfe")  # not UTF-8: skipped, as the training does
    files.append(tmp_path / "bad.py")

    def encode(text: str) -> list[int]:
        return [ord(w) - ord("a") + 10 for w in text.split()]

    counts = Counter(encode(" ".join(texts)))  # a 4, b 2, c 1, d 1, e 1
    v = frequent_vocab(files, encode, 20, 3)
    assert v.token_ids == (10, 11, 12)
    assert v.extra["counted_tokens"] == sum(counts.values())
    assert v.extra["coverage"] == pytest.approx(7 / 9)
    assert v.extra["files"] == 3
    big = frequent_vocab(files, encode, 20, 8)
    assert big.token_ids == (10, 11, 12, 13, 14, 0, 1, 2)
    p = big.write(tmp_path)
    assert p.name == VOCAB_FILE and DraftVocab.read(tmp_path, 20) == big
    with pytest.raises(ConfigError):
        frequent_vocab(files, encode, 20, 21)
    with pytest.raises(ConfigError, match="outside"):
        frequent_vocab(files, encode, 12, 3)
    with pytest.raises(ConfigError, match="no tokens"):
        frequent_vocab(files[-1:], encode, 20, 3)


# -- bfloat16 packed drafter linears ---------------------------------------------------------
needs_bf16 = pytest.mark.skipif(not bf16_supported(), reason="no native bfloat16 oneDNN here")


@needs_bf16
def test_bf16_linears_round_like_bfloat16_and_follow_weight_changes() -> None:
    """Against the float64 product: within what rounding the inputs and weights to bfloat16
    (8 significant bits) allows; an in-place weight change is seen on the next call;
    in autograd mode the float32 path (exact to float32 rounding) runs instead."""
    g = torch.Generator().manual_seed(0)
    w1, w2 = torch.randn(24, 16, generator=g), torch.randn(8, 16, generator=g)
    b1 = torch.randn(24, generator=g)
    x = torch.randn(5, 16, generator=g)

    def oracle() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        y1 = x.double() @ w1.double().T + b1.double()
        y2 = x.double() @ w2.double().T
        bound = 2 * 2.0**-8 * (x.double().abs() @ torch.cat((w1, w2)).double().abs().T)
        return y1, y2, bound + 2.0**-8 * torch.cat((b1, torch.zeros(8))).double().abs()

    for _ in range(2):
        with torch.no_grad():
            o1, o2 = drafter_linears(x, [w1, w2], [b1, None], bf16=True)
        y1, y2, bound = oracle()
        assert o1.dtype == torch.float32 and o1.shape == (5, 24) and o2.shape == (5, 8)
        err = (torch.cat((o1, o2), -1).double() - torch.cat((y1, y2), -1)).abs()
        assert (err <= bound + 1e-3).all()
        assert err.max() > 0  # it did round: the bfloat16 path ran
        w1.add_(0.5)  # in place: the next call must not reuse the old copy
    with torch.enable_grad():
        exact = drafter_linears(x, [w1], [b1], bf16=True)[0]
    assert torch.allclose(exact.double(), x.double() @ w1.double().T + b1.double(), atol=1e-5)


@needs_bf16
@pytest.mark.parametrize("kind", ["block", "medusa"])
def test_greedy_with_bf16_drafter_equals_autoregressive(kind) -> None:  # type: ignore[no-untyped-def]
    t, d = make(kind)
    ps = [[1, 2, 3], [7, 3, 7, 3, 7], [5, 12, 30, 21, 0, 8, 9]]
    ref = [autoregressive_generate(t, p, max_new_tokens=16).tokens for p in ps]
    out = {}
    for bf16 in (False, True):
        d.packed_bf16 = bf16
        d.set_draft_vocab(DraftVocab(KEEP, V))
        if kind == "block":
            d._requests = []
        gen = SpeculativeGenerator(t, d, max_depth=4, budget=6)
        assert [r.tokens for r in gen.generate(ps, max_new_tokens=16)] == ref
        h = torch.randn(3, CFG.hidden_size, generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            out[bf16] = d.logits(h)
    keep = list(KEEP)
    assert torch.allclose(out[True][:, keep], out[False][:, keep], rtol=0.05, atol=0.05)
    assert not torch.equal(out[True][:, keep], out[False][:, keep])


def test_loaders_set_the_precision(tmp_path) -> None:  # type: ignore[no-untyped-def]
    t, d = make("block")
    path = write_checkpoint(t, d, tmp_path / "ckpt")
    assert BlockDrafter.load(path, t).packed_bf16 == bf16_supported()
    assert BlockDrafter.load(path, t, bf16=False).packed_bf16 is False
    assert BlockDrafter.for_target(t).packed_bf16 is False  # training and tests: float32


# -- SmolLM2 against transformers --------------------------------------------------------------
def test_smollm2_greedy_with_subset_matches_transformers_generate() -> None:
    """The shipped block drafter with a small subset (the 2048 most frequent ids of its
    training text would do; here a fixed stride of ids, so the test needs no data) + suffix:
    transformers' greedy tokens."""
    transformers = pytest.importorskip("transformers")
    from specdec.models import smollm2
    from specdec.models.gguf import smollm2_path

    smol = smollm2()
    f = smollm2_path()
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        f.parent, gguf_file=f.name, dtype=torch.float32
    ).eval()
    ids = smol.encode_chat([{"role": "user", "content": "Write a Python function that adds."}])
    with torch.no_grad():
        ref = hf.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=16, eos_token_id=2)
    ref = ref[0, len(ids) :].tolist()
    vocab = DraftVocab(
        tuple(range(0, smol.model.config.vocab_size, 7)), smol.model.config.vocab_size
    )
    try:
        d: Any = BlockDrafter.shipped(smol.model, draft_vocab=vocab)
    except CheckpointError:
        d = BlockDrafter.for_target(smol.model)
        d.set_draft_vocab(vocab)
    for drafter, budget in ((d, 8), (CombinedDrafter(d, SuffixDrafter(max_depth=16)), 4)):
        gen = SpeculativeGenerator(smol.model, drafter, budget=budget, max_depth=8)
        res = gen.generate(ids, max_new_tokens=16, eos_token_id=smol.eos_token_id)
        assert res.tokens == ref
