"""Fuzzing of every Python entry point with hypothesis: random shapes, dtypes, NaN/inf, huge and
negative ids, non-contiguous, read-only and wrong-device arrays, lists and junk objects.

The rule checked for every input: the call either succeeds or raises a ``SpecdecError``; any
other exception is a crash, a call slower than the deadline a hang, and a refusal must leave
the object it was called on unchanged.

``python tests/fuzz.py --examples 1000000`` (``make fuzz``) runs each entry point that many
times and prints a table; ``tests/test_fuzz.py`` runs a short version in CI.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import hypothesis.extra.numpy as hnp
import numpy as np
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import specdec
from specdec.errors import SpecdecError

torch.set_num_threads(1)

# -- inputs ----------------------------------------------------------------------------------
DTYPES = [np.float32, np.float64, np.int64, np.int32, np.uint64, np.int8, np.bool_]
SPECIAL_FLOATS = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e30, -1e30, -1e-30]
SPECIAL_INTS = [0, 1, -1, 2**31 - 1, 2**31, -(2**31), 2**40, -(2**40), 2**62, 7]


def elements(dtype: Any) -> st.SearchStrategy[Any]:
    d = np.dtype(dtype)
    if d.kind == "f":
        return st.one_of(st.sampled_from(SPECIAL_FLOATS), st.floats(-50, 0, width=32))
    if d.kind == "b":
        return st.booleans()
    info = np.iinfo(d)
    ints = [x for x in SPECIAL_INTS if info.min <= x <= info.max]
    return st.one_of(st.sampled_from(ints), st.integers(max(info.min, -3), min(info.max, 40)))


@st.composite
def arrays(
    draw: st.DrawFn, ndim: int | None = None, dtypes: list[Any] | None = None, max_side: int = 6
) -> Any:
    """An array-like as a caller might pass it: numpy of any dtype and rank (often the
    expected one), sometimes non-contiguous, read-only, a torch tensor (maybe on the meta
    device), a nested list, or junk."""
    nd = draw(st.integers(0, 3)) if ndim is None or draw(st.integers(0, 9)) == 0 else ndim
    dtype = draw(st.sampled_from(dtypes or DTYPES))
    shape = draw(hnp.array_shapes(min_dims=nd, max_dims=nd, min_side=0, max_side=max_side))
    a = draw(hnp.arrays(dtype, shape, elements=elements(dtype)))
    kind = draw(st.integers(0, 11))
    if kind == 0 and a.ndim:
        a = np.repeat(a, 2, axis=-1)[..., ::2]  # non-contiguous view
    elif kind == 1:
        a.flags.writeable = False
    elif kind == 2:
        return torch.from_numpy(np.array(a)) if a.dtype != np.uint64 else a
    elif kind == 3:
        return torch.empty(a.shape, device="meta")
    elif kind == 4:
        return a.tolist()
    elif kind == 5:
        return draw(st.sampled_from([None, "x", 3, 2.5, object(), b"\x00"]))
    return a


@st.composite
def marginals(draw: st.DrawFn, ndim: int = 2) -> tuple[Any, Any]:
    """Well-formed marginals (float32 log-probs sorted per row, some -inf; distinct int64 ids
    per row) about half the time, else with one corruption a caller might make."""
    lead = draw(st.lists(st.integers(0, 3), min_size=ndim - 1, max_size=ndim - 1))
    k = draw(st.integers(0, 8))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    lp = -np.sort(rng.exponential(2.0, size=(*lead, k)), axis=-1).astype(np.float32)
    lp[rng.random(lp.shape) < 0.1] = -np.inf
    lp = -np.sort(-lp, axis=-1)
    ids = np.argsort(rng.random((*lead, max(k, 1)) if k else (*lead, 0)), axis=-1)[..., :k]
    ids = ids.astype(np.int64) + draw(st.sampled_from([0, 0, 100, 2**20]))
    corruption = draw(st.integers(0, 15))
    if corruption == 0 and lp.size:
        lp.flat[draw(st.integers(0, lp.size - 1))] = draw(st.sampled_from(SPECIAL_FLOATS))
    elif corruption == 1 and ids.size:
        ids.flat[draw(st.integers(0, ids.size - 1))] = draw(st.sampled_from(SPECIAL_INTS))
    elif corruption == 2:
        lp = lp.astype(draw(st.sampled_from([np.float64, np.float16, np.int64])))
    elif corruption == 3:
        ids = ids.astype(draw(st.sampled_from([np.int32, np.uint64, np.float32, np.int8])))
    elif corruption == 4 and lp.ndim:
        lp = lp[..., ::-1]  # unsorted and non-contiguous
    elif corruption == 5:
        lp.flags.writeable = False
        ids.flags.writeable = False
    elif corruption == 6:
        ids = ids[..., : max(k - 1, 0)]  # shape mismatch
    elif corruption == 7:
        return lp.tolist(), ids.tolist()
    elif corruption == 8 and ids.shape[-1] > 1:
        ids[..., 1] = ids[..., 0]  # duplicate ids in a row
    elif corruption == 9:
        return torch.from_numpy(lp.copy()), torch.from_numpy(ids.copy())
    return lp, ids


def sorted_marginals(lp: np.ndarray) -> np.ndarray:
    return -np.sort(-lp, axis=-1) if lp.ndim and lp.dtype.kind == "f" else lp


ints = st.one_of(st.sampled_from(SPECIAL_INTS), st.integers(-3, 50))
junk = st.sampled_from([None, "3", 2.5, float("nan"), True, [1], object()])
maybe_int = st.one_of(ints, ints, ints, junk)


# -- the runner ------------------------------------------------------------------------------
@dataclass
class Tally:
    inputs: int = 0
    accepted: int = 0
    refused: int = 0
    crashes: list[str] = field(default_factory=list)
    hangs: int = 0


def guarded(tally: Tally, call: Callable[[], object], deadline: float) -> bool:
    """Run one input; True when it was accepted. Crashes (non-SpecdecError exceptions) and
    hangs are recorded, not raised, so a long run reports them all."""
    tally.inputs += 1
    t0 = time.perf_counter()
    try:
        call()
        ok = True
        tally.accepted += 1
    except SpecdecError as e:
        ok = False
        tally.refused += 1
        if not str(e):
            tally.crashes.append(f"{type(e).__name__} with an empty message")
    except Exception as e:  # noqa: BLE001 - any other exception is what we are looking for
        ok = False
        if len(tally.crashes) < 20:
            tally.crashes.append(f"{type(e).__name__}: {str(e)[:200]}")
    if time.perf_counter() - t0 > deadline:
        tally.hangs += 1
    return ok


# -- entry points ------------------------------------------------------------------------------
small = st.one_of(st.integers(0, 40), st.integers(0, 40), maybe_int)


def fuzz_build_ddtree(t: Tally, deadline: float) -> Callable[..., None]:
    @given(
        st.one_of(marginals(), st.tuples(arrays(2), arrays(2))),
        small,
        st.one_of(st.none(), st.none(), st.floats(allow_nan=True), junk),
        st.one_of(st.integers(-1, 9), maybe_int),
    )
    def run(m: tuple[Any, Any], budget: Any, min_lp: Any, root: Any) -> None:
        lp, ids = m
        guarded(
            t,
            lambda: specdec.build_ddtree(lp, ids, budget, min_logprob=min_lp, root_token=root),
            deadline,
        )

    return run


def fuzz_build_ddtree_batch(t: Tally, deadline: float) -> Callable[..., None]:
    @given(
        marginals(3),
        st.one_of(small, arrays(1, [np.int64])),
        st.one_of(st.none(), arrays(1, [np.int64])),
    )
    def run(m: tuple[Any, Any], budgets: Any, roots: Any) -> None:
        lp, ids = m
        guarded(
            t, lambda: specdec.build_ddtree_batch(lp, ids, budgets, root_tokens=roots), deadline
        )

    return run


def fuzz_ddtree_from_logits(t: Tally, deadline: float) -> Callable[..., None]:
    logits = st.one_of(
        hnp.arrays(
            np.float32,
            hnp.array_shapes(min_dims=2, max_dims=3, max_side=5),
            elements=st.floats(-20, 20, width=32),
        ),
        arrays(2, [np.float32, np.float64, np.int64]),
    )

    @given(
        logits,
        st.one_of(small, st.lists(small, max_size=3)),
        st.one_of(st.floats(0.1, 4), st.floats(allow_nan=True), junk),
    )
    def run(logits: Any, budget: Any, temperature: Any) -> None:
        x = (
            torch.from_numpy(np.array(logits))
            if isinstance(logits, np.ndarray) and logits.dtype != np.uint64
            else logits
        )
        guarded(t, lambda: specdec.ddtree_from_logits(x, budget, temperature=temperature), deadline)

    return run


def fuzz_tree_from_branches(t: Tally, deadline: float) -> Callable[..., None]:
    branch = st.lists(st.one_of(ints, ints, junk), max_size=5)

    @given(st.one_of(st.lists(branch, max_size=5), junk), maybe_int)
    def run(branches: Any, root: Any) -> None:
        guarded(t, lambda: specdec.tree_from_branches(branches, root_token=root), deadline)

    return run


def fuzz_draft_tree(t: Tally, deadline: float) -> Callable[..., None]:
    """Trees from arrays given from outside, then every verifier-contract method."""

    @st.composite
    def tree_arrays(draw: st.DrawFn) -> tuple[Any, Any, Any, Any]:
        """A valid tree's arrays (maybe with trailing padding) half the time, else junk."""
        if draw(st.booleans()):
            return (
                draw(arrays(1, [np.int64])),
                draw(arrays(1, [np.int32, np.int64])),
                draw(st.one_of(st.none(), arrays(1, [np.int32]))),
                draw(st.one_of(st.none(), arrays(1, [np.float64]))),
            )
        n = draw(st.integers(1, 12))
        parents = [-1] + [draw(st.integers(0, i - 1)) for i in range(1, n)]
        parents += [-1] * draw(st.integers(0, 3))
        if draw(st.integers(0, 4)) == 0:  # one broken link
            parents[draw(st.integers(0, len(parents) - 1))] = draw(st.sampled_from(SPECIAL_INTS))
        tokens = draw(st.lists(st.integers(0, 20), min_size=len(parents), max_size=len(parents)))
        return np.array(tokens), np.array(parents, dtype=np.int64), None, None

    @given(tree_arrays(), small, small)
    def run(arrays4: tuple[Any, Any, Any, Any], prefix: Any, budget: Any) -> None:
        tokens, parents, depths, lps = arrays4
        box: list[Any] = []
        if guarded(
            t, lambda: box.append(specdec.DraftTree(tokens, parents, depths, lps)), deadline
        ):
            tree = box[0]
            snapshot = (tree.tokens.copy(), tree.parents.copy(), tree.depths.copy())
            for call in (
                lambda: tree.attention_mask(prefix),
                lambda: tree.position_ids(prefix),
                lambda: tree.retrieve_indices(),
                lambda: tree.padded(budget),
                lambda: tree.with_root(prefix),
                lambda: tree.path_to(budget),
                lambda: (tree.first_child, tree.next_sibling),
                lambda: specdec.walk(tree, tokens),
            ):
                guarded(t, call, deadline)
            assert all(
                np.array_equal(a, b)
                for a, b in zip(snapshot, (tree.tokens, tree.parents, tree.depths), strict=True)
            )

    return run


def fuzz_walk(t: Tally, deadline: float) -> Callable[..., None]:
    """Walks of built trees with random choices, and of trees whose arrays a caller edited."""

    @given(
        st.integers(1, 30),
        st.integers(0, 5),
        arrays(1, [np.int64, np.int32, np.float32]),
        st.lists(st.tuples(st.integers(0, 40), ints), max_size=3),
        arrays(2, [np.int64]),
    )
    def run(
        budget: int, seed: int, chosen: Any, edits: list[tuple[int, int]], chosen2: Any
    ) -> None:
        rng = np.random.default_rng(seed)
        lp = -np.sort(np.abs(rng.normal(size=(4, 5))).astype(np.float32), axis=-1)
        ids = np.tile(np.arange(5), (4, 1))
        tree = specdec.build_ddtree(lp, ids, budget, root_token=0)
        for node, value in edits:  # edit the numpy arrays after the build
            if node < tree.num_nodes:
                tree.parents[node] = np.int32(np.clip(value, -(2**31), 2**31 - 1))
        guarded(t, lambda: specdec.walk(tree, chosen), deadline)
        guarded(t, lambda: specdec.walk_batch([tree], chosen2), deadline)

    return run


# Each operation's argument kinds (required ones in capitals, optional ones lower case): a call
# with the wrong number of arguments is a programming error Python reports itself, so the
# fuzzer always passes a valid count, each argument well-typed most of the time.
KV_OPS = {
    "allocate": "SN",
    "allocate_tokens": "STk",
    "allocate_cached_prefix": "STk",
    "append_slots": "SNt",
    "reserve_tree": "SN",
    "commit": "SAt",
    "rollback": "S",
    "fork": "SS",
    "free": "S",
    "truncate": "SN",
    "slot_mapping": "SNN",
    "reorder": "LL",
    "reserve_tree_batch": "QC",
    "append_slots_batch": "QC",
    "commit_batch": "QAOt",
    "free_batch": "Q",
    "allocate_batch": "QC",
    "fork_batch": "QQ",
}
KIND = {
    "s": st.integers(0, 6),
    "n": st.integers(0, 9),
    "t": hnp.arrays(np.int64, st.integers(0, 9), elements=st.integers(0, 5)),
    "k": st.integers(0, 3),
    "a": hnp.arrays(np.int64, st.integers(0, 4), elements=st.integers(0, 6), unique=True).map(
        np.sort
    ),
    "l": st.lists(st.integers(0, 6), max_size=4),
    "q": hnp.arrays(np.uint64, st.integers(0, 4), elements=st.integers(0, 6)),
    "c": hnp.arrays(np.int64, st.integers(0, 4), elements=st.integers(0, 6)),
    "o": hnp.arrays(np.int64, st.integers(0, 5), elements=st.integers(0, 6)).map(np.sort),
}


def kv_arg(kind: str) -> st.SearchStrategy[Any]:
    bad = st.one_of(ints, arrays(1, [np.int64, np.uint64, np.int32, np.float64], max_side=4), junk)
    return st.integers(0, 7).flatmap(lambda r: bad if r == 0 else KIND[kind.lower()])


def kv_call(name: str) -> st.SearchStrategy[tuple[str, list[Any]]]:
    kinds = KV_OPS[name]
    required = [k for k in kinds if k.isupper()]
    optional = [k for k in kinds if k.islower()]
    return st.integers(0, len(optional)).flatmap(
        lambda n: st.tuples(
            st.just(name), st.tuples(*[kv_arg(k) for k in required + optional[:n]]).map(list)
        )
    )


def kv_snapshot(m: specdec.BlockManager) -> tuple[Any, ...]:
    seqs = sorted(m.sequences())
    lens = [(m.seq_len(s).committed, m.seq_len(s).tentative) for s in seqs]
    tables = [m.block_table(s).tolist() for s in seqs]
    return (
        seqs,
        lens,
        tables,
        m.refcounts().tolist(),
        m.free_queue().tolist(),
        m.num_cached_blocks(),
    )


def fuzz_block_manager(t: Tally, deadline: float) -> Callable[..., None]:
    """Random operation sequences with random (often bad) arguments; every refusal leaves the
    manager exactly as it was, and the invariants hold after every call."""
    op = st.sampled_from(sorted(KV_OPS)).flatmap(kv_call)

    @given(st.integers(1, 12), st.sampled_from([1, 2, 4]), st.booleans(), st.lists(op, max_size=12))
    def run(blocks: int, block_size: int, caching: bool, ops: list[tuple[str, list[Any]]]) -> None:
        m = specdec.BlockManager(blocks, block_size, caching)
        for name, args in ops:
            before = kv_snapshot(m)
            method = getattr(m, name)
            if not guarded(t, lambda method=method, args=args: method(*args), deadline):
                assert kv_snapshot(m) == before, f"refused {name}{tuple(args)} changed the manager"
            m.check_invariants()

    return run


def fuzz_vocabulary(t: Tally, deadline: float) -> Callable[..., None]:
    token = st.one_of(st.binary(max_size=4), st.none(), st.none(), junk)

    @given(
        st.lists(token, max_size=12),
        st.lists(maybe_int, max_size=3),
        st.one_of(st.none(), maybe_int),
    )
    def run(tokens: list[Any], eos: list[Any], size: Any) -> None:
        guarded(
            t, lambda: specdec.Vocabulary.from_bytes(tokens, eos_ids=eos, vocab_size=size), deadline
        )

    return run


VOCAB = specdec.Vocabulary.from_bytes(
    [b"a", b"b", b"ab", b"1", b"{", b"}", b'"', b" ", b"\xc3", b"\xa9", None], eos_ids=[10]
)
PATTERN = st.text(alphabet='ab1{}" .*+?|()[]^$\\-é', max_size=10)


def fuzz_regex(t: Tally, deadline: float) -> Callable[..., None]:
    @given(
        st.one_of(PATTERN, junk), st.one_of(st.none(), maybe_int), st.one_of(st.none(), maybe_int)
    )
    def run(pattern: Any, size_limit: Any, cache_bytes: Any) -> None:
        guarded(
            t,
            lambda: specdec.RegexGrammar(
                VOCAB, pattern, size_limit=size_limit, cache_bytes=cache_bytes
            ),
            deadline,
        )

    return run


GRAMMARS = [VOCAB.regex(p) for p in ("a+b?", '"[ab1 ]*"', "(ab|1)*", "\\{[ab]*\\}")]


def fuzz_matcher(t: Tally, deadline: float) -> Callable[..., None]:
    """Matcher operations with random tokens, rows and buffers; a refusal changes nothing."""
    buffers = arrays(2, [np.int32, np.int32, np.int64, np.uint8], max_side=3)
    op = st.tuples(
        st.sampled_from(["accept_token", "accept_tokens", "rollback", "fill", "fork", "reset"]),
        maybe_int,
        buffers,
        st.lists(maybe_int, max_size=3),
    )

    @given(st.sampled_from(range(len(GRAMMARS))), st.lists(op, max_size=10))
    def run(g: int, ops: list[tuple[str, Any, Any, list[Any]]]) -> None:
        m = specdec.Matcher(GRAMMARS[g])
        for name, x, buf, xs in ops:
            state = (m._m.state, m.num_accepted, m.is_terminated())
            if (
                not guarded(t, partial(matcher_op, m, name, x, buf, xs), deadline)
                and name != "accept_tokens"
            ):
                assert (m._m.state, m.num_accepted, m.is_terminated()) == state, name

    return run


def matcher_op(m: specdec.Matcher, name: str, x: Any, buf: Any, xs: list[Any]) -> object:
    if name == "accept_token":
        return m.accept_token(x)
    if name == "accept_tokens":
        return m.accept_tokens(xs)
    if name == "rollback":
        return m.rollback(x)
    if name == "fill":
        return m.fill_next_token_bitmask(buf, x if isinstance(x, int) else 0)
    return m.fork() if name == "fork" else m.reset()


def fuzz_tree_masks(t: Tally, deadline: float) -> Callable[..., None]:
    """Tree masks and the grammar-aware builder over random trees, marginals and buffers."""

    @given(
        st.sampled_from(range(len(GRAMMARS))),
        st.lists(st.lists(st.integers(-1, 12), max_size=3), max_size=4),
        arrays(2, [np.int32, np.int64], max_side=3),
        maybe_int,
        arrays(2, [np.float32]),
        arrays(2, [np.int64]),
        maybe_int,
        st.integers(0, 2),
    )
    def run(
        g: int,
        branches: list[list[int]],
        buf: Any,
        offset: Any,
        lp: Any,
        ids: Any,
        budget: Any,
        padding: int,
    ) -> None:
        m = specdec.Matcher(GRAMMARS[g])
        box: list[Any] = []
        if guarded(
            t, lambda: box.append(specdec.tree_from_branches(branches, root_token=0)), deadline
        ):
            tree = box[0].padded(box[0].num_drafted + padding) if padding else box[0]
            rows = specdec.allocate_token_bitmask(tree.num_nodes + 1, VOCAB.vocab_size)
            guarded(t, lambda: specdec.fill_tree_bitmask(m, tree, rows), deadline)
            guarded(t, lambda: specdec.fill_tree_bitmask(m, tree, buf, offset), deadline)
        if isinstance(lp, np.ndarray):
            lp = sorted_marginals(lp)
        guarded(t, lambda: specdec.build_ddtree_constrained(lp, ids, budget, m), deadline)
        assert m.num_accepted == 0

    return run


def fuzz_apply_bitmask(t: Tally, deadline: float) -> Callable[..., None]:
    @given(
        arrays(2, [np.float32, np.float64, np.int64], max_side=40),
        arrays(2, [np.int32, np.int32, np.int64], max_side=3),
        st.booleans(),
        st.one_of(st.none(), st.lists(maybe_int, max_size=2)),
    )
    def run(logits: Any, bitmask: Any, as_torch: bool, indices: Any) -> None:
        from specdec.constrain import numpy as cnp

        if as_torch and isinstance(logits, np.ndarray) and logits.dtype != np.uint64:
            x = torch.from_numpy(np.array(logits))
            guarded(t, lambda: specdec.apply_token_bitmask(x, bitmask), deadline)
        else:
            guarded(
                t,
                lambda: cnp.apply_token_bitmask_inplace(logits, bitmask, indices=indices),
                deadline,
            )

    return run


def tiny_target() -> specdec.models.LlamaModel:
    from specdec.models import LlamaConfig, LlamaModel

    cfg = LlamaConfig(
        vocab_size=12,
        hidden_size=8,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=8,
        max_position_embeddings=32,
    )
    return LlamaModel(cfg).init_random(0)


def fuzz_verifier(t: Tally, deadline: float) -> Callable[..., None]:
    """Verify steps of random trees (built, padded, edited) on dense and paged caches; a
    refused step leaves the cache as it was."""
    from specdec.cache import PagedKVPool
    from specdec.verify import Greedy, Sampling, Verifier

    target = tiny_target()
    rules = [Greedy(), Sampling(temperature=0.8, top_k=3)]

    @given(
        st.lists(st.lists(st.integers(-2, 14), max_size=3), max_size=4),
        maybe_int,
        st.integers(0, 3),
        st.booleans(),
        st.integers(0, 1),
        st.lists(st.integers(0, 11), max_size=20),
    )
    def run(
        branches: list[list[int]],
        root: Any,
        padding: int,
        paged: bool,
        rule: int,
        prompt: list[int],
    ) -> None:
        ver = Verifier(target, rules[rule], generator=torch.Generator().manual_seed(0))
        if paged:
            cache: Any = PagedKVPool(1, 1, 4, num_blocks=6, block_size=4).sequence()
        else:
            cache = target.new_cache(24)
        if prompt:
            guarded(t, lambda: ver.prefill(prompt, cache), deadline)
        box: list[Any] = []
        if not guarded(
            t, lambda: box.append(specdec.tree_from_branches(branches, root_token=root)), deadline
        ):
            return
        tree = box[0].padded(box[0].num_drafted + padding) if padding else box[0]
        before = cache.committed_len
        if not guarded(t, lambda: ver.step(tree, cache), deadline):
            assert cache.committed_len == before and cache.pending == 0

    return run


ENTRY_POINTS: dict[str, Callable[[Tally, float], Callable[..., None]]] = {
    "build_ddtree": fuzz_build_ddtree,
    "build_ddtree_batch": fuzz_build_ddtree_batch,
    "ddtree_from_logits": fuzz_ddtree_from_logits,
    "tree_from_branches": fuzz_tree_from_branches,
    "DraftTree + contract": fuzz_draft_tree,
    "walk / walk_batch": fuzz_walk,
    "BlockManager": fuzz_block_manager,
    "Vocabulary": fuzz_vocabulary,
    "RegexGrammar": fuzz_regex,
    "Matcher": fuzz_matcher,
    "tree masks + constrained build": fuzz_tree_masks,
    "apply bitmask": fuzz_apply_bitmask,
    "Verifier.step": fuzz_verifier,
}


def run_entry_point(name: str, examples: int, seed: int, deadline: float = 5.0) -> Tally:
    tally = Tally()
    test = ENTRY_POINTS[name](tally, deadline)
    configured = settings(
        max_examples=examples,
        database=None,
        deadline=None,  # hangs are timed per call by `guarded`
        derandomize=seed == 0,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )(test)
    if seed:
        configured = __import__("hypothesis").seed(seed)(configured)
    configured()
    return tally


def main(argv: list[str] | None = None) -> int:
    # Casting -inf or NaN to ints in the generated inputs warns; the inputs are meant to be bad.
    warnings.simplefilter("ignore")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--examples", type=int, default=1000, help="hypothesis examples per entry point"
    )
    parser.add_argument("--seed", type=int, default=0, help="0: derandomized")
    parser.add_argument("--only", action="append", help="entry point names (default: all)")
    args = parser.parse_args(argv)
    names = args.only or list(ENTRY_POINTS)
    print(f"fuzzing {len(names)} entry points, {args.examples} examples each, seed {args.seed}")
    print("\n| entry point | examples | calls | accepted | refused | crashes | hangs | seconds |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    failed = False
    for name in names:
        t0 = time.perf_counter()
        tally = run_entry_point(name, args.examples, args.seed)
        dt = time.perf_counter() - t0
        cells = [name, args.examples, tally.inputs, tally.accepted, tally.refused]
        cells += [len(tally.crashes), tally.hangs, f"{dt:.0f}"]
        print("| " + " | ".join(map(str, cells)) + " |", flush=True)
        for c in tally.crashes:
            print(f"    crash: {c}")
        failed |= bool(tally.crashes or tally.hangs)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
