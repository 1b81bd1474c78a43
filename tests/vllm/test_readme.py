"""The README's vLLM example runs as written (in a scratch directory: it writes the model
there)."""

from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_readme_vllm_example_runs(tmp_path: Path) -> None:
    text = (ROOT / "README.md").read_text()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, flags=re.S) if "from vllm" in b]
    assert blocks
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        for block in blocks:
            namespace: dict[str, object] = {}
            exec(compile(block, "README.md", "exec"), namespace)  # noqa: S102
            for llm in ("fast", "llm"):
                if llm in namespace:
                    namespace[llm].llm_engine.engine_core.shutdown()  # type: ignore[attr-defined]
    finally:
        os.chdir(cwd)
    assert (tmp_path / "smollm2-hf" / "config.json").exists()
