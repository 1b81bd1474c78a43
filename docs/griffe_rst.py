"""A griffe extension for the API reference: the docstrings are written with Sphinx roles
(``:class:`~specdec.x.Y```) and ``::`` literal blocks; Markdown shows roles as inline code
(the last component after ``~``) and literal blocks as fenced code."""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|attr|mod|data|exc|obj|const|ref):`([^`]+)`")


def _role(m: re.Match[str]) -> str:
    text = m.group(1).lstrip("!")
    if "<" in text and text.endswith(">"):  # `title <target>`
        return f"`{text.split('<', 1)[0].strip()}`"
    if text.startswith("~"):
        text = text[1:].rsplit(".", 1)[-1]
    return f"`{text.lstrip('.')}`"


def _literal_blocks(text: str) -> str:
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        out.append(line)
        i += 1
        if not line.rstrip().endswith("::"):
            continue
        out[-1] = line.rstrip()[:-1]  # "stage::" -> "stage:"
        block: list[str] = []
        while i < len(lines) and (not lines[i].strip() or lines[i].startswith((" ", "\t"))):
            block.append(lines[i])
            i += 1
        while block and not block[-1].strip():
            block.pop()
        body = [b for b in block if b.strip()]
        indent = min((len(b) - len(b.lstrip()) for b in body), default=0)
        out += ["", "```"] + [b[indent:] for b in block if b.strip() or b is not block[0]]
        out += ["```", ""]
    return "\n".join(out)


class RstRoles(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            value = _ROLE.sub(_role, obj.docstring.value)
            obj.docstring.value = _literal_blocks(value)
