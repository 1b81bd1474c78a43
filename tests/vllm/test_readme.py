"""The docs' vLLM examples (the vLLM guide page, and the README's if it has any) run as
written, in a scratch directory: they write the model there."""

from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = ["README.md", "docs/guide/vllm.md"]


def test_docs_vllm_examples_run(tmp_path: Path) -> None:
    blocks = [
        (page, b)
        for page in PAGES
        for b in re.findall(r"```python\n(.*?)```", (ROOT / page).read_text(), flags=re.S)
        if "from vllm" in b
    ]
    assert blocks
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        for page, block in blocks:
            namespace: dict[str, object] = {}
            exec(compile(block, page, "exec"), namespace)  # noqa: S102
            for llm in ("fast", "llm"):
                if llm in namespace:
                    namespace[llm].llm_engine.engine_core.shutdown()  # type: ignore[attr-defined]
    finally:
        os.chdir(cwd)
    assert (tmp_path / "smollm2-hf" / "config.json").exists()
