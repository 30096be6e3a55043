"""Mutual TLS (principal from the client certificate), TLS with tokens, insecure mode's
metadata roles, and the identity reaching streaming handlers."""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from structlog.testing import capture_logs

from coordinator.errors import ConfigError, Unauthenticated
from coordinator.etcd_process import free_port
from coordinator.server import build_server
from coordinator.server.identity import identity_of
from coordinator.server.interceptors.auth import AuthInterceptor, InsecureAuth, TokenAuth
from coordinator.server.interceptors.pipeline import Pipeline
from coordinator.server.tls import ServerTLS
from coordinator.server.tokens import TokenFile
from coordinator.store import Store
from coordinator.v1 import admin_pb2, admin_pb2_grpc, tasks_pb2, tasks_pb2_grpc
from tests.auth.certs import CertificateAuthority, Pem
from tests.auth.conftest import TokenRing, status_of
from tests.conftest import GRPC_OPTIONS

TLS_OPTIONS = [*GRPC_OPTIONS, ("grpc.ssl_target_name_override", "localhost")]


@dataclass
class Pki:
    """A CA, the server's certificate, and client certificates."""

    ca: CertificateAuthority
    server: Pem
    mapped: Pem  # SAN worker-x.pool (in the token file), CN worker-x
    cn_only: Pem  # no SAN, CN cn-worker (in the token file)
    stranger: Pem  # signed by the CA, but granted nothing


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    ca = CertificateAuthority(tmp_path)
    return Pki(
        ca=ca,
        server=ca.issue("server", common_name="localhost", dns=("localhost",), server=True),
        mapped=ca.issue("mapped", common_name="worker-x", dns=("worker-x.pool",)),
        cn_only=ca.issue("cn-only", common_name="cn-worker"),
        stranger=ca.issue("stranger", common_name="stranger"),
    )


def _serve(store: Store, ring: TokenRing, tls: ServerTLS) -> tuple[grpc.Server, str]:
    auth = TokenAuth(TokenFile(ring.path, reload_interval=0.0), client_certificates=tls.mutual)
    server, port = build_server(store, auth=auth, tls=tls)
    return server, f"127.0.0.1:{port}"


@pytest.fixture
def mtls(store: Store, ring: TokenRing, pki: Pki) -> Iterator[str]:
    ring.certificates = {"worker-x.pool": ["worker"], "cn-worker": ["pm"]}
    ring.write()
    tls = ServerTLS(
        cert=str(pki.server.cert), key=str(pki.server.key), client_ca=str(pki.ca.pem.cert)
    )
    server, target = _serve(store, ring, tls)
    try:
        yield target
    finally:
        server.stop(None).wait()


def _channel(target: str, pki: Pki, client: Pem | None) -> grpc.Channel:
    credentials = grpc.ssl_channel_credentials(
        root_certificates=pki.ca.pem.cert.read_bytes(),
        private_key=client.key.read_bytes() if client else None,
        certificate_chain=client.cert.read_bytes() if client else None,
    )
    return grpc.secure_channel(target, credentials, options=TLS_OPTIONS)


def test_mutual_tls_names_the_principal_from_the_certificate(mtls: str, pki: Pki) -> None:
    with _channel(mtls, pki, pki.mapped) as channel:
        tasks = tasks_pb2_grpc.TaskServiceStub(channel)
        admin = admin_pb2_grpc.AdminServiceStub(channel)
        assert admin.GetEpoch(admin_pb2.GetEpochRequest()).epoch == 1
        # worker role only: producing is refused, and the refusal names the SAN principal.
        with pytest.raises(grpc.RpcError) as info:
            tasks.CreateTask(tasks_pb2.CreateTaskRequest(task_id="t-1"))
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "'worker-x.pool' (roles: worker)" in (info.value.details() or "")
    with _channel(mtls, pki, pki.cn_only) as channel:
        tasks = tasks_pb2_grpc.TaskServiceStub(channel)
        created = tasks.CreateTask(tasks_pb2.CreateTaskRequest(task_id="t-1"))
        assert created.task.task_id == "t-1"


def test_a_certificate_nobody_granted_a_role_is_denied(mtls: str, pki: Pki) -> None:
    with _channel(mtls, pki, pki.stranger) as channel:
        admin = admin_pb2_grpc.AdminServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            admin.GetEpoch(admin_pb2.GetEpochRequest())
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "'stranger' (roles: none)" in (info.value.details() or "")


def test_mutual_tls_refuses_a_client_without_a_certificate(mtls: str, pki: Pki) -> None:
    with _channel(mtls, pki, None) as channel:
        admin = admin_pb2_grpc.AdminServiceStub(channel)
        code = status_of(lambda: admin.GetEpoch(admin_pb2.GetEpochRequest(), timeout=5))
        assert code == grpc.StatusCode.UNAVAILABLE  # the handshake itself fails


def test_a_bearer_token_wins_over_the_certificate(mtls: str, pki: Pki, ring: TokenRing) -> None:
    with _channel(mtls, pki, pki.mapped) as channel:
        tasks = tasks_pb2_grpc.TaskServiceStub(channel)
        created = tasks.CreateTask(
            tasks_pb2.CreateTaskRequest(task_id="t-1"), metadata=ring.metadata("pm-1")
        )
        assert created.task.task_id == "t-1"
        bogus = (("authorization", "Bearer nope"),)
        code = status_of(
            lambda: tasks.GetTask(tasks_pb2.GetTaskRequest(task_id="t-1"), metadata=bogus)
        )
        assert code == grpc.StatusCode.UNAUTHENTICATED


def _create_as(target: str, pki: Pki, client: Pem) -> grpc.RpcError | None:
    """CreateTask over mutual TLS as ``client`` (pm or admin may): None if accepted."""
    with _channel(target, pki, client) as channel:
        tasks = tasks_pb2_grpc.TaskServiceStub(channel)
        try:
            tasks.CreateTask(tasks_pb2.CreateTaskRequest(), timeout=10)
        except grpc.RpcError as exc:
            return exc
    return None


def test_a_certificate_with_a_san_is_never_identified_by_its_cn(mtls: str, pki: Pki) -> None:
    # CN "cn-worker" is granted pm; the SAN is granted nothing and is the principal all the same.
    client = pki.ca.issue("san-and-cn", common_name="cn-worker", dns=("ungranted.pool",))
    refused = _create_as(mtls, pki, client)
    assert refused is not None and refused.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "'ungranted.pool' (roles: none)" in (refused.details() or "")


def test_a_uri_san_comes_before_a_dns_san(mtls: str, pki: Pki, ring: TokenRing) -> None:
    ring.certificates["urn:worker:u7"] = ["pm"]  # worker-x.pool stays worker-only
    ring.write()
    client = pki.ca.issue(
        "uri-and-dns", common_name="x", uris=("urn:worker:u7",), dns=("worker-x.pool",)
    )
    assert _create_as(mtls, pki, client) is None
    del ring.certificates["urn:worker:u7"]
    ring.write()
    refused = _create_as(mtls, pki, client)  # the DNS SAN (worker) answers now
    assert refused is not None and refused.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "'worker-x.pool' (roles: worker)" in (refused.details() or "")


@pytest.mark.parametrize(
    ("uris", "ips"),
    [(("spiffe://cluster.local/ns/a/sa/w",), ()), ((), ("127.0.0.1",))],
    ids=["spiffe-uri-only", "ip-only"],
)
def test_sans_without_a_usable_name_are_refused_and_the_cn_is_no_fallback(
    mtls: str, pki: Pki, uris: tuple[str, ...], ips: tuple[str, ...]
) -> None:
    client = pki.ca.issue("unusable", common_name="cn-worker", uris=uris, ips=ips)
    refused = _create_as(mtls, pki, client)
    assert refused is not None and refused.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "hold no URI or DNS name usable as a principal" in (refused.details() or "")


def test_refusals_are_logged_with_the_peer_address(mtls: str, pki: Pki) -> None:
    with capture_logs() as logs:
        denied = _create_as(mtls, pki, pki.stranger)
        with _channel(mtls, pki, pki.stranger) as channel:
            admin = admin_pb2_grpc.AdminServiceStub(channel)
            bogus = (("authorization", "Bearer nope"),)
            code = status_of(lambda: admin.GetEpoch(admin_pb2.GetEpochRequest(), metadata=bogus))
    assert denied is not None and denied.code() == grpc.StatusCode.PERMISSION_DENIED
    assert code == grpc.StatusCode.UNAUTHENTICATED
    refusals = [e for e in logs if e["event"] == "rpc refused"]
    assert [e["code"] for e in refusals] == ["PERMISSION_DENIED", "UNAUTHENTICATED"]
    for event in refusals:
        assert event["peer"].startswith("ipv4:127.0.0.1:"), event


def test_tls_without_client_ca_takes_tokens_and_no_client_certificate(
    store: Store, ring: TokenRing, pki: Pki
) -> None:
    server, target = _serve(
        store, ring, ServerTLS(cert=str(pki.server.cert), key=str(pki.server.key))
    )
    try:
        with _channel(target, pki, None) as channel:
            admin = admin_pb2_grpc.AdminServiceStub(channel)
            assert admin.GetEpoch(admin_pb2.GetEpochRequest(), metadata=ring.metadata("admin-1"))
            code = status_of(lambda: admin.GetEpoch(admin_pb2.GetEpochRequest()))
            assert code == grpc.StatusCode.UNAUTHENTICATED
            health = health_pb2_grpc.HealthStub(channel)
            assert health.Check(health_pb2.HealthCheckRequest()).status == (
                health_pb2.HealthCheckResponse.SERVING
            )
    finally:
        server.stop(None).wait()


def _health(target: str, ca: Path) -> grpc.StatusCode:
    """The health check's status over a new TLS connection that trusts ``ca``."""
    credentials = grpc.ssl_channel_credentials(root_certificates=ca.read_bytes())
    with grpc.secure_channel(target, credentials, options=TLS_OPTIONS) as channel:
        try:
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        except grpc.RpcError as exc:
            code: grpc.StatusCode = exc.code()
            return code
    return grpc.StatusCode.OK


def test_a_rotated_server_certificate_is_served_without_a_restart(
    store: Store, ring: TokenRing, pki: Pki, tmp_path: Path
) -> None:
    live = tmp_path / "live"
    live.mkdir()
    cert, key = live / "tls.crt", live / "tls.key"
    cert.write_bytes(pki.server.cert.read_bytes())
    key.write_bytes(pki.server.key.read_bytes())
    server, target = _serve(store, ring, ServerTLS(cert=str(cert), key=str(key)))
    try:
        assert _health(target, pki.ca.pem.cert) == grpc.StatusCode.OK
        # A new CA issues a new certificate; it replaces the files the way a Secret update does.
        (tmp_path / "next").mkdir()
        next_ca = CertificateAuthority(tmp_path / "next", name="next-ca")
        rotated = next_ca.issue("server", common_name="localhost", dns=("localhost",), server=True)
        (torn := live / "half.key").write_text("-----BEGIN half written")
        os.replace(torn, key)  # mid-rotation: unusable, the last good set stays in service
        assert _health(target, pki.ca.pem.cert) == grpc.StatusCode.OK
        for source, target_path in ((rotated.cert, cert), (rotated.key, key)):
            staged = live / (target_path.name + ".new")
            staged.write_bytes(source.read_bytes())
            os.replace(staged, target_path)
        assert _health(target, next_ca.pem.cert) == grpc.StatusCode.OK
        assert _health(target, pki.ca.pem.cert) == grpc.StatusCode.UNAVAILABLE
    finally:
        server.stop(None).wait()


def test_unreadable_tls_files_name_the_setting(tmp_path: Path, pki: Pki) -> None:
    with pytest.raises(ConfigError, match="tls_key"):
        ServerTLS(cert=str(pki.server.cert), key=str(tmp_path / "missing.pem")).credentials()
    (tmp_path / "junk.pem").write_text("not a certificate")
    with pytest.raises(ConfigError, match="tls_client_ca"):
        ServerTLS(
            cert=str(pki.server.cert), key=str(pki.server.key), client_ca=str(tmp_path / "junk.pem")
        ).credentials()


# --- insecure mode ------------------------------------------------------------------------


@pytest.fixture
def insecure(store: Store) -> Iterator[grpc.Channel]:
    server, port = build_server(store)  # no authenticator: insecure, loopback only
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=GRPC_OPTIONS) as channel:
            yield channel
    finally:
        server.stop(None).wait()


def test_insecure_mode_takes_roles_from_metadata_and_defaults_to_all(
    insecure: grpc.Channel,
) -> None:
    tasks = tasks_pb2_grpc.TaskServiceStub(insecure)
    admin = admin_pb2_grpc.AdminServiceStub(insecure)
    as_worker = (("x-coordinator-principal", "w1"), ("x-coordinator-roles", "worker"))
    code = status_of(lambda: tasks.CreateTask(tasks_pb2.CreateTaskRequest(), metadata=as_worker))
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert tasks.CreateTask(tasks_pb2.CreateTaskRequest(task_id="t-1")).task.task_id == "t-1"
    assert admin.BumpEpoch(admin_pb2.BumpEpochRequest()).epoch == 2
    typo = (("x-coordinator-roles", "admn"),)
    with pytest.raises(grpc.RpcError) as info:
        admin.GetEpoch(admin_pb2.GetEpochRequest(), metadata=typo)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "x-coordinator-roles: unknown role 'admn'" in (info.value.details() or "")


def test_an_implicit_insecure_server_refuses_a_non_loopback_address(store: Store) -> None:
    with pytest.raises(ConfigError, match="not a loopback address"):
        build_server(store, listen="0.0.0.0:0")


# --- the identity inside handlers, streaming ones included -------------------------------


def _echo_principal(request: bytes, context: grpc.ServicerContext) -> bytes:
    return identity_of(context).principal.encode()


def _stream_principal(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
    for i in range(3):
        yield f"{i}:{identity_of(context).principal}".encode()


def test_the_identity_reaches_unary_and_streaming_handlers(ring: TokenRing) -> None:
    handler = grpc.method_handlers_generic_handler(
        "coordinator.v1.TaskService",
        {
            "GetTask": grpc.unary_unary_rpc_method_handler(_echo_principal),
            "WatchEvents": grpc.unary_stream_rpc_method_handler(_stream_principal),
        },
    )
    auth = TokenAuth(TokenFile(ring.path, reload_interval=0.0))
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=2), interceptors=[Pipeline([AuthInterceptor(auth)])]
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=GRPC_OPTIONS) as channel:
            unary = channel.unary_unary("/coordinator.v1.TaskService/GetTask", None, None)
            stream = channel.unary_stream("/coordinator.v1.TaskService/WatchEvents", None, None)
            assert unary(b"", metadata=ring.metadata("worker-b")) == b"worker-b"
            assert list(stream(b"", metadata=ring.metadata("pm-1"))) == [
                b"0:pm-1",
                b"1:pm-1",
                b"2:pm-1",
            ]
            with pytest.raises(grpc.RpcError) as info:
                list(stream(b""))
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        server.stop(None).wait()


def test_without_the_interceptor_a_servicer_finds_no_identity() -> None:
    with pytest.raises(Unauthenticated):
        identity_of(None)  # type: ignore[arg-type]
    assert InsecureAuth().insecure is True


def test_the_plaintext_health_port_of_a_tls_server_serves_health_only(
    store: Store, ring: TokenRing, pki: Pki
) -> None:
    health_port = free_port()
    auth = TokenAuth(TokenFile(ring.path, reload_interval=0.0), require_tls=True)
    tls = ServerTLS(cert=str(pki.server.cert), key=str(pki.server.key))
    server, port = build_server(store, auth=auth, tls=tls, health_listen=f"127.0.0.1:{health_port}")
    try:
        target = f"127.0.0.1:{health_port}"
        with grpc.insecure_channel(target, options=GRPC_OPTIONS) as plain:
            health = health_pb2_grpc.HealthStub(plain)
            for service in ("", "liveness"):
                reply = health.Check(health_pb2.HealthCheckRequest(service=service))
                assert reply.status == health_pb2.HealthCheckResponse.SERVING
            admin = admin_pb2_grpc.AdminServiceStub(plain)
            with pytest.raises(grpc.RpcError) as info:
                admin.GetEpoch(admin_pb2.GetEpochRequest(), metadata=ring.metadata("admin-1"))
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "health checks only" in (info.value.details() or "")
        with _channel(f"127.0.0.1:{port}", pki, None) as secure:
            admin = admin_pb2_grpc.AdminServiceStub(secure)
            reply = admin.GetEpoch(admin_pb2.GetEpochRequest(), metadata=ring.metadata("admin-1"))
            assert reply.epoch == 1
    finally:
        server.stop(None).wait()
