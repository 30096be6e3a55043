"""Cluster health around each fault, as etcd's robustness tests check it.

A fault is meaningful only on a healthy cluster, and a heal only when the cluster comes back:
a run that starts a fault on a cluster that was already broken, or that leaves it broken, would
blame (or clear) the coordinator for what the harness did. So the runner probes before each
injection and after each heal (``require_healthy``), and a run fails clearly (UNHEALTHY, exit 1,
naming what is wrong) instead of checking a history that means nothing.

Healthy means: every etcd member runs, answers ``status`` and names the same leader; every
coordinator replica answers the gRPC health check SERVING (its ``""`` service follows etcd).
Against a deployed coordinator (``--target``) only its health check is probed.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from chaos.cluster import EtcdCluster

PROBE_TIMEOUT = 2.0
"""Seconds one probe call may take."""

Channel = Callable[[str], grpc.Channel]
"""Opens a channel to one coordinator address (TLS or not, as the run needs)."""


class ClusterUnhealthy(Exception):
    """The cluster was unhealthy before a fault, or did not recover after its heal."""


def etcd_problems(cluster: EtcdCluster) -> list[str]:
    """What is wrong with the etcd cluster now (empty: healthy)."""
    problems, leaders = [], set()
    for member in cluster.members:
        if not member.running:
            problems.append(f"etcd member {member.name} is not running")
            continue
        try:
            client = cluster.client(member)
            try:
                leader = client.status().leader
            finally:
                client.close()
        except Exception as exc:  # any failure to answer is the finding itself
            problems.append(f"etcd member {member.name} does not answer status ({exc!r:.120})")
            continue
        if leader is None:
            problems.append(f"etcd member {member.name} knows no leader")
        else:
            leaders.add(leader.name)
    if len(leaders) > 1:
        problems.append(f"etcd members disagree on the leader: {sorted(leaders)}")
    return problems


def replica_problems(name: str, target: str, channel: Channel) -> list[str]:
    """What is wrong with one coordinator replica's health check (empty: SERVING)."""
    try:
        with channel(target) as ch:
            got = health_pb2_grpc.HealthStub(ch).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=PROBE_TIMEOUT
            )
    except grpc.RpcError as exc:
        return [f"coordinator {name} health check failed: {exc.code().name}"]
    if got.status != health_pb2.HealthCheckResponse.SERVING:
        status = health_pb2.HealthCheckResponse.ServingStatus.Name(got.status)
        return [f"coordinator {name} is {status}"]
    return []


def require_healthy(
    probe: Callable[[], list[str]], *, timeout: float, when: str, interval: float = 0.2
) -> None:
    """Wait up to ``timeout`` for ``probe`` to find nothing wrong; ClusterUnhealthy naming
    ``when`` and the last problems otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        problems = probe()
        if not problems:
            return
        if time.monotonic() > deadline:
            raise ClusterUnhealthy(f"cluster unhealthy {when}: {'; '.join(problems)}")
        time.sleep(interval)
