"""The draft vocabulary subset (FR-Spec, Zhao et al. 2025): the ``size`` most frequent tokens
of the drafters' training split, counted with the target's tokenizer."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

from .._arrays import check_int
from ..draft.checkpoint import DraftVocab
from ..errors import ConfigError

__all__ = ["frequent_vocab"]


def frequent_vocab(
    files: Sequence[Path],
    encode: Callable[[str], list[int]],
    vocab_size: int,
    size: int,
    source: str = "",
) -> DraftVocab:
    """The ``size`` most frequent token ids over every token of ``files`` (whole files, as
    the training reads them; ties broken by the smaller id, so the result is a function of
    the files alone), most frequent first. Fewer than ``size`` distinct tokens seen: the
    rest are the smallest unseen ids (a subset always has ``size`` tokens). ``source``: how
    the files were chosen (kept in the file)."""
    check_int(vocab_size, "vocab_size", 1, ConfigError)
    check_int(size, "size", 1, ConfigError)
    if size > vocab_size:
        raise ConfigError(f"size {size} is more than the vocabulary's {vocab_size} tokens")
    counts: Counter[int] = Counter()
    used = 0
    for p in files:
        try:
            text = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        counts.update(encode(text))
        used += 1
    if not counts:
        raise ConfigError("the training files give no tokens to count")
    bad = [t for t in counts if not 0 <= t < vocab_size]
    if bad:
        raise ConfigError(f"the tokenizer gave ids outside the vocabulary: {sorted(bad)[:5]}")
    ranked = sorted(counts, key=lambda t: (-counts[t], t))[:size]
    if len(ranked) < size:
        seen = set(ranked)
        ranked += [t for t in range(vocab_size) if t not in seen][: size - len(ranked)]
    total = sum(counts.values())
    kept = sum(counts[t] for t in ranked)
    return DraftVocab(
        tuple(ranked),
        vocab_size,
        source=source or f"the {size} most frequent tokens of {used} files",
        extra={"counted_tokens": total, "files": used, "coverage": kept / total},
    )
