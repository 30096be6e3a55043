"""The chart's operational policy, over the manifests `helm template` renders for every values
file in helm/coordinator/ci/: requests and limits (CPU and memory) on every container, a
liveness probe on every long-running one, a NetworkPolicy selecting every pod, secrets passed
as files, a durable archive unless an emptyDir is chosen explicitly, image digests; and the
policy scan (scripts/scan-chart.sh, checkov) shown to fail on a finding, so its green run in
`make chart` means something.

Skipped when helm is missing (scripts/install-helm.sh installs it into .tools/bin; CI does);
the scan's own test also when checkov is (scripts/scan-chart.sh installs it; CI does).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.ops.test_helm_chart import (
    CHART,
    HELM,
    NAMESPACE,
    REQUIRED,
    ROOT,
    VALUES,
    WORKLOADS,
    Manifest,
    _containers,
    _coordinator,
    _one,
    _run,
    render,
)

pytestmark = pytest.mark.skipif(
    HELM is None, reason="helm not installed: run scripts/install-helm.sh (CI does)"
)

CHECKOV = ROOT / ".tools" / "checkov" / "bin" / "checkov"
DIGEST = "sha256:" + "ab" * 32


def _workloads(manifests: list[Manifest]) -> list[Manifest]:
    return [m for m in manifests if m["kind"] in WORKLOADS]


def _pod_labels(manifest: Manifest) -> dict[str, str]:
    spec = manifest["spec"]
    if manifest["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    return dict(spec["template"]["metadata"]["labels"])


@pytest.mark.parametrize("values", VALUES, ids=lambda p: p.stem)
def test_every_container_has_cpu_and_memory_requests_and_limits(values: Path) -> None:
    for manifest in _workloads(render(values)):
        for _, container in _containers(manifest):
            resources = container.get("resources", {})
            for bound in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(resources.get(bound, {})), (
                    manifest["metadata"]["name"],
                    container["name"],
                    bound,
                )


@pytest.mark.parametrize("values", VALUES, ids=lambda p: p.stem)
def test_every_long_running_container_has_a_liveness_probe(values: Path) -> None:
    for manifest in _workloads(render(values)):
        if manifest["kind"] in {"Job", "CronJob"}:
            continue  # runs to completion: backoffLimit and the Job's deadline bound it
        for _, container in _containers(manifest):
            assert "livenessProbe" in container, (manifest["metadata"]["name"], container["name"])


@pytest.mark.parametrize("values", VALUES, ids=lambda p: p.stem)
def test_every_pod_is_selected_by_a_network_policy_by_default(values: Path) -> None:
    manifests = render(values)
    selectors = [
        m["spec"]["podSelector"]["matchLabels"].items()
        for m in manifests
        if m["kind"] == "NetworkPolicy"
    ]
    for manifest in _workloads(manifests):
        labels = _pod_labels(manifest).items()
        assert any(selector <= labels for selector in selectors), manifest["metadata"]["name"]


# The peers an ingress rule admits when its values name none: every pod of the release's
# namespace, and nothing else.
NAMESPACE_PODS: list[Manifest] = [{"podSelector": {}}]


@pytest.mark.parametrize("values", VALUES, ids=lambda p: p.stem)
def test_no_ingress_rule_admits_any_source(values: Path) -> None:
    # A rule with `ports` and no `from` admits every source: pods of other namespaces and
    # addresses outside the cluster. The console is turned on for its policy too (with a client
    # certificate, which mutual TLS requires).
    manifests = render(values, "console.enabled=true", "console.tls.clientSecretName=console-tls")
    policies = [m for m in manifests if m["kind"] == "NetworkPolicy"]
    assert policies
    for policy in policies:
        for rule in policy["spec"].get("ingress", []):
            assert rule.get("from"), (policy["metadata"]["name"], rule["ports"])


def test_empty_peer_lists_admit_the_pods_of_the_namespace_only() -> None:
    tls = ("auth.tls.enabled=true", "auth.tls.secretName=coordinator-tls")
    manifests = render(None, "console.enabled=true", *tls)
    policy = _one(manifests, "NetworkPolicy", "rel-coordinator")
    assert policy["spec"]["ingress"] == [
        {"ports": [{"port": "grpc", "protocol": "TCP"}], "from": NAMESPACE_PODS},
        {"ports": [{"port": "metrics", "protocol": "TCP"}], "from": NAMESPACE_PODS},
        # The kubelet's probes: traffic from a pod's own node is always allowed.
        {"ports": [{"port": "health", "protocol": "TCP"}], "from": NAMESPACE_PODS},
    ]
    console = _one(manifests, "NetworkPolicy", "rel-coordinator-console")
    assert console["spec"]["ingress"] == [
        {"ports": [{"port": "http", "protocol": "TCP"}], "from": NAMESPACE_PODS}
    ]
    # Peers given replace the default, exactly.
    given = yaml.safe_load((CHART / "ci" / "bundled-etcd-values.yaml").read_text())
    named = _one(
        render(CHART / "ci" / "bundled-etcd-values.yaml"), "NetworkPolicy", "rel-coordinator"
    )
    assert [rule["from"] for rule in named["spec"]["ingress"]] == [
        given["networkPolicy"]["grpcFrom"],
        given["networkPolicy"]["metricsFrom"],
    ]
    ingress = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress"}}}]
    sets = (
        "console.enabled=true",
        "console.networkPolicy.from[0].namespaceSelector.matchLabels"
        ".kubernetes\\.io/metadata\\.name=ingress",
    )
    console = _one(render(None, *sets), "NetworkPolicy", "rel-coordinator-console")
    assert console["spec"]["ingress"][0]["from"] == ingress


def test_the_client_pods_take_no_connection_and_the_console_only_its_port() -> None:
    manifests = render(CHART / "ci" / "worker-pool-keda-values.yaml", "console.enabled=true")
    pool = _one(manifests, "NetworkPolicy", "rel-coordinator-emails")
    assert pool["spec"]["policyTypes"] == ["Ingress"]
    assert "ingress" not in pool["spec"], "the worker pool must take no connection"
    console = _one(manifests, "NetworkPolicy", "rel-coordinator-console")
    (rule,) = console["spec"]["ingress"]
    assert rule == {"ports": [{"port": "http", "protocol": "TCP"}], "from": NAMESPACE_PODS}

    off = render(None, "networkPolicy.enabled=false", "console.enabled=true")
    assert not [m for m in off if m["kind"] == "NetworkPolicy"]


def test_the_archive_outlives_the_pods_by_default() -> None:
    manifests = render(None)
    claim = _one(manifests, "PersistentVolumeClaim", "rel-coordinator-archive")
    # Every replica writes its own files into it; uninstalling keeps the histories.
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert claim["spec"]["resources"]["requests"]["storage"] == "10Gi"
    volumes = {v["name"]: v for v in _coordinator(manifests)["spec"]["template"]["spec"]["volumes"]}
    assert volumes["archive"]["persistentVolumeClaim"] == {"claimName": "rel-coordinator-archive"}

    mine = render(None, "config.archivePersistentVolumeClaim=histories")
    assert not [m for m in mine if m["kind"] == "PersistentVolumeClaim"]
    volumes = {v["name"]: v for v in _coordinator(mine)["spec"]["template"]["spec"]["volumes"]}
    assert volumes["archive"]["persistentVolumeClaim"] == {"claimName": "histories"}

    s3 = render(None, "config.archive=s3://bucket/coordinator")
    assert not [m for m in s3 if m["kind"] == "PersistentVolumeClaim"]
    names = {v["name"] for v in _coordinator(s3)["spec"]["template"]["spec"]["volumes"]}
    assert "archive" not in names


def _notes(*sets: str) -> str:
    args = ["install", "rel", str(CHART), "--namespace", NAMESPACE, "--dry-run=client"]
    for item in REQUIRED + sets:
        args += ["--set", item]
    result = _run(*args)
    assert result.returncode == 0, result.stderr
    return result.stdout.split("\nNOTES:\n", 1)[1]


def test_an_emptydir_archive_is_taken_only_when_chosen_and_then_warned_about() -> None:
    manifests = render(None, "config.archiveEmptyDir=true")
    assert not [m for m in manifests if m["kind"] == "PersistentVolumeClaim"]
    volumes = {v["name"]: v for v in _coordinator(manifests)["spec"]["template"]["spec"]["volumes"]}
    assert volumes["archive"]["emptyDir"] == {}
    assert "WARNING: config.archiveEmptyDir=true" in _notes("config.archiveEmptyDir=true")
    assert "WARNING: config.archiveEmptyDir" not in _notes()


def test_the_notes_describe_the_sdks_sticky_channel_not_round_robin() -> None:
    text = _notes()
    assert "round_robin" not in text
    assert "one channel, sticky to the replica" in text


def test_images_may_be_pinned_by_digest() -> None:
    pinned = render(
        None,
        f"image.digest={DIGEST}",
        "etcd.mode=bundled",
        f"etcd.bundled.image.digest={DIGEST}",
    )
    images = {c["image"] for m in _workloads(pinned) for _, c in _containers(m)}
    assert images == {
        f"registry.example/coordinator:0.1.0@{DIGEST}",
        f"quay.io/coreos/etcd:v3.5.21@{DIGEST}",
    }
    by_digest_only = render(None, "image.tag=", f"image.digest={DIGEST}")
    (_, container), *_ = _containers(_coordinator(by_digest_only))
    assert container["image"] == f"registry.example/coordinator@{DIGEST}"

    result = _run("template", "rel", str(CHART), "--set", ",".join((*REQUIRED, "image.digest=abc")))
    assert result.returncode != 0
    assert "image/digest" in result.stderr or "image.digest" in result.stderr, result.stderr


@pytest.mark.skipif(
    not CHECKOV.exists(), reason="checkov not installed: run scripts/scan-chart.sh (CI does)"
)
def test_the_policy_scan_fails_on_a_finding(tmp_path: Path) -> None:
    """The scan of `make chart` is not vacuous: a container without a CPU limit fails it."""
    args = ["template", "rel", str(CHART), "-f", str(CHART / "ci" / "console-values.yaml")]
    args += ["--set", "console.resources.limits=null"]
    rendered = _run(*args)
    assert rendered.returncode == 0, rendered.stderr
    (tmp_path / "console.yaml").write_text(rendered.stdout)
    isolate = ["unshare", "--net"] if shutil.which("unshare") and os.geteuid() == 0 else []
    scan = subprocess.run(
        [
            *isolate,
            str(CHECKOV),
            "--directory",
            str(tmp_path),
            "--config-file",
            str(CHART / "ci" / "checkov.yaml"),
            "--skip-download",
            "--compact",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "BC_SKIP_MAPPING": "TRUE"},
    )
    assert scan.returncode == 1, scan.stdout + scan.stderr
    assert "CKV_K8S_11" in scan.stdout  # "CPU limits should be set"
    assert "CKV_K8S_13" in scan.stdout  # "Memory limits should be set"
