"""The OpenAI request bodies the server accepts, as pydantic models, and the error every
refusal becomes (``{"error": {"message", "type", "param", "code"}}``).

Unknown fields are refused, not ignored, and so are OpenAI fields this server does not
implement when they ask for something (``logprobs: true``, a non-zero penalty...): a client
never gets a reply that silently ignored part of its request."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

__all__ = [
    "ChatCompletionRequest",
    "CompletionRequest",
    "OpenAIError",
    "validation_error",
]


class OpenAIError(Exception):
    """A refused request: its HTTP status and OpenAI's error body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


_TYPE_TAGS = {"str", "int", "float", "bool", "dict", "list"}


def _param(loc: tuple[int | str, ...]) -> str:
    """A pydantic location as OpenAI writes a param (``messages[0].role``), without the
    union members pydantic names."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part not in _TYPE_TAGS and "[" not in part and not part.startswith("function-"):
            out += f".{part}" if out else part
    return out


def validation_error(e: ValidationError) -> OpenAIError:
    """The first of pydantic's complaints as a 400, naming the field."""
    errs = e.errors()
    first = errs[0]
    param = _param(tuple(first["loc"]))
    msg = first["msg"].removeprefix("Value error, ")
    if param == "prompt" or param.startswith("prompt["):
        return OpenAIError(
            400,
            "prompt: must be a string, a list of token ids, or a list of either",
            param="prompt",
        )
    if not param:  # a check of the whole body names its field first ("stop: ...")
        head = msg.split(":", 1)[0]
        param = head if head.isidentifier() else ""
        return OpenAIError(400, msg, param=param or None)
    more = f" (and {len(errs) - 1} more)" if len(errs) > 1 else ""
    return OpenAIError(400, f"{param}: {msg}{more}", param=param)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class JsonSchemaSpec(_Strict):
    name: str = Field(default="response", max_length=64)
    description: str | None = None
    schema_: dict[str, Any] | bool = Field(default=True, alias="schema")
    strict: bool | None = None

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("type 'json_schema' needs a 'json_schema' object with a 'schema'")
        if self.type != "json_schema" and self.json_schema is not None:
            raise ValueError(f"'json_schema' is only for type 'json_schema', not {self.type!r}")
        return self


class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class _Sampling(_Strict):
    """The fields chat and text completions share."""

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=-1)
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**64)
    n: int = Field(default=1, ge=1, le=16)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None
    regex: str | None = None
    gbnf: str | None = None
    lark: str | None = None
    cache_salt: str | None = Field(default=None, min_length=1, max_length=256)
    user: str | None = None
    # OpenAI fields that are accepted only when they ask for nothing.
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    logprobs: bool | int | None = None
    top_logprobs: int | None = None

    @model_validator(mode="after")
    def _checks(self) -> _Sampling:
        stops = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        if len(stops) > 16:
            raise ValueError(f"stop: at most 16 strings, got {len(stops)}")
        if any(not s for s in stops):
            raise ValueError("stop: strings must not be empty")
        for name in ("frequency_penalty", "presence_penalty"):
            if getattr(self, name) not in (None, 0, 0.0):
                raise ValueError(f"{name}: penalties are not supported (0 or omit it)")
        if self.logit_bias:
            raise ValueError("logit_bias: not supported")
        if self.logprobs not in (None, False, 0) or self.top_logprobs not in (None, 0):
            raise ValueError("logprobs: not supported")
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options: only allowed with stream: true")
        grammars = [
            g
            for g, on in (
                ("response_format", self.response_format is not None
                 and self.response_format.type != "text"),
                ("regex", self.regex is not None),
                ("gbnf", self.gbnf is not None),
                ("lark", self.lark is not None),
            )
            if on
        ]  # fmt: skip
        if len(grammars) > 1:
            raise ValueError(f"one constraint per request, got {', '.join(grammars)}")
        return self

    @property
    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class ContentPart(_Strict):
    type: str
    text: str | None = None
    model_config = ConfigDict(extra="allow", strict=True)


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None
    model_config = ConfigDict(extra="forbid", strict=True)


class ChatCompletionRequest(_Sampling):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    add_generation_prompt: bool = True
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None

    @model_validator(mode="after")
    def _chat_checks(self) -> ChatCompletionRequest:
        if self.tools or self.tool_choice not in (None, "none"):
            raise ValueError("tools: not supported")
        if self.max_tokens is not None and self.max_completion_tokens is not None:
            if self.max_tokens != self.max_completion_tokens:
                raise ValueError("max_tokens: max_completion_tokens says otherwise; give one")
        return self

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(_Sampling):
    """``POST /v1/completions``: ``prompt`` is text, token ids, or a list of either."""

    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    @model_validator(mode="after")
    def _completion_checks(self) -> CompletionRequest:
        if self.echo:
            raise ValueError("echo: not supported")
        if self.suffix:
            raise ValueError("suffix: not supported")
        if self.best_of not in (None, self.n):
            raise ValueError("best_of: not supported (omit it or set it to n)")
        if isinstance(self.prompt, list) and not self.prompt:
            raise ValueError("prompt: at least one prompt")
        return self

    @property
    def token_limit(self) -> int | None:
        return self.max_tokens

    def prompts(self) -> list[str | list[int]]:
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if all(isinstance(x, int) for x in p):
            return [list(p)]  # type: ignore[arg-type]
        return list(p)  # type: ignore[arg-type]
