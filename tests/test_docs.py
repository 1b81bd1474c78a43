"""The docs site's guide pages run as written: each page's Python blocks in order, sharing
one namespace per page. Blocks that need a running server (a client with ``base_url=``) run
in tests/test_serve.py against one; blocks that need vLLM run in tests/vllm/test_readme.py.
``mkdocs build --strict`` (in ``make lint``) checks the site itself."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "docs" / "guide").glob("*.md")) + [ROOT / "docs" / "index.md"]


def python_blocks(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)


def needs_elsewhere(block: str) -> bool:
    return "base_url=" in block or "from vllm" in block


def test_every_guide_page_is_there() -> None:
    names = {p.stem for p in PAGES}
    assert {
        "generation",
        "drafters",
        "trees",
        "verification",
        "kv-cache",
        "constraints",
        "beam-search",
        "serving",
        "vllm",
    } <= names


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem)
def test_guide_page_code_runs(page: Path, tmp_path: Path) -> None:
    blocks = [b for b in python_blocks(page) if not needs_elsewhere(b)]
    if not blocks:
        assert python_blocks(page), f"{page.name} has no Python example"
        pytest.skip("every block needs a server or vLLM (run elsewhere)")
    namespace: dict[str, object] = {"__name__": f"docs_{page.stem}"}
    cwd = os.getcwd()
    os.chdir(tmp_path)  # anything a block writes lands in a scratch directory
    try:
        for block in blocks:
            exec(compile(block, str(page.relative_to(ROOT)), "exec"), namespace)  # noqa: S102
    finally:
        os.chdir(cwd)
