"""specdec's grammars in Hugging Face transformers: a logits processor for
``model.generate(logits_processor=[...])``, as xgrammar and outlines offer one::

    proc = GrammarLogitsProcessor.from_tokenizer(tok, json_schema=schema,
                                                 vocab_size=model.config.vocab_size)
    out = model.generate(**inputs, logits_processor=[proc], max_new_tokens=128)

Each row of the batch gets its own matcher: the tokens generated so far (the columns past
the prompt) are fed to it, and the logits of the tokens it does not allow next become
``-inf``; EOS is allowed exactly where the grammar can end. A row whose tokens stop
extending what it was fed (beam search reordering beams) is replayed from the start. One
processor serves one ``generate`` call at a time (a call whose input is not longer than the
last one starts afresh)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..constrain import CfgGrammar, Matcher, RegexGrammar
from ..constrain.torch import allocate_token_bitmask, apply_token_bitmask_inplace
from ..errors import GrammarError, SpecdecTypeError
from .grammars import GrammarSpec, vocabulary_from_tokenizer

if TYPE_CHECKING:
    import torch

__all__ = ["GrammarLogitsProcessor"]


class GrammarLogitsProcessor:
    """A transformers logits processor (``__call__(input_ids, scores) -> scores``) that keeps
    every row of the batch inside ``grammar`` (a compiled :class:`~specdec.CfgGrammar` or
    :class:`~specdec.RegexGrammar`; :meth:`from_tokenizer` compiles one from a spec)."""

    def __init__(self, grammar: CfgGrammar | RegexGrammar) -> None:
        if not isinstance(grammar, (CfgGrammar, RegexGrammar)):
            raise SpecdecTypeError(
                f"grammar must be a CfgGrammar or a RegexGrammar, got {type(grammar).__name__}"
            )
        self.grammar = grammar
        self._start: int | None = None  # width of the prompt columns
        self._last_len = 0
        self._rows: list[tuple[Matcher, list[int]]] = []
        self._bitmask: torch.Tensor | None = None

    @classmethod
    def from_tokenizer(
        cls,
        tokenizer: Any,
        spec: dict[str, Any] | None = None,
        *,
        vocab_size: int | None = None,
        eos_ids: list[int] | None = None,
        **kinds: Any,
    ) -> GrammarLogitsProcessor:
        """Compile a grammar spec (a dict, or the same as keywords: ``json_schema=``,
        ``regex=``, ``gbnf=``, ``lark=``, ``choice=``) against ``tokenizer``'s vocabulary
        (built once per tokenizer). ``vocab_size``: the model's logits width (default: the
        tokenizer's size); ``eos_ids``: default the tokenizer's ``eos_token_id``."""
        if spec is not None and kinds:
            raise GrammarError("give the grammar as a spec dict or as keywords, not both")
        parsed = GrammarSpec.parse(spec if spec is not None else kinds)
        vocab = vocabulary_from_tokenizer(tokenizer, vocab_size=vocab_size, eos_ids=eos_ids)
        return cls(parsed.compile(vocab))

    def reset(self) -> None:
        """Forget the rows: the next call starts a new generation."""
        self._start = None
        self._rows = []

    def _sync(self, row: int, generated: list[int]) -> Matcher:
        """Row ``row``'s matcher, fed ``generated`` (replayed when it does not extend what
        the row was fed, as when beam search reorders beams)."""
        matcher, fed = self._rows[row]
        if generated[: len(fed)] != fed:
            matcher, fed = self.grammar.matcher(), []
            self._rows[row] = (matcher, fed)
        for t in generated[len(fed) :]:
            if matcher.is_terminated():
                break  # a finished row is padded after its EOS
            if not matcher.accept_token(t):
                raise GrammarError(
                    f"row {row}: token {t} after {len(fed)} generated tokens is not allowed by "
                    "the grammar (was this processor applied at every step, with this "
                    "tokenizer?)"
                )
            fed.append(t)
        return matcher

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        batch, width = input_ids.shape
        if self._start is None or width <= self._last_len or batch != len(self._rows):
            self._start = width
            self._rows = [(self.grammar.matcher(), []) for _ in range(batch)]
        self._last_len = width
        generated = input_ids[:, self._start :].tolist()
        vocab = self.grammar.vocab.vocab_size
        if self._bitmask is None or self._bitmask.shape[0] < batch:
            self._bitmask = allocate_token_bitmask(batch, vocab)
        bitmask = self._bitmask[:batch]
        for row in range(batch):
            self._sync(row, generated[row]).fill_next_token_bitmask(bitmask, row)
        apply_token_bitmask_inplace(scores, bitmask, vocab_size=min(vocab, scores.shape[-1]))
        if scores.shape[-1] > vocab:  # logits columns past the vocabulary: never allowed
            scores[:, vocab:] = float("-inf")
        return scores
