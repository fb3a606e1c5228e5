#!/usr/bin/env bash
# llama.cpp for this CPU, the peer of benchmarks/vs_llamacpp.py: the llama.cpp tree vendored in the
# llama-cpp-python sdist on PyPI (CPU only, -march=native), built into $1 (default .llamacpp). Only the package
# registry is needed; a rerun with the tools in place does nothing.
#   bash scripts/llamacpp.sh [DIR]     -> DIR/bin/llama-batched-bench, llama-bench, llama-quantize (Q4_0 files),
#                                         DIR/src (the tree)
set -euo pipefail
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
DIR="${1:-.llamacpp}"
PIP="${PIP:-.venv/bin/pip}"
# llama.cpp's convert_hf_to_gguf.py (benchmarks/vs_llamacpp.py runs it in this venv) imports sentencepiece
"$(dirname "$PIP")/python" -c "import sentencepiece" 2>/dev/null || "$PIP" install -q sentencepiece
TOOLS=(llama-batched-bench llama-bench llama-quantize)
if [ -x "$DIR/bin/llama-batched-bench" ] && [ -x "$DIR/bin/llama-bench" ] && [ -x "$DIR/bin/llama-quantize" ]; then
  echo "llama.cpp: $DIR/bin is built"; exit 0
fi
mkdir -p "$DIR"
if [ ! -f "$DIR/src/CMakeLists.txt" ]; then
  # the sdist only (`--no-binary :all:` would build its build dependencies from source too, recursively)
  "$PIP" download "llama-cpp-python==$VERSION" --no-deps --no-binary llama-cpp-python -d "$DIR" -q
  tar xzf "$DIR/llama_cpp_python-$VERSION.tar.gz" -C "$DIR"
  rm -rf "$DIR/src"
  mv "$DIR/llama_cpp_python-$VERSION/vendor/llama.cpp" "$DIR/src"
  rm -rf "$DIR/llama_cpp_python-$VERSION" "$DIR/llama_cpp_python-$VERSION.tar.gz"
fi
GENERATOR=()
command -v ninja >/dev/null && GENERATOR=(-G Ninja)
cmake -S "$DIR/src" -B "$DIR/build" "${GENERATOR[@]}" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
  -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=OFF >/dev/null
cmake --build "$DIR/build" --target "${TOOLS[@]}" -j "${JOBS:-$(nproc)}"
mkdir -p "$DIR/bin"
for tool in "${TOOLS[@]}"; do cp "$DIR/build/bin/$tool" "$DIR/bin/"; done
echo "llama.cpp: built $DIR/bin (llama-cpp-python $VERSION's vendored tree, -march=native)"
