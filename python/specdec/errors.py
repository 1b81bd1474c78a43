"""The exception hierarchy. Every exception specdec raises on purpose is a :class:`SpecdecError`;
each class also derives from the builtin a caller would expect (``ValueError`` for bad values,
``TypeError`` for wrong types, ``KeyError`` for unknown sequences), so ``except ValueError``
keeps working. The Rust extension looks these classes up once, when it is imported."""

from __future__ import annotations

__all__ = [
    "SpecdecError",
    "SpecdecTypeError",
    "TreeError",
    "VerifyError",
    "ConfigError",
    "CheckpointError",
    "KVCacheError",
    "OutOfBlocks",
    "UnknownSequence",
    "DoubleFree",
    "SlotNotReserved",
    "GrammarError",
    "UnsupportedSchemaError",
    "NoAllowedTokens",
    "DraftError",
]


class SpecdecError(Exception):
    """Base class of every error specdec raises on purpose."""


class SpecdecTypeError(SpecdecError, TypeError):
    """An argument of the wrong type or dtype (a list where an array is needed, float ids...)."""


class TreeError(SpecdecError, ValueError):
    """Invalid draft-tree input: shapes, NaN, unsorted marginals, bad budgets, broken links..."""


class VerifyError(SpecdecError, ValueError):
    """Invalid verification input: mismatched shapes or devices, positions too large, a cache
    that does not hold what the step needs."""


class ConfigError(SpecdecError, ValueError):
    """An invalid or unsupported model / generator configuration."""


class CheckpointError(ConfigError):
    """A checkpoint directory or file that cannot be loaded (missing files, unknown dtypes,
    tensors whose shapes do not match the configuration)."""


class KVCacheError(SpecdecError, ValueError):
    """Paged KV bookkeeping error; the manager is left unchanged."""


class OutOfBlocks(KVCacheError):
    """Not enough free KV blocks for the request."""


class UnknownSequence(KVCacheError, KeyError):
    """The sequence id is not (or no longer) known to the block manager."""

    # KeyError's str() quotes its message; keep the plain sentence.
    __str__ = ValueError.__str__


class DoubleFree(UnknownSequence):
    """The sequence was already freed (free, fork or use after free)."""


class SlotNotReserved(KVCacheError, IndexError):
    """A commit names a draft-tree node that has no tentative slot in this step."""


class GrammarError(SpecdecError, ValueError):
    """Invalid grammar, regex, vocabulary, bitmask or matcher input."""


class UnsupportedSchemaError(GrammarError):
    """A JSON Schema that cannot be compiled exactly (``strict=True``): ``keyword`` is the
    first keyword that cannot, ``pointer`` where it sits (a JSON pointer as a URI fragment,
    ``#/properties/a``)."""

    keyword: str = ""
    pointer: str = ""

    def __init__(self, message: str = "", keyword: str = "", pointer: str = "") -> None:
        super().__init__(message)
        self.keyword = keyword
        self.pointer = pointer


class NoAllowedTokens(GrammarError):
    """A constraint state allows no token at all (never softmax over all -inf). ``row``: the
    batch row (request) whose state it is, where a batched step raised it; else None."""

    row: int | None = None

    def __init__(self, *args: object, row: int | None = None) -> None:
        super().__init__(*args)
        self.row = row


class DraftError(SpecdecError, ValueError):
    """Invalid drafter input or state: a bad n-gram or match length, a probability outside
    [0, 1], an unknown corpus id, an empty context."""
