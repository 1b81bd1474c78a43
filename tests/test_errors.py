"""The error promise, module by module: every bad input a public entry point can get raises a
``SpecdecError`` (a ``SpecdecTypeError`` for wrong types, also a ``TypeError``), names what
was wrong, and leaves the object it was called on unchanged."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import specdec
from specdec import errors
from specdec.cache import BlockManager, DenseKVCache, PagedKVCache, PagedKVPool
from specdec.constrain import numpy as cnp
from specdec.constrain import torch as ctorch
from specdec.decode import SpeculativeGenerator, autoregressive_generate, beam_search
from specdec.draft import DraftRequest, ModelDrafter
from specdec.models import LlamaConfig, LlamaModel, load_checkpoint
from specdec.testing import RandomDrafter
from specdec.tree import DDTreeShape, batch_tree_inputs
from specdec.verify import Greedy, Sampling, Verifier, tree_attention

Case = tuple[str, Callable[[], object], type[errors.SpecdecError]]

F32 = np.float32


def check(cases: list[Case]) -> None:
    """Each call raises its class, which is a SpecdecError, with a message."""
    wrong = []
    for what, call, cls in cases:
        try:
            call()
        except errors.SpecdecError as e:
            if not isinstance(e, cls) or not str(e):
                wrong.append(f"{what}: {type(e).__name__}({e}), expected {cls.__name__}")
        except Exception as e:  # noqa: BLE001 - the point is to report any other exception
            wrong.append(f"{what}: {type(e).__name__}({e}) is not a SpecdecError")
        else:
            wrong.append(f"{what}: no error")
    assert not wrong, "\n".join(wrong)


def test_every_error_class_is_a_specdec_error_and_a_builtin() -> None:
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, errors.SpecdecError)
        if cls is not errors.SpecdecError:
            assert issubclass(cls, (ValueError, TypeError)), name
    assert issubclass(errors.SpecdecTypeError, TypeError)
    assert issubclass(errors.KVCacheError, ValueError)


def marginals(depth: int = 3, k: int = 4) -> tuple[np.ndarray, np.ndarray]:
    lp = np.log(np.full((depth, k), 1.0 / k, dtype=F32))
    ids = np.tile(np.arange(k, dtype=np.int64), (depth, 1))
    return lp, ids


# -- tree ------------------------------------------------------------------------------------
def test_tree_bad_inputs() -> None:
    lp, ids = marginals()
    tree = specdec.build_ddtree(lp, ids, 6, root_token=1)
    before = (tree.tokens.copy(), tree.parents.copy())
    unsorted = lp.copy()
    unsorted[0, 0] = -10.0
    cases: list[Case] = [
        (
            "float64 logprobs",
            lambda: specdec.build_ddtree(lp.astype(np.float64), ids, 4),
            errors.SpecdecTypeError,
        ),
        (
            "float ids",
            lambda: specdec.build_ddtree(lp, ids.astype(F32), 4),
            errors.SpecdecTypeError,
        ),
        ("1-D logprobs", lambda: specdec.build_ddtree(lp[0], ids, 4), errors.TreeError),
        ("shape mismatch", lambda: specdec.build_ddtree(lp, ids[:, :2], 4), errors.TreeError),
        ("NaN", lambda: specdec.build_ddtree(np.full_like(lp, np.nan), ids, 4), errors.TreeError),
        ("unsorted", lambda: specdec.build_ddtree(unsorted, ids, 4), errors.TreeError),
        ("budget 0", lambda: specdec.build_ddtree(lp, ids, 0), errors.TreeError),
        ("budget str", lambda: specdec.build_ddtree(lp, ids, "4"), errors.SpecdecTypeError),  # type: ignore[arg-type]
        ("budget bool", lambda: specdec.build_ddtree(lp, ids, True), errors.SpecdecTypeError),
        (
            "root str",
            lambda: specdec.build_ddtree(lp, ids, 4, root_token="x"),
            errors.SpecdecTypeError,
        ),  # type: ignore[arg-type]
        ("root huge", lambda: specdec.build_ddtree(lp, ids, 4, root_token=2**40), errors.TreeError),
        (
            "min_prob NaN",
            lambda: specdec.build_ddtree(lp, ids, 4, min_prob=float("nan")),
            errors.TreeError,
        ),
        ("min_prob > 1", lambda: specdec.build_ddtree(lp, ids, 4, min_prob=1.5), errors.TreeError),
        (
            "min_prob < 0",
            lambda: specdec.build_ddtree_batch(lp[None], ids[None], 4, min_prob=-0.1),
            errors.TreeError,
        ),
        (
            "min_prob a log",
            lambda: specdec.ddtree_from_logits(torch.zeros(2, 4), 4, min_prob=-2.0),
            errors.TreeError,
        ),
        (
            "min_prob None",
            lambda: specdec.build_ddtree(lp, ids, 4, min_prob=None),
            errors.SpecdecTypeError,
        ),  # type: ignore[arg-type]
        (
            "huge id",
            lambda: specdec.build_ddtree(lp, np.full_like(ids, 2**40), 4),
            errors.TreeError,
        ),
        ("negative id", lambda: specdec.build_ddtree(lp, -ids - 1, 4), errors.TreeError),
        (
            "batch budgets",
            lambda: specdec.build_ddtree_batch(lp[None], ids[None], [1, 2]),
            errors.TreeError,
        ),
        (
            "batch budget str",
            lambda: specdec.build_ddtree_batch(lp[None], ids[None], "a"),
            errors.SpecdecTypeError,
        ),  # type: ignore[arg-type]
        (
            "branches of floats",
            lambda: specdec.tree_from_branches([[1.5]]),
            errors.SpecdecTypeError,
        ),  # type: ignore[list-item]
        ("branches not lists", lambda: specdec.tree_from_branches(3), errors.SpecdecTypeError),  # type: ignore[arg-type]
        ("logits numpy", lambda: specdec.ddtree_from_logits(lp, 4), errors.SpecdecTypeError),  # type: ignore[arg-type]
        (
            "logits int",
            lambda: specdec.ddtree_from_logits(torch.zeros(2, 3, dtype=torch.long), 4),
            errors.SpecdecTypeError,
        ),
        ("logits 1-D", lambda: specdec.ddtree_from_logits(torch.zeros(3), 4), errors.TreeError),
        (
            "temperature 0",
            lambda: specdec.ddtree_from_logits(torch.zeros(2, 3), 4, temperature=0.0),
            errors.TreeError,
        ),
        (
            "temperature str",
            lambda: specdec.ddtree_from_logits(torch.zeros(2, 3), 4, temperature="1"),
            errors.SpecdecTypeError,
        ),  # type: ignore[arg-type]
        (
            "budget list short",
            lambda: specdec.ddtree_from_logits(torch.zeros(2, 2, 3), [4]),
            errors.TreeError,
        ),
        ("prefix negative", lambda: tree.position_ids(-1), errors.TreeError),
        ("prefix float", lambda: tree.attention_mask(1.5), errors.SpecdecTypeError),  # type: ignore[arg-type]
        ("mask kind", lambda: tree.attention_mask(0, "float"), errors.TreeError),  # type: ignore[arg-type]
        ("pad too small", lambda: tree.padded(2), errors.TreeError),
        ("pad negative", lambda: tree.padded(-1), errors.TreeError),
        ("pad huge", lambda: tree.padded(2**40), errors.TreeError),
        ("root negative", lambda: tree.with_root(-5), errors.TreeError),
        ("path_to out of range", lambda: tree.path_to(99), errors.TreeError),
        ("tree arrays cycle", lambda: specdec.DraftTree([0, 1, 2], [-1, 2, 1]), errors.TreeError),
        ("tree arrays lengths", lambda: specdec.DraftTree([0, 1], [-1]), errors.TreeError),
        (
            "tree arrays depths",
            lambda: specdec.DraftTree([0, 1], [-1, 0], [0, 5]),
            errors.TreeError,
        ),
        ("tree tokens str", lambda: specdec.DraftTree(["a"], [-1]), errors.SpecdecTypeError),
        ("padding then real", lambda: specdec.DraftTree([0, 1, 2], [-1, -1, 0]), errors.TreeError),
        ("walk short", lambda: specdec.walk(tree, [1]), errors.TreeError),
        (
            "walk float",
            lambda: specdec.walk(tree, np.zeros(tree.num_nodes)),
            errors.SpecdecTypeError,
        ),
        ("walk not a tree", lambda: specdec.walk([1, 2], [1, 2]), errors.SpecdecTypeError),  # type: ignore[arg-type]
        (
            "walk_batch rows",
            lambda: specdec.walk_batch([tree], np.zeros((2, 9), np.int64)),
            errors.TreeError,
        ),
        ("batch prefix", lambda: batch_tree_inputs([tree], [-1]), errors.VerifyError),
        ("batch budget", lambda: batch_tree_inputs([tree], [0], budget=1), errors.VerifyError),
        ("batch not trees", lambda: batch_tree_inputs([object()], [0]), errors.SpecdecTypeError),  # type: ignore[list-item]
        ("shape budget", lambda: DDTreeShape(0), errors.ConfigError),
        ("shape min_prob", lambda: DDTreeShape(4, min_prob=1.5), errors.ConfigError),
        ("shape name", lambda: specdec.tree_shape("beam", budget=4, depth=4), errors.ConfigError),
    ]
    check(cases)
    # A tree edited into a cycle after the build: the walk refuses instead of looping.
    edited = specdec.tree_from_branches([[4, 5]])
    edited.parents[2] = 2
    check([("edited parents", lambda: specdec.walk(edited, [4, 5, 0]), errors.TreeError)])
    assert np.array_equal(tree.tokens, before[0]) and np.array_equal(tree.parents, before[1])


# -- constrain -------------------------------------------------------------------------------
SMALL = [b"a", b"b", b"ab", b"1", b"2", None]


def test_constrain_bad_inputs() -> None:
    vocab = specdec.Vocabulary.from_bytes(SMALL, eos_ids=[5])
    grammar = vocab.regex("a+b")
    m = specdec.Matcher(grammar)
    assert m.accept_token(0)
    words = (vocab.vocab_size + 31) // 32
    bm = specdec.allocate_token_bitmask(2, vocab.vocab_size)
    tree = specdec.tree_from_branches([[0, 1]], root_token=0)
    lp, ids = marginals(2, 3)
    cases: list[Case] = [
        ("bad regex", lambda: vocab.regex("a("), errors.GrammarError),
        ("pattern not str", lambda: specdec.RegexGrammar(vocab, 3), errors.GrammarError),  # type: ignore[arg-type]
        (
            "size limit",
            lambda: specdec.RegexGrammar(vocab, "[ab]{30}", size_limit=10),
            errors.GrammarError,
        ),
        (
            "vocab entries",
            lambda: specdec.Vocabulary.from_bytes([1, 2], eos_ids=[0]),
            errors.SpecdecError,
        ),  # type: ignore[list-item]
        (
            "vocab eos",
            lambda: specdec.Vocabulary.from_bytes(SMALL, eos_ids=[99]),
            errors.GrammarError,
        ),
        (
            "token json",
            lambda: specdec.Vocabulary.from_tokenizer_json({"model": {"type": "WordPiece"}}),
            errors.GrammarError,
        ),
        ("matcher of str", lambda: specdec.Matcher("a+"), errors.SpecdecTypeError),  # type: ignore[arg-type]
        ("token out of range", lambda: m.accept_token(99), errors.GrammarError),
        ("token negative", lambda: m.accept_token(-1), errors.GrammarError),
        ("token float", lambda: m.accept_token(1.0), errors.SpecdecTypeError),  # type: ignore[arg-type]
        ("tokens of str", lambda: m.accept_tokens(["a"]), errors.SpecdecTypeError),  # type: ignore[list-item]
        ("rollback too far", lambda: m.rollback(5), errors.GrammarError),
        ("rollback negative", lambda: m.rollback(-1), errors.GrammarError),
        (
            "bitmask int64",
            lambda: m.fill_next_token_bitmask(bm.astype(np.int64)),
            errors.SpecdecTypeError,
        ),
        ("bitmask 1-D", lambda: m.fill_next_token_bitmask(bm[0]), errors.GrammarError),
        ("bitmask list", lambda: m.fill_next_token_bitmask([[0]]), errors.SpecdecTypeError),  # type: ignore[arg-type]
        (
            "bitmask narrow",
            lambda: m.fill_next_token_bitmask(np.zeros((1, 0), np.int32)),
            errors.GrammarError,
        ),
        (
            "bitmask strided",
            lambda: m.fill_next_token_bitmask(np.zeros((2, 2 * words), np.int32)[:, ::2]),
            errors.GrammarError,
        ),
        (
            "bitmask read-only",
            lambda: m.fill_next_token_bitmask(_readonly(bm)),
            errors.GrammarError,
        ),
        (
            "bitmask meta",
            lambda: m.fill_next_token_bitmask(
                torch.zeros(1, words, dtype=torch.int32, device="meta")
            ),
            errors.GrammarError,
        ),
        ("row out of range", lambda: m.fill_next_token_bitmask(bm, 2), errors.GrammarError),
        ("row negative", lambda: m.fill_next_token_bitmask(bm, -1), errors.GrammarError),
        ("row float", lambda: m.fill_next_token_bitmask(bm, 0.0), errors.SpecdecTypeError),  # type: ignore[arg-type]
        (
            "batch rows twice",
            lambda: specdec.fill_next_token_bitmask_batch([m, m], bm, [0, 0]),
            errors.GrammarError,
        ),
        (
            "batch not matchers",
            lambda: specdec.fill_next_token_bitmask_batch([1], bm),
            errors.SpecdecTypeError,
        ),  # type: ignore[list-item]
        ("tree rows", lambda: specdec.fill_tree_bitmask(m, tree, bm), errors.GrammarError),
        (
            "tree not a tree",
            lambda: specdec.fill_tree_bitmask(m, [0, 1], bm),
            errors.SpecdecTypeError,
        ),  # type: ignore[arg-type]
        ("tree offset", lambda: specdec.fill_tree_bitmask(m, tree, bm, -1), errors.GrammarError),
        (
            "constrained budget",
            lambda: specdec.build_ddtree_constrained(lp, ids, 0, m),
            errors.TreeError,
        ),
        (
            "constrained matcher",
            lambda: specdec.build_ddtree_constrained(lp, ids, 2, "m"),
            errors.SpecdecTypeError,
        ),  # type: ignore[arg-type]
        ("shape vocab", lambda: specdec.get_bitmask_shape(1, 0), errors.GrammarError),
        (
            "np logits int",
            lambda: cnp.apply_token_bitmask_inplace(np.zeros((1, 6), np.int32), bm[:1]),
            errors.SpecdecTypeError,
        ),
        (
            "np rows",
            lambda: cnp.apply_token_bitmask_inplace(np.zeros((3, 6), F32), bm),
            errors.GrammarError,
        ),
        (
            "np none allowed",
            lambda: cnp.apply_token_bitmask_inplace(
                np.zeros((1, 6), F32), np.zeros((1, 1), np.int32)
            ),
            errors.NoAllowedTokens,
        ),
        (
            "torch none allowed",
            lambda: ctorch.apply_token_bitmask_inplace(
                torch.zeros(1, 6), np.zeros((1, 1), np.int32)
            ),
            errors.NoAllowedTokens,
        ),
        (
            "torch bitmask float",
            lambda: ctorch.apply_token_bitmask_inplace(torch.zeros(1, 6), torch.zeros(1, 1)),
            errors.SpecdecTypeError,
        ),
        (
            "torch indices",
            lambda: ctorch.apply_token_bitmask_inplace(torch.zeros(1, 6), bm[:1], indices=[3]),
            errors.GrammarError,
        ),
        ("reset list", lambda: specdec.reset_token_bitmask([[0]]), errors.SpecdecTypeError),
    ]
    state, n = m._m.state, m.num_accepted
    check(cases)
    assert (m._m.state, m.num_accepted) == (state, n), "a refusal changed the matcher"


def _readonly(a: np.ndarray) -> np.ndarray:
    r = a.copy()
    r.flags.writeable = False
    return r


# -- cache -----------------------------------------------------------------------------------
def test_cache_bad_inputs() -> None:
    m = BlockManager(4, 4)
    m.allocate(0, 3)
    snapshot = (m.refcounts().tolist(), m.free_queue().tolist(), m.block_table(0).tolist())
    dense = DenseKVCache(1, 1, 2, 8)
    pool = PagedKVPool(1, 1, 2, num_blocks=4, block_size=4)
    paged = PagedKVCache(pool)
    k = torch.zeros(1, 1, 2)
    cases: list[Case] = [
        ("blocks 0", lambda: BlockManager(0, 4), errors.KVCacheError),
        ("blocks str", lambda: BlockManager("4", 4), errors.SpecdecTypeError),  # type: ignore[arg-type]
        ("seq negative", lambda: m.allocate(-1, 1), errors.KVCacheError),
        ("seq float", lambda: m.allocate(1.0, 1), errors.SpecdecTypeError),  # type: ignore[arg-type]
        ("unknown seq", lambda: m.free(7), errors.UnknownSequence),
        ("out of blocks", lambda: m.allocate(1, 100), errors.OutOfBlocks),
        ("seq exists", lambda: m.allocate(0, 1), errors.KVCacheError),
        ("slot range", lambda: m.slot_mapping(0, 2, 5), errors.KVCacheError),
        ("commit outside step", lambda: m.commit(0, np.array([0])), errors.KVCacheError),
        ("tokens list", lambda: m.allocate_tokens(2, [1, 2]), errors.SpecdecTypeError),  # type: ignore[arg-type]
        ("tokens float", lambda: m.allocate_tokens(2, np.zeros(2)), errors.SpecdecTypeError),
        (
            "batch counts",
            lambda: m.reserve_tree_batch(np.array([0], np.uint64), np.array([-1])),
            errors.KVCacheError,
        ),
        (
            "batch lengths",
            lambda: m.allocate_batch(np.array([5, 6], np.uint64), np.array([1])),
            errors.KVCacheError,
        ),
        ("reorder parents", lambda: m.reorder([0], [3]), errors.KVCacheError),
        ("reorder str", lambda: m.reorder(["a"], [0]), errors.SpecdecTypeError),  # type: ignore[list-item]
        ("fork to self", lambda: m.fork(0, 0), errors.KVCacheError),
        ("double free", lambda: (m.allocate(3, 0), m.free(3), m.free(3)), errors.DoubleFree),
        ("dense dims", lambda: DenseKVCache(0, 1, 2, 8), errors.VerifyError),
        ("begin 0", lambda: dense.begin(0), errors.VerifyError),
        ("begin str", lambda: dense.begin("2"), errors.SpecdecTypeError),  # type: ignore[arg-type]
        ("begin too many", lambda: dense.begin(9), errors.VerifyError),
        ("append outside step", lambda: dense.append(0, k, k), errors.VerifyError),
        (
            "append not tensors",
            lambda: (dense.begin(1), dense.append(0, [1], [1])),
            errors.SpecdecTypeError,
        ),  # type: ignore[arg-type]
        ("commit floats", lambda: (dense.begin(1), dense.commit([0.5])), errors.SpecdecTypeError),
        ("commit order", lambda: (dense.begin(2), dense.commit([1, 0])), errors.VerifyError),
        ("commit range", lambda: (dense.begin(2), dense.commit([2])), errors.VerifyError),
        ("commit strings", lambda: (dense.begin(1), dense.commit(["a"])), errors.SpecdecTypeError),
        ("truncate long", lambda: (dense.rollback(), dense.truncate(3)), errors.VerifyError),
        ("paged begin 0", lambda: paged.begin(0), errors.VerifyError),
        ("paged out of blocks", lambda: paged.begin(100), errors.OutOfBlocks),
        ("paged truncate", lambda: paged.truncate(-1), errors.VerifyError),
        ("paged fork in step", lambda: (paged.begin(1), paged.fork()), errors.KVCacheError),
    ]
    check(cases)
    paged.rollback()
    m.check_invariants()
    assert 3 not in m and 1 not in m
    after = (m.refcounts().tolist(), m.free_queue().tolist(), m.block_table(0).tolist())
    assert after == snapshot, "a refusal changed the block manager"


# -- verify, decode, draft, models ----------------------------------------------------------
def test_inputs_found_by_make_fuzz() -> None:
    # Each raised something other than a SpecdecError (OverflowError, TypeError, IndexError,
    # ValueError, NotImplementedError, RuntimeError) before; found by tests/fuzz.py variants.
    lp, ids = marginals()
    tree = specdec.build_ddtree(lp, ids, 6, root_token=1)
    vocab = specdec.Vocabulary.from_bytes(SMALL, eos_ids=[5])
    m = specdec.Matcher(vocab.regex("a+b"))
    bm = specdec.allocate_token_bitmask(1, vocab.vocab_size)
    logits = torch.zeros(1, 6)
    kv = BlockManager(4, 4)
    big, tiny = 2**64 - 1, -(2**63) - 1  # just outside int64
    cases: list[Case] = [
        ("budget past int64", lambda: specdec.build_ddtree(lp, ids, big), errors.TreeError),
        (
            "root past int64",
            lambda: specdec.build_ddtree(lp, ids, 4, root_token=tiny),
            errors.TreeError,
        ),
        (
            "min_prob past float",
            lambda: specdec.build_ddtree(lp, ids, 4, min_prob=10**400),
            errors.TreeError,
        ),
        (
            "batch budget past int64",
            lambda: specdec.build_ddtree_batch(lp[None], ids[None], big),
            errors.TreeError,
        ),
        ("branch token past int64", lambda: specdec.tree_from_branches([[big]]), errors.TreeError),
        ("branch of an int", lambda: specdec.tree_from_branches([3]), errors.SpecdecTypeError),
        (
            "0-D budget array",
            lambda: specdec.ddtree_from_logits(logits, np.array([2])[0:1].reshape(())),
            errors.SpecdecTypeError,
        ),
        (
            "int logprobs",
            lambda: specdec.DraftTree([1, 2], [-1, 0], None, np.array([0, -1])),
            errors.SpecdecTypeError,
        ),
        ("prefix past int64", lambda: tree.position_ids(big), errors.TreeError),
        ("mask prefix past int64", lambda: tree.attention_mask(big), errors.TreeError),
        ("padded past int64", lambda: tree.padded(big), errors.TreeError),
        ("mask kind of an array", lambda: tree.attention_mask(2, np.array([])), errors.TreeError),  # type: ignore[arg-type]
        ("walk_batch of a float", lambda: specdec.walk_batch(2.5, [[0]]), errors.SpecdecTypeError),  # type: ignore[arg-type]
        (
            "eos 0-D array",
            lambda: specdec.Vocabulary.from_bytes(SMALL, eos_ids=np.array(5)),
            errors.SpecdecTypeError,
        ),
        (
            "vocab_size past int64",
            lambda: specdec.Vocabulary.from_bytes(SMALL, [5], big),
            errors.GrammarError,
        ),
        (
            "cache_bytes past int64",
            lambda: specdec.RegexGrammar(vocab, "a", cache_bytes=big),
            errors.GrammarError,
        ),
        ("token past int64", lambda: m.accept_token(big), errors.GrammarError),
        ("tokens of a bool", lambda: m.accept_tokens(True), errors.SpecdecTypeError),  # type: ignore[arg-type]
        ("row past int64", lambda: m.fill_next_token_bitmask(bm, big), errors.GrammarError),
        ("row under int64", lambda: m.fill_next_token_bitmask(bm, tiny), errors.GrammarError),
        (
            "KV seq of a meta tensor",
            lambda: kv.allocate(torch.zeros(1, dtype=torch.int64, device="meta"), 1),
            errors.SpecdecTypeError,
        ),
        (
            "indices of an int",
            lambda: cnp.apply_token_bitmask_inplace(np.zeros((1, 6)), bm, indices=0),
            errors.SpecdecTypeError,
        ),  # type: ignore[arg-type]
        (
            "torch indices of an int",
            lambda: ctorch.apply_token_bitmask_inplace(logits, bm, indices=0),
            errors.SpecdecTypeError,
        ),  # type: ignore[arg-type]
        (
            "0-D torch logits",
            lambda: specdec.apply_token_bitmask(torch.tensor(1.0), bm),
            errors.GrammarError,
        ),
        (
            "meta logits",
            lambda: specdec.apply_token_bitmask(torch.zeros(1, 6, device="meta"), bm),
            errors.SpecdecTypeError,
        ),
        (
            "object bitmask",
            lambda: specdec.apply_token_bitmask(logits, bm.astype(object)),
            errors.SpecdecTypeError,
        ),
        (
            "logits needing grad",
            lambda: specdec.apply_token_bitmask(torch.zeros(1, 6, requires_grad=True), bm * 0 + 1),
            errors.SpecdecTypeError,
        ),
    ]
    state = (m._m.state, m.num_accepted)
    check(cases)
    assert (m._m.state, m.num_accepted) == state, "a refusal changed the matcher"
    assert (logits == 0).all() and kv.sequences() == []
    # An int threshold is a number: 1 keeps only paths of probability 1 (none here).
    assert specdec.build_ddtree(lp, ids, 4, min_prob=1).num_drafted == 0
    # A negative-stride numpy bitmask is read through a copy, like a read-only one.
    x = torch.zeros(1, 40)
    wide = np.stack([np.array([1, 0], dtype=np.int32)[::-1]])  # allows only token 32
    specdec.apply_token_bitmask(x, wide)
    assert torch.isfinite(x[0]).nonzero().flatten().tolist() == [32]


def test_verify_root_token_of_a_wrong_type_is_refused(model: LlamaModel) -> None:
    # int(root_token) raised ValueError/TypeError for junk before (found by make fuzz).
    ver = Verifier(model)
    cache = model.new_cache(16)
    tree = specdec.tree_from_branches([[1, 2]])
    for bad, cls in [
        ("6x", errors.SpecdecTypeError),
        ({}, errors.SpecdecTypeError),
        (-1, errors.VerifyError),
    ]:
        with pytest.raises(cls):
            ver.step(tree, cache, root_token=bad)  # type: ignore[arg-type]
    assert cache.committed_len == 0 and cache.pending == 0


@pytest.fixture(scope="module")
def model() -> LlamaModel:
    cfg = LlamaConfig(
        vocab_size=16, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, intermediate_size=16, max_position_embeddings=64,
    )  # fmt: skip
    return LlamaModel(cfg).init_random(0)


def test_verify_bad_inputs(model: LlamaModel) -> None:
    ver = Verifier(model)
    cache = model.new_cache(16)
    tree = specdec.tree_from_branches([[1, 2]], root_token=3)
    q = torch.zeros(1, 2, 3, 4)
    kv = torch.zeros(1, 1, 3, 4)
    mask = torch.ones(3, 6, dtype=torch.bool)
    cases: list[Case] = [
        ("rule str", lambda: Verifier(model, "greedy"), errors.SpecdecTypeError),  # type: ignore[arg-type]
        ("target object", lambda: Verifier(object()), errors.SpecdecTypeError),  # type: ignore[arg-type]
        ("temperature 0", lambda: Sampling(temperature=0.0), errors.ConfigError),
        ("top_k float", lambda: Sampling(top_k=1.5), errors.SpecdecTypeError),  # type: ignore[arg-type]
        ("top_p", lambda: Sampling(top_p=2.0), errors.ConfigError),
        ("rule logits 1-D", lambda: Greedy().choose(torch.zeros(3)), errors.VerifyError),
        (
            "rule logits int",
            lambda: Greedy().choose(torch.zeros(1, 3, dtype=torch.long)),
            errors.SpecdecTypeError,
        ),
        (
            "rule logits NaN",
            lambda: Sampling().choose(torch.full((1, 3), float("nan"))),
            errors.VerifyError,
        ),
        ("step not a tree", lambda: ver.step([1, 2], cache), errors.SpecdecTypeError),  # type: ignore[arg-type]
        ("step not a cache", lambda: ver.step(tree, object()), errors.SpecdecTypeError),  # type: ignore[arg-type]
        (
            "step no root",
            lambda: ver.step(specdec.tree_from_branches([[1]]), cache),
            errors.VerifyError,
        ),
        (
            "step token range",
            lambda: ver.step(specdec.tree_from_branches([[99]], root_token=1), cache),
            errors.VerifyError,
        ),
        ("prefill empty", lambda: ver.prefill([], cache), errors.VerifyError),
        ("prefill floats", lambda: ver.prefill([1.5], cache), errors.SpecdecTypeError),
        ("batch caches", lambda: ver.step_batch([tree], []), errors.VerifyError),
        (
            "batch same cache",
            lambda: ver.step_batch([tree, tree], [cache, cache]),
            errors.VerifyError,
        ),
        (
            "attention q list",
            lambda: tree_attention([1], kv, kv, kv, kv, mask),
            errors.SpecdecTypeError,
        ),  # type: ignore[arg-type]
        (
            "attention mask dtype",
            lambda: tree_attention(q, kv, kv, kv, kv, mask.float()),
            errors.SpecdecTypeError,
        ),
        (
            "attention mask shape",
            lambda: tree_attention(q, kv, kv, kv, kv, mask[:, :2]),
            errors.VerifyError,
        ),
        (
            "forward token range",
            lambda: model(torch.tensor([99]), torch.tensor([0]), cache),
            errors.VerifyError,
        ),
        (
            "forward position range",
            lambda: model(torch.tensor([1]), torch.tensor([999]), cache),
            errors.VerifyError,
        ),
        (
            "forward float ids",
            lambda: model(torch.tensor([1.0]), torch.tensor([0]), cache),
            errors.SpecdecTypeError,
        ),
        (
            "forward cache",
            lambda: model(torch.tensor([1]), torch.tensor([0]), object()),
            errors.SpecdecTypeError,
        ),  # type: ignore[arg-type]
        (
            "forward cache layout",
            lambda: model(torch.tensor([1]), torch.tensor([0]), DenseKVCache(2, 1, 8, 8)),
            errors.VerifyError,
        ),
    ]
    check(cases)
    assert cache.committed_len == 0 and cache.pending == 0


def test_decode_and_draft_bad_inputs(model: LlamaModel) -> None:
    drafter = RandomDrafter(16)
    gen = SpeculativeGenerator(model, drafter, budget=4, max_depth=2)
    cases: list[Case] = [
        ("budget 0", lambda: SpeculativeGenerator(model, drafter, budget=0), errors.ConfigError),
        (
            "max_depth str",
            lambda: SpeculativeGenerator(model, drafter, max_depth="2"),
            errors.SpecdecTypeError,
        ),  # type: ignore[arg-type]
        (
            "tree shape",
            lambda: SpeculativeGenerator(model, drafter, strategy="beam"),
            errors.ConfigError,
        ),  # type: ignore[arg-type]
        ("drafter", lambda: SpeculativeGenerator(model, object()), errors.SpecdecTypeError),  # type: ignore[arg-type]
        ("prompt empty", lambda: gen.generate([], max_new_tokens=4), errors.VerifyError),
        (
            "prompt floats",
            lambda: gen.generate([1.5, 2.5], max_new_tokens=4),
            errors.SpecdecTypeError,
        ),
        ("prompt strings", lambda: gen.generate(["a"], max_new_tokens=4), errors.SpecdecTypeError),
        ("too long", lambda: gen.generate([1, 2], max_new_tokens=400), errors.VerifyError),
        (
            "ar prompt empty",
            lambda: autoregressive_generate(model, [], max_new_tokens=3),
            errors.VerifyError,
        ),
        (
            "ar too long",
            lambda: autoregressive_generate(model, [1, 2], max_new_tokens=400),
            errors.VerifyError,
        ),
        (
            "ar prompt past vocab",
            lambda: autoregressive_generate(model, [1, 16], max_new_tokens=3),
            errors.VerifyError,
        ),
        (
            "ar stop str",
            lambda: autoregressive_generate(model, [1], max_new_tokens=3, stop_tokens="x"),
            errors.SpecdecTypeError,
        ),  # type: ignore[arg-type]
        (
            "ar eos past vocab",
            lambda: autoregressive_generate(model, [1], max_new_tokens=3, eos_token_id=16),
            errors.ConfigError,
        ),
        (
            "ar constraint",
            lambda: autoregressive_generate(model, [1], max_new_tokens=3, constraint=3),
            errors.SpecdecTypeError,
        ),
        ("draft requests", lambda: drafter.draft([[1, 2]], 2), errors.SpecdecTypeError),  # type: ignore[list-item]
        ("draft depth", lambda: drafter.draft([DraftRequest([1])], 0), errors.ConfigError),
        ("draft none", lambda: ModelDrafter(model).draft([], 2), errors.ConfigError),
    ]
    check(cases)


def test_beam_search_bad_inputs(model: LlamaModel) -> None:
    def beams(prompts: Any = ([1, 2],), n: Any = 2, new: Any = 4, eos: Any = 3, **kw: Any) -> Any:
        return beam_search(model, prompts, num_beams=n, max_new_tokens=new, eos_token_id=eos, **kw)

    cases: list[Case] = [
        ("num_beams 0", lambda: beams(n=0), errors.ConfigError),
        ("num_beams float", lambda: beams(n=2.0), errors.SpecdecTypeError),
        ("return > beams", lambda: beams(num_return_sequences=3), errors.ConfigError),
        ("return 0", lambda: beams(num_return_sequences=0), errors.ConfigError),
        ("eos past vocab", lambda: beams(eos=16), errors.ConfigError),
        ("eos negative", lambda: beams(eos=-1), errors.ConfigError),
        ("eos list past vocab", lambda: beams(eos=[3, 99]), errors.ConfigError),
        ("eos str", lambda: beams(eos="3"), errors.SpecdecTypeError),
        ("past the context", lambda: beams(prompts=[list(range(1, 16)) * 5]), errors.ConfigError),
        ("new past the context", lambda: beams(new=64), errors.ConfigError),
        ("new -1", lambda: beams(new=-1), errors.ConfigError),
        ("new float", lambda: beams(new=2.0), errors.ConfigError),
        ("stop past vocab", lambda: beams(stop_tokens=[16]), errors.ConfigError),
        ("early stopping", lambda: beams(early_stopping="sometimes"), errors.ConfigError),
        ("early stopping 1", lambda: beams(early_stopping=1), errors.ConfigError),
        ("length penalty nan", lambda: beams(length_penalty=float("nan")), errors.ConfigError),
        ("length penalty inf", lambda: beams(length_penalty=float("inf")), errors.ConfigError),
        ("no prompts", lambda: beams(prompts=[]), errors.ConfigError),
        ("empty prompt", lambda: beams(prompts=[[]]), errors.VerifyError),
        ("prompt past vocab", lambda: beams(prompts=[[1, 99]]), errors.VerifyError),
        ("prompt str", lambda: beams(prompts="ab"), errors.SpecdecTypeError),
        ("processor", lambda: beams(logits_processors=[3]), errors.SpecdecTypeError),
        ("constraint", lambda: beams(constraint="[ab]+"), errors.SpecdecTypeError),
        ("block size", lambda: beams(block_size=0), errors.ConfigError),
    ]
    check(cases)
    pool, other = PagedKVPool(1, 1, 8, 8, 4), PagedKVPool(1, 1, 8, 8, 4)
    seq = pool.sequence()
    one, zero = torch.tensor([1]), torch.tensor([0])
    fp = model.forward_paged
    dense = DenseKVCache(1, 1, 8, 4)
    paged: list[Case] = [
        ("paged rows", lambda: fp(torch.tensor([1, 2]), zero, [seq]), errors.VerifyError),
        ("paged dense", lambda: fp(one, zero, [dense]), errors.SpecdecTypeError),  # type: ignore[list-item]
        ("paged token", lambda: fp(torch.tensor([16]), zero, [seq]), errors.VerifyError),
        ("paged position", lambda: fp(one, torch.tensor([64]), [seq]), errors.VerifyError),
        ("paged float ids", lambda: fp(one.float(), zero, [seq]), errors.SpecdecTypeError),
        ("decode other pool", lambda: other.begin_decode([seq]), errors.VerifyError),
        ("decode nothing", lambda: pool.begin_decode([]), errors.VerifyError),
        ("decode twice", lambda: pool.begin_decode([seq, seq]), errors.KVCacheError),
    ]
    check(paged)
    assert seq.committed_len == 0 and seq.pending == 0 and pool.manager.num_free_blocks() == 8


def test_models_bad_inputs(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    empty = tmp_path / "empty"
    empty.mkdir()
    cases: list[Case] = [
        (
            "heads",
            lambda: LlamaConfig(num_attention_heads=3, num_key_value_heads=2),
            errors.ConfigError,
        ),
        ("dims", lambda: LlamaConfig(hidden_size=0), errors.ConfigError),
        ("model type", lambda: LlamaConfig.from_hf({"model_type": "gpt2"}), errors.ConfigError),
        ("no config", lambda: load_checkpoint(empty), errors.CheckpointError),
        ("bad config", lambda: load_checkpoint(tmp_path), errors.ConfigError),
        ("hf target", lambda: _hf_target(object()), errors.SpecdecTypeError),
    ]
    check(cases)


def _hf_target(model: Any) -> object:
    from specdec.models.hf import HFTarget

    return HFTarget(model)


def test_grammar_limits_bad_values() -> None:
    vocab = specdec.Vocabulary.from_bytes(SMALL, eos_ids=[5])
    compilers: dict[str, Callable[..., object]] = {
        "json_schema": lambda **kw: vocab.json_schema({"type": "integer"}, **kw),
        "gbnf": lambda **kw: vocab.gbnf('root ::= "a"', **kw),
        "lark": lambda **kw: vocab.lark('start: "a"', **kw),
    }
    names = ["max_depth", "max_states", "max_symbols", "max_lexer_states", "size_limit"]
    cases: list[Case] = []
    for kind, compile_with in compilers.items():
        for name in [*names, "cache_bytes"]:
            bad: list[tuple[object, type[errors.SpecdecError]]] = [
                (-1, errors.GrammarError),
                (2**70, errors.GrammarError),
                ("3", errors.SpecdecTypeError),
                (2.0, errors.SpecdecTypeError),
                (True, errors.SpecdecTypeError),
            ]
            if name != "cache_bytes":  # a zero cache is allowed (masks recomputed)
                bad.append((0, errors.GrammarError))
            for value, cls in bad:
                cases.append(
                    (
                        f"{kind} {name}={value!r}",
                        lambda c=compile_with, n=name, v=value: c(**{n: v}),
                        cls,
                    )
                )
    for name in ["max_states", "size_limit"]:
        cases.append(
            (
                f"from_regex {name}=0",
                lambda n=name: specdec.CfgGrammar.from_regex(vocab, "a", **{n: 0}),
                errors.GrammarError,
            )
        )
    check(cases)
