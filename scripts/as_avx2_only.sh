#!/usr/bin/env bash
# Run a command as on an AVX2-only CPU (no AVX-512, no AMX, so no native bf16), on a newer x86 machine, as root:
# /proc/cpuinfo without those flags is bind-mounted over the real one in a mount namespace of the command's own,
# torch's kernels and oneDNN are held to AVX2, and the sampler's kernels are built for x86-64-v3. It measures what
# the instruction set costs, not an older core's clock and memory (docs/architecture.md, "CI").
#   sudo scripts/as_avx2_only.sh make test-default
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: $0 COMMAND [ARG...]" >&2; exit 2; }
filtered=$(mktemp "${TMPDIR:-/tmp}/cpuinfo-avx2.XXXX")
sed 's/ avx512[a-z0-9_]*//g; s/ amx[a-z0-9_]*//g' /proc/cpuinfo > "$filtered"
export ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 DAPO_SUITE_KERNEL_ARCH=x86-64-v3
exec unshare -m bash -c 'mount --bind "$0" /proc/cpuinfo && exec "$@"' "$filtered" "$@"
