"""Masks of random regexes along random walks equal brute force (every token's bytes run
through the DFA one by one), on the Tekken 131k and a SentencePiece 32k vocabulary."""

from __future__ import annotations

import os
import random
import re

import mistral_common
import numpy as np
import pytest

import specdec
from specdec import Matcher, RegexGrammar, Vocabulary

DATA = os.path.join(os.path.dirname(mistral_common.__file__), "data")
N_REGEXES = 200

LITERALS = ["a", "ab", "the", "foo", "12", "é", "中文", "😀", " ", '"', "-", ":", "x y", "ß"]
CLASSES = ["[a-z]", "[0-9]", '[^"]', ".", "[a-zé]", r"\d", "[ -~]", "[A-Z_]", "[^a-z]", r"\s"]
QUANT = ["", "", "?", "*", "+", "{1,3}", "{2}"]
META = set(".+*?()|[]{}^$\\#&-~")


def _lit(s: str) -> str:
    return "".join("\\" + c if c in META else c for c in s)


def random_regex(rng: random.Random, depth: int = 0) -> str:
    parts = []
    for _ in range(rng.randint(1, 4)):
        r = rng.random()
        if r < 0.4:
            atom = _lit(rng.choice(LITERALS))
            atom = f"(?:{atom})" if len(atom) > 1 else atom
        elif r < 0.8 or depth >= 1:
            atom = rng.choice(CLASSES)
        else:
            alts = [random_regex(rng, depth + 1) for _ in range(rng.randint(2, 3))]
            atom = "(?:" + "|".join(alts) + ")"
        parts.append(atom + rng.choice(QUANT))
    return "".join(parts)


def _unpack(words: np.ndarray, n: int) -> np.ndarray:
    return np.unpackbits(words.view(np.uint8), bitorder="little")[:n].astype(bool)


@pytest.fixture(scope="module", params=["tekken", "sentencepiece"])
def vocab(request: pytest.FixtureRequest) -> Vocabulary:
    if request.param == "tekken":
        return Vocabulary.from_tekken()
    return Vocabulary.from_sentencepiece(os.path.join(DATA, "tokenizer.model.v1"))


def _partial_utf8(v: Vocabulary) -> np.ndarray:
    out = np.zeros(v.vocab_size, dtype=bool)
    for t in range(v.vocab_size):
        b = v.token_bytes(t)
        if b is not None:
            try:
                b.decode("utf-8")
            except UnicodeDecodeError:
                out[t] = True
    return out


def test_random_regexes_match_brute_force(vocab: Vocabulary) -> None:
    rng = random.Random(1234)
    n = vocab.vocab_size
    partial = _partial_utf8(vocab)
    multibyte = np.array(
        [(b := vocab.token_bytes(t)) is not None and any(c >= 0x80 for c in b) for t in range(n)]
    )
    assert partial.any() and multibyte.any()
    bm = specdec.allocate_token_bitmask(1, n)
    stats = {"states": 0, "partial": 0, "multibyte": 0, "eos": 0, "class_trie": 0}
    tested = too_large = 0
    while tested < N_REGEXES:
        pattern = random_regex(rng)
        try:
            g = RegexGrammar(vocab, pattern)
        except specdec.GrammarError as e:
            # Random nests of quantified alternations can blow up; the limit must say so.
            assert "too large" in str(e)
            too_large += 1
            continue
        tested += 1
        m = Matcher(g)
        text = b""
        for _step in range(6):
            m.fill_next_token_bitmask(bm, 0)
            expected = g._g.brute_force_mask(text)
            assert np.array_equal(bm[0].view(np.uint32), expected), (pattern, text)
            allowed = _unpack(bm[0], n)
            stats["states"] += 1
            stats["partial"] += int((allowed & partial).any())
            stats["multibyte"] += int((allowed & multibyte).any())
            eos_ok = bool(allowed[vocab.eos_ids].any())
            assert eos_ok == g.matches(text)
            try:
                s = text.decode("utf-8")
            except UnicodeDecodeError:
                s = None
            if s is not None:
                assert eos_ok == bool(re.fullmatch(pattern, s)), (pattern, text)
            ids = np.flatnonzero(allowed)
            if len(ids) == 0:
                break
            t = int(rng.choice(list(ids)))
            assert m.accept_token(t)
            if t in vocab.eos_ids:
                stats["eos"] += 1
                assert m.is_terminated()
                break
            text += vocab.token_bytes(t)
        stats["class_trie"] += int(g._g.uses_class_trie)
    # The walks really exercised multi-byte and partial-UTF-8 tokens, and both the byte trie
    # and the merged class trie (which large walks switch to).
    assert stats["partial"] > 0 and stats["multibyte"] > 0, stats
    assert 0 < stats["class_trie"] < tested, stats
    print(stats)
    assert stats["states"] >= N_REGEXES and too_large < N_REGEXES // 10, (stats, too_large)
