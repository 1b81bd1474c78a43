"""The three decode entry points (``SpeculativeGenerator.generate``,
``autoregressive_generate``, ``beam_search``) speak one vocabulary: the same argument names,
the same stop rule, the same ``max_new_tokens`` check, the same constraint semantics and the
same result fields, checked against a plain greedy decoder that recomputes every step from
scratch (no cache, no incremental state)."""

from __future__ import annotations

import inspect
from collections.abc import Collection
from typing import Any

import numpy as np
import pytest
import torch

import specdec
from specdec.decode import (
    GenerationResult,
    RequestOutput,
    SpeculativeGenerator,
    autoregressive_generate,
    beam_search,
)
from specdec.errors import ConfigError, NoAllowedTokens, SpecdecTypeError
from specdec.models import LlamaModel
from specdec.testing import OracleDrafter, tiny_config

VOCAB = 32
CFG = tiny_config(VOCAB)
PROMPTS = [[3, 1, 4, 1, 5], [9, 2, 6], [7]]


@pytest.fixture(scope="module")
def target() -> LlamaModel:
    return LlamaModel(CFG).double().init_random(3)


def plain_greedy(
    target: LlamaModel,
    prompt: list[int],
    n: int,
    stops: Collection[int] = (),
    matcher: Any = None,
) -> tuple[list[int], str]:
    """Greedy decoding by a full forward over the whole context at every step, with the
    constraint's allowed set applied by hand; returns (tokens, finish reason)."""
    out: list[int] = []
    while len(out) < n:
        ctx = prompt + out
        logits = target(
            torch.tensor(ctx), torch.arange(len(ctx)), target.new_cache(len(ctx)), None
        )[-1]
        if matcher is not None:
            allowed = torch.from_numpy(matcher.allowed_tokens())
            masked = torch.full_like(logits, float("-inf"))
            masked[allowed] = logits[allowed]
            logits = masked
        tok = int(logits.argmax())
        out.append(tok)
        if matcher is not None:
            assert matcher.accept_token(tok)
            if matcher.is_terminated():
                return out, "stop"
        if tok in stops:
            return out, "stop"
    return out, "length"


def three(target: LlamaModel, prompt: list[int], **kw: Any) -> list[tuple[list[int], str, int]]:
    """(tokens, finish reason, prompt length) from each entry point, greedy, same arguments."""
    ar = autoregressive_generate(target, prompt, **kw)
    gen = SpeculativeGenerator(target, OracleDrafter(target, miss=0.3, seed=1), budget=6)
    spec = gen.generate(prompt, **kw)
    beam = beam_search(target, prompt, num_beams=1, **kw)
    (h,) = beam.hypotheses[0]
    return [
        (ar.tokens, str(ar.finish_reason), ar.prompt_len),
        (spec.tokens, str(spec.finish_reason), spec.prompt_len),
        (h.tokens, h.finish_reason, h.prompt_len),
    ]


def test_the_same_names_in_all_three() -> None:
    sigs = {
        "generate": inspect.signature(SpeculativeGenerator.generate),
        "autoregressive_generate": inspect.signature(autoregressive_generate),
        "beam_search": inspect.signature(beam_search),
    }
    kw_only = inspect.Parameter.KEYWORD_ONLY
    for name, sig in sigs.items():
        ps = sig.parameters
        for arg in ("max_new_tokens", "eos_token_id", "stop_tokens", "constraint"):
            assert arg in ps and ps[arg].kind is kw_only, (name, arg)
        assert ps["max_new_tokens"].default is inspect.Parameter.empty, name
        assert ps["constraint"].default is None and ps["stop_tokens"].default is None, name
    assert list(sigs["autoregressive_generate"].parameters)[:2] == ["target", "prompt"]
    assert list(sigs["beam_search"].parameters)[:2] == ["target", "prompts"]
    beam = list(sigs["beam_search"].parameters.values())
    assert all(p.kind is kw_only for p in beam[2:])  # everything after the prompts
    gen = inspect.signature(SpeculativeGenerator.__init__).parameters
    assert "max_depth" in gen and "depth" not in gen
    # The result and stream types are exported where the entry points are.
    assert specdec.GenerationResult is GenerationResult
    assert specdec.RequestOutput is RequestOutput


def test_same_tokens_finish_reason_and_prompt_len(target: LlamaModel) -> None:
    n = 14
    for prompt in PROMPTS:
        free, why = plain_greedy(target, prompt, n)
        assert why == "length"
        assert three(target, prompt, max_new_tokens=n) == [(free, "length", len(prompt))] * 3
        # A token the free run emits mid-way, as a stop token and as the EOS: both end the
        # request there, the stop token included.
        cut = free.index(free[n // 2]) + 1
        want = [(free[:cut], "stop", len(prompt))] * 3
        assert three(target, prompt, max_new_tokens=n, stop_tokens=[free[n // 2]]) == want
        assert three(target, prompt, max_new_tokens=n, eos_token_id=free[n // 2]) == want
        # Both together: whichever comes first; an id as an int or a list means the same.
        first, later = free[2], free[n // 2]
        cut = min(free.index(first), free.index(later)) + 1
        got = three(target, prompt, max_new_tokens=n, stop_tokens=later, eos_token_id=[first])
        assert got == [(free[:cut], "stop", len(prompt))] * 3
        # A stop token on the very last token still reads "stop".
        got = three(target, prompt, max_new_tokens=cut, stop_tokens=[free[cut - 1]])
        assert got == [(free[:cut], "stop", len(prompt))] * 3


def test_zero_new_tokens_in_all_three(target: LlamaModel) -> None:
    p = PROMPTS[0]
    assert three(target, p, max_new_tokens=0) == [([], "length", len(p))] * 3
    r = beam_search(target, [p, [1]], num_beams=2, max_new_tokens=0, num_return_sequences=2)
    assert [[(h.tokens, h.prompt_len) for h in hs] for hs in r.hypotheses] == [
        [([], len(p))] * 2,
        [([], 1)] * 2,
    ]
    assert r.steps == 0


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3", None])
def test_bad_max_new_tokens_is_the_same_config_error(target: LlamaModel, bad: Any) -> None:
    gen = SpeculativeGenerator(target, budget=4)
    calls = [
        lambda: autoregressive_generate(target, [1, 2], max_new_tokens=bad),
        lambda: gen.generate([1, 2], max_new_tokens=bad),
        lambda: gen.submit([1, 2], max_new_tokens=bad),
        lambda: beam_search(target, [1, 2], num_beams=2, max_new_tokens=bad),
    ]
    messages = set()
    for call in calls:
        with pytest.raises(ConfigError, match="max_new_tokens") as e:
            call()
        messages.add(str(e.value))
    assert len(messages) == 1  # one check, one message
    assert not gen.has_unfinished()
    # A numpy integer is an int.
    n = np.int64(3)
    assert len(autoregressive_generate(target, [1, 2], max_new_tokens=n).tokens) == 3  # type: ignore[arg-type]
    assert len(gen.generate([1, 2], max_new_tokens=n).tokens) == 3  # type: ignore[arg-type]


def test_bad_stop_tokens_are_the_same_error(target: LlamaModel) -> None:
    gen = SpeculativeGenerator(target, budget=4)
    entry = [
        lambda **kw: autoregressive_generate(target, [1, 2], max_new_tokens=3, **kw),
        lambda **kw: gen.generate([1, 2], max_new_tokens=3, **kw),
        lambda **kw: beam_search(target, [1, 2], num_beams=2, max_new_tokens=3, **kw),
    ]
    cases: list[tuple[dict[str, Any], type[Exception], str]] = [
        ({"stop_tokens": [VOCAB]}, ConfigError, "stop_tokens"),
        ({"eos_token_id": -1}, ConfigError, "eos_token_id"),
        ({"stop_tokens": "x"}, SpecdecTypeError, "stop_tokens"),
        ({"eos_token_id": 2.0}, SpecdecTypeError, "eos_token_id"),
        ({"constraint": "[ab]+"}, SpecdecTypeError, "constraint"),
    ]
    for kw, exc, words in cases:
        for call in entry:
            with pytest.raises(exc, match=words):
                call(**kw)
    assert not gen.has_unfinished()


def constrained_vocab() -> specdec.Vocabulary:
    return specdec.Vocabulary.from_bytes(
        [bytes([c]) for c in b"abcdefghijklmnopqrstuvwxyz01234"] + [None], eos_ids=[VOCAB - 1]
    )


def test_constraint_is_the_same_in_all_three(target: LlamaModel) -> None:
    vocab = constrained_vocab()
    grammar = vocab.regex(r"(ab|cd|[0-4])+x?")
    short = vocab.regex(r"(ab|cd|[0-4]){1,3}x?")  # its end comes: then only EOS is allowed
    stop = VOCAB - 1
    ended = 0
    for prompt in PROMPTS:
        for g, stops in ((grammar, [stop]), (short, [stop]), (short, None)):
            # Without stop tokens, the grammar's end (its EOS accepted) stops the request.
            want, why = plain_greedy(target, prompt, 16, stops or (), g.matcher())
            got = three(target, prompt, max_new_tokens=16, stop_tokens=stops, constraint=g)
            assert got == [(want, why, len(prompt))] * 3, (prompt, stops)
            ended += stops is None and why == "stop"
        # The generator's own constraint, the same.
        gen = SpeculativeGenerator(target, OracleDrafter(target, miss=0.3), constraint=short)
        assert gen.generate(prompt, max_new_tokens=16).tokens == want
    assert ended == len(PROMPTS)
    # A matcher is a state to start from: each call forks it, leaving it where it was.
    m = grammar.matcher()
    assert m.accept_token(2)  # "c": a "d" must follow
    want, _ = plain_greedy(target, [5], 10, {stop}, m.fork())
    assert want[0] == 3
    got = three(target, [5], max_new_tokens=10, stop_tokens=[stop], constraint=m)
    assert [g[0] for g in got] == [want] * 3
    assert m.num_accepted == 1


def test_no_allowed_token_is_the_same_error(target: LlamaModel) -> None:
    vocab = specdec.Vocabulary.from_bytes([bytes([97 + i]) for i in range(VOCAB)], eos_ids=[])
    grammar = vocab.regex("ab")  # after "ab" nothing is allowed, and no EOS ends it
    gen = SpeculativeGenerator(target, strategy="ar")
    for call in (
        lambda: autoregressive_generate(target, [1, 2], max_new_tokens=5, constraint=grammar),
        lambda: gen.generate([1, 2], max_new_tokens=5, constraint=grammar),
    ):
        with pytest.raises(NoAllowedTokens, match="allows no token"):
            call()
    # Room for exactly "ab": both finish by length, never asking for a third token.
    ar = autoregressive_generate(target, [1, 2], max_new_tokens=2, constraint=grammar)
    assert ar.tokens == [0, 1] and ar.finish_reason == "length"


def test_autoregressive_result_fields(target: LlamaModel) -> None:
    a = autoregressive_generate(target, PROMPTS[0], max_new_tokens=6)
    b = autoregressive_generate(target, PROMPTS[1], max_new_tokens=6)
    for r, p in ((a, PROMPTS[0]), (b, PROMPTS[1])):
        assert r.prompt_len == len(p) and r.finish_reason == "length" and r.error is None
        assert set(r.timings) == {"prefill", "mask", "forward", "rule", "commit"}
        assert r.steps == 6 and r.first_token_seconds is not None
        assert 0.0 <= r.first_token_seconds <= r.seconds
    assert a.request_id != b.request_id
    beam = beam_search(target, PROMPTS[:2], num_beams=2, max_new_tokens=4)
    assert set(beam.timings) == {"prefill", "forward", "select", "reorder"}
    assert [hs[0].prompt_len for hs in beam.hypotheses] == [len(PROMPTS[0]), len(PROMPTS[1])]
