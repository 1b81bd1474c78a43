"""Models: one tree forward gives, at every node, the logits of a standalone causal forward of
that node's ancestor path; checkpoint loading; the transformers adapter; bad input."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec.cache import DenseKVCache, HFKVCache
from specdec.errors import CheckpointError, ConfigError, VerifyError
from specdec.models import LlamaConfig, LlamaModel, load_checkpoint
from specdec.models.hf import HFTarget
from specdec.tree import DraftTree, build_ddtree, tree_from_branches

# Tiny tensors: extra intra-op threads only contend (60x slower on a loaded 2-core box).

warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

V = 48
CFG = dict(
    vocab_size=V,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
)


def small_model(backend: str = "auto", **kw) -> LlamaModel:  # type: ignore[no-untyped-def]
    return LlamaModel(LlamaConfig(**{**CFG, **kw}), backend=backend).double().init_random(7)


def randomize_(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Weights large enough that logits differ clearly between contexts (HF's default init
    is tiny)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
            else:
                std = 0.5 if p.dim() == 1 or "embed" in name else 1 / math.sqrt(p.shape[-1])
                p.copy_(std * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


def hf_llama(**kw):  # type: ignore[no-untyped-def]
    from transformers import LlamaConfig as HFConfig
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    cfg = HFConfig(**{**CFG, **kw})
    return randomize_(LlamaForCausalLM(cfg).double().eval())


def hf_qwen2(**kw):  # type: ignore[no-untyped-def]
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    return randomize_(Qwen2ForCausalLM(Qwen2Config(**{**CFG, **kw})).double().eval())


def tree_logits(target, prefix: list[int], tree: DraftTree) -> torch.Tensor:  # type: ignore[no-untyped-def]
    cache = target.new_cache(64)
    if prefix:
        ids = torch.tensor(prefix)
        target(ids, torch.arange(len(prefix)), cache, None)
        cache.commit(range(len(prefix)))
    p = cache.committed_len
    tt = tree.to("cpu")
    out = target(tt.tokens, tt.position_ids(p), cache, tt.attention_mask(p))
    assert cache.pending == tree.num_nodes
    cache.rollback()
    return out


def path_logits(target, prefix: list[int], tree: DraftTree, node: int) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """Standalone causal forward of prefix + the node's ancestor path, fresh cache."""
    seq = prefix + [int(tree.tokens[j]) for j in tree.path_to(node)]
    cache = target.new_cache(64)
    return target(torch.tensor(seq), torch.arange(len(seq)), cache, None)[-1]


def ddtree(seed: int, budget: int, root: int) -> DraftTree:
    rng = np.random.default_rng(seed)
    k = 5
    lp = np.log(rng.dirichlet(np.ones(k) * 0.5, size=6)).astype(np.float32)
    lp = np.ascontiguousarray(np.sort(lp, axis=1)[:, ::-1])
    ids = np.stack([rng.permutation(V)[:k] for _ in range(6)]).astype(np.int64)
    return build_ddtree(lp, ids, budget, root_token=root)


def branches_tree(seed: int, root: int) -> DraftTree:
    rng = np.random.default_rng(seed)
    # Few distinct tokens so branches share prefixes.
    br = [rng.integers(0, 4, size=rng.integers(1, 6)).tolist() for _ in range(rng.integers(1, 6))]
    return tree_from_branches(br, root_token=root)


def check_tree_vs_paths(target, prefix: list[int], tree: DraftTree, tol: float) -> None:  # type: ignore[no-untyped-def]
    packed = tree_logits(target, prefix, tree)
    assert packed.shape == (tree.num_nodes, target.vocab_size)
    for i in range(tree.num_real):
        ref = path_logits(target, prefix, tree, i)
        torch.testing.assert_close(packed[i], ref, rtol=tol, atol=tol)


@pytest.fixture(scope="module")
def llama_targets():  # type: ignore[no-untyped-def]
    return {b: small_model(b) for b in ("sdpa", "math", "flex")}


@pytest.fixture(scope="module")
def hf_target():  # type: ignore[no-untyped-def]
    return HFTarget(hf_llama())


@settings(max_examples=12, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    budget=st.integers(1, 20),
    plen=st.integers(0, 6),
    backend=st.sampled_from(["sdpa", "math", "flex"]),
    kind=st.sampled_from(["ddtree", "branches"]),
)
def test_llama_tree_forward_equals_path_forwards(llama_targets, seed, budget, plen, backend, kind):  # type: ignore[no-untyped-def]
    target = llama_targets[backend]
    rng = np.random.default_rng(seed)
    prefix = rng.integers(0, V, size=plen).tolist()
    root = int(rng.integers(0, V))
    tree = ddtree(seed, budget, root) if kind == "ddtree" else branches_tree(seed, root)
    check_tree_vs_paths(target, prefix, tree, 1e-10)


@settings(max_examples=8, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    budget=st.integers(1, 16),
    plen=st.integers(0, 5),
    kind=st.sampled_from(["ddtree", "branches"]),
)
def test_hf_tree_forward_equals_path_forwards(hf_target, seed, budget, plen, kind):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    prefix = rng.integers(0, V, size=plen).tolist()
    root = int(rng.integers(0, V))
    tree = ddtree(seed, budget, root) if kind == "ddtree" else branches_tree(seed, root)
    check_tree_vs_paths(hf_target, prefix, tree, 1e-10)


def test_hf_qwen2_tree_forward_equals_path_forwards() -> None:
    target = HFTarget(hf_qwen2())
    for seed in range(2):
        check_tree_vs_paths(target, [5, 9, 2], ddtree(seed, 10, 7), 1e-10)
        check_tree_vs_paths(target, [5], branches_tree(seed, 7), 1e-10)


def test_padding_nodes_do_not_change_real_nodes(llama_targets) -> None:  # type: ignore[no-untyped-def]
    target = llama_targets["sdpa"]
    tree = ddtree(3, 9, 5)
    padded = tree.padded(20)
    a = tree_logits(target, [1, 2, 3], tree)
    b = tree_logits(target, [1, 2, 3], padded)
    torch.testing.assert_close(b[: tree.num_nodes], a, rtol=1e-12, atol=1e-12)


def test_tree_forward_differs_from_causal_over_packed_order(llama_targets) -> None:  # type: ignore[no-untyped-def]
    # The oracle would miss a mask bug if the causal packed forward agreed with the paths.
    target = llama_targets["sdpa"]
    tree = tree_from_branches([[4, 5, 6], [4, 7, 8], [9, 0, 1]], root_token=3)
    good = tree_logits(target, [1, 2], tree)
    cache = target.new_cache(64)
    target(torch.tensor([1, 2]), torch.arange(2), cache, None)
    cache.commit([0, 1])
    causal = target(torch.from_numpy(tree.tokens), torch.arange(2, 11), cache, None)
    assert (causal[2:] - good[2:]).abs().max() > 1e-3
    torch.testing.assert_close(causal[:2], good[:2])  # root and first child: same context


def test_llama_matches_hf_logits_and_gqa_variants() -> None:
    for kw in ({}, {"tie_word_embeddings": True}, {"num_key_value_heads": 4}):
        hf = hf_llama(**kw)
        ours = LlamaModel(LlamaConfig(**{**CFG, **kw})).double()
        sd = hf.state_dict()
        if kw.get("tie_word_embeddings"):
            sd.pop("lm_head.weight", None)
        ours.load_state_dict(sd)
        ids = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6])
        a = ours(ids, torch.arange(8), ours.new_cache(16))
        b = hf(ids[None]).logits[0]
        # HF computes RoPE angles in float32, hence not 1e-12.
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_load_hf_saved_checkpoint(tmp_path, family: str) -> None:  # type: ignore[no-untyped-def]
    hf = hf_llama() if family == "llama" else hf_qwen2()
    hf.save_pretrained(tmp_path)
    assert list(tmp_path.glob("*.safetensors"))
    model = load_checkpoint(tmp_path)
    assert model.dtype == torch.float64
    if family == "qwen2":
        assert model.model.layers[0].self_attn.q_proj.bias is not None
        assert model.model.layers[0].self_attn.o_proj.bias is None
    ids = torch.tensor([7, 3, 0, 11, 2])
    a = model(ids, torch.arange(5), model.new_cache(8))
    b = hf(ids[None]).logits[0]
    torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    f32 = load_checkpoint(tmp_path, dtype=torch.float32)
    assert f32.dtype == torch.float32


def test_load_handwritten_sharded_checkpoint(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from safetensors.torch import save_file

    src = small_model(tie_word_embeddings=True)
    sd = {k: v.contiguous() for k, v in src.state_dict().items()}
    keys = sorted(sd)
    save_file(
        {k: sd[k] for k in keys[: len(keys) // 2]},
        str(tmp_path / "model-00001-of-00002.safetensors"),
    )
    save_file(
        {k: sd[k] for k in keys[len(keys) // 2 :]},
        str(tmp_path / "model-00002-of-00002.safetensors"),
    )
    cfg = {
        **CFG,
        "model_type": "llama",
        "tie_word_embeddings": True,
        "torch_dtype": "float64",
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    model = load_checkpoint(tmp_path)
    ids = torch.tensor([1, 2, 3, 4])
    torch.testing.assert_close(
        model(ids, torch.arange(4), model.new_cache(8)),
        src(ids, torch.arange(4), src.new_cache(8)),
        rtol=0,
        atol=0,
    )


def test_checkpoint_errors(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from safetensors.torch import save_file

    with pytest.raises(CheckpointError, match="config.json"):
        load_checkpoint(tmp_path)
    cfg = {**CFG, "model_type": "llama"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="safetensors"):
        load_checkpoint(tmp_path)
    sd = {k: v.contiguous() for k, v in small_model().state_dict().items()}
    sd.pop("model.norm.weight")
    save_file(sd, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="missing"):
        load_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "hidden_size": 16}))
    with pytest.raises(ConfigError):  # shapes that do not match the config
        load_checkpoint(tmp_path)
    bad = {**cfg, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}
    (tmp_path / "config.json").write_text(json.dumps(bad))
    with pytest.raises(ConfigError, match="RoPE scaling"):
        load_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "model_type": "gpt2"}))
    with pytest.raises(ConfigError, match="model_type"):
        load_checkpoint(tmp_path)


def test_hf_cache_commit_compacts_to_accepted_path(hf_target) -> None:  # type: ignore[no-untyped-def]
    tree = tree_from_branches([[4, 5, 6], [4, 7, 8], [9, 0, 1]], root_token=3)
    cache = hf_target.new_cache(32)
    hf_target(torch.tensor([1, 2]), torch.arange(2), cache, None)
    cache.commit([0, 1])
    tt = tree.to("cpu")
    hf_target(tt.tokens, tt.position_ids(2), cache, tt.attention_mask(2))
    cache.commit([0, 1, 4])  # root 3, then 4, then 7
    assert cache.committed_len == 5
    ref = hf_target.new_cache(32)
    hf_target(torch.tensor([1, 2, 3, 4, 7]), torch.arange(5), ref, None)
    ref.commit(range(5))
    for layer in range(hf_target.num_layers):
        for a, b in zip(cache.committed_kv(layer), ref.committed_kv(layer), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    # Rollback drops the step entirely.
    hf_target(torch.tensor([9]), torch.tensor([5]), cache, None)
    cache.rollback()
    assert cache.committed_len == 5 and cache.cache.layers[0].keys.shape[2] == 5


# -- bad input -----------------------------------------------------------------------------
def test_forward_bad_inputs(llama_targets, hf_target) -> None:  # type: ignore[no-untyped-def]
    for target in (llama_targets["sdpa"], hf_target):
        cache = target.new_cache(16)
        ids, pos = torch.tensor([1, 2, 3]), torch.arange(3)
        with pytest.raises(VerifyError, match="position_ids"):
            target(ids, pos[:2], cache, None)
        with pytest.raises(TypeError, match="int64"):
            target(ids.float(), pos, cache, None)
        with pytest.raises(TypeError, match="int64"):
            target(ids, pos.double(), cache, None)
        with pytest.raises(VerifyError, match="1-D"):
            target(ids[None], pos[None], cache, None)
        with pytest.raises(VerifyError, match="at least one"):
            target(ids[:0], pos[:0], cache, None)
        with pytest.raises(VerifyError, match="maximum"):
            target(ids, pos + 126, cache, None)
        with pytest.raises(VerifyError, match="maximum"):
            target(ids, pos - 1, cache, None)
        with pytest.raises(VerifyError, match="token ids"):
            target(ids + V, pos, cache, None)
        with pytest.raises(VerifyError, match="mask must be"):
            target(ids, pos, cache, torch.ones(3, 4, dtype=torch.bool))
        with pytest.raises(TypeError, match="bool"):
            target(ids, pos, cache, torch.ones(3, 3))
        with pytest.raises(VerifyError, match="meta"):
            target(ids.to("meta"), pos, cache, None)
        with pytest.raises(VerifyError, match="meta"):
            target(ids, pos, cache, torch.ones(3, 3, dtype=torch.bool, device="meta"))
        with pytest.raises(TypeError, match="KVCache"):
            target(ids, pos, object(), None)
        with pytest.raises(VerifyError, match="do not fit"):
            target(torch.zeros(17, dtype=torch.long), torch.arange(17), cache, None)
        assert cache.committed_len == 0 and cache.pending == 0  # nothing half-done
        target(ids, pos, cache, None)
        with pytest.raises(VerifyError, match="uncommitted"):
            target(ids, pos + 3, cache, None)
    m = llama_targets["sdpa"]
    with pytest.raises(VerifyError, match="layout"):
        m(
            torch.tensor([1]),
            torch.tensor([0]),
            DenseKVCache(3, 2, 8, 16, dtype=torch.float64),
            None,
        )
    with pytest.raises(TypeError, match="HFKVCache"):
        hf_target(torch.tensor([1]), torch.tensor([0]), m.new_cache(4), None)
    assert isinstance(hf_target.new_cache(4), HFKVCache)
    with pytest.raises(ConfigError, match="multiple"):
        LlamaConfig(**{**CFG, "num_key_value_heads": 3})
