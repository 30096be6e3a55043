"""The Helm chart, rendered with `helm template` for every values file in helm/coordinator/ci/
and checked for what matters in a cluster: probes on the real ports, a configuration the server
accepts, flags that exist, bundled etcd members addressed by their pod DNS names, a hardened
security context, no secret in plain text, and a termination grace longer than the drain; the
required image and token file, the example worker pool with its KEDA or HPA scaling, and the
alerts, whose every metric the server exports. The NOTES a `helm install` prints (rendered by a
client-side dry run) give Python that parses and imports what it uses, and commands that exist.

``kubectl apply --dry-run=client`` is not run: kubectl needs a cluster's API discovery even for
a client-side dry run (it fails at once without one), and the custom kinds (ScaledObject,
PrometheusRule, ServiceMonitor, Certificate) could not be checked without their CRDs anyway.

Skipped when helm is missing (scripts/install-helm.sh installs it into .tools/bin; CI does).
"""

from __future__ import annotations

import ast
import base64
import builtins
import inspect
import json
import os
import re
import shlex
import shutil
import subprocess
import textwrap
import tomllib
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from cryptography import x509

from coordinator import sdk
from coordinator.cli import main as cli
from coordinator.cli.console import console as console_command
from coordinator.cli.etcd_auth import etcd_auth as etcd_auth_command
from coordinator.cli.serve import serve
from coordinator.cli.worker import worker as worker_command
from coordinator.config import Config
from coordinator.config_file import SETTINGS
from coordinator.errors import CoordinatorError
from coordinator.metrics import REGISTRY
from coordinator.sdk.pool import GIVE_BACK_TIMEOUT, SHUTDOWN_ERROR
from coordinator.server import metrics_http
from coordinator.server.app import LIVENESS_SERVICE
from coordinator.server.tokens import TokenFile, token_hash
from coordinator.store import Keyspace, Store
from coordinator.store.etcd.ops import put
from tests.auth.certs import Pem
from tests.ops.tls_etcd import Certificates, tls_etcd

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "coordinator"
VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
NAMESPACE = "agents"
WORKLOADS = frozenset({"Deployment", "StatefulSet", "Job", "CronJob"})
# The only Secrets the chart renders: the token file given in values (hashes only), and the
# bundled etcd's generated certificates and passwords.
# The one secret passed as an environment variable, and why: etcdctl (the defrag CronJob) reads
# its password only from ETCDCTL_PASSWORD or a flag, and the etcd image has no shell to read a
# file (the CronJob carries the policy scan's skip with that reason).
EXEMPT_SECRET_ENV = frozenset({"ETCDCTL_PASSWORD"})
GENERATED_SECRETS = frozenset(
    {
        "rel-coordinator-tokens",
        "rel-coordinator-etcd-server-tls",
        "rel-coordinator-etcd-client-tls",
        "rel-coordinator-etcd-auth",
        "rel-coordinator-console-session",
    }
)


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

# What every install must give (tests without a values file add these to their --set list).
REQUIRED = (
    "image.repository=registry.example/coordinator",
    "image.tag=0.1.0",
    "auth.tokenSecret.name=rel-tokens",
)


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
    else:
        sets = REQUIRED + sets
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


def _coordinator(manifests: list[Manifest]) -> Manifest:
    """The coordinator's own Deployment (a worker pool is another one)."""
    return _one(manifests, "Deployment", "rel-coordinator")


def _config(manifests: list[Manifest]) -> dict[str, Any]:
    configmap = _one(manifests, "ConfigMap", "rel-coordinator")
    return tomllib.loads(configmap["data"]["coordinator.toml"])


def _port(address: str) -> int:
    return int(address.rpartition(":")[2])


def _containers(manifest: Manifest) -> Iterator[tuple[Manifest, Manifest]]:
    """(pod spec, container) of a workload (Deployment, StatefulSet, Job or CronJob)."""
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
    deployment = _coordinator(render(values))
    for _, container in _containers(deployment):
        used = [a.split("=")[0] for a in container.get("args", []) if a.startswith("--")]
        assert used and set(used) <= flags, used
        for env in container.get("env", []):
            setting = env["name"].removeprefix("COORDINATOR_").removesuffix("_FILE").lower()
            assert setting in SETTINGS, env["name"]


@cache
def notes(values: Path) -> str:
    """The NOTES.txt that `helm install` prints for release "rel" (``helm template`` renders
    no NOTES; a client-side dry run needs no cluster)."""
    args = ["install", "rel", str(CHART), "--namespace", NAMESPACE, "--dry-run=client"]
    result = _run(*args, "-f", str(values))
    assert result.returncode == 0, result.stderr
    return result.stdout.split("\nNOTES:\n", 1)[1]


def _notes_snippet(text: str) -> str:
    """The Python the NOTES give a worker: the indented lines after step 3's heading."""
    after = text.split("3. Give worker-1.token", 1)[1].split("\n", 1)[1]
    return textwrap.dedent(after.split("\n\n", 1)[0])


@pytest.mark.parametrize(
    "values", [v for v in VALUES if v.stem != "insecure-values"], ids=lambda p: p.stem
)
def test_the_notes_python_snippet_runs_as_printed(values: Path) -> None:
    snippet = _notes_snippet(notes(values))
    tree = ast.parse(snippet)  # valid Python, indentation and all
    imported = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    assert "os" in imported  # os.environ["COORDINATOR_TOKEN"]
    assert used - imported - set(dir(builtins)) == set(), snippet
    # Every keyword it passes is one the SDK takes.
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
        if isinstance(call.func, ast.Name) and call.func.id in ("WorkerClient", "tls_credentials"):
            taken = inspect.signature(getattr(sdk, call.func.id)).parameters
            assert {k.arg for k in call.keywords} <= set(taken), ast.unparse(call)


@pytest.mark.parametrize("values", VALUES, ids=lambda p: p.stem)
def test_the_notes_commands_exist_with_the_options_they_pass(values: Path) -> None:
    # The indented lines are the ones to type (the first line names the chart, not a command).
    lines = [line.strip() for line in notes(values).splitlines() if line.startswith(" ")]
    commands = [
        shlex.split(line.split(">")[0]) for line in lines if line.startswith("coordinator ")
    ]
    assert commands, "the NOTES name no coordinator command"
    for command in commands:  # an unknown command or option fails before --help is honoured
        shown = CliRunner().invoke(cli, [*command[1:], "--help"])
        assert shown.exit_code == 0, f"{shlex.join(command)}: {shown.output}"


@pytest.mark.parametrize("values", VALUES, ids=lambda p: p.stem)
def test_probes_point_at_the_port_that_serves_health(values: Path) -> None:
    manifests = render(values)
    config = _config(manifests)
    deployment = _coordinator(manifests)
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
    pod = _coordinator(manifests)["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    drain = float(pre_stop[1]) + _config(manifests)["shutdown_grace"]
    assert pod["terminationGracePeriodSeconds"] > drain


@pytest.mark.parametrize("values", VALUES, ids=lambda p: p.stem)
def test_every_workload_runs_hardened(values: Path) -> None:
    workloads = [m for m in render(values) if m["kind"] in WORKLOADS]
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
    # The chart only references the operator's Secrets; it renders only what it generates
    # itself, base64 in `data` (a Secret's data is never in plain text in the manifest).
    for secret in (m for m in manifests if m["kind"] == "Secret"):
        assert secret["metadata"]["name"] in GENERATED_SECRETS, secret["metadata"]["name"]
        assert set(secret) == {"apiVersion", "kind", "type", "metadata", "data"}
    assert "-----BEGIN" not in text
    # A sha256 is only allowed as the config checksum that rolls the pods.
    hashes = set(re.findall(r"\b[0-9a-f]{64}\b", text))
    checksums = {
        _coordinator(manifests)["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    }
    assert hashes <= checksums, "a token hash in a manifest"
    for manifest in manifests:
        if manifest["kind"] not in WORKLOADS:
            continue
        for pod, container in _containers(manifest):
            for env in container.get("env", []):
                if re.search("PASSWORD|TOKEN|SECRET|KEY", env["name"]) and env["name"] not in (
                    EXEMPT_SECRET_ENV
                ):
                    # As a file of a mounted Secret: the variable names only the path.
                    assert env["name"].endswith("_FILE"), env
                    assert env["name"].removesuffix("_FILE") in _secret_files(pod, container)
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
        f"{name}-{i}=https://{m}:2380" for i, m in enumerate(members)
    )
    assert args["advertise-client-urls"] == (
        f"https://$(POD_NAME).{headless['metadata']['name']}.{NAMESPACE}.svc.cluster.local:2379"
    )
    assert args["auto-compaction-retention"] not in {"", "0"}
    assert args["auto-compaction-mode"] in {"periodic", "revision"}
    assert sts["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"]
    assert {m["mountPath"] for m in etcd["volumeMounts"]} == {"/var/lib/etcd", "/etc/etcd/tls"}
    assert args["data-dir"].startswith("/var/lib/etcd/")

    defrag = _one(manifests, "CronJob")
    (_, job), *_ = _containers(defrag)
    assert job["command"] == ["etcdctl"] and "defrag" in job["args"]
    assert f"--endpoints={','.join(f'https://{m}:2379' for m in members)}" in job["args"]
    assert defrag["spec"]["concurrencyPolicy"] == "Forbid"


def test_the_console_runs_apart_and_talks_to_the_coordinator_service() -> None:
    manifests = render(None, "console.enabled=true")
    console = _one(manifests, "Deployment", "rel-coordinator-console")
    coordinator = _coordinator(manifests)
    labels = console["spec"]["template"]["metadata"]["labels"]
    # Its own selector: no coordinator Service or Deployment selects a console pod.
    for selector in (
        coordinator["spec"]["selector"]["matchLabels"],
        _one(manifests, "Service", "rel-coordinator")["spec"]["selector"],
    ):
        assert not set(selector.items()) <= set(labels.items())
    (container,) = console["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["coordinator", "console"]
    assert "--target=rel-coordinator.agents.svc:50051" in container["args"]
    assert "--secure-cookie" in container["args"]
    secret_file = next(a for a in container["args"] if a.startswith("--secret-file="))
    pod = console["spec"]["template"]["spec"]
    assert _mounted_secret(pod, container, secret_file.split("=", 1)[1]) == (
        "rel-coordinator-console-session"
    )
    service = _one(manifests, "Service", "rel-coordinator-console")
    assert service["spec"]["selector"] == console["spec"]["selector"]["matchLabels"]
    assert not [m for m in render(None) if "console" in m["metadata"]["name"]]  # off by default


def test_the_console_answers_the_configured_host_names() -> None:
    manifests = render(None, "console.enabled=true", "console.allowedHosts={a.example,b.example}")
    console = _one(manifests, "Deployment", "rel-coordinator-console")
    (container,) = console["spec"]["template"]["spec"]["containers"]
    hosts = [a for a in container["args"] if a.startswith("--allowed-host")]
    assert hosts == ["--allowed-host=a.example", "--allowed-host=b.example"]
    unset = _one(render(None, "console.enabled=true"), "Deployment", "rel-coordinator-console")
    (container,) = unset["spec"]["template"]["spec"]["containers"]
    assert not [a for a in container["args"] if a.startswith("--allowed-host")]


def _console_files(manifests: list[Manifest]) -> dict[str, tuple[str, str]]:
    """Console flag -> (the Secret mounted where it points, the key projected to that file)."""
    console = _one(manifests, "Deployment", "rel-coordinator-console")
    pod = console["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    flags = dict(a.removeprefix("--").split("=", 1) for a in container["args"] if "=" in a)
    projected = {
        v["name"]: {i["path"]: i["key"] for i in v["secret"].get("items", [])}
        for v in pod["volumes"]
        if "secret" in v
    }
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    found = {}
    for flag in ("ca", "cert", "key"):
        if flag in flags:
            path = Path(flags[flag])
            volume = mounts[str(path.parent)]
            found[flag] = (_mounted_secret(pod, container, str(path)), projected[volume][path.name])
    return found


def test_against_mutual_tls_the_console_gets_the_ca_and_its_own_client_certificate() -> None:
    files = _console_files(render(CHART / "ci" / "console-tls-values.yaml"))
    assert files == {
        "ca": ("coordinator-tls", "ca.crt"),  # the CA in the server's own certificate Secret
        "cert": ("coordinator-console-client-tls", "tls.crt"),
        "key": ("coordinator-console-client-tls", "tls.key"),
    }
    flags = {opt for param in console_command.params for opt in param.opts}
    assert {"--ca", "--cert", "--key"} <= flags


def test_against_tls_alone_the_console_gets_the_ca_it_is_told() -> None:
    tls = ("console.enabled=true", "auth.tls.enabled=true", "auth.tls.secretName=coordinator-tls")
    assert _console_files(render(None, *tls)) == {"ca": ("coordinator-tls", "ca.crt")}
    other_ca = ("console.tls.caSecretName=company-ca", "console.tls.caKey=root.pem")
    assert _console_files(render(None, *tls, *other_ca)) == {"ca": ("company-ca", "root.pem")}
    assert _console_files(render(None, "console.enabled=true")) == {}  # plaintext: no TLS flags


def test_mutual_tls_without_a_client_certificate_for_the_console_is_refused() -> None:
    sets = (
        *REQUIRED,
        "console.enabled=true",
        "auth.tls.enabled=true",
        "auth.tls.secretName=coordinator-tls",
        "auth.tls.clientCA=true",
    )
    result = _run("template", "rel", str(CHART), *(arg for s in sets for arg in ("--set", s)))
    assert result.returncode != 0
    assert "console.tls.clientSecretName: auth.tls.clientCA makes the coordinator demand" in (
        result.stderr
    )


def test_external_etcd_is_the_default() -> None:
    manifests = render(None)
    assert not [m for m in manifests if m["kind"] == "StatefulSet"]
    assert _config(manifests)["etcd"] == ["etcd:2379"]


def _etcd_quota(manifests: list[Manifest]) -> int:
    """The bundled etcd's --quota-backend-bytes."""
    (_, etcd), *_ = _containers(_one(manifests, "StatefulSet"))
    quota = next(a for a in etcd["args"] if a.startswith("--quota-backend-bytes="))
    return int(quota.partition("=")[2])


def test_the_space_guard_reads_the_quota_etcd_really_has() -> None:
    # A guard that assumed etcd's default 2 GiB would refuse creates at 1.6 GiB of a larger etcd.
    bundled = render(CHART / "ci" / "bundled-etcd-values.yaml")
    assert _config(bundled)["etcd_quota_bytes"] == _etcd_quota(bundled) == 2 << 30
    larger = render(
        CHART / "ci" / "bundled-etcd-values.yaml",
        "etcd.bundled.quotaBackendBytes=4294967296",
        "etcd.bundled.resources.limits.memory=16Gi",
    )
    assert _config(larger)["etcd_quota_bytes"] == _etcd_quota(larger) == 4 << 30
    external = _config(render(None, "config.etcdQuotaBytes=4294967296"))
    assert external["etcd_quota_bytes"] == 4 << 30
    assert (external["etcd_quota_high_water"], external["etcd_space_interval"]) == (0.8, 5.0)
    assert (external["etcd_quota_full"], external["etcd_compact_keep"]) == (0.9, 300.0)
    budgets = {k: v for k, v in external.items() if k.startswith("write_budget_")}
    assert budgets == {
        "write_budget_worker": float(256 << 10),
        "write_budget_pm": float(1 << 20),
        "write_budget_admin": 0.0,
        "write_budget_window": 60.0,
        "write_budget_high_water_share": 0.0625,
    }


# Kubernetes quantity suffixes (resource.Quantity), binary and decimal.
_QUANTITY = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}
_QUANTITY |= {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "": 1}


def _bytes(quantity: str | int) -> int:
    """The bytes of a memory quantity ("8Gi", "512M", 1073741824)."""
    match = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(quantity))
    assert match is not None, quantity
    return int(float(match[1]) * _QUANTITY[match[2]])


# etcd memory-maps its db file: a member's memory must hold the db at its quota, and more while
# it defragments (a second copy), sends or receives a snapshot and replays its WAL. Four times
# the quota is the floor the etcd operators' sizing gives (OpenShift's etcd docs: memory of at
# least 4x the database size); the request holds the whole quota, so the scheduler places the
# member where a full db fits.
ETCD_MEMORY_PER_QUOTA = 4


@pytest.mark.parametrize(
    "values",
    [None, *(v for v in VALUES if v.stem.startswith("bundled-etcd"))],
    ids=lambda p: p.stem if p else "defaults",
)
def test_the_bundled_etcds_memory_holds_its_quota(values: Path | None) -> None:
    manifests = render(values, "etcd.mode=bundled") if values is None else render(values)
    quota = _etcd_quota(manifests)
    (_, etcd), *_ = _containers(_one(manifests, "StatefulSet"))
    resources = etcd["resources"]
    assert _bytes(resources["limits"]["memory"]) >= ETCD_MEMORY_PER_QUOTA * quota, resources
    assert _bytes(resources["requests"]["memory"]) >= quota, resources
    # The space guard and the near-quota alert read the same quota the members enforce.
    assert _config(manifests)["etcd_quota_bytes"] == quota


def test_the_bundled_etcds_default_quota_is_etcds_own_with_four_times_the_memory() -> None:
    manifests = render(None, "etcd.mode=bundled")
    (_, etcd), *_ = _containers(_one(manifests, "StatefulSet"))
    assert _etcd_quota(manifests) == 2 << 30  # etcd's default --quota-backend-bytes
    assert etcd["resources"] == {
        "requests": {"cpu": "200m", "memory": "2Gi"},
        "limits": {"cpu": "2", "memory": "8Gi"},
    }
    assert _bytes("8Gi") == 8 << 30 and _bytes("512M") == 512 * 10**6 and _bytes(1024) == 1024


def test_tls_mounts_the_files_the_configuration_names() -> None:
    manifests = render(CHART / "ci" / "tls-values.yaml")
    config = _config(manifests)
    pod = _coordinator(manifests)["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}

    def secret_of(path: str) -> str:
        directory = str(Path(path).parent)
        return str(secrets[mounts[directory]])

    assert secret_of(config["tls_cert"]) == secret_of(config["tls_client_ca"]) == "coordinator-tls"
    assert secret_of(config["etcd_ca_cert"]) == secret_of(config["etcd_key"]) == "etcd-client-tls"
    assert config["token_file"].startswith("/etc/coordinator/auth/")
    assert _secret_files(pod, container) == {
        "COORDINATOR_ETCD_USER": ("etcd-credentials", "username"),
        "COORDINATOR_ETCD_PASSWORD": ("etcd-credentials", "password"),
    }


def test_optional_monitoring_objects() -> None:
    manifests = render(CHART / "ci" / "bundled-etcd-values.yaml")
    monitor = _one(manifests, "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    policies = {m["metadata"]["name"] for m in manifests if m["kind"] == "NetworkPolicy"}
    assert policies == {
        "rel-coordinator",
        "rel-coordinator-etcd",
        "rel-coordinator-etcd-auth",
        "rel-coordinator-etcd-defrag",
    }
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
    "coordinator_queue_ready_tasks",
    "coordinator_queue_oldest_ready_age_seconds",
    "coordinator_queue_claimed_tasks",
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
        ("etcd.mode=bundled,etcd.bundled.tls.enabled=false", "needs etcd.bundled.tls.enabled"),
        ("etcd.mode=bundled,etcd.bundled.tls.source=secret", "etcd.bundled.tls.existingSecrets"),
        ("etcd.bundled.auth.user=root", "etcd/bundled/auth/user"),
        ("metrics.tls=true", "metrics.tls serves the gRPC certificate"),
        ("metrics.maxConnections=0", "metrics/maxConnections"),
    ],
)
def test_invalid_values_are_refused(setting: str, message: str) -> None:
    result = _run("template", "rel", str(CHART), "--set", ",".join((*REQUIRED, setting)))
    assert result.returncode != 0
    assert message in result.stderr, result.stderr


def _mounted_secret(pod: Manifest, container: Manifest, path: str) -> str:
    """The Secret whose volume ``container`` mounts at the directory of ``path``."""
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    return str(secrets[mounts[str(Path(path).parent)]])


def _secret_files(pod: Manifest, container: Manifest) -> dict[str, tuple[str, str]]:
    """Setting variable -> (Secret, key) of every ``<VARIABLE>_FILE`` naming a file of a
    mounted Secret (the way the chart passes secrets: never in an environment variable)."""
    volumes = {v["name"]: v.get("secret") for v in pod.get("volumes", [])}
    mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
    found = {}
    for env in container.get("env", []):
        if not env["name"].endswith("_FILE") or "value" not in env:
            continue
        path = Path(env["value"])
        secret = volumes.get(mounts.get(str(path.parent), ""))
        if secret is None:
            continue
        items = {i["path"]: i["key"] for i in secret.get("items", [])} or {path.name: path.name}
        found[env["name"].removesuffix("_FILE")] = (secret["secretName"], items[path.name])
    return found


def _certificate(secret: Manifest, key: str) -> x509.Certificate:
    return x509.load_pem_x509_certificate(base64.b64decode(secret["data"][key]))


def _admits(policy: Manifest, port: int | str, labels: dict[str, str]) -> bool:
    """Whether ``policy`` lets a pod with ``labels`` (same namespace) reach ``port``."""
    for rule in policy["spec"]["ingress"]:
        if port not in [p["port"] for p in rule["ports"]]:
            continue
        assert rule.get("from"), f"port {port} is open to every pod"
        for peer in rule["from"]:
            assert set(peer) == {"podSelector"}, f"port {port} admits more than pods: {peer}"
            # An empty podSelector selects every pod of the namespace.
            if peer["podSelector"].get("matchLabels", {}).items() <= labels.items():
                return True
    return False


def test_bundled_etcd_serves_only_tls_with_client_certificates_by_default() -> None:
    manifests = render(None, "etcd.mode=bundled")
    sts = _one(manifests, "StatefulSet")
    (etcd_pod, etcd), *_ = _containers(sts)
    args = dict(a.removeprefix("--").split("=", 1) for a in etcd["args"])
    # TLS for clients and peers, and both must show a certificate of the CA.
    assert args["listen-client-urls"] == "https://0.0.0.0:2379"
    assert args["listen-peer-urls"] == "https://0.0.0.0:2380"
    assert args["client-cert-auth"] == args["peer-client-cert-auth"] == "true"
    server_secret = _mounted_secret(etcd_pod, etcd, args["cert-file"])
    assert server_secret == "rel-coordinator-etcd-server-tls"
    for flag in ("key-file", "trusted-ca-file", "peer-cert-file", "peer-trusted-ca-file"):
        assert _mounted_secret(etcd_pod, etcd, args[flag]) == server_secret, flag

    # The generated certificates: one CA; the members' names; a client cert of that CA.
    server = _one(manifests, "Secret", server_secret)
    client = _one(manifests, "Secret", "rel-coordinator-etcd-client-tls")
    ca = _certificate(server, "ca.crt")
    assert _certificate(client, "ca.crt") == ca
    member, client_cert = _certificate(server, "tls.crt"), _certificate(client, "tls.crt")
    member.verify_directly_issued_by(ca)
    client_cert.verify_directly_issued_by(ca)
    names = member.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    hosts = [e.removesuffix(":2379") for e in _config(manifests)["etcd"]]
    assert set(hosts) <= set(names.get_values_for_type(x509.DNSName))


def test_bundled_etcd_auth_is_on_by_default_for_a_coordinator_user() -> None:
    manifests = render(None, "etcd.mode=bundled")
    client = _one(manifests, "Secret", "rel-coordinator-etcd-client-tls")
    # The coordinator: TLS with the client certificate, and its own etcd user's password.
    config = _config(manifests)
    deployment = _coordinator(manifests)
    (pod, container), *_ = _containers(deployment)
    for setting in ("etcd_ca_cert", "etcd_cert", "etcd_key"):
        assert _mounted_secret(pod, container, config[setting]) == client["metadata"]["name"]
    auth_secret = _one(manifests, "Secret", "rel-coordinator-etcd-auth")
    assert base64.b64decode(auth_secret["data"]["username"]) == b"coordinator"
    assert len(base64.b64decode(auth_secret["data"]["root-password"])) == 32
    assert _secret_files(pod, container) == {
        "COORDINATOR_ETCD_USER": ("rel-coordinator-etcd-auth", "username"),
        "COORDINATOR_ETCD_PASSWORD": ("rel-coordinator-etcd-auth", "password"),
    }

    # The Job that turns etcd auth on, for that user, on the coordinator's prefix only.
    job = _one(manifests, "Job")
    (job_pod, job_container), *_ = _containers(job)
    assert job_container["command"] == ["coordinator"]
    job_args = job_container["args"]
    assert job_args[0] == "etcd-auth"
    assert f"--prefix={config['prefix']}" in job_args
    assert f"--etcd={','.join(config['etcd'])}" in job_args
    for flag in ("--etcd-ca-cert", "--etcd-cert", "--etcd-key"):
        (path,) = [a.split("=", 1)[1] for a in job_args if a.startswith(flag + "=")]
        assert _mounted_secret(job_pod, job_container, path) == client["metadata"]["name"]
    assert _secret_files(job_pod, job_container) == {
        "COORDINATOR_ETCD_USER": ("rel-coordinator-etcd-auth", "username"),
        "COORDINATOR_ETCD_PASSWORD": ("rel-coordinator-etcd-auth", "password"),
        "COORDINATOR_ETCD_ROOT_PASSWORD": ("rel-coordinator-etcd-auth", "root-password"),
    }
    flags = {opt for param in etcd_auth_command.params for opt in param.opts}
    assert {a.split("=")[0] for a in job_args[1:]} <= flags
    assert {e["name"].removesuffix("_FILE") for e in job_container["env"]} <= {
        env for param in etcd_auth_command.params for env in [getattr(param, "envvar", None)]
    }


def test_bundled_etcd_admits_only_the_coordinator_and_its_etcd_jobs_by_default() -> None:
    manifests = render(None, "etcd.mode=bundled")
    sts = _one(manifests, "StatefulSet")
    deployment = _coordinator(manifests)
    job = _one(manifests, "Job")
    # Only the coordinator and the etcd jobs reach the client port; only members the peers'.
    policy = _one(manifests, "NetworkPolicy", "rel-coordinator-etcd")
    etcd_labels = sts["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= etcd_labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    defrag = _one(manifests, "CronJob")["spec"]["jobTemplate"]["spec"]["template"]
    clients = [
        deployment["spec"]["template"]["metadata"]["labels"],
        job["spec"]["template"]["metadata"]["labels"],
        defrag["metadata"]["labels"],
    ]
    for labels in clients:
        assert _admits(policy, 2379, labels), labels
        assert not _admits(policy, 2380, labels), labels
    assert _admits(policy, 2380, etcd_labels)
    stranger = {"app.kubernetes.io/instance": "rel", "app.kubernetes.io/name": "coordinator"}
    assert not _admits(policy, 2379, stranger)
    assert not _admits(policy, 2379, {**stranger, "app.kubernetes.io/component": "worker"})


def test_bundled_etcd_takes_cert_manager_or_existing_certificates() -> None:
    manifests = render(CHART / "ci" / "bundled-etcd-cert-manager-values.yaml")
    assert not [m for m in manifests if m["kind"] == "Secret"]
    certificates = {m["spec"]["secretName"]: m for m in manifests if m["kind"] == "Certificate"}
    assert set(certificates) == {
        "rel-coordinator-etcd-server-tls",
        "rel-coordinator-etcd-client-tls",
    }
    server = certificates["rel-coordinator-etcd-server-tls"]["spec"]
    hosts = [e.removesuffix(":2379") for e in _config(manifests)["etcd"]]
    assert set(hosts) <= set(server["dnsNames"])
    assert set(server["usages"]) == {"server auth", "client auth"}
    for certificate in certificates.values():
        assert certificate["spec"]["issuerRef"]["name"] == "platform-ca"
    (pod, container), *_ = _containers(_coordinator(manifests))
    assert set(_secret_files(pod, container).values()) == {
        ("coordinator-etcd-credentials", "username"),
        ("coordinator-etcd-credentials", "password"),
    }

    manifests = render(
        None,
        "etcd.mode=bundled",
        "etcd.bundled.tls.source=secret",
        "etcd.bundled.tls.existingSecrets.server=my-etcd-server",
        "etcd.bundled.tls.existingSecrets.client=my-etcd-client",
    )
    assert {m["metadata"]["name"] for m in manifests if m["kind"] == "Secret"} == {
        "rel-coordinator-etcd-auth"
    }
    (etcd_pod, etcd), *_ = _containers(_one(manifests, "StatefulSet"))
    assert _mounted_secret(etcd_pod, etcd, "/etc/etcd/tls/tls.crt") == "my-etcd-server"
    (pod, container), *_ = _containers(_coordinator(manifests))
    assert _mounted_secret(pod, container, _config(manifests)["etcd_cert"]) == "my-etcd-client"


def test_bundled_etcd_policy_can_be_turned_off_and_external_etcd_is_untouched() -> None:
    manifests = render(None, "etcd.mode=bundled", "etcd.bundled.networkPolicy.enabled=false")
    assert "rel-coordinator-etcd" not in {
        m["metadata"]["name"] for m in manifests if m["kind"] == "NetworkPolicy"
    }
    external = render(None)
    assert not [m for m in external if m["kind"] in {"Secret", "Job"}]
    assert {m["metadata"]["name"] for m in external if m["kind"] == "NetworkPolicy"} == {
        "rel-coordinator"
    }
    assert not {"etcd_ca_cert", "etcd_cert", "etcd_key"} & set(_config(external))


def test_metrics_bind_as_the_values_say() -> None:
    config = _config(render(None))
    assert config["metrics_listen"] == "0.0.0.0:9090"  # the pod IP must be scrapable
    assert config["metrics_read_timeout"] == 10
    assert config["metrics_max_connections"] == 64
    assert "metrics_tls" not in config
    config = _config(render(None, "metrics.listenAddress=::", "service.metricsPort=9100"))
    assert config["metrics_listen"] == "[::]:9100"
    Config(metrics_listen=config["metrics_listen"])  # serve accepts it

    manifests = render(CHART / "ci" / "tls-values.yaml")
    assert _config(manifests)["metrics_tls"] is True
    endpoint = _one(manifests, "ServiceMonitor")["spec"]["endpoints"][0]
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"]["ca"]["secret"] == {"name": "coordinator-tls", "key": "ca.crt"}
    assert endpoint["tlsConfig"]["serverName"] == f"rel-coordinator.{NAMESPACE}.svc"


def test_the_charts_generated_certificates_and_passwords_close_a_real_etcd(
    tmp_path: Path,
) -> None:
    """The bundled etcd's own TLS flags and the Secrets the chart generates, on a local etcd:
    nothing gets in without the client certificate and a password, the auth Job's command
    turns auth on, and the coordinator's user then runs a claim in its prefix only."""
    manifests = render(None, "etcd.mode=bundled")
    files: dict[str, Path] = {}
    for secret in (m for m in manifests if m["kind"] == "Secret"):
        for key, value in secret["data"].items():
            path = tmp_path / f"{secret['metadata']['name']}-{key}"
            path.write_bytes(base64.b64decode(value))
            files[f"{secret['metadata']['name']}/{key}"] = path
    server, client, auth = (
        "rel-coordinator-etcd-server-tls",
        "rel-coordinator-etcd-client-tls",
        "rel-coordinator-etcd-auth",
    )
    (_, etcd_container), *_ = _containers(_one(manifests, "StatefulSet"))
    tls_flags = [  # the chart's TLS flags, with the files mounted here instead
        re.sub(r"/etc/etcd/tls/(.+)$", lambda m: str(files[f"{server}/{m[1]}"]), a)
        for a in etcd_container["args"]
        if re.match(r"--(peer-)?(cert-file|key-file|trusted-ca-file|client-cert-auth)=", a)
    ]
    assert len(tls_flags) == 8
    certs = Certificates(
        ca=files[f"{server}/ca.crt"],
        server=Pem(files[f"{server}/tls.crt"], files[f"{server}/tls.key"]),
        client=Pem(files[f"{client}/tls.crt"], files[f"{client}/tls.key"]),
    )
    (_, job), *_ = _containers(_one(manifests, "Job"))
    prefix = next(a.split("=", 1)[1] for a in job["args"] if a.startswith("--prefix="))
    user, password, root = (
        files[f"{auth}/{key}"].read_text() for key in ("username", "password", "root-password")
    )
    with tls_etcd(tmp_path, certs, tls_flags) as etcd:
        result = CliRunner().invoke(
            cli,
            [
                "etcd-auth",
                f"--etcd={etcd.endpoint}",
                f"--prefix={prefix}",
                f"--etcd-ca-cert={certs.ca}",
                f"--etcd-cert={certs.client.cert}",
                f"--etcd-key={certs.client.key}",
            ],
            env={
                "COORDINATOR_ETCD_USER": user,
                "COORDINATOR_ETCD_PASSWORD": password,
                "COORDINATOR_ETCD_ROOT_PASSWORD": root,
            },
        )
        assert result.exit_code == 0, result.output
        anonymous = etcd.connect()  # the client certificate alone
        try:
            with pytest.raises(CoordinatorError):
                anonymous.get(f"{prefix}/epoch")
        finally:
            anonymous.close()
        kv = etcd.connect(user=user, password=password)
        try:
            store = Store.open(kv, keys=Keyspace(prefix))
            assert store.admin.bump_epoch() == 2
            with pytest.raises(CoordinatorError, match="PERMISSION_DENIED"):
                kv.txn([], [put("/elsewhere", b"x")])
        finally:
            kv.close()


def _refusal(*sets: str) -> str:
    """The error of a render with exactly ``sets`` (it must fail)."""
    args = ["template", "rel", str(CHART), "--namespace", NAMESPACE]
    result = _run(*args, *(a for item in sets for a in ("--set", item)))
    assert result.returncode != 0, "rendered"
    return result.stderr


def test_the_image_is_required_with_a_message_saying_what_to_set() -> None:
    image, _, tokens = REQUIRED
    assert "image.repository is required: the registry path of the coordinator image" in (
        _refusal(tokens)
    )
    assert "image.tag (or image.digest) is required" in _refusal(image, tokens)
    manifests = render(None, "etcd.mode=bundled")
    images = {
        c["image"]
        for m in manifests
        if m["kind"] in {"Deployment", "Job"}
        for _, c in _containers(m)
    }
    assert images == {"registry.example/coordinator:0.1.0"}


def test_the_token_file_comes_from_values_or_a_named_secret(tmp_path: Path) -> None:
    manifests = render(CHART / "ci" / "default-values.yaml")
    secret = _one(manifests, "Secret", "rel-coordinator-tokens")
    given = yaml.safe_load((CHART / "ci" / "default-values.yaml").read_text())
    content = base64.b64decode(secret["data"]["tokens.json"])
    assert content.decode() == given["auth"]["tokenSecret"]["tokenFile"]
    (pod, container), *_ = _containers(_coordinator(manifests))
    token_file = _config(manifests)["token_file"]
    assert _mounted_secret(pod, container, token_file) == "rel-coordinator-tokens"
    assert Path(token_file).name == "tokens.json"
    # The server loads the rendered file as it is.
    path = tmp_path / "tokens.json"
    path.write_bytes(content)
    path.chmod(0o600)
    table = TokenFile(path).table()
    assert table.tokens[token_hash("ci-example-token")].principal == "worker-1"

    named = render(CHART / "ci" / "auth-values.yaml")
    assert not [m for m in named if m["kind"] == "Secret"]
    (pod, container), *_ = _containers(_coordinator(named))
    assert _mounted_secret(pod, container, _config(named)["token_file"]) == "agent-pool-tokens"

    image, tag, _ = REQUIRED
    assert "auth.mode=tokens needs the token file" in _refusal(image, tag)
    both = "auth.tokenSecret.name=x,auth.tokenSecret.tokenFile=x"
    assert "give either name" in _refusal(image, tag, both)
    assert "is not a JSON object" in _refusal(image, tag, "auth.tokenSecret.tokenFile=tokens")
    insecure = render(None, "auth.mode=insecure", "auth.tokenSecret.name=")
    assert not [m for m in insecure if m["kind"] == "Secret"]


def _pool(manifests: list[Manifest]) -> tuple[Manifest, Manifest, Manifest]:
    """The worker pool's Deployment, pod spec and container."""
    (deployment,) = [
        m
        for m in manifests
        if m["kind"] == "Deployment"
        and m["metadata"]["labels"]["app.kubernetes.io/component"] == "worker-pool"
    ]
    ((pod, container),) = _containers(deployment)
    return deployment, pod, container


@pytest.mark.parametrize("values", ["worker-pool-keda", "worker-pool-hpa"])
def test_the_worker_pool_reaches_every_replica_and_outlasts_its_own_grace(values: str) -> None:
    manifests = render(CHART / "ci" / f"{values}-values.yaml")
    given = yaml.safe_load((CHART / "ci" / f"{values}-values.yaml").read_text())["workerPool"]
    deployment, pod, container = _pool(manifests)
    env = {e["name"]: e.get("value") for e in container["env"]}
    grace = float(env["COORDINATOR_SHUTDOWN_GRACE"])
    assert grace == given.get("shutdownGraceSeconds", 60)
    # The grace, then the give-back of what still runs, all before the kubelet's kill.
    assert pod["terminationGracePeriodSeconds"] > grace + GIVE_BACK_TIMEOUT.total_seconds()
    # Ready while claiming: the probe tests for the file `coordinator worker` keeps, which
    # lives on a writable mount.
    ready = env["COORDINATOR_READY_FILE"]
    (option,) = [o for o in worker_command.params if o.name == "ready_file"]
    assert option.envvar == "COORDINATOR_READY_FILE"
    assert container["readinessProbe"]["exec"]["command"] == ["test", "-f", ready]
    mounts = [m["mountPath"] for m in container["volumeMounts"]]
    assert any(ready.startswith(mount.rstrip("/") + "/") for mount in mounts), (ready, mounts)
    # The headless Service (every replica), by its full name and port.
    headless = _one(manifests, "Service", "rel-coordinator-headless")
    port = {p["name"]: p["port"] for p in headless["spec"]["ports"]}["grpc"]
    assert env["COORDINATOR_TARGET"] == (
        f"dns:///rel-coordinator-headless.{NAMESPACE}.svc.cluster.local:{port}"
    )
    assert headless["spec"]["clusterIP"] == "None"
    assert env["COORDINATOR_QUEUE"] == given["queue"]
    assert _secret_files(pod, container)["COORDINATOR_CLIENT_TOKEN"] == (
        given["tokenSecret"]["name"],
        given["tokenSecret"].get("key", "token"),
    )
    assert container["image"] == f"{given['image']['repository']}:{given['image']['tag']}"
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    # The coordinator's Service and PDB must not select the pool's pods.
    service = _one(manifests, "Service", "rel-coordinator")
    assert not service["spec"]["selector"].items() <= labels.items()
    assert "replicas" not in deployment["spec"], "the autoscaler owns the replica count"
    # The coordinator's policy (on by default) admits the pool to its gRPC port: every pod of
    # the namespace (no grpcFrom), or the pool's labels named in grpcFrom.
    policy = _one(manifests, "NetworkPolicy", "rel-coordinator")
    assert _admits(policy, "grpc", labels), "the network policy shuts the pool out"

    target = {"apiVersion": "apps/v1", "kind": "Deployment", "name": deployment["metadata"]["name"]}
    if values == "worker-pool-keda":
        assert not [m for m in manifests if m["kind"] == "HorizontalPodAutoscaler"]
        scaled = _one(manifests, "ScaledObject")
        assert scaled["spec"]["scaleTargetRef"] == target
        assert scaled["spec"]["minReplicaCount"] == 0  # scale to zero
        (trigger,) = scaled["spec"]["triggers"]
        assert trigger["type"] == "prometheus"
        query = trigger["metadata"]["query"]
        match = f'namespace="{NAMESPACE}",service="rel-coordinator",queue="{given["queue"]}"'
        assert f"max(coordinator_queue_ready_tasks{{{match}}})" in query
        assert f"max(coordinator_queue_claimed_tasks{{{match}}})" in query
        assert trigger["metadata"]["threshold"] == "2"
        assert trigger["metadata"]["activationThreshold"] == "0"
    else:
        assert not [m for m in manifests if m["kind"] == "ScaledObject"]
        hpa = _one(manifests, "HorizontalPodAutoscaler")
        assert hpa["spec"]["scaleTargetRef"] == target
        metrics = {
            m["external"]["metric"]["name"]: (
                m["external"]["metric"]["selector"]["matchLabels"],
                m["external"]["target"],
            )
            for m in hpa["spec"]["metrics"]
        }
        assert metrics == {
            "coordinator_queue_ready_tasks": (
                {"queue": given["queue"]},
                {"type": "AverageValue", "averageValue": "4"},
            ),
            "coordinator_queue_claimed_tasks": (
                {"queue": given["queue"]},
                {"type": "AverageValue", "averageValue": "1"},
            ),
        }


def test_the_worker_pool_is_off_by_default_and_refuses_a_short_grace() -> None:
    manifests = render(None)
    assert [m["metadata"]["name"] for m in manifests if m["kind"] == "Deployment"] == [
        "rel-coordinator"
    ]
    assert not [m for m in manifests if m["kind"] in {"ScaledObject", "HorizontalPodAutoscaler"}]
    pool = (
        "workerPool.enabled=true,workerPool.image.repository=w,workerPool.image.tag=v1,"
        "workerPool.tokenSecret.name=pool-token"
    )
    # 60 s of grace (the default) and 10 s of give-back: 70 is too short, 71 is enough.
    assert GIVE_BACK_TIMEOUT.total_seconds() == 10
    message = _refusal(*REQUIRED, pool + ",workerPool.terminationGracePeriodSeconds=70")
    assert (
        "workerPool.terminationGracePeriodSeconds (70) must exceed "
        "workerPool.shutdownGraceSeconds + 10 s (70)"
    ) in message
    enough = render(None, pool + ",workerPool.terminationGracePeriodSeconds=71")
    assert _pool(enough)[1]["terminationGracePeriodSeconds"] == 71
    no_probe = _pool(render(None, pool + ",workerPool.readyFile="))[2]
    assert "readinessProbe" not in no_probe
    assert "COORDINATOR_READY_FILE" not in {e["name"] for e in no_probe["env"]}
    both = ",workerPool.autoscaling.keda.enabled=true,workerPool.autoscaling.hpa.enabled=true"
    assert "enable keda or hpa, not both" in _refusal(*REQUIRED, pool + both)
    no_token = pool.replace("pool-token", "")
    assert "workerPool.tokenSecret.name" in _refusal(*REQUIRED, no_token)
    assert "workerPool needs service.headless" in _refusal(
        *REQUIRED, pool + ",service.headless=false"
    )


def _exported_metrics() -> set[str]:
    """Every metric family name a replica's /metrics serves: the process registry, plus the
    on-scrape collectors of coordinator.server.metrics_http (named in its source)."""
    names = {family.name for family in REGISTRY.collect()}
    source = Path(metrics_http.__file__).read_text()
    return names | set(re.findall(r'"(coordinator_[a-z_]+)"', source))


def _metric_names(expr: str) -> set[str]:
    """The coordinator metric families an expression reads (suffixes _total/_bucket dropped)."""
    found = set(re.findall(r"\b(coordinator_[a-z_]+)", expr))
    return {re.sub(r"_(total|bucket|sum|count)$", "", name) for name in found}


ALERTS = {
    "CoordinatorFenceCoverageBelow100",
    "CoordinatorUnknownEffectBacklog",
    "CoordinatorEffectsEscalated",
    "CoordinatorReclaimLatencyHigh",
    "CoordinatorQueuesLeftOut",
    "CoordinatorEtcdNearQuota",
    "CoordinatorTasksDeadLettered",
    "CoordinatorQueueFailing",
    "CoordinatorQueueStuck",
    "CoordinatorTasksBlocked",
    "CoordinatorTasksOverdue",
    "CoordinatorArchiveFailing",
    "CoordinatorPruneBehind",
    "CoordinatorRpcServerErrors",
    "CoordinatorCallsRefusedByVersionGate",
}


def test_alerts_follow_the_service_monitor_and_read_only_exported_metrics() -> None:
    assert not [m for m in render(None) if m["kind"] == "PrometheusRule"]
    assert not [
        m
        for m in render(
            CHART / "ci" / "bundled-etcd-values.yaml", "metrics.prometheusRule.enabled=false"
        )
        if m["kind"] == "PrometheusRule"
    ]
    exported = _exported_metrics()
    for values, selector in (
        ("bundled-etcd", f'namespace="{NAMESPACE}",service="rel-coordinator"'),
        ("worker-pool-keda", f'namespace="{NAMESPACE}",service="rel-coordinator"'),
        ("worker-pool-hpa", 'job="agents/coordinator"'),  # on without a ServiceMonitor
    ):
        manifests = render(CHART / "ci" / f"{values}-values.yaml")
        rule = _one(manifests, "PrometheusRule")
        rules = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
        assert set(rules) == ALERTS
        for name, alert in rules.items():
            used = _metric_names(alert["expr"])
            assert used and used <= exported, (name, used - exported)
            assert f"{{{selector}}}" in alert["expr"], name
        # A rolling restart's give-backs (failed, code WorkerShutdown) are not a failing queue.
        assert f'end="failed",code!="{SHUTDOWN_ERROR}"' in rules["CoordinatorQueueFailing"]["expr"]
        coverage = rules["CoordinatorFenceCoverageBelow100"]["expr"]
        assert "coordinator_fence_validated_total" in coverage
        assert "coordinator_fence_accepted_total" in coverage
    hpa = _one(render(CHART / "ci" / "worker-pool-hpa-values.yaml"), "PrometheusRule")
    thresholds = {r["alert"]: r for g in hpa["spec"]["groups"] for r in g["rules"]}
    assert thresholds["CoordinatorUnknownEffectBacklog"]["for"] == "15m"
    assert thresholds["CoordinatorUnknownEffectBacklog"]["expr"].endswith("> 25")
    assert thresholds["CoordinatorReclaimLatencyHigh"]["expr"].endswith("> 2")


def test_the_dashboard_and_the_autoscalers_read_only_exported_metrics() -> None:
    exported = _exported_metrics()
    dashboard = json.loads((CHART / "dashboards" / "coordinator.json").read_text())
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            assert _metric_names(target["expr"]) <= exported, panel["title"]
    scaled = _one(render(CHART / "ci" / "worker-pool-keda-values.yaml"), "ScaledObject")
    assert _metric_names(scaled["spec"]["triggers"][0]["metadata"]["query"]) <= exported
