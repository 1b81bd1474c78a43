"""A one-line progress bar on stderr for long generations (no dependency: a serving loop
should not pull a UI library in)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["ProgressBar"]


class ProgressBar:
    """``update(done, running)`` redraws at most every ``interval`` seconds; ``close()``
    ends the line. Disabled bars do nothing."""

    def __init__(
        self,
        total: int,
        *,
        enabled: bool = True,
        stream: TextIO | None = None,
        interval: float = 0.25,
    ) -> None:
        self.total = max(total, 1)
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stderr
        self.interval = interval
        self.t0 = time.perf_counter()
        self._last = 0.0
        self._drawn = False

    def update(self, done: int, running: int, *, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if not force and now - self._last < self.interval:
            return
        self._last = now
        frac = min(done / self.total, 1.0)
        bar = "#" * int(24 * frac) + "-" * (24 - int(24 * frac))
        rate = done / max(now - self.t0, 1e-9)
        self.stream.write(
            f"\r[{bar}] {done}/{self.total} tokens, {running} running, {rate:.1f} tok/s"
        )
        self.stream.flush()
        self._drawn = True

    def close(self, done: int) -> None:
        if self.enabled:
            self.update(done, 0, force=True)
            if self._drawn:
                self.stream.write("\n")
                self.stream.flush()
