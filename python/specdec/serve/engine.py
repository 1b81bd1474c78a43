"""The serving engine: one model, one :class:`~specdec.decode.SpeculativeGenerator` and one
thread that owns its loop. Requests join and leave between steps; each request's committed
tokens go to the sink its submitter gave (the HTTP layer hands them to its event loop).

It knows nothing of HTTP: the web layer (:mod:`specdec.serve.app`) turns a request body
into :class:`EngineRequest` and the outputs into response chunks; the soak test and the
tests drive it directly too.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from ..decode import SpeculativeGenerator
from ..decode.common import RequestOutput
from ..errors import ConfigError, GrammarError, SpecdecError
from ..verify import DecodingRule, Greedy, Sampling
from .metrics import ServerMetrics

__all__ = [
    "DRAFTERS",
    "ConstraintSpec",
    "Engine",
    "EngineConfig",
    "EngineRequest",
    "QueueFull",
    "ShuttingDown",
]

DrafterName = Literal["suffix", "ngram", "block", "block+suffix", "none"]
DRAFTERS: tuple[DrafterName, ...] = ("suffix", "ngram", "block", "block+suffix", "none")
Sink = Callable[[RequestOutput], None]


class QueueFull(SpecdecError):
    """The engine's queue of waiting requests is full (HTTP 429)."""


class ShuttingDown(SpecdecError):
    """The engine takes no new requests: it is stopping (HTTP 503)."""


@dataclass(frozen=True)
class EngineConfig:
    """What ``specdec serve`` runs. ``model``: a GGUF file (None: the packaged SmolLM2);
    ``drafter``: one of :data:`DRAFTERS`; ``budget``: drafted nodes per tree, or ``"auto"``;
    ``kv_tokens``: the paged KV pool's size in tokens (None: sized by ``kv_cache_gib``);
    ``kv_cache_gib``: without ``kv_tokens``, the pool takes this much memory, and at least
    room for ``max_batch`` requests of 1,024 tokens: what finished requests leave in it
    stays in the prefix cache (least recently used out) for later requests that share their
    prompts (a chat's earlier turns, a common system prompt), as llama-server's prompt cache
    and vLLM's KV space keep them;
    ``threads``: torch threads (None: torch's default); ``max_queue``: most requests waiting
    for a slot in the batch (past it, :class:`QueueFull`); ``served_name``: the model name
    clients send (None: the file's stem); ``numeric``: how the target's products round
    (:attr:`~specdec.models.llama.LlamaModel.numeric`: ``"exact"`` or ``"int8"``);
    ``grammar_drafts``: a constrained request's trees start with what its grammar forces
    (:mod:`specdec.draft.grammar`)."""

    model: str | None = None
    drafter: DrafterName = "suffix"
    budget: int | Literal["auto"] = "auto"
    max_batch: int = 8
    kv_tokens: int | None = None
    kv_cache_gib: float = 1.0
    threads: int | None = None
    max_queue: int = 64
    served_name: str | None = None
    block_size: int = 16
    max_budget: int = 32
    numeric: Literal["exact", "int8"] = "exact"
    grammar_drafts: bool = True


@dataclass(frozen=True)
class ConstraintSpec:
    """A request's grammar: ``kind`` is ``"json_schema"`` (``source``: the schema),
    ``"regex"``, ``"gbnf"`` or ``"lark"`` (``source``: its text); ``strict``: JSON objects
    allow no properties beyond the declared ones."""

    kind: Literal["json_schema", "regex", "gbnf", "lark"]
    source: Any
    strict: bool = False


@dataclass
class EngineRequest:
    """One generation: prompt ids, at most ``max_tokens`` new tokens, ending at a token of
    ``stop_token_ids`` (the model's end-of-text token too, unless ``ignore_eos``)."""

    prompt: list[int]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop_token_ids: Sequence[int] = ()
    ignore_eos: bool = False
    constraint: ConstraintSpec | None = None
    cache_salt: str | None = None

    def rule(self) -> DecodingRule:
        if self.temperature == 0.0:
            return Greedy()
        return Sampling(self.temperature, self.top_k, self.top_p)


@dataclass
class _Entry:
    sink: Sink
    t_submit: float
    last_token_t: float | None = None
    tokens: int = 0
    endpoint: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


class Engine:
    """Loads the model, builds the generator and runs its loop on its own thread.

    :meth:`submit` (any thread) compiles the request's grammar and queues it; its outputs
    go to ``sink`` from the engine thread, the last one with ``finished=True``.
    :meth:`cancel` (any thread) ends a request at the next step, freeing its KV blocks.
    :meth:`shutdown` refuses new requests, lets running ones finish for ``grace`` seconds,
    cancels the rest and joins the thread."""

    def __init__(self, config: EngineConfig, metrics: ServerMetrics | None = None) -> None:
        from ..models.gguf import load_gguf, smollm2_path

        self.config = config
        if config.threads is not None:
            torch.set_num_threads(config.threads)
        path = Path(config.model) if config.model is not None else smollm2_path()
        self.loaded = load_gguf(path)
        self.model = self.loaded.model
        self.model.numeric = config.numeric
        self.tokenizer = self.loaded.tokenizer
        self.model_name = config.served_name or path.stem
        self.vocab = self.loaded.vocabulary()
        self.eos_token_id = self.loaded.eos_token_id
        self.max_positions = int(self.model.max_positions)
        self.metrics = metrics if metrics is not None else ServerMetrics()
        drafter = self._drafter(config.drafter)
        self.generator = SpeculativeGenerator(
            self.model,
            drafter,
            strategy="ar" if config.drafter == "none" else "ddtree",
            budget=config.budget,
            max_budget=config.max_budget,
            max_depth=self._depth,
            cache="paged",
            kv_tokens=self._pool_tokens(),
            block_size=config.block_size,
            max_batch=config.max_batch,
            grammar_drafts=config.grammar_drafts,
        )
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._entries: dict[int, _Entry] = {}
        self._grammars: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
        self._stopping = False
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="specdec-engine", daemon=True)
        self._started = threading.Event()

    # -- set-up ----------------------------------------------------------------------------
    def _pool_tokens(self) -> int:
        """The paged pool's size in tokens: ``kv_tokens``, else what ``kv_cache_gib`` holds
        (never less than the generator's default,
        :meth:`~specdec.decode.SpeculativeGenerator.default_kv_tokens`)."""
        config = self.config
        if config.kv_tokens is not None:
            return config.kv_tokens
        gib = config.kv_cache_gib
        if isinstance(gib, bool) or not isinstance(gib, (int, float)) or not 0 < gib < 2**20:
            raise ConfigError(f"kv_cache_gib must be a number of GiB above 0, got {gib!r}")
        c = self.model.new_cache(1)
        itemsize = torch.finfo(self.model.dtype).bits // 8
        per_token = 2 * c.num_layers * c.num_kv_heads * c.head_dim * itemsize  # K and V
        floor = SpeculativeGenerator.default_kv_tokens(config.max_batch, self.max_positions)
        return max(int(gib * 2**30) // per_token, floor)

    def _drafter(self, name: str) -> Any:
        from ..draft import BlockDrafter, CombinedDrafter, NgramDrafter, SuffixDrafter

        self._depth = 8
        if name == "none":
            return None
        # Finished outputs join the suffix corpus (per cache salt, bounded): a server sees
        # the same answers, templates and code again, as suffix decoding's global tree does.
        if name == "suffix":
            self._depth = 16
            return SuffixDrafter(max_depth=16, remember_outputs=True)
        if name == "ngram":
            return NgramDrafter(self.model.vocab_size, max_depth=8)
        if name in ("block", "block+suffix"):
            block = BlockDrafter.shipped(self.model)
            self._depth = int(block.config.block_size)
            if name == "block":
                return block
            suffix = SuffixDrafter(max_depth=16, remember_outputs=True)
            return CombinedDrafter(block, suffix, max_depth=self._depth)
        raise ConfigError(f"drafter must be one of {', '.join(DRAFTERS)}, got {name!r}")

    def start(self, warmup: bool = True) -> None:
        """Start the engine thread; ``warmup``: first run a short request and a long
        prompt, so the first clients do not pay for the adaptive budget's calibration or
        for the set-up of the long-prompt path (a prompt of more rows than the fused step
        takes runs layer by layer on weights packed on first use: ~0.25 s on SmolLM2)."""
        self._thread.start()
        if warmup:
            long = self.encode_text("Count from one to a hundred, one number per line. " * 12)
            runs = [(self.encode_text("Hello"), 8), (long[:128], 1)]
            for prompt, new in runs[: 2 if self.generator.max_new_tokens_for(128) else 1]:
                done = threading.Event()

                def sink(o: RequestOutput, done: threading.Event = done) -> None:
                    if o.finished:
                        done.set()

                self.submit(EngineRequest(prompt, new, temperature=0.0), sink, endpoint="warmup")
                done.wait()
        self._started.set()

    @property
    def ready(self) -> bool:
        return self._started.is_set() and not self._stopping and self._failure is None

    # -- text ------------------------------------------------------------------------------
    def encode_text(self, text: str) -> list[int]:
        """Token ids of ``text`` (special tokens written in it stay whole)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    # -- requests --------------------------------------------------------------------------
    def compile(self, spec: ConstraintSpec) -> Any:
        """The grammar of ``spec`` on this model's vocabulary (compiled grammars are kept,
        64 at most, least recently used out). A bad schema, regex or grammar raises
        :class:`~specdec.errors.GrammarError`."""
        import json

        src = spec.source if isinstance(spec.source, str) else json.dumps(spec.source)
        key = (spec.kind, src, spec.strict)
        with self._lock:
            hit = self._grammars.get(key)
            if hit is not None:
                self._grammars.move_to_end(key)
                return hit
        if spec.kind == "json_schema":
            # OpenAI's strict mode: closed objects, properties in declared order.
            g: Any = self.vocab.json_schema(
                spec.source,
                whitespace=False,
                additional_properties=not spec.strict,
                property_order="declared" if spec.strict else "any",
            )
        elif spec.kind == "regex":
            g = self.vocab.regex(spec.source)
        elif spec.kind == "gbnf":
            g = self.vocab.gbnf(spec.source)
        elif spec.kind == "lark":
            g = self.vocab.lark(spec.source)
        else:
            raise GrammarError(f"unknown grammar kind {spec.kind!r}")
        with self._lock:
            self._grammars[key] = g
            while len(self._grammars) > 64:
                self._grammars.popitem(last=False)
        return g

    def submit(self, req: EngineRequest, sink: Sink, *, endpoint: str = "") -> int:
        """Queue ``req``; returns its id (as :meth:`submit_all` for one request)."""
        return self.submit_all([(req, sink)], endpoint=endpoint)[0]

    def submit_all(
        self, requests: Sequence[tuple[EngineRequest, Sink]], *, endpoint: str = ""
    ) -> list[int]:
        """Queue several requests (an HTTP request's choices) together, all or none;
        returns their ids. Raises :class:`ShuttingDown`, :class:`QueueFull` (they would
        take the queue past ``max_queue``; a ``ConfigError`` when they alone would), or the
        generator's refusal (``VerifyError``: past the model's positions;
        ``KVCacheError``: larger than the KV pool; ``GrammarError``: a bad grammar)."""
        if endpoint != "warmup" and len(requests) > self.config.max_queue:
            raise ConfigError(
                f"{len(requests)} completions in one request, more than the queue holds "
                f"(--max-queue {self.config.max_queue})"
            )
        prepared = []
        for req, sink in requests:
            constraint = None if req.constraint is None else self.compile(req.constraint)
            stops = set(req.stop_token_ids)
            if not req.ignore_eos and self.eos_token_id is not None:
                stops.add(self.eos_token_id)
            prepared.append((req, sink, constraint, stops))
        rids: list[int] = []
        with self._lock:
            if self._stopping or self._failure is not None:
                raise ShuttingDown("the server is shutting down")
            waiting = self.generator.num_waiting
            if endpoint != "warmup" and waiting + len(requests) > self.config.max_queue:
                raise QueueFull(
                    f"{waiting} requests are waiting (--max-queue {self.config.max_queue}); "
                    "retry later"
                )
            try:
                for req, sink, constraint, stops in prepared:
                    rid = self.generator.submit(
                        req.prompt,
                        max_new_tokens=req.max_tokens,
                        stop_tokens=stops,
                        constraint=constraint,
                        cache_salt=req.cache_salt,
                        seed=req.seed,
                        rule=req.rule(),
                    )
                    rids.append(rid)
                    self._entries[rid] = _Entry(sink, time.perf_counter(), endpoint=endpoint)
            except BaseException:
                for rid in rids:  # none of them runs: their outputs go nowhere
                    self._entries.pop(rid, None)
                    self.generator.cancel(rid)
                raise
            self._wake.notify()
        self.metrics.queued(self.generator.num_waiting)
        return rids

    def cancel(self, request_id: int) -> bool:
        """End a request at the next step (its KV blocks are freed then)."""
        return self.generator.cancel(request_id)

    @property
    def num_requests(self) -> int:
        """Requests submitted and not finished."""
        with self._lock:
            return len(self._entries)

    # -- the loop --------------------------------------------------------------------------
    def _loop(self) -> None:
        gen = self.generator
        try:
            while True:
                with self._lock:
                    while not gen.has_unfinished() and not self._stopping:
                        self._wake.wait()
                    if self._stopping and not gen.has_unfinished():
                        return
                t0 = time.perf_counter()
                outputs = gen.step()
                self.metrics.step(time.perf_counter() - t0, gen.num_running)
                self._deliver(outputs)
        except BaseException as e:  # a bug, not a request's failure: end every request
            self._failure = e
            with self._lock:
                entries, self._entries = self._entries, {}
            for rid, entry in entries.items():
                entry.sink(RequestOutput(rid, [], True, None))

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        now = time.perf_counter()
        for o in outputs:
            with self._lock:
                entry = self._entries.pop(o.request_id) if o.finished else None
                entry = entry or self._entries.get(o.request_id)
            if entry is None:
                continue
            if o.new_tokens:
                if entry.last_token_t is None:
                    self.metrics.first_token(now - entry.t_submit)
                else:
                    self.metrics.inter_token(now - entry.last_token_t, len(o.new_tokens))
                entry.last_token_t = now
                entry.tokens += len(o.new_tokens)
            if o.finished and o.result is not None and entry.endpoint != "warmup":
                self.metrics.finished(o.result, now - entry.t_submit)
            entry.sink(o)
        self.metrics.queued(self.generator.num_waiting)
        self.metrics.kv(self.generator.kv_usage())

    def shutdown(self, grace: float = 30.0) -> None:
        """Refuse new requests; wait up to ``grace`` seconds for those in flight, cancel
        what is left, and stop the thread."""
        with self._lock:
            self._stopping = True
            self._wake.notify()
        deadline = time.monotonic() + grace
        while self.num_requests and time.monotonic() < deadline and self._thread.is_alive():
            time.sleep(0.05)
        with self._lock:
            left = list(self._entries)
        for rid in left:
            self.generator.cancel(rid)
        if self._thread.is_alive():
            self._thread.join()
