"""Constrained decoding: vocabularies as exact token bytes, regex grammars compiled to byte
DFAs, matchers that fill allowed-token bitmasks, masks over draft trees, grammar-aware
DDTrees, and applying a bitmask to logits.

Bitmask layout (the one xgrammar and llguidance use, so their kernels work on it): int32
``[rows, ceil(V / 32)]``; bit ``t % 32`` of word ``t // 32`` set = token ``t`` allowed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from . import _core
from .errors import GrammarError, NoAllowedTokens
from .tree import DraftTree, _as_array

if TYPE_CHECKING:
    import torch

__all__ = [
    "Vocabulary",
    "RegexGrammar",
    "Matcher",
    "allocate_token_bitmask",
    "fill_next_token_bitmask_batch",
    "fill_tree_bitmask",
    "build_ddtree_constrained",
    "apply_token_bitmask",
]


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
    """

    __slots__ = ("_v",)

    def __init__(self, core: _core.Vocabulary) -> None:
        self._v = core

    @classmethod
    def from_bytes(
        cls,
        tokens: Sequence[bytes | None],
        eos_ids: Iterable[int],
        vocab_size: int | None = None,
    ) -> Vocabulary:
        """From a list indexed by token id (``None`` = special token without text)."""
        toks = [None if t is None else bytes(t) for t in tokens]
        return cls(_core.Vocabulary(toks, [int(e) for e in eos_ids], vocab_size))

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
        eos = None if eos_ids is None else [int(e) for e in eos_ids]
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
            tj = source
        else:
            text = os.fspath(source)
            if text.lstrip().startswith("{"):
                tj = json.loads(text)
            else:
                with open(text, encoding="utf-8") as f:
                    tj = json.load(f)
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
        return cls.from_bytes(toks, eos, vocab_size)

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
        return RegexGrammar(self, pattern, **kwargs)


class RegexGrammar:
    """A regex compiled to a byte DFA over one vocabulary; the whole output must match.

    ``size_limit`` (bytes) bounds the automaton (a larger one raises ``GrammarError``);
    ``cache_bytes`` bounds the per-state mask cache; masks of the first states (start state
    first) are computed at compile time until ``precompute_ms`` have passed since the compile
    began (``math.inf``: all, ``0``: none); the rest are computed on first use.
    """

    __slots__ = ("_g", "vocab")

    def __init__(
        self,
        vocab: Vocabulary,
        pattern: str,
        *,
        size_limit: int | None = None,
        cache_bytes: int | None = None,
        precompute_ms: float = 5.0,
    ) -> None:
        if not isinstance(pattern, str):
            raise GrammarError(f"pattern must be a str, got {type(pattern).__name__}")
        self.vocab = vocab
        self._g = _core.RegexGrammar(vocab._v, pattern, size_limit, cache_bytes, precompute_ms)

    @property
    def pattern(self) -> str:
        return self._g.pattern

    @property
    def num_states(self) -> int:
        """Live DFA states plus the dead one."""
        return self._g.num_states

    def matches(self, text: bytes | str) -> bool:
        """Does ``text`` match the whole regex?"""
        return self._g.matches(text.encode() if isinstance(text, str) else text)

    def matcher(self) -> Matcher:
        return Matcher(self)


def _torch_rows(bitmask: Any) -> np.ndarray:
    """A numpy view of a CPU int32 torch bitmask (no copy), with clear errors otherwise."""
    import torch

    if not isinstance(bitmask, torch.Tensor):
        raise GrammarError(f"bitmask must be a numpy array or torch tensor, got {type(bitmask)}")
    if bitmask.device.type != "cpu":
        raise GrammarError(f"bitmask must be on the CPU, got {bitmask.device}")
    if bitmask.dtype != torch.int32:
        raise GrammarError(f"bitmask must be int32, got {bitmask.dtype}")
    if bitmask.dim() != 2 or not bitmask.is_contiguous():
        raise GrammarError("bitmask must be a contiguous 2-D tensor")
    return bitmask.detach().numpy()


def _np_rows(bitmask: Any) -> np.ndarray:
    if type(bitmask) is np.ndarray:
        if bitmask.dtype != np.int32 or bitmask.ndim != 2:
            raise GrammarError(f"bitmask must be 2-D int32, got {bitmask.dtype} {bitmask.shape}")
        return bitmask
    return _torch_rows(bitmask)


class Matcher:
    """Grammar state of one sequence. ``accept_token`` returns False (state unchanged) for a
    rejected token; ``rollback(n)`` undoes tokens; ``fork()`` is O(1)."""

    __slots__ = ("_m", "grammar")

    def __init__(self, grammar: RegexGrammar, _core_matcher: Any = None) -> None:
        self.grammar = grammar
        self._m = _core.Matcher(grammar._g) if _core_matcher is None else _core_matcher

    def accept_token(self, token: int) -> bool:
        return self._m.accept_token(token)

    def accept_tokens(self, tokens: Iterable[int]) -> int:
        """Accept in order until one is rejected; returns how many were accepted."""
        return self._m.accept_tokens([int(t) for t in tokens])

    def is_terminated(self) -> bool:
        """EOS was accepted."""
        return self._m.is_terminated()

    def is_accepting(self) -> bool:
        """The text so far matches: EOS is allowed now."""
        return self._m.is_accepting()

    @property
    def num_accepted(self) -> int:
        return self._m.num_accepted

    def rollback(self, n: int = 1) -> None:
        self._m.rollback(n)

    def reset(self) -> None:
        self._m.reset()

    def fork(self) -> Matcher:
        return Matcher(self.grammar, self._m.fork())

    def fill_next_token_bitmask(self, bitmask: np.ndarray | torch.Tensor, row: int = 0) -> None:
        """Write the allowed tokens into row ``row`` of an int32 ``[B, >= ceil(V/32)]``
        buffer (numpy, or a CPU torch tensor). After EOS only EOS is allowed."""
        if type(bitmask) is np.ndarray:
            self._m.fill_next_token_bitmask(bitmask, row)
            return
        import torch

        if (
            type(bitmask) is torch.Tensor
            and bitmask.is_cpu
            and bitmask.dtype is torch.int32
            and bitmask.dim() == 2
            and bitmask.is_contiguous()
        ):
            # Fast path: checked here, written by Rust through the data pointer.
            rows, cols = bitmask.shape
            self._m._fill_next_token_bitmask_ptr(bitmask.data_ptr(), rows, cols, row)
        else:
            self._m.fill_next_token_bitmask(_torch_rows(bitmask), row)

    def allowed_tokens(self) -> np.ndarray:
        """Sorted ids of the allowed tokens (convenience; the bitmask is the fast path)."""
        bm = allocate_token_bitmask(1, self.grammar.vocab.vocab_size)
        self.fill_next_token_bitmask(bm)
        bits = np.unpackbits(bm.view(np.uint8), bitorder="little")[: self.grammar.vocab.vocab_size]
        return np.flatnonzero(bits)


def allocate_token_bitmask(rows: int, vocab_size: int) -> np.ndarray:
    """A zeroed int32 ``[rows, ceil(vocab_size / 32)]`` numpy buffer."""
    return np.zeros((rows, (vocab_size + 31) // 32), dtype=np.int32)


def fill_next_token_bitmask_batch(
    matchers: Sequence[Matcher],
    bitmask: np.ndarray | torch.Tensor,
    rows: Sequence[int] | None = None,
) -> None:
    """Fill one row per matcher (row ``rows[i]``, default ``i``) in parallel, GIL released."""
    buf = _np_rows(bitmask)
    _core.fill_next_token_bitmask_batch(
        [m._m for m in matchers], buf, None if rows is None else [int(r) for r in rows]
    )


def fill_tree_bitmask(
    matcher: Matcher,
    tree: DraftTree,
    bitmask: np.ndarray | torch.Tensor,
    row_offset: int = 0,
) -> np.ndarray:
    """Fill rows ``row_offset .. row_offset + tree.num_nodes`` with each node's mask (root
    first; the root's state is the matcher's current one, i.e. the root token is already
    accepted). Returns bool ``[num_nodes]``: False where the grammar rejects the node's path
    (its row is all zeros)."""
    buf = _np_rows(bitmask)
    return _core.fill_tree_bitmask(matcher._m, tree.tokens, tree.parents, buf, int(row_offset))


def build_ddtree_constrained(
    logprobs: Any,
    token_ids: Any,
    budget: int,
    matcher: Matcher,
    root_token: int = -1,
    min_logprob: float | None = None,
) -> DraftTree:
    """Grammar-aware DDTree: as :func:`specdec.build_ddtree` over ``[L, K]`` marginals, with
    each node's candidate ranks restricted to the tokens its grammar state allows (the root's
    state is the matcher's), so the whole budget goes to valid prefixes. Unlike the plain
    builder, all K columns are read: the grammar may reject any number of top-ranked tokens,
    so pass as wide a top-K as the constraint may need."""
    lp = _as_array(logprobs, np.float32, "logprobs", 2, exact=True)
    ids = _as_array(token_ids, np.int64, "token_ids", 2, exact=False)
    arrays = _core.build_ddtree_constrained(
        lp, ids, int(budget), matcher._m, root_token, min_logprob
    )
    return DraftTree._from_core(arrays)


def apply_token_bitmask(logits: torch.Tensor, bitmask: Any) -> torch.Tensor:
    """Set disallowed logits to -inf in place and return ``logits``.

    ``logits`` ``[B, V']`` (or ``[V']``) on any device; ``bitmask`` int32 ``[B, W]`` (numpy
    or torch, any device). Ids at or past ``32 * W`` are disallowed. Raises
    :class:`NoAllowedTokens` (logits untouched) if a row allows no token among its ``V'``.
    """
    import torch

    if isinstance(bitmask, np.ndarray):
        bitmask = torch.from_numpy(bitmask)
    if not isinstance(bitmask, torch.Tensor) or bitmask.dtype != torch.int32:
        raise GrammarError("bitmask must be an int32 numpy array or torch tensor")
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point():
        raise GrammarError("logits must be a floating-point torch tensor")
    squeeze = logits.dim() == 1
    lg = logits.unsqueeze(0) if squeeze else logits
    bm = bitmask.unsqueeze(0) if bitmask.dim() == 1 else bitmask
    if lg.dim() != 2 or bm.dim() != 2 or bm.shape[0] != lg.shape[0]:
        raise GrammarError(
            f"logits {tuple(logits.shape)} and bitmask {tuple(bitmask.shape)} must be [B, V] "
            "and [B, ceil(V/32)]"
        )
    vocab = lg.shape[1]
    bm = bm.to(lg.device, non_blocking=True)
    shifts = torch.arange(32, device=lg.device, dtype=torch.int32)
    allowed = ((bm.unsqueeze(-1) >> shifts) & 1).bool().flatten(1)
    if allowed.shape[1] < vocab:
        pad = torch.zeros(
            (allowed.shape[0], vocab - allowed.shape[1]), dtype=torch.bool, device=lg.device
        )
        allowed = torch.cat([allowed, pad], dim=1)
    allowed = allowed[:, :vocab]
    empty = ~allowed.any(dim=1)
    if bool(empty.any()):
        rows = torch.nonzero(empty).flatten().tolist()
        raise NoAllowedTokens(f"no token is allowed in row(s) {rows} of the bitmask")
    lg.masked_fill_(~allowed, float("-inf"))
    return logits
