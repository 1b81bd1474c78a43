"""GrammarLogitsProcessor in vLLM: every constrained output is in its grammar (jsonschema,
``re``, Python's ``lark`` parser as the oracles), a request without ``extra_args`` gives
what vLLM gives without the processor, a bad spec fails its own request only (offline and
as an HTTP 400 from ``vllm serve``), and aborted and preempted requests change nobody's
output."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from vllm_support import chat_prompts, close, make_llm, metric, runner_of

PROCESSOR = "specdec.integrations.vllm:GrammarLogitsProcessor"

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "pattern": "^[a-z]{1,10}@[a-z]{1,10}\\.com$"},
    },
    "required": ["name", "age", "email"],
    "additionalProperties": False,
}
ITEMS = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {
            "item": {"enum": ["apple", "bread", "milk", "eggs"]},
            "qty": {"type": "integer", "minimum": 1, "maximum": 9},
        },
        "required": ["item", "qty"],
        "additionalProperties": False,
    },
    "minItems": 1,
    "maxItems": 3,
}
DATE = r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
CHOICES = ["positive", "negative", "neutral"]
GBNF = 'root ::= ("yes" | "no") ", because " [a-z ]{1,40} "."'
GBNF_RE = r"(yes|no), because [a-z ]{1,40}\."
LARK = """
start: pair ("; " pair) ~ 0..2
pair: KEY "=" VALUE
KEY: /[a-z]{1,8}/
VALUE: /[0-9]{1,4}/
"""

# (message, spec or None, check of the output text)
CASES: list[tuple[str, dict[str, Any] | None]] = [
    ("Describe a person as JSON with name, age and email.", {"json_schema": PERSON}),
    ("Give me a shopping list as JSON.", {"json_schema": ITEMS}),
    ("When did the Berlin wall fall? Answer with a date.", {"regex": DATE}),
    ("What is the capital of France?", None),
    ("Classify the sentiment: 'I love this phone!'", {"choice": CHOICES}),
    ("Is water wet? Answer yes or no and explain.", {"gbnf": GBNF}),
    ("Write three settings as key=value pairs.", {"lark": LARK}),
    ("Name three colours.", None),
]


def in_grammar(spec: dict[str, Any], text: str) -> bool:
    """The independent check of one output."""
    import jsonschema
    import lark

    if "json_schema" in spec:
        try:
            jsonschema.validate(json.loads(text), spec["json_schema"])
        except (ValueError, jsonschema.ValidationError):
            return False
        return True
    if "regex" in spec:
        return re.fullmatch(spec["regex"], text) is not None
    if "choice" in spec:
        return text in spec["choice"]
    if "gbnf" in spec:
        return re.fullmatch(GBNF_RE, text) is not None
    try:
        lark.Lark(spec["lark"]).parse(text)
    except lark.exceptions.LarkError:
        return False
    return True


def params(spec: dict[str, Any] | None, max_tokens: int = 96) -> Any:
    from vllm import SamplingParams

    extra = None if spec is None else {"specdec": spec}
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, extra_args=extra)


def texts_and_ids(outputs: list[Any]) -> list[tuple[str, list[int], str | None]]:
    return [
        (o.outputs[0].text, list(o.outputs[0].token_ids), o.outputs[0].finish_reason)
        for o in outputs
    ]


@pytest.fixture(scope="module")
def grammar(model_dir: Path) -> Iterator[Any]:
    llm = make_llm(model_dir, logits_processors=[PROCESSOR])
    yield llm
    close(llm)


@pytest.fixture(scope="module")
def reference(grammar: Any) -> list[tuple[str, list[int], str | None]]:
    prompts = chat_prompts(grammar, [m for m, _ in CASES])
    return texts_and_ids(grammar.generate(prompts, [params(s) for _, s in CASES]))


def test_outputs_are_in_their_grammars(reference: list[Any]) -> None:
    for (_, spec), (text, _, finish) in zip(CASES, reference, strict=True):
        if spec is not None:
            assert finish == "stop", (spec, text)
            assert in_grammar(spec, text), (spec, text)


def test_requests_without_the_key_are_untouched(
    grammar: Any, plain: Any, reference: list[Any]
) -> None:
    messages = [m for m, s in CASES if s is None]
    want = texts_and_ids(plain.generate(chat_prompts(plain, messages), params(None)))
    got = [r for (_, s), r in zip(CASES, reference, strict=True) if s is None]
    assert got == want
    # Another key of extra_args is not ours either.
    from vllm import SamplingParams

    other = SamplingParams(temperature=0.0, max_tokens=96, extra_args={"something": 1})
    assert texts_and_ids(grammar.generate(chat_prompts(grammar, messages), other)) == want


def test_a_bad_spec_fails_its_request_only(grammar: Any, reference: list[Any]) -> None:
    prompts = chat_prompts(grammar, [m for m, _ in CASES])
    for bad, words in [
        ({"regex": "(unclosed"}, "unclosed group"),
        ({"json_schema": {"type": "objectx"}}, "objectx"),
        ({"choice": []}, "at least one string"),
        ({"grammar": "x"}, "unknown key(s) 'grammar'"),
    ]:
        # vLLM raises its VLLMValidationError (HTTP 400 when served) with our message.
        with pytest.raises(Exception, match=re.escape(words)) as e:
            grammar.generate(prompts[:1], params(bad))
        assert "specdec grammar" in str(e.value)
    # Requests queued around a refused one run to the same outputs as before.
    engine = grammar.llm_engine
    engine.add_request("ok-0", prompts[0], params(CASES[0][1]))
    with pytest.raises(Exception, match="specdec grammar"):
        engine.add_request("bad", prompts[1], params({"regex": "a("}))
    engine.add_request("ok-2", prompts[2], params(CASES[2][1]))
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = list(out.outputs[0].token_ids)
    assert done == {"ok-0": reference[0][1], "ok-2": reference[2][1]}


FILLERS = [
    "Explain gravity briefly.",
    "Name three rivers.",
    "Write a haiku about rain.",
    "Count to ten.",
]


def test_aborted_and_preempted_requests_change_no_output(
    model_dir: Path, grammar: Any, plain: Any, reference: list[Any]
) -> None:
    prompts = chat_prompts(grammar, [m for m, _ in CASES])
    engine = grammar.llm_engine
    ids = [f"a-{i}" for i in range(len(CASES))]  # vLLM's outputs and aborts use these
    for rid, p, (_, s) in zip(ids, prompts, CASES, strict=True):
        engine.add_request(rid, p, params(s))
    done: dict[str, list[int]] = {}
    aborted = False
    while engine.has_unfinished_requests():
        for out in engine.step():
            if not aborted and out.request_id == ids[0] and len(out.outputs[0].token_ids) >= 5:
                engine.abort_request([ids[0]])
                aborted = True
            if out.finished:
                done[out.request_id] = list(out.outputs[0].token_ids)
    assert aborted
    assert [done[i] for i in ids[1:]] == [r[1] for r in reference[1:]]
    # A KV cache too small for the batch (5 blocks of 32 tokens, no prefix caching to share
    # the chat template's): requests are preempted and resume mid-grammar.
    small = make_llm(
        model_dir,
        logits_processors=[PROCESSOR],
        num_gpu_blocks_override=6,
        block_size=32,
        max_model_len=160,
        enable_prefix_caching=False,
    )
    # Unconstrained requests with long answers beside them fill the cache.
    fillers = chat_prompts(small, FILLERS)
    try:
        got = texts_and_ids(
            small.generate(prompts + fillers, [params(s) for _, s in CASES] + [params(None)] * 4)
        )
        assert metric(small, "vllm:num_preemptions") > 0
        assert got[: len(CASES)] == reference
        assert got[len(CASES) :] == texts_and_ids(plain.generate(fillers, params(None)))
        (proc,) = [p for p in runner_of(small).input_batch.logitsprocs.all if hasattr(p, "stats")]
        assert proc.stats.failed == [] and proc.stats.steps > 0
    finally:
        close(small)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_vllm_serve_answers_400_to_a_bad_spec(model_dir: Path, tmp_path: Path) -> None:
    port = free_port()
    vllm = Path(sys.executable).parent / "vllm"
    argv = [str(vllm), "serve", str(model_dir), "--port", str(port), "--dtype", "float32"]
    argv += ["--enforce-eager", "--max-model-len", "1024", "--served-model-name", "smollm2"]
    argv += ["--logits-processors", PROCESSOR]
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(base + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "vllm serve did not start"
            time.sleep(1)
        body = {
            "model": "smollm2",
            "messages": [{"role": "user", "content": CASES[0][0]}],
            "temperature": 0,
            "max_tokens": 96,
            "vllm_xargs": {"specdec": json.dumps({"json_schema": PERSON})},
        }
        status, out = post(base + "/v1/chat/completions", body)
        assert status == 200, out
        assert in_grammar({"json_schema": PERSON}, out["choices"][0]["message"]["content"])
        status, out = post(
            base + "/v1/chat/completions",
            {**body, "vllm_xargs": {"specdec": json.dumps({"regex": "a("})}},
        )
        assert status == 400, out
        assert "specdec grammar" in json.dumps(out) and "unclosed group" in json.dumps(out)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
