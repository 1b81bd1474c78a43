"""specdec's grammars as a vLLM (V1) logits processor.

A request opts in with ``SamplingParams(extra_args={"specdec": {...}})`` holding one grammar
spec (``json_schema``, ``regex``, ``gbnf``, ``lark`` or ``choice``: see
:mod:`specdec.integrations.grammars`), or the spec as JSON text (what an HTTP request's
``vllm_xargs`` can carry); requests without the key are left untouched. Load it
with ``LLM(..., logits_processors=[GrammarLogitsProcessor])`` or
``vllm serve ... --logits-processors specdec.integrations.vllm:GrammarLogitsProcessor``.

vLLM checks every request's params with :meth:`GrammarLogitsProcessor.validate_params` when
it is admitted: a bad spec or grammar is refused there (HTTP 400 from ``vllm serve``, a
``ValueError`` from ``LLM.generate``), naming what is wrong, and the other requests go on.

The vocabulary is built once, from vLLM's tokenizer, with the logits' width; EOS (the
tokenizer's and the generation config's) is allowed exactly where the grammar can end. Each
step the processor feeds every constrained request's new output tokens to its matcher (vLLM
hands over a live reference to each request's output list), fills one bitmask row per
request in Rust and masks the logits rows in place.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ...constrain import Matcher, Vocabulary, fill_next_token_bitmask_batch
from ...constrain.torch import allocate_token_bitmask, apply_token_bitmask_inplace
from ...errors import ConfigError, GrammarError, SpecdecError
from ..grammars import GrammarCache, GrammarSpec, vocabulary_from_tokenizer

if TYPE_CHECKING:
    import torch

try:  # vLLM checks that a processor named by its class path subclasses its base class.
    from vllm.v1.sample.logits_processor import LogitsProcessor as _Base
except ImportError:  # without vLLM the module still imports (the class is then unusable)
    _Base = object

__all__ = ["GrammarLogitsProcessor", "EXTRA_ARGS_KEY", "request_spec"]

EXTRA_ARGS_KEY = "specdec"
"""The key of ``SamplingParams.extra_args`` that holds a request's grammar spec."""

logger = logging.getLogger(__name__)


def request_spec(params: Any) -> GrammarSpec | None:
    """The grammar spec of a request's ``SamplingParams`` (``None``: no ``specdec`` key);
    a :class:`~specdec.errors.GrammarError` or :class:`~specdec.errors.SpecdecTypeError`
    naming what is wrong with it."""
    extra = getattr(params, "extra_args", None)
    if not extra or EXTRA_ARGS_KEY not in extra:
        return None
    where = f'extra_args["{EXTRA_ARGS_KEY}"]'
    spec = extra[EXTRA_ARGS_KEY]
    if isinstance(spec, str):
        # Over HTTP (`vllm_xargs`) values are strings: the spec comes as JSON text.
        try:
            spec = json.loads(spec)
        except ValueError as e:
            raise GrammarError(f"{where} is a str but not JSON text of a spec: {e}") from None
    return GrammarSpec.parse(spec, where=where)


@dataclass
class _Row:
    """One constrained request in the batch: its matcher, vLLM's live list of its output
    tokens, and how many of them the matcher has taken."""

    matcher: Matcher | None  # None: the request failed; only EOS is allowed
    output: list[int]
    fed: int = 0


@dataclass
class MaskStats:
    """What the processor did: steps that masked at least one row, rows masked, seconds
    spent (following the batch, feeding tokens, filling bitmasks, masking logits), and
    the errors of requests that failed."""

    steps: int = 0
    rows: int = 0
    seconds: float = 0.0
    failed: list[str] = field(default_factory=list)


def _model_vocabulary(vllm_config: Any) -> Vocabulary:
    """The vocabulary of the model vLLM serves: its tokenizer's bytes, the logits' width,
    and the EOS ids vLLM stops at."""
    from vllm.tokenizers.registry import cached_tokenizer_from_config

    model_config = vllm_config.model_config
    tokenizer = cached_tokenizer_from_config(model_config)
    if tokenizer is None:
        raise ConfigError("GrammarLogitsProcessor needs the tokenizer (skip_tokenizer_init is set)")
    eos = set()
    if getattr(tokenizer, "eos_token_id", None) is not None:
        eos.add(int(tokenizer.eos_token_id))
    gen_eos = model_config.try_get_generation_config().get("eos_token_id")
    if gen_eos is not None:
        eos.update(int(e) for e in (gen_eos if isinstance(gen_eos, list) else [gen_eos]))
    return vocabulary_from_tokenizer(
        tokenizer, vocab_size=model_config.get_vocab_size(), eos_ids=sorted(eos)
    )


class GrammarLogitsProcessor(_Base):  # type: ignore[misc]
    """A vLLM V1 logits processor for per-request grammars (see the module docstring)."""

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self._setup(
            _model_vocabulary(vllm_config),
            int(vllm_config.model_config.get_vocab_size()),
            int(vllm_config.scheduler_config.max_num_seqs),
        )

    def _setup(self, vocab: Vocabulary, vocab_size: int, max_rows: int) -> None:
        """The state over ``vocab``, masking logits of ``vocab_size`` columns in batches of
        at most ``max_rows`` requests."""
        self.vocab = vocab
        self.grammars = GrammarCache(vocab)
        self.vocab_size = vocab_size
        self._bitmask = allocate_token_bitmask(max_rows, vocab_size)
        self._rows: dict[int, _Row] = {}  # batch index -> request state
        self.stats = MaskStats()

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        """Refuse a request whose spec or grammar is bad (vLLM turns the ``ValueError`` into
        an HTTP 400 or an exception from ``add_request``)."""
        try:
            spec = request_spec(sampling_params)
            if spec is not None:
                spec.check()
        except SpecdecError as e:
            raise ValueError(f"specdec grammar: {e}") from e

    def is_argmax_invariant(self) -> bool:
        return False  # a mask changes greedy choices

    def _new_row(self, params: Any, output: list[int]) -> _Row | None:
        try:
            spec = request_spec(params)
            if spec is None:
                return None
            matcher = self.grammars.get(spec).matcher()
        except SpecdecError as e:
            # validate_params refuses these at admission; should one slip through, only this
            # request ends (EOS), the engine and the other requests go on.
            logger.error("specdec grammar: request ended: %s", e)
            self.stats.failed.append(str(e))
            return _Row(None, output)
        return _Row(matcher, output)

    def update_state(self, batch_update: Any) -> None:
        if not batch_update:
            return
        t0 = time.perf_counter()
        self._update(batch_update)
        self.stats.seconds += time.perf_counter() - t0

    def _update(self, batch_update: Any) -> None:
        # vLLM's order: removed, then added (possibly into a removed index), then moved.
        for index in batch_update.removed:
            self._rows.pop(index, None)
        for index, params, _prompt, output in batch_update.added:
            row = self._new_row(params, output)
            if row is None:
                self._rows.pop(index, None)
            else:
                self._rows[index] = row
        for a, b, direction in batch_update.moved:
            ra, rb = self._rows.pop(a, None), self._rows.pop(b, None)
            if ra is not None:
                self._rows[b] = ra
            if rb is not None and direction.name == "SWAP":
                self._rows[a] = rb

    def _feed(self, row: _Row) -> None:
        """Bring the matcher to the request's output so far (rolling back tokens vLLM
        dropped, e.g. a preempted request's output cut back)."""
        m = row.matcher
        if m is None:
            return
        n = len(row.output)
        if n < row.fed:
            m.rollback(row.fed - n)
            row.fed = n
        if n == row.fed:
            return
        new = row.output[row.fed :]
        taken = m.accept_tokens(new) if not m.is_terminated() else 0
        row.fed += taken
        if taken < len(new) and not m.is_terminated():
            msg = f"token {new[taken]} at output position {row.fed} is outside the grammar"
            logger.error("specdec grammar: request ended: %s", msg)
            self.stats.failed.append(msg)
            row.matcher = None

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self._rows:
            return logits
        t0 = time.perf_counter()
        indices = sorted(i for i in self._rows if i < logits.shape[0])
        bitmask = self._bitmask[: len(indices)]
        live: list[Matcher] = []
        live_rows: list[int] = []
        for k, i in enumerate(indices):
            row = self._rows[i]
            self._feed(row)
            if row.matcher is None:
                self._eos_only(bitmask, k)
            else:
                live.append(row.matcher)
                live_rows.append(k)
        if live:
            fill_next_token_bitmask_batch(live, bitmask, live_rows)
        if indices[-1] == len(indices) - 1 and len(indices) == logits.shape[0]:
            # Every row constrained (sorted, so 0..n-1): one masking pass over the batch.
            apply_token_bitmask_inplace(logits, bitmask, vocab_size=self.vocab_size)
        else:
            apply_token_bitmask_inplace(
                logits, bitmask, indices=indices, vocab_size=self.vocab_size
            )
        self.stats.steps += 1
        self.stats.rows += len(indices)
        self.stats.seconds += time.perf_counter() - t0
        return logits

    def _eos_only(self, bitmask: torch.Tensor, k: int) -> None:
        """Row ``k`` of ``bitmask`` allowing only the EOS ids (a failed request ends)."""
        bitmask[k].zero_()
        for e in self.vocab.eos_ids:
            word = int(bitmask[k, e // 32]) & 0xFFFFFFFF | 1 << (e % 32)
            bitmask[k, e // 32] = word - (1 << 32) if word >= 1 << 31 else word  # as int32
