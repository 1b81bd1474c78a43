"""Vocabularies: each token's exact bytes, read from real tokenizer files (Tekken JSON,
SentencePiece models, Hugging Face ``tokenizer.json``) or given as a list."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Literal

from .. import _core
from .._arrays import as_list, check_int
from ..errors import GrammarError, SpecdecTypeError

if TYPE_CHECKING:
    from .grammar import CfgGrammar
    from .regex import RegexGrammar

__all__ = ["Vocabulary", "MAX_VOCAB_SIZE"]

# Compiled grammars kept per vocabulary (the oldest is dropped past this many).
_GRAMMAR_CACHE_SIZE = 32
_CANONICAL_CACHE_SIZE = 4096


def _complete_utf8(data: bytes) -> bytes:
    """``data`` without an incomplete UTF-8 character at its end (a forced path may stop
    inside one); invalid UTF-8 elsewhere gives the bytes up to it."""
    try:
        data.decode("utf-8")
        return data
    except UnicodeDecodeError as e:
        return data[: e.start]


# Real vocabularies hold up to about a million tokens; a larger size is a mistake that would
# allocate gigabytes of per-token tables.
MAX_VOCAB_SIZE = 1 << 24


def _bytes_to_unicode() -> dict[str, int]:
    """GPT-2 byte-level BPE alphabet: printable stand-in character -> byte."""
    bs = list(range(ord("!"), ord("~") + 1))
    bs += list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


def _ids(eos_ids: Iterable[int]) -> list[int]:
    return [check_int(e, "eos id", 0, GrammarError) for e in as_list(eos_ids, "eos_ids")]


def _sp_piece_bytes(piece: str) -> bytes:
    # SentencePiece: "<0xNN>" is a byte-fallback token, "▁" is the metaspace (a space).
    if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
        try:
            return bytes([int(piece[3:5], 16)])
        except ValueError:
            pass
    return piece.replace("\u2581", " ").encode("utf-8")


class Vocabulary:
    """Each token's exact bytes (partial UTF-8 kept as bytes), EOS ids and special ids.

    Special tokens (no text) and ids past the tokenizer's size never match a grammar; EOS is
    allowed exactly where the grammar accepts. SentencePiece pieces keep their leading space
    (``"▁Hi"`` is ``b" Hi"``), as the model sees it.

    Building one costs a trie over the tokens and, once, the mask walks of the lexemes every
    JSON grammar scans (strings, numbers, whitespace, punctuation); every grammar compiled
    against it then shares those, so build one per tokenizer and keep it.
    """

    __slots__ = (
        "_v",
        "_grammars",
        "_tokenizer",
        "_tokenizer_json",
        "_pieces",
        "_canonical",
    )

    def __init__(self, core: _core.Vocabulary) -> None:
        self._v = core
        # (kind, source, options) -> compiled grammar: compiling is the slow part, and a
        # compiled grammar is immutable apart from its thread-safe caches, so it is shared.
        self._grammars: dict[tuple[object, ...], CfgGrammar] = {}
        # The tokenizer that canonical_tokens asks (a tokenizers.Tokenizer, or its JSON
        # text until first use); None: the longest token at each step.
        self._tokenizer: Any = None
        self._tokenizer_json: str | None = None
        self._pieces: tuple[dict[bytes, int], int] | None = None
        self._canonical: dict[bytes, tuple[int, ...]] = {}

    def set_tokenizer(self, tokenizer: Any) -> None:
        """The tokenizer whose tokenization :meth:`canonical_tokens` returns: a
        ``tokenizers.Tokenizer`` (or anything with its ``encode(text,
        add_special_tokens=False).ids``), or ``None`` for the longest-token fallback.
        :meth:`from_tokenizer_json` sets it."""
        if tokenizer is not None and not callable(getattr(tokenizer, "encode", None)):
            raise SpecdecTypeError(
                f"tokenizer must have an encode method, got {type(tokenizer).__name__}"
            )
        self._tokenizer, self._tokenizer_json = tokenizer, None
        self._canonical.clear()

    def canonical_tokens(self, data: bytes) -> tuple[int, ...]:
        """The tokens the tokenizer itself writes ``data`` as (no special tokens added),
        its incomplete trailing UTF-8 character left out; without a tokenizer (or where its
        tokens do not spell ``data`` exactly), the longest token at each step. Cached per
        ``data``: a grammar drafter asks for the same keys and punctuation every step."""
        hit = self._canonical.get(data)
        if hit is not None:
            return hit
        text = _complete_utf8(data)
        ids: tuple[int, ...] | None = None
        tok = self._tokenizer
        if tok is None and self._tokenizer_json is not None:
            from tokenizers import Tokenizer

            tok = self._tokenizer = Tokenizer.from_str(self._tokenizer_json)
            self._tokenizer_json = None
        if tok is not None and text:
            enc = tok.encode(text.decode("utf-8"), add_special_tokens=False)
            got = tuple(int(t) for t in enc.ids)
            parts = [self._v.token_bytes(t) for t in got]
            if all(parts) and b"".join(p for p in parts if p) == text:
                ids = got
        if ids is None:
            ids = self._longest_tokens(text)
        if len(self._canonical) >= _CANONICAL_CACHE_SIZE:
            self._canonical.clear()
        self._canonical[data] = ids
        return ids

    def prefix_tokens(self, data: bytes) -> tuple[int, ...]:
        """The tokens whose bytes ``data`` starts with, longest first (one id per byte
        string: the lowest): every way a tokenization of ``data`` can begin."""
        pieces, longest = self._piece_table()
        out = []
        for n in range(min(longest, len(data)), 0, -1):
            hit = pieces.get(data[:n])
            if hit is not None:
                out.append(hit)
        return tuple(out)

    def _piece_table(self) -> tuple[dict[bytes, int], int]:
        """Bytes -> the lowest token id spelling them, and the longest token's length."""
        if self._pieces is None:
            pieces: dict[bytes, int] = {}
            for t in range(self._v.vocab_size):
                b = self._v.token_bytes(t)
                if b and b not in pieces:
                    pieces[b] = t
            self._pieces = (pieces, max(map(len, pieces), default=0))
        return self._pieces

    def _longest_tokens(self, data: bytes) -> tuple[int, ...]:
        """``data`` as the longest token at each step (stops where no token spells on)."""
        pieces, longest = self._piece_table()
        out: list[int] = []
        i = 0
        while i < len(data):
            for n in range(min(longest, len(data) - i), 0, -1):
                hit = pieces.get(data[i : i + n])
                if hit is not None:
                    out.append(hit)
                    i += n
                    break
            else:
                break
        return tuple(out)

    @classmethod
    def from_bytes(
        cls,
        tokens: Sequence[bytes | None],
        eos_ids: Iterable[int],
        vocab_size: int | None = None,
    ) -> Vocabulary:
        """From a list indexed by token id (``None`` = special token without text)."""
        if not isinstance(tokens, Sequence) or isinstance(tokens, (str, bytes)):
            raise SpecdecTypeError(f"tokens must be a list, got {type(tokens).__name__}")
        # bytes(3) would be three zero bytes: only real byte strings are token text.
        bad = [
            i for i, t in enumerate(tokens) if not (t is None or isinstance(t, (bytes, bytearray)))
        ]
        if bad:
            raise SpecdecTypeError(
                f"tokens must be bytes or None (special), got {type(tokens[bad[0]]).__name__} "
                f"at id {bad[0]}"
            )
        toks = [None if t is None else bytes(t) for t in tokens]
        size = None if vocab_size is None else check_int(vocab_size, "vocab_size", 1, GrammarError)
        if size is not None and size > MAX_VOCAB_SIZE:
            raise GrammarError(f"vocab_size {size} is over the supported {MAX_VOCAB_SIZE}")
        return cls(_core.Vocabulary(toks, _ids(eos_ids), size))

    @classmethod
    def from_tekken(
        cls, path: str | os.PathLike[str] | None = None, eos_ids: Iterable[int] | None = None
    ) -> Vocabulary:
        """From a Tekken (tiktoken-style) JSON file; default: ``mistral_common``'s
        ``tekken_240911.json`` (131,072 ids, the first 1,000 special, EOS = 2)."""
        if path is None:
            import mistral_common

            path = os.path.join(
                os.path.dirname(mistral_common.__file__), "data", "tekken_240911.json"
            )
        with open(path, "rb") as f:
            data = f.read()
        eos = None if eos_ids is None else _ids(eos_ids)
        return cls(_core.Vocabulary.from_tekken_json(data, eos))

    @classmethod
    def from_sentencepiece(
        cls, path: str | os.PathLike[str], eos_ids: Iterable[int] | None = None
    ) -> Vocabulary:
        """From a SentencePiece model via the ``sentencepiece`` package (byte fallback
        pieces become single bytes; control and unknown pieces are special)."""
        import sentencepiece as spm

        sp = spm.SentencePieceProcessor(model_file=os.fspath(path))
        toks: list[bytes | None] = []
        for i in range(sp.get_piece_size()):
            if sp.is_control(i) or sp.is_unknown(i):
                toks.append(None)
            elif sp.is_byte(i):
                toks.append(_sp_piece_bytes(sp.id_to_piece(i)))
            else:
                toks.append(sp.id_to_piece(i).replace("\u2581", " ").encode("utf-8"))
        eos = [sp.eos_id()] if eos_ids is None else list(eos_ids)
        return cls.from_bytes(toks, [e for e in eos if e >= 0])

    @classmethod
    def from_tokenizer_json(
        cls,
        source: str | os.PathLike[str] | dict[str, Any],
        eos_ids: Iterable[int] | None = None,
        vocab_size: int | None = None,
    ) -> Vocabulary:
        """From a Hugging Face ``tokenizer.json`` (path, JSON text or parsed dict): byte-level
        BPE (GPT-2 alphabet) or SentencePiece style (metaspace, ``<0xNN>`` byte fallback).
        Special added tokens have no text; EOS defaults to the special tokens named like an
        end of sequence (``</s>``, ``<|endoftext|>``, ``<|eot_id|>``, ``<|im_end|>``, ...)."""
        if isinstance(source, dict):
            tj, raw_json = source, None
        else:
            text = os.fspath(source)
            if text.lstrip().startswith("{"):
                raw_json = text
            else:
                with open(text, encoding="utf-8") as f:
                    raw_json = f.read()
            tj = json.loads(raw_json)
        model = tj.get("model") or {}
        kind = model.get("type")
        raw = model.get("vocab")
        if kind == "Unigram" and isinstance(raw, list):
            pieces = {p[0]: i for i, p in enumerate(raw)}
        elif isinstance(raw, dict):
            pieces = {str(k): int(v) for k, v in raw.items()}
        else:
            raise GrammarError(f"unsupported tokenizer.json model {kind!r}")
        blob = json.dumps([tj.get("pre_tokenizer"), tj.get("decoder")])
        byte_level = '"ByteLevel"' in blob
        inv = _bytes_to_unicode() if byte_level else {}
        added = {int(a["id"]): a for a in tj.get("added_tokens") or []}
        size = max([*pieces.values(), *added.keys(), -1]) + 1
        toks: list[bytes | None] = [None] * size
        for piece, i in pieces.items():
            if byte_level:
                try:
                    toks[i] = bytes(inv[c] for c in piece)
                except KeyError:
                    toks[i] = piece.encode("utf-8")
            else:
                toks[i] = _sp_piece_bytes(piece)
        eos_names = {"</s>", "<|endoftext|>", "<|eot_id|>", "<|im_end|>", "<eos>", "<|end|>"}
        guessed = []
        for i, a in added.items():
            if a.get("special", False):
                toks[i] = None
                if a.get("content") in eos_names:
                    guessed.append(i)
            else:
                toks[i] = str(a.get("content", "")).encode("utf-8")
        eos = guessed if eos_ids is None else [int(e) for e in eos_ids]
        vocab = cls.from_bytes(toks, eos, vocab_size)
        # Parsed on first use: canonical tokenization is only for grammar drafts.
        vocab._tokenizer_json = raw_json if raw_json is not None else json.dumps(tj)
        return vocab

    @property
    def vocab_size(self) -> int:
        return self._v.vocab_size

    @property
    def eos_ids(self) -> list[int]:
        return list(self._v.eos_ids)

    def token_bytes(self, token: int) -> bytes | None:
        """The token's bytes (``None`` for special, EOS and padding ids)."""
        return self._v.token_bytes(token)

    def __len__(self) -> int:
        return self._v.vocab_size

    def __repr__(self) -> str:
        return f"Vocabulary(vocab_size={self.vocab_size}, eos_ids={self.eos_ids})"

    def regex(self, pattern: str, **kwargs: Any) -> RegexGrammar:
        """Compile a regex against this vocabulary (see :class:`RegexGrammar`)."""
        from .regex import RegexGrammar

        return RegexGrammar(self, pattern, **kwargs)

    def _cached(self, key: tuple[object, ...], build: Callable[[], CfgGrammar]) -> CfgGrammar:
        hit = self._grammars.get(key)
        if hit is not None:
            return hit
        g = build()
        if len(self._grammars) >= _GRAMMAR_CACHE_SIZE:
            self._grammars.pop(next(iter(self._grammars)), None)
        self._grammars[key] = g
        return g

    def gbnf(
        self,
        text: str,
        *,
        cache_bytes: int | None = None,
        max_depth: int | None = None,
        max_states: int | None = None,
        max_symbols: int | None = None,
        max_lexer_states: int | None = None,
        size_limit: int | None = None,
    ) -> CfgGrammar:
        """Compile GBNF text (llama.cpp's format, start rule ``root``) against this
        vocabulary (see :class:`CfgGrammar`, limits included); compiled grammars are cached
        per vocabulary."""
        from .grammar import CfgGrammar

        limits = (cache_bytes, max_depth, max_states, max_symbols, max_lexer_states, size_limit)
        return self._cached(
            ("gbnf", text, *limits),
            lambda: CfgGrammar.from_gbnf(
                self,
                text,
                cache_bytes=cache_bytes,
                max_depth=max_depth,
                max_states=max_states,
                max_symbols=max_symbols,
                max_lexer_states=max_lexer_states,
                size_limit=size_limit,
            ),
        )

    def lark(
        self,
        text: str,
        *,
        cache_bytes: int | None = None,
        max_depth: int | None = None,
        max_states: int | None = None,
        max_symbols: int | None = None,
        max_lexer_states: int | None = None,
        size_limit: int | None = None,
    ) -> CfgGrammar:
        """Compile a Lark grammar (the subset :meth:`CfgGrammar.from_lark` lists, start rule
        ``start``) against this vocabulary (limits as :class:`CfgGrammar`); compiled grammars
        are cached per vocabulary."""
        from .grammar import CfgGrammar

        limits = (cache_bytes, max_depth, max_states, max_symbols, max_lexer_states, size_limit)
        return self._cached(
            ("lark", text, *limits),
            lambda: CfgGrammar.from_lark(
                self,
                text,
                cache_bytes=cache_bytes,
                max_depth=max_depth,
                max_states=max_states,
                max_symbols=max_symbols,
                max_lexer_states=max_lexer_states,
                size_limit=size_limit,
            ),
        )

    def json_schema(
        self,
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
        """Compile a JSON Schema against this vocabulary (options as
        :meth:`CfgGrammar.from_json_schema`, limits as :class:`CfgGrammar`); compiled
        grammars are cached per vocabulary."""
        from .grammar import CfgGrammar, schema_text

        text = schema_text(schema)
        limits = (cache_bytes, max_depth, max_states, max_symbols, max_lexer_states, size_limit)
        opts = (
            whitespace,
            separators,
            strict,
            property_order,
            additional_properties,
            format_assertion,
            *limits,
        )
        return self._cached(
            ("json_schema", text, *opts),
            lambda: CfgGrammar.from_json_schema(
                self,
                text,
                whitespace=whitespace,
                separators=separators,
                strict=strict,
                property_order=property_order,
                additional_properties=additional_properties,
                format_assertion=format_assertion,
                cache_bytes=cache_bytes,
                max_depth=max_depth,
                max_states=max_states,
                max_symbols=max_symbols,
                max_lexer_states=max_lexer_states,
                size_limit=size_limit,
            ),
        )
