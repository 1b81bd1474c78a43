"""DDTree builder, verifier contract and walk against independent oracles."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import specdec
from specdec import TreeError
from specdec.testing import (
    ancestor_set,
    brute_force_scores,
    naive_walk,
    reference_ddtree,
)

NEG_INF = float("-inf")


@st.composite
def marginals(draw, max_l=4, max_k=5, max_b=40):
    l = draw(st.integers(1, max_l))
    k = draw(st.integers(1, max_k))
    vals = st.one_of(
        st.sampled_from([0.0, -0.5, -1.0, -2.0, NEG_INF]),
        st.floats(-8.0, 0.0, allow_nan=False, width=32),
    )
    lp = np.array(draw(st.lists(vals, min_size=l * k, max_size=l * k)), dtype=np.float32)
    lp = -np.sort(-lp.reshape(l, k), axis=1)
    ids = np.array(
        [draw(st.permutations(list(range(0, 3 * k, 3)))) for _ in range(l)], dtype=np.int64
    )
    b = draw(st.integers(1, max_b))
    return lp, ids, b


# ---- builder ------------------------------------------------------------------------------
@settings(max_examples=300, deadline=None)
@given(marginals())
def test_builder_matches_reference_heap_and_brute_force(case):
    lp, ids, b = case
    t = specdec.build_ddtree(lp, ids, b, root_token=9)
    tok, par, dep, score = reference_ddtree(lp, ids, b)
    assert t.tokens.tolist() == [9] + tok[1:]
    assert t.parents.tolist() == par
    assert t.depths.tolist() == dep
    assert t.logprobs.tolist() == score
    best = brute_force_scores(lp)[:b]
    assert t.num_drafted == len(best)
    assert math.isclose(sum(t.logprobs[1:]), sum(best), rel_tol=1e-9, abs_tol=1e-9)
    assert math.isclose(
        t.expected_acceptance, sum(math.exp(s) for s in best), rel_tol=1e-9, abs_tol=1e-12
    )
    # prefix-closed, parents first, non-increasing, no -inf node, no duplicate sibling tokens
    assert np.all(np.diff(t.logprobs[1:]) <= 0)
    assert np.all(np.isfinite(t.logprobs))
    seen = set()
    for i in range(1, t.num_nodes):
        p = int(t.parents[i])
        assert 0 <= p < i and t.depths[i] == t.depths[p] + 1
        assert (p, int(t.tokens[i])) not in seen
        seen.add((p, int(t.tokens[i])))


@settings(max_examples=150, deadline=None)
@given(marginals(), st.floats(math.exp(-5.0), 1.0))
def test_min_prob_matches_reference(case, min_prob):
    lp, ids, b = case
    t = specdec.build_ddtree(lp, ids, b, min_prob=min_prob)
    tok, par, _, score = reference_ddtree(lp, ids, b, min_prob=min_prob)
    assert t.parents.tolist() == par and t.logprobs.tolist() == score
    assert all(s >= math.log(min_prob) for s in t.logprobs)
    # 0 is no threshold: the plain build
    assert specdec.build_ddtree(lp, ids, b, min_prob=0.0).parents.tolist() == (
        specdec.build_ddtree(lp, ids, b).parents.tolist()
    )


@settings(max_examples=150, deadline=None)
@given(marginals(), st.integers(0, 6))
def test_contract_masks_positions_links_retrieve(case, prefix):
    lp, ids, b = case
    t = specdec.build_ddtree(lp, ids, b)
    n = t.num_nodes
    par = t.parents.tolist()
    bits = t.ancestor_bits()
    assert bits.dtype == np.uint64 and bits.shape == (n, (n + 63) // 64)
    dense = t.attention_mask(prefix)
    add = t.attention_mask(prefix, kind="additive")
    assert dense.shape == (n, prefix + n) and dense.dtype == np.bool_
    assert add.dtype == np.float32
    for i in range(n):
        anc = ancestor_set(par, i)
        for j in range(n):
            bit = (int(bits[i, j // 64]) >> (j % 64)) & 1
            assert bit == (j in anc)
            assert dense[i, prefix + j] == (j in anc)
            assert add[i, prefix + j] == (0.0 if j in anc else NEG_INF)
        assert dense[i, :prefix].all()
    assert t.position_ids(prefix).tolist() == [prefix + d for d in t.depths.tolist()]
    # child links: first_child/next_sibling enumerate exactly each node's children in order
    for i in range(n):
        kids, c = [], int(t.first_child[i])
        while c >= 0:
            kids.append(c)
            c = int(t.next_sibling[c])
        assert kids == [j for j in range(n) if par[j] == i]
    # retrieve indices: one row per leaf, root..leaf
    leaves = [i for i in range(n) if i not in par]
    ri = t.retrieve_indices()
    assert ri.shape == (len(leaves), int(t.depths.max()) + 1)
    for row, leaf in zip(ri.tolist(), leaves, strict=True):
        path = [x for x in row if x >= 0]
        assert path == t.path_to(leaf)
        assert row[len(path) :] == [-1] * (len(row) - len(path))


@settings(max_examples=60, deadline=None)
@given(st.lists(marginals(max_b=30), min_size=1, max_size=5), st.data())
def test_batch_equals_single(cases, data):
    l = max(c[0].shape[0] for c in cases)
    k = max(c[0].shape[1] for c in cases)
    r = len(cases)
    lp = np.full((r, l, k), NEG_INF, dtype=np.float32)
    ids = np.zeros((r, l, k), dtype=np.int64)
    for i, (a, t, _) in enumerate(cases):
        lp[i, : a.shape[0], : a.shape[1]] = a
        ids[i, : a.shape[0], : a.shape[1]] = t
        ids[i, :, a.shape[1] :] = np.arange(100, 100 + k - a.shape[1])
    budgets = [c[2] for c in cases]
    roots = data.draw(st.lists(st.integers(0, 50), min_size=r, max_size=r))
    trees = specdec.build_ddtree_batch(lp, ids, budgets, root_tokens=roots)
    for i, t in enumerate(trees):
        one = specdec.build_ddtree(lp[i], ids[i], budgets[i], root_token=roots[i])
        assert t.tokens.tolist() == one.tokens.tolist()
        assert t.parents.tolist() == one.parents.tolist()
        assert np.array_equal(t.ancestor_bits(), one.ancestor_bits())


@settings(max_examples=100, deadline=None)
@given(st.lists(marginals(max_b=30), min_size=1, max_size=4), st.randoms(use_true_random=False))
def test_batched_walk_equals_naive_walk(cases, rnd):
    trees = [specdec.build_ddtree(lp, ids, b) for lp, ids, b in cases]
    n_max = max(t.num_nodes for t in trees)
    chosen = np.full((len(trees), n_max), 10_000, dtype=np.int64)
    for r, t in enumerate(trees):
        for i in range(t.num_nodes):
            kids = [j for j in range(t.num_nodes) if t.parents[j] == i]
            if kids and rnd.random() < 0.8:
                chosen[r, i] = t.tokens[rnd.choice(kids)]
            else:
                chosen[r, i] = rnd.choice([10_000, 3, 6])
    results = specdec.walk_batch(trees, chosen)
    for r, (t, res) in enumerate(zip(trees, results, strict=True)):
        acc, bonus = naive_walk(t.tokens.tolist(), t.parents.tolist(), chosen[r].tolist())
        assert res.accepted.tolist() == acc and res.bonus_token == bonus
        single = specdec.walk(t, chosen[r, : t.num_nodes])
        assert single.accepted.tolist() == acc and single.bonus_token == bonus


# ---- worked examples ----------------------------------------------------------------------
def test_paper_worked_example():
    a, b, c, d = 0, 1, 2, 3
    q = [
        [(a, 0.55), (b, 0.35), (c, 0.06), (d, 0.04)],
        [(b, 0.50), (a, 0.30), (c, 0.15), (d, 0.05)],
        [(c, 0.55), (d, 0.25), (a, 0.12), (b, 0.08)],
    ]
    lp = np.log(np.array([[p for _, p in row] for row in q], dtype=np.float32))
    ids = np.array([[t for t, _ in row] for row in q], dtype=np.int64)
    t = specdec.build_ddtree(lp, ids, 6)
    names = "ABCD"
    paths = ["".join(names[int(t.tokens[j])] for j in t.path_to(i)[1:]) for i in range(1, 7)]
    assert paths == ["A", "B", "AB", "BB", "AA", "ABC"]
    assert t.expected_acceptance == pytest.approx(1.66625, abs=1e-6)
    assert t.position_ids(0).tolist() == [0, 1, 1, 2, 2, 2, 3]
    chosen = np.full(7, d)
    chosen[0] = a  # at the root the verifier picks A
    chosen[1] = b  # after A: B
    chosen[3] = d  # after AB: D (not in the tree)
    res = specdec.walk(t, chosen)
    assert res.accepted_tokens == [a, b] and res.bonus_token == d
    assert res.tokens == [a, b, d]


def test_notes_branches_example():
    t = specdec.tree_from_branches([[4, 5, 6], [4, 7, 8], [9, 0, 1]], root_token=11)
    assert t.num_drafted == 8
    assert t.tokens.tolist() == [11, 4, 9, 5, 7, 0, 6, 8, 1]
    assert t.parents.tolist() == [-1, 0, 0, 1, 1, 2, 3, 4, 5]
    # root 11 is the second of the context tokens [10, 11]: one token before it
    assert t.position_ids(1)[1:].tolist() == [2, 2, 3, 3, 3, 4, 4, 4]
    assert t.attention_mask(1).sum(1)[1:].tolist() == [3, 3, 4, 4, 4, 5, 5, 5]
    assert math.isnan(t.expected_acceptance)
    chosen = np.zeros(9, dtype=np.int64)
    chosen[0], chosen[1], chosen[4] = 4, 7, 3
    res = specdec.walk(t, chosen)
    assert res.accepted_tokens == [4, 7] and res.bonus_token == 3
    assert [10, 11, *res.accepted_tokens] == [10, 11, 4, 7]
    assert t.num_drafted - res.num_accepted == 6  # tentative nodes to release


@settings(max_examples=80, deadline=None)
@given(marginals(max_b=20), st.integers(0, 10))
def test_padded_tree(case, extra):
    lp, ids, b = case
    t = specdec.build_ddtree(lp, ids, b)
    budget = t.num_drafted + extra
    p = t.padded(budget, pad_token=5)
    n = t.num_nodes
    assert p.num_nodes == budget + 1 and p.num_real == n
    assert p.tokens[:n].tolist() == t.tokens.tolist() and (p.tokens[n:] == 5).all()
    assert (p.parents[n:] == -1).all() and (p.depths[n:] == 0).all()
    m = p.attention_mask(2)
    assert np.array_equal(m[:n, : 2 + n], t.attention_mask(2))
    assert not m[:n, 2 + n :].any()
    for i in range(n, budget + 1):  # padding sees the prefix and itself only
        assert m[i, 2:].nonzero()[0].tolist() == [i]
    assert p.valid.tolist() == [True] * n + [False] * (budget + 1 - n)
    # padding is never accepted, even when the verifier picks the pad token everywhere
    res = specdec.walk(p, np.full(budget + 1, 5))
    assert all(a < n for a in res.accepted.tolist())
    with pytest.raises(TreeError, match="padding budget"):
        t.padded(t.num_drafted - 1) if t.num_drafted else t.padded(-1)


def test_ddtree_from_logits_matches_manual_topk():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 50, generator=g) * 3
    trees = specdec.ddtree_from_logits(logits, [8, 16, 40], root_tokens=[1, 2, 3])
    for r, t in enumerate(trees):
        lp = torch.log_softmax(logits[r].float(), -1)
        v, i = torch.topk(lp, 40, -1)
        want = specdec.build_ddtree(v.numpy(), i.numpy(), [8, 16, 40][r], root_token=r + 1)
        assert t.tokens.tolist() == want.tokens.tolist()
        assert t.parents.tolist() == want.parents.tolist()
    one = specdec.ddtree_from_logits(logits[0], 8, temperature=0.5)
    lp = torch.log_softmax(logits[0] / 0.5, -1)
    v, i = torch.topk(lp, 8, -1)
    assert (
        one.tokens[1:].tolist() == specdec.build_ddtree(v.numpy(), i.numpy(), 8).tokens[1:].tolist()
    )


def test_to_device_gives_torch_tensors():
    t = specdec.tree_from_branches([[4, 5], [4, 6]], root_token=1)
    tt = t.to("cpu")
    assert tt.tokens.dtype == torch.long and tt.tokens.tolist() == [1, 4, 5, 6]
    assert tt.position_ids(3).tolist() == [3, 4, 5, 5]
    assert torch.equal(tt.attention_mask(2), torch.from_numpy(t.attention_mask(2)))


def test_draft_tree_from_arrays_is_checked():
    t = specdec.DraftTree([7, 4, 9, 5], [-1, 0, 0, 1])
    assert t.depths.tolist() == [0, 1, 1, 2]
    assert specdec.walk(t, [4, 5, 0, 0]).accepted_tokens == [4, 5]
    for parents in ([-1, 1, 0], [0, -1, 0], [-1, 0, 5], [-1, -1, 0]):
        with pytest.raises(TreeError):
            specdec.DraftTree([1, 2, 3], parents)
    with pytest.raises(TreeError, match="depth"):
        specdec.DraftTree([1, 2], [-1, 0], [0, 2])


def test_child_links_are_derived_once_on_request_and_checked():
    t = specdec.tree_from_branches([[4, 5], [4, 6], [7]])
    fc, ns = t.first_child, t.next_sibling
    assert fc is t.first_child and ns is t.next_sibling  # derived once, then kept
    assert fc.dtype == np.int32 and ns.dtype == np.int32
    assert specdec.walk(t, [4, 6, 0, 0, 0]).accepted_tokens == [4, 6]
    bad = specdec.tree_from_branches([[4, 5]])
    bad.parents[2] = 2  # edited after the build: a node cannot be its own parent
    with pytest.raises(TreeError, match=r"parents\[2\] = 2"):
        _ = bad.first_child


# ---- bad input ----------------------------------------------------------------------------
def _ok():
    return np.array([[-0.1, -2.0]], dtype=np.float32), np.array([[3, 4]], dtype=np.int64)


@pytest.mark.parametrize(
    "mutate, exc, match",
    [
        (lambda lp, ids: (np.array([[np.nan, -1]], np.float32), ids), TreeError, "NaN"),
        (lambda lp, ids: (lp[:, ::-1].copy(), ids), TreeError, "sorted"),
        (lambda lp, ids: (np.array([[0.5, -1]], np.float32), ids), TreeError, "log-prob"),
        (lambda lp, ids: (np.array([[np.inf, -1]], np.float32), ids), TreeError, "log-prob"),
        (lambda lp, ids: (lp.astype(np.float64), ids), TypeError, "float32"),
        (lambda lp, ids: (lp, ids.astype(np.float32)), TypeError, "int64"),
        (lambda lp, ids: (lp[0], ids), TreeError, "2-D"),
        (lambda lp, ids: (lp, ids[:, :1]), TreeError, "same"),
        (lambda lp, ids: (lp[:, :0], ids[:, :0]), TreeError, "K >= 1"),
        (lambda lp, ids: (lp[:0], ids[:0]), TreeError, "L >= 1"),
        (lambda lp, ids: (lp, np.array([[3, 2**31]])), TreeError, "2\\^31"),
        (lambda lp, ids: (lp, np.array([[-3, 4]])), TreeError, "outside"),
    ],
)
def test_bad_marginals(mutate, exc, match):
    lp, ids = mutate(*_ok())
    with pytest.raises(exc, match=match):
        specdec.build_ddtree(lp, ids, 4)


def test_token_ids_are_checked_where_the_tree_uses_them():
    lp = np.array([[-0.1, -9.0], [-0.1, -9.0]], dtype=np.float32)
    ids = np.array([[4, 2**40], [6, 7]], dtype=np.int64)
    # Budget 2 takes [4] then its child [4, 6]: the bad id at [0, 1] is never read.
    assert specdec.build_ddtree(lp, ids, 2).tokens[1:].tolist() == [4, 6]
    # Budget 3 reaches it: the error names the entry.
    with pytest.raises(TreeError, match=r"token_ids\[0, 1\]"):
        specdec.build_ddtree(lp, ids, 3)
    with pytest.raises(TreeError, match="request 0"):
        specdec.build_ddtree_batch(lp[None], ids[None], [3])


def test_duplicate_token_ids_are_rejected_when_they_give_one_parent_two_children():
    lp = np.array([[-0.01, -5, -6], [-0.1, -0.2, -0.3], [-0.1, -0.2, NEG_INF]], np.float32)
    ids = np.array([[1, 2, 3], [4, 5, 4], [7, 8, 7]], dtype=np.int64)
    msg = r"token_ids\[1, 2\] = 4 repeats token_ids\[1, 0\]"
    # At budget 8 node 1 gets all three row-1 entries as children: ids 4 twice.
    with pytest.raises(TreeError, match=msg):
        specdec.build_ddtree(lp, ids, 8)
    # At budget 5 no parent reaches row 1's column 2, and row 2's id 7 (column 0) goes to two
    # different parents: the tree is the one repeat-free ids would give.
    t = specdec.build_ddtree(lp, ids, 5)
    assert t.tokens.tolist() == [-1, 1, 4, 5, 7, 7] and t.parents.tolist() == [-1, 0, 1, 1, 2, 3]
    ok = ids.copy()
    ok[1, 2] = 6
    assert specdec.build_ddtree(lp, ok, 8).num_drafted == 8
    # The opt-out builds the tree from the same marginals.
    assert specdec.build_ddtree(lp, ids, 8, check_duplicates=False).num_drafted == 8
    with pytest.raises(TypeError, match="check_duplicates"):
        specdec.build_ddtree(lp, ids, 8, check_duplicates=1)  # type: ignore[arg-type]
    # The batch names the request.
    with pytest.raises(TreeError, match="request 1: " + msg):
        specdec.build_ddtree_batch(np.stack([lp, lp]), np.stack([ok, ids]), [8, 8])
    assert len(specdec.build_ddtree_batch(lp[None], ids[None], [8], check_duplicates=False)) == 1
    # A top-K's ids are distinct: ddtree_from_logits builds without the check.
    t = specdec.ddtree_from_logits(torch.randn(3, 50), 16)
    assert isinstance(t, specdec.DraftTree) and t.num_drafted == 16


def test_bad_budgets_and_other_input():
    lp, ids = _ok()
    for b in (0, -3):
        with pytest.raises(TreeError, match="budget"):
            specdec.build_ddtree(lp, ids, b)
    with pytest.raises(TypeError, match="budget"):
        specdec.build_ddtree(lp, ids, 2.5)  # type: ignore[arg-type]
    with pytest.raises(TreeError, match="root_token"):
        specdec.build_ddtree(lp, ids, 2, root_token=2**40)
    with pytest.raises(TreeError, match="request 1"):
        specdec.build_ddtree_batch(np.stack([lp, lp[:, ::-1]]), np.stack([ids, ids]), [2, 2])
    with pytest.raises(TreeError, match="budget"):
        specdec.build_ddtree_batch(lp[None], ids[None], [0])
    with pytest.raises(TreeError):
        specdec.build_ddtree_batch(lp[None], ids[None], [2, 2])
    with pytest.raises(TreeError, match="at least one branch"):
        specdec.tree_from_branches([])
    with pytest.raises(TreeError, match="empty"):
        specdec.tree_from_branches([[1], []])
    with pytest.raises(TreeError, match="2\\^31"):
        specdec.tree_from_branches([[1, 2**33]])
    with pytest.raises(TypeError):
        specdec.tree_from_branches([["a"]])  # type: ignore[list-item]
    t = specdec.build_ddtree(lp, ids, 2)
    with pytest.raises(TreeError, match="one chosen token per node"):
        specdec.walk(t, [3])
    with pytest.raises(TreeError, match="prefix_len"):
        t.attention_mask(-1)
    with pytest.raises(TreeError, match="kind"):
        t.attention_mask(0, kind="float")  # type: ignore[arg-type]
    with pytest.raises(TreeError, match="NaN"):
        specdec.ddtree_from_logits(torch.full((2, 4), float("nan")), 4)
    with pytest.raises(TypeError):
        specdec.ddtree_from_logits(np.zeros((2, 4)), 4)  # type: ignore[arg-type]
    with pytest.raises(TreeError):
        specdec.ddtree_from_logits(torch.zeros(4), 4)
    with pytest.raises(TreeError, match="temperature"):
        specdec.ddtree_from_logits(torch.zeros(2, 4), 4, temperature=0)


def test_huge_sizes_are_errors_not_aborts():
    lp, ids = _ok()
    # Two possible prefixes: a budget far past them builds them all, allocating for 3 nodes.
    assert specdec.build_ddtree(lp, ids, 10**15).tokens[1:].tolist() == [3, 4]
    wide = np.full((16, 8), -1.0, np.float32), np.tile(np.arange(8, dtype=np.int64), (16, 1))
    with pytest.raises(TreeError, match="int32"):
        specdec.build_ddtree(*wide, 2**40)
    with pytest.raises(TreeError, match="node limit"):
        specdec.build_ddtree(*wide, 2**31 - 2)
    t = specdec.build_ddtree(lp, ids, 2)
    with pytest.raises(TreeError, match="int32"):
        t.padded(2**40)
    # Over 2^16 nodes the quadratic ancestor bitmap (8 GiB here) is refused, not built for
    # tens of seconds (found by make fuzz).
    with pytest.raises(TreeError, match="node limit"):
        t.padded(2**18)
    with pytest.raises(TreeError, match="over 2 GiB"):  # refused before any allocation
        t.attention_mask(2**62)
    with pytest.raises(TreeError, match="over 2 GiB"):
        t.attention_mask(2**30, kind="additive")


def test_edited_arrays_are_errors_not_panics():
    t = specdec.tree_from_branches([[4, 5], [4, 6]])
    t.parents[1], t.parents[2] = 2, 1  # a cycle: node 1 under node 2 under node 1
    with pytest.raises(TreeError, match="node 1"):
        t.retrieve_indices()
    t = specdec.tree_from_branches([[4, 5], [4, 6]])
    bits = t.ancestor_bits()
    bits[1, 0] |= np.uint64(1 << 9)  # node 9 of a 4-node tree
    with pytest.raises(TreeError, match="row 1"):
        t.attention_mask(0)
