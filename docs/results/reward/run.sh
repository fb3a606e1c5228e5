#!/usr/bin/env bash
# The reward figures in the README: throughput against verl's math_dapo and agreement on the grader cases.
#     docs/results/reward/run.sh            # writes throughput.txt and grader_agreement.txt here
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=docs/results/reward
# each benchmark writes the CPU and the load into its output (dapo_suite.core.provenance.cpu_line)
taskset -c "$(($(nproc) - 1))" .venv/bin/python -m benchmarks.reward_throughput --count 20000 --repeats 5 > "$out/throughput.txt"
.venv/bin/python -m benchmarks.grader_agreement > "$out/grader_agreement.txt"
