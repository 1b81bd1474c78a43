"""The drafters that read the target's hidden states (block drafter, Medusa heads) and their
training: greedy output equals the target's own autoregressive output (the oracle) for every
strategy and cache; the hidden states the generator hands over equal a fresh causal
forward's; incremental drafting equals drafting from scratch; checkpoints round-trip and
bad ones are refused naming the mismatch; training is deterministic, resumable and stops at
its budget."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdec.decode import SpeculativeGenerator, autoregressive_generate
from specdec.draft import BlockDrafter, CombinedDrafter, DraftRequest, MedusaDrafter, SuffixDrafter
from specdec.draft.base import hidden_capture
from specdec.errors import CheckpointError, ConfigError, DraftError
from specdec.models import LlamaConfig, LlamaModel
from specdec.protocols import HiddenCapture
from specdec.train import TrainConfig, split_files, stdlib_files, train

VOCAB = 40
CFG = LlamaConfig(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=200,
)


def make_target(cfg: LlamaConfig = CFG, seed: int = 3) -> LlamaModel:
    return LlamaModel(cfg).double().init_random(seed)


@pytest.fixture(scope="module")
def target() -> LlamaModel:
    return make_target()


def block(t: LlamaModel, size: int = 6) -> BlockDrafter:
    return BlockDrafter.for_target(t, block_size=size, target_layers=(0, 2), num_layers=2, seed=1)


def medusa(t: LlamaModel, heads: int = 4) -> MedusaDrafter:
    m = MedusaDrafter.for_target(t, num_heads=heads)
    with torch.no_grad():  # away from the zero start, so heads differ
        g = torch.Generator().manual_seed(5)
        for p in m.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g, dtype=torch.float64))
    return m


def prompts(seed: int, count: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(VOCAB) for _ in range(rng.randrange(1, 12))] for _ in range(count)]


@pytest.mark.parametrize("kind", ["block", "medusa"])
@pytest.mark.parametrize("strategy", ["chain", "ddtree"])
@pytest.mark.parametrize("cache", ["dense", "paged"])
def test_greedy_equals_autoregressive(target, kind, strategy, cache) -> None:  # type: ignore[no-untyped-def]
    ps = prompts(1, 5)
    ref = [autoregressive_generate(target, p, max_new_tokens=24).tokens for p in ps]
    d = block(target) if kind == "block" else medusa(target)
    gen = SpeculativeGenerator(
        target, d, strategy=strategy, max_depth=4, budget=12, cache=cache, max_batch=3
    )
    assert [r.tokens for r in gen.generate(ps, max_new_tokens=24)] == ref
    assert gen.generate(ps[0], max_new_tokens=24).tokens == ref[0]  # alone, after the batch


@pytest.mark.parametrize("strategy", ["chain", "ddtree"])
def test_combined_drafter_equals_autoregressive(target, strategy) -> None:  # type: ignore[no-untyped-def]
    ps = [p * 3 for p in prompts(4, 4)]  # repeats: the suffix index finds matches
    ref = [autoregressive_generate(target, p, max_new_tokens=24).tokens for p in ps]
    d = CombinedDrafter(block(target), SuffixDrafter(max_depth=6), max_depth=6)
    gen = SpeculativeGenerator(target, d, strategy=strategy, max_depth=6, budget=10, max_batch=2)
    assert [r.tokens for r in gen.generate(ps, max_new_tokens=24)] == ref
    assert d.chose_model > 0 and d.chose_suffix > 0
    # The adaptive budget picks between the two trees itself, by its calibration.
    d2 = CombinedDrafter(block(target), SuffixDrafter(max_depth=6), max_depth=6)
    auto = SpeculativeGenerator(target, d2, budget="auto", max_budget=10, max_depth=6, max_batch=2)
    assert [r.tokens for r in auto.generate(ps, max_new_tokens=24)] == ref
    assert d2.chose_model + d2.chose_suffix > 0
    with pytest.raises(DraftError):
        CombinedDrafter(SuffixDrafter())  # type: ignore[arg-type]


def test_adaptive_budget_equals_autoregressive(target) -> None:  # type: ignore[no-untyped-def]
    ps = prompts(2, 3)
    ref = [autoregressive_generate(target, p, max_new_tokens=20).tokens for p in ps]
    gen = SpeculativeGenerator(target, block(target), budget="auto", max_budget=16, max_depth=6)
    assert [r.tokens for r in gen.generate(ps, max_new_tokens=20)] == ref


class Recorder:
    """A block drafter that keeps every request it was given."""

    def __init__(self, inner: BlockDrafter) -> None:
        self.inner = inner
        self.hidden_layers = inner.hidden_layers
        self.hidden_final = False
        self.seen: list[DraftRequest] = []

    def draft(self, requests: Sequence[DraftRequest], depth: int) -> torch.Tensor:
        self.seen += list(requests)
        return self.inner.draft(requests, depth)


def causal_hidden(t: LlamaModel, ids: list[int], capture: HiddenCapture) -> torch.Tensor:
    cache = t.new_cache(len(ids))
    t(torch.tensor(ids), torch.arange(len(ids)), cache, None, hidden=capture)
    cache.rollback()
    assert capture.states is not None
    return capture.states


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    seed=st.integers(0, 1000),
    strategy=st.sampled_from(["chain", "ddtree"]),
    cache=st.sampled_from(["dense", "paged"]),
)
def test_hidden_states_are_the_committed_positions(target, seed, strategy, cache) -> None:  # type: ignore[no-untyped-def]
    """Each request's hidden states are a fresh causal forward's at the positions just
    committed (prefill: the prompt but its last token, after any prefix-cache hit; a step:
    root + accepted)."""
    rec = Recorder(block(target))
    gen = SpeculativeGenerator(
        target,
        rec,
        strategy=strategy,
        max_depth=4,
        budget=8,
        max_batch=2,
        cache=cache,
        block_size=4,
    )
    ps = prompts(seed, 2)
    gen.generate(ps + ps, max_new_tokens=12)  # the repeats start from cached prefixes when paged
    assert rec.seen
    for r in rec.seen:
        assert r.hidden_states is not None
        ctx = list(r.context)
        m = r.hidden_states.shape[0]
        cap = HiddenCapture(rec.hidden_layers)
        full = causal_hidden(target, ctx[:-1], cap) if len(ctx) > 1 else None
        if m:
            assert full is not None
            torch.testing.assert_close(r.hidden_states, full[len(ctx) - 1 - m :])


def test_incremental_drafting_equals_from_scratch(target) -> None:  # type: ignore[no-untyped-def]
    """The drafter's kept context K/V, grown step by step, drafts what one built from the
    whole context's hidden states at once drafts."""
    rec = Recorder(block(target))
    gen = SpeculativeGenerator(target, rec, strategy="ddtree", max_depth=6, budget=8)
    gen.generate([3, 1, 4, 1, 5, 9, 2, 6], max_new_tokens=30)
    d = block(target)  # replays the steps: its state grows as in the generator
    cap = HiddenCapture(d.hidden_layers)
    assert len(rec.seen) > 3
    for r in rec.seen:
        got = d.draft([r], 6)
        ctx = list(r.context)
        want = block(target).draft([DraftRequest(ctx, causal_hidden(target, ctx[:-1], cap))], 6)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(d.draft([r], 6), got)  # the same request again: no change


def test_medusa_reads_the_last_hidden_state(target) -> None:  # type: ignore[no-untyped-def]
    m = medusa(target, 3)
    ctx = [5, 6, 7, 8]
    h = causal_hidden(target, ctx[:-1], HiddenCapture((), final=True))
    got = m.draft([DraftRequest(ctx, h)], 3)[0]
    w = target.model.embed_tokens.weight if target.lm_head is None else target.lm_head.weight
    for k, lin in enumerate(m.heads):
        x = h[-1]
        assert isinstance(lin, torch.nn.Linear)
        want = (x + torch.nn.functional.silu(lin(x))) @ w.T
        torch.testing.assert_close(got[k], want.float())


@pytest.mark.parametrize("kind", ["block", "medusa"])
def test_checkpoint_round_trip(target, kind, tmp_path) -> None:  # type: ignore[no-untyped-def]
    d: Any = block(target) if kind == "block" else medusa(target)
    d.save(tmp_path / "ck", note="test")
    cls = BlockDrafter if kind == "block" else MedusaDrafter
    back = cls.load(tmp_path / "ck", target)
    for (k, a), (k2, b) in zip(d.state_dict().items(), back.state_dict().items(), strict=True):
        assert k == k2
        torch.testing.assert_close(b, a.to(torch.float16).to(b.dtype))  # stored as float16
    assert json.loads((tmp_path / "ck" / "config.json").read_text())["note"] == "test"


@pytest.mark.parametrize("kind", ["block", "medusa"])
def test_loading_warms_the_drafter_up(kind, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Its packed linears are made at load, not in a request's first draft, and the
    warm-up leaves no request state behind (float32 on the CPU: where linears are packed)."""
    from specdec.models.llama import packing

    if not packing._PACK_OK:
        pytest.skip("this torch build has no oneDNN packed linears")
    t32 = LlamaModel(CFG).float().init_random(3)
    (block(t32) if kind == "block" else medusa(t32)).save(tmp_path / "ck")
    cls: Any = BlockDrafter if kind == "block" else MedusaDrafter
    back = cls.load(tmp_path / "ck", t32)
    ctx = [1, 2, 3, 4]
    layers, final = (back.hidden_layers, False) if kind == "block" else ((), True)
    h = causal_hidden(t32, ctx[:-1], HiddenCapture(layers, final=final))
    made = len(packing._packed)  # the drafter's and (by now) the target's
    back.draft([DraftRequest(ctx, h)], 3)
    assert len(packing._packed) == made  # nothing new to pack
    if kind == "block":
        assert cls.load(tmp_path / "ck", t32).num_requests == 0


def test_bad_checkpoints_name_the_mismatch(target, tmp_path) -> None:  # type: ignore[no-untyped-def]
    block(target).save(tmp_path / "b")
    medusa(target).save(tmp_path / "m")
    wider = make_target(LlamaConfig(**{**CFG.__dict__, "hidden_size": 48, "head_dim": None}))
    other_vocab = make_target(LlamaConfig(**{**CFG.__dict__, "vocab_size": VOCAB + 1}))
    shallow = make_target(LlamaConfig(**{**CFG.__dict__, "num_hidden_layers": 2}))
    for t, word in ((wider, "hidden_size"), (other_vocab, "vocab_size"), (shallow, "num_layers")):
        for cls, d in ((BlockDrafter, "b"), (MedusaDrafter, "m")):
            with pytest.raises(ConfigError, match=word):
                cls.load(tmp_path / d, t)
    with pytest.raises(CheckpointError, match="not a 'medusa'"):
        MedusaDrafter.load(tmp_path / "b", target)
    (tmp_path / "b" / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="model.safetensors"):
        BlockDrafter.load(tmp_path / "b", target)
    with pytest.raises(CheckpointError, match="no drafter checkpoint"):
        BlockDrafter.load(tmp_path / "nothing", target)
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    (tmp_path / "m" / "config.json").write_text(json.dumps({**cfg, "num_heads": 7}))
    with pytest.raises(CheckpointError, match="heads"):
        MedusaDrafter.load(tmp_path / "m", target)
    # A layer id the target lacks (a checkpoint for a deeper target).
    block(target).save(tmp_path / "b2")
    cfg = json.loads((tmp_path / "b2" / "config.json").read_text())
    cfg["dflash_config"]["target_layer_ids"] = [0, 5]
    (tmp_path / "b2" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="target_layers"):
        BlockDrafter.load(tmp_path / "b2", target)


def test_bad_input(target) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match="block_size"):
        BlockDrafter.for_target(target, block_size=0)
    with pytest.raises(ConfigError, match="target_layers"):
        BlockDrafter.for_target(target, target_layers=(2, 1))
    with pytest.raises(ConfigError, match="num_heads"):
        MedusaDrafter.for_target(target, num_heads=0)
    with pytest.raises(ConfigError, match="layers"):
        target.check_capture(HiddenCapture((0, 3)))
    d = block(target, 4)
    with pytest.raises(DraftError, match="block_size"):
        SpeculativeGenerator(target, d, strategy="chain", max_depth=5).generate(
            [1, 2], max_new_tokens=4
        )
    with pytest.raises(DraftError, match="hidden_states is None"):
        d.draft([DraftRequest([1, 2, 3])], 2)
    with pytest.raises(DraftError, match="hidden_states is None"):
        medusa(target).draft([DraftRequest([1, 2, 3])], 2)
    with pytest.raises(DraftError, match="hidden states must be"):
        d.draft([DraftRequest([1, 2, 3], torch.zeros(2, 5, dtype=torch.float64))], 2)
    with pytest.raises(ConfigError, match="another target"):
        SpeculativeGenerator(make_target(LlamaConfig(**{**CFG.__dict__, "vocab_size": 50})), d)

    class NoHidden:  # a target that exposes no hidden states
        vocab_size, max_positions, device = VOCAB, 200, torch.device("cpu")

        def new_cache(self, n: int | None = None) -> Any:
            return target.new_cache(n)

        def __call__(self, *a: Any) -> torch.Tensor:
            return torch.as_tensor(target(*a))

    with pytest.raises(ConfigError, match="keeps none"):
        SpeculativeGenerator(NoHidden(), d)  # type: ignore[arg-type]


# -- training ----------------------------------------------------------------------------------
def encode(text: str) -> list[int]:
    return [b % VOCAB for b in text.encode()]


@pytest.fixture(scope="module")
def files() -> Any:
    return split_files(stdlib_files()[:30], seed=0)


def small_run(kind: str, files: Any, out: Path, steps: int, **kw: Any) -> tuple[Any, Any]:
    t = make_target()
    d: Any = block(t, 4) if kind == "block" else MedusaDrafter.for_target(t, num_heads=3)
    cfg = TrainConfig(
        kind,  # type: ignore[arg-type]
        steps=steps,
        seq_len=48,
        blocks=4,
        positions=8,
        eval_every=4,
        eval_chunks=2,
        save_every=3,
        **kw,
    )
    res = train(d, t, encode, files.train, files.held_out, cfg, out, progress=False)
    return d, res


@pytest.mark.parametrize("kind", ["block", "medusa"])
def test_training_lowers_the_loss_and_writes_a_checkpoint(kind, files, tmp_path) -> None:  # type: ignore[no-untyped-def]
    d, res = small_run(kind, files, tmp_path, 12, lr=3e-3)
    assert res.steps == 12 and res.held_out[-1]["step"] == 12
    assert res.held_out[-1]["kl"] < res.held_out[0]["kl"]
    cls = BlockDrafter if kind == "block" else MedusaDrafter
    back = cls.load(tmp_path, make_target())
    assert "12 steps" in json.loads((tmp_path / "config.json").read_text())["note"]
    assert back.config == d.config


def test_training_is_deterministic_and_resumable(files, tmp_path) -> None:  # type: ignore[no-untyped-def]
    a, _ = small_run("block", files, tmp_path / "a", 6)
    b, _ = small_run("block", files, tmp_path / "b", 6)
    small_run("block", files, tmp_path / "c", 3)  # stops, then resumes to 6
    c, res = small_run("block", files, tmp_path / "c", 6)
    assert res.steps == 6
    for x, y, z in zip(a.parameters(), b.parameters(), c.parameters(), strict=True):
        assert torch.equal(x, y)
        torch.testing.assert_close(x, z)
    with pytest.raises(CheckpointError, match="another training config"):
        small_run("block", files, tmp_path / "c", 6, lr=0.5)


def test_reused_teacher_passes_are_deterministic_and_resumable(files, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # reuse=2: a chunk's teacher pass serves two updates; the resumed run stops and starts
    # again inside a chunk (after step 3), recomputing that chunk's pass.
    a, ra = small_run("block", files, tmp_path / "a", 6, reuse=2)
    small_run("block", files, tmp_path / "c", 3, reuse=2)
    c, rc = small_run("block", files, tmp_path / "c", 6, reuse=2)
    assert ra.steps == rc.steps == 6
    for x, z in zip(a.parameters(), c.parameters(), strict=True):
        torch.testing.assert_close(x, z)
    d, _ = small_run("block", files, tmp_path / "d", 6)  # reuse=1 sees other chunks
    assert any(not torch.equal(x, y) for x, y in zip(a.parameters(), d.parameters(), strict=True))
    with pytest.raises(CheckpointError, match="another training config"):
        small_run("block", files, tmp_path / "c", 8, reuse=3)


def test_learning_rate_schedule() -> None:
    from specdec.train.loop import _lr_factor

    cfg = TrainConfig("block", steps=100, warmup=10, cooldown=40)
    got = [_lr_factor(cfg, s) for s in (0, 9, 30, 60, 80, 99)]
    assert got == pytest.approx([0.1, 1.0, 1.0, 1.0, 0.5, 1 / 40])
    assert _lr_factor(TrainConfig("block", steps=100, warmup=10), 99) == 1.0
    with pytest.raises(ConfigError, match="cooldown"):
        TrainConfig("block", steps=10, cooldown=11)


def test_block_drafter_from_a_target_layer(target) -> None:  # type: ignore[no-untyped-def]
    d = BlockDrafter.for_target(target, target_layers=(0, 2), init_from=2)
    src = target.model.layers[2]
    assert d.config.intermediate_size == CFG.intermediate_size
    for (k, a), (k2, b) in zip(
        d.layers[0].state_dict().items(), src.state_dict().items(), strict=True
    ):
        assert k == k2 and torch.equal(a, b)
    assert torch.equal(d.norm.weight, target.model.norm.weight)
    assert torch.equal(d.hidden_norm.weight, src.input_layernorm.weight)
    h = CFG.hidden_size  # fc: the identity on target layer 2's input (layer 1: nearest is 0)
    want = torch.zeros(h, 2 * h, dtype=d.fc.weight.dtype)
    want[:, :h] = torch.eye(h)
    assert torch.equal(d.fc.weight, want)
    ps = prompts(4, 3)
    ref = [autoregressive_generate(target, p, max_new_tokens=16).tokens for p in ps]
    gen = SpeculativeGenerator(target, d, max_depth=4, budget=8)
    assert [r.tokens for r in gen.generate(ps, max_new_tokens=16)] == ref
    with pytest.raises(ConfigError, match="intermediate_size"):
        BlockDrafter.for_target(target, init_from=1, intermediate_size=CFG.intermediate_size + 1)
    with pytest.raises(ConfigError, match="num_heads"):
        BlockDrafter.for_target(target, init_from=1, num_heads=2)
    with pytest.raises(ConfigError, match="init_from"):
        BlockDrafter.for_target(target, init_from=3)


def test_training_stops_at_its_time_budget(files, tmp_path) -> None:  # type: ignore[no-untyped-def]
    _, res = small_run("medusa", files, tmp_path, 10_000, minutes=1e-9)
    assert res.steps <= 1


def test_data_split_is_by_file_and_seeded() -> None:
    fs = stdlib_files()
    a, b = split_files(fs, seed=1), split_files(fs, seed=1)
    assert a == b and not set(a.train) & set(a.held_out)
    assert sorted(a.train + a.held_out) == sorted(fs)
    assert split_files(fs, seed=2).held_out != a.held_out
    with pytest.raises(ConfigError):
        split_files(fs[:1], seed=0)
    with pytest.raises(ConfigError):
        TrainConfig("other")  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["block", "medusa"])
def test_packed_drafter_layers_match_plain(kind) -> None:  # type: ignore[no-untyped-def]
    """On a float32 CPU target the drafters' linear layers and the shared LM head run on
    oneDNN packed weights (the target's own packed head, not a second copy): their logits
    stay within float32 rounding of plain ``F.linear``'s, with the same argmax, and greedy
    output is still the target's own."""
    from specdec.models import llama

    t = LlamaModel(CFG).init_random(3)
    d: Any = block(t) if kind == "block" else medusa(t).float()
    ps = [p for p in prompts(6, 6) if len(p) > 1]
    hs = []
    for p in ps:
        cap = hidden_capture(d)
        assert cap is not None
        states = causal_hidden(t, p, cap)
        hs.append(states[:-1] if kind == "block" else states)
    out = {}
    for packed in (False, True):
        d.packed_linear = packed
        d._requests = []
        out[packed] = torch.stack(
            [d.draft([DraftRequest(p, h)], 4)[0] for p, h in zip(ps, hs, strict=True)]
        )
    if llama._PACK_OK:
        head = t.model.embed_tokens.weight if t.lm_head is None else t.lm_head.weight
        assert sum(id(head) in key for key in llama._packed) == 1  # one packed head, shared
    scale = out[False].abs().max()
    assert (out[True] - out[False]).abs().max() <= 1e-4 * scale
    assert torch.equal(out[True].argmax(-1), out[False].argmax(-1))
    ref = [autoregressive_generate(t, p, max_new_tokens=20).tokens for p in ps]
    gen = SpeculativeGenerator(t, d, max_depth=4, budget=3)  # depth cut to the budget's 3
    assert [r.tokens for r in gen.generate(ps, max_new_tokens=20)] == ref


# -- SmolLM2 against transformers --------------------------------------------------------------
@pytest.fixture(scope="module")
def smol() -> Any:
    from specdec.models import smollm2

    return smollm2()


@pytest.fixture(scope="module")
def hf_smol() -> Any:
    transformers = pytest.importorskip("transformers")
    from specdec.models.gguf import smollm2_path

    f = smollm2_path()
    m = transformers.AutoModelForCausalLM.from_pretrained(
        f.parent, gguf_file=f.name, dtype=torch.float32
    )
    return m.eval()


def smol_drafter(kind: str, model: LlamaModel) -> Any:
    """The shipped weights when this checkout has them, else untrained ones (still lossless)."""
    cls: Any = BlockDrafter if kind == "block" else MedusaDrafter
    try:
        return cls.shipped(model)
    except CheckpointError:
        return cls.for_target(model)


@pytest.mark.parametrize("kind", ["block", "medusa", "block+suffix"])
@pytest.mark.parametrize("strategy", ["chain", "ddtree"])
def test_smollm2_greedy_matches_transformers_generate(smol, hf_smol, kind, strategy) -> None:  # type: ignore[no-untyped-def]
    ids = smol.encode_chat([{"role": "user", "content": "Write a Python function that adds."}])
    with torch.no_grad():
        ref = hf_smol.generate(
            torch.tensor([ids]), do_sample=False, max_new_tokens=16, eos_token_id=2
        )[0, len(ids) :].tolist()
    d: Any = smol_drafter(kind.split("+")[0], smol.model)
    depth, budget = 4, 16
    if kind == "block+suffix":  # the block's full depth, a budget below it (depth cut to 4)
        depth, budget = d.config.block_size, 4
        d = CombinedDrafter(d, SuffixDrafter(max_depth=16), max_depth=depth)
    gen = SpeculativeGenerator(smol.model, d, strategy=strategy, budget=budget, max_depth=depth)
    res = gen.generate(ids, max_new_tokens=16, eos_token_id=smol.eos_token_id)
    assert res.tokens == ref, (smol.tokenizer.decode(res.tokens), smol.tokenizer.decode(ref))


def test_smollm2_adaptive_budget_matches_transformers_generate(smol, hf_smol) -> None:  # type: ignore[no-untyped-def]
    """The adaptive budget (binned calibration, draft depth cut to what gets accepted) with
    the block drafter + suffix index: still the target's greedy tokens."""
    ids = smol.encode_chat([{"role": "user", "content": "Write a Python function that adds."}])
    with torch.no_grad():
        ref = hf_smol.generate(
            torch.tensor([ids]), do_sample=False, max_new_tokens=24, eos_token_id=2
        )[0, len(ids) :].tolist()
    d = CombinedDrafter(smol_drafter("block", smol.model), SuffixDrafter(max_depth=16))
    gen = SpeculativeGenerator(smol.model, d, budget="auto", max_budget=16, max_depth=8)
    res = gen.generate(ids, max_new_tokens=24, eos_token_id=smol.eos_token_id)
    assert res.tokens == ref


# -- sampling ----------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["block", "medusa"])
def test_sampling_matches_the_target_distribution(kind) -> None:  # type: ignore[no-untyped-def]
    """At temperature 1 the first two tokens follow the target's own distribution (exact, by
    enumeration), whatever the drafter proposes (chi-square)."""
    from collections import Counter

    from specdec.testing import exact_pair_distribution, pair_chi_square, tiny_sampling_target
    from specdec.verify.rules import Sampling

    t = tiny_sampling_target()
    prompt = [1, 2, 3]
    exact = exact_pair_distribution(t, prompt)
    d: Any = (
        BlockDrafter.for_target(t, block_size=3, seed=2)
        if kind == "block"
        else MedusaDrafter.for_target(t, num_heads=3)
    )
    gen = SpeculativeGenerator(
        t,
        d,
        rule=Sampling(temperature=1.0),
        generator=torch.Generator().manual_seed(4),
        budget=6,
        max_depth=3,
    )
    n = 1500
    counts: Counter = Counter()
    accepted = 0
    for _ in range(n):
        res = gen.generate(prompt, max_new_tokens=3)
        counts[tuple(res.tokens[:2])] += 1
        accepted += sum(res.accepted)
    assert accepted > 0
    assert pair_chi_square(counts, exact) > 1e-3
