"""Request bodies that are not the method's message: every RPC of every service answers
INVALID_ARGUMENT before authentication, writes nothing, and logs a throttled warning without a
traceback (grpc's own "Exception deserializing" error and traceback never appear)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import grpc
import pytest
from google.protobuf import descriptor_pool
from grpc_health.v1 import health
from grpc_reflection.v1alpha import reflection
from structlog.testing import capture_logs

from coordinator.server.app import SERVICE_NAMES
from coordinator.server.interceptors.auth import ROLE_TABLE
from coordinator.server.interceptors.undecodable import LOG_INTERVAL
from tests.auth.conftest import TokenRing
from tests.conftest import GRPC_OPTIONS

GARBAGE = b"\xff\xff\xff\xff"  # a varint that never ends: no message type decodes it


def _methods() -> list[tuple[str, str, bool, bool]]:
    """(path, request type, client streaming, server streaming) of every served method."""
    pool = descriptor_pool.Default()
    found = []
    for service in (*SERVICE_NAMES, health.SERVICE_NAME, reflection.SERVICE_NAME):
        for m in pool.FindServiceByName(service).methods:
            path = f"/{service}/{m.name}"
            found.append((path, m.input_type.full_name, m.client_streaming, m.server_streaming))
    return found


METHODS = _methods()


def _raw_call(
    channel: grpc.Channel,
    path: str,
    streams: tuple[bool, bool],
    metadata: tuple[tuple[str, str], ...],
) -> grpc.RpcError:
    """Send GARBAGE as the request body (no serializer) and return the error it ends with."""
    client_streaming, server_streaming = streams
    call: Callable[[], object]
    if client_streaming:
        bidi = channel.stream_stream(path, None, None)
        call = lambda: list(bidi(iter([GARBAGE]), metadata=metadata, timeout=10))  # noqa: E731
    elif server_streaming:
        stream = channel.unary_stream(path, None, None)
        call = lambda: list(stream(GARBAGE, metadata=metadata, timeout=10))  # noqa: E731
    else:
        unary = channel.unary_unary(path, None, None)
        call = lambda: unary(GARBAGE, metadata=metadata, timeout=10)  # noqa: E731
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


def test_every_method_is_covered() -> None:
    paths = {path for path, *_ in METHODS}
    assert set(ROLE_TABLE) <= paths
    assert "/grpc.health.v1.Health/Watch" in paths
    assert "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo" in paths


@pytest.mark.parametrize("token", [False, True], ids=["no-token", "admin-token"])
def test_garbage_to_every_rpc_is_invalid_argument_and_logged_quietly(
    secured: str,
    ring: TokenRing,
    keyspace: Callable[[], tuple[int, int]],
    token: bool,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.DEBUG)
    metadata = ring.metadata("admin-1") if token else ()
    before = keyspace()
    start = time.monotonic()
    with grpc.insecure_channel(secured, options=GRPC_OPTIONS) as channel, capture_logs() as logs:
        for path, request_type, *streams in METHODS:
            error = _raw_call(channel, path, (streams[0], streams[1]), metadata)
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (path, error.details())
            assert f"could not be decoded as {request_type} ({path})" in (error.details() or "")
    elapsed = time.monotonic() - start

    assert keyspace() == before, "an undecodable request wrote to etcd"
    refusals = [e for e in logs if e["event"] == "undecodable request refused"]
    # Throttled: one line, plus at most one per interval the loop took.
    assert 1 <= len(refusals) <= 1 + int(elapsed // LOG_INTERVAL), refusals
    first = refusals[0]
    assert first["log_level"] == "warning"
    assert first["peer"].startswith("ipv4:127.0.0.1:")
    assert first["rpc"] == METHODS[0][0]
    assert first["suppressed"] == 0
    assert not [e for e in logs if "exc_info" in e or e["log_level"] in ("error", "critical")]
    assert not [
        r for r in caplog.records if r.exc_info or "deserializ" in r.getMessage().lower()
    ], "grpc logged the decode failure itself"
    assert "Traceback" not in capfd.readouterr().err
