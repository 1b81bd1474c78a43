"""The exception hierarchy. The Rust extension raises these classes (it looks them up here),
so a caller can catch one family (``SpecdecError``) or the builtin it also derives from."""

from __future__ import annotations


class SpecdecError(Exception):
    """Base class of every error specdec raises on purpose."""


class TreeError(SpecdecError, ValueError):
    """Invalid draft-tree input: shapes, dtypes, NaN, unsorted marginals, bad budgets..."""


class VerifyError(SpecdecError, ValueError):
    """Invalid verification input: mismatched shapes, dtypes or devices, positions too large."""


class KVCacheError(SpecdecError):
    """Paged KV bookkeeping error; the manager is left unchanged."""


class OutOfBlocks(KVCacheError):
    """Not enough free KV blocks for the request."""


class UnknownSequence(KVCacheError, KeyError):
    """The sequence id is not (or no longer) known to the block manager."""


class DoubleFree(UnknownSequence):
    """The sequence was already freed (free, fork or use after free)."""


class SlotNotReserved(KVCacheError, IndexError):
    """A commit names a draft-tree node that has no tentative slot in this step."""


class GrammarError(SpecdecError, ValueError):
    """Invalid grammar, regex, vocabulary or matcher input."""


class NoAllowedTokens(GrammarError):
    """A constraint state allows no token at all (never softmax over all -inf)."""
