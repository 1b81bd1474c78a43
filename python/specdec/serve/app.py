"""The HTTP layer: OpenAI's routes on Starlette over an :class:`~specdec.serve.engine.Engine`.

It validates bodies (pydantic), renders chat messages, turns committed tokens into text
(:mod:`specdec.serve.text`) and streams it as server-sent events; the decoding itself is
the engine's. A client that disconnects cancels its requests at once. Every refusal is a
4xx with OpenAI's error body."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..decode.common import GenerationResult, RequestOutput
from ..errors import ConfigError, GrammarError, KVCacheError, SpecdecError, VerifyError
from .engine import ConstraintSpec, Engine, EngineRequest, QueueFull, ShuttingDown
from .protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    OpenAIError,
    validation_error,
)
from .text import TextStream, render_chat

__all__ = ["create_app"]

MAX_BODY_BYTES = 16 << 20


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"


def _error_response(e: OpenAIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


@dataclass
class _Choice:
    """One completion of an HTTP request: its engine request and text so far."""

    index: int
    prompt: int  # which prompt (completions take several)
    text: TextStream
    rid: int = -1
    done: bool = False  # its text ended (finished, or a stop string)
    result: GenerationResult | None = None
    finish_reason: str | None = None
    error: OpenAIError | None = None
    pieces: list[str] = field(default_factory=list)


class _Server:
    def __init__(self, engine: Engine, api_key: str | None) -> None:
        self.engine = engine
        self.api_key = api_key
        tok = engine.tokenizer
        bos, eos = engine.loaded.bos_token_id, engine.eos_token_id
        self.bos = "" if bos is None else (tok.id_to_token(bos) or "")
        self.eos = "" if eos is None else (tok.id_to_token(eos) or "")

    # -- routes ----------------------------------------------------------------------------
    async def health(self, request: Request) -> Response:
        if not self.engine.ready:
            return JSONResponse({"status": "starting or stopping"}, status_code=503)
        return JSONResponse({"status": "ok"})

    async def metrics(self, request: Request) -> Response:
        return Response(
            self.engine.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8"
        )

    def _model_card(self) -> dict[str, Any]:
        return {
            "id": self.engine.model_name,
            "object": "model",
            "created": 0,
            "owned_by": "specdec",
            "max_model_len": self.engine.max_positions,
        }

    async def models(self, request: Request) -> Response:
        return await self._guard(request, "/v1/models", self._models)

    async def _models(self, request: Request) -> Response:
        name = request.path_params.get("model")
        if name is not None:
            self._check_model(name)
            return JSONResponse(self._model_card())
        return JSONResponse({"object": "list", "data": [self._model_card()]})

    async def chat(self, request: Request) -> Response:
        return await self._guard(request, "/v1/chat/completions", self._chat)

    async def completions(self, request: Request) -> Response:
        return await self._guard(request, "/v1/completions", self._completions)

    async def _guard(
        self,
        request: Request,
        endpoint: str,
        handler: Callable[[Request], Awaitable[Response]],
    ) -> Response:
        """Auth, then the handler; a refusal becomes its 4xx. Counts the response."""
        try:
            self._auth(request)
            response = await handler(request)
        except OpenAIError as e:
            response = _error_response(e)
        self.engine.metrics.http(endpoint, response.status_code)
        return response

    def _auth(self, request: Request) -> None:
        if self.api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            token.strip().encode(), self.api_key.encode()
        ):
            raise OpenAIError(
                401,
                "Incorrect or missing API key: send 'Authorization: Bearer <key>'",
                code="invalid_api_key",
            )

    def _check_model(self, name: str | None) -> None:
        if name is not None and name != self.engine.model_name:
            raise OpenAIError(
                404,
                f"The model `{name}` does not exist; this server serves `{self.engine.model_name}`",
                param="model",
                code="model_not_found",
            )

    async def _body(self, request: Request) -> bytes:
        size = request.headers.get("content-length")
        if size is not None and size.isdigit() and int(size) > MAX_BODY_BYTES:
            raise OpenAIError(413, f"the body is over {MAX_BODY_BYTES} bytes")
        chunks: list[bytes] = []
        total = 0
        async for chunk in request.stream():
            total += len(chunk)
            if total > MAX_BODY_BYTES:
                raise OpenAIError(413, f"the body is over {MAX_BODY_BYTES} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    # -- completions -----------------------------------------------------------------------
    async def _chat(self, request: Request) -> Response:
        try:
            req = ChatCompletionRequest.model_validate_json(await self._body(request))
        except ValidationError as e:
            raise validation_error(e) from None
        self._check_model(req.model)
        messages = [m.model_dump(exclude_none=True) for m in req.messages]
        try:
            text = render_chat(
                self.engine.loaded.chat_template,
                messages,
                bos_token=self.bos,
                eos_token=self.eos,
                add_generation_prompt=req.add_generation_prompt,
            )
        except ConfigError as e:
            raise OpenAIError(400, str(e), param="messages") from None
        prompts = [self.engine.encode_text(text)]
        return await self._run(request, req, prompts, chat=True, param="messages")

    async def _completions(self, request: Request) -> Response:
        try:
            req = CompletionRequest.model_validate_json(await self._body(request))
        except ValidationError as e:
            raise validation_error(e) from None
        self._check_model(req.model)
        vocab = self.engine.model.vocab_size
        prompts: list[list[int]] = []
        for p in req.prompts():
            ids = self.engine.encode_text(p) if isinstance(p, str) else p
            if not ids:
                raise OpenAIError(400, "prompt: a prompt needs at least one token", param="prompt")
            if min(ids) < 0 or max(ids) >= vocab:
                raise OpenAIError(400, f"prompt: token ids must be in [0, {vocab})", param="prompt")
            prompts.append(ids)
        return await self._run(request, req, prompts, chat=False, param="prompt")

    def _constraint(self, req: ChatCompletionRequest | CompletionRequest) -> tuple[Any, str]:
        rf = req.response_format
        if rf is not None and rf.type == "json_object":
            return ConstraintSpec("json_schema", {"type": "object"}), "response_format"
        if rf is not None and rf.type == "json_schema":
            assert rf.json_schema is not None
            js = rf.json_schema
            spec = ConstraintSpec("json_schema", js.schema_, strict=bool(js.strict))
            return spec, "response_format.json_schema.schema"
        for kind in ("regex", "gbnf", "lark"):
            src = getattr(req, kind)
            if src is not None:
                return ConstraintSpec(kind, src), kind
        return None, ""

    async def _run(
        self,
        request: Request,
        req: ChatCompletionRequest | CompletionRequest,
        prompts: list[list[int]],
        *,
        chat: bool,
        param: str,
    ) -> Response:
        engine = self.engine
        spec, spec_param = self._constraint(req)
        if spec is not None:
            try:  # compiled off the event loop (a large schema takes a while); then cached
                await anyio.to_thread.run_sync(engine.compile, spec)
            except SpecdecError as e:
                raise OpenAIError(400, str(e), param=spec_param, code="invalid_grammar") from None
        vocab = engine.model.vocab_size
        stop_ids = req.stop_token_ids or []
        if any(not 0 <= t < vocab for t in stop_ids):
            raise OpenAIError(
                400, f"stop_token_ids: ids must be in [0, {vocab})", param="stop_token_ids"
            )
        limit = req.token_limit
        for ids in prompts:
            room = engine.generator.max_new_tokens_for(len(ids))
            want = limit if limit is not None else max(room, 1)
            if want > room:
                raise OpenAIError(
                    400,
                    f"This model's maximum context length is {engine.max_positions} tokens "
                    f"and the KV pool holds {room + len(ids)} for one request; the request "
                    f"has {len(ids)} prompt tokens and asks for {want} more",
                    param=param if room == 0 else "max_tokens",
                    code="context_length_exceeded",
                )
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[int, RequestOutput]] = asyncio.Queue()
        choices: list[_Choice] = []
        batch: list[tuple[EngineRequest, Callable[[RequestOutput], None]]] = []
        for p, ids in enumerate(prompts):
            for j in range(req.n):
                c = _Choice(len(choices), p, TextStream(engine.tokenizer, req.stop_strings))
                choices.append(c)
                seed = None if req.seed is None else (req.seed + j) % 2**64
                er = EngineRequest(
                    ids,
                    limit if limit is not None else engine.generator.max_new_tokens_for(len(ids)),
                    temperature=req.temperature,
                    top_p=req.top_p,
                    top_k=max(req.top_k, 0),
                    seed=seed,
                    stop_token_ids=stop_ids,
                    ignore_eos=req.ignore_eos,
                    constraint=spec,
                    cache_salt=req.cache_salt,
                )

                def sink(o: RequestOutput, i: int = c.index) -> None:
                    loop.call_soon_threadsafe(queue.put_nowait, (i, o))

                batch.append((er, sink))
        if len(batch) > engine.config.max_queue:
            raise OpenAIError(
                400,
                f"n: {len(batch)} completions in one request, more than the server queues "
                f"(--max-queue {engine.config.max_queue})",
                param="n",
            )
        try:
            rids = engine.submit_all(batch, endpoint="chat" if chat else "completions")
        except BaseException as e:
            raise self._refusal(e, param) from None
        for c, rid in zip(choices, rids, strict=True):
            c.rid = rid
        call = _Call(self, req, prompts, choices, queue, chat)
        if req.stream:
            return StreamingResponse(
                call.stream(request), media_type="text/event-stream", headers=_NO_CACHE
            )
        return JSONResponse(await call.complete(request))

    @staticmethod
    def _refusal(e: BaseException, param: str) -> OpenAIError:
        if isinstance(e, QueueFull):
            return OpenAIError(
                429, str(e), type="rate_limit_exceeded", code="queue_full",
                headers={"Retry-After": "1"},
            )  # fmt: skip
        if isinstance(e, ShuttingDown):
            return OpenAIError(503, str(e), type="server_error", code="shutting_down")
        if isinstance(e, (VerifyError, KVCacheError)):
            return OpenAIError(400, str(e), param=param, code="context_length_exceeded")
        if isinstance(e, GrammarError):
            return OpenAIError(400, str(e), code="invalid_grammar")
        if isinstance(e, SpecdecError):
            return OpenAIError(400, str(e))
        raise e


_NO_CACHE = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

_FINISH = {"stop": "stop", "length": "length", "context": "length", "cancelled": "stop"}


class _Call:
    """One HTTP request's completions: gathers or streams them, and cancels them when the
    client goes away."""

    def __init__(
        self,
        server: _Server,
        req: ChatCompletionRequest | CompletionRequest,
        prompts: list[list[int]],
        choices: list[_Choice],
        queue: asyncio.Queue[tuple[int, RequestOutput]],
        chat: bool,
    ) -> None:
        self.engine = server.engine
        self.req = req
        self.prompts = prompts
        self.choices = choices
        self.queue = queue
        self.chat = chat
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.model = self.engine.model_name

    def cancel_all(self) -> None:
        for c in self.choices:
            if c.result is None:
                self.engine.cancel(c.rid)

    @contextlib.asynccontextmanager
    async def _watch(self, request: Request) -> AsyncIterator[None]:
        """Cancels the engine requests as soon as the client disconnects."""

        async def watch() -> None:
            while True:
                msg = await request.receive()
                if msg["type"] == "http.disconnect":
                    self.cancel_all()
                    return

        task = asyncio.ensure_future(watch())
        try:
            yield
        finally:
            task.cancel()
            self.cancel_all()  # a no-op for the requests that ended

    def _take(self, index: int, o: RequestOutput) -> str:
        """Apply one engine output to its choice; the new text to send."""
        c = self.choices[index]
        text = "" if c.done else c.text.push(o.new_tokens)
        if not c.done and c.text.stopped is not None:
            c.done, c.finish_reason = True, "stop"
            self.engine.cancel(c.rid)
        if o.finished:
            c.result = o.result
            if not c.done:
                text += c.text.flush()
                c.done = True
                res = o.result
                if res is None:
                    c.error = OpenAIError(
                        500, "the engine stopped", type="server_error", code="engine_failed"
                    )
                elif res.finish_reason == "error":
                    c.error = OpenAIError(
                        400, f"generation failed: {res.error}", code="generation_failed"
                    )
                else:
                    c.finish_reason = _FINISH.get(res.finish_reason or "", "stop")
        c.pieces.append(text)
        return text

    def usage(self) -> dict[str, Any]:
        prompt = sum(len(p) for p in self.prompts)
        completion = sum(c.text.tokens for c in self.choices)
        results = [c.result for c in self.choices if c.result is not None]
        first = {c.prompt: c.result for c in reversed(self.choices) if c.result is not None}
        steps = sum(r.steps for r in results)
        accepted = sum(sum(r.accepted) for r in results)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": sum(r.prefix_hit for r in first.values())},
            "speculative": {
                "steps": steps,
                "drafted_tokens": sum(sum(r.tree_sizes) for r in results),
                "accepted_tokens": accepted,
                "acceptance_length": round((accepted + steps) / steps, 4) if steps else 0.0,
            },
        }

    async def complete(self, request: Request) -> dict[str, Any]:
        async with self._watch(request):
            while any(c.result is None for c in self.choices):
                index, o = await self.queue.get()
                self._take(index, o)
        for c in self.choices:
            if c.error is not None:
                raise c.error
        if self.chat:
            out = [
                {
                    "index": c.index,
                    "message": {"role": "assistant", "content": "".join(c.pieces)},
                    "logprobs": None,
                    "finish_reason": c.finish_reason,
                }
                for c in self.choices
            ]
            kind = "chat.completion"
        else:
            out = [
                {
                    "index": c.index,
                    "text": "".join(c.pieces),
                    "logprobs": None,
                    "finish_reason": c.finish_reason,
                }
                for c in self.choices
            ]
            kind = "text_completion"
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "choices": out,
            "usage": self.usage(),
        }

    def _chunk(self, index: int, text: str | None, finish: str | None) -> dict[str, Any]:
        if self.chat:
            delta: dict[str, Any] = {} if text is None else {"content": text}
            choice: dict[str, Any] = {"index": index, "delta": delta}
            kind = "chat.completion.chunk"
        else:
            choice = {"index": index, "text": text or ""}
            kind = "text_completion"
        choice["logprobs"] = None
        choice["finish_reason"] = finish
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        }

    async def stream(self, request: Request) -> AsyncIterator[str]:
        async with self._watch(request):
            if self.chat:
                for c in self.choices:
                    first = self._chunk(c.index, "", None)
                    first["choices"][0]["delta"] = {"role": "assistant", "content": ""}
                    yield _sse(first)
            while any(c.result is None for c in self.choices):
                index, o = await self.queue.get()
                c = self.choices[index]
                was_done = c.done
                text = self._take(index, o)
                if text:
                    yield _sse(self._chunk(index, text, None))
                if c.error is not None and not was_done:
                    yield _sse(c.error.body())
                elif c.done and not was_done:
                    yield _sse(self._chunk(index, None, c.finish_reason))
            if self.req.include_usage:
                yield _sse(
                    {
                        "id": self.id,
                        "object": "chat.completion.chunk" if self.chat else "text_completion",
                        "created": self.created,
                        "model": self.model,
                        "choices": [],
                        "usage": self.usage(),
                    }
                )
            yield "data: [DONE]\n\n"


async def _not_found(request: Request, exc: Exception) -> Response:
    status = exc.status_code if isinstance(exc, HTTPException) else 404
    detail = exc.detail if isinstance(exc, HTTPException) else "not found"
    e = OpenAIError(status, f"{request.method} {request.url.path}: {detail}", code=str(status))
    return _error_response(e)


async def _server_error(request: Request, exc: Exception) -> Response:
    e = OpenAIError(500, f"internal error: {type(exc).__name__}: {exc}", type="server_error")
    return _error_response(e)


def create_app(engine: Engine, *, api_key: str | None = None, grace: float = 30.0) -> Starlette:
    """The ASGI app over ``engine``. Its lifespan starts the engine (loads nothing: the
    engine holds the model) and shuts it down: requests in flight get ``grace`` seconds to
    finish, then are cancelled. ``api_key``: every ``/v1`` route needs ``Authorization:
    Bearer <api_key>`` (``/health`` and ``/metrics`` stay open)."""
    server = _Server(engine, api_key)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if not engine.ready:
            await anyio.to_thread.run_sync(engine.start)
        yield
        await anyio.to_thread.run_sync(lambda: engine.shutdown(grace))

    routes = [
        Route("/health", server.health, methods=["GET"]),
        Route("/metrics", server.metrics, methods=["GET"]),
        Route("/v1/models", server.models, methods=["GET"]),
        Route("/v1/models/{model:path}", server.models, methods=["GET"]),
        Route("/v1/chat/completions", server.chat, methods=["POST"]),
        Route("/v1/completions", server.completions, methods=["POST"]),
    ]
    return Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={HTTPException: _not_found, Exception: _server_error},
    )
