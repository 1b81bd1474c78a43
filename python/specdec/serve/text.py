"""From token ids to the text a client sees: incremental detokenization that only ever
emits whole UTF-8 characters, stop strings (which may span tokens) found before any of
their text is sent, and chat messages rendered with the model's own template."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

from ..errors import ConfigError

__all__ = ["TextStream", "render_chat"]


class TextStream:
    """One completion's text, fed token by token. :meth:`push` returns the text that can
    be sent now: whole characters only (a character whose bytes span tokens waits for its
    last byte), and never the start of a possible stop string (it waits until it is known
    not to be one). When a stop string appears, the text ends just before it, ``stopped``
    is set and ``tokens`` counts the tokens up to the one that completed it."""

    def __init__(
        self, tokenizer: Tokenizer, stop: Sequence[str] = (), *, skip_special_tokens: bool = True
    ) -> None:
        self._tok = tokenizer
        self._stream = DecodeStream(skip_special_tokens=skip_special_tokens)
        self._stop = [s for s in stop if s]
        self._held = ""
        self.text = ""  # everything returned so far
        self.tokens = 0
        self.stopped: str | None = None  # the stop string that ended the text

    def push(self, tokens: Sequence[int]) -> str:
        out: list[str] = []
        for t in tokens:
            if self.stopped is not None:
                break
            self.tokens += 1
            piece = self._stream.step(self._tok, int(t))
            if piece:
                out.append(self._add(piece))
        s = "".join(out)
        self.text += s
        return s

    def _add(self, piece: str) -> str:
        held = self._held + piece
        if not self._stop:
            self._held = ""
            return held
        cut = min((i for i in (held.find(s) for s in self._stop) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = next(s for s in self._stop if held.find(s) == cut)
            self._held = ""
            return held[:cut]
        keep = 0  # the longest tail of held text that begins some stop string
        for s in self._stop:
            for k in range(min(len(s) - 1, len(held)), keep, -1):
                if held.endswith(s[:k]):
                    keep = k
                    break
        self._held = held[len(held) - keep :]
        return held[: len(held) - keep]

    def flush(self) -> str:
        """At the end of the completion: text held back for a stop string that never
        came."""
        s = "" if self.stopped is not None else self._held
        self._held = ""
        self.text += s
        return s


def _content(i: int, content: Any) -> str:
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    parts: list[str] = []
    for part in content:
        if part.get("type") != "text":
            raise ConfigError(
                f"messages[{i}].content: only text parts are supported, got type "
                f"{part.get('type')!r}"
            )
        parts.append(str(part.get("text", "")))
    return "".join(parts)


def _raise_exception(message: str) -> None:
    raise ConfigError(f"the chat template refused the messages: {message}")


@functools.lru_cache(maxsize=8)
def _compiled(template: str) -> Any:
    """``template`` compiled in a sandbox, once per template (compiling takes ~1.5 ms, far
    more than rendering a chat)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise_exception
    return env.from_string(template)


def render_chat(
    template: str | None,
    messages: Sequence[Mapping[str, Any]],
    *,
    bos_token: str = "",
    eos_token: str = "",
    add_generation_prompt: bool = True,
) -> str:
    """``messages`` (OpenAI's ``{"role", "content"}``, content a string or text parts)
    through the model's Jinja chat template, in a sandbox; ChatML when the model has none.
    A template that fails raises :class:`~specdec.errors.ConfigError`."""
    msgs = [
        {"role": m["role"], "content": _content(i, m.get("content"))}
        for i, m in enumerate(messages)
    ]
    if template is None:
        from ..models.gguf import chatml

        return chatml(msgs, add_generation_prompt=add_generation_prompt)
    import jinja2

    try:
        text: str = _compiled(template).render(
            messages=msgs,
            bos_token=bos_token,
            eos_token=eos_token,
            add_generation_prompt=add_generation_prompt,
        )
        return text
    except jinja2.TemplateError as e:
        raise ConfigError(f"the chat template failed: {e}") from None
