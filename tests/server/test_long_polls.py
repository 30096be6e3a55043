"""A unary method named a long poll is bounded like a stream, for the requests that wait: they
count against the caps and end UNAVAILABLE at their maximum age; a request that does not wait
runs uncounted. A stand-in handler takes ClaimNext's name (its real waits are in
tests/workqueue/test_long_poll.py); the server runs the real interceptors and the real
LONG_POLLS entry, which counts a ClaimNext only with wait_seconds > 0."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from coordinator.domain.stream_limits import StreamLimits
from coordinator.server.interceptors.auth import AuthInterceptor, InsecureAuth
from coordinator.server.interceptors.pipeline import Pipeline
from coordinator.server.interceptors.stream_interceptor import StreamLimitInterceptor, stream_alive
from coordinator.server.streams import LONG_POLLS, OpenStreams
from coordinator.v1 import types_pb2, worker_pb2
from tests.conftest import GRPC_OPTIONS
from tests.helpers import eventually
from tests.lifecycle.support import who

CLAIM_NEXT = "/coordinator.v1.WorkerService/ClaimNext"
WORKER = who("w-1", "worker")
WAIT = worker_pb2.ClaimNextRequest(wait_seconds=5)


def _wait_until_ended(
    request: worker_pb2.ClaimNextRequest, context: grpc.ServicerContext
) -> worker_pb2.ClaimResponse:
    """A long poll with nothing to hand out: waits as long as it may (when asked to wait)."""
    alive, idle = stream_alive(context), threading.Event()
    while request.wait_seconds and alive():
        idle.wait(0.05)
    return worker_pb2.ClaimResponse(outcome=types_pb2.OUTCOME_NO_READY_TASK)


Served = tuple[grpc.UnaryUnaryMultiCallable, OpenStreams]  # type: ignore[type-arg]


@pytest.fixture
def served() -> Iterator[Served]:
    """ClaimNext on a server, and the count of its open long-lived calls."""
    open_streams = OpenStreams(StreamLimits(max_streams=1, max_per_principal=1, max_age=1.0))
    auth = AuthInterceptor(InsecureAuth())
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=4),
        interceptors=[
            Pipeline(
                [auth, StreamLimitInterceptor(open_streams, auth.check, long_polls=LONG_POLLS)]
            )
        ],
    )
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "coordinator.v1.WorkerService",
                {
                    "ClaimNext": grpc.unary_unary_rpc_method_handler(
                        _wait_until_ended,
                        request_deserializer=worker_pb2.ClaimNextRequest.FromString,
                        response_serializer=worker_pb2.ClaimResponse.SerializeToString,
                    )
                },
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=GRPC_OPTIONS) as channel:
            call = channel.unary_unary(
                CLAIM_NEXT,
                request_serializer=worker_pb2.ClaimNextRequest.SerializeToString,
                response_deserializer=worker_pb2.ClaimResponse.FromString,
            )
            yield call, open_streams
    finally:
        server.stop(grace=None).wait()


def test_a_long_poll_counts_against_the_cap_and_ends_at_its_age(served: Served) -> None:
    call, open_streams = served
    first = call.future(WAIT, metadata=WORKER, timeout=30)
    eventually(lambda: open_streams.count("w-1") == 1, message="the first poll was not admitted")
    # A ClaimNext that does not wait is no long poll: it runs beside, uncounted.
    now = call(worker_pb2.ClaimNextRequest(), metadata=WORKER, timeout=30)
    assert now.outcome == types_pb2.OUTCOME_NO_READY_TASK
    # The waiting one holds the principal's only slot until its age ends it.
    with pytest.raises(grpc.RpcError) as refused:
        call(WAIT, metadata=WORKER, timeout=30)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "max_streams_per_principal" in (refused.value.details() or "")

    with pytest.raises(grpc.RpcError) as info:
        first.result()
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "stream reached its maximum age (1 s, max_stream_age)" in (info.value.details() or "")
    assert open_streams.count() == 0
