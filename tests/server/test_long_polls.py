"""A unary method named a long poll is bounded like a stream: it counts against the caps and
ends UNAVAILABLE at its maximum age. A stand-in handler takes ClaimNext's name (the long-poll
ClaimNext this is for does not exist yet); the server runs the real interceptors."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from coordinator.domain.stream_limits import StreamLimits
from coordinator.server.auth import AuthInterceptor, InsecureAuth
from coordinator.server.stream_interceptor import StreamLimitInterceptor, stream_alive
from coordinator.server.streams import OpenStreams
from tests.conftest import GRPC_OPTIONS
from tests.helpers import eventually
from tests.lifecycle.support import who

CLAIM_NEXT = "/coordinator.v1.WorkerService/ClaimNext"
WORKER = who("w-1", "worker")


def _wait_until_ended(request: bytes, context: grpc.ServicerContext) -> bytes:
    """A long poll with nothing to hand out: waits as long as it may."""
    alive, idle = stream_alive(context), threading.Event()
    while alive():
        idle.wait(0.05)
    return b"nothing"


Served = tuple[grpc.UnaryUnaryMultiCallable, OpenStreams]  # type: ignore[type-arg]


@pytest.fixture
def served() -> Iterator[Served]:
    """ClaimNext on a server, and the count of its open long-lived calls."""
    open_streams = OpenStreams(StreamLimits(max_per_principal=1, max_age=1.0))
    auth = AuthInterceptor(InsecureAuth())
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=4),
        interceptors=[
            auth,
            StreamLimitInterceptor(open_streams, auth.check, long_polls=frozenset({CLAIM_NEXT})),
        ],
    )
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "coordinator.v1.WorkerService",
                {"ClaimNext": grpc.unary_unary_rpc_method_handler(_wait_until_ended)},
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=GRPC_OPTIONS) as channel:
            yield channel.unary_unary(CLAIM_NEXT), open_streams
    finally:
        server.stop(grace=None).wait()


def test_a_long_poll_counts_against_the_cap_and_ends_at_its_age(served: Served) -> None:
    call, open_streams = served
    first = call.future(b"", metadata=WORKER, timeout=30)
    eventually(lambda: open_streams.count("w-1") == 1, message="the first poll was not admitted")
    # It holds the principal's only slot until its age ends it.
    with pytest.raises(grpc.RpcError) as refused:
        call(b"", metadata=WORKER, timeout=30)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "max_streams_per_principal" in (refused.value.details() or "")

    with pytest.raises(grpc.RpcError) as info:
        first.result()
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "stream reached its maximum age (1 s, max_stream_age)" in (info.value.details() or "")
    assert open_streams.count() == 0
