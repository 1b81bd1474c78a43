"""``specdec serve`` over real HTTP on 127.0.0.1: the ``openai`` package as the client, raw
``httpx`` requests for malformed bodies. The oracle for every greedy reply is the library's
own plain autoregressive decoding of the same prompt, in this process; JSON replies are
checked with ``jsonschema``; the server's bookkeeping is read back from ``/metrics`` and the
process's thread count."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest
import torch

from serve_harness import Server, poll, start_server
from specdec.decode import autoregressive_generate
from specdec.models import smollm2
from specdec.serve.text import render_chat

ROOT = Path(__file__).resolve().parent.parent


def openai_client(server: Server, **kw: Any) -> openai.OpenAI:
    kw.setdefault("api_key", "unused")
    return openai.OpenAI(base_url=server.base, max_retries=0, timeout=120, **kw)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start_server(["--threads", "1", "--max-batch", "8"], tmp_path_factory.mktemp("serve"))
    yield s
    assert s.stop() == 0, s.log.read_text()


@pytest.fixture(scope="module")
def lm() -> Any:
    return smollm2()


def model_name(server: Server) -> str:
    name: str = openai_client(server).models.list().data[0].id
    return name


def reference(lm: Any, messages: list[dict[str, str]], max_tokens: int) -> tuple[str, str]:
    """The library's greedy text for a chat, and its finish reason (OpenAI's words)."""
    text = render_chat(lm.chat_template, messages)
    ids = list(lm.tokenizer.encode(text, add_special_tokens=False).ids)
    res = autoregressive_generate(
        lm.model, ids, max_new_tokens=max_tokens, eos_token_id=lm.eos_token_id
    )
    out = lm.tokenizer.decode(res.tokens, skip_special_tokens=True)
    return out, "stop" if res.finish_reason == "stop" else "length"


PROMPTS = [
    "What is the capital of France, and what is it famous for?",
    "Write a Python function that adds two numbers.",
    "Repeat exactly: the quick brown fox jumps over the lazy dog. The quick brown fox.",
    "List three colors.",
]


def chat(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def serving_examples() -> list[tuple[str, str, str | None]]:
    """(where, Python block, curl command or None) for the README's serving section and the
    docs' serving page."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Serving") :]
    section = section[: section.index("\n## ", 1)]
    out: list[tuple[str, str, str | None]] = []
    for where, body in (("README.md", section), ("docs/guide/serving.md", None)):
        if body is None:
            body = (ROOT / where).read_text()
        curl = re.search(r"```bash\n.*?\n(curl .*?)\n```", body, re.S)
        blocks = re.findall(r"```python\n(.*?)```", body, re.S)
        assert blocks, f"no Python example in {where}"
        for i, code in enumerate(blocks):
            out.append((where, code, curl.group(1) if curl is not None and i == 0 else None))
    return out


def test_the_serving_examples_run_against_a_server(server: Server) -> None:
    """The README's and the docs' serving examples (curl and the openai client) as written,
    pointed at the test server's port."""
    port = server.url.rsplit(":", 1)[1]
    for where, code, curl in serving_examples():
        if curl is not None:
            cmd = curl.replace("\\\n", " ").replace("127.0.0.1:8000", f"127.0.0.1:{port}")
            out = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=120)
            reply = json.loads(out.stdout)
            assert reply["choices"][0]["message"]["content"], (where, reply)
        namespace: dict[str, Any] = {}
        code = code.replace("127.0.0.1:8000", f"127.0.0.1:{port}")
        exec(compile(code, where, "exec"), namespace)  # noqa: S102
        if "reply" in namespace and "json_schema" in code:
            cat = json.loads(namespace["reply"].choices[0].message.content)
            assert isinstance(cat["name"], str), where


def test_importing_specdec_imports_no_web_framework() -> None:
    code = (
        "import sys, specdec, specdec.decode, specdec.models; "
        "bad = [m for m in ('starlette', 'uvicorn', 'fastapi', 'prometheus_client', 'vllm') "
        "if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_greedy_chat_equals_the_librarys_greedy_generation(server: Server, lm: Any) -> None:
    client = openai_client(server)
    name = model_name(server)
    for p in PROMPTS[:3]:
        want, reason = reference(lm, chat(p), 48)
        r = client.chat.completions.create(
            model=name,
            messages=chat(p),
            max_tokens=48,
            temperature=0,  # type: ignore[arg-type]
        )
        assert r.choices[0].message.content == want
        assert r.choices[0].finish_reason == reason
        assert r.usage is not None and r.usage.completion_tokens <= 48


def test_completions_take_text_and_token_ids(server: Server, lm: Any) -> None:
    client = openai_client(server)
    name = model_name(server)
    ids = list(
        lm.tokenizer.encode("The first five prime numbers are", add_special_tokens=False).ids
    )
    res = autoregressive_generate(lm.model, ids, max_new_tokens=24, eos_token_id=lm.eos_token_id)
    want = lm.tokenizer.decode(res.tokens, skip_special_tokens=True)
    by_text = client.completions.create(
        model=name, prompt="The first five prime numbers are", max_tokens=24, temperature=0
    )
    by_ids = client.completions.create(model=name, prompt=ids, max_tokens=24, temperature=0)
    assert by_text.choices[0].text == want
    assert by_ids.choices[0].text == want
    assert by_ids.usage is not None and by_ids.usage.prompt_tokens == len(ids)


def test_a_stream_equals_the_non_streamed_reply(server: Server) -> None:
    client = openai_client(server)
    name = model_name(server)
    for p in PROMPTS[:2] + ["Write the word 'naïve', then 日本語, then an emoji: 🙂."]:
        whole = client.chat.completions.create(
            model=name,
            messages=chat(p),
            max_tokens=40,
            temperature=0,  # type: ignore[arg-type]
        )
        pieces: list[str] = []
        reasons: list[str | None] = []
        usage = None
        for chunk in client.chat.completions.create(
            model=name,
            messages=chat(p),  # type: ignore[arg-type]
            max_tokens=40,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        ):
            if chunk.usage is not None:
                usage = chunk.usage
            for ch in chunk.choices:
                if ch.delta.content:
                    assert "\ufffd" not in ch.delta.content  # whole characters only
                    pieces.append(ch.delta.content)
                if ch.finish_reason is not None:
                    reasons.append(ch.finish_reason)
        assert "".join(pieces) == whole.choices[0].message.content
        assert reasons == [whole.choices[0].finish_reason]
        assert usage is not None and whole.usage is not None
        assert usage.completion_tokens == whole.usage.completion_tokens
        assert usage.prompt_tokens == whole.usage.prompt_tokens


def test_stop_strings_that_span_tokens_end_the_text_before_them(server: Server, lm: Any) -> None:
    client = openai_client(server)
    name = model_name(server)
    p = PROMPTS[2]
    want, _ = reference(lm, chat(p), 48)
    ids = lm.tokenizer.encode(want, add_special_tokens=False)
    # A stop string across the boundary of the 5th and 6th tokens of the reply.
    cut = ids.offsets[5][0]
    stop = want[cut - 2 : cut + 3]
    assert len(stop) == 5
    expected = want[: want.index(stop)]
    for stream in (False, True):
        if stream:
            text = "".join(
                c.choices[0].delta.content or ""
                for c in client.chat.completions.create(
                    model=name,
                    messages=chat(p),  # type: ignore[arg-type]
                    max_tokens=48,
                    temperature=0,
                    stop=[stop, "zzzz"],
                    stream=True,
                )
                if c.choices
            )
        else:
            r = client.chat.completions.create(
                model=name,
                messages=chat(p),  # type: ignore[arg-type]
                max_tokens=48,
                temperature=0,
                stop=[stop, "zzzz"],
            )
            assert r.choices[0].finish_reason == "stop"
            text = r.choices[0].message.content or ""
        assert text == expected


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "pets": {"type": "array", "items": {"enum": ["cat", "dog", "fish"]}, "maxItems": 3},
    },
    "required": ["name", "age", "pets"],
    "additionalProperties": False,
}


def test_json_schema_replies_validate(server: Server) -> None:
    client = openai_client(server)
    name = model_name(server)
    for p in ["Describe a person called Ana who is 31 and has a cat.", "Describe a child."]:
        r = client.chat.completions.create(
            model=name,
            messages=chat(p),  # type: ignore[arg-type]
            max_tokens=80,
            temperature=0,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "person", "schema": SCHEMA, "strict": True},
            },
        )
        assert r.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(r.choices[0].message.content or ""), SCHEMA)
    r = client.chat.completions.create(
        model=name,
        messages=chat("Give me a JSON object about Paris."),  # type: ignore[arg-type]
        max_tokens=60,
        temperature=0.7,
        seed=3,
        response_format={"type": "json_object"},
    )
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content or ""), dict)


def test_regex_gbnf_and_lark_fields(server: Server) -> None:
    client = openai_client(server)
    name = model_name(server)
    msgs = chat("What is 2 + 2? Answer with a number.")
    cases = [
        ({"regex": r"[0-9]{1,3}( apples)?"}, re.compile(r"[0-9]{1,3}( apples)?")),
        ({"gbnf": 'root ::= ("yes" | "no") "."'}, re.compile(r"(yes|no)\.")),
        ({"lark": 'start: ("red" | "blue") " " NUM\nNUM: /[0-9]+/'}, re.compile(r"(red|blue) \d+")),
    ]
    for extra, pattern in cases:
        r = client.chat.completions.create(
            model=name,
            messages=msgs,  # type: ignore[arg-type]
            max_tokens=12,
            temperature=0,
            extra_body=extra,
        )
        text = r.choices[0].message.content or ""
        if r.choices[0].finish_reason == "stop":
            assert pattern.fullmatch(text), (extra, text)
        else:  # cut at max_tokens: still a prefix of the language
            assert pattern.fullmatch(text) or text.isdigit(), (extra, text)


def test_seeded_sampling_repeats_and_n_gives_several_choices(server: Server) -> None:
    client = openai_client(server)
    name = model_name(server)
    kw: dict[str, Any] = dict(
        model=name, messages=chat(PROMPTS[3]), max_tokens=20, temperature=0.9, top_p=0.95
    )
    a = client.chat.completions.create(seed=11, **kw)
    b = client.chat.completions.create(seed=11, **kw)
    assert a.choices[0].message.content == b.choices[0].message.content
    many = client.chat.completions.create(seed=11, n=3, **kw)
    assert [c.index for c in many.choices] == [0, 1, 2]
    # Choice j samples with seed + j: the first one is the single request's.
    assert many.choices[0].message.content == a.choices[0].message.content
    assert many.usage is not None and a.usage is not None
    assert many.usage.prompt_tokens == a.usage.prompt_tokens


def test_32_concurrent_streams_all_finish_correctly(server: Server, lm: Any) -> None:
    name = model_name(server)
    want = {p: reference(lm, chat(p), 24)[0] for p in PROMPTS}

    async def one(client: openai.AsyncOpenAI, p: str) -> tuple[str, str]:
        stream = await client.chat.completions.create(
            model=name,
            messages=chat(p),  # type: ignore[arg-type]
            max_tokens=24,
            temperature=0,
            stream=True,
        )
        text = ""
        async for chunk in stream:
            for ch in chunk.choices:
                text += ch.delta.content or ""
        return p, text

    async def main() -> list[tuple[str, str]]:
        client = openai.AsyncOpenAI(base_url=server.base, api_key="x", max_retries=0, timeout=300)
        try:
            return await asyncio.gather(*(one(client, PROMPTS[i % 4]) for i in range(32)))
        finally:
            await client.close()

    got = asyncio.run(main())
    assert len(got) == 32
    for p, text in got:
        assert text == want[p]


def test_a_client_that_disconnects_mid_stream_is_cancelled(server: Server) -> None:
    name = model_name(server)
    before = server.metrics().get('specdec:request_success_total{finish_reason="cancelled"}', 0)
    body = {
        "model": name,
        "messages": chat("Count from 1 to 500, one number per line."),
        "max_tokens": 600,
        "temperature": 0,
        "stream": True,
    }
    with (
        httpx.Client(timeout=60) as h,
        h.stream("POST", server.base + "/chat/completions", json=body) as r,
    ):
        assert r.status_code == 200
        lines = r.iter_lines()
        for _ in range(6):
            next(lines)
    # The connection is closed: the request ends long before its 600 tokens.
    assert poll(
        lambda: (
            server.metrics().get('specdec:request_success_total{finish_reason="cancelled"}', 0)
            == before + 1
        ),
        30,
    )
    assert poll(lambda: server.metrics()["specdec:kv_blocks_used"] == 0, 30)
    r2 = openai_client(server).chat.completions.create(
        model=name,
        messages=chat(PROMPTS[3]),
        max_tokens=8,
        temperature=0,  # type: ignore[arg-type]
    )
    assert r2.choices[0].message.content


def test_multi_turn_chat_starts_its_second_turn_from_the_prefix_cache(server: Server) -> None:
    client = openai_client(server)
    name = model_name(server)
    msgs: list[dict[str, str]] = [
        {"role": "system", "content": "You are a terse assistant. Salt: 83127."},
        {"role": "user", "content": "Name a large animal."},
    ]
    first = client.chat.completions.create(
        model=name,
        messages=msgs,
        max_tokens=32,
        temperature=0,  # type: ignore[arg-type]
    )
    assert first.usage is not None
    msgs += [
        {"role": "assistant", "content": first.choices[0].message.content or ""},
        {"role": "user", "content": "And a small one?"},
    ]
    second = client.chat.completions.create(
        model=name,
        messages=msgs,
        max_tokens=16,
        temperature=0,  # type: ignore[arg-type]
    )
    assert second.usage is not None and second.usage.prompt_tokens_details is not None
    cached = second.usage.prompt_tokens_details.cached_tokens or 0
    # Everything up to the first turn's reply is cached, in whole 16-token blocks.
    history = first.usage.prompt_tokens + first.usage.completion_tokens
    assert cached >= history - 16 - 2, (cached, history)


def chat_body(**fields: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "x"}], **fields}


C, T = "/chat/completions", "/completions"
SCHEMA_BAD = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}
IMAGE = [{"type": "image_url", "image_url": {"url": "x"}}]
BAD: list[tuple[str, Any, int, str | None]] = [
    # (path, body (bytes: sent as is), status, param)
    (C, b"{not json", 400, None),
    (C, b"", 400, None),
    (C, [1, 2], 400, None),
    (C, {"messages": []}, 400, "messages"),
    (C, {"messages": "hi"}, 400, "messages"),
    (C, {"messages": [{"role": "robot", "content": "x"}]}, 400, "messages[0].role"),
    (C, {"messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content"),
    (C, {"messages": [{"role": "user", "content": IMAGE}]}, 400, "messages"),
    (C, {"messages": [{"role": "user", "content": "word " * 9000}]}, 400, "messages"),
    (C, chat_body(max_tokens=0), 400, "max_tokens"),
    (C, chat_body(max_tokens="9"), 400, "max_tokens"),
    (C, chat_body(max_tokens=True), 400, "max_tokens"),
    (C, chat_body(max_tokens=100000), 400, "max_tokens"),
    (C, chat_body(temperature=3), 400, "temperature"),
    (C, chat_body(top_p=0), 400, "top_p"),
    (C, chat_body(n=17), 400, "n"),
    (C, chat_body(stop=[""]), 400, "stop"),
    (C, chat_body(frobnicate=1), 400, "frobnicate"),
    (C, chat_body(logprobs=True), 400, "logprobs"),
    (C, chat_body(stream_options={"include_usage": True}), 400, "stream_options"),
    (C, chat_body(model="gpt-9"), 404, "model"),
    (C, chat_body(stop_token_ids=[10**9]), 400, "stop_token_ids"),
    (C, chat_body(regex="(a"), 400, "regex"),
    (C, chat_body(gbnf="root ::= undefined"), 400, "gbnf"),
    (C, chat_body(lark="start: ("), 400, "lark"),
    (C, chat_body(regex="a", gbnf='root ::= "a"'), 400, None),
    (C, chat_body(response_format={"type": "json_schema"}), 400, "response_format"),
    (C, chat_body(response_format={"type": "xml"}), 400, "response_format.type"),
    (C, chat_body(response_format=SCHEMA_BAD), 400, "response_format.json_schema.schema"),
    (T, {"prompt": [1, "a"]}, 400, "prompt"),
    (T, {"prompt": []}, 400, "prompt"),
    (T, {"prompt": [10**9]}, 400, "prompt"),
    (T, {"prompt": "x", "echo": True}, 400, "echo"),
    (T, {"prompt": "x", "seed": 2**70}, 400, "seed"),
]


def test_bad_requests_get_4xx_with_openais_error_body_and_the_server_goes_on(
    server: Server,
) -> None:
    name = model_name(server)
    with httpx.Client(base_url=server.base, timeout=60) as h:
        for path, body, status, param in BAD:
            if isinstance(body, dict) and "model" not in body:
                body = {**body, "model": name}
            content = body if isinstance(body, bytes) else json.dumps(body).encode()
            r = h.post(path, content=content, headers={"content-type": "application/json"})
            assert r.status_code == status, (body, r.status_code, r.text)
            err = r.json()["error"]
            assert set(err) == {"message", "type", "param", "code"}, err
            assert isinstance(err["message"], str) and err["message"], err
            if param is not None:
                assert err["param"] == param, (body, err)
        for method, path, status in (("GET", "/chat/completions", 405), ("GET", "/nowhere", 404)):
            r = h.request(method, path)
            assert r.status_code == status
            assert r.json()["error"]["message"]
    # The SDK raises its typed errors on them.
    with pytest.raises(openai.NotFoundError):
        openai_client(server).chat.completions.create(model="gpt-9", messages=chat("x"))  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError):
        openai_client(server).chat.completions.create(
            model=name,
            messages=chat("x"),
            max_tokens=10**6,  # type: ignore[arg-type]
        )
    r = openai_client(server).chat.completions.create(
        model=name,
        messages=chat(PROMPTS[3]),
        max_tokens=8,
        temperature=0,  # type: ignore[arg-type]
    )
    assert r.choices[0].message.content


def test_metrics_count_requests_and_tokens(server: Server) -> None:
    client = openai_client(server)
    name = model_name(server)
    m0 = server.metrics()
    usages = []
    for p in PROMPTS[:2]:
        r = client.chat.completions.create(
            model=name,
            messages=chat(p),
            max_tokens=16,
            temperature=0,  # type: ignore[arg-type]
        )
        usages.append(r.usage)
    m1 = server.metrics()
    key = 'specdec:http_requests_total{endpoint="/v1/chat/completions",status="200"}'
    assert m1[key] - m0.get(key, 0) == 2
    gen = m1["specdec:generation_tokens_total"] - m0["specdec:generation_tokens_total"]
    assert gen == sum(u.completion_tokens for u in usages if u is not None)
    prompt = m1["specdec:prompt_tokens_total"] - m0["specdec:prompt_tokens_total"]
    assert prompt == sum(u.prompt_tokens for u in usages if u is not None)
    assert m1["specdec:engine_steps_total"] > m0["specdec:engine_steps_total"]


def test_after_many_requests_the_pool_is_empty_and_no_thread_leaked(server: Server) -> None:
    client = openai_client(server)
    name = model_name(server)
    client.chat.completions.create(model=name, messages=chat("hi"), max_tokens=2)  # type: ignore[arg-type]
    threads = server.threads()

    async def burst() -> None:
        c = openai.AsyncOpenAI(base_url=server.base, api_key="x", max_retries=0, timeout=300)
        try:
            await asyncio.gather(
                *(
                    c.completions.create(
                        model=name, prompt=f"Story {i}:", max_tokens=8 + i % 9, temperature=0.8
                    )
                    for i in range(24)
                )
            )
        finally:
            await c.close()

    asyncio.run(burst())
    assert poll(lambda: server.metrics()["specdec:kv_blocks_used"] == 0, 30)
    assert server.metrics()["specdec:num_requests_running"] == 0
    assert poll(lambda: server.threads() <= threads, 30), (server.threads(), threads)


def test_queue_bound_api_key_int8_and_sigterm(tmp_path: Path, lm: Any) -> None:
    """A second server: one request at a time, one waiting, a key, int8 products. Its
    greedy reply is the library's int8 plain decoding; past the queue: 429 with
    Retry-After; a wrong key: 401; SIGTERM with a stream in flight: it finishes, exit 0."""
    args = ["--threads", "1", "--max-batch", "1", "--max-queue", "1", "--api-key", "sekrit"]
    s = start_server([*args, "--numeric", "int8"], tmp_path)
    try:
        name = openai_client(s, api_key="sekrit").models.list().data[0].id
        # A prompt whose int8 reply differs from the exact one: the reply tells the modes apart.
        poem = chat("Write a limerick about a robot.")
        exact, _ = reference(lm, poem, 32)
        lm.model.numeric = "int8"
        try:
            want, _ = reference(lm, poem, 32)
        finally:
            lm.model.numeric = "exact"
        assert want != exact
        r = openai_client(s, api_key="sekrit").chat.completions.create(
            model=name,
            messages=poem,  # type: ignore[arg-type]
            max_tokens=32,
            temperature=0,  # type: ignore[arg-type]
        )
        assert r.choices[0].message.content == want
        with pytest.raises(openai.AuthenticationError):
            openai_client(s, api_key="wrong").models.list()
        assert httpx.get(s.url + "/health").status_code == 200  # open without the key
        body = {"model": name, "prompt": "Once upon a time", "max_tokens": 64, "temperature": 0}
        hdr = {"authorization": "Bearer sekrit"}

        async def burst() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=s.base, timeout=300, headers=hdr) as h:
                return await asyncio.gather(*(h.post("/completions", json=body) for _ in range(6)))

        codes = [r.status_code for r in asyncio.run(burst())]
        assert set(codes) <= {200, 429} and 429 in codes and 200 in codes, codes
        # n above the queue can never run: a 400, not a 429 to retry forever.
        over = httpx.post(s.base + "/completions", json={**body, "n": 2}, headers=hdr)
        assert over.status_code == 400 and over.json()["error"]["param"] == "n", over.text
        limited = [r for r in asyncio.run(burst()) if r.status_code == 429]
        for r in limited:
            assert r.headers["retry-after"].isdigit()
            assert r.json()["error"]["code"] == "queue_full"
        # SIGTERM while a stream runs: the stream still ends with [DONE], the process exits 0.
        with (
            httpx.Client(base_url=s.base, timeout=120, headers=hdr) as h,
            h.stream("POST", "/completions", json={**body, "stream": True, "max_tokens": 48}) as r,
        ):
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
            s.proc.send_signal(signal.SIGTERM)
            rest = list(lines)
        assert "data: [DONE]" in rest
        assert s.proc.wait(timeout=60) == 0
    finally:
        if s.proc.poll() is None:
            s.proc.kill()


def _prefix_hit(engine: Any, prompt: list[int]) -> int:
    """Run ``prompt`` for one token on ``engine``; the prompt tokens it found cached."""
    from specdec.serve import EngineRequest

    done = threading.Event()
    out: list[Any] = []

    def sink(o: Any) -> None:
        if o.finished:
            out.append(o.result)
            done.set()

    engine.submit(EngineRequest(prompt, 1, temperature=0.0), sink)
    assert done.wait(120)
    hit: int = out[0].prefix_hit
    return hit


@pytest.mark.parametrize("kv_tokens", [None, 1024])
def test_the_kv_pool_fills_its_memory_so_the_prefix_cache_outlives_other_traffic(
    kv_tokens: int | None,
) -> None:
    """One request at a time. By default the pool takes ``kv_cache_gib`` (1 GiB) of K/V, so
    a prompt stays cached while 1,200 tokens of other prompts pass through; a pool of 1,024
    tokens (room for the one request the batch holds) has evicted it by then."""
    from specdec.serve import Engine, EngineConfig

    engine = Engine(EngineConfig(drafter="none", max_batch=1, threads=1, kv_tokens=kv_tokens))
    c = engine.model.config
    head_dim = c.hidden_size // c.num_attention_heads
    per_token = 2 * c.num_hidden_layers * c.num_key_value_heads * head_dim * 4  # K, V float32
    pool = engine.generator.kv_tokens
    assert pool == (kv_tokens or 2**30 // per_token), pool
    engine.start(warmup=False)
    try:
        g = torch.Generator().manual_seed(5)
        first = torch.randint(100, 40000, (64,), generator=g).tolist()
        assert _prefix_hit(engine, first) == 0
        for _ in range(12):  # other prompts: 1,200 tokens
            _prefix_hit(engine, torch.randint(100, 40000, (100,), generator=g).tolist())
        again = _prefix_hit(engine, first)
    finally:
        engine.shutdown()
    if kv_tokens is None:
        assert again >= 48, again  # its whole 16-token blocks
    else:
        assert again == 0, again
