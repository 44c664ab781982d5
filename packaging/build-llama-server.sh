#!/usr/bin/env bash
# Build llama.cpp's llama-server and its RPC worker (ggml-rpc-server, for a replica
# spanning nodes) for the CPU from the llama-cpp-python sdist on PyPI (it
# vendors llama.cpp), cache it outside the clone keyed by that version, print its path.
#
#   packaging/build-llama-server.sh [PIP]
#
# The tests use this binary as a real engine; it is packaged by the tests as a release
# archive and installed through the agent's own install path.
set -euo pipefail

VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
CACHE="${LLMGW_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/llmgw}/llama-server-$VERSION"
PIP="${1:-pip}"
BIN="$CACHE/llama-server"
RPC="$CACHE/ggml-rpc-server"

# Both from one build: the RPC protocol refuses a worker of another version. A cache
# holding llama-server alone (from before the worker was built) is built again.
if [ -x "$BIN" ] && [ -x "$RPC" ] && "$BIN" --version >/dev/null 2>&1; then
  echo "$BIN"
  exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "building llama-server from llama-cpp-python $VERSION (a few minutes on 2 cores)" >&2
"$PIP" download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$work" >&2
tar -xzf "$work"/llama_cpp_python-"$VERSION".tar.gz -C "$work"
src="$work/llama_cpp_python-$VERSION/vendor/llama.cpp"
# -O1: a fraction of -O2's build time, fast enough for tests on a tiny model. The
# prebuilt web UI would be downloaded; it is switched off.
cmake -S "$src" -B "$work/build" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_C_FLAGS_RELEASE="-O1 -DNDEBUG" -DCMAKE_CXX_FLAGS_RELEASE="-O1 -DNDEBUG" \
  -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TOOLS=ON \
  -DLLAMA_BUILD_SERVER=ON -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF \
  -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DGGML_RPC=ON \
  >&2
cmake --build "$work/build" --target llama-server ggml-rpc-server -j"$(nproc)" >&2
mkdir -p "$CACHE"
cp "$work/build/bin/ggml-rpc-server" "$RPC.tmp"
mv "$RPC.tmp" "$RPC"
cp "$work/build/bin/llama-server" "$BIN.tmp"
mv "$BIN.tmp" "$BIN"
"$BIN" --version >&2
echo "$BIN"
