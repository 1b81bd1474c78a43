"""Every ``benches/*.py`` runs end to end at tiny sizes (``--smoke``), so a bench that no longer
runs against the package fails the suite. Output is checked for a markdown table only: no
timings are asserted (machines are noisy)."""

import importlib.util
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
BENCHES = sorted(p.name for p in (ROOT / "benches").glob("bench_*.py"))


def test_benches_found():
    assert len(BENCHES) >= 4, BENCHES


@pytest.mark.parametrize("name", BENCHES)
def test_bench_smoke(name: str) -> None:
    vllm = importlib.util.find_spec("vllm")
    if name == "bench_vllm.py" and (vllm is None or vllm.origin is None):  # tests/vllm/ is none
        pytest.skip("needs vLLM, which lives in its own venv (make test-vllm)")
    proc = subprocess.run(
        [sys.executable, f"benches/{name}", "--smoke"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{name} --smoke exited {proc.returncode}:\n{out[-4000:]}"
    assert any("|" in line for line in proc.stdout.splitlines()), f"no result table:\n{out}"
