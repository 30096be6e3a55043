"""A real coordinator for the TypeScript SDK's tests: etcd (EtcdProcess), a store and a gRPC
server on free loopback ports, as tests/fixtures.py builds them for the Python tests.

Run by test/server.ts with the repo's venv python. Prints one JSON line, {"target", "metrics",
"secure"} (the server's Prometheus text at ``metrics``; ``secure``: a second server over the same
store that demands bearer tokens, with the token of the principal "ts-secure", a worker and a
producer; ``mtls``: a third one that demands a client certificate, with the paths of its CA and
of the client certificate and key of "ts-mtls"; ``tls``: a fourth one over server-only TLS,
with the path of its CA; ``replicas``: two more plain servers over the same store, which the
line ``stop N`` on stdin stops, so a test can take a client's replica away), then serves until
its stdin closes: the node test process holds the pipe, so the server, and etcd with it
(coordinator/lifeline.py), goes when the tests end or die.
"""

from __future__ import annotations

import json
import secrets
import sys
import tempfile
from pathlib import Path

import grpc
from prometheus_client import CollectorRegistry, start_http_server

from coordinator import lifeline
from coordinator.domain.decisions import ClaimLimits
from coordinator.domain.keys import Keyspace
from coordinator.domain.retry import RetryDefaults, RetryPolicy
from coordinator.etcd_process import EtcdProcess, find_etcd_binary
from coordinator.logging import configure_logging
from coordinator.metrics import Metrics
from coordinator.server import build_server
from coordinator.server.interceptors.auth import TokenAuth
from coordinator.server.tls import ServerTLS
from coordinator.server.tokens import TokenFile, token_hash, write_token_file
from coordinator.store import EtcdKV, Store
from tests.auth.certs import CertificateAuthority

# Tasks are claimable again at once after an attempt ends (these tests are about claims,
# fences and outcomes, not backoff), and a TTL may be as short as 1 s (tests wait past it).
LIMITS = ClaimLimits(min_ttl=1, retry=RetryDefaults(RetryPolicy(initial_backoff=0.0)))


def main() -> None:
    """Serve until stdin closes."""
    configure_logging("warning")  # stdout carries the address line only
    registry = CollectorRegistry(auto_describe=True)
    with EtcdProcess(binary=find_etcd_binary(), compaction_retention=None) as etcd:
        kv = EtcdKV.connect([etcd.endpoint], timeout=5.0)
        store = Store.open(
            kv, keys=Keyspace("/ts"), limits=LIMITS, scan_interval=1.0, metrics=Metrics(registry)
        )
        store.start()
        server, port = build_server(store, listen="127.0.0.1:0", max_workers=16)
        folder = Path(tempfile.mkdtemp(prefix="ts-server-"))
        lifeline.remove_with_parent(folder)  # tokens and certificates go with this process
        secured, secure_port, token = _secured(store, folder)
        mutual, mtls = _mutual(store, folder)
        tls_server, tls = _tls_only(store, folder)
        replicas = [build_server(store, listen="127.0.0.1:0", max_workers=8) for _ in range(2)]
        http, _ = start_http_server(0, addr="127.0.0.1", registry=registry)
        address = {
            "target": f"127.0.0.1:{port}",
            "metrics": f"http://127.0.0.1:{http.server_port}/metrics",
            "secure": {"target": f"127.0.0.1:{secure_port}", "token": token},
            "mtls": mtls,
            "tls": tls,
            "replicas": [f"127.0.0.1:{p}" for _, p in replicas],
        }
        print(json.dumps(address), flush=True)
        try:
            _serve_commands([r for r, _ in replicas])
        finally:
            tls_server.stop(grace=None).wait()
            for replica, _ in replicas:
                replica.stop(grace=None).wait()
            http.shutdown()
            server.stop(grace=None).wait()
            secured.stop(grace=None).wait()
            mutual.stop(grace=None).wait()
            store.close()
            kv.close()


def _secured(store: Store, folder: Path) -> tuple[grpc.Server, int, str]:
    """A server over ``store`` that demands tokens, and the token of "ts-secure"."""
    token = secrets.token_urlsafe(24)
    path = folder / "tokens.json"
    entry = {"principal": "ts-secure", "roles": ["worker", "pm"]}
    write_token_file(path, {"tokens": {token_hash(token): entry}, "certificates": {}})
    auth = TokenAuth(TokenFile(path, reload_interval=0.0))
    server, port = build_server(store, listen="127.0.0.1:0", max_workers=8, auth=auth)
    return server, port, token


def _mutual(store: Store, folder: Path) -> tuple[grpc.Server, dict[str, str]]:
    """A server over ``store`` that demands a client certificate, and the PEM paths of its CA
    and of the client "ts-mtls" (a worker and a producer)."""
    ca = CertificateAuthority(folder)
    server_pem = ca.issue(
        "server", common_name="localhost", dns=("localhost",), ips=("127.0.0.1",), server=True
    )
    client = ca.issue("client", common_name="ts-mtls")
    path = folder / "certificates.json"
    roles = {"ts-mtls": {"roles": ["worker", "pm"]}}
    write_token_file(path, {"tokens": {}, "certificates": roles})
    auth = TokenAuth(TokenFile(path, reload_interval=0.0), client_certificates=True)
    tls = ServerTLS(cert=str(server_pem.cert), key=str(server_pem.key), client_ca=str(ca.pem.cert))
    server, port = build_server(store, listen="127.0.0.1:0", max_workers=8, auth=auth, tls=tls)
    paths = {"ca": str(ca.pem.cert), "cert": str(client.cert), "key": str(client.key)}
    return server, {"target": f"127.0.0.1:{port}", **paths}


def _tls_only(store: Store, folder: Path) -> tuple[grpc.Server, dict[str, str]]:
    """A server over ``store`` with server-only TLS (no client certificate, no token), and the
    PEM path of the CA that signed its certificate."""
    (folder / "tls-only").mkdir()
    ca = CertificateAuthority(folder / "tls-only", name="tls-only-ca")
    pem = ca.issue(
        "server", common_name="localhost", dns=("localhost",), ips=("127.0.0.1",), server=True
    )
    tls = ServerTLS(cert=str(pem.cert), key=str(pem.key))
    server, port = build_server(store, listen="127.0.0.1:0", max_workers=8, tls=tls)
    return server, {"target": f"127.0.0.1:{port}", "ca": str(ca.pem.cert)}


def _serve_commands(replicas: list[grpc.Server]) -> None:
    """Until stdin closes: ``stop N`` stops replica N at once (calls in flight fail) and
    answers ``stopped N`` on stdout once its port is closed."""
    for line in sys.stdin:
        words = line.split()
        if len(words) == 2 and words[0] == "stop":
            replicas[int(words[1])].stop(grace=None).wait()
            print(f"stopped {words[1]}", flush=True)


if __name__ == "__main__":
    main()
