# The README's two commands: `make demo` (the main job on the embedded default) and `make test`.
# Both create .venv on first use; nothing here downloads models or data at run time.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo gsm8k test test-slow lint bench clean-venv

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

clean-venv:
	rm -rf $(VENV)
