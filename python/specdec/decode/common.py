"""What the decode entry points share: the per-request result and stream types, the checks of
their common arguments (``max_new_tokens``, the stop set, the prompt, the constraint) and the
emit rule (stop at ``max_new_tokens`` or the first stop token)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from .._arrays import check_int, token_tensor
from ..errors import ConfigError, SpecdecTypeError, VerifyError
from ..protocols import Constraint

__all__ = [
    "GenerationResult",
    "RequestOutput",
    "FinishReason",
    "check_fits",
    "check_max_new_tokens",
    "emit",
    "new_matcher",
    "prompt_ids",
    "stop_set",
]

FinishReason = Literal["length", "stop", "context", "cancelled", "error"]


@dataclass
class GenerationResult:
    """One request's output and statistics.

    ``tokens``: generated tokens (prompt excluded); ``steps``: target forwards it took part
    in (prefill excluded); ``accepted``: drafted tokens accepted per step; ``tree_sizes``:
    drafted nodes verified per step; ``timings``: seconds per stage summed over its steps
    (a batched step's stage time counts for every request in it); ``finish_reason``:
    ``"length"`` (``max_new_tokens``), ``"stop"`` (a stop token, included in ``tokens``),
    ``"context"`` (the model's maximum positions), ``"cancelled"`` or ``"error"`` (then
    ``error`` is the exception that ended it: refused at admission, its grammar allowed no
    token, its drafter raised...; only that request failed); ``prefix_hit``: prompt tokens
    whose K/V came from the prefix cache; ``seconds``: submit (or call) to finish;
    ``first_token_seconds``: submit to the first streamed token; ``preemptions``: times its
    KV blocks were taken back for other requests (it resumed from its committed tokens);
    ``grammar_tokens``: accepted tokens its grammar drafted (forced tokens and grammar
    branches, :mod:`specdec.draft.grammar`)."""

    tokens: list[int]
    steps: int = 0
    accepted: list[int] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    tree_sizes: list[int] = field(default_factory=list)
    request_id: int = 0
    prompt_len: int = 0
    finish_reason: FinishReason | None = None
    prefix_hit: int = 0
    seconds: float = 0.0
    first_token_seconds: float | None = None
    error: BaseException | None = None
    preemptions: int = 0
    grammar_tokens: int = 0

    @property
    def tokens_per_step(self) -> float:
        return len(self.tokens) / max(self.steps, 1)

    @property
    def acceptance_length(self) -> float:
        """Mean tokens emitted per step (accepted drafted tokens + the bonus token)."""
        return (sum(self.accepted) + self.steps) / max(self.steps, 1)

    @property
    def tokens_per_second(self) -> float:
        return len(self.tokens) / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class RequestOutput:
    """What one step streamed for one request: ``new_tokens`` (committed, never retracted),
    and on its last output ``finished`` with the ``result``."""

    request_id: int
    new_tokens: list[int]
    finished: bool = False
    result: GenerationResult | None = None


def check_max_new_tokens(max_new_tokens: Any) -> int:
    """``max_new_tokens`` as an int >= 0; anything else (a bool, a float, a string, a negative
    number) is a :class:`ConfigError`, the same from every decode entry point."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)):
        raise ConfigError(
            f"max_new_tokens must be an int >= 0, got {type(max_new_tokens).__name__} "
            f"{max_new_tokens!r}"
        )
    return check_int(max_new_tokens, "max_new_tokens", 0, ConfigError)


def stop_set(
    stop_tokens: Collection[int] | int | None,
    eos_token_id: Collection[int] | int | None = None,
    vocab_size: int | None = None,
) -> frozenset[int]:
    """The tokens that end a request (included in its tokens): ``stop_tokens`` and
    ``eos_token_id`` (one more stop token, or several), each an int or a collection of ints,
    inside ``[0, vocab_size)`` when that is given."""
    out: set[int] = set()
    for name, value in (("stop_tokens", stop_tokens), ("eos_token_id", eos_token_id)):
        if value is None:
            continue
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            value = [int(value)]
        if isinstance(value, (str, bytes)) or not isinstance(value, Collection):
            raise SpecdecTypeError(f"{name} must be token ids, got {type(value).__name__}")
        for t in value:
            tok = check_int(t, name, 0, ConfigError)
            if vocab_size is not None and tok >= vocab_size:
                raise ConfigError(f"{name} {tok} is outside the vocabulary [0, {vocab_size})")
            out.add(tok)
    return frozenset(out)


def new_matcher(constraint: Any) -> Constraint | None:
    """A request's own matcher for ``constraint``: a fork of a matcher (its state is where
    the request starts), a fresh matcher of a grammar (anything with ``.matcher()``), or
    None."""
    if constraint is None:
        return None
    if isinstance(constraint, Constraint):
        return constraint.fork()
    make = getattr(constraint, "matcher", None)
    if callable(make):
        m = make()
        if isinstance(m, Constraint):
            return m
    raise SpecdecTypeError(
        "constraint must be a grammar (with .matcher()) or a matcher, got "
        f"{type(constraint).__name__}"
    )


def emit(
    out: list[int], new: Sequence[int], limit: int, stop: int | Collection[int] | None
) -> bool:
    """Append ``new`` to ``out`` up to ``limit`` tokens or the first stop token; True when
    done."""
    stops: Collection[int] = () if stop is None else (stop,) if isinstance(stop, int) else stop
    for t in new:
        out.append(int(t))
        if len(out) >= limit or t in stops:
            return True
    return False


def prompt_ids(prompt: Any) -> list[int]:
    """The prompt as a non-empty list of ints."""
    ids = token_tensor(prompt, "prompt", "cpu").tolist()
    if not ids:
        raise VerifyError("the prompt needs at least one token")
    return [int(t) for t in ids]


def check_fits(target: Any, ids: Sequence[int], max_new: int) -> None:
    """A ``VerifyError`` unless the prompt ``ids`` plus ``max_new`` tokens fit the target's
    positions and every id is in its vocabulary."""
    if len(ids) + max_new > target.max_positions:
        raise VerifyError(
            f"the prompt ({len(ids)} tokens) and max_new_tokens ({max_new}) do not fit the "
            f"model's maximum of {target.max_positions} positions"
        )
    vocab = target.vocab_size
    if min(ids) < 0 or max(ids) >= vocab:
        raise VerifyError(f"prompt token ids must be in [0, {vocab}), got {min(ids)}..{max(ids)}")
