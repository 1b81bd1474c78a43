"""Grammar state per request: one matcher past ``max_states`` fails alone (a new matcher on
the same cached grammar, and the other live ones, go on with the right verdicts), the
grammar's chart stays within ``max_states``, and mask fills of one grammar from several
threads equal one thread's."""

from __future__ import annotations

import json
import random
import threading
from typing import Any

import numpy as np
import pytest

from specdec import (
    CfgGrammar,
    GrammarError,
    Matcher,
    Vocabulary,
    allocate_token_bitmask,
    fill_next_token_bitmask_batch,
)

# Printable ASCII one byte a token, a few fragments spanning lexemes, EOS last.
BYTES = [bytes([b]) for b in range(32, 127)]
FRAGMENTS = [b"[[", b"]]", b"],", b'{"', b'":', b'", "', b"ab", b"true", b"12"]
EOS = len(BYTES) + len(FRAGMENTS)

NESTED = {"type": "array", "items": {"$ref": "#"}}
FLAT = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "n": {"type": "integer"},
        "tags": {"type": "array", "items": {"enum": ["ab", "bc", "d e"]}},
    },
}


def byte_vocab() -> Vocabulary:
    return Vocabulary.from_bytes([*BYTES, *FRAGMENTS, None], eos_ids=[EOS])


def feed(m: Matcher, text: str) -> bool:
    """Accept ``text`` byte by byte; False at the first byte refused."""
    return all(m.accept_token(b - 32) for b in text.encode())


def verdict(g: CfgGrammar, text: str) -> bool:
    """A new matcher on ``g`` takes all of ``text`` and may end there."""
    m = g.matcher()
    return feed(m, text) and m.is_accepting()


def only_arrays(value: Any) -> bool:
    return isinstance(value, list) and all(only_arrays(x) for x in value)


def nested_ok(text: str) -> bool:
    """Independent oracle for NESTED: JSON whose every value is an array."""
    try:
        return only_arrays(json.loads(text))
    except json.JSONDecodeError:
        return False


def flat_ok(text: str) -> bool:
    """Independent oracle for FLAT (properties optional, in any order, no others)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        return False
    if not isinstance(doc, dict):
        return False
    if any(k not in FLAT["properties"] for k in doc):
        return False
    name, n, tags = doc.get("name", ""), doc.get("n", 0), doc.get("tags", [])
    return (
        isinstance(name, str)
        and len(name) <= 12
        and isinstance(n, int)
        and not isinstance(n, bool)
        and isinstance(tags, list)
        and all(t in ("ab", "bc", "d e") for t in tags)
    )


NESTED_DOCS = ["[[[]],[]]", "[]", "[[[[]]]]", " [ [ ] , [ ] ] ", "[1]", "[[]", "[],", "[[],]"]
FLAT_DOCS = [
    '{"name": "ab", "n": -3, "tags": ["bc", "d e"]}',
    '{"tags": []}',
    '{"name": "a long name!", "n": 123456789}',
    '{"n": 1, "name": "x"}',
    '{"name": "far too long a name"}',
    '{"tags": ["ab", "zz"]}',
    '{"n": 1.5}',
    "{}",
]


def test_one_request_past_max_states_fails_alone() -> None:
    v = byte_vocab()
    g = v.json_schema(NESTED, max_states=40)
    live = g.matcher()
    assert feed(live, "[[],[")
    # Each `[` nests one level deeper: the request fails once one of its steps or fills
    # needs more than 40 parser states, and a failed step changes nothing.
    deep = g.matcher()
    bm = allocate_token_bitmask(1, v.vocab_size)
    with pytest.raises(GrammarError, match="max_states"):
        for _ in range(400):
            deep.fill_next_token_bitmask(bm)
            state = (deep._m.state, deep.num_accepted)
            try:
                assert deep.accept_token(ord("[") - 32)
            except GrammarError:
                assert (deep._m.state, deep.num_accepted) == state
                raise
    # New requests on the same cached grammar, and the live one, go on.
    assert v.json_schema(NESTED, max_states=40) is g
    for text in NESTED_DOCS:
        assert verdict(g, text) == nested_ok(text), text
        assert g.matches(text) == nested_ok(text), text
    assert feed(live, "[]]]") and live.is_accepting()
    with pytest.raises(GrammarError, match="max_states"):
        g.matches("[" * 400)
    assert g.num_states <= 40


def test_small_max_states_keeps_verdicts_and_masks() -> None:
    # Documents need more states than one chart of 30 holds: charts are replaced as they
    # fill, and masks and verdicts stay those of a grammar without the small limit.
    v = byte_vocab()
    small = v.json_schema(FLAT, max_states=30)
    big = CfgGrammar.from_json_schema(v, FLAT)
    for text in FLAT_DOCS:
        assert verdict(small, text) == flat_ok(text), text
        m, o = small.matcher(), big.matcher()
        bm = allocate_token_bitmask(2, v.vocab_size)
        for b in text.encode():
            m.fill_next_token_bitmask(bm, 0)
            o.fill_next_token_bitmask(bm, 1)
            assert np.array_equal(bm[0], bm[1]), text
            assert m.accept_token(b - 32) == o.accept_token(b - 32)
            assert small.num_states <= 30
    assert not small.matches("{") and small.matches('{"n": 0}')


@pytest.fixture(scope="module")
def tekken() -> Vocabulary:
    return Vocabulary.from_tekken()


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0},
        "email": {"type": "string", "pattern": "^[a-z.]+@[a-z]+\\.[a-z]{2,3}$"},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name"],
}


def _walk(g: CfgGrammar, seed: int, steps: int) -> tuple[list[int], list[np.ndarray]]:
    """One thread: a random walk over allowed tokens, and the mask before each token and
    after the last."""
    rng = random.Random(seed)
    m = g.matcher()
    bm = allocate_token_bitmask(1, g.vocab.vocab_size)
    tokens, masks = [], []
    for _ in range(steps):
        m.fill_next_token_bitmask(bm)
        masks.append(bm[0].copy())
        ids = [t for t in m.allowed_tokens().tolist() if t not in g.vocab.eos_ids]
        if not ids:
            return tokens, masks
        # Mostly short tokens, so walks reach past the first string.
        ids.sort(key=lambda t: len(g.vocab.token_bytes(t) or b""))
        t = ids[rng.randrange(min(len(ids), 40))] if rng.random() < 0.8 else rng.choice(ids)
        assert m.accept_token(t)
        tokens.append(t)
    m.fill_next_token_bitmask(bm)
    masks.append(bm[0].copy())
    return tokens, masks


def _replay(g: CfgGrammar, tokens: list[int], start: threading.Barrier) -> list[np.ndarray]:
    m = g.matcher()
    bm = allocate_token_bitmask(1, g.vocab.vocab_size)
    masks = []
    start.wait()
    for t in [*tokens, None]:
        m.fill_next_token_bitmask(bm)
        masks.append(bm[0].copy())
        if t is not None:
            assert m.accept_token(t)
    return masks


@pytest.mark.parametrize("max_states", [None, 60])
def test_fills_from_several_threads_equal_one_thread(
    tekken: Vocabulary, max_states: int | None
) -> None:
    # Oracle: walks filled one after another in one thread, on a grammar of their own.
    seeds = range(4)
    walks = [_walk(CfgGrammar.from_json_schema(tekken, PERSON), s, 30) for s in seeds]
    # Threads replaying them at once on one fresh grammar (uncached states everywhere).
    g = CfgGrammar.from_json_schema(tekken, PERSON, max_states=max_states)
    start = threading.Barrier(len(walks))
    results: list[list[np.ndarray] | None] = [None] * len(walks)

    def run(i: int) -> None:
        results[i] = _replay(g, walks[i][0], start)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(walks))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for (_, want), got in zip(walks, results, strict=True):
        assert got is not None and len(got) == len(want)
        for a, b in zip(want, got, strict=True):
            assert np.array_equal(a, b)
    # One batch call per step, its rows filled in parallel, on another fresh grammar.
    g = CfgGrammar.from_json_schema(tekken, PERSON, max_states=max_states)
    ms = [g.matcher() for _ in walks]
    bm = allocate_token_bitmask(len(walks), tekken.vocab_size)
    for step in range(max(len(masks) for _, masks in walks)):
        live = [i for i, (_, masks) in enumerate(walks) if step < len(masks)]
        fill_next_token_bitmask_batch([ms[i] for i in live], bm, live)
        for i in live:
            assert np.array_equal(bm[i], walks[i][1][step]), (i, step)
            if step < len(walks[i][0]):
                assert ms[i].accept_token(walks[i][0][step])
    if max_states is not None:
        assert g.num_states <= max_states


def test_accept_tokens_past_max_states_changes_nothing() -> None:
    v = byte_vocab()
    g = v.json_schema(NESTED, max_states=40)
    m = g.matcher()
    assert m.accept_tokens([ord(c) - 32 for c in "[[],"]) == 4
    state = (m._m.state, m.num_accepted)
    with pytest.raises(GrammarError, match="max_states"):
        m.accept_tokens([ord("[") - 32] * 400)
    assert (m._m.state, m.num_accepted) == state
    assert m.accept_tokens([ord(c) - 32 for c in "[]]"]) == 3 and m.is_accepting()
