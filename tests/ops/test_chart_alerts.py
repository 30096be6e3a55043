"""The chart's alerts on stuck queues, the archive and pruner, and the RPC error rate: the exact
PromQL each renders (its thresholds from values.yaml, the prune threshold from config.retention),
label values that are real (gRPC status codes, WorkerService methods), and a runbook entry in
docs/operations.md for each. That every metric an alert reads is one a replica exports, and
that it selects the release's series, is checked for every alert in tests/ops/test_helm_chart.py.

Skipped when helm is missing (scripts/install-helm.sh installs it into .tools/bin; CI does).
"""

from __future__ import annotations

import re
from pathlib import Path

import grpc
import pytest
import yaml

from coordinator.server.status import STATUS_CODES
from coordinator.v1 import worker_pb2
from tests.ops.test_helm_chart import HELM, ROOT, Manifest, _one, render

pytestmark = pytest.mark.skipif(
    HELM is None, reason="helm not installed: run scripts/install-helm.sh (CI does)"
)

SELECTOR = 'namespace="agents",service="rel-coordinator"'
ON = "metrics.prometheusRule.enabled=true"
NEW_ALERTS = (
    "CoordinatorQueueStuck",
    "CoordinatorArchiveFailing",
    "CoordinatorPruneBehind",
    "CoordinatorRpcServerErrors",
    "CoordinatorCallsRefusedByVersionGate",
)
GATED = "/coordinator.v1.WorkerService/(Claim|ClaimNext|Renew|RenewMany)"


def _rules(*sets: str) -> dict[str, Manifest]:
    rule = _one(render(None, ON, *sets), "PrometheusRule")
    return {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}


def _expr(rule: Manifest) -> str:
    """The rule's PromQL with its whitespace (folded YAML lines) collapsed."""
    return " ".join(rule["expr"].split())


def test_the_new_alerts_render_with_their_default_thresholds() -> None:
    rules = _rules()
    errors, calls = "coordinator_rpc_errors_total", "coordinator_rpc_duration_seconds_count"
    expected = {
        "CoordinatorQueueStuck": (
            f"max by (queue) (coordinator_queue_oldest_ready_age_seconds{{{SELECTOR}}}) > 900",
            "5m",
        ),
        "CoordinatorArchiveFailing": (
            f"sum(increase(coordinator_archive_failures_total{{{SELECTOR}}}[5m])) > 0",
            "15m",
        ),
        # 7d of retention plus 6 h.
        "CoordinatorPruneBehind": (
            f"max(coordinator_oldest_terminal_task_age_seconds{{{SELECTOR}}}) > 626400",
            "30m",
        ),
        "CoordinatorRpcServerErrors": (
            f"( sum by (method) (rate({errors}{{{SELECTOR},"
            'code=~"INTERNAL|UNKNOWN|UNAVAILABLE"}[10m])) '
            f"/ sum by (method) (rate({calls}{{{SELECTOR}}}[10m])) ) > 0.05 "
            f"and on (method) sum by (method) (rate({calls}{{{SELECTOR}}}[10m])) * 60 >= 1",
            "10m",
        ),
        "CoordinatorCallsRefusedByVersionGate": (
            f"sum by (method) (rate({errors}{{{SELECTOR},"
            f'code="FAILED_PRECONDITION",method=~"{GATED}"}}[5m])) '
            f"/ sum by (method) (rate({calls}{{{SELECTOR}}}[5m])) > 0",
            "10m",
        ),
    }
    assert {name: (_expr(rules[name]), rules[name]["for"]) for name in NEW_ALERTS} == expected


def _rules_of(values: Path, retention: str, **thresholds: object) -> dict[str, Manifest]:
    """The alerts rendered from a values file (--set would pass 0.2 or 3600 as numbers or
    strings the schema refuses) with ``retention`` and ``thresholds``."""
    values.write_text(
        yaml.safe_dump(
            {
                "image": {"repository": "registry.example/coordinator", "tag": "0.1.0"},
                "auth": {"tokenSecret": {"name": "rel-tokens"}},
                "config": {"retention": retention},
                "metrics": {"prometheusRule": {"enabled": True, **thresholds}},
            }
        )
    )
    rule = _one(render(values), "PrometheusRule")
    return {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}


def test_the_new_alerts_take_their_thresholds_from_values_and_the_retention(
    tmp_path: Path,
) -> None:
    rules = _rules_of(
        tmp_path / "thresholds-values.yaml",
        "1.5h",
        pruneLagSeconds=600,
        queueStuckSeconds=60,
        queueStuckFor="2m",
        archiveFailingFor="1h",
        rpcServerErrorRatio=0.2,
        rpcMinCallsPerMinute=30,
        versionRefusedRatio=0.1,
    )
    assert _expr(rules["CoordinatorPruneBehind"]).endswith(") > 6000")  # 5400 s + 600 s
    assert _expr(rules["CoordinatorQueueStuck"]).endswith(") > 60")
    assert rules["CoordinatorQueueStuck"]["for"] == "2m"
    assert rules["CoordinatorArchiveFailing"]["for"] == "1h"
    rpc = _expr(rules["CoordinatorRpcServerErrors"])
    assert ") > 0.2 and on (method)" in rpc and rpc.endswith("* 60 >= 30")
    assert _expr(rules["CoordinatorCallsRefusedByVersionGate"]).endswith("[5m])) > 0.1")
    # Every form of duration the server takes, plus the default 6 h of lag.
    for retention, seconds in (("3600", 3600), ("90s", 90), ("2w", 1_209_600), ("1d", 86_400)):
        values = tmp_path / f"retention-{retention}-values.yaml"
        prune = _expr(_rules_of(values, retention)["CoordinatorPruneBehind"])
        assert prune.endswith(f") > {seconds + 21_600}"), (retention, prune)


def test_the_rpc_alerts_name_real_status_codes_and_worker_methods() -> None:
    rules = _rules()
    server_side = re.search(r'code=~"([A-Z_|]+)"', rules["CoordinatorRpcServerErrors"]["expr"])
    assert server_side is not None
    codes = set(server_side[1].split("|"))
    assert codes == {"INTERNAL", "UNKNOWN", "UNAVAILABLE"}
    # Codes the server answers: its error table's, and UNKNOWN for an uncaught exception
    # (what the metrics interceptor counts then).
    answered = {code.name for code in STATUS_CODES.values()} | {grpc.StatusCode.UNKNOWN.name}
    assert codes <= answered
    gate = rules["CoordinatorCallsRefusedByVersionGate"]["expr"]
    assert 'code="FAILED_PRECONDITION"' in gate and "FAILED_PRECONDITION" in answered
    (methods,) = re.findall(r'method=~"/coordinator\.v1\.WorkerService/\(([A-Za-z|]+)\)"', gate)
    assert set(methods.split("|")) == {"Claim", "ClaimNext", "Renew", "RenewMany"}
    service = worker_pb2.DESCRIPTOR.services_by_name["WorkerService"]
    assert set(methods.split("|")) <= set(service.methods_by_name)


def test_every_new_alert_has_a_runbook_entry_in_the_operations_guide() -> None:
    operations = (ROOT / "docs" / "operations.md").read_text()
    runbook = operations.split("\n## Alerts\n", 1)[1].split("\n## ", 1)[0]
    rules = _rules()
    for name in NEW_ALERTS:
        assert f"`{name}`" in runbook, name
        assert "Runbook: docs/operations.md, Alerts." in rules[name]["annotations"]["description"]
