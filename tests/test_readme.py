"""The README's Python examples run as written (in order, sharing one namespace). The
serving section's examples need a server: tests/test_serve.py runs them against one; vLLM
examples need vLLM: tests/vllm/test_readme.py runs them."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_readme_examples_run():
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) >= 3
    namespace: dict = {}
    for block in blocks:
        if "base_url=" in block:  # a client of `specdec serve`: run in test_serve.py
            continue
        if "from vllm" in block:  # needs vLLM: run in tests/vllm/test_readme.py
            continue
        exec(compile(block, "README.md", "exec"), namespace)  # noqa: S102
    assert len(namespace["context"]) >= 48
