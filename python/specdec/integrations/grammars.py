"""Per-request grammars as the integrations take them, and vocabularies of Hugging Face
tokenizers.

A grammar spec is a mapping with exactly one of these keys:

- ``json_schema``: a JSON Schema (a dict, a bool, or its JSON text), compiled to compact JSON
  (no whitespace between tokens of the JSON text, properties in declared order);
- ``regex``: a regular expression the whole output must match;
- ``gbnf``: a GBNF grammar (start rule ``root``);
- ``lark``: a Lark grammar (start rule ``start``);
- ``choice``: a non-empty list of strings, the output being one of them.

:meth:`GrammarSpec.parse` checks one (a :class:`~specdec.errors.GrammarError` naming what is
wrong) and :meth:`GrammarSpec.check` compiles it against a small byte vocabulary, so a bad
grammar is refused before any model vocabulary exists (an engine's front end)."""

from __future__ import annotations

import json
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..constrain import CfgGrammar, RegexGrammar, Vocabulary
from ..errors import GrammarError, SpecdecTypeError

__all__ = [
    "GRAMMAR_KINDS",
    "GrammarSpec",
    "GrammarCache",
    "choice_gbnf",
    "vocabulary_from_tokenizer",
]

GRAMMAR_KINDS = ("json_schema", "regex", "gbnf", "lark", "choice")
"""The keys a grammar spec may hold (exactly one of them)."""

Grammar = CfgGrammar | RegexGrammar


def _gbnf_literal(text: str) -> str:
    """``text`` as a GBNF string literal (quotes, backslashes and control characters
    escaped; everything else as itself)."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def choice_gbnf(choices: Sequence[str]) -> str:
    """The GBNF grammar whose language is exactly ``choices``."""
    return "root ::= " + " | ".join(_gbnf_literal(c) for c in choices)


@dataclass(frozen=True)
class GrammarSpec:
    """One request's grammar: ``kind`` (one of :data:`GRAMMAR_KINDS`) and its ``source``
    (the schema as JSON text, the pattern, the grammar text, or the choices as a tuple)."""

    kind: str
    source: str | tuple[str, ...]

    @classmethod
    def parse(cls, spec: object, *, where: str = "grammar spec") -> GrammarSpec:
        """Check a spec mapping (see the module docstring); ``where`` names it in errors."""
        if not isinstance(spec, Mapping):
            raise SpecdecTypeError(
                f"{where} must be a dict with one of {', '.join(GRAMMAR_KINDS)}, "
                f"got {type(spec).__name__}"
            )
        unknown = sorted(str(k) for k in spec if k not in GRAMMAR_KINDS)
        if unknown:
            raise GrammarError(
                f"{where} has unknown key(s) {', '.join(map(repr, unknown))}; expected exactly "
                f"one of {', '.join(GRAMMAR_KINDS)}"
            )
        kinds = [k for k in GRAMMAR_KINDS if k in spec]
        if len(kinds) != 1:
            got = ", ".join(kinds) if kinds else "none"
            raise GrammarError(
                f"{where} needs exactly one of {', '.join(GRAMMAR_KINDS)}, got {got}"
            )
        kind = kinds[0]
        value = spec[kind]
        if kind == "json_schema":
            if isinstance(value, str):
                try:
                    json.loads(value)
                except ValueError as e:
                    raise GrammarError(f"{where}: json_schema is not valid JSON: {e}") from None
                return cls(kind, value)
            if not isinstance(value, (dict, bool)):
                raise SpecdecTypeError(
                    f"{where}: json_schema must be a dict, a bool or JSON text, "
                    f"got {type(value).__name__}"
                )
            try:
                return cls(kind, json.dumps(value))
            except (TypeError, ValueError) as e:
                raise GrammarError(f"{where}: json_schema is not JSON-serializable: {e}") from None
        if kind == "choice":
            if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
                raise SpecdecTypeError(
                    f"{where}: choice must be a list of strings, got {type(value).__name__}"
                )
            if not value:
                raise GrammarError(f"{where}: choice needs at least one string")
            bad = [i for i, c in enumerate(value) if not isinstance(c, str)]
            if bad:
                raise SpecdecTypeError(
                    f"{where}: choice must be a list of strings; item {bad[0]} is "
                    f"{type(value[bad[0]]).__name__}"
                )
            return cls(kind, tuple(value))
        if not isinstance(value, str):
            raise SpecdecTypeError(f"{where}: {kind} must be a str, got {type(value).__name__}")
        return cls(kind, value)

    def compile(self, vocab: Vocabulary) -> Grammar:
        """The grammar against ``vocab`` (JSON Schemas and grammar texts are cached by the
        vocabulary; :class:`GrammarCache` keeps regexes and choices too)."""
        if self.kind == "json_schema":
            assert isinstance(self.source, str)
            return vocab.json_schema(self.source, whitespace=False)
        if self.kind == "regex":
            assert isinstance(self.source, str)
            return vocab.regex(self.source)
        if self.kind == "gbnf":
            assert isinstance(self.source, str)
            return vocab.gbnf(self.source)
        if self.kind == "lark":
            assert isinstance(self.source, str)
            return vocab.lark(self.source)
        assert isinstance(self.source, tuple)
        return vocab.gbnf(choice_gbnf(self.source))

    def check(self) -> None:
        """Compile against a 256-token byte vocabulary: raises the :class:`GrammarError` a
        real vocabulary would raise for a bad schema, pattern or grammar text."""
        self.compile(_byte_vocabulary())


_BYTE_VOCAB: Vocabulary | None = None


def _byte_vocabulary() -> Vocabulary:
    """One token per byte and an EOS: enough to compile any grammar and so check it."""
    global _BYTE_VOCAB
    if _BYTE_VOCAB is None:
        tokens: list[bytes | None] = [bytes([b]) for b in range(256)]
        _BYTE_VOCAB = Vocabulary.from_bytes([*tokens, None], [256])
    return _BYTE_VOCAB


class GrammarCache:
    """Compiled grammars of one vocabulary, keyed by spec, the least recently used dropped
    past ``size``; safe to share between threads."""

    def __init__(self, vocab: Vocabulary, size: int = 64) -> None:
        self.vocab = vocab
        self.size = size
        self._grammars: OrderedDict[GrammarSpec, Grammar] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, spec: GrammarSpec) -> Grammar:
        with self._lock:
            hit = self._grammars.get(spec)
            if hit is not None:
                self._grammars.move_to_end(spec)
                return hit
        grammar = spec.compile(self.vocab)
        with self._lock:
            self._grammars[spec] = grammar
            while len(self._grammars) > self.size:
                self._grammars.popitem(last=False)
        return grammar


_VOCABS: weakref.WeakKeyDictionary[Any, dict[tuple[int | None, tuple[int, ...]], Vocabulary]] = (
    weakref.WeakKeyDictionary()
)


def _eos_of(tokenizer: Any) -> list[int]:
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        return []
    return [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]


def vocabulary_from_tokenizer(
    tokenizer: Any, *, vocab_size: int | None = None, eos_ids: Iterable[int] | None = None
) -> Vocabulary:
    """The :class:`~specdec.constrain.Vocabulary` of a Hugging Face fast tokenizer (anything
    with ``backend_tokenizer``, a ``tokenizers.Tokenizer``, or ``tokenizer.json`` text).
    ``vocab_size``: the model's logits width when larger than the tokenizer (ids past the
    tokenizer are never allowed); ``eos_ids``: the ids that end a sequence (default: the
    tokenizer's ``eos_token_id``), allowed exactly where the grammar can end. Built once per
    tokenizer object and arguments (building one is the slow part of a first request)."""
    eos = tuple(_eos_of(tokenizer) if eos_ids is None else [int(e) for e in eos_ids])
    if isinstance(tokenizer, str):
        return Vocabulary.from_tokenizer_json(tokenizer, eos_ids=eos, vocab_size=vocab_size)
    key = (vocab_size, eos)
    try:
        cached = _VOCABS.get(tokenizer)
    except TypeError:  # not weakly referenceable: build without caching
        cached = None
    if cached is not None and key in cached:
        return cached[key]
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    to_str = getattr(backend, "to_str", None)
    if not callable(to_str):
        raise SpecdecTypeError(
            "tokenizer must be a Hugging Face fast tokenizer (with backend_tokenizer), a "
            f"tokenizers.Tokenizer or tokenizer.json text, got {type(tokenizer).__name__}"
        )
    vocab = Vocabulary.from_tokenizer_json(to_str(), eos_ids=eos, vocab_size=vocab_size)
    try:
        _VOCABS.setdefault(tokenizer, {})[key] = vocab
    except TypeError:
        pass
    return vocab
