"""Serving soak: ``specdec serve`` under many requests of mixed, seeded traffic over HTTP.

The script starts ``python -m specdec serve`` on a free 127.0.0.1 port, waits for
``/health``, warms it up with one request of each kind, then sends ``--requests`` requests
from ``--concurrency`` asyncio clients over raw ``httpx`` (so malformed bodies go out as
written). The traffic is drawn from ``--seed``, one request after the other:

* chat and text completions, streamed or not; ``max_tokens`` mostly 1-4, often up to 16,
  sometimes up to 32, rarely up to 128 (:func:`draw_max_tokens`: the mix sets the run's
  length); greedy, or sampled with a seed (or none); some with ``n`` 2, some with ``stop``
  strings, a cache salt, a system prompt or an earlier turn; text completions also with
  token-id prompts and two prompts in one request;
* constrained requests: ``response_format`` ``json_schema`` (a few small schemas, strict or
  not) or ``json_object``, and ``regex``; every choice that ends with ``stop`` must parse
  and validate (``jsonschema``), or fullmatch;
* cancellations: streams that the client closes after a few chunks, and non-streamed
  requests whose client gives up after a fraction of a second (and disconnects);
* malformed bodies: invalid JSON, wrong types, out-of-range values, unknown and
  unsupported fields, an unknown model, invalid schemas, regexes and grammars: each must
  get its 4xx (and ``param``) with OpenAI's error body
  ``{"error": {"message", "type", "param", "code"}}``.

A 429 (queue full) is allowed: it is counted and the request is retried once after its
``Retry-After``. Every reply is checked: its status, its choices (each with one finish
reason, ``stop`` or ``length``), no stop string in its text, a stream's chunks and its
closing ``data: [DONE]``. Greedy replies to the same request (``max_tokens``, ``n``,
streaming and the cache salt aside) are compared with each other (one is a prefix of
the other, or equal when the shorter one stopped): a disagreement is reported, not
failed, since batched float32 forwards may break a near tie either way.

The requirements (exit status 1 when one fails): no 5xx; no broken stream (one that ends
without ``data: [DONE]`` and was not closed by its client) and no request past its
deadline (``--timeout``); no reply that fails its checks; the server's resident memory
(``VmRSS``, sampled every 1,000 requests, or every tenth of a shorter run) grows less
than ``--max-rss-growth`` percent from the first sample to the last, taken at the end;
once the traffic stops, ``/metrics`` shows no KV block in use and no request running or
waiting, and the process has no more threads than after warm-up; SIGTERM stops it with
exit status 0.

``make soak-serve`` runs ``python3 tests/soak_serve.py --requests 10000``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from random import Random
from typing import Any

import httpx
import jsonschema  # type: ignore[import-untyped, unused-ignore]

from serve_harness import Server, poll, start_server

SERVER_ARGS = "--max-batch 8 --max-queue 64 --threads 2"
RSS_EVERY = 1000  # requests between resident-memory samples
IDLE_PRUNE_S = 10.5  # anyio's thread pool stops a worker idle this long, at its next call
JSON_HEADERS = {"content-type": "application/json"}

# -- the traffic -----------------------------------------------------------------------------
CHAT_PROMPTS = [
    "What is the capital of France?",
    "Write a Python function that adds two numbers.",
    "List three colors.",
    "Name a large animal.",
    "Explain in one sentence what a CPU does.",
    "Repeat exactly: the quick brown fox jumps over the lazy dog.",
    "Count from 1 to 20, one number per line.",
    "What is 12 times 7?",
    "Give me a haiku about autumn.",
    "Translate 'good morning' into Spanish.",
    "Why is the sky blue?",
    "Write the word 'naïve', then 日本語, then an emoji: 🙂.",
    "Summarize the plot of Romeo and Juliet in two sentences.",
    "What are the three states of matter?",
    "Suggest a name for a pet fish.",
    "How many days are there in a leap year?",
]
SYSTEM_PROMPTS = [
    "You are a terse assistant. Answer in one sentence.",
    "You are a helpful teacher who explains things to children.",
]
TEXT_PROMPTS = [
    "Once upon a time",
    "The first five prime numbers are",
    "def fibonacci(n):",
    "The capital of Germany is",
    "Ingredients for a simple pancake recipe:",
    "Story 7:",
    "In 1969, the first humans",
    "import numpy as np\n",
    "Dear Sir or Madam,",
    "The quick brown fox",
]
STOP_STRINGS = [".", "\n", " the", ",", "\n\n", "Paris", "def ", "!", " and"]
SALTS = ["tenant-a", "tenant-b", "tenant-c"]

SCHEMAS: dict[str, tuple[str, dict[str, Any]]] = {
    # name: (a prompt asking for it, the schema)
    "answer": (
        "Is water wet? Answer as JSON.",
        {
            "type": "object",
            "properties": {"answer": {"type": "boolean"}},
            "required": ["answer"],
            "additionalProperties": False,
        },
    ),
    "city": (
        "Give a city and its population as JSON.",
        {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 16},
                "population": {"type": "integer", "minimum": 0, "maximum": 100000000},
            },
            "required": ["city", "population"],
            "additionalProperties": False,
        },
    ),
    "color": (
        "Pick a color and a shade from 1 to 9, as JSON.",
        {
            "type": "object",
            "properties": {
                "color": {"enum": ["red", "green", "blue"]},
                "shade": {"type": "integer", "minimum": 1, "maximum": 9},
            },
            "required": ["color"],
        },
    ),
    "tags": (
        "Give up to three one-word tags for a blog post about cooking, as a JSON list.",
        {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
    ),
    "person": (
        "Describe a person called Ana who is 31 and has a cat.",
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 20},
                "age": {"type": "integer", "minimum": 0, "maximum": 150},
                "pets": {
                    "type": "array",
                    "items": {"enum": ["cat", "dog", "fish"]},
                    "maxItems": 3,
                },
            },
            "required": ["name", "age", "pets"],
            "additionalProperties": False,
        },
    ),
}
PATTERNS: dict[str, tuple[str, str]] = {
    # name: (a prompt, the regex)
    "number": ("What is 2 + 2? Answer with a number.", r"[0-9]{1,3}"),
    "yesno": ("Is the sun a star? Answer yes or no.", r"(yes|no)"),
    "words": ("Name some fruits.", r"[a-z]{1,8}( [a-z]{1,8}){0,3}"),
    "date": ("When did the Apollo 11 mission land? Give the date.", r"[0-9]{4}-[0-9]{2}-[0-9]{2}"),
    "colors": ("Name one or two colors.", r"(red|green|blue)( and (red|green|blue))?"),
    "sentence": ("Describe the sea in a few words.", r"[A-Z][a-z]{0,10}( [a-z]{1,10}){0,4}\."),
}

# Traffic kinds and their weights.
KINDS: dict[str, float] = {
    "chat": 0.22,
    "chat-stream": 0.14,
    "text": 0.12,
    "text-stream": 0.08,
    "json-schema": 0.07,
    "json-object": 0.03,
    "regex": 0.07,
    "cancel-stream": 0.06,
    "cancel-wait": 0.05,
    "malformed": 0.16,
}


@dataclass
class Plan:
    """One drawn request: where it goes, its body, and what its reply must be."""

    index: int
    kind: str
    path: str
    body: dict[str, Any] | bytes
    stream: bool = False
    choices: int = 1  # choices the reply must have
    max_tokens: int = 0
    stops: list[str] = field(default_factory=list)
    schema: dict[str, Any] | None = None  # a choice that ends with "stop" must validate
    json_object: bool = False  # ... must be a JSON object
    pattern: str | None = None  # ... must fullmatch
    close_after: int | None = None  # chunks the client reads before it closes the stream
    give_up_after: float | None = None  # seconds the client waits for a non-streamed reply
    want_status: int = 200
    want_param: str | None = None  # the error's param, for a malformed body (None: any)
    label: str = ""  # what is wrong with a malformed body
    greedy_key: str | None = None  # greedy replies with one key must agree

    @property
    def content(self) -> bytes:
        return self.body if isinstance(self.body, bytes) else json.dumps(self.body).encode()

    @property
    def include_usage(self) -> bool:
        opts = self.body.get("stream_options") if isinstance(self.body, dict) else None
        return isinstance(opts, dict) and bool(opts.get("include_usage"))


def draw_max_tokens(rng: Random) -> int:
    """Mostly very short (1-4), often up to 16, sometimes up to 32, rarely up to 128: on 2
    cores the server runs some 5-7 steps of up to 8 requests a second, and 10^4 requests
    of this mix take some 7,300 steps, about 18 minutes."""
    u = rng.random()
    if u < 0.7:
        return rng.randint(1, 4)
    if u < 0.92:
        return rng.randint(5, 16)
    return rng.randint(17, 32) if u < 0.985 else rng.randint(33, 128)


def chat_messages(rng: Random, prompt: str) -> list[dict[str, str]]:
    msgs: list[dict[str, str]] = []
    if rng.random() < 0.2:
        msgs.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    if rng.random() < 0.05:  # an earlier turn
        msgs += [
            {"role": "user", "content": rng.choice(CHAT_PROMPTS)},
            {"role": "assistant", "content": "Sure."},
        ]
    if rng.random() < 0.03:  # a prompt seen once (new prefixes for the prefix cache)
        prompt += f" (#{rng.randrange(10**6)})"
    msgs.append({"role": "user", "content": prompt})
    return msgs


def sampling(rng: Random, body: dict[str, Any], greedy: float = 0.5) -> bool:
    """Greedy (returns True) or sampled settings into ``body``."""
    if rng.random() < greedy:
        body["temperature"] = 0
        return True
    body["temperature"] = round(rng.uniform(0.3, 1.2), 2)
    if rng.random() < 0.3:
        body["top_p"] = round(rng.uniform(0.8, 1.0), 2)
    if rng.random() < 0.8:
        body["seed"] = rng.randrange(2**31)
    return False


def base_request(
    rng: Random, index: int, kind: str, model: str, chat: bool, prompt: str | None = None
) -> Plan:
    """A plain chat or text completion (no stream, one choice), before the kind's extras."""
    body: dict[str, Any] = {"model": model}
    prompts = 1
    if chat:
        body["messages"] = chat_messages(rng, prompt or rng.choice(CHAT_PROMPTS))
        path = "/chat/completions"
    else:
        path = "/completions"
        u = rng.random()
        if prompt is not None:
            body["prompt"] = prompt
        elif u < 0.1:
            body["prompt"] = [rng.randrange(1, 1000) for _ in range(rng.randint(3, 12))]
        elif u < 0.15:
            body["prompt"] = rng.sample(TEXT_PROMPTS, 2)
            prompts = 2
        else:
            body["prompt"] = rng.choice(TEXT_PROMPTS)
    if rng.random() < 0.05:
        body["cache_salt"] = rng.choice(SALTS)
    return Plan(index, kind, path, body, choices=prompts)


def set_max_tokens(rng: Random, plan: Plan, n: int) -> None:
    assert isinstance(plan.body, dict)
    plan.max_tokens = n
    if plan.path == "/chat/completions" and rng.random() < 0.1:
        plan.body["max_completion_tokens"] = n
    else:
        plan.body["max_tokens"] = n


def set_stream(rng: Random, plan: Plan) -> None:
    assert isinstance(plan.body, dict)
    plan.stream = True
    plan.body["stream"] = True
    if rng.random() < 0.6:
        plan.body["stream_options"] = {"include_usage": True}


def greedy_key(plan: Plan) -> str:
    """The request without what may differ between replies that must agree."""
    assert isinstance(plan.body, dict)
    skip = {"max_tokens", "max_completion_tokens", "stream", "stream_options", "seed", "n"}
    skip.add("cache_salt")  # a salt changes what is cached and drafted, never the reply
    return plan.path + json.dumps({k: v for k, v in plan.body.items() if k not in skip})


def draw_plain(rng: Random, plan: Plan, streamed: bool) -> None:
    assert isinstance(plan.body, dict)
    prompts = plan.choices
    greedy = sampling(rng, plan.body)
    set_max_tokens(rng, plan, draw_max_tokens(rng))
    if rng.random() < 0.1:
        plan.body["n"] = 2
        plan.choices *= 2
    if rng.random() < 0.15:
        plan.stops = rng.sample(STOP_STRINGS, rng.randint(1, 2))
        plan.body["stop"] = plan.stops[0] if len(plan.stops) == 1 else plan.stops
    if streamed:
        set_stream(rng, plan)
    # A stop string may hide a reply's tail (no prefix order), two prompts have two replies.
    if greedy and not plan.stops and prompts == 1:
        plan.greedy_key = greedy_key(plan)


def draw_constrained(rng: Random, index: int, kind: str, model: str) -> Plan:
    chat = rng.random() < 0.8
    if kind == "regex":
        prompt, pattern = PATTERNS[rng.choice(sorted(PATTERNS))]
        plan = base_request(rng, index, kind, model, chat, prompt if chat else prompt + "\n")
        assert isinstance(plan.body, dict)
        plan.body["regex"] = plan.pattern = pattern
        n_max = rng.randint(4, 12)
    elif kind == "json-object":
        plan = base_request(rng, index, kind, model, chat, "Give me a JSON object about Paris.")
        assert isinstance(plan.body, dict)
        plan.body["response_format"] = {"type": "json_object"}
        plan.json_object = True
        n_max = rng.randint(6, 24)
    else:
        prompt, schema = SCHEMAS[rng.choice(sorted(SCHEMAS))]
        plan = base_request(rng, index, kind, model, chat, prompt if chat else prompt + "\n")
        assert isinstance(plan.body, dict)
        spec: dict[str, Any] = {"name": "reply", "schema": schema}
        if rng.random() < 0.5:
            spec["strict"] = True
        plan.body["response_format"] = {"type": "json_schema", "json_schema": spec}
        plan.schema = schema
        n_max = rng.randint(12, 40)
    greedy = sampling(rng, plan.body, greedy=0.6)
    set_max_tokens(rng, plan, n_max)
    if rng.random() < 0.1:
        plan.body["n"] = 2
        plan.choices *= 2
    if rng.random() < 0.3:
        set_stream(rng, plan)
    if greedy:
        plan.greedy_key = greedy_key(plan)
    return plan


def draw_cancel(rng: Random, index: int, kind: str, model: str) -> Plan:
    plan = base_request(rng, index, kind, model, rng.random() < 0.7)
    assert isinstance(plan.body, dict)
    sampling(rng, plan.body)
    set_max_tokens(rng, plan, rng.randint(16, 128))
    if kind == "cancel-stream":
        set_stream(rng, plan)
        plan.close_after = rng.randint(1, 6)
    else:
        plan.give_up_after = round(rng.uniform(0.05, 0.6), 3)
    return plan


def _cut_json(rng: Random, model: str) -> bytes:
    good = json.dumps({"model": model, "messages": [{"role": "user", "content": "Hi there"}]})
    return good[: rng.randrange(len(good) - 1)].encode()


# Malformed bodies: (label, path, body or a function of the model and rng, status, param).
C, T = "/chat/completions", "/completions"
BodyFn = Callable[[Random, str], "dict[str, Any] | bytes"]
MALFORMED: list[tuple[str, str, dict[str, Any] | bytes | BodyFn, int, str | None]] = [
    ("invalid-json", C, _cut_json, 400, None),
    ("invalid-json", C, b"", 400, None),
    ("invalid-json", C, b"{not json", 400, None),
    ("invalid-json", C, b"\xff\xfe{\x00", 400, None),
    ("wrong-type", T, b"[1, 2]", 400, None),
    ("wrong-type", C, {"max_tokens": "9"}, 400, "max_tokens"),
    ("wrong-type", C, {"max_tokens": True}, 400, "max_tokens"),
    ("wrong-type", C, {"temperature": "0.5"}, 400, "temperature"),
    ("wrong-type", C, {"messages": "hi"}, 400, "messages"),
    ("wrong-type", C, {"messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content"),
    ("wrong-type", C, {"messages": [{"role": "robot", "content": "x"}]}, 400, "messages[0].role"),
    ("wrong-type", C, {"stream": "yes"}, 400, "stream"),
    ("wrong-type", C, {"n": 2.0}, 400, "n"),
    ("wrong-type", C, {"stop": 5}, 400, "stop"),
    ("wrong-type", T, {"prompt": [1, "a"]}, 400, "prompt"),
    ("out-of-range", C, {"max_tokens": 0}, 400, "max_tokens"),
    ("out-of-range", C, {"max_tokens": -3}, 400, "max_tokens"),
    ("out-of-range", C, {"max_tokens": 100000}, 400, "max_tokens"),
    ("out-of-range", C, {"temperature": 2.5}, 400, "temperature"),
    ("out-of-range", C, {"temperature": -0.5}, 400, "temperature"),
    ("out-of-range", C, {"top_p": 0}, 400, "top_p"),
    ("out-of-range", C, {"top_p": 1.5}, 400, "top_p"),
    ("out-of-range", C, {"n": 0}, 400, "n"),
    ("out-of-range", C, {"n": 17}, 400, "n"),
    ("out-of-range", C, {"top_k": -2}, 400, "top_k"),
    ("out-of-range", T, {"prompt": "x", "seed": 2**70}, 400, "seed"),
    ("out-of-range", C, {"stop": [""]}, 400, "stop"),
    ("out-of-range", C, {"stop": [f"s{i}" for i in range(17)]}, 400, "stop"),
    ("out-of-range", C, {"messages": []}, 400, "messages"),
    ("out-of-range", T, {"prompt": []}, 400, "prompt"),
    ("out-of-range", T, {"prompt": [10**9]}, 400, "prompt"),
    ("out-of-range", C, {"stop_token_ids": [10**9]}, 400, "stop_token_ids"),
    ("unknown-field", C, lambda rng, m: {f"frobnicate_{rng.randrange(100)}": 1}, 400, None),
    ("unsupported", T, {"prompt": "x", "best_of": 3}, 400, "best_of"),
    ("unsupported", C, {"logprobs": True}, 400, "logprobs"),
    ("unsupported", T, {"prompt": "x", "echo": True}, 400, "echo"),
    ("unsupported", C, {"tools": [{"type": "function"}]}, 400, "tools"),
    ("unknown-model", C, {"model": "gpt-9"}, 404, "model"),
    ("unknown-model", T, {"model": "no-such-model", "prompt": "x"}, 404, "model"),
    (
        "invalid-schema",
        C,
        {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "nope"}}}},
        400,
        "response_format.json_schema.schema",
    ),
    ("invalid-schema", C, {"response_format": {"type": "json_schema"}}, 400, "response_format"),
    ("invalid-schema", C, {"response_format": {"type": "xml"}}, 400, "response_format.type"),
    ("invalid-regex", C, {"regex": "(a"}, 400, "regex"),
    ("invalid-regex", T, {"prompt": "x", "regex": "[z-a]"}, 400, "regex"),
    ("invalid-regex", C, {"regex": "a{3,1}"}, 400, "regex"),
    ("invalid-regex", T, {"prompt": "x", "regex": "*a"}, 400, "regex"),
    ("invalid-grammar", C, {"gbnf": "root ::= undefined"}, 400, "gbnf"),
    ("invalid-grammar", C, {"lark": "start: ("}, 400, "lark"),
    ("invalid-grammar", C, {"regex": "a", "gbnf": 'root ::= "a"'}, 400, None),
]


def draw_malformed(rng: Random, index: int, model: str) -> Plan:
    label, path, spec, status, param = rng.choice(MALFORMED)
    body = spec(rng, model) if callable(spec) else spec
    if isinstance(body, dict):
        body = dict(body)
        body.setdefault("model", model)
        body.setdefault("max_tokens", 4)  # short, should the server take it after all
        if path == C:
            body.setdefault("messages", [{"role": "user", "content": rng.choice(CHAT_PROMPTS)}])
        else:
            body.setdefault("prompt", rng.choice(TEXT_PROMPTS))
        if param is None and label == "unknown-field":
            param = next(k for k in body if k.startswith("frobnicate_"))
        if "stream" not in body and rng.random() < 0.3:
            body["stream"] = True  # refused before any event is sent: still a JSON 4xx
    return Plan(index, "malformed", path, body, want_status=status, want_param=param, label=label)


def draw(rng: Random, index: int, model: str) -> Plan:
    kind = rng.choices(list(KINDS), weights=list(KINDS.values()))[0]
    if kind == "malformed":
        return draw_malformed(rng, index, model)
    if kind in ("json-schema", "json-object", "regex"):
        return draw_constrained(rng, index, kind, model)
    if kind.startswith("cancel"):
        return draw_cancel(rng, index, kind, model)
    plan = base_request(rng, index, kind, model, kind.startswith("chat"))
    draw_plain(rng, plan, kind.endswith("stream"))
    return plan


def traffic(seed: int, n: int, model: str) -> Iterator[Plan]:
    rng = Random(seed)
    for i in range(n):
        yield draw(rng, i, model)


# -- one request -----------------------------------------------------------------------------
@dataclass
class Outcome:
    """How one request ended. ``result``: ``ok`` (a valid reply), ``refused`` (the 4xx a
    malformed body must get), ``closed`` (the client closed its stream), ``gave-up`` (the
    client stopped waiting), ``rate-limited`` (429, after the retry), ``5xx``, ``broken``
    (a stream that ended without ``[DONE]``, or a dropped connection), ``hung`` (past the
    deadline), ``invalid`` (a reply that fails its checks)."""

    status: int | None
    result: str
    problem: str | None = None
    retry_after: float = 0.0
    retried: bool = False
    completion_tokens: int = 0
    prompt_tokens: int = 0
    replies: list[tuple[str, str | None]] = field(default_factory=list)  # (text, finish)


def check_error_body(plan: Plan, status: int, content: bytes) -> Outcome:
    """A malformed body's reply: its status, and OpenAI's error body."""
    what = f"{plan.label} {plan.content[:200]!r}: {status} {content[:300]!r}"
    if status != plan.want_status:
        return Outcome(status, "invalid", f"wanted {plan.want_status}: {what}")
    try:
        err = json.loads(content)["error"]
    except (ValueError, KeyError, TypeError):
        return Outcome(status, "invalid", f"no OpenAI error body: {what}")
    if not isinstance(err, dict) or set(err) != {"message", "type", "param", "code"}:
        return Outcome(status, "invalid", f"the error body's keys: {what}")
    if not isinstance(err["message"], str) or not err["message"]:
        return Outcome(status, "invalid", f"no error message: {what}")
    if plan.want_param is not None and err["param"] != plan.want_param:
        return Outcome(status, "invalid", f"param {err['param']!r} != {plan.want_param!r}: {what}")
    return Outcome(status, "refused")


def check_choices(plan: Plan, replies: list[tuple[str, str | None]]) -> str | None:
    """What is wrong with a whole reply's choices (None: nothing)."""
    if len(replies) != plan.choices:
        return f"{len(replies)} choices, wanted {plan.choices}"
    for i, (text, finish) in enumerate(replies):
        if finish not in ("stop", "length"):
            return f"choice {i}: finish_reason {finish!r}"
        hit = [s for s in plan.stops if s in text]
        if hit:
            return f"choice {i}: stop string {hit[0]!r} in its text {text!r}"
        if finish != "stop":
            continue
        try:
            if plan.schema is not None:
                jsonschema.validate(json.loads(text), plan.schema)
            elif plan.json_object and not isinstance(json.loads(text), dict):
                return f"choice {i}: not a JSON object: {text!r}"
        except (ValueError, jsonschema.ValidationError) as e:
            return f"choice {i}: {type(e).__name__} on {text!r}: {str(e)[:200]}"
        if plan.pattern is not None and re.fullmatch(plan.pattern, text) is None:
            return f"choice {i}: {text!r} does not fullmatch {plan.pattern!r}"
    return None


def check_usage(plan: Plan, usage: Any, out: Outcome) -> str | None:
    if not isinstance(usage, dict):
        return f"usage {usage!r}"
    out.completion_tokens = int(usage.get("completion_tokens", 0))
    out.prompt_tokens = int(usage.get("prompt_tokens", 0))
    if not 0 <= out.completion_tokens <= plan.max_tokens * plan.choices:
        return f"{out.completion_tokens} completion tokens, max_tokens {plan.max_tokens}"
    return None


def check_reply(plan: Plan, status: int, content: bytes, headers: httpx.Headers) -> Outcome:
    """A non-streamed reply (or a stream refused before its first event)."""
    if status >= 500:
        return Outcome(status, "5xx", f"{plan.kind} {plan.content[:300]!r}: {content[:500]!r}")
    if status == 429:
        try:
            retry = float(headers.get("retry-after", "1"))
        except ValueError:
            retry = 1.0
        return Outcome(status, "rate-limited", retry_after=retry)
    if plan.want_status != 200:
        return check_error_body(plan, status, content)
    if status != 200:
        return Outcome(status, "invalid", f"{plan.kind} {plan.content[:300]!r}: {content[:300]!r}")
    try:
        reply = json.loads(content)
        chat = plan.path == C
        want = "chat.completion" if chat else "text_completion"
        if reply["object"] != want:
            return Outcome(status, "invalid", f"object {reply['object']!r}, wanted {want!r}")
        choices = sorted(reply["choices"], key=lambda c: int(c["index"]))
        if [c["index"] for c in choices] != list(range(len(choices))):
            return Outcome(status, "invalid", f"choice indices {[c['index'] for c in choices]}")
        out = Outcome(status, "ok")
        out.replies = [
            (c["message"]["content"] if chat else c["text"], c["finish_reason"]) for c in choices
        ]
        problem = check_choices(plan, out.replies) or check_usage(plan, reply.get("usage"), out)
    except (ValueError, KeyError, TypeError) as e:
        return Outcome(status, "invalid", f"a malformed reply ({e!r}): {content[:300]!r}")
    if problem is not None:
        out.result, out.problem = "invalid", f"{plan.kind} {plan.content[:300]!r}: {problem}"
    return out


@dataclass
class StreamState:
    """A stream's choices as its chunks build them."""

    texts: dict[int, str] = field(default_factory=dict)
    finishes: dict[int, str | None] = field(default_factory=dict)
    usage: Any = None
    events: int = 0

    def take(self, plan: Plan, chunk: dict[str, Any]) -> str | None:
        """Apply one chunk; what is wrong with it (None: nothing)."""
        chat = plan.path == C
        want = "chat.completion.chunk" if chat else "text_completion"
        if chunk.get("object") != want:
            return f"a chunk's object {chunk.get('object')!r}, wanted {want!r}"
        if chunk.get("usage") is not None:
            self.usage = chunk["usage"]
        for ch in chunk["choices"]:
            i = int(ch["index"])
            if not 0 <= i < plan.choices:
                return f"a chunk for choice {i} of {plan.choices}"
            piece = (ch["delta"].get("content") if chat else ch["text"]) or ""
            if piece and self.finishes.get(i) is not None:
                return f"choice {i}: text after its finish_reason"
            self.texts[i] = self.texts.get(i, "") + piece
            if ch.get("finish_reason") is not None:
                if self.finishes.get(i) is not None:
                    return f"choice {i}: a second finish_reason"
                self.finishes[i] = ch["finish_reason"]
        return None


async def stream_once(client: httpx.AsyncClient, plan: Plan, timeout: float) -> Outcome:
    state = StreamState()
    done = False
    what = f"{plan.kind} {plan.content[:300]!r}"
    try:
        async with client.stream(
            "POST", plan.path, content=plan.content, headers=JSON_HEADERS, timeout=timeout
        ) as r:
            if r.status_code != 200:
                return check_reply(plan, r.status_code, await r.aread(), r.headers)
            async for line in r.aiter_lines():
                if not line:
                    continue
                if done:
                    return Outcome(200, "broken", f"{what}: {line[:200]!r} after [DONE]")
                if not line.startswith("data: "):
                    return Outcome(200, "broken", f"{what}: not an event: {line[:200]!r}")
                data = line.removeprefix("data: ")
                if data == "[DONE]":
                    done = True
                    continue
                chunk = json.loads(data)
                if "error" in chunk:
                    err = chunk["error"]
                    bad = "5xx" if err.get("type") == "server_error" else "invalid"
                    return Outcome(200, bad, f"{what}: an error event {data[:300]}")
                problem = state.take(plan, chunk)
                if problem is not None:
                    return Outcome(200, "invalid", f"{what}: {problem}")
                state.events += 1
                if plan.close_after is not None and state.events >= plan.close_after:
                    return Outcome(200, "closed")  # leaving the block closes the connection
    except httpx.TimeoutException as e:
        return Outcome(200, "hung", f"{what}: {type(e).__name__} after {state.events} events")
    except httpx.TransportError as e:
        return Outcome(200, "broken", f"{what}: {type(e).__name__}: {e}")
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        return Outcome(200, "invalid", f"{what}: a malformed chunk ({e!r})")
    if not done:
        return Outcome(200, "broken", f"{what}: no [DONE] after {state.events} events")
    out = Outcome(200, "ok")
    out.replies = [(state.texts.get(i, ""), state.finishes.get(i)) for i in sorted(state.finishes)]
    problem = check_choices(plan, out.replies)
    if problem is None and state.usage is not None:
        problem = check_usage(plan, state.usage, out)
    if problem is None and plan.include_usage and state.usage is None:
        problem = "include_usage: no usage chunk"
    if problem is not None:
        out.result, out.problem = "invalid", f"{what}: {problem}"
    return out


async def post_once(client: httpx.AsyncClient, plan: Plan, timeout: float) -> Outcome:
    wait = plan.give_up_after if plan.give_up_after is not None else timeout
    try:
        r = await client.post(plan.path, content=plan.content, headers=JSON_HEADERS, timeout=wait)
    except httpx.TimeoutException as e:
        if plan.give_up_after is not None:
            return Outcome(None, "gave-up")  # the connection is closed: the server cancels
        return Outcome(None, "hung", f"{plan.kind} {plan.content[:300]!r}: {e!r}")
    except httpx.TransportError as e:
        return Outcome(None, "broken", f"{plan.kind} {plan.content[:300]!r}: {e!r}")
    return check_reply(plan, r.status_code, r.content, r.headers)


async def send(client: httpx.AsyncClient, plan: Plan, timeout: float) -> Outcome:
    """One request, retried once after a 429; past ``timeout`` + 30 s in all, hung."""

    async def attempts() -> Outcome:
        once = stream_once if plan.stream and plan.want_status == 200 else post_once
        out = await once(client, plan, timeout)
        if out.status == 429:
            await asyncio.sleep(out.retry_after)
            out = await once(client, plan, timeout)
            out.retried = True
        return out

    try:
        return await asyncio.wait_for(attempts(), timeout + 30)
    except asyncio.TimeoutError:
        return Outcome(None, "hung", f"{plan.kind} {plan.content[:300]!r}: past the deadline")


# -- the tally -------------------------------------------------------------------------------
def status_class(status: int | None) -> str:
    if status is None:
        return "none"
    return "429" if status == 429 else f"{status // 100}xx"


def greedy_agree(a: tuple[int, str, str | None], b: tuple[int, str, str | None]) -> bool:
    """Two greedy replies to one request at ``max_tokens`` ``a[0]`` and ``b[0]``: equal at
    one length, or when the shorter one stopped; else the shorter one starts the longer."""
    (ma, ta, fa), (mb, tb, fb) = sorted((a, b), key=lambda r: r[0])
    if ma == mb or fa == "stop":
        return (ta, fa) == (tb, fb)
    return tb.startswith(ta.rstrip("\ufffd"))


@dataclass
class Stats:
    by_kind: Counter[tuple[str, str]] = field(default_factory=Counter)  # (kind, status class)
    tokens_by_kind: Counter[str] = field(default_factory=Counter)  # completion tokens (usage)
    results: Counter[str] = field(default_factory=Counter)
    malformed: Counter[str] = field(default_factory=Counter)
    done: int = 0
    retried: int = 0
    completion_tokens: int = 0
    prompt_tokens: int = 0
    validated: int = 0  # constrained choices that ended with "stop" and passed
    greedy_checked: int = 0
    greedy_disagreements: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    rss: list[tuple[int, int]] = field(default_factory=list)  # (requests done, VmRSS kB)
    greedy: dict[str, list[tuple[int, str, str | None]]] = field(default_factory=dict)

    def record(self, plan: Plan, out: Outcome) -> None:
        self.done += 1
        self.by_kind[plan.kind, status_class(out.status)] += 1
        self.results[out.result] += 1
        self.retried += out.retried
        if plan.kind == "malformed":
            self.malformed[plan.label] += 1
        self.completion_tokens += out.completion_tokens
        self.tokens_by_kind[plan.kind] += out.completion_tokens
        self.prompt_tokens += out.prompt_tokens
        if out.problem is not None:
            self.problems.append(f"request {plan.index} ({out.result}): {out.problem}")
        if out.result != "ok":
            return
        constrained = plan.schema is not None or plan.json_object or plan.pattern is not None
        self.validated += constrained * sum(f == "stop" for _, f in out.replies)
        if plan.greedy_key is not None:
            seen = self.greedy.setdefault(plan.greedy_key, [])
            for text, finish in out.replies:
                new = (plan.max_tokens, text, finish)
                for old in seen:
                    self.greedy_checked += 1
                    if not greedy_agree(old, new):
                        self.greedy_disagreements.append(
                            f"{plan.greedy_key[:200]}: {old!r} vs {new!r}"
                        )
                if len(seen) < 4:
                    seen.append(new)

    def count(self, *results: str) -> int:
        return sum(self.results[r] for r in results)


def warmup_plans(model: str) -> list[Plan]:
    """One request of each kind, run one at a time before the traffic."""
    hello = [{"role": "user", "content": "Hello"}]
    prompt, schema = SCHEMAS["person"]
    person = {"type": "json_schema", "json_schema": {"name": "person", "schema": schema}}
    bodies: list[tuple[str, dict[str, Any]]] = [
        (C, {"messages": hello, "max_tokens": 8, "temperature": 0}),
        (C, {"messages": hello, "max_tokens": 8, "stream": True}),
        (T, {"prompt": "Once upon a time", "max_tokens": 8, "n": 2, "seed": 1}),
        (T, {"prompt": "Story 1:", "max_tokens": 8, "stream": True}),
        (C, {"messages": [{"role": "user", "content": prompt}], "response_format": person}),
        (C, {"messages": hello, "max_tokens": 8, "regex": PATTERNS["number"][1]}),
    ]
    plans = []
    for i, (path, body) in enumerate(bodies):
        body = {"model": model, "max_tokens": 64, **body}
        plan = Plan(-1 - i, "warm-up", path, body, stream=bool(body.get("stream")))
        plan.choices, plan.max_tokens = int(body.get("n", 1)), int(body["max_tokens"])
        plan.schema = schema if "response_format" in body else None
        plan.pattern = body.get("regex")
        plans.append(plan)
    return plans


async def run_plans(
    server: Server, plans: Iterator[Plan], stats: Stats, args: argparse.Namespace, every: int
) -> None:
    """``--concurrency`` clients, each sending the next plan when its last one ended."""
    t0 = time.perf_counter()
    limits = httpx.Limits(max_connections=args.concurrency + 4)
    async with httpx.AsyncClient(base_url=server.base, limits=limits) as client:

        async def client_loop() -> None:
            for plan in plans:  # one shared iterator: the plans go out in their drawn order
                stats.record(plan, await send(client, plan, args.timeout))
                if every and stats.done % every == 0:
                    stats.rss.append((stats.done, server.rss_kb()))
                if args.progress and stats.done % args.progress == 0:
                    dt = time.perf_counter() - t0
                    print(
                        f"{stats.done} requests, {dt:.0f} s ({stats.done / dt:.1f}/s), "
                        f"5xx {stats.count('5xx')}, broken {stats.count('broken')}, "
                        f"hung {stats.count('hung')}, invalid {stats.count('invalid')}, "
                        f"RSS {server.rss_kb() / 1024:.0f} MiB",
                        file=sys.stderr,
                        flush=True,
                    )

        await asyncio.gather(*(client_loop() for _ in range(args.concurrency)))


# -- the run ---------------------------------------------------------------------------------
def soak(args: argparse.Namespace) -> dict[str, Any]:
    """Start the server, warm it up, send the traffic, check the end, stop it: the report."""
    t_start = time.perf_counter()
    log_dir = args.log_dir or Path(tempfile.gettempdir())
    try:
        server = start_server(shlex.split(args.server_args), log_dir)
    except RuntimeError as e:
        raise SystemExit(str(e)) from None
    stats = Stats()
    report: dict[str, Any] = {
        "requests": args.requests,
        "seed": args.seed,
        "concurrency": args.concurrency,
        "server_args": args.server_args,
        "server_log": str(server.log),
    }
    try:
        model = httpx.get(server.base + "/models", timeout=30).json()["data"][0]["id"]
        report["model"] = model
        m0 = warm_up(server, model, stats, report, args)
        run_traffic(server, model, stats, report, args, m0)
        check_the_end(server, model, stats, report, args, m0)
    except Exception as e:  # a server that died, a client bug: still stop it and report
        stats.problems.append(f"the soak stopped early: {e!r}")
    finally:
        server.proc.send_signal(signal.SIGTERM)
        try:
            rc: int | None = server.proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            rc = None
            server.proc.kill()
            server.proc.wait()
    report["exit_status"] = rc
    report["total_wall_s"] = round(time.perf_counter() - t_start, 1)
    return _summarize(report, stats, args)


def warm_up(
    server: Server, model: str, stats: Stats, report: dict[str, Any], args: argparse.Namespace
) -> dict[str, float]:
    """One request of each kind, one at a time; then the counts the end is compared with
    (returned: the metrics)."""
    warm = Stats()
    asyncio.run(run_plans(server, iter(warmup_plans(model)), warm, _serial(args), 0))
    stats.problems += [f"warm-up: {p}" for p in warm.problems]
    stats.problems += [f"warm-up: {r}" for r in warm.results.elements() if r != "ok"]
    report["threads_after_warmup"] = server.threads()
    report["rss_after_warmup_kb"] = server.rss_kb()
    return server.metrics()


def run_traffic(
    server: Server,
    model: str,
    stats: Stats,
    report: dict[str, Any],
    args: argparse.Namespace,
    m0: dict[str, float],
) -> None:
    every = min(RSS_EVERY, max(args.requests // 10, 1))
    t0, cpu0 = time.perf_counter(), server.cpu_s()
    asyncio.run(run_plans(server, traffic(args.seed, args.requests, model), stats, args, every))
    wall = time.perf_counter() - t0
    report["traffic_wall_s"] = round(wall, 1)
    report["server_cpu_s"] = round(server.cpu_s() - cpu0, 1)
    m = server.metrics()
    busy = m["specdec:engine_step_seconds_sum"] - m0["specdec:engine_step_seconds_sum"]
    report["engine_steps"] = int(m["specdec:engine_steps_total"] - m0["specdec:engine_steps_total"])
    report["engine_busy_pct"] = round(100 * busy / wall, 1)


def check_the_end(
    server: Server,
    model: str,
    stats: Stats,
    report: dict[str, Any],
    args: argparse.Namespace,
    m0: dict[str, float],
) -> None:
    """Once the traffic stops: no KV block in use, no request running or waiting, the
    warm-up's thread count, the last RSS sample. anyio's thread pool (grammar compiles)
    stops a worker idle IDLE_PRUNE_S at its next call: the script waits that long, then
    sends one constrained request, so idle workers are not counted as leaked threads."""
    idle = poll(lambda: _idle(server.metrics()), 60)
    time.sleep(IDLE_PRUNE_S)
    last = Stats()
    asyncio.run(run_plans(server, iter(warmup_plans(model)[-1:]), last, _serial(args), 0))
    stats.problems += [f"after the traffic: {p}" for p in last.problems]
    idle = poll(lambda: _idle(server.metrics()), 60) and idle
    poll(lambda: server.threads() <= report["threads_after_warmup"], 30)
    report["threads_at_end"] = server.threads()
    stats.rss.append((stats.done, server.rss_kb()))
    m1 = server.metrics()
    report["idle_at_end"] = idle
    report["kv_blocks_used_at_end"] = m1.get("specdec:kv_blocks_used", -1)
    report["kv_blocks_total"] = m1.get("specdec:kv_blocks_total", -1)
    report["requests_running_at_end"] = m1.get("specdec:num_requests_running", -1)
    report["requests_waiting_at_end"] = m1.get("specdec:num_requests_waiting", -1)
    key = "specdec:generation_tokens_total"
    report["server_generation_tokens"] = int(m1.get(key, 0) - m0.get(key, 0))
    key = 'specdec:request_success_total{finish_reason="cancelled"}'
    report["server_cancelled"] = int(m1.get(key, 0) - m0.get(key, 0))
    report["server_counted_5xx"] = int(
        sum(v - m0.get(k, 0) for k, v in m1.items() if _is_5xx_counter(k))
    )


def _serial(args: argparse.Namespace) -> argparse.Namespace:
    return argparse.Namespace(**{**vars(args), "concurrency": 1, "progress": 0})


def _idle(m: dict[str, float]) -> bool:
    names = ("specdec:kv_blocks_used", "specdec:num_requests_running")
    return all(m.get(k) == 0 for k in (*names, "specdec:num_requests_waiting"))


def _is_5xx_counter(name: str) -> bool:
    return name.startswith("specdec:http_requests_total{") and 'status="5' in name


def _summarize(report: dict[str, Any], stats: Stats, args: argparse.Namespace) -> dict[str, Any]:
    kinds = sorted({k for k, _ in stats.by_kind})
    report["by_kind"] = {
        k: {c: n for (kk, c), n in sorted(stats.by_kind.items()) if kk == k} for k in kinds
    }
    report["tokens_by_kind"] = {k: stats.tokens_by_kind[k] for k in kinds}
    report["status"] = dict(sorted(Counter(c for (_, c) in stats.by_kind.elements()).items()))
    report["results"] = dict(sorted(stats.results.items()))
    report["malformed"] = dict(sorted(stats.malformed.items()))
    report["retried_after_429"] = stats.retried
    report["completion_tokens"] = stats.completion_tokens
    report["prompt_tokens"] = stats.prompt_tokens
    report["constrained_choices_validated"] = stats.validated
    report["greedy_pairs_compared"] = stats.greedy_checked
    report["greedy_disagreements"] = len(stats.greedy_disagreements)
    report["rss_kb"] = stats.rss
    first = stats.rss[0][1] if stats.rss else 0
    last = stats.rss[-1][1] if stats.rss else 0
    report["rss_first_kb"], report["rss_end_kb"] = first, last
    growth = 100.0 * (last - first) / first if first else float("inf")
    report["rss_growth_pct"] = round(growth, 2)
    if "traffic_wall_s" in report:
        report["requests_per_s"] = round(stats.done / max(report["traffic_wall_s"], 1e-9), 2)
    report["five_xx"] = stats.count("5xx")
    report["broken"] = stats.count("broken")
    report["hung"] = stats.count("hung")
    report["invalid"] = stats.count("invalid")
    checks = {
        f"all {args.requests} requests sent": stats.done == args.requests,
        "no 5xx": report["five_xx"] == 0 and report.get("server_counted_5xx", 0) == 0,
        "no broken or hung request": report["broken"] == 0 and report["hung"] == 0,
        "every reply passes its checks": report["invalid"] == 0 and not stats.problems,
        f"RSS growth < {args.max_rss_growth}%": growth < args.max_rss_growth,
        "no KV block in use at the end": report.get("kv_blocks_used_at_end") == 0,
        "no request running or waiting at the end": report.get("idle_at_end") is True,
        "threads back to the warm-up count": report.get("threads_at_end", 1 << 30)
        <= report.get("threads_after_warmup", -1),
        "SIGTERM: exit status 0": report["exit_status"] == 0,
    }
    report["checks"] = checks
    report["ok"] = all(checks.values())
    report["problems"] = stats.problems[:50]
    report["greedy_disagreement_examples"] = stats.greedy_disagreements[:10]
    return report


# -- report ----------------------------------------------------------------------------------
def summary(r: dict[str, Any]) -> str:
    return (
        f"soak-serve seed={r['seed']}: {r['requests']} requests in {r.get('traffic_wall_s', 0)} s "
        f"({r.get('requests_per_s', 0)}/s, concurrency {r['concurrency']}), status {r['status']}, "
        f"5xx {r['five_xx']}, broken {r['broken']}, hung {r['hung']}, invalid {r['invalid']}, "
        f"RSS {r['rss_first_kb'] / 1024:.0f} -> {r['rss_end_kb'] / 1024:.0f} MiB "
        f"({r['rss_growth_pct']:+.2f}%), KV blocks in use at the end "
        f"{r.get('kv_blocks_used_at_end')}, exit status {r['exit_status']}: "
        + ("ok" if r["ok"] else "FAILED")
    )


def table(r: dict[str, Any]) -> str:
    classes = sorted({c for v in r["by_kind"].values() for c in v})
    head = ["kind", *classes, "completion tokens (usage)"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for kind, counts in r["by_kind"].items():
        cells = [kind, *(str(counts.get(c, 0)) for c in classes), str(r["tokens_by_kind"][kind])]
        lines.append("| " + " | ".join(cells) + " |")
    rss = ", ".join(f"{n}: {kb / 1024:.0f}" for n, kb in r["rss_kb"])
    rows: list[tuple[str, Any]] = [
        ("server", f"{r.get('model')} {r['server_args']}"),
        ("results", ", ".join(f"{k} {v}" for k, v in r["results"].items())),
        ("malformed bodies", ", ".join(f"{k} {v}" for k, v in r["malformed"].items())),
        ("retried after a 429", r["retried_after_429"]),
        ("engine requests cancelled (server)", r.get("server_cancelled")),
        ("completion / prompt tokens (usage)", f"{r['completion_tokens']} / {r['prompt_tokens']}"),
        ("tokens generated (server)", r.get("server_generation_tokens")),
        ("constrained choices validated", r["constrained_choices_validated"]),
        (
            "greedy replies compared (disagreements)",
            f"{r['greedy_pairs_compared']} ({r['greedy_disagreements']})",
        ),
        ("traffic / total wall time", f"{r.get('traffic_wall_s')} s / {r['total_wall_s']} s"),
        (
            "engine steps (busy) / server CPU in the traffic",
            f"{r.get('engine_steps')} ({r.get('engine_busy_pct')}%) / {r.get('server_cpu_s')} s",
        ),
        ("RSS after warm-up", f"{r.get('rss_after_warmup_kb', 0) / 1024:.0f} MiB"),
        ("RSS at each sample (requests: MiB)", rss),
        ("RSS first sample -> end", f"{r['rss_first_kb']} -> {r['rss_end_kb']} kB"),
        ("RSS growth", f"{r['rss_growth_pct']:+.2f}%"),
        (
            "KV blocks in use at the end",
            f"{r.get('kv_blocks_used_at_end')} of {r.get('kv_blocks_total')}",
        ),
        (
            "requests running / waiting at the end",
            f"{r.get('requests_running_at_end')} / {r.get('requests_waiting_at_end')}",
        ),
        (
            "threads after warm-up / at the end",
            f"{r.get('threads_after_warmup')} / {r.get('threads_at_end')}",
        ),
        ("5xx (client / server-counted)", f"{r['five_xx']} / {r.get('server_counted_5xx')}"),
        ("broken / hung streams and requests", f"{r['broken']} / {r['hung']}"),
        ("replies failing their checks", r["invalid"]),
        ("exit status after SIGTERM", r["exit_status"]),
    ]
    lines += ["", "| soak-serve | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in rows]
    lines += ["", "| requirement | |", "|---|---|"]
    lines += [f"| {k} | {'ok' if v else 'FAILED'} |" for k, v in r["checks"].items()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--concurrency", type=int, default=16, help="clients sending at once")
    ap.add_argument(
        "--server-args", default=SERVER_ARGS, help=f"for specdec serve (default: {SERVER_ARGS})"
    )
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds a request may take")
    ap.add_argument("--max-rss-growth", type=float, default=5.0, help="percent")
    ap.add_argument("--progress", type=int, default=500, help="report every N requests (stderr)")
    ap.add_argument(
        "--log-dir", type=Path, help="where the server's log goes (default: the temp dir)"
    )
    ap.add_argument("--json", type=Path, help="write the summary here")
    args = ap.parse_args(argv)
    r = soak(args)
    print(summary(r))
    print()
    print(table(r))
    for p in r["problems"]:
        print("ERROR", p, file=sys.stderr)
    for d in r["greedy_disagreement_examples"]:
        print("greedy disagreement:", d, file=sys.stderr)
    if not r["ok"]:
        print(f"the server's log ({r['server_log']}), last lines:", file=sys.stderr)
        print(Path(r["server_log"]).read_text(errors="replace")[-4000:], file=sys.stderr)
    if args.json is not None:
        args.json.write_text(json.dumps(r, indent=2) + "\n")
    return 0 if r["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
