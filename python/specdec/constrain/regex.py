"""Regex constraints: a regex compiled to a byte DFA over one vocabulary, with allowed-token
bitmasks cached per DFA state (the first :class:`~specdec.protocols.Constraint` engine)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import _core
from .._arrays import check_float, check_int
from ..errors import GrammarError, SpecdecTypeError
from .vocab import Vocabulary

if TYPE_CHECKING:
    from .matcher import Matcher

__all__ = ["RegexGrammar", "MAX_SIZE_LIMIT"]

# Building an automaton takes time in proportion to its memory (about 4 s per 64 MiB for a
# pathological pattern on a loaded 2-core machine), and cannot be interrupted: a caller may
# raise the 64 MiB default, but not without bound (the 1M-input fuzz run found patterns that
# filled a 2 GiB limit for minutes).
MAX_SIZE_LIMIT = 128 << 20


class RegexGrammar:
    """A regex compiled to a byte DFA over one vocabulary; the whole output must match.

    ``size_limit`` (bytes, default 64 MiB, at most :data:`MAX_SIZE_LIMIT` = 128 MiB) bounds
    the automaton (a larger one raises ``GrammarError``);
    ``cache_bytes`` bounds the per-state mask cache; masks of the first states (start state
    first) are computed at compile time until ``precompute_ms`` have passed since the compile
    began (``math.inf``: all, ``0``: none); the rest are computed on first use.
    """

    __slots__ = ("_g", "vocab")

    def __init__(
        self,
        vocab: Vocabulary,
        pattern: str,
        *,
        size_limit: int | None = None,
        cache_bytes: int | None = None,
        precompute_ms: float = 5.0,
    ) -> None:
        if not isinstance(pattern, str):
            raise GrammarError(f"pattern must be a str, got {type(pattern).__name__}")
        if not isinstance(vocab, Vocabulary):
            raise SpecdecTypeError(f"vocab must be a Vocabulary, got {type(vocab).__name__}")
        limit = None if size_limit is None else check_int(size_limit, "size_limit", 1, GrammarError)
        if limit is not None and limit > MAX_SIZE_LIMIT:
            raise GrammarError(
                f"size_limit {limit} is over the maximum of {MAX_SIZE_LIMIT} bytes (128 MiB): "
                "automata that large take too long to build"
            )
        cache = (
            None if cache_bytes is None else check_int(cache_bytes, "cache_bytes", 0, GrammarError)
        )
        ms = check_float(precompute_ms, "precompute_ms", GrammarError)
        if ms < 0:
            raise GrammarError(f"precompute_ms must be >= 0, got {ms}")
        self.vocab = vocab
        self._g = _core.RegexGrammar(vocab._v, pattern, limit, cache, ms)

    @property
    def pattern(self) -> str:
        return self._g.pattern

    @property
    def num_states(self) -> int:
        """Live DFA states plus the dead one."""
        return self._g.num_states

    def matches(self, text: bytes | str) -> bool:
        """Does ``text`` match the whole regex?"""
        return self._g.matches(text.encode() if isinstance(text, str) else text)

    def matcher(self) -> Matcher:
        from .matcher import Matcher

        return Matcher(self)
