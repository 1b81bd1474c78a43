"""Fuzzing of every Python entry point with hypothesis: random shapes, dtypes, NaN/inf, huge and
negative ids, non-contiguous, read-only and wrong-device arrays, lists and junk objects.

The rule checked for every input: the call either succeeds or raises a ``SpecdecError``; any
other exception is a crash, a call slower than the deadline a hang, and a refusal must leave
the object it was called on unchanged.

Hypothesis draws the structure of each example; each example is then called as drawn and as
distinct variants derived from it (``Mutator``), so that millions of inputs per entry point
take minutes rather than hours. ``python tests/fuzz.py --variants 64 --inputs 1000000``
(``make fuzz``) runs each entry point until it has made at least that many calls and prints a
table; ``tests/test_fuzz.py`` runs a short version in CI.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import hypothesis
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
    examples: int = 0
    inputs: int = 0
    accepted: int = 0
    refused: int = 0
    crash_count: int = 0
    crashes: list[str] = field(default_factory=list)  # the first 20, for the report
    hangs: int = 0
    slow: list[str] = field(default_factory=list)  # the first 20 hangs, for the report

    def start(self, seed: int) -> Mutator:
        """Count one drawn example; its variants come from the returned mutator."""
        self.examples += 1
        return Mutator(seed)

    def record_crash(self, what: str) -> None:
        self.crash_count += 1
        if len(self.crashes) < 20 and what not in self.crashes:
            self.crashes.append(what)


def guarded(
    tally: Tally,
    call: Callable[[], object],
    deadline: float,
    what: Callable[[], str] | None = None,
) -> bool:
    """Run one input; True when it was accepted. Crashes (non-SpecdecError exceptions) and
    hangs are recorded, not raised, so a long run reports them all; ``what`` describes the
    input for the report of a hang."""
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
            tally.record_crash(f"{type(e).__name__} with an empty message")
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # noqa: BLE001 - any other (a Rust panic is a BaseException)
        ok = False
        # Where: the innermost frame, then the innermost in specdec or this file.
        frames = traceback.extract_tb(e.__traceback__)
        ours = [f for f in frames if "specdec" in f.filename or "fuzz" in f.filename]
        place = " < ".join(
            f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno}"
            for f in {id(f): f for f in [frames[-1], *ours[-1:]]}.values()
        )
        tally.record_crash(f"{type(e).__name__} at {place}: {str(e)[:200]}")
    dt = time.perf_counter() - t0
    if dt > deadline:
        tally.hangs += 1
        if len(tally.slow) < 20:
            tally.slow.append(
                f"{dt:.1f} s: {what() if what else getattr(call, '__qualname__', '?')}"
            )
    return ok


# -- variants: many cheap inputs from one hypothesis example --------------------------------
# Hypothesis draws the structure of an example (a few ms each); each example is then called
# as drawn and as `variants - 1` distinct variants made with a `random.Random` seeded from the
# example (microseconds each), so a long run reaches millions of inputs per entry point.
FLOAT_DTYPES = [np.float16, np.float32, np.float64]
ALL_DTYPES = [*DTYPES, np.float16, np.uint8, np.int16, np.uint32]
TORCH_ODD = [torch.bfloat16, torch.float16, torch.complex64, torch.int16]
JUNK = [None, "3", "", 2.5, float("nan"), True, False, [1], [], (), {}, b"\x00", object()]


class Mutator:
    """Random variants of call arguments: array elements set to NaN/inf/huge/negative values,
    other dtypes, ranks and shapes, non-contiguous, read-only, torch (CPU, meta, bfloat16,
    requires-grad) and list forms; ints moved by one or to special values; strings, bytes and
    lists edited; any argument sometimes swapped for junk. Inputs are never changed in place."""

    def __init__(self, seed: int) -> None:
        self.r = random.Random(seed)

    def args(self, args: list[Any]) -> list[Any]:
        """A variant of an argument list: one argument changed, sometimes two or three."""
        out = list(args)
        if not out:
            return out
        for _ in range(1 if self.r.random() < 0.7 else self.r.randint(2, 3)):
            i = self.r.randrange(len(out))
            try:
                out[i] = self.value(out[i])
            except (ValueError, TypeError, RuntimeError, OverflowError):
                out[i] = self.r.choice(JUNK)  # a form numpy or torch cannot make: junk instead
        return out

    def value(self, x: Any) -> Any:
        r = self.r
        if r.random() < 0.03:
            return r.choice(JUNK)
        if isinstance(x, np.ndarray):
            return self.array(x)
        if isinstance(x, torch.Tensor):
            return self.tensor(x)
        if isinstance(x, bool):
            return r.choice([not x, int(x), None, np.bool_(x)])
        if isinstance(x, (int, np.integer)):
            return self.integer(int(x))
        if isinstance(x, (float, np.floating)):
            return self.floating(float(x))
        if isinstance(x, str):
            return self.text(x)
        if isinstance(x, bytes):
            return self.blob(x)
        if isinstance(x, (list, tuple)):
            return self.sequence(x)
        if x is None:
            return self.integer(r.randint(0, 8))
        return r.choice([self.integer(r.randint(0, 8)), None, [x], (x,)])

    def special_int(self) -> int:
        return self.r.choice(SPECIAL_INTS + [-2, 3, 2**63 - 1, -(2**63), 2**64 - 1, 2**24 + 1])

    def integer(self, x: int) -> Any:
        r = self.r
        k = r.randrange(12)
        if k < 4:
            return x + r.choice([-1, 1, -2, 2])
        if k < 6:
            return self.special_int()
        if k == 6:
            return x + r.randint(-100, 100)
        if k == 7:
            return -x - 1
        if k == 8:
            return r.choice([np.int64, np.int32, np.uint8, np.int8])(np.clip(x, -128, 127))
        if k == 9:
            return r.choice([float(x), str(x), np.float32(x), np.array(x), [x], None])
        if k == 10:
            return 2 ** r.randint(8, 70) * r.choice([1, -1])
        return r.randint(0, 64)

    def floating(self, x: float) -> Any:
        r = self.r
        k = r.randrange(6)
        if k < 2:
            return r.choice(SPECIAL_FLOATS)
        if k == 2:
            return x * r.uniform(-3, 3)
        if k == 3:
            return r.choice([np.float32(x), np.float16(x), int(x) if np.isfinite(x) else 0])
        if k == 4:
            return r.uniform(-60, 5)
        return r.choice([None, str(x), [x], np.array([x])])

    def text(self, s: str) -> Any:
        r = self.r
        alphabet = 'ab1{}" .*+?|()[]^$\\-é\x00\u2603{,}'
        k = r.randrange(8)
        i = r.randint(0, len(s))
        if k < 3:
            return s[:i] + r.choice(alphabet) + s[i:]
        if k < 5 and s:
            return s[:i] + s[i + 1 :]
        if k == 5 and s:
            return s[:i] + r.choice(alphabet) + s[i + 1 :]
        if k == 6:
            return s * r.randint(2, 4)
        return r.choice([s.encode(), s[::-1], s + "{" + str(r.randint(0, 2**20)) + "}", ""])

    def blob(self, b: bytes) -> Any:
        r = self.r
        k = r.randrange(5)
        if k < 2:
            return b + bytes([r.randrange(256)])
        if k == 2:
            return b[1:]
        if k == 3:
            return bytes([r.randrange(256)]) * r.randint(0, 3)
        return r.choice([None, b.decode("latin-1"), bytearray(b), list(b)])

    def sequence(self, xs: list[Any] | tuple[Any, ...]) -> Any:
        r = self.r
        out = list(xs)
        k = r.randrange(10)
        if k < 4 and out:
            i = r.randrange(len(out))
            out[i] = self.value(out[i])
        elif k == 4 and out:
            del out[r.randrange(len(out))]
        elif k == 5 and out:
            out.insert(r.randint(0, len(out)), r.choice(out))
        elif k == 6:
            out.insert(r.randint(0, len(out)), r.choice([self.special_int(), r.randint(0, 20)]))
        elif k == 7:
            r.shuffle(out)
        elif k == 8:
            try:
                return np.array(out)
            except ValueError:  # ragged
                return np.array(out, dtype=object)
        else:
            return tuple(out) if isinstance(xs, list) else list(out)
        return tuple(out) if isinstance(xs, tuple) else out

    def tensor(self, t: torch.Tensor) -> Any:
        r = self.r
        if t.device.type == "meta":
            return r.choice([torch.empty(t.shape[:-1]), None, t.reshape(-1), t.to(torch.int64)])
        k = r.randrange(8)
        t = t.detach()
        if k == 0:
            return t.to(r.choice(TORCH_ODD))
        if k == 1:
            return t.to(torch.float32).requires_grad_(True) if t.is_floating_point() else t.float()
        if k == 2:
            return torch.empty(t.shape, device="meta")
        if k == 3 and t.dim() >= 2:
            return t.transpose(0, 1)  # non-contiguous view
        a = (t.float() if t.dtype == torch.bfloat16 else t).numpy()
        if k == 4:
            return a.copy()
        v = self.array(a)
        if isinstance(v, np.ndarray) and v.dtype != np.uint64 and v.dtype != object:
            return torch.from_numpy(np.array(v))
        return v

    def array(self, a: np.ndarray) -> Any:
        r = self.r
        k = r.randrange(20)
        if k < 6 and a.size and a.dtype != object:
            b = a.copy()
            for _ in range(1 if r.random() < 0.7 else r.randint(2, 4)):
                self.poke(b, r.randrange(b.size))
            return b
        if k == 6:
            return a.astype(r.choice(ALL_DTYPES))
        if k == 7 and a.ndim:
            return np.repeat(a, 2, axis=-1)[..., ::2]  # non-contiguous view, same values
        if k == 8 and a.ndim:
            return a[..., ::-1]  # reversed: unsorted rows, negative strides
        if k == 9:
            b = a.copy()
            b.flags.writeable = False
            return b
        if k == 10:
            return r.choice([a[None], a.reshape(-1), a[0] if a.ndim and len(a) else a[None]])
        if k == 11 and a.ndim:
            return a[..., : r.randint(0, a.shape[-1])]
        if k == 12 and a.ndim:
            return np.concatenate([a, a[..., : r.randint(1, 3)]], axis=-1)
        if k == 13 and a.ndim >= 2:
            return a.T
        if k == 14 and a.dtype.kind == "f":
            return a * np.float32(r.uniform(0.25, 4)) + np.float32(r.uniform(-1, 1))
        if k == 15 and a.dtype.kind in "iu" and a.size:
            return a + a.dtype.type(r.choice([1, 2]))
        if k == 16:
            return a.tolist()
        if k == 17 and a.dtype not in (np.uint64, np.float16) and a.dtype != object:
            return torch.from_numpy(np.array(a))
        if k == 18 and a.size:
            b = a.copy().reshape(-1)
            r.shuffle(b)  # same values, another order
            return b.reshape(a.shape)
        return np.array(a.flat[0]) if a.size else a.reshape(*a.shape, 1)

    def poke(self, b: np.ndarray, i: int) -> None:
        """Set element ``i`` of ``b`` (a copy) to a value of its dtype a caller might pass."""
        r = self.r
        kind = b.dtype.kind
        if kind == "f":
            b.flat[i] = r.choice([*SPECIAL_FLOATS, r.uniform(-30, 1), b.flat[r.randrange(b.size)]])
        elif kind == "b":
            b.flat[i] = not b.flat[i]
        elif kind in "iu":
            info = np.iinfo(b.dtype)
            v = r.choice(
                [
                    self.special_int(),
                    int(b.flat[i]) + r.choice([-1, 1]),
                    r.randint(-2, 30),
                    int(b.flat[r.randrange(b.size)]),
                    info.max,
                    info.min,
                ]
            )
            b.flat[i] = min(max(v, info.min), info.max)


def fingerprint(x: Any) -> Any:
    """A hashable identity of an input (values, type, dtype, shape, strides, flags, device),
    so that the variants of an example are distinct calls."""
    if isinstance(x, np.ndarray):
        data = x.tobytes() if x.dtype != object else repr(x.tolist())
        return ("nd", x.dtype.str, x.shape, x.strides, x.flags.writeable, data)
    if isinstance(x, torch.Tensor):
        if x.device.type == "meta":
            return ("meta", str(x.dtype), tuple(x.shape))
        data = x.detach().reshape(-1).tolist()
        return ("pt", str(x.dtype), tuple(x.shape), x.stride(), x.requires_grad, repr(data))
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, *[fingerprint(y) for y in x])
    if isinstance(x, (int, float, str, bytes, bool, np.generic)) or x is None:
        return (type(x).__name__, repr(x))
    return (type(x).__name__,)  # other junk objects: one input per type


def fan(
    t: Tally,
    deadline: float,
    mut: Mutator,
    args: list[Any],
    call: Callable[..., object],
    n: int,
    state: Callable[[], object] | None = None,
    on_accept: Callable[[], None] | None = None,
) -> list[list[Any]]:
    """Call ``call(*args)`` and then ``call`` on distinct variants of ``args``, ``n`` calls in
    all. ``state``: a snapshot of the object the calls act on; a refusal must leave it equal.
    ``on_accept`` runs after each accepted call (e.g. to undo it). Returns the accepted
    argument lists."""
    seen: set[Any] = set()
    accepted: list[list[Any]] = []
    tries = 0
    while len(seen) < n and tries < 3 * n:
        tries += 1
        v = args if tries == 1 else mut.args(args)
        key = fingerprint(v)
        if key in seen:
            continue
        seen.add(key)
        before = state() if state is not None else None
        if guarded(t, lambda v=v: call(*v), deadline, lambda v=v: describe(call, v)):
            accepted.append(v)
            if on_accept is not None:
                on_accept()
        elif state is not None and state() != before:
            t.record_crash(f"a refused call changed the state: {describe(call, v)}")
    return accepted


def describe(call: Callable[..., object], args: list[Any]) -> str:
    return f"{getattr(call, '__qualname__', type(call).__name__)}{tuple(args)!r}"[:300]


# -- entry points ------------------------------------------------------------------------------
# Each factory takes the tally, the hang deadline and `n`, the calls made from one drawn
# example (the example as drawn, then distinct variants of it); the stateful ones (KV manager,
# matcher, verifier) fan out every operation of a drawn sequence.
small = st.one_of(st.integers(0, 40), st.integers(0, 40), maybe_int)
seeds = st.integers(0, 2**32 - 1)
Factory = Callable[[Tally, float, int], Callable[..., None]]


def fuzz_build_ddtree(t: Tally, deadline: float, n: int) -> Callable[..., None]:
    @given(
        st.one_of(marginals(), st.tuples(arrays(2), arrays(2))),
        small,
        st.one_of(st.just(0.0), st.floats(0, 1), st.floats(allow_nan=True), junk),
        st.one_of(st.integers(-1, 9), maybe_int),
        seeds,
    )
    def run(m: tuple[Any, Any], budget: Any, min_p: Any, root: Any, seed: int) -> None:
        def call(lp: Any, ids: Any, budget: Any, min_p: Any, root: Any, dup: Any) -> object:
            return specdec.build_ddtree(
                lp, ids, budget, min_prob=min_p, root_token=root, check_duplicates=dup
            )

        fan(t, deadline, t.start(seed), [*m, budget, min_p, root, True], call, n)

    return run


def fuzz_build_ddtree_batch(t: Tally, deadline: float, n: int) -> Callable[..., None]:
    @given(
        marginals(3),
        st.one_of(small, arrays(1, [np.int64])),
        st.one_of(st.none(), arrays(1, [np.int64])),
        seeds,
    )
    def run(m: tuple[Any, Any], budgets: Any, roots: Any, seed: int) -> None:
        def call(lp: Any, ids: Any, budgets: Any, min_p: Any, roots: Any, dup: Any) -> object:
            return specdec.build_ddtree_batch(
                lp, ids, budgets, min_prob=min_p, root_tokens=roots, check_duplicates=dup
            )

        fan(t, deadline, t.start(seed), [*m, budgets, 0.0, roots, True], call, n)

    return run


def fuzz_ddtree_from_logits(t: Tally, deadline: float, n: int) -> Callable[..., None]:
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
        seeds,
    )
    def run(logits: Any, budget: Any, temperature: Any, seed: int) -> None:
        x = (
            torch.from_numpy(np.array(logits))
            if isinstance(logits, np.ndarray) and logits.dtype != np.uint64
            else logits
        )

        def call(x: Any, budget: Any, temp: Any, min_p: Any, roots: Any) -> object:
            return specdec.ddtree_from_logits(
                x, budget, temperature=temp, min_prob=min_p, root_tokens=roots
            )

        fan(t, deadline, t.start(seed), [x, budget, temperature, 0.0, None], call, n)

    return run


def fuzz_tree_from_branches(t: Tally, deadline: float, n: int) -> Callable[..., None]:
    branch = st.lists(st.one_of(ints, ints, junk), max_size=5)

    @given(st.one_of(st.lists(branch, max_size=5), junk), maybe_int, seeds)
    def run(branches: Any, root: Any, seed: int) -> None:
        def call(branches: Any, root: Any) -> object:
            return specdec.tree_from_branches(branches, root_token=root)

        fan(t, deadline, t.start(seed), [branches, root], call, n)

    return run


def fuzz_draft_tree(t: Tally, deadline: float, n: int) -> Callable[..., None]:
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

    @given(tree_arrays(), small, small, seeds)
    def run(arrays4: tuple[Any, Any, Any, Any], prefix: Any, budget: Any, seed: int) -> None:
        mut = t.start(seed)
        trees: list[specdec.DraftTree] = []
        fan(
            t,
            deadline,
            mut,
            list(arrays4),
            lambda *a: trees.append(specdec.DraftTree(*a)),
            max(1, n // 4),
        )
        k = max(1, n // 16)
        for tree in trees[:2]:
            snapshot = (tree.tokens.copy(), tree.parents.copy(), tree.depths.copy())
            for call, args in (
                (tree.attention_mask, [prefix, "bool"]),
                (tree.position_ids, [prefix]),
                (tree.padded, [budget, 0]),
                (tree.with_root, [prefix]),
                (tree.path_to, [budget]),
                (partial(specdec.walk, tree), [arrays4[0]]),
            ):
                fan(t, deadline, mut, args, call, k)
            guarded(t, tree.retrieve_indices, deadline)
            guarded(t, lambda tree=tree: (tree.first_child, tree.next_sibling), deadline)
            arrays_now = (tree.tokens, tree.parents, tree.depths)
            if not all(np.array_equal(a, b) for a, b in zip(snapshot, arrays_now, strict=True)):
                t.record_crash("a contract method changed the tree")

    return run


def edit_tree(tree: specdec.DraftTree, node: int, value: int, which: int) -> None:
    """Edit a tree's numpy arrays in place after its build, as a careless caller might."""
    a = (tree.parents, tree.depths, tree.tokens)[which % 3]
    if 0 <= node < len(a):
        info = np.iinfo(a.dtype)
        a[node] = min(max(value, info.min), info.max)


def fuzz_walk(t: Tally, deadline: float, n: int) -> Callable[..., None]:
    """Walks of built trees with random choices, and of trees whose arrays a caller edited."""

    @given(
        st.integers(1, 30),
        st.integers(0, 5),
        arrays(1, [np.int64, np.int32, np.float32]),
        st.lists(st.tuples(st.integers(0, 40), ints), max_size=3),
        arrays(2, [np.int64]),
        seeds,
    )
    def run(
        budget: int,
        tree_seed: int,
        chosen: Any,
        edits: list[tuple[int, int]],
        chosen2: Any,
        seed: int,
    ) -> None:
        mut = t.start(seed)
        r = mut.r
        rng = np.random.default_rng(tree_seed)
        lp = -np.sort(np.abs(rng.normal(size=(4, 5))).astype(np.float32), axis=-1)
        ids = np.tile(np.arange(5), (4, 1))
        trees = []
        for i in range(4):
            tree = specdec.build_ddtree(lp, ids, budget, root_token=0)
            if i == 0:
                for node, value in edits:
                    edit_tree(tree, node, value, 0)
            elif i > 1:  # one more random edit of parents, depths or tokens
                node, value = r.randrange(tree.num_nodes + 1), mut.integer(r.randint(-1, 8))
                edit_tree(tree, node, value if isinstance(value, int) else -1, r.randrange(3))
            trees.append(tree)
        k = max(1, n // 24)
        for tree in trees:
            valid = np.array([r.randrange(6) for _ in range(tree.num_nodes)], dtype=np.int64)
            fan(t, deadline, mut, [tree, chosen], specdec.walk, k)
            fan(t, deadline, mut, [tree, valid], specdec.walk, k)
            fan(t, deadline, mut, [[tree], chosen2], specdec.walk_batch, k)
            fan(t, deadline, mut, [[tree, tree], np.stack([valid, valid])], specdec.walk_batch, k)

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


def manager_state(t: Tally, m: specdec.BlockManager) -> tuple[Any, ...]:
    """The manager's snapshot, its invariants checked first (a broken one is recorded)."""
    try:
        m.check_invariants()
    except Exception as e:  # noqa: BLE001 - reported like a crash
        t.record_crash(f"BlockManager invariants broken: {type(e).__name__}: {e}")
    return kv_snapshot(m)


def fuzz_block_manager(t: Tally, deadline: float, n: int) -> Callable[..., None]:
    """Random operation sequences with random (often bad) arguments and variants of each;
    every refusal leaves the manager exactly as it was, and the invariants hold throughout."""
    op = st.sampled_from(sorted(KV_OPS)).flatmap(kv_call)

    @given(
        st.integers(1, 12),
        st.sampled_from([1, 2, 4]),
        st.booleans(),
        st.lists(op, max_size=12),
        seeds,
    )
    def run(
        blocks: int, block_size: int, caching: bool, ops: list[tuple[str, list[Any]]], seed: int
    ) -> None:
        mut = t.start(seed)
        m = specdec.BlockManager(blocks, block_size, caching)
        for name, args in ops:
            fan(
                t,
                deadline,
                mut,
                args,
                getattr(m, name),
                max(1, n // 8),
                partial(manager_state, t, m),
            )
        manager_state(t, m)

    return run


def fuzz_vocabulary(t: Tally, deadline: float, n: int) -> Callable[..., None]:
    token = st.one_of(st.binary(max_size=4), st.none(), st.none(), junk)

    @given(
        st.lists(token, max_size=12),
        st.lists(maybe_int, max_size=3),
        st.one_of(st.none(), maybe_int),
        seeds,
    )
    def run(tokens: list[Any], eos: list[Any], size: Any, seed: int) -> None:
        def call(tokens: Any, eos: Any, size: Any) -> object:
            return specdec.Vocabulary.from_bytes(tokens, eos_ids=eos, vocab_size=size)

        fan(t, deadline, t.start(seed), [tokens, eos, size], call, n)

    return run


VOCAB = specdec.Vocabulary.from_bytes(
    [b"a", b"b", b"ab", b"1", b"{", b"}", b'"', b" ", b"\xc3", b"\xa9", None], eos_ids=[10]
)
PATTERN = st.text(alphabet='ab1{}" .*+?|()[]^$\\-é', max_size=10)


def fuzz_regex(t: Tally, deadline: float, n: int) -> Callable[..., None]:
    @given(
        st.one_of(PATTERN, junk),
        st.one_of(st.none(), maybe_int),
        st.one_of(st.none(), maybe_int),
        st.one_of(st.just(5.0), st.floats(allow_nan=True), junk),
        seeds,
    )
    def run(pattern: Any, size_limit: Any, cache_bytes: Any, ms: Any, seed: int) -> None:
        def call(vocab: Any, pattern: Any, limit: Any, cache: Any, ms: Any) -> object:
            return specdec.RegexGrammar(
                vocab, pattern, size_limit=limit, cache_bytes=cache, precompute_ms=ms
            )

        fan(t, deadline, t.start(seed), [VOCAB, pattern, size_limit, cache_bytes, ms], call, n)

    return run


GRAMMARS = [VOCAB.regex(p) for p in ("a+b?", '"[ab1 ]*"', "(ab|1)*", "\\{[ab]*\\}")]


def matcher_state(m: specdec.Matcher) -> tuple[Any, ...]:
    return (m._m.state, m.num_accepted, m.is_terminated())


def fuzz_matcher(t: Tally, deadline: float, n: int) -> Callable[..., None]:
    """Matcher operations with random tokens, rows and buffers, and variants of each; a
    refusal changes nothing (accept_tokens keeps the tokens accepted before a rejected one)."""
    buffers = arrays(2, [np.int32, np.int32, np.int64, np.uint8], max_side=3)
    op = st.tuples(
        st.sampled_from(["accept_token", "accept_tokens", "rollback", "fill", "fork", "reset"]),
        maybe_int,
        buffers,
        st.lists(maybe_int, max_size=3),
    )

    @given(st.sampled_from(range(len(GRAMMARS))), st.lists(op, max_size=10), seeds)
    def run(g: int, ops: list[tuple[str, Any, Any, list[Any]]], seed: int) -> None:
        mut = t.start(seed)
        m = specdec.Matcher(GRAMMARS[g])
        k = max(1, n // 8)
        for name, x, buf, xs in ops:
            state = partial(matcher_state, m)
            if name == "accept_token":
                fan(t, deadline, mut, [x], m.accept_token, k, state)
            elif name == "accept_tokens":
                fan(t, deadline, mut, [xs], m.accept_tokens, k)
            elif name == "rollback":
                fan(t, deadline, mut, [x], m.rollback, k, state)
            elif name == "fill":
                row = x if isinstance(x, int) else 0
                fan(t, deadline, mut, [buf, row], m.fill_next_token_bitmask, k, state)
            else:  # fork and reset take no argument: one call each
                guarded(t, m.fork if name == "fork" else m.reset, deadline)

    return run


def fuzz_tree_masks(t: Tally, deadline: float, n: int) -> Callable[..., None]:
    """Tree masks and the grammar-aware builder over random trees, marginals and buffers."""

    @given(
        st.sampled_from(range(len(GRAMMARS))),
        st.lists(st.lists(st.integers(-1, 12), max_size=3), max_size=4),
        arrays(2, [np.int32, np.int64], max_side=3),
        maybe_int,
        st.one_of(marginals(), st.tuples(arrays(2, [np.float32]), arrays(2, [np.int64]))),
        maybe_int,
        st.integers(0, 2),
        seeds,
    )
    def run(
        g: int,
        branches: list[list[int]],
        buf: Any,
        offset: Any,
        m2: tuple[Any, Any],
        budget: Any,
        padding: int,
        seed: int,
    ) -> None:
        mut = t.start(seed)
        m = specdec.Matcher(GRAMMARS[g])
        box: list[Any] = []
        k = max(1, n // 4)
        if guarded(
            t, lambda: box.append(specdec.tree_from_branches(branches, root_token=0)), deadline
        ):
            tree = box[0].padded(box[0].num_drafted + padding) if padding else box[0]
            rows = specdec.allocate_token_bitmask(tree.num_nodes + 1, VOCAB.vocab_size)
            fan(t, deadline, mut, [m, tree, rows, 0], specdec.fill_tree_bitmask, k)
            fan(t, deadline, mut, [m, tree, buf, offset], specdec.fill_tree_bitmask, k)
        lp, ids = m2
        if isinstance(lp, np.ndarray):
            lp = sorted_marginals(lp)
        fan(
            t,
            deadline,
            mut,
            [lp, ids, budget, m, 0, 0.0, True],
            specdec.build_ddtree_constrained,
            k,
        )
        if m.num_accepted != 0:
            t.record_crash("a tree mask or constrained build advanced the matcher")

    return run


def fuzz_apply_bitmask(t: Tally, deadline: float, n: int) -> Callable[..., None]:
    from specdec.constrain import numpy as cnp

    def apply_np(logits: Any, bitmask: Any, indices: Any, vocab_size: Any) -> object:
        cnp.apply_token_bitmask_inplace(logits, bitmask, indices=indices, vocab_size=vocab_size)
        return None

    @given(
        arrays(2, [np.float32, np.float64, np.int64], max_side=40),
        arrays(2, [np.int32, np.int32, np.int64], max_side=3),
        st.booleans(),
        st.one_of(st.none(), st.lists(maybe_int, max_size=2)),
        seeds,
    )
    def run(logits: Any, bitmask: Any, as_torch: bool, indices: Any, seed: int) -> None:
        mut = t.start(seed)
        if as_torch and isinstance(logits, np.ndarray) and logits.dtype != np.uint64:
            x = torch.from_numpy(np.array(logits))
            fan(t, deadline, mut, [x, bitmask], specdec.apply_token_bitmask, n)
        else:
            fan(t, deadline, mut, [logits, bitmask, indices, None], apply_np, n)

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


def fuzz_verifier(t: Tally, deadline: float, n: int) -> Callable[..., None]:
    """Verify steps of random trees (built, padded, edited) on dense and paged caches, with
    variants of the tree, cache and root token; a refused step leaves the cache as it was. An
    accepted step is undone (truncated) so the variants all start from the same prefix."""
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
        seeds,
    )
    def run(
        branches: list[list[int]],
        root: Any,
        padding: int,
        paged: bool,
        rule: int,
        prompt: list[int],
        seed: int,
    ) -> None:
        mut = t.start(seed)
        r = mut.r
        ver = Verifier(target, rules[rule], generator=torch.Generator().manual_seed(0))
        if paged:
            cache: Any = PagedKVPool(1, 1, 4, num_blocks=6, block_size=4).sequence()
        else:
            cache = target.new_cache(24)

        def state() -> tuple[int, int]:
            return cache.committed_len, cache.pending

        def undo() -> None:
            cache.truncate(0)

        k = max(1, n // 16)
        if prompt:
            ok = fan(t, deadline, mut, [prompt], lambda p: ver.prefill(p, cache), k, state, undo)
            if ok and ok[0][0] is prompt:
                ver.prefill(prompt, cache)  # the prompt (accepted above) stays for the steps
        box: list[Any] = []
        if not guarded(
            t, lambda: box.append(specdec.tree_from_branches(branches, root_token=root)), deadline
        ):
            return
        tree = box[0].padded(box[0].num_drafted + padding) if padding else box[0]
        trees = [tree]
        for _ in range(2):  # the same tree with its arrays edited after the build
            edited = specdec.tree_from_branches(branches, root_token=root)
            node, value = r.randrange(edited.num_nodes + 1), mut.integer(r.randint(-1, 12))
            edit_tree(edited, node, value if isinstance(value, int) else -1, r.randrange(3))
            trees.append(edited)
        prefix = cache.committed_len

        def reset() -> None:
            cache.truncate(prefix)

        for tr in trees:
            fan(
                t,
                deadline,
                mut,
                [tr, cache, None],
                lambda tr, c, rt: ver.step(tr, c, root_token=rt),
                max(1, n // 4),
                state,
                reset,
            )

    return run


ENTRY_POINTS: dict[str, Factory] = {
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


def run_entry_point(
    name: str,
    examples: int,
    seed: int,
    deadline: float = 5.0,
    variants: int = 1,
    inputs: int = 0,
) -> Tally:
    """Fuzz one entry point: ``examples`` hypothesis examples, each called as drawn and as
    variants (``variants`` calls per example, per operation for the stateful ones); with
    ``inputs``, further rounds of examples (new seeds) until that many calls were made."""
    tally = Tally()
    round_ = 0
    todo = examples
    while todo > 0:
        test = ENTRY_POINTS[name](tally, deadline, variants)  # settings() decorates it once
        configured = settings(
            max_examples=todo,
            database=None,
            deadline=None,  # hangs are timed per call by `guarded`
            derandomize=seed == 0 and round_ == 0,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )(test)
        if seed or round_:
            configured = hypothesis.seed(seed * 1000003 + round_)(configured)
        configured()
        round_ += 1
        if tally.inputs >= inputs or tally.examples == 0:
            break
        # Enough examples for the calls still missing, at this entry point's calls per example.
        per_example = tally.inputs / tally.examples
        todo = int((inputs - tally.inputs) / per_example * 1.05) + 10
    return tally


def main(argv: list[str] | None = None) -> int:
    # Casting -inf or NaN to ints in the generated inputs warns; the inputs are meant to be bad.
    warnings.simplefilter("ignore")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--examples", type=int, default=1000, help="hypothesis examples per entry point"
    )
    parser.add_argument(
        "--variants",
        type=int,
        default=1,
        help="calls per example (the example and distinct variants of it; per operation for "
        "the stateful entry points)",
    )
    parser.add_argument(
        "--inputs",
        type=int,
        default=0,
        help="keep drawing examples until each entry point has made this many calls",
    )
    parser.add_argument("--seed", type=int, default=0, help="0: derandomized")
    parser.add_argument("--only", action="append", help="entry point names (default: all)")
    args = parser.parse_args(argv)
    names = args.only or list(ENTRY_POINTS)
    print(
        f"fuzzing {len(names)} entry points: {args.examples} examples each, {args.variants} "
        f"calls per example, at least {args.inputs} calls each, seed {args.seed}"
    )
    print("\n| entry point | examples | calls | accepted | refused | crashes | hangs | seconds |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    failed = False
    start = time.perf_counter()
    for name in names:
        t0 = time.perf_counter()
        tally = run_entry_point(
            name, args.examples, args.seed, variants=args.variants, inputs=args.inputs
        )
        dt = time.perf_counter() - t0
        cells = [name, tally.examples, tally.inputs, tally.accepted, tally.refused]
        cells += [tally.crash_count, tally.hangs, f"{dt:.0f}"]
        print("| " + " | ".join(map(str, cells)) + " |", flush=True)
        for c in tally.crashes:
            print(f"    crash: {c}")
        for h in tally.slow:
            print(f"    hang: {h}")
        failed |= bool(tally.crash_count or tally.hangs)
    print(f"\ntotal: {time.perf_counter() - start:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
