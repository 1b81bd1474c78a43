"""Training text the machine already has: the Python standard library's source (code and
docstrings, found through ``sysconfig``), split by file into train and held-out, in an order
fixed by a seed."""

from __future__ import annotations

import random
import sysconfig
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError

__all__ = ["Split", "stdlib_files", "split_files", "chunks"]

# Left out: tests (long data tables, odd encodings) and vendored or generated files.
_SKIP = ("test", "tests", "idlelib", "site-packages", "dist-packages", "__pycache__", "encodings")


@dataclass(frozen=True)
class Split:
    """Files for training and held-out files (never trained on), each in seeded order."""

    train: list[Path]
    held_out: list[Path]


def stdlib_files(root: str | Path | None = None, *, max_bytes: int = 200_000) -> list[Path]:
    """Every ``*.py`` file of the standard library (or of ``root``), sorted by path."""
    base = Path(root) if root is not None else Path(sysconfig.get_paths()["stdlib"])
    if not base.is_dir():
        raise ConfigError(f"no source directory at {base}")
    out = []
    for p in sorted(base.rglob("*.py")):
        rel = p.relative_to(base).parts
        if any(part in _SKIP for part in rel[:-1]) or rel[-1].startswith("test_"):
            continue
        try:
            if 0 < p.stat().st_size <= max_bytes:
                out.append(p)
        except OSError:
            continue
    if not out:
        raise ConfigError(f"no Python source files under {base}")
    return out


def split_files(files: Sequence[Path], *, seed: int, held_out: float = 0.05) -> Split:
    """Shuffle ``files`` by ``seed`` and hold out a fraction of them (at least one)."""
    if not 0.0 < held_out < 1.0 or len(files) < 2:
        raise ConfigError(f"need >= 2 files and 0 < held_out < 1, got {len(files)}, {held_out}")
    order = list(files)
    random.Random(seed).shuffle(order)
    n = max(1, round(len(order) * held_out))
    return Split(train=order[n:], held_out=order[:n])


def chunks(
    files: Sequence[Path], encode: Callable[[str], list[int]], length: int
) -> Iterator[list[int]]:
    """Consecutive ``length``-token pieces of each file in turn (a file's tail shorter than
    ``length`` is dropped; unreadable files are skipped)."""
    for p in files:
        try:
            text = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        ids = encode(text)
        for i in range(0, len(ids) - length + 1, length):
            yield ids[i : i + length]
