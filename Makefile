# make demo: install everything and run the demo on simulated GPUs (a private bus).
# make test: install everything and run the whole test suite.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test bench setup clean

demo: setup
	$(BIN)/gpuctl demo

test: setup
	$(BIN)/python -m pytest

bench: setup
	$(BIN)/python benchmarks/claim_roundtrip.py
	$(BIN)/python benchmarks/cli_startup.py

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml scripts/system-deps.sh
	./scripts/system-deps.sh
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $@

clean:
	rm -rf $(VENV) build *.egg-info
