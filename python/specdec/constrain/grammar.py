"""Context-free grammar constraints: GBNF text, a Lark grammar, a JSON Schema, or a regex as
a one-lexeme grammar, compiled
against one vocabulary; an Earley parser over regex lexemes whose states are interned, with
allowed-token bitmasks cached per parser state (a :class:`~specdec.protocols.Constraint`
engine beside :mod:`.regex`)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from .. import _core
from .._arrays import check_bool, check_int
from ..errors import GrammarError, SpecdecTypeError
from .vocab import Vocabulary

if TYPE_CHECKING:
    from .matcher import Matcher

__all__ = ["CfgGrammar", "SchemaApproximation"]


class SchemaApproximation(NamedTuple):
    """Where a grammar compiled from a JSON Schema differs from the schema. ``kind``:
    ``"subset"`` (some valid documents rejected, no invalid one accepted), ``"superset"``
    (every valid document accepted, and some invalid ones), ``"neither"`` or ``"spelling"``
    (every value reachable, some spellings not: numbers under bounds without exponents,
    integers with exponents only as floats print them, strings under ``pattern`` or
    ``format`` without escape sequences)."""

    keyword: str
    pointer: str
    kind: str
    detail: str


def _opt_int(value: int | None, name: str, lo: int) -> int | None:
    return None if value is None else check_int(value, name, lo, GrammarError)


def _limits(
    cache_bytes: int | None,
    max_depth: int | None,
    max_states: int | None,
    max_symbols: int | None,
    max_lexer_states: int | None,
    size_limit: int | None,
) -> tuple[int | None, ...]:
    """The compile limits, checked, in the order the core constructors take them."""
    return (
        _opt_int(cache_bytes, "cache_bytes", 0),
        _opt_int(max_depth, "max_depth", 1),
        _opt_int(max_states, "max_states", 1),
        _opt_int(max_symbols, "max_symbols", 1),
        _opt_int(max_lexer_states, "max_lexer_states", 1),
        _opt_int(size_limit, "size_limit", 1),
    )


def schema_text(schema: object) -> str:
    """A JSON Schema as JSON text (key order kept: it is the properties' output order)."""
    if isinstance(schema, str):
        return schema
    if not isinstance(schema, (dict, bool)):
        raise SpecdecTypeError(
            f"schema must be a dict, a bool or JSON text, got {type(schema).__name__}"
        )
    try:
        return json.dumps(schema)
    except (TypeError, ValueError) as e:
        raise GrammarError(f"the schema is not JSON-serializable: {e}") from None


class CfgGrammar:
    """A context-free grammar compiled against one vocabulary; the whole output must belong
    to its language. Build one with :meth:`Vocabulary.gbnf` or :meth:`Vocabulary.json_schema`
    (cached per vocabulary) or the class methods. Limits (``None``: the default; exceeding
    one raises :class:`GrammarError` naming it): ``cache_bytes`` bounds the per-state mask
    cache; ``max_depth`` the nesting of the grammar text (parentheses, schemas);
    ``max_states`` the parser states (and their nodes) one chart holds (4,194,304): the
    matchers of a grammar share a chart, replaced by a fresh one when full (each matcher's
    state carried over on its next step), so the limit bounds memory, not the length of a
    text, and a matcher fails only when one of its own steps or fills needs more states
    than that (deep nesting), while the grammar's other matchers go on; ``max_symbols``
    the right-hand-side symbols of all rules (1,048,576); ``max_lexer_states`` the DFA
    states of all lexemes (65,536); ``size_limit`` the automaton bytes of one lexeme
    (16 MiB, as :class:`RegexGrammar`'s)."""

    __slots__ = ("_g", "vocab", "source")

    def __init__(self, vocab: Vocabulary, core: _core.CfgGrammar, source: str) -> None:
        self.vocab = vocab
        self._g = core
        self.source = source

    @classmethod
    def from_gbnf(
        cls,
        vocab: Vocabulary,
        text: str,
        *,
        cache_bytes: int | None = None,
        max_depth: int | None = None,
        max_states: int | None = None,
        max_symbols: int | None = None,
        max_lexer_states: int | None = None,
        size_limit: int | None = None,
    ) -> CfgGrammar:
        """Compile GBNF (llama.cpp's grammar format; the start rule is ``root``)."""
        limits = _limits(
            cache_bytes, max_depth, max_states, max_symbols, max_lexer_states, size_limit
        )
        return cls._from_text(vocab, text, "GBNF", _core.CfgGrammar.from_gbnf, limits)

    @classmethod
    def from_lark(
        cls,
        vocab: Vocabulary,
        text: str,
        *,
        cache_bytes: int | None = None,
        max_depth: int | None = None,
        max_states: int | None = None,
        max_symbols: int | None = None,
        max_lexer_states: int | None = None,
        size_limit: int | None = None,
    ) -> CfgGrammar:
        """Compile a Lark grammar (start rule ``start``). Supported: rules and terminals
        (``?rule``, ``!rule``, priorities and ``-> alias`` accepted and ignored), ``|``
        continuation lines, ``"lit"``, ``"lit"i``, ``/regex/`` (flags ``i``, ``s``),
        ``"a".."z"``, ``( )``, ``[ ]``, ``? * +``, ``~ n``, ``~ n..m``, ``%ignore``,
        ``%import common.NAME``. Every tokenization the rules allow is accepted (no
        contextual lexer). Anything else raises :class:`GrammarError` naming it."""
        limits = _limits(
            cache_bytes, max_depth, max_states, max_symbols, max_lexer_states, size_limit
        )
        return cls._from_text(vocab, text, "Lark", _core.CfgGrammar.from_lark, limits)

    @classmethod
    def _from_text(
        cls,
        vocab: Vocabulary,
        text: str,
        kind: str,
        compile_text: Any,
        limits: tuple[int | None, ...],
    ) -> CfgGrammar:
        """The checks and compile call shared by the grammar-text formats."""
        if not isinstance(vocab, Vocabulary):
            raise SpecdecTypeError(f"vocab must be a Vocabulary, got {type(vocab).__name__}")
        if not isinstance(text, str):
            raise SpecdecTypeError(f"{kind} text must be a str, got {type(text).__name__}")
        core = compile_text(vocab._v, text, *limits)
        return cls(vocab, core, text)

    @classmethod
    def from_json_schema(
        cls,
        vocab: Vocabulary,
        schema: dict[str, Any] | bool | str,
        *,
        whitespace: bool = True,
        separators: tuple[str, str] | None = None,
        strict: bool = True,
        property_order: Literal["any", "declared"] = "any",
        additional_properties: bool = True,
        format_assertion: bool = True,
        cache_bytes: int | None = None,
        max_depth: int | None = None,
        max_states: int | None = None,
        max_symbols: int | None = None,
        max_lexer_states: int | None = None,
        size_limit: int | None = None,
    ) -> CfgGrammar:
        """Compile a JSON Schema (a parsed document, or its JSON text) to the grammar of the
        JSON texts it accepts. ``whitespace``: any whitespace around punctuation (else
        exactly ``separators``, ``(item, key)``, default ``(", ", ": ")`` as
        :func:`json.dumps`). ``strict``: a schema that cannot be compiled exactly raises
        :class:`~specdec.errors.UnsupportedSchemaError` naming the first keyword that cannot
        and its JSON pointer; with ``strict=False`` an approximation is compiled and listed
        in :attr:`approximations` (spelling approximations are listed either way).
        ``property_order``: ``"any"`` (each property at most once, every required one
        present, in any order) or ``"declared"`` (declared properties in declared order,
        others after them, as OpenAI structured outputs). ``additional_properties=False``:
        objects without ``additionalProperties`` allow no other properties.
        ``format_assertion``: each format compiled is exactly its RFC's grammar (``hostname``,
        ``idn-hostname``, ``idn-email`` and ``regex`` are not compiled: refused, or a
        superset without ``strict``); ``False``: ``format`` is an annotation (JSON Schema
        2020-12's default reading), not checked."""
        if not isinstance(vocab, Vocabulary):
            raise SpecdecTypeError(f"vocab must be a Vocabulary, got {type(vocab).__name__}")
        text = schema_text(schema)
        ws = check_bool(whitespace, "whitespace")
        if separators is None:
            separators = (",", ":") if ws else (", ", ": ")
        if (
            not isinstance(separators, tuple)
            or len(separators) != 2
            or not all(isinstance(x, str) for x in separators)
        ):
            raise SpecdecTypeError("separators must be a tuple of two str: (item, key)")
        if property_order not in ("any", "declared"):
            raise GrammarError(
                f'property_order must be "any" or "declared", got {property_order!r}'
            )
        core = _core.CfgGrammar.from_json_schema(
            vocab._v,
            text,
            ws,
            separators[0],
            separators[1],
            not check_bool(additional_properties, "additional_properties"),
            property_order == "declared",
            check_bool(strict, "strict"),
            check_bool(format_assertion, "format_assertion"),
            *_limits(cache_bytes, max_depth, max_states, max_symbols, max_lexer_states, size_limit),
        )
        return cls(vocab, core, text)

    @classmethod
    def from_regex(
        cls,
        vocab: Vocabulary,
        pattern: str,
        *,
        cache_bytes: int | None = None,
        max_states: int | None = None,
        size_limit: int | None = None,
    ) -> CfgGrammar:
        """A regex as the one-lexeme grammar ``root ::= /pattern/``."""
        if not isinstance(vocab, Vocabulary):
            raise SpecdecTypeError(f"vocab must be a Vocabulary, got {type(vocab).__name__}")
        if not isinstance(pattern, str):
            raise SpecdecTypeError(f"pattern must be a str, got {type(pattern).__name__}")
        cache, _, states, _, _, size = _limits(
            cache_bytes, None, max_states, None, None, size_limit
        )
        core = _core.CfgGrammar.from_regex(vocab._v, pattern, cache, states, size)
        return cls(vocab, core, pattern)

    @property
    def num_states(self) -> int:
        """Parser states in the current chart (the dead one included); grows with new
        prefixes, up to ``max_states``, then starts again in a fresh chart."""
        return self._g.num_states

    @property
    def num_rules(self) -> int:
        return self._g.num_rules

    @property
    def approximations(self) -> list[SchemaApproximation]:
        """Where a JSON Schema's grammar differs from the schema (empty for other grammars,
        and for exact schemas)."""
        return [SchemaApproximation(*a) for a in self._g.approximations]

    @property
    def num_lexemes(self) -> int:
        return self._g.num_lexemes

    def matches(self, text: bytes | str) -> bool:
        """Is the whole ``text`` in the grammar's language?"""
        return self._g.matches(text.encode() if isinstance(text, str) else text)

    def matcher(self) -> Matcher:
        from .matcher import Matcher

        return Matcher(self)

    def __repr__(self) -> str:
        return f"CfgGrammar(rules={self.num_rules}, lexemes={self.num_lexemes})"
