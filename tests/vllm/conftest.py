"""tests/vllm/: specdec.integrations.vllm inside vLLM itself (its CPU backend, the engine in
this process), run by ``make test-vllm`` in the venv tests/vllm/venv.sh makes. The main test
run does not collect this folder (pyproject's norecursedirs); without vLLM it is skipped.

The oracle throughout is vLLM itself: the same prompts through an engine without
speculation and without the logits processor."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# vLLM's CPU backend: the CPU platform, 1 GiB of KV cache, threads from OMP_NUM_THREADS (no
# pinning to cores other processes use); the engine core in this process, so the tests can
# read the proposer's and the processor's state.
for key, value in {
    "VLLM_TARGET_DEVICE": "cpu",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "OMP_NUM_THREADS": "2",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_NO_USAGE_STATS": "1",
}.items():
    os.environ.setdefault(key, value)

pytest.importorskip("vllm")

from vllm_support import close, make_llm  # noqa: E402


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from specdec.integrations.vllm import export_smollm2

    return export_smollm2(tmp_path_factory.mktemp("smollm2") / "hf")


@pytest.fixture(scope="session")
def plain(model_dir: Path) -> Iterator[Any]:
    """vLLM without speculation and without specdec: the oracle."""
    llm = make_llm(model_dir)
    yield llm
    close(llm)


@pytest.fixture(scope="session")
def demo_messages() -> list[str]:
    """The demo's prompts, every kind, padded to a batch of 8."""
    from specdec.demo_prompts import PROMPTS

    msgs = [p for kind in PROMPTS.values() for p in kind]
    return (msgs + ["List three prime numbers and say why each is prime."])[:8]
