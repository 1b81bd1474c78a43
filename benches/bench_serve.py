"""Load benchmark for OpenAI-compatible chat servers: `specdec serve` side by side with
llama.cpp's `llama-server` (plain and with n-gram speculation) and vLLM, on the same weights
(SmolLM2-135M-Instruct) and the same requests, in one run.

    python3 benches/bench_serve.py [--servers specdec,llama,llama-ngram,vllm]
        [--concurrency 1,4,16] [--requests N] [--max-tokens 128] [--threads 2]
        [--peers DIR] [--json FILE]

Each server is started here as a subprocess on a free port of 127.0.0.1, waited for through
its `/health` endpoint, warmed up with one unmeasured prompt, measured, then stopped (SIGINT,
then SIGTERM); one server runs at a time, a fresh one per concurrency level (`--no-restart`:
one for all levels), all with `--threads` threads and the same number of slots (the highest
level: specdec `--max-batch`, llama-server `--parallel`, vLLM `--max-num-seqs`). The peers are
installed outside the repo by benches/peers/ (see its README); a server whose binary or venv
is missing is skipped with a line saying so. The machine's CPU use by other work is sampled
before each start and measured during each level: figures taken on a busy machine are flagged.

Requests: the held-out chat prompts of specdec.demo_prompts (kinds code, edit, qa) and
JSON-schema requests (kind json, `response_format` json_schema, strict), all streamed from
`POST /v1/chat/completions` with temperature 0 and `stream_options.include_usage`. At
concurrency c, c client tasks pull from the request list, repeated in whole passes until at
least `--requests` (default max(8, 2c)) are sent.

Figures per server and concurrency: output tokens/s (completion tokens from `usage` over the
level's wall time), time to first content chunk (TTFT) p50/p99, inter-token latency (ITL)
p50/p99, chunk-gap p99, requests and errors (4xx, 5xx, broken streams), and tok/s relative to
specdec; per prompt kind at concurrency 1 as well. ITL is per request (last chunk time - first
chunk time) / (completion tokens - 1), since a speculative server's chunk may carry several
tokens; chunk gap is the time between consecutive content chunks as the client sees them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from specdec.demo_prompts import PROMPTS

ALL_SERVERS = (
    "specdec",
    "specdec-nodraft",
    "specdec-int8",
    "specdec-nodraft-int8",
    "specdec-nogd",
    "llama",
    "llama-ngram",
    "vllm",
    "vllm-ngram",
)
DEFAULT_SERVERS = "specdec,llama,llama-ngram,vllm"

# vLLM's CPU backend: KV cache size (GiB) and OpenMP thread binding ("nobind": leave it to
# OMP_NUM_THREADS). Also in benches/peers/smollm2_hf.py.
VLLM_CPU_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "2",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_TARGET_DEVICE": "cpu",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}

# ---------------------------------------------------------------------------------------------
# Requests


def _obj(props: dict[str, Any]) -> dict[str, Any]:
    """A strict JSON-schema object: every property required, no others."""
    return {
        "type": "object",
        "properties": props,
        "required": list(props),
        "additionalProperties": False,
    }


SCHEMAS: list[tuple[str, dict[str, Any], str]] = [
    (
        "person",
        _obj(
            {
                "name": {"type": "string"},
                "age": {"type": "integer", "minimum": 0, "maximum": 150},
                "email": {"type": "string"},
                "is_member": {"type": "boolean"},
            }
        ),
        "Create a JSON record for a fictional library member: name, age, email address and "
        "whether the membership is active.",
    ),
    (
        "product",
        _obj(
            {
                "name": {"type": "string"},
                "price": {"type": "number"},
                "category": {"type": "string", "enum": ["books", "electronics", "garden", "toys"]},
                "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
            }
        ),
        "Describe a cordless garden hedge trimmer as a JSON product entry with its name, price "
        "in euros, category and a few tags.",
    ),
    (
        "recipe_steps",
        _obj(
            {
                "title": {"type": "string"},
                "steps": {
                    "type": "array",
                    "items": _obj({"step": {"type": "integer"}, "instruction": {"type": "string"}}),
                    "minItems": 2,
                    "maxItems": 6,
                },
            }
        ),
        "Give the steps to make a cup of black tea as a JSON document with a title and a list "
        "of numbered steps.",
    ),
    (
        "address",
        _obj(
            {
                "street": {"type": "string"},
                "city": {"type": "string"},
                "postal_code": {"type": "string"},
                "country": {"type": "string"},
            }
        ),
        "Write the postal address of a made-up bakery in Lisbon as JSON.",
    ),
]


@dataclass(frozen=True)
class Request:
    kind: str
    name: str
    messages: list[dict[str, str]]
    response_format: dict[str, Any] | None = None


def build_requests() -> list[Request]:
    """The base list: prompt kinds interleaved round robin so every slice of it is mixed."""
    by_kind: dict[str, list[Request]] = {}
    for kind, prompts in PROMPTS.items():
        by_kind[kind] = [
            Request(kind, f"{kind}{i}", [{"role": "user", "content": p}])
            for i, p in enumerate(prompts)
        ]
    by_kind["json"] = [
        Request(
            "json",
            f"json-{name}",
            [{"role": "user", "content": prompt}],
            {
                "type": "json_schema",
                "json_schema": {"name": name, "schema": schema, "strict": True},
            },
        )
        for name, schema, prompt in SCHEMAS
    ]
    out: list[Request] = []
    longest = max(len(v) for v in by_kind.values())
    for i in range(longest):
        for reqs in by_kind.values():
            if i < len(reqs):
                out.append(reqs[i])
    return out


# Each JSON request's schema, by request name: its outputs are validated against it.
SCHEMA_OF: dict[str, dict[str, Any]] = {name: schema for name, schema, _ in SCHEMAS}

# MaskBench schemas longer than this (as compact JSON) make prompts longer than the answers.
MASKBENCH_MAX_SCHEMA_CHARS = 1500


def maskbench_requests(data: Path, limit: int) -> list[Request]:
    """JSON requests (kind ``json``) from MaskBench schema files in ``data`` (public:
    guidance-ai/jsonschemabench, ``maskbench/data``): of the files whose schema is an object
    schema of at most :data:`MASKBENCH_MAX_SCHEMA_CHARS` characters that specdec compiles
    exactly in OpenAI's strict mode (closed objects, declared order), ``limit`` spread
    evenly over the sorted names. The schema goes in ``response_format`` (strict), as with
    OpenAI's structured outputs, not in the prompt: the prompt asks for an example of what
    the schema describes (its description or title, else its file's name)."""
    from specdec.models.gguf import smollm2

    vocab = smollm2().vocabulary()
    usable: list[tuple[str, dict[str, Any]]] = []
    for path in sorted(data.glob("*.json")):
        schema = json.loads(path.read_text()).get("schema")
        if not isinstance(schema, dict) or schema.get("type") != "object":
            continue
        if len(json.dumps(schema, separators=(",", ":"))) > MASKBENCH_MAX_SCHEMA_CHARS:
            continue
        try:
            vocab.json_schema(
                schema, whitespace=False, additional_properties=False, property_order="declared"
            )
        except Exception:  # refused or not compilable: not a fair request for this run
            continue
        usable.append((path.stem, schema))
    if not usable:
        raise SystemExit(f"--maskbench {data}: no usable schema files")
    step = max(1, len(usable) // max(limit, 1))
    out = []
    for name, schema in usable[::step][:limit]:
        SCHEMA_OF[f"mb-{name}"] = schema
        what = schema.get("description") or schema.get("title")
        if not isinstance(what, str) or not what.strip():
            what = name.split("---")[-1].rsplit("_", 1)[0].replace("_", " ")
        prompt = f"Reply with a JSON document only. Write an example: {what.strip()[:300]}"
        out.append(
            Request(
                "json",
                f"mb-{name}",
                [{"role": "user", "content": prompt}],
                {
                    "type": "json_schema",
                    "json_schema": {"name": "doc", "schema": schema, "strict": True},
                },
            )
        )
    return out


def requests_for_level(base: Sequence[Request], at_least: int) -> list[Request]:
    passes = max(1, math.ceil(at_least / len(base)))
    return list(base) * passes


# ---------------------------------------------------------------------------------------------
# One streamed request


@dataclass
class Result:
    kind: str
    name: str
    status: int = 0  # HTTP status; 0 = no response
    error: str = ""  # "", "4xx", "5xx", "stream"
    detail: str = ""
    t_start: float = 0.0
    t_end: float = 0.0
    chunk_times: list[float] = field(default_factory=list)
    completion_tokens: int | None = None  # from `usage`
    prompt_tokens: int | None = None
    finish_reason: str | None = None
    text: str = ""

    @property
    def tokens(self) -> int:
        """Completion tokens: `usage` when the server sent it, else the content chunk count."""
        return (
            self.completion_tokens if self.completion_tokens is not None else len(self.chunk_times)
        )

    @property
    def ttft(self) -> float | None:
        return self.chunk_times[0] - self.t_start if self.chunk_times else None

    @property
    def itl(self) -> float | None:
        if len(self.chunk_times) < 1 or self.tokens < 2:
            return None
        return (self.chunk_times[-1] - self.chunk_times[0]) / (self.tokens - 1)

    def chunk_gaps(self) -> list[float]:
        t = self.chunk_times
        return [b - a for a, b in zip(t, t[1:], strict=False)]


def chat_body(req: Request, model: str, max_tokens: int) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "messages": req.messages,
        "stream": True,
        "temperature": 0,
        "max_tokens": max_tokens,
        "stream_options": {"include_usage": True},
    }
    if req.response_format is not None:
        body["response_format"] = req.response_format
    return body


async def send(
    client: httpx.AsyncClient, base_url: str, body: dict[str, Any], req: Request
) -> Result:
    """POST one streamed chat completion; parse the SSE `data:` lines up to `data: [DONE]`."""
    res = Result(req.kind, req.name)
    res.t_start = time.perf_counter()
    parts: list[str] = []
    try:
        async with client.stream("POST", f"{base_url}/v1/chat/completions", json=body) as resp:
            res.status = resp.status_code
            if resp.status_code >= 400:
                res.error = "4xx" if resp.status_code < 500 else "5xx"
                res.detail = (await resp.aread()).decode(errors="replace")[:300]
                return res
            done = False
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    done = True
                    break
                now = time.perf_counter()
                event: dict[str, Any] = json.loads(payload)
                if "error" in event:
                    res.error, res.detail = "stream", json.dumps(event["error"])[:300]
                    return res
                for choice in event.get("choices") or []:
                    content = (choice.get("delta") or {}).get("content")
                    if content:
                        res.chunk_times.append(now)
                        parts.append(content)
                    if choice.get("finish_reason"):
                        res.finish_reason = choice["finish_reason"]
                usage = event.get("usage")
                if usage:
                    res.completion_tokens = usage.get("completion_tokens")
                    res.prompt_tokens = usage.get("prompt_tokens")
            if not done:
                res.error, res.detail = "stream", "stream ended without data: [DONE]"
    except (httpx.HTTPError, json.JSONDecodeError, OSError) as exc:
        res.error, res.detail = "stream", f"{type(exc).__name__}: {exc}"[:300]
    finally:
        res.t_end = time.perf_counter()
        res.text = "".join(parts)
    return res


async def run_level(
    base_url: str,
    model: str,
    reqs: Sequence[Request],
    concurrency: int,
    max_tokens: int,
    timeout: float,
) -> tuple[list[Result], float]:
    """`concurrency` tasks pull from `reqs`; returns the results and the wall time."""
    queue: asyncio.Queue[Request] = asyncio.Queue()
    for r in reqs:
        queue.put_nowait(r)
    results: list[Result] = []
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency)
    tmo = httpx.Timeout(timeout, connect=10.0)
    async with httpx.AsyncClient(timeout=tmo, limits=limits, trust_env=False) as client:

        async def worker() -> None:
            while True:
                try:
                    req = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                results.append(await send(client, base_url, chat_body(req, model, max_tokens), req))

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    return results, wall


# ---------------------------------------------------------------------------------------------
# Figures


def pct(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100), linear interpolation; None for no values."""
    if not values:
        return None
    v = sorted(values)
    k = (len(v) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def json_valid(text: str, schema: dict[str, Any] | None = None) -> bool:
    """The text is JSON, and follows ``schema`` when one is given (and the jsonschema
    package is installed)."""
    try:
        doc = json.loads(text)
    except ValueError:
        return False
    if schema is None:
        return True
    try:
        import jsonschema  # type: ignore[import-untyped]
    except ImportError:
        return True
    cls = jsonschema.validators.validator_for(schema)
    return bool(cls(schema).is_valid(doc))


def per_request(r: Result, text: bool) -> dict[str, Any]:
    """One request's figures (times in ms from the level's first request)."""
    row: dict[str, Any] = {
        "name": r.name,
        "kind": r.kind,
        "status": r.status,
        "error": r.error,
        "completion_tokens": r.completion_tokens,
        "prompt_tokens": r.prompt_tokens,
        "chunks": len(r.chunk_times),
        "finish_reason": r.finish_reason,
        "ttft_ms": None if r.ttft is None else r.ttft * 1000.0,
        "itl_ms": None if r.itl is None else r.itl * 1000.0,
        "duration_ms": (r.t_end - r.t_start) * 1000.0,
    }
    if text:
        row["text"] = r.text
    return row


def summarize(results: Sequence[Result], wall: float | None) -> dict[str, Any]:
    """Figures over `results`. Throughput: tokens over `wall` when given (a whole level), else
    over the summed request durations (a slice of a sequential level)."""
    ok = [r for r in results if not r.error]
    tokens = sum(r.tokens for r in ok)
    busy = wall if wall is not None else sum(r.t_end - r.t_start for r in ok)
    ttft = [t for r in ok if (t := r.ttft) is not None]
    itl = [t for r in ok if (t := r.itl) is not None]
    gaps = [g for r in ok for g in r.chunk_gaps()]
    chunks = sum(len(r.chunk_times) for r in ok)
    ms = 1000.0
    json_reqs = [r for r in ok if r.kind == "json"]

    def p(vals: list[float], q: float) -> float | None:
        x = pct(vals, q)
        return None if x is None else x * ms

    return {
        "requests": len(results),
        "ok": len(ok),
        "errors_4xx": sum(r.error == "4xx" for r in results),
        "errors_5xx": sum(r.error == "5xx" for r in results),
        "broken_streams": sum(r.error == "stream" for r in results),
        "completion_tokens": tokens,
        "usage_missing": sum(r.completion_tokens is None for r in ok),
        "wall_s": busy,
        "output_tok_s": tokens / busy if busy > 0 else None,
        "ttft_ms_p50": p(ttft, 50),
        "ttft_ms_p99": p(ttft, 99),
        "itl_ms_p50": p(itl, 50),
        "itl_ms_p99": p(itl, 99),
        "chunk_gap_ms_p50": p(gaps, 50),
        "chunk_gap_ms_p99": p(gaps, 99),
        "tokens_per_chunk": tokens / chunks if chunks else None,
        "json_requests": len(json_reqs),
        "json_valid": sum(json_valid(r.text, SCHEMA_OF.get(r.name)) for r in json_reqs),
        "finish_length": sum(r.finish_reason == "length" for r in ok),
    }


# ---------------------------------------------------------------------------------------------
# Servers


@dataclass
class ServerSpec:
    name: str
    argv: list[str]  # with {port} to fill in
    env: dict[str, str]
    health: str = "/health"
    startup_timeout: float = 300.0
    version_argv: list[str] | None = None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def help_text(exe: str) -> str:
    try:
        out = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout + out.stderr


def llama_ngram_args(exe: str, spec_args: str) -> list[str]:
    """The n-gram speculation for `llama-ngram`: `spec_args` when given, else the best this
    llama-server build offers. That is `--spec-type ngram-mod` (a hash pool of n-grams seen in
    every slot's context, shared across slots, drafting until the pool has no next token), with
    its lookup length at the documented 24 and, for a small dense model and short answers, drafts
    of 2..16 tokens instead of the default 48..64 (a draft shorter than n-min is dropped). Older
    builds: `--spec-type ngram-simple`, else prompt lookup via `--lookup-ngram-min`."""
    if spec_args:
        return shlex.split(spec_args)
    text = help_text(exe)
    if "ngram-mod" in text and "--spec-ngram-mod-n-min" in text:
        return [
            "--spec-type", "ngram-mod", "--spec-ngram-mod-n-match", "24",
            "--spec-ngram-mod-n-min", "2", "--spec-ngram-mod-n-max", "16",
        ]  # fmt: skip
    if "ngram-simple" in text:
        return ["--spec-type", "ngram-simple", "--spec-draft-n-max", "16"]
    if "--lookup-ngram-min" in text:
        return ["--lookup-ngram-min", "2"]
    raise RuntimeError("this llama-server has no n-gram speculation option")


def vllm_preload(venv: Path) -> str:
    """LD_PRELOAD for vLLM's CPU backend as its docs advise: tcmalloc (Debian's
    libtcmalloc-minimal4) and Intel's OpenMP (pip's intel-openmp, in the venv), those present."""
    libs = Path("/usr/lib/x86_64-linux-gnu")
    tcmalloc = (libs / "libtcmalloc_minimal.so.4", libs / "libtcmalloc.so.4")
    found = [p for p in tcmalloc if p.exists()][:1]
    found += [p for p in (venv / "lib" / "libiomp5.so",) if p.exists()]
    return ":".join(str(p) for p in found)


def server_specs(args: argparse.Namespace, names: Sequence[str]) -> list[ServerSpec | str]:
    """One spec per requested server, or a line saying why it is skipped."""
    from specdec.models.gguf import smollm2_path

    peers: Path = args.peers
    gguf = str(smollm2_path())
    threads = str(args.threads)
    parallel = str(max(max(args.concurrency), 1) if args.slots <= 0 else args.slots)
    thread_env = {"OMP_NUM_THREADS": threads}
    out: list[ServerSpec | str] = []
    llama = peers / "llama.cpp" / "bin" / "llama-server"
    vllm = peers / "vllm-venv" / "bin" / "vllm"
    hf_dir = peers / "smollm2-hf"
    for name in names:
        if name.startswith("specdec"):
            argv = [sys.executable, "-m", "specdec", "serve", "--host", "127.0.0.1"]
            argv += ["--port", "{port}", "--threads", threads, "--max-batch", parallel]
            if name.startswith("specdec-nodraft"):
                argv += ["--drafter", "none"]
            if name.startswith("specdec-nogd"):  # the drafter's trees without grammar drafts
                argv += ["--no-grammar-drafts"]
            if name.endswith("-int8"):  # llama.cpp's numeric class: 8-bit activations
                argv += ["--numeric", "int8"]
            argv += shlex.split(args.specdec_args)
            out.append(ServerSpec(name, argv, thread_env, version_argv=None))
        elif name.startswith("llama"):
            if not llama.exists():
                out.append(f"{name}: skipped, no {llama} (run benches/peers/llama_cpp.sh)")
                continue
            help_ = help_text(str(llama))
            ctx = args.llama_ctx or max(4096, int(parallel) * (args.max_tokens + 384))
            argv = [str(llama), "-m", gguf, "--host", "127.0.0.1", "--port", "{port}"]
            argv += ["-t", threads, "-tb", threads, "-c", str(ctx)]
            argv += ["--parallel", parallel, "--cont-batching"]
            # One KV pool shared by the slots (else each slot gets ctx / parallel).
            argv += ["--kv-unified"] if "--kv-unified" in help_ else []
            argv += ["--no-webui"] if "--no-webui" in help_ else []
            if name == "llama-ngram":
                try:
                    argv += llama_ngram_args(str(llama), args.llama_spec_args)
                except RuntimeError as exc:
                    out.append(f"{name}: skipped, {exc}")
                    continue
            out.append(ServerSpec(name, argv, thread_env, version_argv=[str(llama), "--version"]))
        elif name.startswith("vllm"):
            if not vllm.exists():
                out.append(f"{name}: skipped, no {vllm} (run benches/peers/vllm.sh)")
                continue
            if not (hf_dir / "config.json").exists():
                out.append(f"{name}: skipped, no {hf_dir} (run benches/peers/smollm2_hf.py)")
                continue
            argv = [str(vllm), "serve", str(hf_dir), "--host", "127.0.0.1", "--port", "{port}"]
            argv += ["--dtype", "float32", "--enforce-eager", "--max-model-len", "2048"]
            argv += ["--served-model-name", "smollm2-135m-instruct"]
            argv += ["--max-num-seqs", parallel]
            if name == "vllm-ngram":
                spec = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}
                argv += ["--speculative-config", json.dumps(spec)]
            env = {**thread_env, **VLLM_CPU_ENV, "VLLM_CPU_KVCACHE_SPACE": str(args.vllm_kv_gib)}
            preload = vllm_preload(vllm.parent.parent)
            if preload:
                env["LD_PRELOAD"] = preload
            out.append(
                ServerSpec(
                    name, argv, env, startup_timeout=600.0, version_argv=[str(vllm), "--version"]
                )
            )
        else:
            out.append(f"{name}: unknown server (known: {', '.join(ALL_SERVERS)})")
    return out


class Server:
    """A server subprocess in its own process group, output to a log file."""

    def __init__(self, spec: ServerSpec, log_dir: Path, tag: str) -> None:
        self.spec = spec
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_dir / f"{spec.name}-{tag}.log"
        self.argv = [a.replace("{port}", str(self.port)) for a in spec.argv]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {**os.environ, **self.spec.env}
        with open(self.log_path, "wb") as log:
            log.write(("$ " + shlex.join(self.argv) + "\n").encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )

    def log_tail(self, n: int = 25) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def wait_ready(self) -> str:
        """Polls the health endpoint until 200; returns the first model of GET /v1/models."""
        assert self.proc is not None
        deadline = time.monotonic() + self.spec.startup_timeout
        with httpx.Client(timeout=5.0, trust_env=False) as client:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"exited with {self.proc.returncode}")
                try:
                    if client.get(self.base_url + self.spec.health).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"not healthy after {self.spec.startup_timeout:.0f} s")
                time.sleep(0.5)
            resp = client.get(self.base_url + "/v1/models")
            resp.raise_for_status()
            data: list[dict[str, Any]] = resp.json()["data"]
            return str(data[0]["id"])

    def stop(self) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGINT, 20.0), (signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            try:
                proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        # Children left in the group (vLLM's engine core) go too.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def version_of(spec: ServerSpec) -> str:
    if spec.version_argv is None:
        try:
            from importlib.metadata import version

            return f"specdec {version('specdec')}"
        except Exception:  # a missing version only blanks a label
            return ""
    try:
        out = subprocess.run(spec.version_argv, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError):
        return ""
    lines = [ln for ln in (out.stdout + out.stderr).splitlines() if ln.strip()]
    keep = [ln for ln in lines if "version" in ln.lower()] or lines[-1:]
    label = keep[0].strip() if keep else ""
    # benches/peers/llama_cpp.sh notes the sdist's version next to the binaries.
    note = Path(spec.version_argv[0]).parent / "VERSION"
    if note.exists():
        label = f"{note.read_text().strip()}; {label}"
    return label


# ---------------------------------------------------------------------------------------------
# Driver


# The warm-up request: not one of the measured prompts, so no server has seen those before the
# timed requests (llama-server's ngram-mod pool, for one, remembers every answer it gave).
WARMUP = Request("warmup", "warmup", [{"role": "user", "content": "Count from one to ten."}])


def _cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def machine_busy(seconds: float = 2.0) -> float | None:
    """Share of the machine's CPU time in use over `seconds` while no server of ours runs: what
    other work (another user, a build) takes from the measurement. None off Linux."""
    try:
        b0, t0 = _cpu_times()
        time.sleep(seconds)
        b1, t1 = _cpu_times()
    except (OSError, ValueError, IndexError):
        return None
    return (b1 - b0) / (t1 - t0) if t1 > t0 else None


def _group_jiffies(pgid: int) -> int:
    """CPU time (user + system jiffies) of the live processes of process group `pgid`."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 12 and int(fields[2]) == pgid:
            total += int(fields[11]) + int(fields[12])
    return total


class OtherWork:
    """The share of the machine's CPU time taken by other work (neither this script nor the
    server's process group) between `__init__` and `share()`."""

    def __init__(self, pgid: int | None) -> None:
        self.pgid = pgid
        self.start = self._sample()

    def _sample(self) -> tuple[int, int, int, float] | None:
        try:
            busy, total = _cpu_times()
            group = _group_jiffies(self.pgid) if self.pgid is not None else 0
        except (OSError, ValueError, IndexError):
            return None
        t = os.times()
        return busy, total, group, t.user + t.system

    def share(self) -> float | None:
        end = self._sample()
        if self.start is None or end is None or end[1] <= self.start[1]:
            return None
        hz = os.sysconf("SC_CLK_TCK")
        ours = (end[2] - self.start[2]) + (end[3] - self.start[3]) * hz
        other = (end[0] - self.start[0]) - ours
        return max(0.0, other / (end[1] - self.start[1]))


# Above this share of the CPU taken by other work, figures are flagged.
BUSY_WARN = 0.10


def start_server(
    spec: ServerSpec, log_dir: Path, tag: str, record: dict[str, Any], say: Callable[[str], None]
) -> tuple[Server, str] | None:
    """Starts a server and waits for it; None (with record["error"] set) when it fails."""
    server = Server(spec, log_dir, tag)
    # The machine may be shared: the load before the start tells whether figures are trustworthy.
    busy = machine_busy()
    record.setdefault("cpu_busy_before", {})[tag] = busy
    record.setdefault("loadavg_before", {})[tag] = os.getloadavg()
    record["argv"] = server.argv
    shown = "?" if busy is None else f"{busy:.0%}"
    say(f"[{spec.name}] CPU busy before start {shown}; starting: {shlex.join(server.argv)}")
    if busy is not None and busy > BUSY_WARN:
        say(f"[{spec.name}] warning: the machine is busy with other work; figures are unreliable")
    t0 = time.perf_counter()
    server.start()
    try:
        model = server.wait_ready()
    except (RuntimeError, httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
        record["error"] = f"start failed: {exc}"
        say(f"[{spec.name}] start failed: {exc}; log {server.log_path}:\n{server.log_tail()}")
        server.stop()
        return None
    startup = time.perf_counter() - t0
    record.setdefault("startup_s", {})[tag] = startup
    record["model"] = model
    say(f"[{spec.name}] ready in {startup:.1f} s, model {model!r}")
    return server, model


def bench_server(
    spec: ServerSpec,
    args: argparse.Namespace,
    base: Sequence[Request],
    log_dir: Path,
    say: Callable[[str], None],
) -> dict[str, Any]:
    """All concurrency levels on one server config; a fresh server per level unless
    --no-restart (so no level inherits another's caches)."""
    record: dict[str, Any] = {
        "server": spec.name,
        "env": spec.env,
        "version": version_of(spec),
        "restart_per_level": not args.no_restart,
        "levels": {},
    }
    server: Server | None = None
    model = ""
    tag = ""
    try:
        for c in args.concurrency:
            if server is None or not args.no_restart:
                if server is not None:
                    server.stop()
                    say(f"[{spec.name}] stopped")
                tag = "all" if args.no_restart else f"c{c}"
                started = start_server(spec, log_dir, tag, record, say)
                if started is None:
                    return record
                server, model = started
                warm, _ = asyncio.run(
                    run_level(
                        server.base_url, model, [WARMUP], 1, args.max_tokens, args.request_timeout
                    )
                )
                if warm[0].error:
                    say(f"[{spec.name}] warm-up failed: {warm[0].error} {warm[0].detail}")
            at_least = args.requests if args.requests > 0 else max(8, 2 * c)
            reqs = requests_for_level(base, at_least)
            other = OtherWork(server.proc.pid if server.proc is not None else None)
            before = engine_counters(server.base_url) if spec.name.startswith("specdec") else {}
            results, wall = asyncio.run(
                run_level(server.base_url, model, reqs, c, args.max_tokens, args.request_timeout)
            )
            other_share = other.share()
            level: dict[str, Any] = summarize(results, wall)
            if before:
                level.update(engine_figures(before, engine_counters(server.base_url)))
            level["concurrency"] = c
            level["passes"] = len(reqs) // len(base)
            level["cpu_busy_before"] = record["cpu_busy_before"].get(tag)
            level["cpu_other_during"] = other_share
            if c == 1:
                level["by_kind"] = {
                    k: summarize([r for r in results if r.kind == k], None)
                    for k in dict.fromkeys(r.kind for r in base)
                }
            errs = [f"{r.name}: {r.error} {r.status} {r.detail}" for r in results if r.error]
            level["error_samples"] = errs[:5]
            level["per_request"] = [per_request(r, args.keep_text) for r in results]
            record["levels"][str(c)] = level
            tps = level["output_tok_s"]
            say(
                f"[{spec.name}] c={c}: {level['ok']}/{level['requests']} ok, "
                f"{tps if tps is None else round(tps, 1)} tok/s, {wall:.1f} s"
                + (f"; errors e.g. {errs[0]}" if errs else "")
                + (
                    f"; other work took {other_share:.0%} of the CPU: figures unreliable"
                    if other_share is not None and other_share > BUSY_WARN
                    else ""
                )
            )
    finally:
        if server is not None:
            server.stop()
            say(f"[{spec.name}] stopped")
    return record


ENGINE_COUNTERS = {
    "specdec:generation_tokens_total": "tokens",
    "specdec:engine_steps_total": "steps",
    "specdec:grammar_drafted_tokens_total": "grammar",
}


def engine_counters(base_url: str) -> dict[str, float]:
    """specdec's generated tokens, engine steps and grammar-drafted tokens so far (its
    Prometheus ``/metrics``); empty when they cannot be read."""
    try:
        text = httpx.get(f"{base_url}/metrics", timeout=10.0, trust_env=False).text
    except httpx.HTTPError:
        return {}
    out: dict[str, float] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in ENGINE_COUNTERS:
            out[ENGINE_COUNTERS[name]] = float(value)
    return out


def engine_figures(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """A level's tokens per engine step (at concurrency 1: the acceptance length) and the
    share of its tokens its grammars drafted, from the counters around it."""
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in ENGINE_COUNTERS.values()}
    return {
        "engine_tokens_per_step": d["tokens"] / d["steps"] if d["steps"] > 0 else None,
        "grammar_share": d["grammar"] / d["tokens"] if d["tokens"] > 0 else None,
    }


def fmt(x: Any, nd: int = 1) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def busy_label(busy: float | None) -> str:
    if busy is None:
        return "-"
    return f"{busy:.0%}" + (" (busy!)" if busy > BUSY_WARN else "")


def ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}x"


def markdown(records: Sequence[dict[str, Any]], args: argparse.Namespace) -> str:
    ref = next((r for r in records if r["server"] == "specdec" and r["levels"]), None)
    lines = [
        f"max_tokens={args.max_tokens}, threads={args.threads}; TTFT = first content chunk; "
        "ITL = per request (last chunk - first chunk) / (completion tokens - 1); "
        "gap = time between content chunks (a chunk may carry several tokens); times in ms; "
        "x = ratio to specdec at the same concurrency; other CPU use = the share of the machine's "
        "CPU that work other than this run took during the level (figures unreliable above "
        f"{BUSY_WARN:.0%})",
        "",
        "| server | conc | reqs | ok | 4xx | 5xx | broken | out tok/s | tok/s vs specdec "
        "| TTFT p50 | TTFT p99 | ITL p50 | ITL p99 | gap p99 | tok/chunk | TTFT p50 vs specdec "
        "| other CPU use |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for rec in records:
        if not rec["levels"]:
            lines.append(f"| {rec['server']} | - | {rec.get('error', 'no result')} |")
            continue
        for c, lv in rec["levels"].items():
            rl = ref["levels"].get(c) if ref else None
            lines.append(
                "| "
                + " | ".join(
                    [
                        rec["server"],
                        c,
                        fmt(lv["requests"]),
                        fmt(lv["ok"]),
                        fmt(lv["errors_4xx"]),
                        fmt(lv["errors_5xx"]),
                        fmt(lv["broken_streams"]),
                        fmt(lv["output_tok_s"]),
                        ratio(lv["output_tok_s"], rl["output_tok_s"] if rl else None),
                        fmt(lv["ttft_ms_p50"]),
                        fmt(lv["ttft_ms_p99"]),
                        fmt(lv["itl_ms_p50"]),
                        fmt(lv["itl_ms_p99"]),
                        fmt(lv["chunk_gap_ms_p99"]),
                        fmt(lv["tokens_per_chunk"], 2),
                        ratio(lv["ttft_ms_p50"], rl["ttft_ms_p50"] if rl else None),
                        busy_label(lv.get("cpu_other_during")),
                    ]
                )
                + " |"
            )
    passes = sorted({(int(c), lv["passes"]) for rec in records for c, lv in rec["levels"].items()})
    repeated = [f"c={c}: {p} passes" for c, p in passes if p > 1]
    restart = all(rec.get("restart_per_level", True) for rec in records)
    lines += [
        "",
        ("A fresh server per level, warmed up with one unmeasured prompt. " if restart else "")
        + (
            "Prompts repeated within a level ("
            + ", ".join(repeated)
            + "): a server that remembers earlier answers across requests (llama-server's "
            "ngram-mod pool) drafts the repeats from memory."
            if repeated
            else "Every prompt sent once per level."
        ),
    ]
    engine = [
        (rec["server"], c, lv)
        for rec in records
        for c, lv in rec["levels"].items()
        if lv.get("engine_tokens_per_step") is not None
    ]
    if engine:
        lines += [
            "",
            "specdec's engine per level (its /metrics): tokens per engine step (at concurrency "
            "1 the acceptance length) and the share of tokens its grammars drafted:",
            "",
            "| server | conc | tok/step | grammar-drafted share |",
            "|---|---:|---:|---:|",
        ]
        for server, c, lv in engine:
            share = lv.get("grammar_share")
            lines.append(
                f"| {server} | {c} | {fmt(lv['engine_tokens_per_step'], 2)} | "
                + ("-" if share is None else f"{share:.0%}")
                + " |"
            )
    kinds = [
        (rec["server"], k, s)
        for rec in records
        for k, s in (rec["levels"].get("1", {}).get("by_kind") or {}).items()
    ]
    if kinds:
        lines += [
            "",
            "Per prompt kind, concurrency 1 (tok/s over the kind's summed request times):",
            "",
            "| server | kind | reqs | ok | out tok/s | tok/s vs specdec | TTFT p50 | ITL p50 "
            "| ITL p99 | tok/chunk | hit max_tokens | JSON valid |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        ref_kinds = (ref["levels"].get("1", {}).get("by_kind") or {}) if ref else {}
        for server, k, s in kinds:
            rk = ref_kinds.get(k)
            valid = f"{s['json_valid']}/{s['json_requests']}" if k == "json" else "-"
            lines.append(
                "| "
                + " | ".join(
                    [
                        server,
                        k,
                        fmt(s["requests"]),
                        fmt(s["ok"]),
                        fmt(s["output_tok_s"]),
                        ratio(s["output_tok_s"], rk["output_tok_s"] if rk else None),
                        fmt(s["ttft_ms_p50"]),
                        fmt(s["itl_ms_p50"]),
                        fmt(s["itl_ms_p99"]),
                        fmt(s["tokens_per_chunk"], 2),
                        fmt(s["finish_length"]),
                        valid,
                    ]
                )
                + " |"
            )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description="Load benchmark of OpenAI-compatible servers (specdec, llama-server, vLLM).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    ap.add_argument("--servers", default=DEFAULT_SERVERS, help=f"from {','.join(ALL_SERVERS)}")
    ap.add_argument("--concurrency", default="1,4,16", help="comma-separated levels")
    ap.add_argument(
        "--requests",
        type=int,
        default=0,
        help="at least this many requests per level (whole passes over the prompt list); "
        "0: max(8, 2*concurrency)",
    )
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--peers",
        type=Path,
        default=Path(os.environ.get("SPECDEC_PEERS", Path.home() / ".cache" / "specdec-peers")),
        help="where benches/peers/ installed the peers ($SPECDEC_PEERS)",
    )
    ap.add_argument("--json", type=Path, default=None, help="write every figure here")
    ap.add_argument("--logs", type=Path, default=None, help="server logs (default: a temp dir)")
    ap.add_argument("--specdec-args", default="", help="extra arguments for `specdec serve`")
    ap.add_argument(
        "--llama-ctx",
        type=int,
        default=0,
        help="llama-server -c; 0: max(4096, parallel * (max_tokens + 384))",
    )
    ap.add_argument(
        "--llama-spec-args",
        default="",
        help="llama-ngram's speculation options (default: ngram-mod, see llama_ngram_args)",
    )
    ap.add_argument(
        "--slots",
        type=int,
        default=0,
        help="slots of every server (specdec --max-batch, llama-server --parallel, vLLM "
        "--max-num-seqs); 0: the highest concurrency level",
    )
    ap.add_argument("--vllm-kv-gib", type=int, default=2, help="VLLM_CPU_KVCACHE_SPACE")
    ap.add_argument("--request-timeout", type=float, default=600.0, help="seconds per request")
    ap.add_argument(
        "--no-restart",
        action="store_true",
        help="one server for all levels (default: a fresh one per level, warmed up alike)",
    )
    ap.add_argument(
        "--keep-text", action="store_true", help="put the generated texts in --json too"
    )
    ap.add_argument(
        "--maskbench",
        type=Path,
        default=None,
        help="instead of the built-in prompts: JSON requests from the MaskBench schema files "
        "in this directory (guidance-ai/jsonschemabench maskbench/data)",
    )
    ap.add_argument(
        "--maskbench-limit", type=int, default=8, help="MaskBench schemas taken (evenly spread)"
    )
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="specdec alone, concurrency 1, one request of each kind, 8 tokens (the test suite)",
    )
    args = ap.parse_args(argv)
    if args.smoke:
        args.servers, args.concurrency, args.max_tokens, args.requests = "specdec", "1", 8, 1
    args.concurrency = [int(c) for c in str(args.concurrency).split(",") if c.strip()]
    args.servers = [s.strip() for s in str(args.servers).split(",") if s.strip()]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)

    def say(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    log_dir = args.logs or Path(tempfile.mkdtemp(prefix="bench_serve-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    say(f"server logs: {log_dir}")
    base = (
        build_requests()
        if args.maskbench is None
        else maskbench_requests(args.maskbench, args.maskbench_limit)
    )
    if args.smoke:
        base = [next(r for r in base if r.kind == k) for k in dict.fromkeys(r.kind for r in base)]
    records: list[dict[str, Any]] = []
    skipped: list[str] = []
    for spec in server_specs(args, args.servers):
        if isinstance(spec, str):
            say(spec)
            skipped.append(spec)
            continue
        records.append(bench_server(spec, args, base, log_dir, say))
    table = markdown(records, args)
    print(table)
    for line in skipped:
        print(f"\n{line}")
    if args.json is not None:
        doc = {
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "requests": [asdict(r) for r in base],
            "servers": records,
            "skipped": skipped,
            "cpu": _cpu_model(),
        }
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
        say(f"wrote {args.json}")
    ok = all(rec["levels"] and "error" not in rec for rec in records)
    return 0 if ok else 1


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return ""


if __name__ == "__main__":
    raise SystemExit(main())
