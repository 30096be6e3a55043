"""What the chart's probes rely on: readiness ("") follows etcd, liveness ("liveness") follows
only the process, so an etcd outage takes replicas out of the Service without restarting them."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from coordinator.etcd_process import EtcdProcess, find_etcd_binary
from coordinator.server import build_server
from coordinator.store import EtcdKV, Keyspace, Store
from tests.conftest import GRPC_OPTIONS
from tests.helpers import eventually

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def test_liveness_stays_serving_while_etcd_is_down() -> None:
    with EtcdProcess(binary=find_etcd_binary()) as etcd:
        kv = EtcdKV.connect([etcd.endpoint], timeout=1.0)
        store = Store.open(kv, keys=Keyspace("/probe"), scan_interval=1.0)
        store.start()
        server, port = build_server(store, health_interval=0.1)
        try:
            with grpc.insecure_channel(f"127.0.0.1:{port}", options=GRPC_OPTIONS) as channel:
                health = health_pb2_grpc.HealthStub(channel)

                def status(service: str) -> int:
                    request = health_pb2.HealthCheckRequest(service=service)
                    return int(health.Check(request, timeout=5).status)

                assert (status(""), status("liveness")) == (SERVING, SERVING)
                etcd.stop()
                eventually(lambda: status("") == NOT_SERVING, timeout=15)
                assert status("liveness") == SERVING
        finally:
            server.stop(None).wait()
            store.close()
            kv.close()
