"""The Helm chart, rendered with `helm template` for every values file in helm/coordinator/ci/
and checked for what matters in a cluster: probes on the real ports, a configuration the server
accepts, flags that exist, bundled etcd members addressed by their pod DNS names, a hardened
security context, no secret in plain text, and a termination grace longer than the drain.

Skipped when helm is missing (scripts/install-helm.sh installs it into .tools/bin; CI does).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from coordinator.cli.serve import serve
from coordinator.config import SETTINGS, Config
from coordinator.server.app import LIVENESS_SERVICE

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "coordinator"
VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
NAMESPACE = "agents"


def _helm() -> str | None:
    local = ROOT / ".tools" / "bin" / "helm"
    if local.exists():
        return str(local)
    return shutil.which("helm")


HELM = _helm()
pytestmark = pytest.mark.skipif(
    HELM is None, reason="helm not installed: run scripts/install-helm.sh (CI does)"
)

Manifest = dict[str, Any]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    assert HELM is not None
    env = {**os.environ, "HELM_CACHE_HOME": "/tmp/helm-cache", "HELM_CONFIG_HOME": "/tmp/helm"}
    return subprocess.run(
        [HELM, *args], capture_output=True, text=True, timeout=120, check=False, env=env
    )


@cache
def render(values: Path | None, *sets: str) -> list[Manifest]:
    """The manifests of release "rel" in NAMESPACE."""
    args = ["template", "rel", str(CHART), "--namespace", NAMESPACE]
    if values is not None:
        args += ["-f", str(values)]
    for item in sets:
        args += ["--set", item]
    result = _run(*args)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def _one(manifests: list[Manifest], kind: str, name: str | None = None) -> Manifest:
    found = [
        m
        for m in manifests
        if m["kind"] == kind and (name is None or m["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {len(found)}"
    return found[0]


def _config(manifests: list[Manifest]) -> dict[str, Any]:
    configmap = _one(manifests, "ConfigMap", "rel-coordinator")
    return tomllib.loads(configmap["data"]["coordinator.toml"])


def _port(address: str) -> int:
    return int(address.rpartition(":")[2])


def _containers(manifest: Manifest) -> Iterator[tuple[Manifest, Manifest]]:
    """(pod spec, container) of a workload (Deployment, StatefulSet or CronJob)."""
    spec = manifest["spec"]
    if manifest["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    pod = spec["template"]["spec"]
    for container in pod.get("initContainers", []) + pod["containers"]:
        yield pod, container


@pytest.mark.parametrize("values", VALUES, ids=lambda p: p.stem)
def test_lint_passes(values: Path) -> None:
    result = _run("lint", str(CHART), "-f", str(values), "--strict")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("values", VALUES, ids=lambda p: p.stem)
def test_the_server_accepts_the_rendered_configuration(values: Path) -> None:
    config = _config(render(values))
    assert set(config) <= set(SETTINGS), "a config key serve does not know"
    config["etcd"] = tuple(config["etcd"])
    parsed = Config(**config)  # the same validation `coordinator serve` runs
    assert parsed.insecure or parsed.token_file, "neither authentication nor explicit insecure"


@pytest.mark.parametrize("values", VALUES, ids=lambda p: p.stem)
def test_args_and_env_name_settings_that_exist(values: Path) -> None:
    flags = {opt for param in serve.params for opt in param.opts}
    deployment = _one(render(values), "Deployment")
    for _, container in _containers(deployment):
        used = [a.split("=")[0] for a in container.get("args", []) if a.startswith("--")]
        assert used and set(used) <= flags, used
        for env in container.get("env", []):
            assert env["name"].removeprefix("COORDINATOR_").lower() in SETTINGS, env["name"]


@pytest.mark.parametrize("values", VALUES, ids=lambda p: p.stem)
def test_probes_point_at_the_port_that_serves_health(values: Path) -> None:
    manifests = render(values)
    config = _config(manifests)
    deployment = _one(manifests, "Deployment")
    assert deployment["spec"]["replicas"] >= 2
    anti = deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    assert anti, "replicas must be spread over nodes"
    (_, container), *_ = _containers(deployment)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    # With TLS the kubelet (which speaks no TLS) probes the plaintext health port.
    health_address = config.get("health_listen", config["listen"])
    readiness, liveness = container["readinessProbe"]["grpc"], container["livenessProbe"]["grpc"]
    assert readiness["port"] == liveness["port"] == _port(health_address)
    assert readiness["port"] in ports.values()
    assert readiness.get("service", "") == ""  # follows etcd
    assert liveness["service"] == LIVENESS_SERVICE  # follows the process only
    assert ports["grpc"] == _port(config["listen"])
    assert ports["metrics"] == _port(config["metrics_listen"])

    service = _one(manifests, "Service", "rel-coordinator")
    targets = {p["name"]: p["targetPort"] for p in service["spec"]["ports"]}
    assert targets == {"grpc": "grpc", "metrics": "metrics"}
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    pdb = _one(manifests, "PodDisruptionBudget", "rel-coordinator")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


@pytest.mark.parametrize("values", VALUES, ids=lambda p: p.stem)
def test_graceful_termination_outlasts_the_servers_drain(values: Path) -> None:
    manifests = render(values)
    pod = _one(manifests, "Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    drain = float(pre_stop[1]) + _config(manifests)["shutdown_grace"]
    assert pod["terminationGracePeriodSeconds"] > drain


@pytest.mark.parametrize("values", VALUES, ids=lambda p: p.stem)
def test_every_workload_runs_hardened(values: Path) -> None:
    workloads = [m for m in render(values) if m["kind"] in {"Deployment", "StatefulSet", "CronJob"}]
    assert workloads
    for manifest in workloads:
        for pod, container in _containers(manifest):
            assert pod["securityContext"]["runAsNonRoot"] is True, manifest["metadata"]["name"]
            assert pod["automountServiceAccountToken"] is False
            context = container["securityContext"]
            assert context["readOnlyRootFilesystem"] is True
            assert context["allowPrivilegeEscalation"] is False
            assert context["capabilities"]["drop"] == ["ALL"]


@pytest.mark.parametrize("values", VALUES, ids=lambda p: p.stem)
def test_no_secret_is_rendered_in_plain_text(values: Path) -> None:
    manifests = render(values)
    text = yaml.safe_dump_all(manifests)
    assert not [m for m in manifests if m["kind"] == "Secret"], "the chart must only reference"
    assert "-----BEGIN" not in text
    # A sha256 is only allowed as the config checksum that rolls the pods.
    hashes = set(re.findall(r"\b[0-9a-f]{64}\b", text))
    checksums = {
        m["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
        for m in manifests
        if m["kind"] == "Deployment"
    }
    assert hashes <= checksums, "a token hash in a manifest"
    for manifest in manifests:
        if manifest["kind"] not in {"Deployment", "StatefulSet", "CronJob"}:
            continue
        for _, container in _containers(manifest):
            for env in container.get("env", []):
                if re.search("PASSWORD|TOKEN|SECRET|KEY", env["name"]):
                    assert "value" not in env and "secretKeyRef" in env["valueFrom"], env
    config = _config(manifests)
    assert not {"etcd_password", "etcd_user"} & set(config)


def test_bundled_etcd_members_are_addressed_by_their_pod_dns_names() -> None:
    manifests = render(CHART / "ci" / "bundled-etcd-values.yaml")
    sts = _one(manifests, "StatefulSet")
    name, replicas = sts["metadata"]["name"], sts["spec"]["replicas"]
    headless = _one(manifests, "Service", sts["spec"]["serviceName"])
    assert replicas == 3
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    pod_labels = sts["spec"]["template"]["metadata"]["labels"]
    assert headless["spec"]["selector"].items() <= pod_labels.items()
    members = [
        f"{name}-{i}.{headless['metadata']['name']}.{NAMESPACE}.svc.cluster.local"
        for i in range(replicas)
    ]
    assert _config(manifests)["etcd"] == [f"{m}:2379" for m in members]

    (_, etcd), *_ = _containers(sts)
    args = dict(a.removeprefix("--").split("=", 1) for a in etcd["args"])
    assert args["initial-cluster"] == ",".join(
        f"{name}-{i}=http://{m}:2380" for i, m in enumerate(members)
    )
    assert args["advertise-client-urls"] == (
        f"http://$(POD_NAME).{headless['metadata']['name']}.{NAMESPACE}.svc.cluster.local:2379"
    )
    assert args["auto-compaction-retention"] not in {"", "0"}
    assert args["auto-compaction-mode"] in {"periodic", "revision"}
    assert sts["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"]
    assert {m["mountPath"] for m in etcd["volumeMounts"]} == {"/var/lib/etcd"}
    assert args["data-dir"].startswith("/var/lib/etcd/")

    defrag = _one(manifests, "CronJob")
    (_, job), *_ = _containers(defrag)
    assert job["command"] == ["etcdctl"] and "defrag" in job["args"]
    assert f"--endpoints={','.join(f'{m}:2379' for m in members)}" in job["args"]
    assert defrag["spec"]["concurrencyPolicy"] == "Forbid"


def test_external_etcd_is_the_default() -> None:
    manifests = render(None)
    assert not [m for m in manifests if m["kind"] == "StatefulSet"]
    assert _config(manifests)["etcd"] == ["etcd:2379"]


def test_tls_mounts_the_files_the_configuration_names() -> None:
    manifests = render(CHART / "ci" / "tls-values.yaml")
    config = _config(manifests)
    pod = _one(manifests, "Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}

    def secret_of(path: str) -> str:
        directory = str(Path(path).parent)
        return secrets[mounts[directory]]

    assert secret_of(config["tls_cert"]) == secret_of(config["tls_client_ca"]) == "coordinator-tls"
    assert secret_of(config["etcd_ca_cert"]) == secret_of(config["etcd_key"]) == "etcd-client-tls"
    assert config["token_file"].startswith("/etc/coordinator/auth/")
    env = {e["name"]: e["valueFrom"]["secretKeyRef"]["name"] for e in container["env"]}
    assert env == {
        "COORDINATOR_ETCD_USER": "etcd-credentials",
        "COORDINATOR_ETCD_PASSWORD": "etcd-credentials",
    }


def test_optional_monitoring_objects() -> None:
    manifests = render(CHART / "ci" / "bundled-etcd-values.yaml")
    monitor = _one(manifests, "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    policies = {m["metadata"]["name"] for m in manifests if m["kind"] == "NetworkPolicy"}
    assert policies == {"rel-coordinator", "rel-coordinator-etcd"}
    dashboard = json.loads(
        _one(manifests, "ConfigMap", "rel-coordinator-dashboard")["data"]["coordinator.json"]
    )
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    for metric in DASHBOARD_METRICS:
        assert metric in exprs, metric


# The metric names the dashboard plots (the metrics work must export exactly these).
DASHBOARD_METRICS = (
    "coordinator_claims_total",
    "coordinator_reclaim_latency_seconds",
    "coordinator_renewals_total",
    "coordinator_fenced_commits_total",
    "coordinator_attempts_per_task",
    "coordinator_unknown_effects",
    "coordinator_wasted_compute_seconds_total",
    "coordinator_ready_to_commit_seconds",
    "coordinator_fence_validated_total",
    "coordinator_fence_accepted_total",
    "coordinator_active_leases",
    "coordinator_rpc_duration_seconds",
    "coordinator_rpc_errors_total",
)


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("replicaCount=1", "minimum: got 1, want 2"),
        ("etcd.bundled.autoCompactionRetention=0", "autoCompactionRetention"),
        ("etcd.mode=embedded", "etcd/mode"),
        ("auth.mode=none", "auth/mode"),
        ("terminationGracePeriodSeconds=15", "must exceed preStopSleepSeconds"),
        ("auth.tls.enabled=true", "auth.tls.secretName"),
        ("etcd.external.endpoints=null", "etcd.external.endpoints"),
    ],
)
def test_invalid_values_are_refused(setting: str, message: str) -> None:
    result = _run("template", "rel", str(CHART), "--set", setting)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr
