"""Matchers: the grammar state of one sequence, following a constraint token by token, with
O(1) fork and rollback, filling allowed-token bitmasks (the
:class:`~specdec.protocols.Constraint` protocol)."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _core
from .._arrays import I32, I64_MAX, as_list, check_int
from ..errors import GrammarError, SpecdecTypeError
from .bitmask import bitmask_rows
from .grammar import CfgGrammar
from .numpy import allocate_token_bitmask, unpack_bitmask
from .regex import RegexGrammar

if TYPE_CHECKING:
    import torch

__all__ = ["Matcher", "fill_next_token_bitmask_batch"]


class Matcher:
    """Grammar state of one sequence. ``accept_token`` returns False (state unchanged) for a
    rejected token; ``rollback(n)`` undoes tokens; ``fork()`` is O(1)."""

    __slots__ = ("_m", "grammar")

    def __init__(self, grammar: RegexGrammar | CfgGrammar, _core_matcher: Any = None) -> None:
        if not isinstance(grammar, (RegexGrammar, CfgGrammar)):
            raise SpecdecTypeError(
                f"grammar must be a RegexGrammar or a CfgGrammar, got {type(grammar).__name__}"
            )
        self.grammar = grammar
        self._m = _core.Matcher(grammar._g) if _core_matcher is None else _core_matcher

    def accept_token(self, token: int) -> bool:
        """Advance by ``token``; False (state unchanged) if the grammar rejects it."""
        if type(token) is not int:
            token = check_int(token, "token", None, GrammarError)
        try:
            return self._m.accept_token(token)
        except OverflowError:  # a Python int past int64 (the fast path skips check_int)
            raise GrammarError(f"token {token} out of range") from None

    def accept_tokens(self, tokens: Iterable[int]) -> int:
        """Accept in order until one is rejected; returns how many were accepted."""
        ids = [check_int(t, "token", None, GrammarError) for t in as_list(tokens, "tokens")]
        return self._m.accept_tokens(ids)

    def is_terminated(self) -> bool:
        """EOS was accepted."""
        return self._m.is_terminated()

    def is_accepting(self) -> bool:
        """The text so far matches: EOS is allowed now."""
        return self._m.is_accepting()

    @property
    def num_accepted(self) -> int:
        return self._m.num_accepted

    def rollback(self, n: int = 1) -> None:
        """Undo the last ``n`` accepted tokens."""
        self._m.rollback(check_int(n, "n", 0, GrammarError))

    def reset(self) -> None:
        self._m.reset()

    def fork(self) -> Matcher:
        return Matcher(self.grammar, self._m.fork())

    def fill_next_token_bitmask(self, bitmask: np.ndarray | torch.Tensor, row: int = 0) -> None:
        """Write the allowed tokens into row ``row`` of an int32 ``[B, >= ceil(V/32)]``
        buffer (numpy, or a CPU torch tensor). After EOS only EOS is allowed."""
        if type(row) is not int or not 0 <= row <= I64_MAX:
            row = check_int(row, "row", 0, GrammarError)
        # A CPU tensor is filled through a numpy view of its memory: no raw pointer crosses
        # into Rust, and numpy's borrow checks (writable, no aliasing) apply.
        if type(bitmask) is np.ndarray and bitmask.dtype is I32 and bitmask.ndim == 2:
            arr = bitmask
        elif _is_cpu_int32_tensor(bitmask):
            arr = bitmask.numpy()  # type: ignore[union-attr]  # a view; Rust checks the rest
        else:
            arr = bitmask_rows(bitmask)
        self._m.fill_next_token_bitmask(arr, row)

    def forced_paths(
        self, *, max_bytes: int = 64, max_branches: int = 4, levels: int = 2, max_paths: int = 16
    ) -> list[_core.ForcedPath]:
        """Every way the text can go from here, as bytes: what the grammar forces, and at
        each choice point of at most ``max_branches`` options (EOS counts as one) each
        option with its own forced tail, ``levels`` choice points deep; at most
        ``max_paths`` paths of ``max_bytes`` bytes. Each path's ``weight`` is the product
        of ``1 / options`` over its choices; ``eos``: the text ends after it. Empty after
        EOS. Cached per parser state."""
        args = {"max_bytes": max_bytes, "max_branches": max_branches, "levels": levels}
        lim = {k: check_int(v, k, 0, GrammarError) for k, v in args.items()}
        paths = check_int(max_paths, "max_paths", 1, GrammarError)
        return self._m.forced_paths(**lim, max_paths=paths)

    def forced_bytes(self, max_bytes: int = 64) -> bytes:
        """The bytes every valid continuation starts with (at most ``max_bytes``)."""
        paths = self.forced_paths(max_bytes=max_bytes, levels=0, max_paths=1)
        return paths[0].bytes if paths else b""

    def allowed_tokens(self) -> np.ndarray:
        """Sorted ids of the allowed tokens (convenience; the bitmask is the fast path)."""
        v = self.grammar.vocab.vocab_size
        bm = allocate_token_bitmask(1, v)
        self.fill_next_token_bitmask(bm)
        return np.flatnonzero(unpack_bitmask(bm, v)[0])


def _is_cpu_int32_tensor(x: Any) -> bool:
    # torch is looked up, not imported: without it loaded, no tensor can exist.
    torch = sys.modules.get("torch")
    return (
        torch is not None
        and type(x) is torch.Tensor
        and x.dtype is torch.int32
        and x.device.type == "cpu"
    )


def _check_matcher(m: Any) -> Matcher:
    if not isinstance(m, Matcher):
        raise SpecdecTypeError(f"matcher must be a specdec.Matcher, got {type(m).__name__}")
    return m


def fill_next_token_bitmask_batch(
    matchers: Sequence[Matcher],
    bitmask: np.ndarray | torch.Tensor,
    rows: Sequence[int] | None = None,
) -> None:
    """Fill one row per matcher (row ``rows[i]``, default ``i``) in parallel, GIL released."""
    buf = bitmask_rows(bitmask)
    cores = [_check_matcher(m)._m for m in matchers]
    idx = None if rows is None else [check_int(r, "row", 0, GrammarError) for r in rows]
    _core.fill_next_token_bitmask_batch(cores, buf, idx)
