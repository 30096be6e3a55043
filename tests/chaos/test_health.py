"""The health probe around each fault: a broken cluster is named, and fails the run."""

from __future__ import annotations

import signal
from pathlib import Path

import grpc
import pytest

from chaos.__main__ import exit_code
from chaos.cluster import EtcdCluster
from chaos.health import ClusterUnhealthy, etcd_problems, replica_problems, require_healthy
from chaos.report import table
from chaos.runner import Result
from coordinator.etcd_process import EtcdProcess
from tests.sdk.support import served


def test_a_stopped_or_killed_etcd_member_is_named(tmp_path: Path) -> None:
    cluster = EtcdCluster(tmp_path)
    try:
        cluster.start()
        assert etcd_problems(cluster) == []
        m1, m2 = cluster.members[1], cluster.members[2]
        m2.signal(signal.SIGKILL)
        assert m2.proc is not None
        m2.proc.wait()
        assert etcd_problems(cluster) == ["etcd member m2 is not running"]
        m1.signal(signal.SIGSTOP)  # frozen: it cannot answer
        (problem,) = [p for p in etcd_problems(cluster) if "m1" in p]
        assert problem.startswith("etcd member m1 does not answer status")
    finally:
        cluster.stop()


def test_a_replica_is_healthy_only_while_it_serves(etcd: EtcdProcess, prefix: str) -> None:
    def channel(target: str) -> grpc.Channel:
        return grpc.insecure_channel(target, options=[("grpc.enable_http_proxy", 0)])

    with served(etcd.endpoint, prefix) as running:
        assert replica_problems("r0", running.target, channel) == []
        target = running.target
    assert replica_problems("r0", target, channel) == [
        "coordinator r0 health check failed: UNAVAILABLE"
    ]


def test_an_unhealthy_cluster_fails_the_run_naming_when_and_what() -> None:
    answers = [["etcd member m0 is not running"], []]
    require_healthy(lambda: answers.pop(0), timeout=5, when="before x", interval=0)
    assert answers == []  # it waited for the second probe
    with pytest.raises(ClusterUnhealthy) as caught:
        require_healthy(lambda: ["coordinator r1 is NOT_SERVING"], timeout=0, when="after y")
    assert str(caught.value) == "cluster unhealthy after y: coordinator r1 is NOT_SERVING"
    result = Result("replica-kill", "coordinator", None, unhealthy=str(caught.value))
    assert exit_code([result]) == 1
    assert "UNHEALTHY" in table([result]) and "coordinator r1 is NOT_SERVING" in table([result])
