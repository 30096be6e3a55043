# Developer and CI entry points. `make test` works on a fresh machine with python3, make and pip
# (and apt as root, for etcd); see .ci/run.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv etcd lint test demo protos

venv: $(STAMP)

# Re-install whenever pyproject.toml changes; the stamp records the last successful install.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install -e '.[dev]'
	touch $@

etcd: venv
	bash scripts/install-etcd.sh $(VENV)

lint: venv
	$(BIN)/ruff check
	$(BIN)/ruff format --check
	$(BIN)/mypy

test: venv etcd lint
	$(BIN)/pytest -q

demo: venv etcd
	$(BIN)/coordinator demo

# protoc looks up its mypy plugins (protoc-gen-mypy*) on PATH.
protos: venv
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python scripts/gen_protos.py
