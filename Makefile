# make demo: install everything and run the demo on simulated GPUs (a private bus).
# make test: install everything and run the whole test suite. As root it includes the
#   multi-user tests (tests/system: real polkitd, test users, the daemon as `resourced`);
#   anyone else sees them skipped, with the reason.
# make test-system: only those.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test test-system bench setup clean

demo: setup
	$(BIN)/gpuctl demo

test: setup
	$(BIN)/python -m pytest

test-system: setup
	$(BIN)/python -m pytest tests/system

bench: setup
	$(BIN)/python benchmarks/claim_roundtrip.py
	$(BIN)/python benchmarks/cli_startup.py

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml scripts/system-deps.sh
	./scripts/system-deps.sh
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,mcp,tui]'
	touch $@

clean:
	rm -rf $(VENV) build *.egg-info
