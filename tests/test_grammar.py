"""Matcher API, a small FSM example, tree masks, grammar-aware DDTree (against
brute force), apply_token_bitmask, vocabulary constructors and bad input."""

from __future__ import annotations

import json
import os
import random

import mistral_common
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import specdec
from specdec import (
    GrammarError,
    Matcher,
    NoAllowedTokens,
    RegexGrammar,
    SpecdecTypeError,
    TreeError,
    Vocabulary,
    allocate_token_bitmask,
    apply_token_bitmask,
    build_ddtree_constrained,
    fill_next_token_bitmask_batch,
    fill_tree_bitmask,
)

DATA = os.path.join(os.path.dirname(mistral_common.__file__), "data")
SMALL = [b"a", b"b", b"ab", b"c", b"ba", b"\xc3", b"\xa9", "é".encode(), None, b"abc"]
SMALL_EOS = 8  # the None entry


def small_vocab() -> Vocabulary:
    return Vocabulary.from_bytes(SMALL, eos_ids=[SMALL_EOS])


def allowed(m: Matcher, v: Vocabulary) -> set[int]:
    return set(m.allowed_tokens().tolist())


@pytest.fixture(scope="module")
def tekken() -> Vocabulary:
    return Vocabulary.from_tekken()


# ---- a small FSM example ---------------------------------------------------------------------
def test_fsm_example_yields_a_c_eos() -> None:
    v = Vocabulary.from_bytes([b"A", b"B", b"C", None], eos_ids=[3])
    m = Matcher(RegexGrammar(v, "A(B|C)"))
    steps = [[-2.0, 4, 3, 1], [5.0, 1, 2, 0], [3.0, 2, 1, -1]]
    out = []
    bm = allocate_token_bitmask(1, 4)
    for logits in steps:
        m.fill_next_token_bitmask(bm)
        lg = apply_token_bitmask(torch.tensor([logits]), bm)
        tok = int(lg.argmax())
        assert m.accept_token(tok)
        out.append("ABC"[tok] if tok < 3 else "EOS")
    assert out == ["A", "C", "EOS"]
    assert m.is_terminated()
    # Unmasked, the argmax would have been B, A, A.
    assert [int(np.argmax(s)) for s in steps] == [1, 0, 0]


# ---- matcher ------------------------------------------------------------------------------
def test_accept_rollback_fork_terminate() -> None:
    v = small_vocab()
    g = RegexGrammar(v, "ab(c|é)")
    m = Matcher(g)
    assert allowed(m, v) == {0, 2, 9}  # a, ab, abc
    assert not m.accept_token(1)  # b rejected, state unchanged
    assert m.num_accepted == 0 and allowed(m, v) == {0, 2, 9}
    assert m.accept_token(2)  # ab
    assert allowed(m, v) == {3, 5, 7}  # c, the first byte of é, é
    f = m.fork()
    assert f.accept_token(5) and allowed(f, v) == {6}  # partial UTF-8 then its tail
    assert f.accept_token(6) and allowed(f, v) == {SMALL_EOS}
    assert allowed(m, v) == {3, 5, 7}  # the fork did not move the original
    assert f.accept_token(SMALL_EOS) and f.is_terminated()
    assert allowed(f, v) == {SMALL_EOS}  # after EOS only EOS
    assert not f.accept_token(0)
    assert f.accept_token(SMALL_EOS) and f.is_terminated()  # EOS may repeat (padding)
    f.rollback(4)
    assert f.num_accepted == 1 and allowed(f, v) == {3, 5, 7}
    f.reset()
    assert f.num_accepted == 0 and allowed(f, v) == {0, 2, 9}
    assert m.accept_tokens([3, 0]) == 1 and m.is_accepting()


def test_batch_fill_equals_single_fills(tekken: Vocabulary) -> None:
    g = RegexGrammar(tekken, r"[a-z]+( [a-z]+)*\.")
    ms = []
    rng = random.Random(0)
    for i in range(8):
        m = Matcher(g)
        for _ in range(i):
            ids = m.allowed_tokens()
            m.accept_token(int(rng.choice(list(ids))))
        ms.append(m)
    bm = allocate_token_bitmask(10, tekken.vocab_size)
    rows = [9, 0, 3, 4, 5, 6, 7, 8]
    fill_next_token_bitmask_batch(ms, bm, rows)
    one = allocate_token_bitmask(1, tekken.vocab_size)
    for m, r in zip(ms, rows, strict=True):
        m.fill_next_token_bitmask(one)
        assert np.array_equal(bm[r], one[0])
    assert (bm[1] == -1).all() and (bm[2] == -1).all()  # rows nobody fills stay as allocated
    tb = torch.zeros(8, bm.shape[1], dtype=torch.int32)
    fill_next_token_bitmask_batch(ms, tb)
    assert np.array_equal(tb.numpy(), bm[rows])
    with pytest.raises(GrammarError, match="twice"):
        fill_next_token_bitmask_batch(ms[:2], bm, [1, 1])


# ---- tree masks ---------------------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(st.data())
def test_tree_mask_equals_per_node_matchers(data: st.DataObject) -> None:
    v = small_vocab()
    pattern = data.draw(st.sampled_from(["(ab|ba)*c?", "a(bc|é)*", "[abc]{1,4}", "(é|a)+b"]))
    g = RegexGrammar(v, pattern)
    m = Matcher(g)
    for t in data.draw(st.lists(st.integers(0, 9), max_size=2)):
        m.accept_token(t)
    branches = data.draw(
        st.lists(st.lists(st.integers(0, 9), min_size=1, max_size=4), min_size=1, max_size=6)
    )
    tree = specdec.tree_from_branches(branches, root_token=0)
    bm = np.full((tree.num_nodes + 2, 1), -7, dtype=np.int32)
    valid = fill_tree_bitmask(m, tree, bm, row_offset=1)
    assert (bm[0] == -7).all() and (bm[-1] == -7).all()
    one = allocate_token_bitmask(1, v.vocab_size)
    for i in range(tree.num_nodes):
        path = []
        j = i
        while j > 0:
            path.append(int(tree.tokens[j]))
            j = int(tree.parents[j])
        f = m.fork()
        ok = all(f.accept_token(t) for t in reversed(path))
        assert bool(valid[i]) == ok
        if ok:
            f.fill_next_token_bitmask(one)
            assert np.array_equal(bm[1 + i], one[0])
        else:
            assert not bm[1 + i].any()


# ---- grammar-aware DDTree -----------------------------------------------------------------
def brute_force_tree(logprobs, token_ids, budget, matcher):  # type: ignore[no-untyped-def]
    """All valid prefixes (any rank, none past EOS) scored by summed log-probs; top-B."""
    depth, width = logprobs.shape
    k = width
    out = []

    def rec(m: Matcher, d: int, path: tuple, score: float) -> None:
        if d == depth or m.is_terminated():  # nothing is drafted past EOS
            return
        for r in range(k):
            t = int(token_ids[d, r])
            f = m.fork()
            if f.accept_token(t):
                s = score + float(logprobs[d, r])
                out.append((s, path + (t,)))
                rec(f, d + 1, path + (t,), s)

    rec(matcher, 0, (), 0.0)
    out.sort(key=lambda x: -x[0])
    return out[:budget]


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_constrained_ddtree_equals_brute_force(data: st.DataObject) -> None:
    v = small_vocab()
    pattern = data.draw(st.sampled_from(["(ab|ba)*c?", "a(bc|é)*", "[abc]{1,4}", "(a|é)+b?"]))
    m = Matcher(RegexGrammar(v, pattern))
    depth = data.draw(st.integers(1, 4))
    width = data.draw(st.integers(1, 5))
    budget = data.draw(st.integers(1, 12))
    seed = data.draw(st.integers(0, 2**31))
    rng = np.random.default_rng(seed)
    lp = -np.sort(rng.exponential(1.0, size=(depth, width)).astype(np.float32), axis=1)
    ids = np.stack([rng.permutation(10)[:width] for _ in range(depth)]).astype(np.int64)
    tree = build_ddtree_constrained(lp, ids, budget, m, root_token=0)
    expected = brute_force_tree(lp, ids, budget, m)
    got = []
    for i in range(1, tree.num_nodes):
        path = []
        j = i
        while j > 0:
            path.append(int(tree.tokens[j]))
            j = int(tree.parents[j])
        got.append((float(tree.logprobs[i]), tuple(reversed(path))))
    assert sorted(p for _, p in got) == sorted(p for _, p in expected)
    for (s1, _), (s2, _) in zip(sorted(got), sorted(expected), strict=True):
        assert s1 == pytest.approx(s2, abs=1e-5)
    # Every node's path is valid for the grammar, and the matcher did not move.
    bm = allocate_token_bitmask(tree.num_nodes, v.vocab_size)
    assert fill_tree_bitmask(m, tree, bm).all()
    assert m.num_accepted == 0


def test_constrained_ddtree_spends_budget_on_valid_prefixes() -> None:
    v = Vocabulary.from_bytes([b"x", b"y", b"1", b"2", None], eos_ids=[4])
    m = Matcher(RegexGrammar(v, "[0-9]+"))
    lp = np.log(np.array([[0.6, 0.3, 0.05, 0.05]] * 3, dtype=np.float32))
    ids = np.array([[0, 1, 2, 3]] * 3, dtype=np.int64)  # the drafter prefers letters
    free = specdec.build_ddtree(lp, ids, 6)
    tree = build_ddtree_constrained(lp, ids, 6, m)
    assert set(free.tokens[1:].tolist()) & {0, 1}
    assert set(tree.tokens[1:].tolist()) <= {2, 3} and tree.num_drafted == 6


def test_constrained_ddtree_reaches_allowed_tokens_below_rank_budget() -> None:
    # The grammar rejects the 10 best candidates at every depth; digits sit at ranks 10..13.
    v = Vocabulary.from_bytes(
        [bytes([97 + i]) for i in range(10)] + [b"1", b"2", b"3", b"4", None], eos_ids=[14]
    )
    m = Matcher(RegexGrammar(v, "[0-9]+"))
    lp = -np.arange(14, dtype=np.float32)[None].repeat(3, 0) * 0.5
    ids = np.arange(14, dtype=np.int64)[None].repeat(3, 0)
    tree = build_ddtree_constrained(lp, ids, 4, m)
    assert tree.num_drafted == 4 and set(tree.tokens[1:].tolist()) <= {10, 11, 12, 13}
    assert brute_force_tree(lp, ids, 4, m)[0][1] == (10,)


def test_constrained_ddtree_rejects_duplicate_ids_given_to_one_parent() -> None:
    v = Vocabulary.from_bytes([b"1", b"2", b"3", b"4", None], eos_ids=[4])
    lp = np.log(np.array([[0.6, 0.3, 0.05, 0.05]] * 2, dtype=np.float32))
    ids = np.array([[0, 1, 2, 3], [0, 1, 2, 1]], dtype=np.int64)
    # Budget 12 gives node 1 the row-1 entries at columns 1 and 3, both id 1.
    with pytest.raises(TreeError, match=r"token_ids\[1, 3\] = 1 repeats token_ids\[1, 1\]"):
        build_ddtree_constrained(lp, ids, 12, Matcher(RegexGrammar(v, "[0-9]+")))
    # Budget 10 never gives one parent both: accepted.
    ok = build_ddtree_constrained(lp, ids, 10, Matcher(RegexGrammar(v, "[0-9]+")))
    assert ok.num_drafted == 10
    m = Matcher(RegexGrammar(v, "[0-9]+"))
    tree = build_ddtree_constrained(lp, ids, 12, m, check_duplicates=False)
    assert tree.num_drafted == 12 and m.num_accepted == 0


# ---- apply_token_bitmask ------------------------------------------------------------------
def test_apply_token_bitmask_matches_reference() -> None:
    rng = np.random.default_rng(0)
    bm = rng.integers(-(2**31), 2**31, size=(3, 3), dtype=np.int64).astype(np.int32)
    logits = torch.randn(3, 70)
    ref = logits.clone()
    for b in range(3):
        for t in range(70):
            if not (int(bm[b, t // 32]) >> (t % 32)) & 1:
                ref[b, t] = float("-inf")
    out = apply_token_bitmask(logits, torch.from_numpy(bm))
    assert out is logits and torch.equal(out, ref)
    # Wider logits than the bitmask: the ids past 32 * W are disallowed.
    wide = torch.zeros(1, 100)
    apply_token_bitmask(wide, bm[:1])
    assert torch.isinf(wide[0, 96:]).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_apply_token_bitmask_cpu_matches_a_per_token_loop(dtype: torch.dtype) -> None:
    # The CPU path (byte lookups, clamping) against the definition, bit by bit: widths off
    # the word size, vocab_size below the logits' width, a wider bitmask, rows by indices.
    rng = np.random.default_rng(1)
    for v, words, vocab_size, indices in [
        (70, 3, None, None),
        (64, 2, 50, None),
        (40, 3, None, [2, 0]),
        (1000, 32, 999, [1, 3, 0]),
    ]:
        rows = 4 if indices is None else len(indices)
        bm = rng.integers(-(2**31), 2**31, size=(rows, words), dtype=np.int64).astype(np.int32)
        bm[0] = -1  # a row that allows everything
        logits = torch.randn(4, v).to(dtype)
        ref = logits.clone()
        n = v if vocab_size is None else vocab_size
        for k, b in enumerate(range(4) if indices is None else indices):
            for t in range(n):
                if t >= 32 * words or not (int(bm[k, t // 32]) >> (t % 32)) & 1:
                    ref[b, t] = float("-inf")
        specdec.apply_token_bitmask_inplace(
            logits, torch.from_numpy(bm), vocab_size=vocab_size, indices=indices
        )
        assert torch.equal(logits, ref), (v, words, vocab_size, indices)


def test_apply_token_bitmask_no_allowed_tokens() -> None:
    logits = torch.randn(2, 40)
    before = logits.clone()
    bm = np.zeros((2, 2), dtype=np.int32)
    bm[0, 0] = 1
    with pytest.raises(NoAllowedTokens, match=r"row\(s\) \[1\]"):
        apply_token_bitmask(logits, bm)
    assert torch.equal(logits, before)
    with pytest.raises(SpecdecTypeError, match="int32"):
        apply_token_bitmask(logits, bm.astype(np.int64))
    with pytest.raises(GrammarError):
        apply_token_bitmask(logits, bm[:1])


# ---- bad input ----------------------------------------------------------------------------
def test_bad_regex_and_size_limit(tekken: Vocabulary) -> None:
    with pytest.raises(GrammarError, match="invalid regex"):
        RegexGrammar(tekken, "a(b")
    with pytest.raises(GrammarError, match="invalid regex"):
        RegexGrammar(tekken, r"\bword\b")  # Unicode word boundary: not a byte DFA
    with pytest.raises(GrammarError, match="too large"):
        RegexGrammar(tekken, "[ab]*a[ab]{20}", size_limit=1 << 16)
    with pytest.raises(GrammarError):
        RegexGrammar(tekken, b"abc")  # type: ignore[arg-type]
    # Refused from the pattern's match length, before seconds of expansion (found by make fuzz).
    with pytest.raises(GrammarError, match="too large"):
        RegexGrammar(tekken, "a{1000000}")
    # A limit so large that building up to it would take minutes is refused up front (the
    # 1M-input fuzz run's only hangs had size_limit=2**31).
    from specdec.constrain.regex import MAX_SIZE_LIMIT

    with pytest.raises(GrammarError, match="size_limit .* over the maximum"):
        RegexGrammar(tekken, r".*\(.{10023}", size_limit=2**31)
    RegexGrammar(tekken, "ab", size_limit=MAX_SIZE_LIMIT)  # the maximum itself is fine
    # Patterns whose automaton would take seconds to build before failing are refused from
    # their expanded size or NFA size first (found by the 1M-input fuzz run).
    with pytest.raises(GrammarError, match="expands to 333527 positions"):
        RegexGrammar(tekken, "] }-*\\\\+a?{333522}")
    with pytest.raises(GrammarError, match="NFA states"):
        RegexGrammar(tekken, r".*\(.{10023}")
    RegexGrammar(tekken, "(ab|cd){5000}")  # large but linear: accepted


def test_huge_precompute_budget_is_no_limit(tekken: Vocabulary) -> None:
    # A finite budget too long for a Rust Duration panicked (PanicException) before; found by
    # `make fuzz`. Any budget that long means: precompute every state.
    for ms in (1e30, 2.0**64 * 1e3, float("inf")):
        g = RegexGrammar(tekken, r"\d+", precompute_ms=ms)
        assert g.matches("42") and not g.matches("4a")
    with pytest.raises(GrammarError, match="precompute_ms"):
        RegexGrammar(tekken, r"\d+", precompute_ms=-1e30)


def test_bad_buffers_and_tokens_leave_matcher_unchanged(tekken: Vocabulary) -> None:
    m = Matcher(RegexGrammar(tekken, r"\d+"))
    words = (tekken.vocab_size + 31) // 32
    good = allocate_token_bitmask(2, tekken.vocab_size)
    m.fill_next_token_bitmask(good, 1)
    bad_inputs = [
        (np.zeros((2, words - 1), dtype=np.int32), GrammarError),
        (np.zeros((2, words), dtype=np.int64), SpecdecTypeError),
        (np.zeros(words, dtype=np.int32), GrammarError),
        (np.zeros((2, 2 * words), dtype=np.int32)[:, ::2], GrammarError),
        (torch.zeros(2, words, dtype=torch.float32), SpecdecTypeError),
        (torch.zeros(2, words, dtype=torch.int32, device="meta"), GrammarError),
        ([[0] * words], SpecdecTypeError),
    ]
    for bad, error in bad_inputs:
        with pytest.raises(error):
            m.fill_next_token_bitmask(bad, 0)
    good_t = torch.full((2, words), -1, dtype=torch.int32)
    m.fill_next_token_bitmask(good_t, 1)  # a CPU tensor is written through a numpy view
    assert np.array_equal(good_t.numpy(), good) and (good_t[0] == -1).all()
    for row in (-1, 2):
        for buf in (good, good_t):
            with pytest.raises(GrammarError):
                m.fill_next_token_bitmask(buf, row)
    with pytest.raises(GrammarError):
        m.fill_next_token_bitmask(torch.zeros(2, 2 * words, dtype=torch.int32)[:, ::2], 0)
    for tok in (-1, tekken.vocab_size, 2**40):
        with pytest.raises(GrammarError, match="out of range"):
            m.accept_token(tok)
    with pytest.raises(GrammarError, match="out of range"):
        m.accept_tokens([1000 + 50, tekken.vocab_size])
    with pytest.raises(GrammarError, match="roll back"):
        m.rollback(1)
    assert m.num_accepted == 0
    again = allocate_token_bitmask(1, tekken.vocab_size)
    m.fill_next_token_bitmask(again)
    assert np.array_equal(again[0], good[1])
    tree = specdec.tree_from_branches([[1050, 1051]], root_token=0)
    with pytest.raises(GrammarError):
        fill_tree_bitmask(m, tree, allocate_token_bitmask(2, tekken.vocab_size))
    bad_tree = specdec.DraftTree([0, tekken.vocab_size], [-1, 0])
    with pytest.raises(GrammarError, match="out of range"):
        fill_tree_bitmask(m, bad_tree, allocate_token_bitmask(2, tekken.vocab_size))


def test_bad_vocabularies() -> None:
    with pytest.raises(GrammarError):
        Vocabulary.from_bytes([b"a"], eos_ids=[5])
    with pytest.raises(GrammarError):
        Vocabulary.from_bytes([b"a", b"b"], eos_ids=[0], vocab_size=1)
    with pytest.raises(GrammarError):
        Vocabulary.from_tokenizer_json({"model": {"type": "Mystery"}})


# ---- vocabularies -------------------------------------------------------------------------
def test_tekken_vocabulary_bytes(tekken: Vocabulary) -> None:
    with open(os.path.join(DATA, "tekken_240911.json")) as f:
        tj = json.load(f)
    import base64

    assert tekken.vocab_size == 131072 and tekken.eos_ids == [2]
    assert tekken.token_bytes(1) is None and tekken.token_bytes(2) is None
    for r in (0, 65, 500, 1234, 77777, 130071):
        assert tekken.token_bytes(1000 + r) == base64.b64decode(tj["vocab"][r]["token_bytes"])
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    tok = Tekkenizer.from_file(os.path.join(DATA, "tekken_240911.json"))
    ids = tok.encode("Grüße, 世界! 123", bos=False, eos=False)
    assert b"".join(tekken.token_bytes(i) for i in ids) == "Grüße, 世界! 123".encode()


def test_sentencepiece_vocabulary_bytes() -> None:
    import sentencepiece as spm

    path = os.path.join(DATA, "tokenizer.model.v1")
    v = Vocabulary.from_sentencepiece(path)
    sp = spm.SentencePieceProcessor(model_file=path)
    assert v.vocab_size == sp.get_piece_size() and v.eos_ids == [sp.eos_id()]
    text = "Hello wörld 😀 ∮"
    ids = sp.encode(text)
    got = b"".join(v.token_bytes(i) for i in ids)
    assert got.decode("utf-8").lstrip(" ") == text  # the metaspace's leading space
    assert any(sp.is_byte(i) for i in ids)  # byte fallback really used


def test_tokenizer_json_byte_level_and_metaspace() -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {"a": 0, "b": 1, "Ġ": 2, "Ã": 3, "©": 4, "Ġa": 5, "ab": 6}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[("Ġ", "a"), ("a", "b")]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>"])
    v = Vocabulary.from_tokenizer_json(tok.to_str())
    assert v.eos_ids == [7]
    assert [v.token_bytes(i) for i in range(8)] == [
        b"a",
        b"b",
        b" ",
        b"\xc3",
        b"\xa9",
        b" a",
        b"ab",
        None,
    ]
    sp_style = {
        "model": {"type": "BPE", "vocab": {"<s>": 0, "</s>": 1, "<0xC3>": 2, "▁hi": 3, "x": 4}},
        "decoder": {"type": "Sequence", "decoders": [{"type": "ByteFallback"}]},
        "added_tokens": [
            {"id": 0, "content": "<s>", "special": True},
            {"id": 1, "content": "</s>", "special": True},
        ],
    }
    v2 = Vocabulary.from_tokenizer_json(sp_style, vocab_size=8)
    assert v2.vocab_size == 8 and v2.eos_ids == [1]
    assert [v2.token_bytes(i) for i in range(6)] == [None, None, b"\xc3", b" hi", b"x", None]


def test_all_valid_strings_are_reachable_token_by_token(tekken: Vocabulary) -> None:
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    tok = Tekkenizer.from_file(os.path.join(DATA, "tekken_240911.json"))
    cases = {
        r"\d{4}-\d{2}-\d{2}": ["2024-01-31", "1999-12-01"],
        r"[a-z0-9._%+-]+@[a-z0-9.-]+\.[a-z]{2,}": ["john.doe@example.com"],
        r'"([^"\\]|\\.)*"': ['"hello \\"wörld\\" 😀"'],
        r"(red|green|blue|yellow)( (red|green|blue|yellow))*": ["green blue red"],
    }
    for pattern, texts in cases.items():
        g = RegexGrammar(tekken, pattern)
        for text in texts:
            m = Matcher(g)
            for t in tok.encode(text, bos=False, eos=False):
                assert t in set(m.allowed_tokens().tolist())
                assert m.accept_token(t)
            assert m.is_accepting() and m.accept_token(2) and m.is_terminated()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_apply_token_bitmask_cuda_matches_cpu() -> None:
    rng = np.random.default_rng(1)
    bm = rng.integers(-(2**31), 2**31, size=(4, 5), dtype=np.int64).astype(np.int32)
    logits = torch.randn(4, 150)
    ref = apply_token_bitmask(logits.clone(), bm)
    out = apply_token_bitmask(logits.cuda(), torch.from_numpy(bm).cuda())
    assert out.is_cuda and torch.equal(out.cpu(), ref)
    with pytest.raises(NoAllowedTokens):
        apply_token_bitmask(torch.randn(1, 40, device="cuda"), np.zeros((1, 2), np.int32))


def test_apply_token_bitmask_1d_logits() -> None:
    logits = torch.zeros(40)
    bm = np.zeros((1, 2), dtype=np.int32)
    bm[0, 1] = 1 << 3  # token 35 only
    apply_token_bitmask(logits, bm)
    assert torch.isfinite(logits).nonzero().flatten().tolist() == [35]


def test_tokenizer_json_unigram_equals_sentencepiece() -> None:
    """The SentencePiece 32k model rebuilt as a `tokenizers` Unigram with byte fallback and
    the metaspace: tokenizer.json parsing gives the same bytes as the sentencepiece path."""
    import sentencepiece as spm
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    path = os.path.join(DATA, "tokenizer.model.v1")
    sp = spm.SentencePieceProcessor(model_file=path)
    pieces = [(sp.id_to_piece(i), sp.get_score(i)) for i in range(sp.get_piece_size())]
    tok = Tokenizer(models.Unigram(pieces, unk_id=sp.unk_id(), byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Sequence([decoders.Metaspace(), decoders.ByteFallback()])
    tok.add_special_tokens([AddedToken(sp.id_to_piece(i), special=True) for i in (0, 1, 2)])
    a = Vocabulary.from_tokenizer_json(tok.to_str())
    b = Vocabulary.from_sentencepiece(path)
    assert a.vocab_size == b.vocab_size and a.eos_ids == b.eos_ids == [2]
    assert all(a.token_bytes(i) == b.token_bytes(i) for i in range(b.vocab_size))


def test_bitmask_layout_matches_xgrammar_kernel(tekken: Vocabulary) -> None:
    """Our bitmask is xgrammar's layout: its in-place kernel masks what ours masks."""
    import xgrammar as xgr

    m = Matcher(RegexGrammar(tekken, r"[0-9]+(\.[0-9]+)?"))
    bm = torch.zeros(1, (tekken.vocab_size + 31) // 32, dtype=torch.int32)
    m.fill_next_token_bitmask(bm)
    logits = torch.randn(1, tekken.vocab_size)
    ours = apply_token_bitmask(logits.clone(), bm)
    theirs = logits.clone()
    xgr.apply_token_bitmask_inplace(theirs, bm)
    assert torch.equal(ours, theirs)


def test_bitmask_layout_and_helpers_match_llguidance(tekken: Vocabulary) -> None:
    """llguidance's helpers (per framework) agree with ours: shapes, allocation, and the
    in-place kernels mask exactly what ours mask."""
    import llguidance.numpy as lnp
    import llguidance.torch as ltorch

    from specdec.constrain import numpy as snp
    from specdec.constrain import torch as storch

    v = tekken.vocab_size
    assert snp.get_bitmask_shape(3, v) == tuple(lnp.get_bitmask_shape(3, v))
    assert np.array_equal(snp.allocate_token_bitmask(2, v), lnp.allocate_token_bitmask(2, v))
    assert torch.equal(storch.allocate_token_bitmask(2, v), ltorch.allocate_token_bitmask(2, v))
    m = Matcher(RegexGrammar(tekken, r"[a-z]+ [0-9]{2}"))
    bm = storch.allocate_token_bitmask(1, v)
    m.fill_next_token_bitmask(bm)
    logits = torch.randn(1, v)
    ours, theirs = logits.clone(), logits.clone()
    storch.apply_token_bitmask_inplace(ours, bm)
    ltorch.apply_token_bitmask_inplace(theirs, bm)
    assert torch.equal(ours, theirs)
    ours_np, theirs_np = logits.numpy().copy(), logits.numpy().copy()
    snp.apply_token_bitmask_inplace(ours_np, bm.numpy())
    lnp.apply_token_bitmask_inplace(theirs_np, bm.numpy())
    assert np.array_equal(ours_np, theirs_np)


def test_edge_languages() -> None:
    v = Vocabulary.from_bytes([b"a", b"b", None], eos_ids=[2])
    # Only the empty string: EOS at once, nothing else.
    m = Matcher(RegexGrammar(v, ""))
    assert m.allowed_tokens().tolist() == [2] and m.is_accepting()
    # The empty language: nothing at all, and the logits step says so.
    m = Matcher(RegexGrammar(v, r"[^\x00-\x{10FFFF}]"))
    assert m.allowed_tokens().tolist() == [] and not m.accept_token(2)
    bm = allocate_token_bitmask(1, 3)
    m.fill_next_token_bitmask(bm)
    with pytest.raises(NoAllowedTokens):
        apply_token_bitmask(torch.zeros(1, 3), bm)
    # Optional text: EOS or "a".
    assert Matcher(RegexGrammar(v, "(?:)|a")).allowed_tokens().tolist() == [0, 2]
