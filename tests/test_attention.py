"""Packed tree attention against a per-branch reference and across backends, GQA and padded
batches."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec.errors import VerifyError
from specdec.testing import ancestor_path, reference_tree_mask
from specdec.tree import batch_tree_inputs, build_ddtree, tree_from_branches
from specdec.verify.attention import attend, tree_attention

# Tiny tensors: extra intra-op threads only contend (60x slower on a loaded 2-core box).

warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

# The notes' tree: branches [4,5,6], [4,7,8], [9,0,1] packed breadth-first, no root.
NOTE_TOKENS = [4, 9, 5, 7, 0, 6, 8, 1]
NOTE_PARENTS = [-1, -1, 0, 0, 1, 2, 3, 4]
F64 = torch.float64


def rope_interleaved(x: torch.Tensor, positions: torch.Tensor, base: float = 10_000.0):
    """Rotary embedding on (even, odd) pairs, written independently of the library."""
    d = x.shape[-1]
    inv = base ** (-torch.arange(0, d, 2, dtype=x.dtype) / d)
    ang = positions.to(x.dtype)[..., None] * inv
    cos = torch.repeat_interleave(ang.cos(), 2, -1)
    sin = torch.repeat_interleave(ang.sin(), 2, -1)
    rot = torch.stack((-x[..., 1::2], x[..., 0::2]), -1).flatten(-2)
    return x * cos + rot * sin


def branch_reference(q, bk, bv, ck, cv, parents):  # type: ignore[no-untyped-def]
    """Each node alone: softmax over base prefix + its own ancestor path, no mask at all."""
    rep = q.shape[1] // bk.shape[1]
    bk, bv, ck, cv = (t.repeat_interleave(rep, 1) for t in (bk, bv, ck, cv))
    outs = []
    for i in range(len(parents)):
        path = torch.tensor(ancestor_path(i, parents))
        k = torch.cat((bk, ck.index_select(-2, path)), -2)
        v = torch.cat((bv, cv.index_select(-2, path)), -2)
        s = q[..., i : i + 1, :] @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        outs.append(torch.softmax(s, -1) @ v)
    return torch.cat(outs, -2)


def note_inputs(seed: int = 233):
    g = torch.Generator().manual_seed(seed)
    b, h, p, n, d = 1, 2, 2, len(NOTE_PARENTS), 8
    bk = torch.randn(b, h, p, d, generator=g, dtype=F64)
    bv = torch.randn(b, h, p, d, generator=g, dtype=F64)
    q = torch.randn(b, h, n, d, generator=g, dtype=F64)
    ck = torch.randn(b, h, n, d, generator=g, dtype=F64)
    cv = torch.randn(b, h, n, d, generator=g, dtype=F64)
    return q, bk, bv, ck, cv


def library_tree_mask_and_positions(p: int):
    """The notes' mask and positions from the library's tree: with the root in the tree, the
    notes' prefix of length P is [P-1 committed tokens, root]; drop the root row."""
    tree = tree_from_branches([[4, 5, 6], [4, 7, 8], [9, 0, 1]], root_token=3)
    assert tree.tokens[1:].tolist() == NOTE_TOKENS
    assert (tree.parents[1:] - 1).clip(min=-1).tolist() == NOTE_PARENTS
    mask = torch.from_numpy(tree.attention_mask(p - 1))[1:]
    pos = torch.from_numpy(tree.position_ids(p - 1))[1:]
    return mask, pos


@pytest.mark.parametrize("backend", ["math", "sdpa", "flex", "auto"])
def test_notes_experiment(backend: str) -> None:
    p = 2
    q_raw, bk_raw, bv, ck_raw, cv = note_inputs()
    mask, pos = library_tree_mask_and_positions(p)
    assert torch.equal(mask, reference_tree_mask(NOTE_PARENTS, p))
    assert mask.sum(-1).tolist() == [3, 3, 4, 4, 4, 5, 5, 5]
    assert pos.tolist() == [2, 2, 3, 3, 3, 4, 4, 4]  # P + depth - 1, not the packed index

    q, ck = rope_interleaved(q_raw, pos), rope_interleaved(ck_raw, pos)
    bk = rope_interleaved(bk_raw, torch.arange(p))
    packed = tree_attention(q, bk, bv, ck, cv, mask, backend=backend)
    reference = branch_reference(q, bk, bv, ck, cv, NOTE_PARENTS)
    assert packed.shape == (1, 2, 8, 8)
    torch.testing.assert_close(packed, reference, rtol=1e-12, atol=1e-12)

    # A lower-triangular candidate mask lets siblings leak into each other.
    wrong = torch.cat((torch.ones(8, p, dtype=torch.bool), torch.tril(torch.ones(8, 8)).bool()), -1)
    leak = (tree_attention(q, bk, bv, ck, cv, wrong, backend=backend) - reference).abs().max()
    assert leak > 1e-3

    # RoPE by packed index instead of depth changes the output.
    packed_pos = p + torch.arange(8)
    q2, ck2 = rope_interleaved(q_raw, packed_pos), rope_interleaved(ck_raw, packed_pos)
    by_index = tree_attention(q2, bk, bv, ck2, cv, mask, backend=backend)
    assert (by_index - reference).abs().max() > 1e-3


def test_notes_mask_matches_reference_from_raw_parents() -> None:
    # Independent of tree_from_branches: the library mask of a tree given by raw arrays.
    from specdec.tree import DraftTree

    parents = [-1] + [pp + 1 if pp >= 0 else 0 for pp in NOTE_PARENTS]
    tree = DraftTree([3, *NOTE_TOKENS], parents)
    full = torch.from_numpy(tree.attention_mask(4))
    assert torch.equal(full, reference_tree_mask(parents, 4))


def random_tree(seed: int, budget: int):
    rng = np.random.default_rng(seed)
    lp = np.sort(np.log(rng.dirichlet(np.ones(6), size=5)).astype(np.float32), axis=1)[:, ::-1]
    ids = np.stack([rng.permutation(40)[:6] for _ in range(5)]).astype(np.int64)
    return build_ddtree(np.ascontiguousarray(lp), ids, budget, root_token=1)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    budget=st.integers(1, 24),
    p=st.integers(0, 7),
    hkv=st.sampled_from([1, 2, 4]),
    backend=st.sampled_from(["math", "sdpa", "flex"]),
)
def test_random_trees_gqa_match_reference(seed, budget, p, hkv, backend) -> None:  # type: ignore[no-untyped-def]
    tree = random_tree(seed, budget)
    n = tree.num_nodes
    g = torch.Generator().manual_seed(seed)
    hq, d = 4, 8
    q = torch.randn(2, hq, n, d, generator=g, dtype=F64)
    bk, bv = (torch.randn(2, hkv, p, d, generator=g, dtype=F64) for _ in range(2))
    ck, cv = (torch.randn(2, hkv, n, d, generator=g, dtype=F64) for _ in range(2))
    mask = torch.from_numpy(tree.attention_mask(p))
    out = tree_attention(q, bk, bv, ck, cv, mask, backend=backend)
    ref = branch_reference(q, bk, bv, ck, cv, tree.parents.tolist())
    torch.testing.assert_close(out, ref, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("backend", ["math", "sdpa", "flex"])
def test_padded_batch_of_trees_matches_each_tree_alone(backend: str) -> None:
    trees = [random_tree(s, b) for s, b in ((1, 3), (2, 9), (3, 14))]
    prefix = [5, 0, 2]
    budget = 16
    batch = batch_tree_inputs(trees, prefix, budget=budget)
    tokens, positions, mask = batch.tokens, batch.positions, batch.mask
    r, n = tokens.shape
    assert (r, n) == (3, budget + 1) and mask.shape == (3, n, max(prefix) + n)
    g = torch.Generator().manual_seed(0)
    hq, hkv, d, pmax = 4, 2, 8, max(prefix)
    q = torch.randn(r, hq, n, d, generator=g, dtype=F64)
    bk, bv = (torch.randn(r, hkv, pmax, d, generator=g, dtype=F64) for _ in range(2))
    ck, cv = (torch.randn(r, hkv, n, d, generator=g, dtype=F64) for _ in range(2))
    out = tree_attention(q, bk, bv, ck, cv, mask, backend=backend)
    for i, (t, p) in enumerate(zip(trees, prefix, strict=True)):
        m = t.num_nodes
        assert tokens[i, :m].tolist() == t.tokens.tolist()
        assert positions[i, :m].tolist() == t.position_ids(p).tolist()
        alone = tree_attention(
            q[i : i + 1, :, :m],
            bk[i : i + 1, :, :p],
            bv[i : i + 1, :, :p],
            ck[i : i + 1, :, :m],
            cv[i : i + 1, :, :m],
            torch.from_numpy(t.attention_mask(p)),
            backend="math",
        )
        torch.testing.assert_close(out[i : i + 1, :, :m], alone, rtol=1e-11, atol=1e-11)
    assert torch.isfinite(out).all()  # padding rows see themselves: never all-masked


def test_unbatched_inputs_and_attend_without_mask() -> None:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 4, generator=g, dtype=F64)
    kp, vp = torch.randn(2, 1, 4, dtype=F64), torch.randn(2, 1, 4, dtype=F64)
    kt, vt = torch.randn(2, 3, 4, dtype=F64), torch.randn(2, 3, 4, dtype=F64)
    mask = torch.ones(3, 4, dtype=torch.bool)
    out = tree_attention(q, kp, vp, kt, vt, mask)
    assert out.shape == (2, 3, 4)
    k, v = torch.cat((kp, kt), 1)[None], torch.cat((vp, vt), 1)[None]
    torch.testing.assert_close(out, attend(q[None], k, v, None, backend="math")[0])


def _io(hq=2, hkv=2, n=3, p=2, d=4, dtype=F64):  # type: ignore[no-untyped-def]
    return (
        torch.randn(1, hq, n, d, dtype=dtype),
        torch.randn(1, hkv, p, d, dtype=dtype),
        torch.randn(1, hkv, p, d, dtype=dtype),
        torch.randn(1, hkv, n, d, dtype=dtype),
        torch.randn(1, hkv, n, d, dtype=dtype),
        torch.ones(n, p + n, dtype=torch.bool),
    )


def test_bad_inputs() -> None:
    q, bk, bv, ck, cv, m = _io()
    with pytest.raises(VerifyError, match="mask must be"):
        tree_attention(q, bk, bv, ck, cv, m[:, :-1])
    with pytest.raises(TypeError, match="bool"):
        tree_attention(q, bk, bv, ck, cv, m.float())
    with pytest.raises(TypeError, match="dtype"):
        tree_attention(q, bk.float(), bv.float(), ck, cv, m)
    with pytest.raises(TypeError, match="dtypes differ"):
        tree_attention(q.float(), bk.float(), bv.float(), ck.float(), cv, m)
    with pytest.raises(VerifyError, match="devices differ|on meta"):
        tree_attention(q, bk, bv, ck.to("meta"), cv.to("meta"), m)
    with pytest.raises(VerifyError, match="on meta"):
        tree_attention(q, bk, bv, ck, cv, m.to("meta"))
    with pytest.raises(VerifyError, match="multiple"):
        tree_attention(*_io(hq=3, hkv=2))
    with pytest.raises(VerifyError, match="nodes"):
        tree_attention(q, bk, bv, ck[:, :, :2], cv[:, :, :2], m)
    q0, bk0, bv0, ck0, cv0, m0 = _io(n=0)
    with pytest.raises(VerifyError, match="empty"):
        tree_attention(q0, bk0, bv0, ck0, cv0, m0)
    with pytest.raises(TypeError):
        tree_attention(q.numpy(), bk, bv, ck, cv, m)  # type: ignore[arg-type]
    with pytest.raises(VerifyError, match="backend"):
        attend(q, torch.cat((bk, ck), 2), torch.cat((bv, cv), 2), m, backend="cuda")  # type: ignore[arg-type]
    with pytest.raises(VerifyError, match="prefix length|one prefix"):
        batch_tree_inputs([random_tree(0, 3)], [1, 2])
    with pytest.raises(VerifyError, match="budget"):
        batch_tree_inputs([random_tree(0, 8)], [1], budget=2)


def test_flex_block_mask_cache_never_goes_stale() -> None:
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 2, 5, 8, generator=g, dtype=F64)
    k = torch.randn(1, 2, 7, 8, generator=g, dtype=F64)
    v = torch.randn(1, 2, 7, 8, generator=g, dtype=F64)
    m = torch.from_numpy(random_tree(5, 4).attention_mask(2))
    for _ in range(2):  # second call: cached block mask
        torch.testing.assert_close(
            attend(q, k, v, m, backend="flex"), attend(q, k, v, m, backend="math")
        )
    m[:, 2:] = torch.eye(5, dtype=torch.bool)  # modified in place
    torch.testing.assert_close(
        attend(q, k, v, m, backend="flex"), attend(q, k, v, m, backend="math")
    )
    for seed in range(3):  # fresh masks of the same shape (addresses may be reused)
        m2 = torch.from_numpy(random_tree(10 + seed, 4).attention_mask(2))
        torch.testing.assert_close(
            attend(q, k, v, m2, backend="flex"), attend(q, k, v, m2, backend="math")
        )
