#!/usr/bin/env bash
# The reward figures in the README: throughput against verl's math_dapo and agreement on the grader cases.
#     docs/results/reward/run.sh            # ~1 minute; writes throughput.txt and grader_agreement.txt here
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=docs/results/reward
cpu() { .venv/bin/python -c "import os; from dapo_suite.core.provenance import cpu_description as d; \
l = os.getloadavg(); print(f'CPU: {d()}; load average {l[0]:.2f} {l[1]:.2f} {l[2]:.2f}')"; }
{ cpu; .venv/bin/python benchmarks/reward_throughput.py --count 20000; cpu; } > "$out/throughput.txt"
{ cpu; .venv/bin/python benchmarks/grader_agreement.py; } > "$out/grader_agreement.txt"
